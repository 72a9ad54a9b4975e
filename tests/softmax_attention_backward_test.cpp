// attnkit::softmax_attention_backward against the double oracle
// (reference::softmax_attention_backward, itself checked against finite differences in
// reference_softmax_attention_backward_test.cpp).
//
// Tolerances (compare.hpp): each gradient tensor is held to tolerance_for(kGradEps, M (1 + S)),
// S the Cauchy-Schwarz bound on the scores (P is recomputed from lse with a relative error of a
// few eps |s|) and M a bound on the sum of the absolute values of the terms that make up one of
// its elements, not on the result (dS = P (dP - D) cancels, to exactly 0 where a row sees one
// key). With dP bounded by p = max|dO_i| max|v_j| (row norms) and c the largest column sum of P
// (how much weight one key gets from all rows of its key/value head):
//   d_q: 2 scale p max|k_j|      d_k: 2 scale p max|q_i| c      d_v: max|dO_i| c
// kGradEps = 32: reductions run over up to a few hundred keys or query rows; the bounds are
// bounds, and the worst error measured over this file (AVX2, SSE2) is far below them.
#include "attnkit/softmax_attention_backward.hpp"

#include "attnkit/reference/softmax_attention_backward.hpp"
#include "attnkit/thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <utility>
#include <string>
#include <vector>

#include "common/backward_checks.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::softmax_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;

constexpr double kGradEps = 32;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
using vec = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using vecd = Eigen::Tensor<double, 1, Eigen::RowMajor>;

// With the sinks' gradient.
struct sink_grads : grads {
    vec ds;
};
struct sink_grads_d : grads_d {
    vecd ds;
    double col_sum = 0.0;  // the largest column sum of P over a key/value head's rows
};

struct bwd_case : backward_shape {
    softmax_options o;

    std::string describe() const {
        std::string s = shape_name();
        if (o.causal) s += "_causal";
        if (o.window_left >= 0) s += "_w" + std::to_string(o.window_left);
        if (o.chunk > 0) s += "_chunk" + std::to_string(o.chunk);
        if (!o.key_lengths.empty()) s += "_kl";
        if (o.softcap > 0) s += "_cap";
        if (!o.sinks.empty()) s += "_sinks";
        return s + "_" + name(dist);
    }
};

void PrintTo(const bwd_case& c, std::ostream* os) { *os << c.describe(); }

template <class T>
double score_bound(const tensor4<T>& q, const tensor4<T>& k, const softmax_options& o) {
    double s = static_cast<double>(attnkit::detail::resolve_scale(o.scale, q.dimension(3))) * max_row_norm(q) *
               max_row_norm(k);
    if (o.softcap > 0.0f) s = std::min(s, static_cast<double>(o.softcap));
    return s;
}

// Runs the fused forward (for out and lse) and backward on float inputs of storage type S.
template <class SQ, class S>
sink_grads run_fast(const tensor4<SQ>& q, const tensor4<S>& k, const tensor4<S>& v, const tensor4<float>& dout,
               const softmax_options& o, tensor4<float>* out_used = nullptr, tensor3<float>* lse_used = nullptr) {
    const index_t B = q.dimension(0), Lq = q.dimension(1), H = q.dimension(2), D = q.dimension(3);
    const index_t Lk = k.dimension(1), Hk = k.dimension(2), Dv = v.dimension(3);
    tensor4<float> out(B, Lq, H, Dv);
    tensor3<float> lse(B, Lq, H);
    attnkit::softmax_attention(q, k, v, out, lse, o);
    sink_grads g{{make_bshd<float>(B, Lq, H, D, kNaN), make_bshd<float>(B, Lk, Hk, D, kNaN),
                  make_bshd<float>(B, Lk, Hk, Dv, kNaN)},
                 vec(H)};
    g.ds.setConstant(kNaN);
    if (o.sinks.empty())
        attnkit::softmax_attention_backward(q, k, v, out, lse, dout, g.dq, g.dk, g.dv, o);
    else
        attnkit::softmax_attention_backward(q, k, v, out, lse, dout, g.dq, g.dk, g.dv, g.ds, o);
    if (out_used) *out_used = out;
    if (lse_used) *lse_used = lse;
    return g;
}

template <class SQ, class S>
sink_grads_d run_oracle(const tensor4<SQ>& q, const tensor4<S>& k, const tensor4<S>& v, const tensor4<float>& dout,
                   const softmax_options& o) {
    const index_t B = q.dimension(0), Lq = q.dimension(1), H = q.dimension(2), D = q.dimension(3);
    const index_t Lk = k.dimension(1), Hk = k.dimension(2), Dv = v.dimension(3);
    tensor4<double> out(B, Lq, H, Dv), w;
    tensor3<double> lse(B, Lq, H);
    ref::softmax_attention_weights(q, k, v, out, lse, w, o);
    sink_grads_d g{{tensor4<double>(B, Lq, H, D), tensor4<double>(B, Lk, Hk, D), tensor4<double>(B, Lk, Hk, Dv)}, vecd(H)};
    const tensor4<double> dd = dout.cast<double>();
    if (o.sinks.empty())
        ref::softmax_attention_backward(q, k, v, out, lse, dd, g.dq, g.dk, g.dv, o);
    else
        ref::softmax_attention_backward(q, k, v, out, lse, dd, g.dq, g.dk, g.dv, g.ds, o);
    g.col_sum = max_column_sum(w, Hk);
    return g;
}

template <class SQ, class S>
void expect_matches_oracle(const tensor4<SQ>& q, const tensor4<S>& k, const tensor4<S>& v, const tensor4<float>& dout,
                           const softmax_options& o, bool equal_nan = false) {
    sink_grads got = run_fast(q, k, v, dout, o);
    sink_grads_d want = run_oracle(q, k, v, dout, o);
    if (equal_nan) nan_if_not_finite_all(got), nan_if_not_finite_all(want);
    const tensor4<float> qf = q.template cast<float>(), kf = k.template cast<float>(), vf = v.template cast<float>();
    const double s1 = 1.0 + score_bound(qf, kf, o);
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(o.scale, q.dimension(3)));
    const double dp = max_row_norm(dout) * max_row_norm(vf);
    const double m_dq = 2 * scale * dp * max_row_norm(kf), m_dk = 2 * scale * dp * max_row_norm(qf) * want.col_sum;
    const double m_dv = max_row_norm(dout) * want.col_sum;
    EXPECT_TRUE(all_close(got.dq, want.dq, tolerance_for(kGradEps, m_dq * s1), equal_nan)) << "d_q";
    EXPECT_TRUE(all_close(got.dk, want.dk, tolerance_for(kGradEps, m_dk * s1), equal_nan)) << "d_k";
    EXPECT_TRUE(all_close(got.dv, want.dv, tolerance_for(kGradEps, m_dv * s1), equal_nan)) << "d_v";
    if (!o.sinks.empty()) {
        const double rows = static_cast<double>(q.dimension(0) * q.dimension(1));
        EXPECT_TRUE(all_close(got.ds, want.ds, tolerance_for(kGradEps, dp * rows * s1), equal_nan)) << "d_sinks";
    }
}

std::vector<bwd_case> build_cases() {
    std::vector<bwd_case> cs;
    std::uint64_t seed = 1;
    auto add = [&](bwd_case c) {
        c.seed = seed++;
        cs.push_back(c);
    };
    add_structured_cases(cs, seed, {1, 3, 4, 7, 8, 9, 16, 17, 31, 64});
    picker pk{20261202};
    const index_t Ls[] = {1, 7, 16, 33, 96, 97, 150};
    const index_t Ds[] = {1, 5, 8, 16, 24};
    const index_t windows[] = {0, 3, 40};
    const index_t chunks[] = {1, 16, 50};
    int made = 0;
    while (made < 60) {
        bwd_case c;
        c.B = 1 + static_cast<index_t>(pk.below(2));
        c.Lq = pk.pick(Ls);
        c.Lk = pk.below(3) == 0 ? c.Lq : pk.pick(Ls);
        c.H = pk.below(2) ? 4 : 2;
        c.Hk = c.H >> pk.below(2);
        c.D = pk.pick(Ds);
        c.Dv = pk.below(2) ? c.D : pk.pick(Ds);
        if (double(c.B) * c.H * c.Lq * c.Lk * (c.D + c.Dv) > 4e6) continue;
        switch (pk.below(7)) {
            case 0: break;
            case 1: c.o.causal = true; break;
            case 2: c.o.window_left = pk.pick(windows); break;
            case 3: c.o.chunk = pk.pick(chunks); break;
            case 4: c.o.causal = true, c.o.window_left = pk.pick(windows); break;
            case 5: c.o.chunk = pk.pick(chunks), c.o.window_left = pk.pick(windows); break;
            default:
                c.o.causal = pk.below(2) == 0;
                c.o.key_lengths.resize(static_cast<std::size_t>(c.B));
                for (auto& l : c.o.key_lengths) l = static_cast<std::int64_t>(pk.below(static_cast<std::uint64_t>(c.Lk + 1)));
                c.o.key_lengths[0] = pk.below(2) ? 0 : c.Lk;
                break;
        }
        if (pk.below(4) == 0) c.o.softcap = pk.below(2) ? 2.0f : 20.0f;
        if (pk.below(4) == 0) {
            c.o.sinks.resize(static_cast<std::size_t>(c.H));
            for (std::size_t h = 0; h < c.o.sinks.size(); ++h) c.o.sinks[h] = static_cast<float>(pk.below(60)) / 10.0f - 2.0f;
        }
        if (pk.below(8) == 0) c.o.scale = 0.5f;
        c.dist = kAllDistributions[pk.below(3)];
        add(c);
        ++made;
    }
    return cs;
}

const std::vector<bwd_case>& all_cases() {
    static const std::vector<bwd_case> cases = build_cases();
    return cases;
}

class sweep : public ::testing::TestWithParam<bwd_case> {};

TEST_P(sweep, matches_oracle) {
    const bwd_case& c = GetParam();
    const backward_inputs in = make_backward_inputs(c);
    expect_matches_oracle(in.q, in.k, in.v, in.dout, c.o);
}

INSTANTIATE_TEST_SUITE_P(softmax_attention_backward, sweep, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<bwd_case>& info) {
                             return std::to_string(info.index) + "_" + info.param.describe();
                         });

// 16-bit q/k/v: the oracle reads the same stored values.
TEST(softmax_attention_backward, bfloat16_and_half_inputs) {
    softmax_options o;
    o.causal = true;
    const tensor4<float> q = random_bshd(2, 37, 4, 24, distribution::gaussian, 91);
    const tensor4<float> k = random_bshd(2, 50, 2, 24, distribution::gaussian, 92);
    const tensor4<float> v = random_bshd(2, 50, 2, 10, distribution::gaussian, 93);
    const tensor4<float> dout = random_bshd(2, 37, 4, 10, distribution::gaussian, 94);
    {
        SCOPED_TRACE("bfloat16 q, k, v");
        const tensor4<Eigen::bfloat16> qb = q.cast<Eigen::bfloat16>(), kb = k.cast<Eigen::bfloat16>(),
                                       vb = v.cast<Eigen::bfloat16>();
        expect_matches_oracle(qb, kb, vb, dout, o);
    }
    {
        SCOPED_TRACE("half k, v with float q");
        const tensor4<Eigen::half> kh = k.cast<Eigen::half>(), vh = v.cast<Eigen::half>();
        expect_matches_oracle(q, kh, vh, dout, o);
    }
}

::testing::AssertionResult same_bits(const tensor4<float>& a, const tensor4<float>& b) {
    if (std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0)
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "bits differ";
}

TEST(softmax_attention_backward, thread_count_gives_bitwise_identical_results) {
    softmax_options o;
    o.causal = true;
    o.sinks = {0.5f, -1.0f, 0.0f, 2.0f, 1.0f, -0.5f};
    const tensor4<float> q = random_bshd(3, 130, 6, 20, distribution::outliers, 101);
    const tensor4<float> k = random_bshd(3, 130, 2, 20, distribution::outliers, 102);
    const tensor4<float> v = random_bshd(3, 130, 2, 17, distribution::outliers, 103);
    const tensor4<float> dout = random_bshd(3, 130, 6, 17, distribution::outliers, 104);
    const sink_grads one = run_fast(q, k, v, dout, o);
    for (int n : {2, 3}) {
        attnkit::thread_pool pool(n);
        softmax_options on = o;
        on.pool = &pool;
        const sink_grads many = run_fast(q, k, v, dout, on);
        EXPECT_TRUE(same_bits(one.dq, many.dq)) << n << " threads, d_q";
        EXPECT_TRUE(same_bits(one.dk, many.dk)) << n << " threads, d_k";
        EXPECT_TRUE(same_bits(one.dv, many.dv)) << n << " threads, d_v";
        for (index_t h = 0; h < 6; ++h) EXPECT_EQ(one.ds(h), many.ds(h)) << n << " threads, d_sinks " << h;
    }
}

// Non-finite inputs: the fused gradients have NaN exactly where the oracle's have (equal_nan),
// so a NaN or Inf never leaks into rows or keys that do not depend on it. Each case puts the
// bad value where a mask hides it from some rows: in the key and value rows past key_lengths,
// in one query row, in one d_out row, and at a key a sliding window hides from later rows.
TEST(softmax_attention_backward, non_finite_inputs_stay_where_they_belong) {
    const float bad_values[] = {kNaN, std::numeric_limits<float>::infinity()};
    for (float bad : bad_values) {
        SCOPED_TRACE(bad);
        softmax_options o;
        o.causal = true;
        o.window_left = 20;
        o.key_lengths = {110, 130};
        tensor4<float> q = random_bshd(2, 130, 2, 9, distribution::gaussian, 111);
        tensor4<float> k = random_bshd(2, 130, 1, 9, distribution::gaussian, 112);
        tensor4<float> v = random_bshd(2, 130, 1, 9, distribution::gaussian, 113);
        tensor4<float> dout = random_bshd(2, 130, 2, 9, distribution::gaussian, 114);
        k(0, 120, 0, 3) = bad;  // past key_lengths[0]: never seen
        v(0, 125, 0, 1) = bad;
        k(1, 30, 0, 2) = bad;  // seen by rows 30..50 only
        v(1, 60, 0, 0) = bad;  // seen by rows 60..80 only
        q(1, 100, 1, 4) = bad;
        dout(0, 70, 0, 2) = bad;
        expect_matches_oracle(q, k, v, dout, o, /*equal_nan=*/true);
    }
}

TEST(softmax_attention_backward, rows_without_keys_contribute_nothing) {
    softmax_options o;
    o.key_lengths = {0, 5};
    o.causal = true;
    const tensor4<float> q = random_bshd(2, 9, 2, 6, distribution::gaussian, 121);
    const tensor4<float> k = random_bshd(2, 7, 2, 6, distribution::gaussian, 122);
    const tensor4<float> v = random_bshd(2, 7, 2, 6, distribution::gaussian, 123);
    const tensor4<float> dout = random_bshd(2, 9, 2, 6, distribution::gaussian, 124);
    const sink_grads g = run_fast(q, k, v, dout, o);
    for (index_t i = 0; i < 9; ++i)
        for (index_t h = 0; h < 2; ++h)
            for (index_t d = 0; d < 6; ++d) {
                EXPECT_EQ(0.0f, g.dq(0, i, h, d));
                if (i < 2) {
                    EXPECT_EQ(0.0f, g.dq(1, i, h, d)) << "row " << i << " sees no key (Lq > Lk)";
                }
            }
    for (index_t j = 0; j < 7; ++j)
        for (index_t d = 0; d < 6; ++d) {
            EXPECT_EQ(0.0f, g.dk(0, j, 0, d));
            EXPECT_EQ(0.0f, g.dv(0, j, 1, d));
            if (j >= 5) {
                EXPECT_EQ(0.0f, g.dk(1, j, 1, d));
            }
        }
    expect_matches_oracle(q, k, v, dout, o);
}

TEST(softmax_attention_backward, strided_gradient_views_equal_dense) {
    softmax_options o;
    o.causal = true;
    const index_t B = 2, L = 33, H = 4, Hk = 2, D = 8;
    const tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 131);
    const tensor4<float> k = random_bshd(B, L, Hk, D, distribution::gaussian, 132);
    const tensor4<float> v = random_bshd(B, L, Hk, D, distribution::gaussian, 133);
    const tensor4<float> dout = random_bshd(B, L, H, D, distribution::gaussian, 134);
    tensor4<float> out(B, L, H, D);
    tensor3<float> lse(B, L, H);
    const sink_grads dense = run_fast(q, k, v, dout, o, &out, &lse);
    std::vector<float> bq(static_cast<std::size_t>(B * H * L * D)), bk(static_cast<std::size_t>(B * Hk * L * D)),
        bv(static_cast<std::size_t>(B * Hk * L * D));
    const auto dq = bhld_as_bshd(bq.data(), B, H, L, D);
    const auto dk = bhld_as_bshd(bk.data(), B, Hk, L, D);
    const auto dv = bhld_as_bshd(bv.data(), B, Hk, L, D);
    attnkit::softmax_attention_backward(q, k, v, out, lse, dout, dq, dk, dv, o);
    EXPECT_TRUE(all_close(dq, dense.dq, 0.0, 0.0)) << "d_q";
    EXPECT_TRUE(all_close(dk, dense.dk, 0.0, 0.0)) << "d_k";
    EXPECT_TRUE(all_close(dv, dense.dv, 0.0, 0.0)) << "d_v";
}

TEST(softmax_attention_backward, empty_sequences) {
    for (auto [Lq, Lk] : {std::pair<index_t, index_t>{0, 5}, {4, 0}}) {
        const tensor4<float> q = random_bshd(1, Lq, 2, 3, distribution::gaussian, 141);
        const tensor4<float> k = random_bshd(1, Lk, 1, 3, distribution::gaussian, 142);
        const tensor4<float> v = random_bshd(1, Lk, 1, 3, distribution::gaussian, 143);
        const tensor4<float> dout = random_bshd(1, Lq, 2, 3, distribution::gaussian, 144);
        const sink_grads g = run_fast(q, k, v, dout, {});
        EXPECT_TRUE(all_equal_to(g.dq, 0.0f));
        EXPECT_TRUE(all_equal_to(g.dk, 0.0f));
        EXPECT_TRUE(all_equal_to(g.dv, 0.0f));
    }
}

// Bad input is rejected before any gradient is written.
TEST(softmax_attention_backward, bad_input_rejected_before_writing) {
    const index_t B = 1, Lq = 3, Lk = 4, H = 2, Hk = 1, D = 3, Dv = 2;
    const tensor4<float> q = random_bshd(B, Lq, H, D, distribution::gaussian, 151);
    const tensor4<float> k = random_bshd(B, Lk, Hk, D, distribution::gaussian, 152);
    const tensor4<float> v = random_bshd(B, Lk, Hk, Dv, distribution::gaussian, 153);
    const tensor4<float> dout = random_bshd(B, Lq, H, Dv, distribution::gaussian, 154);
    tensor4<float> out(B, Lq, H, Dv);
    tensor3<float> lse(B, Lq, H);
    attnkit::softmax_attention(q, k, v, out, lse);
    tensor4<float> dq = make_bshd<float>(B, Lq, H, D, 5.0f), dk = make_bshd<float>(B, Lk, Hk, D, 5.0f),
                   dv = make_bshd<float>(B, Lk, Hk, Dv, 5.0f);
    vec ds(H);
    ds.setConstant(5.0f);

    tensor4<float> bad_dq(B, Lq, H, D + 1);
    expect_invalid([&] { attnkit::softmax_attention_backward(q, k, v, out, lse, dout, bad_dq, dk, dv); },
                   {"d_q", "[1, 3, 2, 4]"});
    tensor4<float> bad_dk(B, Lk + 1, Hk, D);
    expect_invalid([&] { attnkit::softmax_attention_backward(q, k, v, out, lse, dout, dq, bad_dk, dv); },
                   {"d_k", "[1, 5, 1, 3]"});
    tensor4<float> bad_dout(B, Lq, H, Dv + 1);
    expect_invalid([&] { attnkit::softmax_attention_backward(q, k, v, out, lse, bad_dout, dq, dk, dv); }, "d_out");
    tensor4<float> bad_out(B, Lq + 1, H, Dv);
    expect_invalid([&] { attnkit::softmax_attention_backward(q, k, v, bad_out, lse, dout, dq, dk, dv); }, "out");
    tensor3<float> bad_lse(B, Lq, H + 1);
    expect_invalid([&] { attnkit::softmax_attention_backward(q, k, v, out, bad_lse, dout, dq, dk, dv); }, "lse");
    expect_invalid([&] { attnkit::softmax_attention_backward(q, k, v, out, lse, dout, dq, dk, dv, ds, {}); },
                   "d_sinks");
    softmax_options bad_window;
    bad_window.window_left = -2;
    expect_invalid([&] { attnkit::softmax_attention_backward(q, k, v, out, lse, dout, dq, dk, dv, bad_window); },
                   "window");
    // Overlaps: a gradient on an input, on another gradient.
    tensor4<float> q_copy = q;
    expect_invalid([&] { attnkit::softmax_attention_backward(q_copy, k, v, out, lse, dout, q_copy, dk, dv); },
                   "d_q");
    std::vector<float> shared(static_cast<std::size_t>(B * Lk * Hk * D));
    Eigen::TensorMap<tensor4<float>> dk_map(shared.data(), B, Lk, Hk, D);
    Eigen::TensorMap<tensor4<float>> dv_map(shared.data(), B, Lk, Hk, Dv);
    expect_invalid([&] { attnkit::softmax_attention_backward(q, k, v, out, lse, dout, dq, dk_map, dv_map); }, "d_v");
    EXPECT_TRUE(all_equal_to(dq, 5.0f));
    EXPECT_TRUE(all_equal_to(dk, 5.0f));
    EXPECT_TRUE(all_equal_to(dv, 5.0f));
    EXPECT_TRUE(all_equal_to(ds, 5.0f));
}

}  // namespace
