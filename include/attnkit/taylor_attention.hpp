// Second-order Taylor ("Approximate") attention, the fast kernel (docs/variants.md section 2):
//
//   w_ij = 1 + s_ij + s_ij^2 / 2 (visible keys; 0 otherwise),  o_i = sum_j w_ij v_j / (sum_j w_ij + eps)
//
//   attnkit::taylor_attention(q, k, v, out, opts);   q [B,Lq,H,D], k [B,Lk,Hk,D], v [B,Lk,Hk,Dv],
//                                                    out [B,Lq,H,Dv]; opts: attnkit::taylor_options
//   attnkit::taylor_state st(B, H, Hk, D, Dv, opts); st.step(q, k, v, out);   decode / chunked prefill
//     (taylor_state.hpp): a K/V cache and the quadratic form while it holds fewer bytes than S
//     and below the causal crossover of its shapes (the cost model), then the linear form's
//     state; opts.form = linear or quadratic keeps one form throughout.
//
// Conventions are the softmax ones: BSHD, GQA by index, causal bottom-right, key_lengths, the
// caller's thread pool, bitwise identical results for any thread count. A row that sees no key
// outputs zeros. Scores past float's reach for w = 1 + s + s^2/2 (|s| ~ 2.6e19 and up) still
// give finite rows: the quadratic form computes a row that overflowed again with scores and
// weights scaled by exact powers of two, the linear form scales queries and keys past 2^20 the
// same way before they enter the features. Arguments are validated before anything is written: everything
// softmax_attention rejects, plus eps negative or non-finite.
//
// Forms (opts.form), two exact algorithms for the same outputs:
//   quadratic  the engine of softmax_attention with the Taylor row policy
//              (detail/taylor/quadratic.hpp): the tile kernel (S^T = K Q^T on register tiles)
//              for prefill, the row kernel for decode, w = 1 + s + s^2/2 with a running sum
//              per row, no max and no rescaling; O(Lq Lk (D + Dv)).
//   linear     chunked feature-map form (detail/taylor/linear.hpp): a state
//              S = sum phi(k) [v 1]^T of F = 1 + D + D(D+1)/2 features per key/value head;
//              O((Lq H + Lk Hk) F Dv), independent of how many keys a query sees.
//   automatic  the cheaper of the two by the cost model below.
//
// Cost model (detail::taylor::choose_form in detail/taylor/cost_model.hpp): with P the number of
// visible (query, key) pairs summed over query heads and N = B (Lq H + Lk Hk) the rows that read
// or update the state,
//   t_quadratic = 2 P (D + Dv) / kQuadraticGflops
//   t_linear    = 2 N F (Dv + 1) / kLinearGflops + (causal: the chunk-local quadratic part)
// The two constants are effective FLOP rates of the two forms' kernels, measured with
// bench/taylor_attention_bench (the runs and the crossovers they give are in
// docs/benchmarks.md).
//
// Crossover: the quadratic form's cost grows with L (with L^2 over a whole sequence), the
// linear form's with D^2 Dv, so the linear form wins from some L on, later for a larger D and
// later under a causal mask (which halves the quadratic form's pairs but not the state's
// work). Near a crossover the two forms take about the same time, so a choice on the wrong side
// of it costs little; far from it the model is unambiguous. The model counts GQA (the state
// update is per key/value head), key_lengths and Lq != Lk; it ignores the thread count (both
// forms split their work over the same pool).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "attnkit/detail/attention_driver.hpp"
#include "attnkit/detail/check.hpp"
#include "attnkit/detail/taylor/check.hpp"
#include "attnkit/detail/taylor/cost_model.hpp"
#include "attnkit/detail/taylor/linear.hpp"
#include "attnkit/detail/taylor/quadratic.hpp"
#include "attnkit/options.hpp"
#include "attnkit/taylor_state.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

// The quadratic form on the engine (tile kernel, row kernel for decode): scale folded into the queries, the Taylor row
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
    check_max_keys("k", s.len_k, "keys per call", "Lk", k);
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
    ATTNKIT_IF_FLOAT("attnkit::taylor_attention: q, k and v must be float tensors (out float)", q, k, v, out)
        attention_run<A>(q, k, v, out, opts);
}

}  // namespace taylor
}  // namespace detail

template <class Q, class K, class V, class O>
void taylor_attention(const Q& q, const K& k, const V& v, O&& out, const taylor_options& opts = {}) {
    detail::taylor::attention_impl<simd::default_arch>(detail::q_view(q), detail::k_view(k), detail::v_view(v),
                                                       detail::out_view(out), opts);
}

}  // namespace attnkit
