// attnkit::self_gating_attention_backward against the double oracle
// (reference::self_gating_attention_backward, itself checked against finite differences in
// reference_self_gating_attention_backward_test.cpp).
//
// Tolerances (compare.hpp): each gradient tensor is held to tolerance_for(kGradEps, M (1 + S)),
// S the Cauchy-Schwarz bound on the gates (a float gate, max and weight carry a relative error of
// a few eps |g|) and M a bound on the sum of the absolute values of the terms that make up one of
// its elements (dg = sum_i w_ij (dW_ij - D_i) cancels). With p = max|dO_i| max|v_j| (row norms)
// and c the largest column sum of the weights (the weight one token gets from all rows of its
// key/value head's query heads):
//   d_q: 2 scale p max|k_j| c      d_k: 2 scale p max|q_j| c      d_v: max|dO_i| c
#include "attnkit/self_gating_attention_backward.hpp"

#include "attnkit/reference/self_gating_attention_backward.hpp"
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
#include "common/sweep.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::self_gating_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;

constexpr double kGradEps = 32;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct weighted_grads_d : grads_d {
    double col_sum = 0.0;  // the largest column sum of the weights over a key/value head's rows
};

// with_lse: the forward keeps lse and the backward takes it (no pass over q and k of its own).
grads run_fast(const tensor4<float>& q, const tensor4<float>& k, const tensor4<float>& v, const tensor4<float>& dout,
               const self_gating_options& o, tensor4<float>* out_used = nullptr, bool with_lse = false) {
    const index_t B = q.dimension(0), L = q.dimension(1), H = q.dimension(2), D = q.dimension(3);
    const index_t Hk = k.dimension(2), Dv = v.dimension(3);
    tensor4<float> out(B, L, H, Dv);
    tensor3<float> lse = make_lse<float>(B, L, H, kNaN);
    if (with_lse)
        attnkit::self_gating_attention(q, k, v, out, lse, o);
    else
        attnkit::self_gating_attention(q, k, v, out, o);
    grads g{make_bshd<float>(B, L, H, D, kNaN), make_bshd<float>(B, L, Hk, D, kNaN), make_bshd<float>(B, L, Hk, Dv, kNaN)};
    if (with_lse)
        attnkit::self_gating_attention_backward(q, k, v, out, lse, dout, g.dq, g.dk, g.dv, o);
    else
        attnkit::self_gating_attention_backward(q, k, v, out, dout, g.dq, g.dk, g.dv, o);
    if (out_used) *out_used = out;
    return g;
}

weighted_grads_d run_oracle(const tensor4<float>& q, const tensor4<float>& k, const tensor4<float>& v,
                   const tensor4<float>& dout, const self_gating_options& o) {
    const index_t B = q.dimension(0), L = q.dimension(1), H = q.dimension(2), D = q.dimension(3);
    const index_t Hk = k.dimension(2), Dv = v.dimension(3);
    tensor4<double> out(B, L, H, Dv), w;
    self_gating_options oo = o;
    oo.pool = nullptr;
    ref::self_gating_attention(q, k, v, out, w, oo);
    weighted_grads_d g{{tensor4<double>(B, L, H, D), tensor4<double>(B, L, Hk, D), tensor4<double>(B, L, Hk, Dv)}};
    ref::self_gating_attention_backward(q, k, v, out, dout, g.dq, g.dk, g.dv, oo);
    g.col_sum = max_column_sum(w, Hk);
    return g;
}

// The tolerance covers both forms: lse's rounding (eps |lse| <= eps (S + log L)) is of the
// order of the gates' own (eps S).
void expect_matches_oracle(const tensor4<float>& q, const tensor4<float>& k, const tensor4<float>& v,
                           const tensor4<float>& dout, const self_gating_options& o, bool equal_nan = false,
                           bool with_lse = false) {
    grads got = run_fast(q, k, v, dout, o, nullptr, with_lse);
    weighted_grads_d want = run_oracle(q, k, v, dout, o);
    if (equal_nan) {
        nan_if_not_finite_all(got), nan_if_not_finite_all(want);
    }
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(o.scale, q.dimension(3)));
    const double s1 = 1.0 + scale * max_row_norm(q) * max_row_norm(k) + std::log(double(q.dimension(1)) + 1.0);
    const double c = std::max(1.0, want.col_sum);
    const double dp = max_row_norm(dout) * max_row_norm(v);
    const double m_dq = 2 * scale * dp * max_row_norm(k) * c, m_dk = 2 * scale * dp * max_row_norm(q) * c;
    const double m_dv = max_row_norm(dout) * c;
    EXPECT_TRUE(all_close(got.dq, want.dq, tolerance_for(kGradEps, m_dq * s1), equal_nan)) << "d_q";
    EXPECT_TRUE(all_close(got.dk, want.dk, tolerance_for(kGradEps, m_dk * s1), equal_nan)) << "d_k";
    EXPECT_TRUE(all_close(got.dv, want.dv, tolerance_for(kGradEps, m_dv * s1), equal_nan)) << "d_v";
}

struct bwd_case {
    index_t B = 1, L = 5, H = 2, Hk = 1, D = 4, Dv = 4;
    self_gating_options o;
    distribution dist = distribution::gaussian;
    std::uint64_t seed = 1;

    std::string describe() const {
        std::string s = "B" + std::to_string(B) + "_L" + std::to_string(L) + "_H" + std::to_string(H) + "_Hk" +
                        std::to_string(Hk) + "_D" + std::to_string(D) + "_Dv" + std::to_string(Dv);
        if (o.causal) s += "_causal";
        if (!o.key_lengths.empty()) s += "_kl";
        if (o.scale > 0) s += "_scale";
        return s + "_" + name(dist);
    }
};

void PrintTo(const bwd_case& c, std::ostream* os) { *os << c.describe(); }

std::vector<bwd_case> sweep() {
    std::vector<bwd_case> cs;
    std::uint64_t seed = 1000;
    const distribution dists[] = {distribution::uniform, distribution::gaussian, distribution::outliers};
    int n = 0;
    // Lengths straddling the chunk length (16) and lane widths; head counts straddling 4/8/16
    // heads per vector (the per-head scalars go W heads at a time); dims straddling 4/8/16 lanes.
    const index_t lens[] = {1, 3, 16, 17, 40, 70};
    const std::pair<index_t, index_t> heads[] = {{1, 1}, {2, 1}, {4, 2}, {5, 5}, {9, 3}, {17, 1}};
    const std::pair<index_t, index_t> dims[] = {{1, 1}, {3, 5}, {4, 4}, {7, 9}, {8, 8}, {16, 17}, {33, 15}};
    for (index_t L : lens)
        for (const auto& hh : heads)
            for (bool causal : {true, false}) {
                bwd_case c;
                const auto& dd = dims[static_cast<std::size_t>(n % 7)];
                c.B = 1 + n % 2;
                c.L = L;
                c.H = hh.first;
                c.Hk = hh.second;
                c.D = dd.first;
                c.Dv = dd.second;
                c.o.causal = causal;
                if (n % 3 == 1) c.o.key_lengths = c.B == 1 ? std::vector<std::int64_t>{L / 2 + 1}
                                                           : std::vector<std::int64_t>{L, (L + 1) / 3};
                if (n % 5 == 2) c.o.scale = 0.7f;
                c.dist = dists[n % 3];
                c.seed = seed += 7;
                cs.push_back(c);
                ++n;
            }
    return cs;
}

class sweep_test : public ::testing::TestWithParam<bwd_case> {};

TEST_P(sweep_test, matches_oracle) {
    const bwd_case& c = GetParam();
    const tensor4<float> q = random_bshd(c.B, c.L, c.H, c.D, c.dist, c.seed);
    const tensor4<float> k = random_bshd(c.B, c.L, c.Hk, c.D, c.dist, c.seed + 1);
    const tensor4<float> v = random_bshd(c.B, c.L, c.Hk, c.Dv, c.dist, c.seed + 2);
    const tensor4<float> dout = random_bshd(c.B, c.L, c.H, c.Dv, c.dist, c.seed + 3);
    expect_matches_oracle(q, k, v, dout, c.o);
    expect_matches_oracle(q, k, v, dout, c.o, false, /*with_lse=*/true);
}

INSTANTIATE_TEST_SUITE_P(self_gating_attention_backward, sweep_test, ::testing::ValuesIn(sweep()),
                         [](const ::testing::TestParamInfo<bwd_case>& i) { return i.param.describe(); });

// Gates of about +-1e3 (q and k scaled): exp(g) alone overflows float, and a prefix's weights
// relative to one global max would underflow to 0 / 0. The gradients stay finite and match the
// oracle (the tolerance grows with the gates: their own float rounding is eps |g|).
TEST(self_gating_attention_backward, large_gates_are_finite_and_correct) {
    for (bool causal : {true, false}) {
        SCOPED_TRACE(causal);
        self_gating_options o;
        o.causal = causal;
        const index_t B = 1, L = 67, H = 3, D = 16, Dv = 12;
        tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 71);
        const tensor4<float> k = random_bshd(B, L, H, D, distribution::gaussian, 72);
        const tensor4<float> v = random_bshd(B, L, H, Dv, distribution::gaussian, 73);
        const tensor4<float> dout = random_bshd(B, L, H, Dv, distribution::gaussian, 74);
        // Each query row scaled so that its gate is about +-1e3, rising and falling along the rows.
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < H; ++h) {
                double g = 0;
                for (index_t d = 0; d < D; ++d) g += double(q(0, l, h, d)) * double(k(0, l, h, d)) / 4.0;
                const double target = (l % 5 == 0 ? 1000.0 : 990.0 - 3.0 * static_cast<double>(l % 7)) * (h == 1 ? -1 : 1);
                for (index_t d = 0; d < D; ++d) q(0, l, h, d) = static_cast<float>(q(0, l, h, d) * target / g);
            }
        for (bool with_lse : {false, true}) {
            SCOPED_TRACE(with_lse ? "with lse" : "without lse");
            const grads got = run_fast(q, k, v, dout, o, nullptr, with_lse);
            for (const tensor4<float>* t : {&got.dq, &got.dk, &got.dv})
                for (index_t i = 0; i < t->size(); ++i) ASSERT_TRUE(std::isfinite(t->data()[i])) << i;
            expect_matches_oracle(q, k, v, dout, o, false, with_lse);
        }
    }
}

::testing::AssertionResult same_bits(const tensor4<float>& a, const tensor4<float>& b) {
    if (a.size() == b.size() &&
        std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0)
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "bits differ";
}

// Many chunks per item (chunk_len: 16 positions at this length), one head and several, GQA,
// key_lengths cutting inside a chunk, one item as well as three: 1, 2 and 3 threads give the
// same bits.
TEST(self_gating_attention_backward, thread_count_gives_bitwise_identical_results) {
    struct shape_case {
        index_t B, H, Hk;
    };
    for (bool causal : {true, false})
        for (const shape_case sc : {shape_case{3, 1, 1}, shape_case{3, 6, 2}, shape_case{1, 1, 1}, shape_case{1, 8, 4}}) {
            const index_t B = sc.B, H = sc.H, Hk = sc.Hk;
            SCOPED_TRACE(std::string(causal ? "causal" : "full") + " B " + std::to_string(B) + " H " +
                         std::to_string(H) + " Hk " + std::to_string(Hk));
            self_gating_options o;
            o.causal = causal;
            o.key_lengths = B == 3 ? std::vector<index_t>{300, 517, 0} : std::vector<index_t>{400};
            const tensor4<float> q = random_bshd(B, 517, H, 20, distribution::outliers, 101);
            const tensor4<float> k = random_bshd(B, 517, Hk, 20, distribution::outliers, 102);
            const tensor4<float> v = random_bshd(B, 517, Hk, 17, distribution::outliers, 103);
            const tensor4<float> dout = random_bshd(B, 517, H, 17, distribution::outliers, 104);
            for (bool with_lse : {false, true}) {
                const grads one = run_fast(q, k, v, dout, o, nullptr, with_lse);
                for (int n : {2, 3}) {
                    attnkit::thread_pool pool(n);
                    self_gating_options on = o;
                    on.pool = &pool;
                    // Repeats look for a schedule-dependent result; under a sanitizer one run per
                    // pool size checks the memory accesses (the native build repeats).
                    for (int rep = 0; rep < (kSanitizerSweep ? 1 : 3); ++rep) {
                        const grads many = run_fast(q, k, v, dout, on, nullptr, with_lse);
                        EXPECT_TRUE(same_bits(one.dq, many.dq)) << n << " threads, d_q, lse " << with_lse;
                        EXPECT_TRUE(same_bits(one.dk, many.dk)) << n << " threads, d_k, lse " << with_lse;
                        EXPECT_TRUE(same_bits(one.dv, many.dv)) << n << " threads, d_v, lse " << with_lse;
                    }
                }
                // The oracle at this length (L x L in double, 16 times) is most of this test's
                // time: under a sanitizer, which is here for the kernels' memory accesses (the
                // runs above make them; the sweep runs the oracle), it is left to the native
                // build.
                if (!kSanitizerSweep) expect_matches_oracle(q, k, v, dout, o, false, with_lse);
            }
        }
}

// Non-finite inputs: NaN exactly where the oracle has it (equal_nan): never in another batch
// item, another key/value head's group, a token past key_lengths, or (causal) a token after the
// row of a bad d_out.
TEST(self_gating_attention_backward, non_finite_inputs_stay_where_they_belong) {
    const float bad_values[] = {kNaN, std::numeric_limits<float>::infinity()};
    for (float bad : bad_values)
        for (bool causal : {true, false}) {
            SCOPED_TRACE(std::to_string(bad) + (causal ? " causal" : " full"));
            self_gating_options o;
            o.causal = causal;
            o.key_lengths = {40, 50, 50};
            tensor4<float> q = random_bshd(3, 50, 4, 9, distribution::gaussian, 111);
            tensor4<float> k = random_bshd(3, 50, 2, 9, distribution::gaussian, 112);
            tensor4<float> v = random_bshd(3, 50, 2, 9, distribution::gaussian, 113);
            tensor4<float> dout = random_bshd(3, 50, 4, 9, distribution::gaussian, 114);
            k(0, 45, 0, 3) = bad;     // past key_lengths[0]: never seen
            v(0, 47, 1, 1) = bad;
            // item 1, head 3 (key/value head 1); NaN only: an infinite gate is a limit the kernel
            // takes (all weight on that token) and the oracle does not
            q(1, 20, 3, 4) = kNaN;
            dout(2, 30, 0, 2) = bad;  // item 2, head 0: tokens 0..30 (causal)
            expect_matches_oracle(q, k, v, dout, o, /*equal_nan=*/true);
            expect_matches_oracle(q, k, v, dout, o, /*equal_nan=*/true, /*with_lse=*/true);
            const grads g = run_fast(q, k, v, dout, o);
            for (index_t d = 0; d < 9; ++d) {
                EXPECT_TRUE(std::isfinite(g.dq(1, 20, 0, d)) && std::isfinite(g.dk(1, 20, 0, d)));
                EXPECT_TRUE(std::isfinite(g.dq(2, 10, 2, d)));
                if (causal) {
                    EXPECT_TRUE(std::isfinite(g.dv(2, 31, 0, d)));
                }
            }
        }
}

// Item 0 sees nothing, item 1 sees its first 3 tokens: zeros where nothing is seen.
TEST(self_gating_attention_backward, masked_tokens_get_zero) {
    for (bool causal : {true, false}) {
        self_gating_options o;
        o.key_lengths = {0, 3};
        o.causal = causal;
        const tensor4<float> q = random_bshd(2, 9, 2, 6, distribution::gaussian, 121);
        const tensor4<float> k = random_bshd(2, 9, 2, 6, distribution::gaussian, 122);
        const tensor4<float> v = random_bshd(2, 9, 2, 5, distribution::gaussian, 123);
        const tensor4<float> dout = random_bshd(2, 9, 2, 5, distribution::gaussian, 124);
        for (bool with_lse : {false, true}) {
        const grads g = run_fast(q, k, v, dout, o, nullptr, with_lse);
        for (index_t l = 0; l < 9; ++l)
            for (index_t h = 0; h < 2; ++h) {
                for (index_t d = 0; d < 6; ++d) {
                    EXPECT_EQ(0.0f, g.dq(0, l, h, d));
                    EXPECT_EQ(0.0f, g.dk(0, l, h, d));
                    if (l >= 3) {
                        EXPECT_EQ(0.0f, g.dq(1, l, h, d));
                        EXPECT_EQ(0.0f, g.dk(1, l, h, d));
                    }
                }
                for (index_t d = 0; d < 5; ++d) {
                    EXPECT_EQ(0.0f, g.dv(0, l, h, d));
                    if (l >= 3) {
                        EXPECT_EQ(0.0f, g.dv(1, l, h, d));
                    }
                }
            }
        expect_matches_oracle(q, k, v, dout, o, false, with_lse);
        }
    }
}

// GQA's d_k and d_v are the sums, over a key/value head's query heads, of what each query head
// gets on its own: the same call with k and v repeated per query head (MHA) gives the terms,
// summed here in double. The tolerance is a few float roundings of the sum of their magnitudes,
// far below the oracle tests' bound-based one, so a wrong weight on one head's share shows.
TEST(self_gating_attention_backward, gqa_sums_the_query_heads_shares) {
    for (bool causal : {true, false})
        for (bool with_lse : {false, true}) {
            self_gating_options o;
            o.causal = causal;
            const index_t B = 2, L = 41, H = 6, Hk = 2, G = H / Hk, D = 20, Dv = 19;
            const tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 141);
            const tensor4<float> k = random_bshd(B, L, Hk, D, distribution::gaussian, 142);
            const tensor4<float> v = random_bshd(B, L, Hk, Dv, distribution::gaussian, 143);
            const tensor4<float> dout = random_bshd(B, L, H, Dv, distribution::gaussian, 144);
            tensor4<float> km(B, L, H, D), vm(B, L, H, Dv);
            for (index_t b = 0; b < B; ++b)
                for (index_t l = 0; l < L; ++l)
                    for (index_t h = 0; h < H; ++h) {
                        for (index_t d = 0; d < D; ++d) km(b, l, h, d) = k(b, l, h / G, d);
                        for (index_t d = 0; d < Dv; ++d) vm(b, l, h, d) = v(b, l, h / G, d);
                    }
            const grads gqa = run_fast(q, k, v, dout, o, nullptr, with_lse);
            const grads mha = run_fast(q, km, vm, dout, o, nullptr, with_lse);
            auto expect_sums = [&](const tensor4<float>& got, const tensor4<float>& terms, const char* what) {
                double worst = 0.0;
                for (index_t b = 0; b < B; ++b)
                    for (index_t l = 0; l < L; ++l)
                        for (index_t hk = 0; hk < Hk; ++hk)
                            for (index_t d = 0; d < got.dimension(3); ++d) {
                                double sum = 0.0, mag = 0.0;
                                for (index_t gi = 0; gi < G; ++gi) {
                                    sum += terms(b, l, hk * G + gi, d);
                                    mag += std::abs(terms(b, l, hk * G + gi, d));
                                }
                                const double err = std::abs(got(b, l, hk, d) - sum) / (mag + 1e-30);
                                worst = std::max(worst, err);
                            }
                EXPECT_LT(worst, 8 * std::numeric_limits<float>::epsilon())
                    << what << (causal ? " causal" : " full") << " lse " << with_lse;
            };
            EXPECT_TRUE(all_close(gqa.dq, mha.dq, 0.0, 0.0)) << "d_q";
            expect_sums(gqa.dk, mha.dk, "d_k");
            expect_sums(gqa.dv, mha.dv, "d_v");
        }
}

// Inputs and gradients as [B, H, L, D] buffers seen as BSHD views: the same bits as dense.
TEST(self_gating_attention_backward, strided_views_equal_dense) {
    for (bool causal : {true, false}) {
        self_gating_options o;
        o.causal = causal;
        const index_t B = 2, L = 45, H = 4, Hk = 2, D = 8;
        const tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 131);
        const tensor4<float> k = random_bshd(B, L, Hk, D, distribution::gaussian, 132);
        const tensor4<float> v = random_bshd(B, L, Hk, D, distribution::gaussian, 133);
        const tensor4<float> dout = random_bshd(B, L, H, D, distribution::gaussian, 134);
        tensor4<float> out(B, L, H, D);
        const grads dense = run_fast(q, k, v, dout, o, &out);
        auto to_bhld = [](const tensor4<float>& x) {
            const index_t b = x.dimension(0), l = x.dimension(1), h = x.dimension(2), d = x.dimension(3);
            std::vector<float> buf(static_cast<std::size_t>(x.size()));
            const auto vw = bhld_as_bshd(buf.data(), b, h, l, d);
            for (index_t i0 = 0; i0 < b; ++i0)
                for (index_t i1 = 0; i1 < l; ++i1)
                    for (index_t i2 = 0; i2 < h; ++i2)
                        for (index_t i3 = 0; i3 < d; ++i3) vw(i0, i1, i2, i3) = x(i0, i1, i2, i3);
            return buf;
        };
        std::vector<float> sq = to_bhld(q), sk = to_bhld(k), sv = to_bhld(v), so = to_bhld(out), sd = to_bhld(dout);
        std::vector<float> bq(static_cast<std::size_t>(B * H * L * D)), bk(static_cast<std::size_t>(B * Hk * L * D)),
            bv(static_cast<std::size_t>(B * Hk * L * D));
        const auto dq = bhld_as_bshd(bq.data(), B, H, L, D);
        const auto dk = bhld_as_bshd(bk.data(), B, Hk, L, D);
        const auto dv = bhld_as_bshd(bv.data(), B, Hk, L, D);
        attnkit::self_gating_attention_backward(
            attnkit::view<const float, 4>(bhld_as_bshd(sq.data(), B, H, L, D)),
            attnkit::view<const float, 4>(bhld_as_bshd(sk.data(), B, Hk, L, D)),
            attnkit::view<const float, 4>(bhld_as_bshd(sv.data(), B, Hk, L, D)),
            attnkit::view<const float, 4>(bhld_as_bshd(so.data(), B, H, L, D)),
            attnkit::view<const float, 4>(bhld_as_bshd(sd.data(), B, H, L, D)), dq, dk, dv, o);
        EXPECT_TRUE(all_close(dq, dense.dq, 0.0, 0.0)) << "d_q";
        EXPECT_TRUE(all_close(dk, dense.dk, 0.0, 0.0)) << "d_k";
        EXPECT_TRUE(all_close(dv, dense.dv, 0.0, 0.0)) << "d_v";
    }
}

// Where the gradients lie (at a 64-byte line, 16, 32 or 48 bytes into one, rows padded apart)
// changes none of their bits. These calls are large enough to stream their rows (kStreamBytes),
// and on an AVX2 core a row that starts mid-line holds its last half-line back until the row
// below it comes (detail/self_gating/backward.hpp, line_joiner): a half dropped, written to the
// wrong place or left unwritten at the end of a chunk shows here as a NaN or a moved value.
// Causal (the joined stores) and not, MHA and GQA (the group sums' stores), D a multiple of the
// lane width and not, an odd number of whole vectors per row under 8 and 16 lanes (D 120: the
// row's stores between its ends go two a step, and one is left over), masked tokens (their zero
// rows) after key_lengths. The dense call's gradients start as NaN and must all be written.
TEST(self_gating_attention_backward, gradient_placement_changes_no_bits) {
    struct shape_case {
        index_t H, Hk, D;
    };
    const index_t B = 1, L = 1100;
    for (bool causal : {true, false})
        for (const shape_case sc :
             {shape_case{4, 4, 128}, shape_case{4, 2, 128}, shape_case{4, 4, 100}, shape_case{4, 4, 120}}) {
            const index_t H = sc.H, Hk = sc.Hk, D = sc.D;
            SCOPED_TRACE(std::string(causal ? "causal" : "full") + " H " + std::to_string(H) + " Hk " +
                         std::to_string(Hk) + " D " + std::to_string(D));
            self_gating_options o;
            o.causal = causal;
            o.key_lengths = {1000};
            const tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 141);
            const tensor4<float> k = random_bshd(B, L, Hk, D, distribution::gaussian, 142);
            const tensor4<float> v = random_bshd(B, L, Hk, D, distribution::gaussian, 143);
            const tensor4<float> dout = random_bshd(B, L, H, D, distribution::gaussian, 144);
            tensor4<float> out(B, L, H, D);
            tensor3<float> lse = make_lse<float>(B, L, H, kNaN);
            attnkit::self_gating_attention(q, k, v, out, lse, o);
            const grads want = run_fast(q, k, v, dout, o, nullptr, true);
            for (const tensor4<float>* w : {&want.dq, &want.dk, &want.dv})
                for (index_t i = 0; i < w->size(); ++i)
                    ASSERT_TRUE(std::isfinite(w->data()[i])) << "a gradient element left unwritten at " << i;
            for (index_t pad : {index_t(0), index_t(8)})
                for (index_t offset : {index_t(0), index_t(4), index_t(8), index_t(12)}) {
                    SCOPED_TRACE("rows " + std::to_string(pad) + " floats apart, " + std::to_string(4 * offset) +
                                 " bytes past a line");
                    const index_t rs = D + pad;  // floats from one row to the next
                    auto placed = [&](std::vector<float>& buf, index_t heads) {
                        buf.assign(static_cast<std::size_t>(B * L * heads * rs + 16 + offset), kNaN);
                        const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(buf.data());
                        float* p = buf.data() + ((64 - a % 64) % 64) / sizeof(float) + offset;
                        return attnkit::view<float, 4>(p, {B, L, heads, D}, {L * heads * rs, heads * rs, rs, 1});
                    };
                    std::vector<float> bq, bk, bv;
                    const attnkit::view<float, 4> dq = placed(bq, H), dk = placed(bk, Hk), dv = placed(bv, Hk);
                    attnkit::self_gating_attention_backward(q, k, v, out, lse, dout, dq, dk, dv, o);
                    auto same = [&](const attnkit::view<float, 4>& got, const tensor4<float>& w) {
                        for (index_t l = 0; l < L; ++l)
                            for (index_t h = 0; h < w.dimension(2); ++h)
                                for (index_t d = 0; d < D; ++d)
                                    if (std::memcmp(&got(0, l, h, d), &w(0, l, h, d), sizeof(float)) != 0)
                                        return ::testing::AssertionFailure()
                                               << "token " << l << " head " << h << " element " << d << ": "
                                               << got(0, l, h, d) << " against " << w(0, l, h, d);
                        return ::testing::AssertionSuccess();
                    };
                    EXPECT_TRUE(same(dq, want.dq)) << "d_q";
                    EXPECT_TRUE(same(dk, want.dk)) << "d_k";
                    EXPECT_TRUE(same(dv, want.dv)) << "d_v";
                }
        }
}

TEST(self_gating_attention_backward, empty_sequences) {
    for (index_t L : {0, 1}) {
        const tensor4<float> q = random_bshd(1, L, 2, 3, distribution::gaussian, 141);
        const tensor4<float> k = random_bshd(1, L, 1, 3, distribution::gaussian, 142);
        const tensor4<float> v = random_bshd(1, L, 1, 3, distribution::gaussian, 143);
        const tensor4<float> dout = random_bshd(1, L, 2, 3, distribution::gaussian, 144);
        const grads g = run_fast(q, k, v, dout, {});
        if (L == 0) continue;
        // One token: its weight is 1 whatever its gate, so d_q and d_k are 0 and d_v = sum of d_out.
        EXPECT_TRUE(all_equal_to(g.dq, 0.0f));
        EXPECT_TRUE(all_equal_to(g.dk, 0.0f));
        for (index_t d = 0; d < 3; ++d) EXPECT_FLOAT_EQ(g.dv(0, 0, 0, d), dout(0, 0, 0, d) + dout(0, 0, 1, d));
    }
}

// Bad input is rejected before any gradient is written.
TEST(self_gating_attention_backward, bad_input_rejected_before_writing) {
    const index_t B = 1, L = 4, H = 2, Hk = 1, D = 3, Dv = 2;
    const tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 151);
    const tensor4<float> k = random_bshd(B, L, Hk, D, distribution::gaussian, 152);
    const tensor4<float> v = random_bshd(B, L, Hk, Dv, distribution::gaussian, 153);
    const tensor4<float> dout = random_bshd(B, L, H, Dv, distribution::gaussian, 154);
    tensor4<float> out(B, L, H, Dv);
    attnkit::self_gating_attention(q, k, v, out);
    tensor4<float> dq = make_bshd<float>(B, L, H, D, 5.0f), dk = make_bshd<float>(B, L, Hk, D, 5.0f),
                   dv = make_bshd<float>(B, L, Hk, Dv, 5.0f);
    auto untouched = [&] {
        EXPECT_TRUE(all_equal_to(dq, 5.0f));
        EXPECT_TRUE(all_equal_to(dk, 5.0f));
        EXPECT_TRUE(all_equal_to(dv, 5.0f));
    };
    tensor4<float> bad_dq(B, L, H, D + 1);
    expect_invalid([&] { attnkit::self_gating_attention_backward(q, k, v, out, dout, bad_dq, dk, dv); },
                   {"d_q", "[1, 4, 2, 4]"});
    tensor4<float> bad_dk(B, L + 1, Hk, D);
    expect_invalid([&] { attnkit::self_gating_attention_backward(q, k, v, out, dout, dq, bad_dk, dv); },
                   {"d_k", "[1, 5, 1, 3]"});
    tensor4<float> bad_dv(B, L, H, Dv);
    expect_invalid([&] { attnkit::self_gating_attention_backward(q, k, v, out, dout, dq, dk, bad_dv); }, "d_v");
    tensor4<float> bad_dout(B, L, H, Dv + 1);
    expect_invalid([&] { attnkit::self_gating_attention_backward(q, k, v, out, bad_dout, dq, dk, dv); }, "d_out");
    tensor4<float> bad_out(B, L + 1, H, Dv);
    expect_invalid([&] { attnkit::self_gating_attention_backward(q, k, v, bad_out, dout, dq, dk, dv); }, "out");
    const tensor4<float> short_k = random_bshd(B, L - 1, Hk, D, distribution::gaussian, 155);
    expect_invalid([&] { attnkit::self_gating_attention_backward(q, short_k, v, out, dout, dq, dk, dv); }, "k");
    self_gating_options bad_kl;
    bad_kl.key_lengths = {1, 2};
    expect_invalid([&] { attnkit::self_gating_attention_backward(q, k, v, out, dout, dq, dk, dv, bad_kl); },
                   "key_lengths");
    self_gating_options bad_scale;
    bad_scale.scale = std::numeric_limits<float>::infinity();
    expect_invalid([&] { attnkit::self_gating_attention_backward(q, k, v, out, dout, dq, dk, dv, bad_scale); },
                   "scale");
    untouched();
    // Overlaps: a gradient on an input, on another gradient.
    tensor4<float> q_copy = q;
    expect_invalid([&] { attnkit::self_gating_attention_backward(q_copy, k, v, out, dout, q_copy, dk, dv); }, "d_q");
    std::vector<float> shared(static_cast<std::size_t>(B * L * Hk * D), 5.0f);
    Eigen::TensorMap<tensor4<float>> dk_map(shared.data(), B, L, Hk, D);
    Eigen::TensorMap<tensor4<float>> dv_map(shared.data(), B, L, Hk, Dv);
    expect_invalid([&] { attnkit::self_gating_attention_backward(q, k, v, out, dout, dq, dk_map, dv_map); }, "d_");
    untouched();
    // The lse form: lse of the wrong shape, a gradient over lse.
    tensor3<float> lse = make_lse<float>(B, L, H), bad_lse = make_lse<float>(B, L, H + 1);
    attnkit::self_gating_attention(q, k, v, out, lse);
    expect_invalid([&] { attnkit::self_gating_attention_backward(q, k, v, out, bad_lse, dout, dq, dk, dv); },
                   {"lse", "[1, 4, 3]"});
    std::vector<float> lse_and_dv(static_cast<std::size_t>(B * L * Hk * Dv), 5.0f);
    Eigen::TensorMap<tensor3<float>> lse_over_dv(lse_and_dv.data(), B, L, H);
    Eigen::TensorMap<tensor4<float>> dv_over_lse(lse_and_dv.data(), B, L, Hk, Dv);
    expect_invalid([&] { attnkit::self_gating_attention_backward(q, k, v, out, lse_over_dv, dout, dq, dk, dv_over_lse); },
                   "lse");
    untouched();
    for (float x : shared) EXPECT_EQ(5.0f, x);
}

}  // namespace
