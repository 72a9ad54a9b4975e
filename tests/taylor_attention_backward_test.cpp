// attnkit::taylor_attention_backward, both forms, against the double oracle
// (reference::taylor_attention_backward, itself checked against finite differences in
// reference_taylor_attention_backward_test.cpp), and the two forms against each other.
//
// Tolerances (compare.hpp): tolerance_for(kGradEps, M), M the largest sum of the absolute values
// of the terms that make up one element of a gradient (grad_magnitudes, in double from the
// inputs), not the result (dS = (dP - D) (1 + s) / Z cancels). kGradEps = 64: the row sums Z
// are recomputed (quadratic form: running key sums; linear form: the feature state) with float
// errors of a few eps times their largest term, and reductions run over hundreds of terms.
#include "attnkit/taylor_attention_backward.hpp"

#include "attnkit/reference/taylor_attention_backward.hpp"
#include "attnkit/thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "common/backward_checks.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::taylor_form;
using attnkit::taylor_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;

constexpr double kGradEps = 64;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr taylor_form kForms[] = {taylor_form::quadratic, taylor_form::linear};

const char* form_name(taylor_form f) {
    return f == taylor_form::quadratic ? "quadratic" : f == taylor_form::linear ? "linear" : "automatic";
}

struct bwd_case : backward_shape {
    taylor_options o;

    std::string describe() const {
        std::string s = shape_name();
        if (o.causal) s += "_causal";
        if (!o.key_lengths.empty()) s += "_kl";
        if (o.scale > 0) s += "_scale";
        return s + "_" + name(dist);
    }
};

void PrintTo(const bwd_case& c, std::ostream* os) { *os << c.describe(); }

template <class X>
tensor4<float> fresh(const X& like, float fill = kNaN) {
    return make_bshd<float>(like.dimension(0), like.dimension(1), like.dimension(2), like.dimension(3), fill);
}

// The fast forward (its out), then the backward in the given form.
template <class Q, class K, class V>
grads run_fast(const Q& q, const K& k, const V& v, const tensor4<float>& dout, const taylor_options& o,
               tensor4<float>* out_used = nullptr) {
    const index_t B = q.dimension(0), Lq = q.dimension(1), H = q.dimension(2), D = q.dimension(3);
    const index_t Lk = k.dimension(1), Hk = k.dimension(2), Dv = v.dimension(3);
    tensor4<float> out(B, Lq, H, Dv);
    attnkit::taylor_attention(q, k, v, out, o);
    grads g{make_bshd<float>(B, Lq, H, D, kNaN), make_bshd<float>(B, Lk, Hk, D, kNaN),
            make_bshd<float>(B, Lk, Hk, Dv, kNaN)};
    attnkit::taylor_attention_backward(q, k, v, out, dout, g.dq, g.dk, g.dv, o);
    if (out_used) *out_used = out;
    return g;
}

grads_d run_oracle(const tensor4<float>& q, const tensor4<float>& k, const tensor4<float>& v,
                   const tensor4<float>& dout, const taylor_options& o) {
    const index_t B = q.dimension(0), Lq = q.dimension(1), H = q.dimension(2), D = q.dimension(3);
    const index_t Lk = k.dimension(1), Hk = k.dimension(2), Dv = v.dimension(3);
    tensor4<double> out(B, Lq, H, Dv);
    ref::taylor_attention(q, k, v, out, o);
    grads_d g{tensor4<double>(B, Lq, H, D), tensor4<double>(B, Lk, Hk, D), tensor4<double>(B, Lk, Hk, Dv)};
    const tensor4<double> dd = dout.cast<double>();
    ref::taylor_attention_backward(q, k, v, out, dd, g.dq, g.dk, g.dv, o);
    return g;
}

struct magnitudes {
    double dq = 0, dk = 0, dv = 0;
};

// The largest sum of absolute terms that make up one gradient element, in double from the
// inputs: |dS_ij| <= (|dP_ij| + |D_i|) (1 + |s_ij|) / Z_i, and per element of d_q (d_k) the sum
// over keys (rows) of |dS| times the other side's row norm, of d_v the sum of P |dO|.
magnitudes grad_magnitudes(const tensor4<float>& q, const tensor4<float>& k, const tensor4<float>& v,
                           const tensor4<float>& dout, const taylor_options& o) {
    const index_t B = q.dimension(0), Lq = q.dimension(1), H = q.dimension(2), D = q.dimension(3);
    const index_t Lk = k.dimension(1), Hk = k.dimension(2), Dv = v.dimension(3), G = H / Hk;
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(o.scale, D));
    auto norm = [](const tensor4<float>& x, index_t b, index_t i, index_t h) {
        double n = 0;
        for (index_t d = 0; d < x.dimension(3); ++d) n += double(x(b, i, h, d)) * double(x(b, i, h, d));
        return std::sqrt(n);
    };
    magnitudes m;
    std::vector<double> sk(static_cast<std::size_t>(Lk)), sv(static_cast<std::size_t>(Lk)), w(static_cast<std::size_t>(Lk)),
        sc(static_cast<std::size_t>(Lk));
    for (index_t b = 0; b < B; ++b) {
        const index_t len = o.key_lengths.empty() ? Lk : static_cast<index_t>(o.key_lengths[b]);
        for (index_t hk = 0; hk < Hk; ++hk) {
            std::fill(sk.begin(), sk.end(), 0.0);
            std::fill(sv.begin(), sv.end(), 0.0);
            for (index_t h = hk * G; h < (hk + 1) * G; ++h)
                for (index_t i = 0; i < Lq; ++i) {
                    const index_t n = ref::taylor_impl::visible_prefix(o, i, Lq, Lk, len);
                    double z = o.eps, dmag = 0, dq = 0;
                    for (index_t j = 0; j < n; ++j) {
                        double dot = 0;
                        for (index_t d = 0; d < D; ++d) dot += double(q(b, i, h, d)) * double(k(b, j, hk, d));
                        sc[j] = scale * dot;
                        w[j] = 1 + sc[j] + 0.5 * sc[j] * sc[j];
                        z += w[j];
                    }
                    const double dn = norm(dout, b, i, h), qn = norm(q, b, i, h);
                    for (index_t j = 0; j < n; ++j) dmag += w[j] / z * dn * norm(v, b, j, hk);
                    for (index_t j = 0; j < n; ++j) {
                        const double ds = (dn * norm(v, b, j, hk) + dmag) * (1 + std::abs(sc[j])) / z;
                        dq += scale * ds * norm(k, b, j, hk);
                        sk[j] += scale * ds * qn;
                        sv[j] += w[j] / z * dn;
                    }
                    m.dq = std::max(m.dq, dq);
                }
            for (index_t j = 0; j < Lk; ++j) m.dk = std::max(m.dk, sk[j]), m.dv = std::max(m.dv, sv[j]);
        }
    }
    (void)Dv;
    return m;
}

void expect_matches_oracle(const tensor4<float>& q, const tensor4<float>& k, const tensor4<float>& v,
                           const tensor4<float>& dout, const taylor_options& o, bool equal_nan = false) {
    grads_d want = run_oracle(q, k, v, dout, o);
    const magnitudes m = grad_magnitudes(q, k, v, dout, o);
    if (equal_nan) nan_if_not_finite_all(want);
    for (taylor_form f : kForms) {
        SCOPED_TRACE(form_name(f));
        taylor_options of = o;
        of.form = f;
        grads got = run_fast(q, k, v, dout, of);
        if (equal_nan) nan_if_not_finite_all(got);
        EXPECT_TRUE(all_close(got.dq, want.dq, tolerance_for(kGradEps, m.dq), equal_nan)) << "d_q";
        EXPECT_TRUE(all_close(got.dk, want.dk, tolerance_for(kGradEps, m.dk), equal_nan)) << "d_k";
        EXPECT_TRUE(all_close(got.dv, want.dv, tolerance_for(kGradEps, m.dv), equal_nan)) << "d_v";
    }
}

std::vector<bwd_case> build_cases() {
    std::vector<bwd_case> cs;
    std::uint64_t seed = 1;
    auto add = [&](bwd_case c) {
        c.seed = seed++;
        cs.push_back(c);
    };
    add_structured_cases(cs, seed, {1, 3, 4, 7, 8, 9, 16, 17, 31});
    picker pk{20261203};
    const index_t Ls[] = {1, 7, 16, 33, 64, 96, 97, 150};
    const index_t Ds[] = {1, 5, 8, 16, 24};
    int made = 0;
    while (made < 40) {
        bwd_case c;
        c.B = 1 + static_cast<index_t>(pk.below(2));
        c.Lq = pk.pick(Ls);
        c.Lk = pk.below(3) == 0 ? c.Lq : pk.pick(Ls);
        c.H = pk.below(2) ? 4 : 2;
        c.Hk = c.H >> pk.below(2);
        c.D = pk.pick(Ds);
        c.Dv = pk.below(2) ? c.D : pk.pick(Ds);
        if (double(c.B) * c.H * c.Lq * c.Lk * (c.D + c.Dv) > 4e6) continue;
        c.o.causal = pk.below(2) == 0;
        if (pk.below(3) == 0) {
            c.o.key_lengths.resize(static_cast<std::size_t>(c.B));
            for (auto& l : c.o.key_lengths) l = static_cast<std::int64_t>(pk.below(static_cast<std::uint64_t>(c.Lk + 1)));
            c.o.key_lengths[0] = pk.below(2) ? 0 : c.Lk;
        }
        if (pk.below(6) == 0) c.o.scale = 0.5f;
        if (pk.below(6) == 0) c.o.eps = 0.0f;
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

INSTANTIATE_TEST_SUITE_P(taylor_attention_backward, sweep, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<bwd_case>& info) {
                             return std::to_string(info.index) + "_" + info.param.describe();
                         });

// Longer sequences, where the linear form runs many chunks and the quadratic form many blocks;
// with one query head per key/value head (H 1) whole chunks of queries take the transposing pack.
TEST(taylor_attention_backward, long_causal_sequences) {
    for (index_t H : {2, 1}) {
        for (index_t D : {16, 32}) {
            SCOPED_TRACE(std::to_string(D) + " H " + std::to_string(H));
            taylor_options o;
            o.causal = true;
            const tensor4<float> q = random_bshd(1, 300, H, D, distribution::gaussian, 51);
            const tensor4<float> k = random_bshd(1, 333, 1, D, distribution::gaussian, 52);
            const tensor4<float> v = random_bshd(1, 333, 1, 24, distribution::gaussian, 53);
            const tensor4<float> dout = random_bshd(1, 300, H, 24, distribution::gaussian, 54);
            expect_matches_oracle(q, k, v, dout, o);
        }
    }
}

// The two forms compute the gradients of the same function: they agree with each other to float
// tolerance (the oracle's double level, 1e-9, is the reference test's: both reference forms'
// finite differences match the one oracle).
TEST(taylor_attention_backward, forms_agree) {
    for (bool causal : {false, true}) {
        SCOPED_TRACE(causal);
        taylor_options o;
        o.causal = causal;
        o.key_lengths = {200, 131};
        const tensor4<float> q = random_bshd(2, 190, 4, 16, distribution::gaussian, 61);
        const tensor4<float> k = random_bshd(2, 200, 2, 16, distribution::gaussian, 62);
        const tensor4<float> v = random_bshd(2, 200, 2, 20, distribution::gaussian, 63);
        const tensor4<float> dout = random_bshd(2, 190, 4, 20, distribution::gaussian, 64);
        taylor_options oq = o, ol = o;
        oq.form = taylor_form::quadratic;
        ol.form = taylor_form::linear;
        const grads a = run_fast(q, k, v, dout, oq), b = run_fast(q, k, v, dout, ol);
        const magnitudes m = grad_magnitudes(q, k, v, dout, o);
        EXPECT_TRUE(all_close(a.dq, b.dq, tolerance_for(2 * kGradEps, m.dq))) << "d_q";
        EXPECT_TRUE(all_close(a.dk, b.dk, tolerance_for(2 * kGradEps, m.dk))) << "d_k";
        EXPECT_TRUE(all_close(a.dv, b.dv, tolerance_for(2 * kGradEps, m.dv))) << "d_v";
    }
}

::testing::AssertionResult same_bits(const tensor4<float>& a, const tensor4<float>& b);

// automatic runs the form the backward cost model picks, bit for bit; the model picks the
// quadratic form for short sequences and the linear one for long ones at small D.
TEST(taylor_attention_backward, automatic_runs_the_chosen_form) {
    namespace ad = attnkit::detail;
    EXPECT_EQ(taylor_form::quadratic, ad::taylor::choose_backward_form({1, 512, 512, 8, 8, 64, 64}, [] {
                  taylor_options o;
                  o.causal = true;
                  return o;
              }()));
    EXPECT_EQ(taylor_form::linear, ad::taylor::choose_backward_form({1, 16384, 16384, 8, 8, 64, 64}, [] {
                  taylor_options o;
                  o.causal = true;
                  return o;
              }()));
    EXPECT_EQ(taylor_form::linear, ad::taylor::choose_backward_form({1, 4096, 4096, 2, 2, 4, 4}, {}));
    for (index_t D : {4, 24}) {
        SCOPED_TRACE(D);
        taylor_options o;
        o.causal = true;
        const tensor4<float> q = random_bshd(1, 150, 2, D, distribution::gaussian, 71);
        const tensor4<float> k = random_bshd(1, 150, 1, D, distribution::gaussian, 72);
        const tensor4<float> v = random_bshd(1, 150, 1, 8, distribution::gaussian, 73);
        const tensor4<float> dout = random_bshd(1, 150, 2, 8, distribution::gaussian, 74);
        const ad::attention_shape sh{1, 150, 150, 2, 1, D, 8};
        taylor_options chosen = o;
        chosen.form = ad::taylor::choose_backward_form(sh, o);
        // One forward output for both calls: the forward's own automatic choice (its cost model)
        // need not be the backward's, and its bits would differ between the forms.
        taylor_options fwd = o;
        fwd.form = taylor_form::quadratic;
        tensor4<float> out(1, 150, 2, 8);
        attnkit::taylor_attention(q, k, v, out, fwd);
        auto backward = [&](const taylor_options& ob) {
            grads g{make_bshd<float>(1, 150, 2, D, kNaN), make_bshd<float>(1, 150, 1, D, kNaN),
                    make_bshd<float>(1, 150, 1, 8, kNaN)};
            attnkit::taylor_attention_backward(q, k, v, out, dout, g.dq, g.dk, g.dv, ob);
            return g;
        };
        const grads a = backward(o), b = backward(chosen);
        EXPECT_TRUE(same_bits(a.dq, b.dq)) << form_name(chosen.form);
        EXPECT_TRUE(same_bits(a.dk, b.dk));
        EXPECT_TRUE(same_bits(a.dv, b.dv));
    }
}

::testing::AssertionResult same_bits(const tensor4<float>& a, const tensor4<float>& b) {
    if (std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0)
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "bits differ";
}

TEST(taylor_attention_backward, thread_count_gives_bitwise_identical_results) {
    for (taylor_form f : kForms) {
        SCOPED_TRACE(form_name(f));
        taylor_options o;
        o.causal = true;
        o.form = f;
        const tensor4<float> q = random_bshd(3, 130, 6, 20, distribution::outliers, 101);
        const tensor4<float> k = random_bshd(3, 130, 2, 20, distribution::outliers, 102);
        const tensor4<float> v = random_bshd(3, 130, 2, 17, distribution::outliers, 103);
        const tensor4<float> dout = random_bshd(3, 130, 6, 17, distribution::outliers, 104);
        const grads one = run_fast(q, k, v, dout, o);
        for (int n : {2, 3}) {
            attnkit::thread_pool pool(n);
            taylor_options on = o;
            on.pool = &pool;
            const grads many = run_fast(q, k, v, dout, on);
            EXPECT_TRUE(same_bits(one.dq, many.dq)) << n << " threads, d_q";
            EXPECT_TRUE(same_bits(one.dk, many.dk)) << n << " threads, d_k";
            EXPECT_TRUE(same_bits(one.dv, many.dv)) << n << " threads, d_v";
        }
    }
}

// Non-finite inputs: the gradients are non-finite exactly where the oracle's are, so a NaN or
// Inf never leaks into rows or keys that do not depend on it: keys past key_lengths, a key that
// only later rows see (causal), one query row, one d_out row.
TEST(taylor_attention_backward, non_finite_inputs_stay_where_they_belong) {
    const float bad_values[] = {kNaN, std::numeric_limits<float>::infinity()};
    for (float bad : bad_values) {
        SCOPED_TRACE(bad);
        taylor_options o;
        o.causal = true;
        o.key_lengths = {110, 130};
        tensor4<float> q = random_bshd(2, 130, 2, 9, distribution::gaussian, 111);
        tensor4<float> k = random_bshd(2, 130, 1, 9, distribution::gaussian, 112);
        tensor4<float> v = random_bshd(2, 130, 1, 9, distribution::gaussian, 113);
        tensor4<float> dout = random_bshd(2, 130, 2, 9, distribution::gaussian, 114);
        k(0, 120, 0, 3) = bad;  // past key_lengths[0]: never seen
        v(0, 125, 0, 1) = bad;
        k(1, 100, 0, 2) = bad;  // seen by rows 100.. only
        v(1, 90, 0, 0) = bad;   // seen by rows 90.. only
        q(1, 40, 1, 4) = bad;
        dout(0, 70, 0, 2) = bad;
        expect_matches_oracle(q, k, v, dout, o, /*equal_nan=*/true);
    }
}

TEST(taylor_attention_backward, rows_without_keys_contribute_nothing) {
    for (taylor_form f : kForms) {
        SCOPED_TRACE(form_name(f));
        taylor_options o;
        o.key_lengths = {0, 5};
        o.causal = true;
        o.form = f;
        const tensor4<float> q = random_bshd(2, 9, 2, 6, distribution::gaussian, 121);
        const tensor4<float> k = random_bshd(2, 7, 2, 6, distribution::gaussian, 122);
        const tensor4<float> v = random_bshd(2, 7, 2, 6, distribution::gaussian, 123);
        const tensor4<float> dout = random_bshd(2, 9, 2, 6, distribution::gaussian, 124);
        const grads g = run_fast(q, k, v, dout, o);
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
        for (index_t i = 0; i < g.dq.size(); ++i) EXPECT_FALSE(std::isnan(g.dq.data()[i]));
    }
}

TEST(taylor_attention_backward, strided_views_equal_dense) {
    for (taylor_form f : kForms) {
        SCOPED_TRACE(form_name(f));
        taylor_options o;
        o.causal = true;
        o.form = f;
        const index_t B = 2, L = 70, H = 4, Hk = 2, D = 8;
        const tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 131);
        const tensor4<float> k = random_bshd(B, L, Hk, D, distribution::gaussian, 132);
        const tensor4<float> v = random_bshd(B, L, Hk, D, distribution::gaussian, 133);
        const tensor4<float> dout = random_bshd(B, L, H, D, distribution::gaussian, 134);
        tensor4<float> out(B, L, H, D);
        const grads dense = run_fast(q, k, v, dout, o, &out);
        // Inputs in [B, H, L, D] buffers and gradients likewise, all as strided BSHD views.
        std::vector<float> iq(static_cast<std::size_t>(B * H * L * D)), ik(static_cast<std::size_t>(B * Hk * L * D)),
            iv(static_cast<std::size_t>(B * Hk * L * D));
        const auto qv = bhld_as_bshd(iq.data(), B, H, L, D);
        const auto kv = bhld_as_bshd(ik.data(), B, Hk, L, D);
        const auto vv = bhld_as_bshd(iv.data(), B, Hk, L, D);
        for_each_index<4>(qv.dims, [&](const std::array<index_t, 4>& x) { at(qv, x) = q(x[0], x[1], x[2], x[3]); });
        for_each_index<4>(kv.dims, [&](const std::array<index_t, 4>& x) { at(kv, x) = k(x[0], x[1], x[2], x[3]); });
        for_each_index<4>(vv.dims, [&](const std::array<index_t, 4>& x) { at(vv, x) = v(x[0], x[1], x[2], x[3]); });
        std::vector<float> bq(static_cast<std::size_t>(B * H * L * D)), bk(static_cast<std::size_t>(B * Hk * L * D)),
            bv(static_cast<std::size_t>(B * Hk * L * D));
        const auto dq = bhld_as_bshd(bq.data(), B, H, L, D);
        const auto dk = bhld_as_bshd(bk.data(), B, Hk, L, D);
        const auto dv = bhld_as_bshd(bv.data(), B, Hk, L, D);
        attnkit::taylor_attention_backward(as_view(qv), as_view(kv), as_view(vv), out, dout, dq, dk, dv, o);
        EXPECT_TRUE(all_close(dq, dense.dq, 0.0, 0.0)) << "d_q";
        EXPECT_TRUE(all_close(dk, dense.dk, 0.0, 0.0)) << "d_k";
        EXPECT_TRUE(all_close(dv, dense.dv, 0.0, 0.0)) << "d_v";
    }
}

TEST(taylor_attention_backward, empty_sequences) {
    for (taylor_form f : kForms)
        for (auto [Lq, Lk] : {std::pair<index_t, index_t>{0, 5}, {4, 0}}) {
            SCOPED_TRACE(form_name(f));
            taylor_options o;
            o.form = f;
            const tensor4<float> q = random_bshd(1, Lq, 2, 3, distribution::gaussian, 141);
            const tensor4<float> k = random_bshd(1, Lk, 1, 3, distribution::gaussian, 142);
            const tensor4<float> v = random_bshd(1, Lk, 1, 3, distribution::gaussian, 143);
            const tensor4<float> dout = random_bshd(1, Lq, 2, 3, distribution::gaussian, 144);
            const grads g = run_fast(q, k, v, dout, o);
            EXPECT_TRUE(all_equal_to(g.dq, 0.0f));
            EXPECT_TRUE(all_equal_to(g.dk, 0.0f));
            EXPECT_TRUE(all_equal_to(g.dv, 0.0f));
        }
}

// Bad input is rejected before any gradient is written.
TEST(taylor_attention_backward, bad_input_rejected_before_writing) {
    const index_t B = 1, Lq = 3, Lk = 4, H = 2, Hk = 1, D = 3, Dv = 2;
    const tensor4<float> q = random_bshd(B, Lq, H, D, distribution::gaussian, 151);
    const tensor4<float> k = random_bshd(B, Lk, Hk, D, distribution::gaussian, 152);
    const tensor4<float> v = random_bshd(B, Lk, Hk, Dv, distribution::gaussian, 153);
    const tensor4<float> dout = random_bshd(B, Lq, H, Dv, distribution::gaussian, 154);
    tensor4<float> out(B, Lq, H, Dv);
    attnkit::taylor_attention(q, k, v, out);
    tensor4<float> dq = make_bshd<float>(B, Lq, H, D, 5.0f), dk = make_bshd<float>(B, Lk, Hk, D, 5.0f),
                   dv = make_bshd<float>(B, Lk, Hk, Dv, 5.0f);
    for (taylor_form f : kForms) {
        taylor_options o;
        o.form = f;
        tensor4<float> bad_dq(B, Lq, H, D + 1);
        expect_invalid([&] { attnkit::taylor_attention_backward(q, k, v, out, dout, bad_dq, dk, dv, o); },
                       {"d_q", "[1, 3, 2, 4]"});
        tensor4<float> bad_dk(B, Lk + 1, Hk, D);
        expect_invalid([&] { attnkit::taylor_attention_backward(q, k, v, out, dout, dq, bad_dk, dv, o); },
                       {"d_k", "[1, 5, 1, 3]"});
        tensor4<float> bad_dout(B, Lq, H, Dv + 1);
        expect_invalid([&] { attnkit::taylor_attention_backward(q, k, v, out, bad_dout, dq, dk, dv, o); }, "d_out");
        tensor4<float> bad_out(B, Lq + 1, H, Dv);
        expect_invalid([&] { attnkit::taylor_attention_backward(q, k, v, bad_out, dout, dq, dk, dv, o); }, "out");
        taylor_options bad = o;
        bad.eps = -1.0f;
        expect_invalid([&] { attnkit::taylor_attention_backward(q, k, v, out, dout, dq, dk, dv, bad); }, "eps");
        bad = o;
        bad.key_lengths = {5};
        expect_invalid([&] { attnkit::taylor_attention_backward(q, k, v, out, dout, dq, dk, dv, bad); }, "key_lengths");
        tensor4<float> q_copy = q;
        expect_invalid([&] { attnkit::taylor_attention_backward(q_copy, k, v, out, dout, q_copy, dk, dv, o); }, "d_q");
        std::vector<float> shared(static_cast<std::size_t>(B * Lk * Hk * D));
        Eigen::TensorMap<tensor4<float>> dk_map(shared.data(), B, Lk, Hk, D);
        Eigen::TensorMap<tensor4<float>> dv_map(shared.data(), B, Lk, Hk, Dv);
        expect_invalid([&] { attnkit::taylor_attention_backward(q, k, v, out, dout, dq, dk_map, dv_map, o); }, "d_v");
    }
    EXPECT_TRUE(all_equal_to(dq, 5.0f));
    EXPECT_TRUE(all_equal_to(dk, 5.0f));
    EXPECT_TRUE(all_equal_to(dv, 5.0f));
}

}  // namespace
