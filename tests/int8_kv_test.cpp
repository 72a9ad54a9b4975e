// int8 K/V (attnkit/int8_kv.hpp): quantize_kv's rule and bound, softmax_attention over int8 K/V
// against the oracle on the same dequantised values (sizes around the lane widths and the
// kernels' block edges, decode with every GQA ratio, prefill through the tile kernel, masks,
// head-major views), the error against float K/V within the bound docs/serving.md ("int8 K/V") states,
// thread counts bitwise, and bad input rejected before anything is written.
//
// Tolerances: against the oracle on the dequantised values, the float kernels' own (kOutEps
// times the magnitude, common/softmax_checks.hpp): the kernel computes the same sums with each
// scale applied once to a score or a weight. Against float K/V, the stated bound plus that.
#include <gtest/gtest.h>

#include <attnkit/attnkit.hpp>
#include <attnkit/reference/softmax_attention.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/softmax_checks.hpp"
#include "common/sweep.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit_test::distribution;
using attnkit_test::tensor3;
using attnkit_test::tensor4;

using i8tensor = Eigen::Tensor<std::int8_t, 4, Eigen::RowMajor>;

// x quantised: values, scales, and the dequantised copy in double (exact there, not in float:
// a float scale times a 7-bit value needs up to 31 bits).
struct quantised {
    i8tensor values;
    tensor3<float> scales;
    tensor4<double> dequantised;
    attnkit::int8_kv kv() const { return attnkit::int8_kv(values, scales); }
};

quantised quantise(const tensor4<float>& x) {
    quantised r;
    r.values = i8tensor(x.dimensions());
    r.scales = tensor3<float>(x.dimension(0), x.dimension(1), x.dimension(2));
    attnkit::quantize_kv(x, r.values, r.scales);
    r.dequantised = tensor4<double>(x.dimensions());
    for (index_t b = 0; b < x.dimension(0); ++b)
        for (index_t l = 0; l < x.dimension(1); ++l)
            for (index_t h = 0; h < x.dimension(2); ++h)
                for (index_t d = 0; d < x.dimension(3); ++d)
                    r.dequantised(b, l, h, d) = double(r.scales(b, l, h)) * double(r.values(b, l, h, d));
    return r;
}

// The kernel and the oracle on int8 K/V, NaN-sentinel outputs (common/softmax_checks.hpp's
// run_fast / run_reference, which size outputs from a tensor v).
attnkit_test::fast_result fast8(const tensor4<float>& q, const attnkit::int8_kv& k, const attnkit::int8_kv& v,
                                const attnkit::softmax_options& o) {
    attnkit_test::fast_result r = attnkit_test::outputs_for<float>(q, v.values(), attnkit_test::kNaN);
    attnkit::softmax_attention(q, k, v, r.out, r.lse, o);
    return r;
}
attnkit_test::ref_result reference8(const tensor4<float>& q, const attnkit::int8_kv& k, const attnkit::int8_kv& v,
                                    const attnkit::softmax_options& o) {
    attnkit_test::ref_result r = attnkit_test::outputs_for<double>(q, v.values(), 0.0);
    attnkit::reference::softmax_attention(q, k, v, r.out, r.lse, o);
    return r;
}

// ---- quantize_kv ----

TEST(quantize_kv, rows_follow_the_rule_and_stay_within_half_a_step) {
    for (distribution dist : attnkit_test::kAllDistributions)
        for (index_t D : {1, 3, 16, 17, 64, 128}) {
            const tensor4<float> x = attnkit_test::random_bshd(2, 9, 3, D, dist, 11 + D);
            const quantised q = quantise(x);
            for (index_t b = 0; b < 2; ++b)
                for (index_t l = 0; l < 9; ++l)
                    for (index_t h = 0; h < 3; ++h) {
                        double amax = 0.0;
                        for (index_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(double(x(b, l, h, d))));
                        const float s = q.scales(b, l, h);
                        ASSERT_EQ(s, static_cast<float>(amax) / 127.0f) << dist << " D " << D;
                        bool reaches_127 = false;
                        for (index_t d = 0; d < D; ++d) {
                            const int v = q.values(b, l, h, d);
                            ASSERT_GE(v, -127);
                            ASSERT_LE(v, 127);
                            reaches_127 = reaches_127 || v == 127 || v == -127;
                            // Nearest: the error is at most half a step, in exact arithmetic.
                            const double err = std::fabs(double(x(b, l, h, d)) - double(s) * v);
                            ASSERT_LE(err, 0.5 * double(s)) << "at " << b << "," << l << "," << h << "," << d;
                        }
                        EXPECT_TRUE(reaches_127) << "the largest element maps to +-127";
                    }
        }
}

TEST(quantize_kv, zero_rows_ties_and_16_bit_inputs) {
    tensor4<float> x(1, 3, 1, 4);
    x.setValues({{{{0, 0, 0, 0}}, {{127, 0.5f, 1.5f, -2.5f}}, {{-1, 0.25f, 0, 0}}}});
    const quantised q = quantise(x);
    EXPECT_EQ(q.scales(0, 0, 0), 0.0f);
    for (index_t d = 0; d < 4; ++d) EXPECT_EQ(q.values(0, 0, 0, d), 0);
    // Scale 1: ties round to even.
    EXPECT_EQ(q.scales(0, 1, 0), 1.0f);
    EXPECT_EQ(q.values(0, 1, 0, 0), 127);
    EXPECT_EQ(q.values(0, 1, 0, 1), 0);
    EXPECT_EQ(q.values(0, 1, 0, 2), 2);
    EXPECT_EQ(q.values(0, 1, 0, 3), -2);
    EXPECT_EQ(q.values(0, 2, 0, 0), -127);

    // A 16-bit input quantises as its float widening does.
    const tensor4<float> y = attnkit_test::random_bshd(1, 5, 2, 24, distribution::outliers, 3);
    const auto yb = attnkit_test::stored_as<Eigen::bfloat16>(y);
    const auto yh = attnkit_test::stored_as<Eigen::half>(y);
    for (int which = 0; which < 2; ++which) {
        const tensor4<float> wide = which ? attnkit_test::widened(yh) : attnkit_test::widened(yb);
        const quantised want = quantise(wide);
        i8tensor v(wide.dimensions());
        tensor3<float> s(1, 5, 2);
        if (which)
            attnkit::quantize_kv(yh, v, s);
        else
            attnkit::quantize_kv(yb, v, s);
        EXPECT_TRUE(std::memcmp(v.data(), want.values.data(), static_cast<std::size_t>(v.size())) == 0);
        EXPECT_TRUE(attnkit_test::all_close(s, want.scales, 0.0, 0.0));
    }
}

TEST(quantize_kv, strided_views_in_and_out) {
    // x head-major [B, Hk, L, D] seen as BSHD; values written into a head-major buffer too.
    const index_t B = 2, H = 3, L = 7, D = 20;
    std::vector<float> xbuf(static_cast<std::size_t>(B * H * L * D));
    attnkit_test::fill_random(xbuf.data(), static_cast<index_t>(xbuf.size()), distribution::gaussian, 5);
    const auto xv = attnkit_test::bhld_as_bshd(xbuf.data(), B, H, L, D);
    std::vector<std::int8_t> vbuf(xbuf.size());
    const auto vv = attnkit_test::bhld_as_bshd(vbuf.data(), B, H, L, D);
    tensor3<float> s(B, L, H);
    attnkit::quantize_kv(attnkit::view<const float, 4>(xv), vv, s);
    tensor4<float> dense(B, L, H, D);
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < H; ++h)
                for (index_t d = 0; d < D; ++d) dense(b, l, h, d) = xv(b, l, h, d);
    const quantised want = quantise(dense);
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < H; ++h) {
                ASSERT_EQ(s(b, l, h), want.scales(b, l, h));
                for (index_t d = 0; d < D; ++d) ASSERT_EQ(vv(b, l, h, d), want.values(b, l, h, d));
            }
}

TEST(quantize_kv, bad_input_is_rejected_before_anything_is_written) {
    tensor4<float> x = attnkit_test::random_bshd(1, 4, 2, 8, distribution::gaussian, 1);
    i8tensor v(1, 4, 2, 8);
    tensor3<float> s(1, 4, 2);
    auto untouched = [&] {
        for (index_t i = 0; i < v.size(); ++i) ASSERT_EQ(v.data()[i], 99);
        for (index_t i = 0; i < s.size(); ++i) ASSERT_EQ(s.data()[i], -3.0f);
    };
    auto reset = [&] {
        v.setConstant(99);
        s.setConstant(-3.0f);
    };
    reset();
    i8tensor v_short(1, 4, 2, 7);
    attnkit_test::expect_invalid([&] { attnkit::quantize_kv(x, v_short, s); }, {"values", "[1, 4, 2, 8]"});
    tensor3<float> s_wrong(1, 4, 3);
    attnkit_test::expect_invalid([&] { attnkit::quantize_kv(x, v, s_wrong); }, {"scales", "[1, 4, 3]"});
    untouched();
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        tensor4<float> y = x;
        y(0, 3, 1, 5) = bad;
        attnkit_test::expect_invalid([&] { attnkit::quantize_kv(y, v, s); }, {"x", "(0, 3, 1, 5)", "not finite"});
        untouched();
    }
    // scales inside x's memory.
    Eigen::TensorMap<tensor3<float>> s_in_x(x.data() + 4, 1, 4, 2);
    const tensor4<float> x_before = x;
    attnkit_test::expect_invalid([&] { attnkit::quantize_kv(x, v, s_in_x); }, {"scales", "x"});
    EXPECT_TRUE(attnkit_test::all_close(x, x_before, 0.0, 0.0));
}

// ---- attention over int8 K/V ----

struct attn_shape {
    index_t B, Lq, Lk, H, Hk, D, Dv;
    bool causal;
    index_t window = -1;
    bool key_lengths = false;
};

attnkit::softmax_options options_of(const attn_shape& c) {
    attnkit::softmax_options o;
    o.causal = c.causal;
    o.window_left = c.window;
    if (c.key_lengths)
        for (index_t b = 0; b < c.B; ++b) o.key_lengths.push_back(std::max<index_t>(0, c.Lk - 1 - 37 * b));
    return o;
}

// Decode (the row kernel; Lq * H / Hk small) with every GQA ratio, and prefill (the tile
// kernel), at head dims around the 4-, 8- and 16-lane widths, key counts around the kernels'
// 64-key blocks and the split-KV pieces.
std::vector<attn_shape> sweep() {
    std::vector<attn_shape> v;
    for (index_t group : {1, 2, 4, 8, 32})
        for (index_t D : {4, 17, 64, 128}) v.push_back({1, 1, 700, 4 * group, 4, D, D, true});
    for (index_t D : {1, 3, 8, 15, 16, 33})
        for (index_t Lk : {1, 63, 64, 65, 1000, 4099}) v.push_back({2, 1, Lk, 4, 2, D, D + 5, true, -1, true});
    v.push_back({1, 3, 5000, 8, 2, 32, 32, true, 1500});
    v.push_back({2, 100, 100, 4, 4, 48, 48, true});
    v.push_back({1, 130, 300, 6, 2, 64, 40, true, 90});
    v.push_back({1, 300, 200, 2, 1, 128, 128, false, -1, true});
    v.push_back({3, 17, 17, 8, 1, 16, 16, false});
    return v;
}

TEST(int8_kv_attention, matches_the_oracle_on_the_dequantised_values) {
    std::size_t i = 0;
    for (const attn_shape& c : sweep()) {
        for (distribution dist : attnkit_test::kAllDistributions) {
            if (!attnkit_test::sweep_takes(i++, static_cast<std::size_t>(dist), 3)) continue;
            const std::uint64_t seed = 1000 + 7 * i;
            const tensor4<float> q = attnkit_test::random_bshd(c.B, c.Lq, c.H, c.D, dist, seed);
            const quantised k = quantise(attnkit_test::random_bshd(c.B, c.Lk, c.Hk, c.D, dist, seed + 1));
            const quantised v = quantise(attnkit_test::random_bshd(c.B, c.Lk, c.Hk, c.Dv, dist, seed + 2));
            const attnkit::softmax_options o = options_of(c);
            const auto got = fast8(q, k.kv(), v.kv(), o);
            const auto want = reference8(q, k.kv(), v.kv(), o);
            // The oracle on int8_kv is the oracle on the dequantised float tensors.
            const auto plain = attnkit_test::run_reference(q, k.dequantised, v.dequantised, o);
            ASSERT_TRUE(attnkit_test::all_close(want.out, plain.out, 0.0, 0.0));
            SCOPED_TRACE(::testing::Message() << "B " << c.B << " Lq " << c.Lq << " Lk " << c.Lk << " H " << c.H
                                              << " Hk " << c.Hk << " D " << c.D << " Dv " << c.Dv << " " << dist);
            EXPECT_TRUE(attnkit_test::all_close(
                got.out, want.out, attnkit_test::out_tolerance(q, k.dequantised, v.dequantised, o)));
            EXPECT_TRUE(attnkit_test::all_close(got.lse, want.lse, attnkit_test::lse_tolerance(q, k.dequantised, o)));
        }
    }
}

// Head-major rows longer than the row kernel's short rows (kShortRowBytes, 128 bytes) are walked
// in the token-major key order, so the two layouts give the same bits; short ones (int8 D 64) are
// read as one stream per head, another summation order, and agree to rounding.
TEST(int8_kv_attention, head_major_views_give_the_token_major_result) {
    const index_t B = 1, H = 8, Hk = 2, L = 777;
    for (index_t D : {64, 256}) for (index_t Lq : {1, 40}) {
        const tensor4<float> q = attnkit_test::random_bshd(B, Lq, H, D, distribution::gaussian, 9);
        const quantised k = quantise(attnkit_test::random_bshd(B, L, Hk, D, distribution::gaussian, 10));
        const quantised v = quantise(attnkit_test::random_bshd(B, L, Hk, D, distribution::gaussian, 11));
        // Head-major copies: values [B, Hk, L, D], scales [B, Hk, L].
        std::vector<std::int8_t> kh(static_cast<std::size_t>(B * Hk * L * D)), vh(kh.size());
        std::vector<float> ksh(static_cast<std::size_t>(B * Hk * L)), vsh(ksh.size());
        const auto khv = attnkit_test::bhld_as_bshd(kh.data(), B, Hk, L, D);
        const auto vhv = attnkit_test::bhld_as_bshd(vh.data(), B, Hk, L, D);
        const attnkit::view<float, 3> kss(ksh.data(), {B, L, Hk}, {Hk * L, 1, L});
        const attnkit::view<float, 3> vss(vsh.data(), {B, L, Hk}, {Hk * L, 1, L});
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < Hk; ++h) {
                kss(0, l, h) = k.scales(0, l, h);
                vss(0, l, h) = v.scales(0, l, h);
                for (index_t d = 0; d < D; ++d) {
                    khv(0, l, h, d) = k.values(0, l, h, d);
                    vhv(0, l, h, d) = v.values(0, l, h, d);
                }
            }
        attnkit::softmax_options o;
        o.causal = true;
        const auto token_major = fast8(q, k.kv(), v.kv(), o);
        const auto head_major = fast8(
            q, attnkit::int8_kv(attnkit::view<const std::int8_t, 4>(khv), attnkit::view<const float, 3>(kss)),
            attnkit::int8_kv(attnkit::view<const std::int8_t, 4>(vhv), attnkit::view<const float, 3>(vss)), o);
        if (D > 128) {
            EXPECT_TRUE(attnkit_test::bitwise_equal(head_major.out, token_major.out)) << "D " << D << " Lq " << Lq;
            EXPECT_TRUE(attnkit_test::bitwise_equal(head_major.lse, token_major.lse)) << "D " << D << " Lq " << Lq;
        } else {
            EXPECT_TRUE(attnkit_test::all_close(head_major.out, token_major.out,
                                                attnkit_test::out_tolerance(q, k.dequantised, v.dequantised, o)))
                << "D " << D << " Lq " << Lq;
            EXPECT_TRUE(attnkit_test::all_close(head_major.lse, token_major.lse,
                                                attnkit_test::lse_tolerance(q, k.dequantised, o)))
                << "D " << D << " Lq " << Lq;
        }
    }
}

// docs/serving.md ("int8 K/V"): with K rows quantised at scales s_j and V rows at t_j, every score moves by
// at most delta = scale * max_j (s_j / 2) * ||q_i||_1, each weight by a factor within
// exp(+-2 delta), so each output element moves by at most
//   (exp(2 delta) - 1) * max_j |v_jc| + max_j t_j / 2
// from the float result (j over the row's visible keys; all keys here give a looser bound).
TEST(int8_kv_attention, error_against_float_within_the_stated_bound) {
    for (distribution dist : attnkit_test::kAllDistributions)
        for (const attn_shape& c : {attn_shape{1, 1, 4096, 32, 8, 128, 128, true},
                                    attn_shape{1, 64, 512, 8, 8, 64, 64, true}}) {
            // The reduced builds run other widths' code on the same shapes: one distribution.
            if (attnkit_test::kReducedSweep && dist != distribution::gaussian) continue;
            const tensor4<float> q = attnkit_test::random_bshd(c.B, c.Lq, c.H, c.D, dist, 21);
            const tensor4<float> kf = attnkit_test::random_bshd(c.B, c.Lk, c.Hk, c.D, dist, 22);
            const tensor4<float> vf = attnkit_test::random_bshd(c.B, c.Lk, c.Hk, c.Dv, dist, 23);
            const quantised k = quantise(kf), v = quantise(vf);
            attnkit::softmax_options o;
            o.causal = c.causal;
            const auto got = fast8(q, k.kv(), v.kv(), o);
            const auto exact = attnkit_test::run_reference(q, kf, vf, o);
            const double scale = attnkit::detail::resolve_scale(0.0f, c.D);
            double s_max = 0.0, t_max = 0.0;
            for (index_t i = 0; i < k.scales.size(); ++i) s_max = std::max(s_max, double(k.scales.data()[i]));
            for (index_t i = 0; i < v.scales.size(); ++i) t_max = std::max(t_max, double(v.scales.data()[i]));
            std::vector<double> v_max(static_cast<std::size_t>(c.Dv), 0.0);
            for (index_t l = 0; l < c.Lk; ++l)
                for (index_t h = 0; h < c.Hk; ++h)
                    for (index_t d = 0; d < c.Dv; ++d)
                        v_max[d] = std::max(v_max[d], std::fabs(double(vf(0, l, h, d))));
            const auto fp = attnkit_test::out_tolerance(q, kf, vf, o);
            double worst = 0.0;  // largest error / bound
            for (index_t i = 0; i < c.Lq; ++i)
                for (index_t h = 0; h < c.H; ++h) {
                    double q1 = 0.0;
                    for (index_t d = 0; d < c.D; ++d) q1 += std::fabs(double(q(0, i, h, d)));
                    const double delta = scale * 0.5 * s_max * q1;
                    for (index_t d = 0; d < c.Dv; ++d) {
                        const double bound = std::expm1(2.0 * delta) * v_max[d] + 0.5 * t_max + fp.atol;
                        const double err = std::fabs(double(got.out(0, i, h, d)) - exact.out(0, i, h, d));
                        ASSERT_LE(err, bound) << dist << " at " << i << "," << h << "," << d;
                        worst = std::max(worst, err / bound);
                    }
                }
            // The bound is a bound: typical errors are far inside it, and a kernel that
            // ignored the scales would be far outside it.
            EXPECT_LT(worst, 0.5) << dist;
        }
}

TEST(int8_kv_attention, thread_counts_give_bitwise_identical_results) {
    for (const attn_shape& c : {attn_shape{1, 1, 5000, 16, 4, 64, 64, true}, attn_shape{2, 150, 150, 4, 2, 32, 32, true}}) {
        const tensor4<float> q = attnkit_test::random_bshd(c.B, c.Lq, c.H, c.D, distribution::gaussian, 31);
        const quantised k = quantise(attnkit_test::random_bshd(c.B, c.Lk, c.Hk, c.D, distribution::gaussian, 32));
        const quantised v = quantise(attnkit_test::random_bshd(c.B, c.Lk, c.Hk, c.Dv, distribution::gaussian, 33));
        attnkit::softmax_options o;
        o.causal = c.causal;
        const auto serial = fast8(q, k.kv(), v.kv(), o);
        for (std::size_t n : {1, 2, 3}) {
            if (attnkit_test::kReducedSweep && n == 3) continue;
            attnkit::thread_pool pool(n);
            o.pool = &pool;
            const auto pooled = fast8(q, k.kv(), v.kv(), o);
            EXPECT_TRUE(attnkit_test::bitwise_equal(pooled.out, serial.out)) << n << " threads";
            EXPECT_TRUE(attnkit_test::bitwise_equal(pooled.lse, serial.lse)) << n << " threads";
        }
    }
}

TEST(int8_kv_attention, bad_input_is_rejected_before_anything_is_written) {
    const index_t B = 1, L = 70, H = 4, Hk = 2, D = 16;
    const tensor4<float> q = attnkit_test::random_bshd(B, 1, H, D, distribution::gaussian, 41);
    const quantised k = quantise(attnkit_test::random_bshd(B, L, Hk, D, distribution::gaussian, 42));
    const quantised v = quantise(attnkit_test::random_bshd(B, L, Hk, D, distribution::gaussian, 43));
    tensor4<float> out(B, 1, H, D);
    out.setConstant(-5.0f);
    auto untouched = [&] { EXPECT_TRUE(attnkit_test::all_equal_to(out, -5.0f)); };

    tensor3<float> short_scales(B, L - 1, Hk);
    short_scales.setConstant(1.0f);
    attnkit_test::expect_invalid(
        [&] { attnkit::softmax_attention(q, attnkit::int8_kv(k.values, short_scales), v.kv(), out); },
        {"k.scales", "[1, 69, 2]", "[B, Lk, Hk]"});
    untouched();
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
        tensor3<float> s = v.scales;
        s(0, 50, 1) = bad;
        attnkit_test::expect_invalid([&] { attnkit::softmax_attention(q, k.kv(), attnkit::int8_kv(v.values, s), out); },
                                     {"v.scales", "(0, 50, 1)", "not finite"});
        untouched();
    }
    // k values of the wrong head dim, and Hk not dividing H.
    i8tensor k_wide(B, L, Hk, D + 1);
    k_wide.setZero();
    attnkit_test::expect_invalid([&] { attnkit::softmax_attention(q, attnkit::int8_kv(k_wide, k.scales), v.kv(), out); },
                                 "k: expected shape");
    untouched();
    // out inside the scales' memory (an output over an input).
    std::vector<float> shared(static_cast<std::size_t>(B * L * Hk + 64), 1.0f);
    const attnkit::view<const float, 3> sv(shared.data(), {B, L, Hk});
    const attnkit::view<float, 4> out_in_scales(shared.data() + 10, {B, 1, H, D});
    attnkit_test::expect_invalid(
        [&] { attnkit::softmax_attention(q, attnkit::int8_kv(k.values, sv), v.kv(), out_in_scales); },
        {"out", "k.scales"});
    for (std::size_t i = 0; i < shared.size(); ++i) ASSERT_EQ(shared[i], 1.0f);
}

}  // namespace
