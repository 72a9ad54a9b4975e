// attnkit::static_qk_attention_backward and attnkit::static_attention_map_backward against their
// double oracles (reference/static_qk_attention_backward.hpp, checked against finite differences
// in reference_static_qk_attention_backward_test.cpp).
//
// Tolerances as softmax_attention_backward_test.cpp's: tolerance_for(kGradEps, M (1 + S)), S the
// bound on the scores, M a bound on the sum of the absolute values of an element's terms; the
// items' dP add up (p = B max|dO| max|v|), c is the largest column sum of the map:
//   d_q: 2 scale p max|k|      d_k: 2 scale p max|q| c      d_v: max|dO| c
#include "attnkit/static_qk_attention_backward.hpp"

#include "attnkit/reference/static_qk_attention_backward.hpp"
#include "attnkit/thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "common/backward_checks.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::static_qk_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;
using tensor3f = Eigen::Tensor<float, 3, Eigen::RowMajor>;
using tensor3d = Eigen::Tensor<double, 3, Eigen::RowMajor>;

constexpr double kGradEps = 32;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct inputs {
    tensor4<float> qf, kf, v, dout;
};

inputs make_inputs(index_t B, index_t L, index_t Lmax, index_t H, index_t Hk, index_t D, index_t Dv, distribution d,
                   std::uint64_t seed) {
    return {random_bshd(1, Lmax, H, D, d, seed), random_bshd(1, Lmax, Hk, D, d, seed + 1),
            random_bshd(B, L, Hk, Dv, d, seed + 2), random_bshd(B, L, H, Dv, d, seed + 3)};
}

grads run_fast(const inputs& in, const static_qk_options& o) {
    const index_t B = in.v.dimension(0), L = in.v.dimension(1), Hk = in.v.dimension(2), Dv = in.v.dimension(3);
    const index_t Lmax = in.qf.dimension(1), H = in.qf.dimension(2), D = in.qf.dimension(3);
    tensor4<float> out(B, L, H, Dv);
    attnkit::static_qk_attention(in.qf, in.kf, in.v, out, o);
    grads g{make_bshd<float>(1, Lmax, H, D, kNaN), make_bshd<float>(1, Lmax, Hk, D, kNaN),
            make_bshd<float>(B, L, Hk, Dv, kNaN)};
    attnkit::static_qk_attention_backward(in.qf, in.kf, in.v, out, in.dout, g.dq, g.dk, g.dv, o);
    return g;
}

void expect_matches_oracle(const inputs& in, const static_qk_options& o, bool equal_nan = false) {
    const index_t B = in.v.dimension(0), L = in.v.dimension(1), Hk = in.v.dimension(2), Dv = in.v.dimension(3);
    const index_t Lmax = in.qf.dimension(1), H = in.qf.dimension(2), D = in.qf.dimension(3);
    grads got = run_fast(in, o);
    tensor4<double> out(B, L, H, Dv), dq(1, Lmax, H, D), dk(1, Lmax, Hk, D), dv(B, L, Hk, Dv);
    tensor3d w;
    static_qk_options oo = o;
    oo.pool = nullptr;
    ref::static_qk_attention(in.qf, in.kf, in.v, out, w, oo);
    ref::static_qk_attention_backward(in.qf, in.kf, in.v, out, in.dout, dq, dk, dv, oo);
    double c = 1.0;
    for (index_t hk = 0; hk < Hk; ++hk)
        for (index_t j = 0; j < L; ++j) {
            double cs = 0.0;
            for (index_t h = hk * (H / Hk); h < (hk + 1) * (H / Hk); ++h)
                for (index_t i = 0; i < L; ++i) cs += w(h, i, j);
            c = std::max(c, cs);
        }
    if (equal_nan) {
        nan_if_not_finite_all(got);
        nan_if_not_finite(dq), nan_if_not_finite(dk), nan_if_not_finite(dv);
    }
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(o.scale, D));
    const double s1 = 1.0 + scale * max_row_norm(in.qf) * max_row_norm(in.kf);
    const double p = static_cast<double>(std::max<index_t>(B, 1)) * max_row_norm(in.dout) * max_row_norm(in.v);
    EXPECT_TRUE(all_close(got.dq, dq, tolerance_for(kGradEps, 2 * scale * p * max_row_norm(in.kf) * s1), equal_nan))
        << "d_q_fixed";
    EXPECT_TRUE(all_close(got.dk, dk, tolerance_for(kGradEps, 2 * scale * p * max_row_norm(in.qf) * c * s1), equal_nan))
        << "d_k_fixed";
    EXPECT_TRUE(all_close(got.dv, dv, tolerance_for(kGradEps, max_row_norm(in.dout) * c * s1), equal_nan)) << "d_v";
}

struct sq_case {
    index_t B, L, Lmax, H, Hk, D, Dv;
    float scale;
    distribution dist;
};

void PrintTo(const sq_case& c, std::ostream* os) {
    *os << "B" << c.B << "_L" << c.L << "_Lmax" << c.Lmax << "_H" << c.H << "_Hk" << c.Hk << "_D" << c.D << "_Dv"
        << c.Dv;
}

std::vector<sq_case> sweep() {
    std::vector<sq_case> cs;
    const distribution dists[] = {distribution::uniform, distribution::gaussian, distribution::outliers};
    const index_t lens[] = {1, 7, 16, 17, 65, 130};
    const std::pair<index_t, index_t> heads[] = {{1, 1}, {2, 1}, {4, 2}, {3, 3}};
    const std::pair<index_t, index_t> dims[] = {{1, 1}, {4, 3}, {8, 8}, {9, 17}, {16, 5}, {33, 16}};
    int n = 0;
    for (index_t L : lens)
        for (const auto& hh : heads) {
            const auto& dd = dims[static_cast<std::size_t>(n % 6)];
            cs.push_back({1 + n % 3, L, L + (n % 2) * 5, hh.first, hh.second, dd.first, dd.second,
                          n % 4 == 3 ? 0.6f : 0.0f, dists[n % 3]});
            ++n;
        }
    return cs;
}

class sweep_test : public ::testing::TestWithParam<sq_case> {};

TEST_P(sweep_test, matches_oracle) {
    const sq_case& c = GetParam();
    static_qk_options o;
    o.scale = c.scale;
    expect_matches_oracle(make_inputs(c.B, c.L, c.Lmax, c.H, c.Hk, c.D, c.Dv, c.dist, 900 + c.L * 7 + c.H), o);
}

INSTANTIATE_TEST_SUITE_P(static_qk_attention_backward, sweep_test, ::testing::ValuesIn(sweep()),
                         [](const ::testing::TestParamInfo<sq_case>& i) {
                             std::string s = "n" + std::to_string(i.index);
                             return s;
                         });

// B items give d_q_fixed and d_k_fixed summed over the items, d_v per item: the same as B calls
// of one item, added (to rounding), and rows >= L are zero.
TEST(static_qk_attention_backward, batch_sums_and_rows_past_l_zero) {
    const index_t B = 3, L = 37, Lmax = 45, H = 4, Hk = 2, D = 12, Dv = 10;
    const inputs in = make_inputs(B, L, Lmax, H, Hk, D, Dv, distribution::gaussian, 31);
    const grads all = run_fast(in, {});
    tensor4<float> dq_sum(1, Lmax, H, D), dk_sum(1, Lmax, Hk, D);
    dq_sum.setZero();
    dk_sum.setZero();
    for (index_t b = 0; b < B; ++b) {
        inputs one{in.qf, in.kf, tensor4<float>(1, L, Hk, Dv), tensor4<float>(1, L, H, Dv)};
        one.v = in.v.slice(std::array<index_t, 4>{b, 0, 0, 0}, std::array<index_t, 4>{1, L, Hk, Dv});
        one.dout = in.dout.slice(std::array<index_t, 4>{b, 0, 0, 0}, std::array<index_t, 4>{1, L, H, Dv});
        const grads g = run_fast(one, {});
        dq_sum += g.dq;
        dk_sum += g.dk;
        const tensor4<float> dvb = all.dv.slice(std::array<index_t, 4>{b, 0, 0, 0}, std::array<index_t, 4>{1, L, Hk, Dv});
        EXPECT_TRUE(all_close(dvb, g.dv, 1e-5, 1e-6)) << "d_v of item " << b;
    }
    EXPECT_TRUE(all_close(all.dq, dq_sum, 1e-4, 1e-5));
    EXPECT_TRUE(all_close(all.dk, dk_sum, 1e-4, 1e-5));
    for (index_t i = L; i < Lmax; ++i)
        for (index_t d = 0; d < D; ++d) {
            EXPECT_EQ(0.0f, all.dq(0, i, H - 1, d));
            EXPECT_EQ(0.0f, all.dk(0, i, Hk - 1, d));
        }
}

::testing::AssertionResult same_bits(const tensor4<float>& a, const tensor4<float>& b) {
    if (std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0)
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "bits differ";
}

TEST(static_qk_attention_backward, thread_count_gives_bitwise_identical_results) {
    const inputs in = make_inputs(3, 200, 210, 6, 2, 20, 17, distribution::outliers, 51);
    const grads one = run_fast(in, {});
    for (int n : {2, 3}) {
        attnkit::thread_pool pool(n);
        static_qk_options o;
        o.pool = &pool;
        const grads many = run_fast(in, o);
        EXPECT_TRUE(same_bits(one.dq, many.dq)) << n << " threads, d_q_fixed";
        EXPECT_TRUE(same_bits(one.dk, many.dk)) << n << " threads, d_k_fixed";
        EXPECT_TRUE(same_bits(one.dv, many.dv)) << n << " threads, d_v";
    }
    expect_matches_oracle(in, {});
}

// A NaN in item 1's values or d_out reaches the map's gradients (the items share the map) but
// never item 0's d_v, nor the rows and keys the causal mask keeps it from, nor other heads.
TEST(static_qk_attention_backward, non_finite_inputs_stay_where_they_belong) {
    inputs in = make_inputs(2, 60, 60, 4, 2, 8, 8, distribution::gaussian, 61);
    in.v(1, 40, 1, 3) = kNaN;     // key 40 of key/value head 1: rows >= 40 of heads 2, 3
    in.dout(1, 20, 0, 2) = kNaN;  // row 20 of head 0: keys <= 20
    expect_matches_oracle(in, {}, /*equal_nan=*/true);
    const grads g = run_fast(in, {});
    for (index_t d = 0; d < 8; ++d) {
        EXPECT_TRUE(std::isfinite(g.dv(0, 40, 1, d)));
        EXPECT_TRUE(std::isfinite(g.dq(0, 39, 2, d)));
        EXPECT_TRUE(std::isfinite(g.dk(0, 30, 0, d)));
        EXPECT_TRUE(std::isfinite(g.dq(0, 21, 1, d)));
        EXPECT_TRUE(std::isnan(g.dq(0, 20, 0, 0)));
    }
}

TEST(static_qk_attention_backward, bad_input_rejected_before_writing) {
    const inputs in = make_inputs(2, 4, 5, 2, 1, 3, 2, distribution::gaussian, 71);
    tensor4<float> out(2, 4, 2, 2);
    attnkit::static_qk_attention(in.qf, in.kf, in.v, out);
    tensor4<float> dq = make_bshd<float>(1, 5, 2, 3, 5.0f), dk = make_bshd<float>(1, 5, 1, 3, 5.0f),
                   dv = make_bshd<float>(2, 4, 1, 2, 5.0f);
    tensor4<float> bad_dq(1, 4, 2, 3);
    expect_invalid([&] { attnkit::static_qk_attention_backward(in.qf, in.kf, in.v, out, in.dout, bad_dq, dk, dv); },
                   {"d_q_fixed", "[1, 5, 2, 3]"});
    tensor4<float> bad_dk(2, 5, 1, 3);
    expect_invalid([&] { attnkit::static_qk_attention_backward(in.qf, in.kf, in.v, out, in.dout, dq, bad_dk, dv); },
                   "d_k_fixed");
    tensor4<float> bad_dv(2, 5, 1, 2);
    expect_invalid([&] { attnkit::static_qk_attention_backward(in.qf, in.kf, in.v, out, in.dout, dq, dk, bad_dv); },
                   "d_v");
    tensor4<float> bad_dout(2, 4, 2, 3);
    expect_invalid([&] { attnkit::static_qk_attention_backward(in.qf, in.kf, in.v, out, bad_dout, dq, dk, dv); },
                   "d_out");
    tensor4<float> v_copy = in.v;
    expect_invalid([&] { attnkit::static_qk_attention_backward(in.qf, in.kf, v_copy, out, in.dout, dq, dk, v_copy); },
                   "d_v");
    static_qk_options bad;
    bad.scale = -1.0f;
    expect_invalid([&] { attnkit::static_qk_attention_backward(in.qf, in.kf, in.v, out, in.dout, dq, dk, dv, bad); },
                   "scale");
    EXPECT_TRUE(all_equal_to(dq, 5.0f));
    EXPECT_TRUE(all_equal_to(dk, 5.0f));
    EXPECT_TRUE(all_equal_to(dv, 5.0f));
}

// --- the from_weights map -----------------------------------------------------------------

struct map_grads {
    tensor3f dw;
    tensor4<float> dv;
};

map_grads run_map(const tensor3f& w, const tensor4<float>& v, const tensor4<float>& dout, attnkit::thread_pool* pool) {
    map_grads g{tensor3f(w.dimension(0), w.dimension(1), w.dimension(2)),
                make_bshd<float>(v.dimension(0), v.dimension(1), v.dimension(2), v.dimension(3), kNaN)};
    g.dw.setConstant(kNaN);
    attnkit::static_attention_map_backward(w, v, dout, g.dw, g.dv, pool);
    return g;
}

TEST(static_qk_attention_backward, map_from_weights_matches_oracle) {
    struct mc {
        index_t B, L, Lmax, H, Hk, Dv;
    };
    for (const mc& c : {mc{1, 1, 1, 1, 1, 1}, mc{2, 17, 20, 2, 1, 5}, mc{3, 64, 64, 4, 2, 8}, mc{2, 130, 141, 3, 3, 17}}) {
        SCOPED_TRACE(c.L);
        tensor3f w(c.H, c.Lmax, c.Lmax);
        fill_random(w, distribution::gaussian, 81 + c.L);
        // The upper triangle is never read: NaN there must not show anywhere.
        for (index_t h = 0; h < c.H; ++h)
            for (index_t i = 0; i < c.Lmax; ++i)
                for (index_t j = i + 1; j < c.Lmax; ++j) w(h, i, j) = kNaN;
        const tensor4<float> v = random_bshd(c.B, c.L, c.Hk, c.Dv, distribution::gaussian, 82 + c.L);
        const tensor4<float> dout = random_bshd(c.B, c.L, c.H, c.Dv, distribution::gaussian, 83 + c.L);
        const map_grads got = run_map(w, v, dout, nullptr);
        tensor3d dw(c.H, c.Lmax, c.Lmax);
        tensor4<double> dv(c.B, c.L, c.Hk, c.Dv);
        ref::static_attention_map_backward(w, v, dout, dw, dv);
        const double mw = static_cast<double>(c.B) * max_row_norm(dout) * max_row_norm(v);
        double wmax = 0.0;  // over the lower triangle
        for (index_t h = 0; h < c.H; ++h)
            for (index_t i = 0; i < c.Lmax; ++i)
                for (index_t j = 0; j <= i; ++j) wmax = std::max(wmax, std::fabs(static_cast<double>(w(h, i, j))));
        const double mv = max_row_norm(dout) * wmax * static_cast<double>(c.L * (c.H / c.Hk));
        EXPECT_TRUE(all_close(got.dw, dw, tolerance_for(kGradEps, mw))) << "d_w";
        EXPECT_TRUE(all_close(got.dv, dv, tolerance_for(kGradEps, mv))) << "d_v";
        attnkit::thread_pool pool(3);
        const map_grads many = run_map(w, v, dout, &pool);
        EXPECT_EQ(0, std::memcmp(got.dw.data(), many.dw.data(), sizeof(float) * static_cast<std::size_t>(got.dw.size())));
        EXPECT_TRUE(same_bits(got.dv, many.dv));
    }
}

TEST(static_qk_attention_backward, map_bad_input_rejected_before_writing) {
    tensor3f w(2, 6, 6);
    w.setConstant(0.5f);
    const tensor4<float> v = random_bshd(1, 5, 1, 3, distribution::gaussian, 91);
    const tensor4<float> dout = random_bshd(1, 5, 2, 3, distribution::gaussian, 92);
    tensor3f dw(2, 6, 6);
    dw.setConstant(5.0f);
    tensor4<float> dv = make_bshd<float>(1, 5, 1, 3, 5.0f);
    tensor3f bad_dw(2, 5, 5);
    expect_invalid([&] { attnkit::static_attention_map_backward(w, v, dout, bad_dw, dv); }, {"d_w", "[2, 6, 6]"});
    tensor4<float> bad_dout(1, 5, 3, 3);
    expect_invalid([&] { attnkit::static_attention_map_backward(w, v, bad_dout, dw, dv); }, "d_out");
    const tensor4<float> long_v = random_bshd(1, 7, 1, 3, distribution::gaussian, 93);
    expect_invalid([&] { attnkit::static_attention_map_backward(w, long_v, dout, dw, dv); }, "v");
    EXPECT_TRUE(all_equal_to(dw, 5.0f));
    EXPECT_TRUE(all_equal_to(dv, 5.0f));
}

}  // namespace
