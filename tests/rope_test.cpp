// attnkit::model::rope against the double oracle (both pair layouts, partial rotary, every
// frequency scaling, sizes around the lane widths 4 / 8 / 16) and against golden values computed
// in Python in Hugging Face's convention (tests/golden/make_rope_golden.py); per-row positions
// equal per-call offsets and separate calls, bitwise; 16-bit storage equals rotating the
// float-converted values and rounding; thread counts bitwise; strided views; errors leave x as
// it was. rope_backward: the oracle against finite differences of the forward oracle, the
// kernel against the oracle (both layouts, partial rotary, the scalings, positions), the inverse
// of rope, thread counts and the cache bitwise, and its errors.
#include "attnkit/model/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/reference/model/rope.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/compare.hpp"
#include "common/finite_differences.hpp"
#include "common/random.hpp"
#include "common/sweep.hpp"
#include "common/tensor.hpp"
#include "golden/rope_golden.hpp"

namespace {

using namespace attnkit_test;
using attnkit::index_t;
using attnkit::model::rope_options;
using attnkit::model::rope_scaling_type;
using attnkit::model::rope_style;

using positions2 = Eigen::Tensor<std::int64_t, 2, Eigen::RowMajor>;

template <class T>
bool same_bits(const T& a, const T& b) {
    return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
::testing::AssertionResult bitwise_equal(const tensor4<T>& a, const tensor4<T>& b) {
    if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
    for (index_t i = 0; i < a.size(); ++i)
        if (!same_bits(a.data()[i], b.data()[i]))
            return ::testing::AssertionFailure()
                   << "element " << i << ": " << static_cast<double>(a.data()[i]) << " vs "
                   << static_cast<double>(b.data()[i]);
    return ::testing::AssertionSuccess();
}

// The scalings the sweeps cycle through, with parameters that put frequencies in every band.
rope_options with_scaling(rope_scaling_type t) {
    rope_options o;
    o.scaling.type = t;
    switch (t) {
        case rope_scaling_type::none:
            break;
        case rope_scaling_type::linear:
            o.scaling.factor = 4.0;
            break;
        case rope_scaling_type::llama3:
            o.theta = 500000.0f;
            o.scaling.factor = 8.0;
            o.scaling.low_freq_factor = 1.0;
            o.scaling.high_freq_factor = 4.0;
            o.scaling.original_max_position_embeddings = 8192;
            break;
        case rope_scaling_type::yarn:
            o.theta = 1e6f;
            o.scaling.factor = 4.0;
            o.scaling.original_max_position_embeddings = 32768;
            break;
    }
    return o;
}

const char* scaling_name(rope_scaling_type t) {
    switch (t) {
        case rope_scaling_type::none: return "none";
        case rope_scaling_type::linear: return "linear";
        case rope_scaling_type::llama3: return "llama3";
        case rope_scaling_type::yarn: return "yarn";
    }
    return "?";
}

// ---- against the oracle --------------------------------------------------------------------

struct sweep_case {
    rope_style style;
    rope_scaling_type scaling;
    index_t D, R;  // R = 0: all of D
    index_t B, L, H;
    std::int64_t offset;
};

void PrintTo(const sweep_case& c, std::ostream* os) {
    *os << (c.style == rope_style::interleaved ? "interleaved" : "rotate_half") << " " << scaling_name(c.scaling)
        << " D " << c.D << " R " << (c.R ? c.R : c.D) << " x [" << c.B << ", " << c.L << ", " << c.H << ", " << c.D
        << "] offset " << c.offset;
}

std::vector<sweep_case> sweep_cases() {
    std::vector<sweep_case> cases;
    const rope_scaling_type scalings[] = {rope_scaling_type::none, rope_scaling_type::linear,
                                          rope_scaling_type::llama3, rope_scaling_type::yarn};
    // Rotate-half vectorises over R/2 pairs, interleaved over R elements: these straddle 4, 8, 16
    // lanes in both.
    const index_t dims[] = {2, 6, 8, 10, 14, 16, 18, 30, 32, 34, 48, 64, 66, 128};
    int k = 0;
    for (rope_style st : {rope_style::rotate_half, rope_style::interleaved})
        for (index_t D : dims) {
            const rope_scaling_type sc = scalings[k++ % 4];
            const std::int64_t offset = (k % 3 == 0) ? 0 : (k % 3 == 1 ? 4093 : 131000);
            cases.push_back({st, sc, D, 0, 2, 3, 2, offset});
            if (D >= 6) cases.push_back({st, scalings[k % 4], D, D / 2 - (D / 2) % 2, 1, 2, 3, offset});
        }
    return cases;
}

class RopeSweep : public ::testing::TestWithParam<sweep_case> {};

// A kernel's rotated x (in place; `before` its input) against the oracle's ref: cos and sin are
// rounded to float once and the rotation rounds twice, a few eps of each pair's norm (<= sqrt(2)
// max|x|, times yarn's attention factor); the part past the rotary dim R is untouched.
void expect_rotated_like(const tensor4<float>& x, const tensor4<double>& ref, const tensor4<float>& before, index_t D,
                         index_t R, const rope_options& o) {
    const double magnitude = 1.5 * max_abs(before) * attnkit::reference::model::rope_attention_factor(o.scaling);
    EXPECT_TRUE(all_close(x, ref, tolerance_for(4, magnitude)));
    for (index_t i = 0; i < x.size(); ++i)
        if (i % D >= R) {
            ASSERT_TRUE(same_bits(x.data()[i], before.data()[i])) << i;
        }
}

TEST_P(RopeSweep, MatchesReference) {
    const sweep_case c = GetParam();
    rope_options o = with_scaling(c.scaling);
    o.style = c.style;
    o.rotary_dim = c.R;
    o.position_offset = c.offset;
    tensor4<float> x = random_bshd(c.B, c.L, c.H, c.D, distribution::gaussian, 11 + static_cast<std::uint64_t>(c.D));
    tensor4<double> ref = make_bshd<double>(c.B, c.L, c.H, c.D);
    attnkit::reference::model::rope(x, ref, o);
    const tensor4<float> before = x;
    attnkit::model::rope(x, o);
    expect_rotated_like(x, ref, before, c.D, c.R ? c.R : c.D, o);
}

INSTANTIATE_TEST_SUITE_P(Forms, RopeSweep, ::testing::ValuesIn(sweep_cases()), [](const auto& info) {
    const sweep_case& c = info.param;
    return std::string(c.style == rope_style::interleaved ? "interleaved" : "half") + "_" + scaling_name(c.scaling) +
           "_D" + std::to_string(c.D) + "_R" + std::to_string(c.R ? c.R : c.D) + "_off" + std::to_string(c.offset);
});

// Every scaling's frequencies at once: all R/2 bands (kept, blended, divided) show in one head.
TEST(Rope, ScalingsAtLongContextMatchReference) {
    for (rope_scaling_type t : {rope_scaling_type::linear, rope_scaling_type::llama3, rope_scaling_type::yarn})
        for (rope_style st : {rope_style::rotate_half, rope_style::interleaved}) {
            rope_options o = with_scaling(t);
            o.style = st;
            positions2 pos(2, 3);
            pos.setValues({{0, 8191, 8192}, {32767, 65536, 131071}});
            tensor4<float> x = random_bshd(2, 3, 2, 128, distribution::uniform, 5);
            tensor4<double> ref = make_bshd<double>(2, 3, 2, 128);
            attnkit::reference::model::rope(x, ref, pos, o);
            const double magnitude = 1.5 * max_abs(x) * attnkit::reference::model::rope_attention_factor(o.scaling);
            attnkit::model::rope(x, pos, o);
            EXPECT_TRUE(all_close(x, ref, tolerance_for(4, magnitude))) << scaling_name(t);
        }
}

// The frequencies themselves: llama3 leaves the short wavelengths alone and divides the long
// ones by the factor; yarn's attention factor is 0.1 ln(factor) + 1.
TEST(Rope, ScalingFrequenciesHaveTheirPublishedShape) {
    rope_options o = with_scaling(rope_scaling_type::llama3);
    const rope_options plain = [] {
        rope_options p;
        p.theta = 500000.0f;
        return p;
    }();
    const double f0 = attnkit::reference::model::rope_inv_freq(o, 128, 0);
    EXPECT_EQ(f0, attnkit::reference::model::rope_inv_freq(plain, 128, 0));
    const double f63 = attnkit::reference::model::rope_inv_freq(o, 128, 63);
    EXPECT_DOUBLE_EQ(f63 * 8.0, attnkit::reference::model::rope_inv_freq(plain, 128, 63));
    rope_options y = with_scaling(rope_scaling_type::yarn);
    EXPECT_DOUBLE_EQ(attnkit::reference::model::rope_attention_factor(y.scaling), 0.1 * std::log(4.0) + 1.0);
    y.scaling.attention_factor = 0.5;
    EXPECT_EQ(attnkit::reference::model::rope_attention_factor(y.scaling), 0.5);
}

// The angles' sine and cosine (simd::sincos: double angles, float results) against the C
// library in double: every quadrant, the reduction's range edge (1.6e6) and beyond, negative
// angles, a count that leaves a partial last block.
TEST(Rope, SinCosOfDoubleAnglesWithinFloatUlps) {
    std::vector<double> x;
    for (int k = -40; k <= 40; ++k) x.push_back(k * 0.7853981633974483);  // multiples of pi/4
    std::uint64_t s = 12345;
    for (int i = 0; i < 4000; ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const double u = static_cast<double>(s >> 11) * 0x1.0p-53;
        x.push_back(i % 4 == 0 ? u * 3.2 : (i % 4 == 1 ? u * 1.7e6 : (i % 4 == 2 ? -u * 2e4 : u * 1e9)));
    }
    x.push_back(1e-30);
    x.push_back(1.6e6);
    x.push_back(1.6e6 + 1.0);
    x.push_back(131071.0);
    x.push_back(std::numeric_limits<double>::infinity());
    x.push_back(1.0);  // 4168 angles: a partial last block at 8 and 16 lanes
    std::vector<float> sn(x.size()), cs(x.size());
    attnkit::simd::sincos<attnkit::simd::default_arch>(x.data(), sn.data(), cs.data(), static_cast<index_t>(x.size()));
    // A float result within 1.5 ulp of 1 (2^-23): the polynomials' ~1 ulp and the final rounding.
    const double tol = 1.5 * std::ldexp(1.0, -23);
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (!std::isfinite(x[i])) {
            EXPECT_TRUE(std::isnan(sn[i]) && std::isnan(cs[i])) << x[i];
            continue;
        }
        const double es = std::fabs(sn[i] - std::sin(x[i])), ec = std::fabs(cs[i] - std::cos(x[i]));
        worst = std::max(worst, std::max(es, ec));
        ASSERT_LE(es, tol) << "sin " << x[i];
        ASSERT_LE(ec, tol) << "cos " << x[i];
    }
    RecordProperty("max_abs_error", std::to_string(worst));
}

// ---- against Hugging Face's convention (golden values from Python) -------------------------

rope_options golden_options(const rope_golden::golden_case& g) {
    rope_options o;
    o.theta = static_cast<float>(g.theta);
    o.style = std::string(g.style) == "interleaved" ? rope_style::interleaved : rope_style::rotate_half;
    o.rotary_dim = g.rotary_dim;
    const std::string t = g.rope_type;
    o.scaling.type = t == "linear"   ? rope_scaling_type::linear
                     : t == "llama3" ? rope_scaling_type::llama3
                     : t == "yarn"   ? rope_scaling_type::yarn
                                     : rope_scaling_type::none;
    o.scaling.factor = g.factor;
    o.scaling.low_freq_factor = g.low_freq_factor;
    o.scaling.high_freq_factor = g.high_freq_factor;
    o.scaling.original_max_position_embeddings = g.original_max_position_embeddings;
    o.scaling.beta_fast = g.beta_fast;
    o.scaling.beta_slow = g.beta_slow;
    o.scaling.mscale = g.mscale;
    o.scaling.mscale_all_dim = g.mscale_all_dim;
    o.scaling.truncate = g.truncate;
    return o;
}

TEST(Rope, MatchesHuggingFaceGolden) {
    int ci = 0;
    for (const rope_golden::golden_case& g : rope_golden::kCases) {
        SCOPED_TRACE(g.name);
        const rope_options o = golden_options(g);
        const index_t n = g.rows, D = g.head_dim;
        // Once as a batch of n rows at their own positions (a ragged decode), once through the
        // oracle: both against the Python values.
        tensor4<float> x(n, 1, 1, D);
        tensor4<double> want(n, 1, 1, D), ref(n, 1, 1, D);
        positions2 pos(n, 1);
        for (index_t r = 0; r < n; ++r) {
            pos(r, 0) = g.positions[r];
            for (index_t d = 0; d < D; ++d) {
                x(r, 0, 0, d) = static_cast<float>(rope_golden::input(ci, static_cast<int>(r), static_cast<int>(d)));
                want(r, 0, 0, d) = g.expected[r * D + d];
            }
        }
        attnkit::reference::model::rope(x, ref, pos, o);
        attnkit::model::rope(x, pos, o);
        const double magnitude = 3.0 * 1.5 * attnkit::reference::model::rope_attention_factor(o.scaling);
        EXPECT_TRUE(all_close(x, want, tolerance_for(4, magnitude)));
        // The oracle in double: the angle p f_c itself carries ~1e-16 p f_c of rounding (1e-11 at
        // p ~ 1e5), the rest is exact to a few ulp.
        EXPECT_TRUE(all_close(ref, want, 1e-10, 1e-10 * magnitude));
        ++ci;
    }
}

// ---- positions ---------------------------------------------------------------------------

TEST(Rope, PerRowPositionsEqualPerCallOffsets) {
    const index_t B = 3, L = 7, H = 2, D = 40;
    const std::int64_t offsets[B] = {0, 4093, 77};
    for (rope_style st : {rope_style::rotate_half, rope_style::interleaved}) {
        rope_options o = with_scaling(rope_scaling_type::llama3);
        o.style = st;
        tensor4<float> x = random_bshd(B, L, H, D, distribution::gaussian, 21);
        tensor4<float> separate = x;
        positions2 pos(B, L);
        for (index_t b = 0; b < B; ++b)
            for (index_t l = 0; l < L; ++l) pos(b, l) = offsets[b] + l;
        attnkit::model::rope(x, pos, o);
        for (index_t b = 0; b < B; ++b) {
            rope_options ob = o;
            ob.position_offset = offsets[b];
            attnkit::model::rope(attnkit::view<float, 4>(separate.data() + b * L * H * D, {1, L, H, D}), ob);
        }
        EXPECT_TRUE(bitwise_equal(x, separate));
    }
}

// A ragged decode step (B sequences at their own lengths, some equal) in one call equals B calls
// of one row each; int32 positions and a strided [B] vector of positions give the same.
TEST(Rope, RaggedDecodeEqualsSeparateCalls) {
    const index_t B = 9, H = 3, D = 64;
    const std::int64_t lengths[B] = {5, 1023, 0, 5, 131071, 77, 8191, 8192, 1};
    for (rope_style st : {rope_style::rotate_half, rope_style::interleaved}) {
        rope_options o = with_scaling(rope_scaling_type::yarn);
        o.style = st;
        tensor4<float> x = random_bshd(B, 1, H, D, distribution::uniform, 8);
        tensor4<float> separate = x, with_int32 = x, with_stride = x;
        positions2 pos(B, 1);
        Eigen::Tensor<std::int32_t, 2, Eigen::RowMajor> pos32(B, 1);
        std::vector<std::int64_t> spaced(2 * B, -1);  // every other entry: a strided view
        for (index_t b = 0; b < B; ++b) {
            pos(b, 0) = lengths[b];
            pos32(b, 0) = static_cast<std::int32_t>(lengths[b]);
            spaced[static_cast<std::size_t>(2 * b)] = lengths[b];
        }
        attnkit::model::rope(x, pos, o);
        attnkit::model::rope(with_int32, pos32, o);
        attnkit::model::rope(with_stride, attnkit::view<const std::int64_t, 2>(spaced.data(), {B, 1}, {2, 1}), o);
        for (index_t b = 0; b < B; ++b) {
            rope_options ob = o;
            ob.position_offset = lengths[b];
            attnkit::model::rope(attnkit::view<float, 4>(separate.data() + b * H * D, {1, 1, H, D}), ob);
        }
        EXPECT_TRUE(bitwise_equal(x, separate));
        EXPECT_TRUE(bitwise_equal(with_int32, separate));
        EXPECT_TRUE(bitwise_equal(with_stride, separate));
    }
}

TEST(Rope, DecodeStepsEqualPrefillRows) {
    const index_t L = 11, H = 2, D = 16;
    tensor4<float> full = random_bshd(1, L, H, D, distribution::uniform, 9);
    tensor4<float> rows = full;
    attnkit::thread_pool pool(2);
    attnkit::model::rope_options o;
    o.pool = &pool;
    attnkit::model::rope(full, o);
    // Row by row, each at its own offset, through a [1, 1, H, D] view into `rows`.
    for (index_t l = 0; l < L; ++l) {
        attnkit::view<float, 4> step(rows.data() + l * H * D, {1, 1, H, D});
        attnkit::model::rope_options so;
        so.position_offset = l;
        attnkit::model::rope(step, so);
    }
    EXPECT_TRUE(bitwise_equal(full, rows));
}

// ---- forms -------------------------------------------------------------------------------

// The interleaved result of x is the rotate-half result of x with its pairs regrouped, bit for
// bit (both compute each output with the same two roundings).
TEST(Rope, InterleavedIsRotateHalfOfRegroupedPairs) {
    for (index_t D : {8, 18, 64, 66}) {
        const index_t R = D - 2, B = 2, L = 3, H = 2;
        rope_options o = with_scaling(rope_scaling_type::yarn);
        o.rotary_dim = R;
        o.position_offset = 1000;
        tensor4<float> x = random_bshd(B, L, H, D, distribution::gaussian, 4);
        tensor4<float> regrouped = x;
        for (index_t i = 0; i < x.size() / D; ++i)
            for (index_t c = 0; c < R / 2; ++c) {
                regrouped.data()[i * D + c] = x.data()[i * D + 2 * c];
                regrouped.data()[i * D + R / 2 + c] = x.data()[i * D + 2 * c + 1];
            }
        rope_options oi = o;
        oi.style = rope_style::interleaved;
        attnkit::model::rope(x, oi);
        attnkit::model::rope(regrouped, o);
        for (index_t i = 0; i < x.size() / D; ++i)
            for (index_t c = 0; c < R / 2; ++c) {
                ASSERT_EQ(x.data()[i * D + 2 * c], regrouped.data()[i * D + c]) << D << " " << i << " " << c;
                ASSERT_EQ(x.data()[i * D + 2 * c + 1], regrouped.data()[i * D + R / 2 + c]) << D << " " << i << " " << c;
            }
    }
}

TEST(Rope, PartialRotaryFactorFollowsHuggingFace) {
    // int(80 * 0.4) = 32: the same as rotary_dim = 32.
    tensor4<float> a = random_bshd(1, 4, 2, 80, distribution::uniform, 3);
    tensor4<float> b = a;
    rope_options oa, ob;
    oa.partial_rotary_factor = 0.4;
    ob.rotary_dim = 32;
    oa.position_offset = ob.position_offset = 12;
    attnkit::model::rope(a, oa);
    attnkit::model::rope(b, ob);
    EXPECT_TRUE(bitwise_equal(a, b));
}

TEST(Rope, KeepsPairNormsAndPositionZeroIsIdentity) {
    const index_t L = 6, H = 3, D = 10;
    tensor4<float> x = random_bshd(2, L, H, D, distribution::outliers, 3);
    const tensor4<float> before = x;
    attnkit::model::rope(x);
    for (index_t b = 0; b < 2; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < H; ++h)
                for (index_t c = 0; c < D / 2; ++c) {
                    const double n0 = std::hypot(before(b, l, h, c), before(b, l, h, c + D / 2));
                    const double n1 = std::hypot(x(b, l, h, c), x(b, l, h, c + D / 2));
                    ASSERT_NEAR(n1, n0, 4 * kEpsFloat * (1.0 + n0));
                    if (l == 0) {
                        ASSERT_EQ(x(b, l, h, c), before(b, l, h, c));
                    }
                }
}

// A NaN spreads to its pair partner only.
TEST(Rope, NaNStaysInItsPair) {
    for (rope_style st : {rope_style::rotate_half, rope_style::interleaved}) {
        tensor4<float> x = random_bshd(1, 2, 2, 32, distribution::uniform, 6);
        x(0, 1, 1, 2) = std::numeric_limits<float>::quiet_NaN();
        rope_options o;
        o.style = st;
        attnkit::model::rope(x, o);
        const index_t partner = st == rope_style::interleaved ? 3 : 18;
        for (index_t l = 0; l < 2; ++l)
            for (index_t h = 0; h < 2; ++h)
                for (index_t d = 0; d < 32; ++d) {
                    const bool hit = l == 1 && h == 1 && (d == 2 || d == partner);
                    ASSERT_EQ(std::isnan(x(0, l, h, d)), hit) << l << " " << h << " " << d;
                }
    }
}

// ---- storage, threads, views --------------------------------------------------------------

template <class T>
void check_16bit_storage() {
    for (rope_style st : {rope_style::rotate_half, rope_style::interleaved})
        for (index_t D : {6, 16, 34, 128}) {
            const index_t B = 2, L = 5, H = 3;
            rope_options o = with_scaling(rope_scaling_type::llama3);
            o.style = st;
            o.position_offset = 8000;
            o.rotary_dim = D == 128 ? 96 : 0;
            const tensor4<float> src = random_bshd(B, L, H, D, distribution::outliers, 13);
            tensor4<T> x(B, L, H, D);
            tensor4<float> wide(B, L, H, D);
            for (index_t i = 0; i < src.size(); ++i) {
                x.data()[i] = T(src.data()[i]);
                wide.data()[i] = static_cast<float>(x.data()[i]);  // exact
            }
            attnkit::model::rope(x, o);
            attnkit::model::rope(wide, o);
            // The kernel rounds its float result once, to nearest even: the same bits as rounding
            // the float path's result (the brief allows one ulp; none is needed).
            for (index_t i = 0; i < x.size(); ++i) {
                const T want = T(wide.data()[i]);
                ASSERT_TRUE(same_bits(x.data()[i], want))
                    << "D " << D << " element " << i << ": " << static_cast<float>(x.data()[i]) << " vs "
                    << static_cast<float>(want);
            }
        }
}

TEST(Rope, Bfloat16StorageEqualsRoundedFloatPath) { check_16bit_storage<Eigen::bfloat16>(); }
TEST(Rope, HalfStorageEqualsRoundedFloatPath) { check_16bit_storage<Eigen::half>(); }

// The kernel's 16-bit store (simd::store_float) against Eigen's conversion of one element, over
// random bit patterns and the edges: ties to even, subnormals, overflow to infinity, NaN.
template <class T>
void check_store_rounding() {
    using A = attnkit::simd::default_arch;
    constexpr index_t W = attnkit::simd::kLanes<A>;
    std::vector<float> v = {1.0f, 1.00390625f, 1.01171875f, -1.00390625f, 3.0e38f, -3.0e38f, 65520.0f, 65519.0f,
                            65504.0f, 1e-40f, -1e-40f, 6e-8f, 2.9802322e-08f, 1e-8f, 0.0f, -0.0f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()};
    std::uint64_t s = 0x9e3779b97f4a7c15ull;
    while (v.size() < 1 << 16) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const std::uint32_t bits = static_cast<std::uint32_t>(s >> 32);
        float f;
        std::memcpy(&f, &bits, sizeof f);
        v.push_back(f);
    }
    while (v.size() % static_cast<std::size_t>(W) != 0) v.push_back(0.5f);
    std::vector<T> got(v.size());
    for (std::size_t i = 0; i < v.size(); i += static_cast<std::size_t>(W))
        attnkit::simd::store_float<A>(got.data() + i, attnkit::simd::loadu<A>(v.data() + i));
    for (std::size_t i = 0; i < v.size(); ++i) {
        const T want(v[i]);
        if (std::isnan(v[i])) {
            ASSERT_TRUE(std::isnan(static_cast<float>(got[i]))) << i;
        } else {
            ASSERT_TRUE(same_bits(got[i], want)) << v[i] << ": " << static_cast<float>(got[i]) << " vs "
                                                 << static_cast<float>(want);
        }
    }
}

TEST(Rope, SixteenBitStoreRoundsAsEigen) {
    check_store_rounding<Eigen::bfloat16>();
    check_store_rounding<Eigen::half>();
}

// The thread-count cases of the forward and the backward: both styles, one position offset or
// a [B, L] position per row, YaRN, partial rotary; fn(options, positions, per_row).
template <class Fn>
void for_each_thread_case(index_t B, index_t L, Fn&& fn) {
    for (rope_style st : {rope_style::rotate_half, rope_style::interleaved})
        for (bool per_row : {false, true}) {
            rope_options o = with_scaling(rope_scaling_type::yarn);
            o.style = st;
            o.rotary_dim = 64;
            if (!per_row) o.position_offset = 500;
            positions2 pos(B, L);
            for (index_t b = 0; b < B; ++b)
                for (index_t l = 0; l < L; ++l) pos(b, l) = 100 * b + 3 * l;
            fn(o, pos, per_row);
        }
}

TEST(Rope, ThreadCountsGiveTheSameBits) {
    const index_t B = 3, L = 37, H = 5, D = 96;
    attnkit::thread_pool p2(2), p3(3);
    for_each_thread_case(B, L, [&](const rope_options& o, const positions2& pos, bool per_row) {
        const tensor4<float> x0 = random_bshd(B, L, H, D, distribution::gaussian, 17);
        tensor4<float> results[3] = {x0, x0, x0};
        attnkit::thread_pool* pools[3] = {nullptr, &p2, &p3};
        for (int t = 0; t < 3; ++t) {
            rope_options ot = o;
            ot.pool = pools[t];
            if (per_row)
                attnkit::model::rope(results[t], pos, ot);
            else
                attnkit::model::rope(results[t], ot);
        }
        EXPECT_TRUE(bitwise_equal(results[0], results[1]));
        EXPECT_TRUE(bitwise_equal(results[0], results[2]));
    });
}

// A cache of tables gives the same bits as computing them; a table is reused only for the same
// options and positions (a different theta, scaling, style, rotary dim or position misses).
TEST(Rope, CacheGivesTheSameBitsAndKeysOnEverything) {
    const index_t B = 4, H = 2, D = 64;
    attnkit::model::rope_cache cache(3);
    positions2 pos(B, 1);
    pos.setValues({{7}, {4000}, {7}, {131000}});
    const tensor4<float> x0 = random_bshd(B, 1, H, D, distribution::gaussian, 41);
    std::vector<rope_options> variants;
    variants.push_back(with_scaling(rope_scaling_type::yarn));
    variants.push_back(variants.back());
    variants.back().theta = 2e6f;
    variants.push_back(variants.back());
    variants.back().style = rope_style::interleaved;
    variants.push_back(variants.back());
    variants.back().rotary_dim = 32;
    variants.push_back(variants.back());
    variants.back().scaling.beta_fast = 16.0;
    variants.push_back(with_scaling(rope_scaling_type::llama3));
    for (int round = 0; round < 2; ++round)
        for (std::size_t v = 0; v < variants.size(); ++v) {
            rope_options plain = variants[v], cached = variants[v];
            cached.cache = &cache;
            tensor4<float> a = x0, b = x0, c = x0;
            attnkit::model::rope(a, pos, plain);
            attnkit::model::rope(b, pos, cached);
            attnkit::model::rope(c, pos, cached);  // a hit
            EXPECT_TRUE(bitwise_equal(a, b)) << v;
            EXPECT_TRUE(bitwise_equal(a, c)) << v;
        }
    // Each variant missed once per round (3 tables kept, 6 variants: every round evicts all),
    // then hit once.
    EXPECT_EQ(cache.misses(), 2 * variants.size());
    EXPECT_EQ(cache.hits(), 2 * variants.size());
    // Another position is another table; the offset form shares the cache.
    rope_options o = variants[0];
    o.cache = &cache;
    positions2 moved = pos;
    moved(3, 0) = 131001;
    tensor4<float> a = x0, b = x0;
    attnkit::model::rope(a, moved, o);
    attnkit::model::rope(b, moved, variants[0]);
    EXPECT_TRUE(bitwise_equal(a, b));
    tensor4<float> p = random_bshd(1, 50, H, D, distribution::gaussian, 3), q = p;
    o.position_offset = 9;
    attnkit::model::rope(p, o);
    attnkit::model::rope(p, o);
    rope_options oq = variants[0];
    oq.position_offset = 9;
    attnkit::model::rope(q, oq);
    attnkit::model::rope(q, oq);
    EXPECT_TRUE(bitwise_equal(p, q));
}

// q and k as views into a fused [B, L, H + 2 Hk, D] buffer: each rotates its own slots, v stays.
TEST(Rope, FusedQkvViews) {
    const index_t B = 2, L = 5, H = 4, Hk = 2, D = 24;
    tensor4<float> qkv = random_bshd(B, L, H + 2 * Hk, D, distribution::uniform, 31);
    const tensor4<float> before = qkv;
    const qkv_views<float> v = fused_qkv_views(qkv.data(), B, L, H, Hk, D);
    rope_options o;
    o.style = rope_style::interleaved;
    o.position_offset = 9;
    attnkit::model::rope(v.q, o);
    attnkit::model::rope(v.k, o);
    tensor4<double> want = make_bshd<double>(B, L, H + 2 * Hk, D);
    attnkit::reference::model::rope(before, want, o);
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < H + 2 * Hk; ++h)
                for (index_t d = 0; d < D; ++d) {
                    if (h < H + Hk) {
                        ASSERT_NEAR(qkv(b, l, h, d), want(b, l, h, d), 4 * kEpsFloat * 1.5);
                    } else {
                        ASSERT_EQ(qkv(b, l, h, d), before(b, l, h, d));
                    }
                }
}

// ---- errors --------------------------------------------------------------------------------

void expect_rejected(const std::function<void()>& f, const std::string& needle) {
    try {
        f();
        ADD_FAILURE() << "no exception; expected one mentioning \"" << needle << "\"";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
}

TEST(Rope, RejectsBadArguments) {
    tensor4<float> odd = make_bshd<float>(1, 2, 1, 5, 1.0f);
    expect_rejected([&] { attnkit::model::rope(odd); }, "x: the head dim must be even");
    tensor4<float> x = make_bshd<float>(2, 3, 2, 8, 1.0f);
    positions2 pos(2, 3);
    pos.setConstant(4);
    const auto bad = [&](const std::function<void(rope_options&)>& set, const std::string& needle) {
        rope_options o;
        set(o);
        expect_rejected([&] { attnkit::model::rope(x, o); }, needle);
        expect_rejected([&] { attnkit::model::rope(x, pos, o); }, needle);
    };
    bad([](rope_options& o) { o.theta = 1.0f; }, "opts.theta");
    bad([](rope_options& o) { o.theta = std::numeric_limits<float>::infinity(); }, "opts.theta");
    bad([](rope_options& o) { o.rotary_dim = 5; }, "opts.rotary_dim: the rotary dim must be even and >= 2, got rotary dim 5 for x [2, 3, 2, 8]");
    bad([](rope_options& o) { o.rotary_dim = 10; }, "opts.rotary_dim: the rotary dim must be <= the head dim D = 8");
    bad([](rope_options& o) { o.rotary_dim = -2; }, "opts.rotary_dim");
    bad([](rope_options& o) { o.partial_rotary_factor = 0.4; }, "opts.partial_rotary_factor: the rotary dim must be even and >= 2, got rotary dim 3");
    bad([](rope_options& o) { o.partial_rotary_factor = 1.5; }, "opts.partial_rotary_factor: expected a value in (0, 1]");
    bad([](rope_options& o) { o.partial_rotary_factor = std::nan(""); }, "opts.partial_rotary_factor");
    bad([](rope_options& o) { o.rotary_dim = 4, o.partial_rotary_factor = 0.5; }, "not both");
    bad([](rope_options& o) { o.style = static_cast<rope_style>(7); }, "opts.style");
    bad([](rope_options& o) { o.scaling.factor = 2.0; }, "opts.scaling.factor: 2 with scaling type none");
    bad([](rope_options& o) { o.scaling.type = rope_scaling_type::linear, o.scaling.factor = 0.5; },
        "opts.scaling.factor: expected a finite value >= 1, got 0.5");
    bad([](rope_options& o) {
        o.scaling.type = rope_scaling_type::linear;
        o.scaling.factor = std::numeric_limits<double>::infinity();
    }, "opts.scaling.factor");
    bad([](rope_options& o) { o = with_scaling(rope_scaling_type::llama3), o.scaling.high_freq_factor = 1.0; },
        "opts.scaling.high_freq_factor");
    bad([](rope_options& o) { o = with_scaling(rope_scaling_type::llama3), o.scaling.low_freq_factor = -1.0; },
        "opts.scaling.low_freq_factor");
    bad([](rope_options& o) { o = with_scaling(rope_scaling_type::llama3), o.scaling.original_max_position_embeddings = 0; },
        "opts.scaling.original_max_position_embeddings");
    bad([](rope_options& o) { o = with_scaling(rope_scaling_type::yarn), o.scaling.beta_fast = 0.5; },
        "opts.scaling.beta_fast");
    bad([](rope_options& o) { o = with_scaling(rope_scaling_type::yarn), o.scaling.beta_slow = std::nan(""); },
        "opts.scaling.beta_slow");
    bad([](rope_options& o) { o = with_scaling(rope_scaling_type::yarn), o.scaling.mscale = -1.0; },
        "opts.scaling.mscale");
    bad([](rope_options& o) { o = with_scaling(rope_scaling_type::yarn), o.scaling.attention_factor = -1.0; },
        "opts.scaling.attention_factor");
    bad([](rope_options& o) { o.scaling.type = static_cast<rope_scaling_type>(9); }, "opts.scaling.type");

    rope_options o;
    o.position_offset = -1;
    expect_rejected([&] { attnkit::model::rope(x, o); }, "opts.position_offset: expected >= 0, got -1");
    o.position_offset = 3;
    expect_rejected([&] { attnkit::model::rope(x, pos, o); }, "opts.position_offset: expected 0 with a positions tensor");
    positions2 wrong(2, 2);
    wrong.setConstant(1);
    expect_rejected([&] { attnkit::model::rope(x, wrong); }, "positions: expected shape [B, L] = [2, 3] for x [2, 3, 2, 8], got [2, 2]");
    positions2 negative = pos;
    negative(1, 2) = -5;
    expect_rejected([&] { attnkit::model::rope(x, negative); }, "positions: expected >= 0, got -5 at [1, 2]");
    EXPECT_TRUE(all_equal_to(x, 1.0f));
    EXPECT_TRUE(all_equal_to(odd, 1.0f));

    tensor4<Eigen::bfloat16> x16(1, 2, 1, 8);
    x16.setConstant(Eigen::bfloat16(1.0f));
    rope_options o16;
    o16.rotary_dim = 3;
    expect_rejected([&] { attnkit::model::rope(x16, o16); }, "opts.rotary_dim");
    for (index_t i = 0; i < x16.size(); ++i) ASSERT_EQ(static_cast<float>(x16.data()[i]), 1.0f);
}

// A view that reaches one row through several indices (a zero stride) would rotate that row
// several times (and race between threads): rejected, nothing written. Positions past int64
// are rejected too, and positions that share x's memory.
TEST(Rope, RejectsSelfOverlappingViewAndPositionOverflow) {
    tensor4<float> one = make_bshd<float>(1, 1, 1, 4, 1.0f);
    const attnkit::view<float, 4> repeated(one.data(), {1, 1, 3, 4}, {4, 4, 0, 1});
    EXPECT_THROW(attnkit::model::rope(repeated), std::invalid_argument);
    const attnkit::view<float, 4> repeated_rows(one.data(), {1, 5, 1, 4}, {4, 0, 4, 1});
    attnkit::model::rope_options o;
    o.position_offset = 1;
    EXPECT_THROW(attnkit::model::rope(repeated_rows, o), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(one, 1.0f));
    tensor4<float> x = make_bshd<float>(1, 3, 1, 4, 1.0f);
    o.position_offset = std::numeric_limits<std::int64_t>::max() - 1;
    EXPECT_THROW(attnkit::model::rope(x, o), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(x, 1.0f));
    // Positions laid over x itself.
    std::vector<std::int64_t> buf(16, 0);
    const attnkit::view<float, 4> xs(reinterpret_cast<float*>(buf.data()), {1, 2, 1, 4});
    const attnkit::view<const std::int64_t, 2> ps(buf.data(), {1, 2});
    EXPECT_THROW(attnkit::model::rope(xs, ps), std::invalid_argument);
}

// ---- backward ------------------------------------------------------------------------------

// The oracle's gradient against central differences of the forward oracle through the loss
// <rope(x), r>: both layouts, partial rotary, yarn's attention factor, llama3, a positions
// tensor.
TEST(RopeBackward, ReferenceMatchesFiniteDifferences) {
    struct fd_case {
        rope_style style;
        rope_scaling_type scaling;
        index_t D, R;
        bool positions;
    };
    const fd_case cases[] = {
        {rope_style::rotate_half, rope_scaling_type::none, 8, 0, false},
        {rope_style::interleaved, rope_scaling_type::yarn, 10, 0, false},
        {rope_style::rotate_half, rope_scaling_type::llama3, 12, 6, true},
        {rope_style::interleaved, rope_scaling_type::linear, 10, 4, true},
    };
    for (const fd_case& c : cases) {
        SCOPED_TRACE(std::string(c.style == rope_style::interleaved ? "interleaved " : "rotate_half ") +
                     scaling_name(c.scaling) + " D " + std::to_string(c.D));
        const index_t B = 2, L = 3, H = 2;
        rope_options o = with_scaling(c.scaling);
        o.style = c.style;
        o.rotary_dim = c.R;
        if (!c.positions) o.position_offset = 5;
        positions2 pos(B, L);
        pos.setValues({{3, 70, 9000}, {0, 12, 131000}});
        tensor4<double> x = random_bshd<double>(B, L, H, c.D, distribution::gaussian, 90 + c.D);
        const tensor4<double> r = random_bshd<double>(B, L, H, c.D, distribution::gaussian, 91 + c.D);
        tensor4<double> dx = make_bshd<double>(B, L, H, c.D), out = make_bshd<double>(B, L, H, c.D);
        if (c.positions)
            attnkit::reference::model::rope_backward(r, dx, pos, o);
        else
            attnkit::reference::model::rope_backward(r, dx, o);
        const auto loss = [&] {
            if (c.positions)
                attnkit::reference::model::rope(x, out, pos, o);
            else
                attnkit::reference::model::rope(x, out, o);
            return projection_loss(out, r);
        };
        expect_gradient_matches_fd(x, dx, loss, "d_x");
    }
}

struct backward_case {
    rope_style style;
    rope_scaling_type scaling;
    index_t D, R;  // R = 0: all of D
    bool positions;
    std::int64_t offset;
};

void PrintTo(const backward_case& c, std::ostream* os) {
    *os << (c.style == rope_style::interleaved ? "interleaved" : "rotate_half") << " " << scaling_name(c.scaling)
        << " D " << c.D << " R " << (c.R ? c.R : c.D);
    if (c.positions)
        *os << " positions";
    else
        *os << " offset " << c.offset;
}

// Rotate-half vectorises over R/2 pairs, interleaved over R elements: head dims of 2 x {1, 2, 3,
// 4, 7, 8, 9, 15, 16, 17, 31, 33, 64} pairs and 100 straddle 4, 8 and 16 lanes in both; the
// scalings in rotation; the partial rotary part (R = half of D, even) beside each full one; a
// positions tensor for every other dim.
std::vector<backward_case> backward_cases() {
    std::vector<backward_case> cases;
    const rope_scaling_type scalings[] = {rope_scaling_type::none, rope_scaling_type::yarn,
                                          rope_scaling_type::llama3, rope_scaling_type::linear};
    const index_t dims[] = {2, 4, 6, 8, 14, 16, 18, 30, 32, 34, 62, 66, 100, 128};
    int k = 0;
    for (rope_style st : {rope_style::rotate_half, rope_style::interleaved})
        for (index_t D : dims) {
            const bool positions = k % 2 == 1;
            const std::int64_t offset = k % 3 == 0 ? 0 : (k % 3 == 1 ? 4093 : 131000);
            cases.push_back({st, scalings[k % 4], D, 0, positions, offset});
            if (D >= 6) cases.push_back({st, scalings[(k + 1) % 4], D, D / 2 - (D / 2) % 2, !positions, offset});
            ++k;
        }
    return cases;
}

class RopeBackwardSweep : public ::testing::TestWithParam<backward_case> {};

TEST_P(RopeBackwardSweep, MatchesReference) {
    const backward_case c = GetParam();
    const index_t B = 2, L = 3, H = 2;
    rope_options o = with_scaling(c.scaling);
    o.style = c.style;
    o.rotary_dim = c.R;
    positions2 pos(B, L);
    pos.setValues({{0, 7, 8191}, {8192, 40000, 131071}});
    if (!c.positions) o.position_offset = c.offset;
    tensor4<float> d = random_bshd(B, L, H, c.D, distribution::outliers, 23 + static_cast<std::uint64_t>(c.D));
    const tensor4<float> before = d;
    tensor4<double> ref = make_bshd<double>(B, L, H, c.D);
    if (c.positions) {
        attnkit::reference::model::rope_backward(d, ref, pos, o);
        attnkit::model::rope_backward(d, pos, o);
    } else {
        attnkit::reference::model::rope_backward(d, ref, o);
        attnkit::model::rope_backward(d, o);
    }
    expect_rotated_like(d, ref, before, c.D, c.R ? c.R : c.D, o);
}

INSTANTIATE_TEST_SUITE_P(Forms, RopeBackwardSweep, ::testing::ValuesIn(backward_cases()), [](const auto& info) {
    const backward_case& c = info.param;
    return std::string(c.style == rope_style::interleaved ? "interleaved" : "half") + "_" + scaling_name(c.scaling) +
           "_D" + std::to_string(c.D) + "_R" + std::to_string(c.R ? c.R : c.D) +
           (c.positions ? std::string("_pos") : "_off" + std::to_string(c.offset));
});

// The rotation is orthogonal: the gradient of rope applied to rope(x) gives back af^2 x (x
// itself without an attention factor), for both layouts, partial rotary and long positions.
TEST(RopeBackward, InvertsRope) {
    for (rope_scaling_type t : {rope_scaling_type::none, rope_scaling_type::llama3, rope_scaling_type::yarn})
        for (rope_style st : {rope_style::rotate_half, rope_style::interleaved}) {
            SCOPED_TRACE(std::string(scaling_name(t)) + (st == rope_style::interleaved ? " interleaved" : " half"));
            rope_options o = with_scaling(t);
            o.style = st;
            o.rotary_dim = 48;
            o.position_offset = 100000;
            const tensor4<float> x = random_bshd(2, 5, 3, 64, distribution::gaussian, 77);
            tensor4<float> y = x;
            attnkit::model::rope(y, o);
            attnkit::model::rope_backward(y, o);
            const double af = attnkit::reference::model::rope_attention_factor(o.scaling);
            tensor4<double> want = make_bshd<double>(2, 5, 3, 64);
            for (index_t i = 0; i < x.size(); ++i)
                want.data()[i] = (i % 64 < 48 ? af * af : 1.0) * static_cast<double>(x.data()[i]);
            EXPECT_TRUE(all_close(y, want, tolerance_for(8, 1.5 * af * af * max_abs(x))));
        }
}

TEST(RopeBackward, ThreadCountsAndCacheGiveTheSameBits) {
    const index_t B = 3, L = 37, H = 5, D = 96;
    attnkit::thread_pool p2(2), p3(3);
    attnkit::model::rope_cache cache;
    for_each_thread_case(B, L, [&](const rope_options& o, const positions2& pos, bool per_row) {
        const tensor4<float> d0 = random_bshd(B, L, H, D, distribution::gaussian, 19);
        tensor4<float> results[4] = {d0, d0, d0, d0};
        attnkit::thread_pool* pools[4] = {nullptr, &p2, &p3, &p2};
        for (int t = 0; t < 4; ++t) {
            rope_options ot = o;
            ot.pool = pools[t];
            if (t == 3) {  // the forward's cached table serves the backward
                ot.cache = &cache;
                tensor4<float> fwd = d0;
                if (per_row)
                    attnkit::model::rope(fwd, pos, ot);
                else
                    attnkit::model::rope(fwd, ot);
            }
            if (per_row)
                attnkit::model::rope_backward(results[t], pos, ot);
            else
                attnkit::model::rope_backward(results[t], ot);
        }
        EXPECT_TRUE(bitwise_equal(results[0], results[1]));
        EXPECT_TRUE(bitwise_equal(results[0], results[2]));
        EXPECT_TRUE(bitwise_equal(results[0], results[3]));
    });
    EXPECT_EQ(cache.hits(), 4u);
    EXPECT_EQ(cache.misses(), 4u);
}

// Errors as the forward's, naming d_x; nothing written.
TEST(RopeBackward, RejectsBadArguments) {
    tensor4<float> odd = make_bshd<float>(1, 2, 1, 5, 1.0f);
    expect_rejected([&] { attnkit::model::rope_backward(odd); }, "d_x: the head dim must be even");
    tensor4<float> x = make_bshd<float>(2, 3, 2, 8, 1.0f);
    rope_options o;
    o.rotary_dim = 10;
    expect_rejected([&] { attnkit::model::rope_backward(x, o); }, "got rotary dim 10 for d_x [2, 3, 2, 8]");
    o = rope_options{};
    o.theta = 0.5f;
    expect_rejected([&] { attnkit::model::rope_backward(x, o); }, "opts.theta");
    positions2 wrong(2, 2);
    wrong.setConstant(1);
    expect_rejected([&] { attnkit::model::rope_backward(x, wrong); },
                    "positions: expected shape [B, L] = [2, 3] for d_x [2, 3, 2, 8], got [2, 2]");
    positions2 negative(2, 3);
    negative.setConstant(1);
    negative(0, 1) = -3;
    expect_rejected([&] { attnkit::model::rope_backward(x, negative); }, "positions: expected >= 0, got -3 at [0, 1]");
    const attnkit::view<float, 4> repeated(x.data(), {1, 1, 3, 8}, {8, 8, 0, 1});
    expect_rejected([&] { attnkit::model::rope_backward(repeated); }, "d_x: strides");
    EXPECT_TRUE(all_equal_to(x, 1.0f));
    EXPECT_TRUE(all_equal_to(odd, 1.0f));
}

}  // namespace
