// Second-order Taylor ("Approximate") attention, the fast kernel (docs/variants.md section 2):
//
//   w_ij = 1 + s_ij + s_ij^2 / 2 (visible keys; 0 otherwise),  o_i = sum_j w_ij v_j / (sum_j w_ij + eps)
//
//   attnkit::taylor_attention(q, k, v, out, opts);   q [B,Lq,H,D], k [B,Lk,Hk,D], v [B,Lk,Hk,Dv],
//                                                    out [B,Lq,H,Dv]; opts: attnkit::taylor_options
//   attnkit::taylor_state st(B, H, Hk, D, Dv, opts); st.step(q, k, v, out);   decode / chunked prefill
//
// Conventions are the softmax ones: BSHD, GQA by index, causal bottom-right, key_lengths, the
// caller's thread pool, bitwise identical results for any thread count. A row that sees no key
// outputs zeros. Arguments are validated before anything is written: everything
// softmax_attention rejects, plus eps negative or non-finite.
//
// Forms (opts.form), two exact algorithms for the same outputs:
//   quadratic  the tile engine of softmax_attention with the Taylor row policy
//              (detail/taylor/quadratic.hpp): S^T = K Q^T on register tiles, w = 1 + s + s^2/2
//              with a running sum per row, no max and no rescaling; O(Lq Lk (D + Dv)).
//   linear     chunked feature-map form (detail/taylor/linear.hpp): a state
//              S = sum phi(k) [v 1]^T of F = 1 + D + D(D+1)/2 features per key/value head;
//              O((Lq H + Lk Hk) F Dv), independent of how many keys a query sees.
//   automatic  the cheaper of the two by the cost model below.
//
// Cost model (detail::taylor::choose_form): with P the number of visible (query, key) pairs
// summed over query heads and N = B (Lq H + Lk Hk) the rows that read or update the state,
//   t_quadratic = 2 P (D + Dv) / kQuadraticGflops
//   t_linear    = 2 N F (Dv + 1) / kLinearGflops + (causal: the chunk-local quadratic part)
// The two constants are effective FLOP rates measured with bench/taylor_attention_bench
// (B = 1, H = 8, 1 thread, this machine: AMD EPYC Zen 2, AVX2 + FMA); see "Crossover" below.
//
// Crossover: the L from which the linear form is faster (B = 1, H = Hk = 8, Lq = Lk = L,
// 1 thread; bench/taylor_attention_bench medians, one run per L; the model's L in brackets).
//   D = 64,  not causal: between 2048 and 4096 [2560]  (4096: linear 286 ms, quadratic 470 ms)
//   D = 64,  causal:     between 4096 and 8192 [5120]  (4096: 288 vs 240 ms; 8192: 557 vs 957)
//   D = 128, not causal: about 8192 [9728]             (8192: 3.70 vs 3.52 s; 16384: linear wins)
//   D = 128, causal:     above 16384 [19456]           (8192: 3.61 vs 1.71 s; 16384: 16.3 vs 11.9)
// Near a crossover the two forms take about the same time, so a choice on the wrong side of it
// costs little; far from it the model is unambiguous (the linear form's cost grows with
// D^2 Dv, the quadratic form's with L). The model counts GQA (the state update is per
// key/value head), key_lengths and Lq != Lk; it ignores the thread count (both forms split
// their work over the same pool).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "attnkit/detail/attention_driver.hpp"
#include "attnkit/detail/check.hpp"
#include "attnkit/detail/taylor/check.hpp"
#include "attnkit/detail/taylor/linear.hpp"
#include "attnkit/detail/taylor/quadratic.hpp"
#include "attnkit/detail/taylor/state.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

// Effective FLOP rates of each form, in GFLOP/s of its own arithmetic (see the header comment):
// medians of bench/taylor_attention_bench at B = 1, H = 8, 1 thread, L = 2048..8192,
// D = 64 and 128 (quadratic 74-80, linear 67-74; the ratio is what matters).
constexpr double kQuadraticGflops = 78.0;
constexpr double kLinearGflops = 68.0;

// Visible (query, key) pairs of one batch item's query head: row i sees min(len, i + Lk - Lq + 1)
// keys when causal (at least 0), len otherwise.
inline double visible_pairs(index_t len_q, index_t len_k, index_t len, bool causal) {
    if (!causal) return static_cast<double>(len_q) * static_cast<double>(len);
    // n_i = clamp(i + a, 0, len), i in [0, Lq), a = Lk - Lq + 1: a ramp, then a plateau at len.
    const double a = static_cast<double>(len_k - len_q + 1), L = static_cast<double>(len);
    double sum = 0.0;
    const double x0 = std::max(a, 1.0), x1 = std::min(a + static_cast<double>(len_q) - 1.0, L);  // ramp x in [x0, x1]
    if (x1 >= x0) sum += (x0 + x1) * (x1 - x0 + 1.0) / 2.0;
    const double plateau_from = std::max(a, L + 1.0), last = a + static_cast<double>(len_q) - 1.0;
    if (last >= plateau_from) sum += (last - plateau_from + 1.0) * L;
    return sum;
}

inline taylor_form choose_form(const attention_shape& s, const taylor_options& o) {
    double pairs = 0.0;
    for (index_t b = 0; b < s.batch; ++b) {
        const index_t len = o.key_lengths.empty() ? s.len_k : static_cast<index_t>(o.key_lengths[b]);
        pairs += visible_pairs(s.len_q, s.len_k, len, o.causal);
    }
    pairs *= static_cast<double>(s.heads);
    const double D = static_cast<double>(s.dim), Dv = static_cast<double>(s.dim_v);
    const double F = 1.0 + D + D * (D + 1.0) / 2.0;
    const double rows = static_cast<double>(s.batch) *
                        (static_cast<double>(s.len_q * s.heads) + static_cast<double>(s.len_k * s.heads_k));
    const double local = o.causal ? static_cast<double>(s.batch * s.len_q * s.heads) * (kChunk / 2.0) : 0.0;
    const double t_quad = 2.0 * pairs * (D + Dv) / kQuadraticGflops;
    const double t_lin = 2.0 * rows * F * (Dv + 1.0) / kLinearGflops + 2.0 * local * (D + Dv) / kQuadraticGflops;
    return t_lin < t_quad ? taylor_form::linear : taylor_form::quadratic;
}

// The quadratic form on the tile engine: scale folded into the packed queries, the Taylor row
// policy, the softmax work partition (its split-KV pieces merge by addition).
template <class A, class T>
void quadratic_forward(const view<const T, 4>& q, const view<const T, 4>& k, const view<const T, 4>& v,
                       const view<float, 4>& out, const attention_shape& s, const taylor_options& opts) {
    basic_attention_problem<T, T> p = make_base_problem(q, k, v, s, opts.causal, opts.key_lengths);
    p.q_scale = resolve_scale(opts.scale, s.dim);
    forward_outputs fo;
    fo.out = out;
    attention_forward<A>(p, quadratic_rows{opts.eps}, fo, opts.pool);
}

template <class A>
void attention_run(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
                   const view<float, 4>& out, const taylor_options& opts) {
    const attention_shape s = check_call(q, k, v, out, opts);
    // Mask bounds are compared to key indices in float lanes, exact below 2^24 (as softmax).
    if (s.len_k >= (index_t(1) << 24))
        fail("k: at most 2^24 - 1 keys per call, got Lk = " + std::to_string(s.len_k) + " in " + shape_string(k));
    // out may not overlap k, v or itself; it may be q itself (each work item packs its queries
    // before it writes any of its rows, in both forms).
    check_attention_memory(q, k, v, out, static_cast<const view<float, 3>*>(nullptr));
    if (s.batch == 0 || s.len_q == 0) return;
    const taylor_form form = opts.form == taylor_form::automatic ? choose_form(s, opts) : opts.form;
    if (form == taylor_form::linear)
        linear_forward<A>(q, k, v, out, opts);
    else
        quadratic_forward<A>(q, k, v, out, s, opts);
}

// A wrong element type stops at the static_assert alone: the kernel is not instantiated for it.
template <class A, class TQ, class TK, class TV, class TO>
void attention_impl(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
                    const view<TO, 4>& out, const taylor_options& opts) {
    constexpr bool kFloat = std::is_same<TQ, float>::value && std::is_same<TK, float>::value &&
                            std::is_same<TV, float>::value && std::is_same<TO, float>::value;
    static_assert(kFloat, "attnkit::taylor_attention: q, k and v must be float tensors (out float)");
    if constexpr (kFloat) attention_run<A>(q, k, v, out, opts);
}

}  // namespace taylor
}  // namespace detail

template <class Q, class K, class V, class O>
void taylor_attention(const Q& q, const K& k, const V& v, O&& out, const taylor_options& opts = {}) {
    detail::taylor::attention_impl<simd::default_arch>(detail::q_view(q), detail::k_view(k), detail::v_view(v),
                                                       detail::out_view(out), opts);
}

}  // namespace attnkit
