// attnkit::gated_mlp against attnkit::reference::gated_mlp (docs/variants.md section 6): shapes from
// 1 x 1 x 1 to d_model 512 / m 683 around the SIMD width and the block edges, rank 2 and 3,
// strided inputs and outputs, the three input distributions, extreme gates, NaN isolation,
// bitwise identical results for 1, 2 and 3 threads, and every bad input rejected before a
// write.
#include <gtest/gtest.h>

#include <attnkit/attnkit.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit_test::distribution;
using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;

constexpr double kEps = std::numeric_limits<float>::epsilon();

struct weights {
    tensor2 gate, up, down;
};

weights random_weights(index_t d, index_t m, distribution dist, std::uint64_t seed) {
    weights w{tensor2(d, m), tensor2(d, m), tensor2(m, d)};
    attnkit_test::fill_random(w.gate, dist, seed);
    attnkit_test::fill_random(w.up, dist, seed + 1);
    attnkit_test::fill_random(w.down, dist, seed + 2);
    // Scale like a trained layer (unit-variance activations in and out) so SiLU sees gates of
    // order 1 as well as its saturated ends.
    w.gate = w.gate * (2.0f / std::sqrt(static_cast<float>(d)));
    w.up = w.up * (1.0f / std::sqrt(static_cast<float>(d)));
    w.down = w.down * (1.0f / std::sqrt(static_cast<float>(m)));
    return w;
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

// The worst-case float error of out = (SiLU(x Wg) * (x Wu)) Wd, per output, to first order:
// each dot product of length n is off by <= n eps sum |terms|, SiLU (simd::exp, a division) by
// <= 6 eps of its value, and those errors pass through SiLU' and W_down. A correct kernel is
// always inside; any wrong index, missing term or wrong nonlinearity is far outside.
template <class X>
tensor2 error_bound(const X& x2, const weights& w) {
    const index_t N = x2.dimension(0), d = x2.dimension(1), m = w.gate.dimension(1);
    tensor2 bound(N, d);
    std::vector<double> hb(static_cast<std::size_t>(m)), ha(static_cast<std::size_t>(m));
    for (index_t i = 0; i < N; ++i) {
        for (index_t j = 0; j < m; ++j) {
            double g = 0, u = 0, sg = 0, su = 0;
            for (index_t k = 0; k < d; ++k) {
                g += double(x2(i, k)) * w.gate(k, j);
                u += double(x2(i, k)) * w.up(k, j);
                sg += std::fabs(double(x2(i, k)) * w.gate(k, j));
                su += std::fabs(double(x2(i, k)) * w.up(k, j));
            }
            const double sig = 1.0 / (1.0 + std::exp(-g)), dsilu = std::fabs(sig * (1.0 + g * (1.0 - sig)));
            const double h = silu(g) * u;
            ha[static_cast<std::size_t>(j)] = std::fabs(h);
            hb[static_cast<std::size_t>(j)] = (d + 1) * kEps * (dsilu * std::fabs(u) * sg + std::fabs(silu(g)) * su) +
                                              8 * kEps * std::fabs(h);
        }
        for (index_t o = 0; o < d; ++o) {
            double b = 0;
            for (index_t j = 0; j < m; ++j)
                b += std::fabs(double(w.down(j, o))) * (hb[static_cast<std::size_t>(j)] + (m + 2) * kEps * ha[static_cast<std::size_t>(j)]);
            bound(i, o) = static_cast<float>(b * 1.01 + 1e-30);
        }
    }
    return bound;
}

::testing::AssertionResult within(const tensor2& out, const tensor2& expected, const tensor2& bound) {
    for (index_t i = 0; i < out.dimension(0); ++i)
        for (index_t j = 0; j < out.dimension(1); ++j)
            if (!(std::fabs(double(out(i, j)) - expected(i, j)) <= bound(i, j)))
                return ::testing::AssertionFailure() << "out(" << i << ", " << j << ") = " << out(i, j) << ", expected "
                                                     << expected(i, j) << " +- " << bound(i, j);
    return ::testing::AssertionSuccess();
}

struct mlp_shape {
    index_t n, d, m;
};

// 1 x 1 x 1 up to d_model 512 / m 683; lane counts 4, 8, 16 and their neighbours, odd primes,
// and N across the block edges (32-row minimum blocks, 256-row maximum).
const mlp_shape kShapes[] = {{1, 1, 1},    {1, 1, 2},    {2, 3, 1},     {3, 7, 5},     {5, 8, 9},
                             {7, 16, 17},  {9, 15, 31},  {17, 3, 4},    {31, 33, 45},  {33, 64, 85},
                             {65, 96, 128}, {257, 37, 49}, {300, 24, 23}, {13, 512, 683}};

TEST(gated_mlp, width_is_round_four_thirds) {
    EXPECT_EQ(attnkit::gated_mlp_width(1), 1);
    EXPECT_EQ(attnkit::gated_mlp_width(2), 3);
    EXPECT_EQ(attnkit::gated_mlp_width(3), 4);
    EXPECT_EQ(attnkit::gated_mlp_width(512), 683);
    EXPECT_EQ(attnkit::gated_mlp_width(768), 1024);
    EXPECT_EQ(attnkit::gated_mlp_width(896), 1195);
    for (index_t d = 1; d < 2000; ++d)
        ASSERT_EQ(attnkit::gated_mlp_width(d), static_cast<index_t>(std::llround(4.0 * d / 3.0))) << d;
}

class gated_mlp_sweep : public ::testing::TestWithParam<distribution> {};

TEST_P(gated_mlp_sweep, rank2_matches_reference) {
    std::uint64_t seed = 10;
    for (const mlp_shape& s : kShapes) {
        tensor2 x(s.n, s.d);
        attnkit_test::fill_random(x, GetParam(), seed++);
        const weights w = random_weights(s.d, s.m, GetParam(), seed);
        seed += 3;
        tensor2 out(s.n, s.d), ref(s.n, s.d);
        out.setConstant(std::numeric_limits<float>::quiet_NaN());
        attnkit::gated_mlp(x, w.gate, w.up, w.down, out);
        attnkit::reference::gated_mlp(x, w.gate, w.up, w.down, ref);
        ASSERT_TRUE(within(out, ref, error_bound(x, w))) << "N " << s.n << " d " << s.d << " m " << s.m;
    }
}

INSTANTIATE_TEST_SUITE_P(distributions, gated_mlp_sweep, ::testing::ValuesIn(attnkit_test::kAllDistributions),
                         [](const auto& info) { return attnkit_test::name(info.param); });

TEST(gated_mlp, rank3_dense_equals_rank2_bitwise_and_strided_matches_reference) {
    const index_t B = 3, L = 70, d = 24, m = 32;
    tensor3 x(B, L, d);
    attnkit_test::fill_random(x, distribution::gaussian, 5);
    const weights w = random_weights(d, m, distribution::gaussian, 6);
    tensor3 out3(B, L, d);
    attnkit::gated_mlp(x, w.gate, w.up, w.down, out3);
    const Eigen::TensorMap<const tensor2> x2(x.data(), B * L, d);
    tensor2 out2(B * L, d);
    attnkit::gated_mlp(x2, w.gate, w.up, w.down, out2);
    EXPECT_EQ(0, std::memcmp(out3.data(), out2.data(), sizeof(float) * out2.size()));

    // x and out as [B, L, d] slices of wider buffers (rows of 40 floats, 75 rows per batch item):
    // the kernel runs one segment per batch item. W_gate and W_up side by side in one buffer.
    std::vector<float> xbuf(static_cast<std::size_t>(B * 75 * 40)), obuf(xbuf.size(), -5.0f);
    const attnkit::view<float, 3> xs(xbuf.data() + 3, {B, L, d}, {75 * 40, 40, 1});
    const attnkit::view<float, 3> os(obuf.data() + 7, {B, L, d}, {75 * 40, 40, 1});
    for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < L; ++t)
            for (index_t k = 0; k < d; ++k) xs(b, t, k) = x(b, t, k);
    tensor2 packed(d, 2 * m);
    for (index_t k = 0; k < d; ++k)
        for (index_t j = 0; j < m; ++j) packed(k, j) = w.gate(k, j), packed(k, m + j) = w.up(k, j);
    const attnkit::view<const float, 2> wg(packed.data(), {d, m}, {2 * m, 1}), wu(packed.data() + m, {d, m}, {2 * m, 1});
    attnkit::gated_mlp(attnkit::view<const float, 3>(xs), wg, wu, w.down, os);
    tensor2 got(B * L, d), ref(B * L, d);
    attnkit::reference::gated_mlp(x2, w.gate, w.up, w.down, ref);
    for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < L; ++t)
            for (index_t k = 0; k < d; ++k) got(b * L + t, k) = os(b, t, k);
    EXPECT_TRUE(within(got, ref, error_bound(x2, w)));
    // Nothing outside the view written.
    index_t touched = 0;
    for (float v : obuf) touched += v != -5.0f;
    EXPECT_EQ(touched, B * L * d);
}

TEST(gated_mlp, thread_counts_are_bitwise_identical) {
    for (const mlp_shape& s : {mlp_shape{1000, 64, 85}, mlp_shape{77, 33, 45}, mlp_shape{2048, 16, 21}}) {
        tensor2 x(s.n, s.d);
        attnkit_test::fill_random(x, distribution::outliers, 3);
        const weights w = random_weights(s.d, s.m, distribution::gaussian, 4);
        tensor2 serial(s.n, s.d);
        attnkit::gated_mlp(x, w.gate, w.up, w.down, serial);
        for (std::size_t n : {1, 2, 3}) {
            attnkit::thread_pool pool(n);
            attnkit::gated_mlp_options o;
            o.pool = &pool;
            tensor2 out(s.n, s.d);
            attnkit::gated_mlp(x, w.gate, w.up, w.down, out, o);
            EXPECT_EQ(0, std::memcmp(out.data(), serial.data(), sizeof(float) * out.size()))
                << n << " threads, N " << s.n;
        }
    }
}

TEST(gated_mlp, extreme_gates_stay_finite_and_nan_stays_in_its_row) {
    const index_t N = 40, d = 9, m = 13;
    tensor2 x(N, d);
    attnkit_test::fill_random(x, distribution::gaussian, 8);
    weights w = random_weights(d, m, distribution::gaussian, 9);
    w.gate = w.gate * 200.0f;  // gates of +-hundreds: e^-g overflows or vanishes
    tensor2 out(N, d), ref(N, d);
    attnkit::gated_mlp(x, w.gate, w.up, w.down, out);
    attnkit::reference::gated_mlp(x, w.gate, w.up, w.down, ref);
    EXPECT_TRUE(within(out, ref, error_bound(x, w)));
    x(17, 4) = std::numeric_limits<float>::quiet_NaN();
    attnkit::gated_mlp(x, w.gate, w.up, w.down, out);
    for (index_t i = 0; i < N; ++i)
        for (index_t j = 0; j < d; ++j) ASSERT_EQ(std::isnan(out(i, j)), i == 17) << i << ", " << j;
}

TEST(gated_mlp, empty_sizes) {
    tensor2 x(4, 3), out(4, 3);
    attnkit_test::fill_random(x, distribution::uniform, 1);
    tensor2 wg(3, 0), wu(3, 0), wd(0, 3);
    out.setConstant(9.0f);
    attnkit::gated_mlp(x, wg, wu, wd, out);  // m = 0: the product is zero
    EXPECT_TRUE(attnkit_test::all_equal_to(out, 0.0f));
    tensor2 x0(0, 3), out0(0, 3), g(3, 5), u(3, 5), dn(5, 3);
    attnkit::gated_mlp(x0, g, u, dn, out0);  // no rows: nothing to do, no error
}

// Every bad argument: std::invalid_argument naming it and the shapes, out untouched.
template <class X, class O>
void expect_rejected(const X& x, const tensor2& wg, const tensor2& wu, const tensor2& wd, O&& out,
                     const std::vector<std::string>& words, float* sentinel_begin, std::size_t n) {
    std::vector<float> before(sentinel_begin, sentinel_begin + n);
    try {
        attnkit::gated_mlp(x, wg, wu, wd, out);
        ADD_FAILURE() << "no exception for " << words[0];
    } catch (const std::invalid_argument& e) {
        for (const std::string& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
    EXPECT_EQ(0, std::memcmp(before.data(), sentinel_begin, n * sizeof(float))) << words[0];
    try {
        attnkit::reference::gated_mlp(x, wg, wu, wd, out);
        ADD_FAILURE() << "reference: no exception for " << words[0];
    } catch (const std::invalid_argument&) {
    }
    EXPECT_EQ(0, std::memcmp(before.data(), sentinel_begin, n * sizeof(float))) << words[0];
}

TEST(gated_mlp, bad_input_is_rejected_before_any_write) {
    const index_t N = 6, d = 5, m = 7;
    tensor2 x(N, d), out(N, d);
    attnkit_test::fill_random(x, distribution::uniform, 1);
    const weights w = random_weights(d, m, distribution::uniform, 2);
    out.setConstant(3.0f);
    float* o = out.data();
    const std::size_t n = static_cast<std::size_t>(out.size());
    tensor2 wg_bad(d + 1, m), wu_bad(d, m + 1), wd_bad(m, d + 1), wd_bad2(m + 1, d);
    wg_bad.setZero(), wu_bad.setZero(), wd_bad.setZero(), wd_bad2.setZero();
    expect_rejected(x, wg_bad, w.up, w.down, out, {"w_gate", "[6, 7]", "[6, 5]"}, o, n);
    expect_rejected(x, w.gate, wu_bad, w.down, out, {"w_up", "[5, 8]", "[5, 7]"}, o, n);
    expect_rejected(x, w.gate, w.up, wd_bad, out, {"w_down", "[7, 6]", "[7, 5]"}, o, n);
    expect_rejected(x, w.gate, w.up, wd_bad2, out, {"w_down", "[8, 5]"}, o, n);
    tensor2 short_out(N - 1, d);
    short_out.setConstant(3.0f);
    expect_rejected(x, w.gate, w.up, w.down, short_out, {"out", "[5, 5]", "[6, 5]"}, short_out.data(), 25);
    // An out of another rank than x (or x of rank 1 or 4) is a compile-time error: see the
    // static_asserts of detail/gated_mlp/check.hpp.
    // out laid over x (in place) and over a weight; out with a zero row stride.
    expect_rejected(x, w.gate, w.up, w.down, attnkit::view<float, 2>(x.data(), {N, d}), {"out", "and x", "overlap"}, x.data(), n);
    tensor2 wd_copy = w.down;
    expect_rejected(x, w.gate, w.up, wd_copy, attnkit::view<float, 2>(wd_copy.data(), {N, d}), {"out", "w_down", "overlap"},
                    wd_copy.data(), static_cast<std::size_t>(wd_copy.size()));
    expect_rejected(x, w.gate, w.up, w.down, attnkit::view<float, 2>(o, {N, d}, {0, 1}), {"out", "overlap"}, o, n);
    // x with a non-contiguous last dimension.
    expect_rejected(attnkit::view<const float, 2>(x.data(), {N, 2}, {5, 2}), w.gate, w.up, w.down, out,
                    {"x", "contiguous"}, o, n);
}

}  // namespace
