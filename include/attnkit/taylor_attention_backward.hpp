// The backward pass of second-order Taylor ("Approximate") attention, both forms.
//
//   attnkit::taylor_attention(q, k, v, out, opts);                       // forward, keep out
//   // ... loss, and d_out = dloss / dout [B, Lq, H, Dv] ...
//   attnkit::taylor_attention_backward(q, k, v, out, d_out, d_q, d_k, d_v, opts);
//
// The options are the forward's, unchanged (causal, key_lengths, scale, eps, form, GQA, pool).
// d_q [B, Lq, H, D], d_k [B, Lk, Hk, D], d_v [B, Lk, Hk, Dv] are float and overwritten; d_k and
// d_v sum over the query heads that share a key/value head. q, k, v, out and d_out float, as the
// forward takes them. No L x L matrix is formed and the results are bitwise identical for any
// thread count.
//
// Forms (opts.form), as in the forward; both give the gradients of the same function:
//   quadratic  the engine's backward tile kernel (detail/backward/tile_kernel.hpp, the one the
//              softmax backward runs) with the Taylor gradient row policy and the row sums Z
//              recomputed from running key sums (detail/taylor/quadratic_backward.hpp);
//              O(Lq Lk (D + Dv)), extra memory O(L D) per thread.
//   linear     the feature-map state run forward over chunks for d_q and in reverse for d_k and
//              d_v, the chunks' own (causal) pairs through the same tile kernel
//              (detail/taylor/linear_backward.hpp); O((Lq H + Lk Hk) F Dv), F = 1 + D + D(D+1)/2,
//              extra memory two F x (Dv + 1) states per thread.
//   automatic  the cheaper of the two by the backward cost model (detail/taylor/cost_model.hpp).
//
// A row with no visible key contributes nothing (its d_q is 0; keys nobody sees get 0). A NaN or
// Inf in one row's inputs stays in the gradients that depend on that row. Scores past float's
// reach for s^2 (|s| ~ 1e19) give gradients that are not finite (the forward rescales such rows;
// their gradients have no float representation anyway). Bad input (shapes that do not match the
// forward's, gradients that overlap each other or an input, the forward's option errors) throws
// std::invalid_argument naming the argument, before anything is written.
#pragma once

#include <utility>

#include "attnkit/detail/taylor/backward_check.hpp"
#include "attnkit/detail/taylor/cost_model.hpp"
#include "attnkit/detail/taylor/linear_backward.hpp"
#include "attnkit/detail/taylor/quadratic_backward.hpp"
#include "attnkit/taylor_attention.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

template <class A>
void backward_run(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
                  const view<const float, 4>& out, const view<const float, 4>& d_out, const view<float, 4>& d_q,
                  const view<float, 4>& d_k, const view<float, 4>& d_v, const taylor_options& opts) {
    const attention_shape s = check_backward_call(q, k, v, out, d_out, d_q, d_k, d_v, opts);
    check_max_keys("k", s.len_k, "keys per call", "Lk", k);
    if (s.batch == 0) return;
    const taylor_form form = opts.form == taylor_form::automatic ? choose_backward_form(s, opts) : opts.form;
    if (form == taylor_form::linear)
        linear_backward<A>(q, k, v, out, d_out, d_q, d_k, d_v, s, opts);
    else
        quadratic_backward<A>(q, k, v, out, d_out, d_q, d_k, d_v, s, opts);
}

template <class A, class TQ, class TK, class TV, class TO, class TD, class TG>
void backward_impl(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
                   const view<const TO, 4>& out, const view<const TD, 4>& d_out, const view<TG, 4>& d_q,
                   const view<TG, 4>& d_k, const view<TG, 4>& d_v, const taylor_options& opts) {
    ATTNKIT_IF_FLOAT("attnkit::taylor_attention_backward: q, k, v, out and d_out must be float tensors (every "
                     "gradient float; double is for attnkit::reference)",
                     q, k, v, out, d_out, d_q, d_k, d_v)
        backward_run<A>(q, k, v, out, d_out, d_q, d_k, d_v, opts);
}

}  // namespace taylor
}  // namespace detail

template <class Q, class K, class V, class O, class DO, class GQ, class GK, class GV>
void taylor_attention_backward(const Q& q, const K& k, const V& v, const O& out, const DO& d_out, GQ&& d_q,
                               GK&& d_k, GV&& d_v, const taylor_options& opts = {}) {
    const auto a = detail::taylor::backward_arguments(q, k, v, out, d_out, std::forward<GQ>(d_q),
                                                      std::forward<GK>(d_k), std::forward<GV>(d_v));
    using TG = typename decltype(a.d_q)::value_type;
    detail::taylor::backward_impl<simd::default_arch>(a.q, a.k, a.v, a.out, a.d_out, a.d_q, view<TG, 4>(a.d_k),
                                                      view<TG, 4>(a.d_v), opts);
}

}  // namespace attnkit
