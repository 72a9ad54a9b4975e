// static_qk_attention and static_attention_map against attnkit::reference::static_qk_attention.
//
// Sizes straddle the lane width W, the engine's row panel (2W) and micro tile (kMR keys), the
// map's micro tile (6 rows) and key block (64): 1, W-1, W, W+1, 3W+2, odd primes, L < Lmax and
// L = Lmax, Lmax not a multiple of any tile. Tolerances: tolerance_for(k, magnitude) with the
// attention magnitude of the stream and values.
#include "attnkit/static_qk_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/reference/static_qk_attention.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/sweep.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::static_attention_map;
using attnkit::static_qk_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;

using weights3 = Eigen::Tensor<double, 3, Eigen::RowMajor>;
constexpr index_t W = attnkit::simd::kLanes<attnkit::simd::default_arch>;
constexpr float kSentinel = 7.0f;
constexpr double kK = 64;  // eps multiple of the float-vs-double tolerance

struct shape {
    index_t B, Lmax, L, H, Hk, D, Dv;
};

std::string describe(const shape& s) {
    return "B " + std::to_string(s.B) + " Lmax " + std::to_string(s.Lmax) + " L " + std::to_string(s.L) + " H " +
           std::to_string(s.H) + " Hk " + std::to_string(s.Hk) + " D " + std::to_string(s.D) + " Dv " +
           std::to_string(s.Dv);
}

struct problem {
    shape s;
    tensor4<float> qf, kf, v;
    tensor4<double> want;  // the oracle, all L rows
    weights3 w;            // [H, L, L]
    double magnitude;
};

problem make_problem(const shape& s, distribution d, std::uint64_t seed, float scale = 0.0f) {
    problem p{s, random_bshd(1, s.Lmax, s.H, s.D, d, seed), random_bshd(1, s.Lmax, s.Hk, s.D, d, seed + 1),
              random_bshd(s.B, s.L, s.Hk, s.Dv, d, seed + 2), make_bshd<double>(s.B, s.L, s.H, s.Dv), {}, 0.0};
    static_qk_options o;
    o.scale = scale;
    ref::static_qk_attention(p.qf, p.kf, p.v, p.want, p.w, o);
    const double sc = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(s.D));
    p.magnitude = attention_magnitude(p.qf, p.kf, p.v, sc);
    return p;
}

// Rows first .. first + T - 1 of a [B, L, H, Dv] tensor.
tensor4<double> rows_of(const tensor4<double>& x, index_t first, index_t T) {
    tensor4<double> r(x.dimension(0), T, x.dimension(2), x.dimension(3));
    for (index_t b = 0; b < x.dimension(0); ++b)
        for (index_t t = 0; t < T; ++t)
            for (index_t h = 0; h < x.dimension(2); ++h)
                for (index_t c = 0; c < x.dimension(3); ++c) r(b, t, h, c) = x(b, first + t, h, c);
    return r;
}

std::vector<shape> sweep() {
    std::vector<shape> v;
    const index_t lens[] = {1, W - 1, W, W + 1, 3 * W + 2, 13, 67, 131};
    for (index_t Lmax : lens) {
        if (Lmax < 1) continue;
        for (index_t L : {index_t(1), (Lmax + 1) / 2, Lmax}) {
            v.push_back({3, Lmax, L, 4, 2, W + 1, 3 * W + 2});
            v.push_back({1, Lmax, L, 3, 3, 7, W});
        }
    }
    for (index_t B : {1, 3, 8})
        for (index_t Dv : {index_t(1), W - 1, W + 1, index_t(64)}) v.push_back({B, 70, 69, 4, 1, 16, Dv > 0 ? Dv : 1});
    v.push_back({2, 200, 197, 2, 2, 64, 64});  // several key blocks, Lmax not a tile multiple
    v.push_back({8, 97, 97, 8, 4, 2 * W, 2 * W - 1});
    return v;
}

// ---- the kernel ------------------------------------------------------------------------------

TEST(static_qk_attention, matches_reference_on_sweep) {
    for (distribution d : kAllDistributions)
        for (const shape& s : sweep()) {
            SCOPED_TRACE(describe(s) + " " + name(d));
            const problem p = make_problem(s, d, 700 + s.Lmax);
            tensor4<float> out = make_bshd<float>(s.B, s.L, s.H, s.Dv, kSentinel);
            attnkit::static_qk_attention(p.qf, p.kf, p.v, out);
            EXPECT_TRUE(all_close(out, p.want, tolerance_for(kK, p.magnitude)));
        }
}

// Many value sets (B > kMaxValueSets runs in groups), a scale, strided views of the inputs.
TEST(static_qk_attention, large_batch_scale_and_strided_views) {
    const shape s{19, 40, 33, 4, 2, 8, 5};
    const problem p = make_problem(s, distribution::gaussian, 800, 0.3f);
    static_qk_options o;
    o.scale = 0.3f;
    tensor4<float> out = make_bshd<float>(s.B, s.L, s.H, s.Dv, kSentinel);
    attnkit::static_qk_attention(p.qf, p.kf, p.v, out, o);
    EXPECT_TRUE(all_close(out, p.want, tolerance_for(kK, attention_magnitude(p.qf, p.kf, p.v, 0.3))));

    // v and out inside wider buffers: [B, L, Hk, Dv] with a padded batch and row stride.
    std::vector<float> vbuf(static_cast<std::size_t>(s.B * (s.L + 1) * s.Hk * (s.Dv + 3)), 0.0f);
    const attnkit::view<float, 4> vview(vbuf.data(), {s.B, s.L, s.Hk, s.Dv},
                                        {(s.L + 1) * s.Hk * (s.Dv + 3), s.Hk * (s.Dv + 3), s.Dv + 3, 1});
    for (index_t b = 0; b < s.B; ++b)
        for (index_t j = 0; j < s.L; ++j)
            for (index_t h = 0; h < s.Hk; ++h)
                for (index_t c = 0; c < s.Dv; ++c) vview(b, j, h, c) = p.v(b, j, h, c);
    std::vector<float> obuf(static_cast<std::size_t>(s.B * s.L * s.H * (s.Dv + 2)), kSentinel);
    const attnkit::view<float, 4> oview(obuf.data(), {s.B, s.L, s.H, s.Dv},
                                        {s.L * s.H * (s.Dv + 2), s.H * (s.Dv + 2), s.Dv + 2, 1});
    attnkit::static_qk_attention(p.qf, p.kf, attnkit::view<const float, 4>(vview), oview, o);
    EXPECT_TRUE(all_close(oview, out, 0.0, 0.0));
    for (index_t x = 0; x < static_cast<index_t>(obuf.size()); ++x) {
        if (x % (s.Dv + 2) >= s.Dv) {
            ASSERT_EQ(kSentinel, obuf[static_cast<std::size_t>(x)]) << "padding written";
        }
    }
}

// The kernel, the map and the oracle agree; the map's last rows equal the kernel's.
TEST(static_qk_attention, kernel_map_and_reference_agree) {
    // Under a sanitizer the first shape has fewer batch items (the same rows, fewer of them).
    const index_t B0 = kSanitizerSweep ? 2 : 8;
    for (const shape& s : {shape{B0, 300, 290, 8, 8, 64, 64}, shape{3, 131, 131, 6, 2, 2 * W + 1, W - 1 > 0 ? W - 1 : 1}}) {
        SCOPED_TRACE(describe(s));
        const problem p = make_problem(s, distribution::gaussian, 900);
        const tolerance tol = tolerance_for(kK, p.magnitude);
        tensor4<float> k_out = make_bshd<float>(s.B, s.L, s.H, s.Dv, kSentinel);
        attnkit::static_qk_attention(p.qf, p.kf, p.v, k_out);
        const static_attention_map map(p.qf, p.kf);
        tensor4<float> m_out = make_bshd<float>(s.B, s.L, s.H, s.Dv, kSentinel);
        map.apply(p.v, m_out);
        EXPECT_TRUE(all_close(k_out, p.want, tol));
        EXPECT_TRUE(all_close(m_out, p.want, tol));
        EXPECT_TRUE(all_close(m_out, to_double(k_out), tol));
        tensor4<float> last = make_bshd<float>(s.B, 3, s.H, s.Dv, kSentinel);
        map.apply(p.v, last);
        EXPECT_TRUE(all_close(last, rows_of(to_double(k_out), s.L - 3, 3), tol));
    }
}

// NaN in one batch item's values stays in that item (each value set has its own accumulators).
TEST(static_qk_attention, nan_in_one_item_stays_there) {
    const shape s{3, 50, 50, 2, 1, 8, 8};
    problem p = make_problem(s, distribution::uniform, 1000);
    p.v(1, 20, 0, 3) = std::numeric_limits<float>::quiet_NaN();
    tensor4<float> out = make_bshd<float>(s.B, s.L, s.H, s.Dv, kSentinel);
    attnkit::static_qk_attention(p.qf, p.kf, p.v, out);
    const tolerance tol = tolerance_for(kK, p.magnitude);
    for (index_t b : {0, 2}) {
        tensor4<double> got(1, s.L, s.H, s.Dv), want(1, s.L, s.H, s.Dv);
        for (index_t i = 0; i < s.L; ++i)
            for (index_t h = 0; h < s.H; ++h)
                for (index_t c = 0; c < s.Dv; ++c) got(0, i, h, c) = out(b, i, h, c), want(0, i, h, c) = p.want(b, i, h, c);
        EXPECT_TRUE(all_close(got, want, tol)) << "item " << b;
    }
    for (index_t i = 0; i < 20; ++i) EXPECT_FALSE(std::isnan(out(1, i, 0, 3))) << "row " << i << " sees no NaN key";
    EXPECT_TRUE(std::isnan(out(1, 20, 0, 3)));
}

TEST(static_qk_attention, bitwise_identical_for_any_thread_count) {
    for (const shape& s : {shape{8, 600, 577, 4, 2, 64, 64}, shape{3, 1100, 1100, 2, 2, 16, 9}}) {
        SCOPED_TRACE(describe(s));
        const tensor4<float> qf = random_bshd(1, s.Lmax, s.H, s.D, distribution::outliers, 1);
        const tensor4<float> kf = random_bshd(1, s.Lmax, s.Hk, s.D, distribution::outliers, 2);
        const tensor4<float> v = random_bshd(s.B, s.L, s.Hk, s.Dv, distribution::outliers, 3);
        tensor4<float> out1 = make_bshd<float>(s.B, s.L, s.H, s.Dv);
        attnkit::static_qk_attention(qf, kf, v, out1);
        for (std::size_t n : {2u, 3u}) {
            attnkit::thread_pool pool(n);
            static_qk_options o;
            o.pool = &pool;
            tensor4<float> outn = make_bshd<float>(s.B, s.L, s.H, s.Dv);
            attnkit::static_qk_attention(qf, kf, v, outn, o);
            EXPECT_TRUE(all_close(outn, out1, 0.0, 0.0)) << n << " threads";
        }
    }
}

TEST(static_qk_attention, bad_input_throws_before_writing) {
    const index_t B = 2, Lmax = 5, H = 4, Hk = 2, D = 3;
    const tensor4<float> qf = random_bshd(1, Lmax, H, D, distribution::uniform, 1);
    const tensor4<float> kf = random_bshd(1, Lmax, Hk, D, distribution::uniform, 2);
    const tensor4<float> v = random_bshd(B, Lmax, Hk, D, distribution::uniform, 3);
    tensor4<float> out = make_bshd<float>(B, Lmax, H, D, kSentinel);
    const tensor4<float> qf_b2 = random_bshd(2, Lmax, H, D, distribution::uniform, 4);
    expect_invalid([&] { attnkit::static_qk_attention(qf_b2, kf, v, out); }, "q_fixed: expected batch 1");
    const tensor4<float> kf_b2 = random_bshd(2, Lmax, Hk, D, distribution::uniform, 5);
    expect_invalid([&] { attnkit::static_qk_attention(qf, kf_b2, v, out); }, "k_fixed: expected batch 1");
    const tensor4<float> v_long = random_bshd(B, Lmax + 1, Hk, D, distribution::uniform, 6);
    tensor4<float> out_long = make_bshd<float>(B, Lmax + 1, H, D, kSentinel);
    expect_invalid([&] { attnkit::static_qk_attention(qf, kf, v_long, out_long); }, "exceeds the fixed stream's Lmax");
    const tensor4<float> kf_h3 = random_bshd(1, Lmax, 3, D, distribution::uniform, 7);
    const tensor4<float> v_h3 = random_bshd(B, Lmax, 3, D, distribution::uniform, 8);
    expect_invalid([&] { attnkit::static_qk_attention(qf, kf_h3, v_h3, out); }, "multiple of key heads");
    const tensor4<float> v_h = random_bshd(B, Lmax, H, D, distribution::uniform, 9);
    expect_invalid([&] { attnkit::static_qk_attention(qf, kf, v_h, out); }, "v: expected 2 key/value heads");
    tensor4<float> out_t = make_bshd<float>(B, Lmax - 1, H, D, kSentinel);
    expect_invalid([&] { attnkit::static_qk_attention(qf, kf, v, out_t); }, "out: expected shape");
    static_qk_options o;
    o.scale = -2.0f;
    expect_invalid([&] { attnkit::static_qk_attention(qf, kf, v, out, o); }, "opts.scale");
    EXPECT_TRUE(all_equal_to(out, kSentinel));
    EXPECT_TRUE(all_equal_to(out_long, kSentinel));
    EXPECT_TRUE(all_equal_to(out_t, kSentinel));
}

// ---- the map ---------------------------------------------------------------------------------

TEST(static_attention_map, rows_match_reference_weights) {
    for (const shape& s : {shape{1, 37, 37, 4, 2, 9, 3}, shape{1, 2 * W + 1, 2 * W + 1, 2, 1, W, 1}}) {
        SCOPED_TRACE(describe(s));
        const problem p = make_problem(s, distribution::gaussian, 100);
        const static_attention_map map(p.qf, p.kf);
        ASSERT_EQ(s.Lmax, map.max_length());
        ASSERT_EQ(s.H, map.heads());
        ASSERT_EQ(s.Hk, map.heads_kv());
        EXPECT_EQ(static_cast<std::size_t>(s.H * s.Lmax * (s.Lmax + 1) / 2) * sizeof(float), map.bytes());
        tensor3<double> got(s.H, s.L, s.L);
        got.setZero();
        for (index_t h = 0; h < s.H; ++h)
            for (index_t i = 0; i < s.L; ++i)
                for (index_t j = 0; j <= i; ++j) got(h, i, j) = map.row(h, i)[j];
        // Weights are probabilities of scores up to scale |q| |k|: the magnitude is that bound.
        EXPECT_TRUE(all_close(got, p.w, tolerance_for(kK, 1.0 + p.magnitude / max_abs(p.v))));
    }
}

TEST(static_attention_map, apply_matches_reference_on_sweep) {
    for (distribution d : kAllDistributions)
        for (const shape& s : sweep()) {
            SCOPED_TRACE(describe(s) + " " + name(d));
            const problem p = make_problem(s, d, 200 + s.Lmax);
            const static_attention_map map(p.qf, p.kf);
            tensor4<float> out = make_bshd<float>(s.B, s.L, s.H, s.Dv, kSentinel);
            map.apply(p.v, out);
            EXPECT_TRUE(all_close(out, p.want, tolerance_for(kK, p.magnitude)));
        }
}

// The last T rows (T = 1: a decode step over the cache v) equal those rows of the whole call.
TEST(static_attention_map, last_rows_and_decode) {
    const shape s{3, 150, 141, 4, 2, 16, 2 * W + 3};
    const problem p = make_problem(s, distribution::gaussian, 300);
    attnkit::thread_pool pool(2);
    const static_attention_map map(p.qf, p.kf);
    for (index_t T : {index_t(0), index_t(1), index_t(2), index_t(7), index_t(64), index_t(65), s.L}) {
        SCOPED_TRACE(T);
        tensor4<float> out = make_bshd<float>(s.B, T, s.H, s.Dv, kSentinel);
        map.apply(p.v, out, &pool);
        EXPECT_TRUE(all_close(out, rows_of(p.want, s.L - T, T), tolerance_for(kK, p.magnitude)));
    }
    // Decode steps over a growing cache: step len uses the first len rows of v.
    for (index_t len : {index_t(1), index_t(2), index_t(66), s.L}) {
        SCOPED_TRACE(len);
        tensor4<float> cache(s.B, len, s.Hk, s.Dv);
        for (index_t b = 0; b < s.B; ++b)
            for (index_t j = 0; j < len; ++j)
                for (index_t h = 0; h < s.Hk; ++h)
                    for (index_t c = 0; c < s.Dv; ++c) cache(b, j, h, c) = p.v(b, j, h, c);
        tensor4<float> out = make_bshd<float>(s.B, 1, s.H, s.Dv, kSentinel);
        map.apply(cache, out);
        EXPECT_TRUE(all_close(out, rows_of(p.want, len - 1, 1), tolerance_for(kK, p.magnitude)));
    }
}

// out [B, T, H, Dv] must be the last T rows of w's lower triangle applied to v [B, L, Hk, Dv] in
// double (query head h reads value head h / group), within a tolerance scaled by the largest
// sum |w_ij| |v_j| of a row.
template <class WT>
void expect_mixes_lower_triangle(const WT& w, const tensor4<float>& v, const tensor4<float>& out, index_t group) {
    const index_t B = v.dimension(0), L = v.dimension(1), T = out.dimension(1), H = out.dimension(2);
    const index_t Dv = v.dimension(3);
    tensor4<double> want = make_bshd<double>(B, T, H, Dv);
    double mag = 0;
    for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < T; ++t)
            for (index_t h = 0; h < H; ++h) {
                const index_t i = L - T + t;
                double row = 0;
                for (index_t j = 0; j <= i; ++j) row += std::fabs(w(h, i, j));
                mag = std::max(mag, row * max_abs(v));
                for (index_t c = 0; c < Dv; ++c) {
                    double acc = 0;
                    for (index_t j = 0; j <= i; ++j) acc += double(w(h, i, j)) * v(b, j, h / group, c);
                    want(b, t, h, c) = acc;
                }
            }
    EXPECT_TRUE(all_close(out, want, tolerance_for(kK, mag)));
}

// from_weights uses the lower triangle as given (no renormalisation) and never reads above the
// diagonal: NaN there changes nothing.
TEST(static_attention_map, from_weights_ignores_upper_triangle) {
    const index_t H = 4, Lmax = 3 * W + 2, L = Lmax - 1, B = 3, Dv = W + 1;
    for (index_t hk : {index_t(0), index_t(2)}) {
        SCOPED_TRACE(hk);
        const index_t Hk = hk == 0 ? H : hk;
        Eigen::Tensor<float, 3, Eigen::RowMajor> w(H, Lmax, Lmax);
        fill_random(w, distribution::gaussian, 400);
        for (index_t h = 0; h < H; ++h)
            for (index_t i = 0; i < Lmax; ++i)
                for (index_t j = i + 1; j < Lmax; ++j) w(h, i, j) = std::numeric_limits<float>::quiet_NaN();
        const tensor4<float> v = random_bshd(B, L, Hk, Dv, distribution::gaussian, 401);
        const static_attention_map map = static_attention_map::from_weights(w, hk);
        EXPECT_EQ(Lmax, map.max_length());
        EXPECT_EQ(H, map.heads());
        EXPECT_EQ(hk, map.heads_kv());  // 0: taken from v
        tensor4<float> out = make_bshd<float>(B, L, H, Dv, kSentinel);
        map.apply(v, out);
        expect_mixes_lower_triangle(w, v, out, H / Hk);
    }
}

// from_weights(w) without heads_kv reads the key/value heads from v, as every other entry point
// does (GQA by index: query head h reads value head h / (H / Hk)); one map serves v with H, H / 2
// or 1 heads. A v whose heads do not divide H is rejected, naming v, before anything is written.
TEST(static_attention_map, from_weights_reads_kv_heads_from_v) {
    const index_t H = 4, Lmax = 2 * W + 3, L = Lmax - 2, B = 2, Dv = W + 3;
    Eigen::Tensor<float, 3, Eigen::RowMajor> w(H, Lmax, Lmax);
    fill_random(w, distribution::gaussian, 410);
    const static_attention_map map = static_attention_map::from_weights(w);
    EXPECT_EQ(0, map.heads_kv());  // taken from v
    for (index_t Hk : {H, H / 2, index_t(1)}) {
        SCOPED_TRACE(Hk);
        const tensor4<float> v = random_bshd(B, L, Hk, Dv, distribution::gaussian, 411 + Hk);
        tensor4<float> out = make_bshd<float>(B, 3, H, Dv, kSentinel);  // the last 3 rows
        map.apply(v, out);
        expect_mixes_lower_triangle(w, v, out, H / Hk);
    }
    const tensor4<float> v3 = random_bshd(B, L, 3, Dv, distribution::gaussian, 420);
    tensor4<float> out = make_bshd<float>(B, 1, H, Dv, kSentinel);
    expect_invalid([&] { map.apply(v3, out); }, "v: key/value heads Hk = 3 must divide");
    EXPECT_TRUE(all_equal_to(out, kSentinel));
    // A map of a stream keeps its k_fixed's heads: v must have them (tested in rejects_bad_input).
}

TEST(static_attention_map, bitwise_identical_for_any_thread_count) {
    const shape s{3, 211, 203, 4, 2, 32, 40};
    const problem p = make_problem(s, distribution::outliers, 500);
    const static_attention_map m1(p.qf, p.kf);
    tensor4<float> out1 = make_bshd<float>(s.B, s.L, s.H, s.Dv);
    m1.apply(p.v, out1);
    for (std::size_t n : {2u, 3u}) {
        attnkit::thread_pool pool(n);
        static_qk_options o;
        o.pool = &pool;
        const static_attention_map mn(p.qf, p.kf, o);
        for (index_t h = 0; h < s.H; ++h)
            for (index_t i = 0; i < s.Lmax; ++i)
                for (index_t j = 0; j <= i; ++j) ASSERT_EQ(m1.row(h, i)[j], mn.row(h, i)[j]);
        tensor4<float> outn = make_bshd<float>(s.B, s.L, s.H, s.Dv);
        mn.apply(p.v, outn, &pool);
        EXPECT_TRUE(all_close(outn, out1, 0.0, 0.0)) << n << " threads";
    }
}

// Scores of 1e4 in magnitude: the map's exact row max and the kernel's online max keep them finite.
TEST(static_attention_map, extreme_logits) {
    const shape s{2, 40, 40, 2, 2, 4, 5};
    problem p = make_problem(s, distribution::gaussian, 600, 1.0f);
    for (index_t i = 0; i < s.Lmax; ++i)
        for (index_t h = 0; h < s.H; ++h)
            for (index_t d = 0; d < s.D; ++d) {
                p.qf(0, i, h, d) *= 50.0f;
                p.kf(0, i, h, d) *= 50.0f;
            }
    static_qk_options o;
    o.scale = 1.0f;
    ref::static_qk_attention(p.qf, p.kf, p.v, p.want, o);
    const static_attention_map map(p.qf, p.kf, o);
    const tolerance tol = tolerance_for(kK, attention_magnitude(p.qf, p.kf, p.v, 1.0));
    tensor4<float> out = make_bshd<float>(s.B, s.L, s.H, s.Dv, kSentinel);
    map.apply(p.v, out);
    EXPECT_TRUE(all_close(out, p.want, tol));
    tensor4<float> k_out = make_bshd<float>(s.B, s.L, s.H, s.Dv, kSentinel);
    attnkit::static_qk_attention(p.qf, p.kf, p.v, k_out, o);
    EXPECT_TRUE(all_close(k_out, p.want, tol));
}

TEST(static_attention_map, bad_input_throws_before_writing) {
    const index_t B = 2, Lmax = 9, H = 4, Hk = 2, D = 3, Dv = 5;
    const tensor4<float> qf = random_bshd(1, Lmax, H, D, distribution::uniform, 1);
    const tensor4<float> kf = random_bshd(1, Lmax, Hk, D, distribution::uniform, 2);
    const static_attention_map map(qf, kf);
    tensor4<float> out = make_bshd<float>(B, Lmax, H, Dv, kSentinel);

    const tensor4<float> v_long = random_bshd(B, Lmax + 1, Hk, Dv, distribution::uniform, 3);
    expect_invalid([&] { map.apply(v_long, out); }, "exceeds the map's Lmax = 9");
    const tensor4<float> v_heads = random_bshd(B, Lmax, H, Dv, distribution::uniform, 4);
    expect_invalid([&] { map.apply(v_heads, out); }, "v: expected 2 key/value heads");
    const tensor4<float> v_short = random_bshd(B, 4, Hk, Dv, distribution::uniform, 5);
    expect_invalid([&] { map.apply(v_short, out); }, "out: expected shape [B, T, H, Dv]");  // T = 9 > L = 4
    tensor4<float> out_h = make_bshd<float>(B, 4, H + 1, Dv, kSentinel);
    expect_invalid([&] { map.apply(v_short, out_h); }, "out: expected shape");
    EXPECT_TRUE(all_equal_to(out, kSentinel));
    EXPECT_TRUE(all_equal_to(out_h, kSentinel));

    const tensor4<float> qf_b2 = random_bshd(2, Lmax, H, D, distribution::uniform, 6);
    expect_invalid([&] { static_attention_map m(qf_b2, kf); }, "q_fixed: expected batch 1");
    const tensor4<float> kf_h3 = random_bshd(1, Lmax, 3, D, distribution::uniform, 7);
    expect_invalid([&] { static_attention_map m(qf, kf_h3); }, "multiple of key heads");
    static_qk_options o;
    o.scale = std::numeric_limits<float>::infinity();
    expect_invalid([&] { static_attention_map m(qf, kf, o); }, "opts.scale");

    const Eigen::Tensor<float, 3, Eigen::RowMajor> w_rect(2, 4, 5);
    expect_invalid([&] { static_attention_map::from_weights(w_rect); }, "w: expected a square");
    // A w of another rank stops at compile time (view.hpp's rank static_assert).
    const Eigen::Tensor<float, 3, Eigen::RowMajor> w_sq(4, 3, 3);
    expect_invalid([&] { static_attention_map::from_weights(w_sq, 3); }, "heads_kv");
}

// Outputs share no memory with the inputs: not even out = v in place (H == Hk, same shape),
// since every query block reads all value rows up to its own. Nothing is written.
TEST(static_qk_attention, out_overlapping_an_input_is_rejected) {
    const index_t B = 2, Lmax = 7, H = 2, D = 4;
    tensor4<float> qf = random_bshd(1, Lmax, H, D, distribution::uniform, 1);
    tensor4<float> kf = random_bshd(1, Lmax, H, D, distribution::uniform, 2);
    tensor4<float> v = random_bshd(B, Lmax, H, D, distribution::uniform, 3);
    const tensor4<float> v_before = v;
    expect_invalid([&] { attnkit::static_qk_attention(qf, kf, v, v); }, "out [2, 7, 2, 4] and v [2, 7, 2, 4] overlap");
    // out over the stream: a [1, Lmax, H, D] out of a batch-1 call laid over q_fixed or k_fixed.
    const tensor4<float> v1 = random_bshd(1, Lmax, H, D, distribution::uniform, 4);
    const tensor4<float> qf_before = qf;
    expect_invalid([&] { attnkit::static_qk_attention(qf, kf, v1, qf); }, "and q_fixed");
    expect_invalid([&] { attnkit::static_qk_attention(qf, kf, v1, kf); }, "and k_fixed");
    // ... and a zero-stride out (every row the same memory).
    tensor4<float> row = make_bshd<float>(B, 1, H, D, kSentinel);
    const attnkit::view<float, 4> zero(row.data(), {B, Lmax, H, D}, {H * D, 0, D, 1});
    expect_invalid([&] { attnkit::static_qk_attention(qf, kf, v, zero); }, "make its elements overlap");
    EXPECT_TRUE(all_equal_to(row, kSentinel));
    EXPECT_TRUE(all_close(v, v_before, 0.0, 0.0));
    EXPECT_TRUE(all_close(qf, qf_before, 0.0, 0.0));

    const static_attention_map map(qf, kf);
    expect_invalid([&] { map.apply(v, v); }, "out [2, 7, 2, 4] and v [2, 7, 2, 4] overlap");
    // The last row of out (T = 1) laid over v's last row.
    const attnkit::view<float, 4> last(v.data() + (Lmax - 1) * H * D, {B, 1, H, D}, {Lmax * H * D, H * D, D, 1});
    expect_invalid([&] { map.apply(v, last); }, "overlap in memory");
    expect_invalid([&] { map.apply(v, zero); }, "make its elements overlap");
    EXPECT_TRUE(all_close(v, v_before, 0.0, 0.0));
    EXPECT_TRUE(all_equal_to(row, kSentinel));
}

}  // namespace
