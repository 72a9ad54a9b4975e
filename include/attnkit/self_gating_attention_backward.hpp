// The backward pass of self-gating ("Non-approximate") attention.
//
//   attnkit::self_gating_attention(q, k, v, out, opts);                    // forward, keep out
//   // ... loss, and d_out = dloss / dout [B, L, H, Dv] ...
//   attnkit::self_gating_attention_backward(q, k, v, out, d_out, d_q, d_k, d_v, opts);
//
//   attnkit::self_gating_attention(q, k, v, out, lse, opts);               // or keep lse as well
//   attnkit::self_gating_attention_backward(q, k, v, out, lse, d_out, d_q, d_k, d_v, opts);
//
// The options are the forward's, unchanged (causal, key_lengths, scale, GQA, pool). d_q
// [B, L, H, D], d_k [B, L, Hk, D], d_v [B, L, Hk, Dv] are float and overwritten; d_k and d_v sum
// over the query heads that share a key/value head. q, k, v, out and d_out float (as the forward
// takes them), row-major Eigen::Tensor / TensorMap or attnkit::view (any strides but a
// contiguous last dimension).
//
// O(L (D + Dv)) per head like the forward, and no L x L matrix: one pass over q and k for the
// gates and the forward's running (max, sum) per row, then one reverse scan over q, k, v, out and
// d_out that writes each gradient row once (detail/self_gating/backward.hpp). With the
// forward's lse the first pass is skipped (a fifth less memory traffic); the weights then carry
// lse's float rounding, a relative error of about 6e-8 |lse| (6e-5 at gates of 1e3). Everything is in
// the forward's max-shifted form, so gates of 1e3 give finite, correct gradients. Extra memory:
// three floats per (row, head) plus O(H Dv) per thread. Results are bitwise identical for any
// thread count; a single head still uses every thread.
//
// Tokens no row sees (key_lengths) get zero gradients; items with no visible token get zeros.
// A NaN or Inf stays in the gradients that depend on it (its batch item and heads; causal: the
// tokens at or before the row it is in). Bad input (shapes that do not match the forward's,
// gradients that overlap each other or an input) throws std::invalid_argument naming the
// argument, before anything is written.
#pragma once

#include <algorithm>
#include <utility>

#include "attnkit/detail/self_gating/backward.hpp"
#include "attnkit/detail/self_gating/check.hpp"
#include "attnkit/self_gating_attention.hpp"

namespace attnkit {
namespace detail {
namespace self_gating {

template <class A, class TQ, class TK, class TV, class TO, class TL, class TD, class TG>
void attention_backward_impl(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
                             const view<const TO, 4>& out, const view<const TL, 3>* lse, const view<const TD, 4>& d_out,
                             const view<TG, 4>& d_q, const view<TG, 4>& d_k, const view<TG, 4>& d_v,
                             const self_gating_options& opts) {
    ATTNKIT_IF_FLOAT("attnkit::self_gating_attention_backward: float storage (q, k, v, out, lse, d_out and the "
                     "gradients float tensors)",
                     q, k, v, out, *lse, d_out, d_q) {
        const attention_shape s = check_backward(q, k, v, out, d_out, d_q, d_k, d_v, opts, lse);
        constexpr index_t W = simd::kLanes<A>;
        grad_problem g;
        scratch_lease<index_t> visible;
        g.fw = make_input_problem<A>(q, k, v, s, opts.scale, opts.causal, opts.key_lengths, 0, visible.get());
        g.o = rows_of(out);
        g.dout = rows_of(d_out);
        g.dq = {d_q.data, d_q.strides[0], d_q.strides[1], d_q.strides[2]};
        g.dk = {d_k.data, d_k.strides[0], d_k.strides[1], d_k.strides[2]};
        g.dv = {d_v.data, d_v.strides[0], d_v.strides[1], d_v.strides[2]};
        g.dim_p = (s.dim + W - 1) / W * W;
        g.stream = (d_q.size() + d_k.size() + d_v.size()) * static_cast<index_t>(sizeof(float)) >= kStreamBytes;
        if (lse) {
            g.lse = lse->data;
            g.lb = lse->strides[0];
            g.ll = lse->strides[1];
            g.lh = lse->strides[2];
        }
        run_backward<A>(g, opts.pool);
    }
}

}  // namespace self_gating
}  // namespace detail

// Gradients of a loss through out = self_gating_attention(q, k, v, opts), given d_out =
// dloss / dout: d_q [B, L, H, D], d_k [B, L, Hk, D], d_v [B, L, Hk, Dv], overwritten.
template <class Q, class K, class V, class O, class DO, class GQ, class GK, class GV>
void self_gating_attention_backward(const Q& q, const K& k, const V& v, const O& out, const DO& d_out, GQ&& d_q,
                                    GK&& d_k, GV&& d_v, const self_gating_options& opts = {}) {
    detail::self_gating::attention_backward_impl<simd::default_arch>(
        detail::q_view(q), detail::k_view(k), detail::v_view(v), detail::input_view<4>("out", out, "[B, L, H, Dv]"),
        static_cast<const view<const float, 3>*>(nullptr), detail::input_view<4>("d_out", d_out, "[B, L, H, Dv]"),
        detail::output_view<4>("d_q", std::forward<GQ>(d_q), "[B, L, H, D]"),
        detail::output_view<4>("d_k", std::forward<GK>(d_k), "[B, L, Hk, D]"),
        detail::output_view<4>("d_v", std::forward<GV>(d_v), "[B, L, Hk, Dv]"), opts);
}

// The same from the forward's lse [B, L, H] as well (self_gating_attention(q, k, v, out, lse,
// opts)): the rows' statistics come from it instead of a pass over q and k.
template <class Q, class K, class V, class O, class L, class DO, class GQ, class GK, class GV,
          std::enable_if_t<detail::kIsLseArg<GV, self_gating_options>, int> = 0>
void self_gating_attention_backward(const Q& q, const K& k, const V& v, const O& out, const L& lse, const DO& d_out,
                                    GQ&& d_q, GK&& d_k, GV&& d_v, const self_gating_options& opts = {}) {
    const auto lse_v = detail::input_view<3>("lse", lse, "[B, L, H]");
    detail::self_gating::attention_backward_impl<simd::default_arch>(
        detail::q_view(q), detail::k_view(k), detail::v_view(v), detail::input_view<4>("out", out, "[B, L, H, Dv]"),
        &lse_v, detail::input_view<4>("d_out", d_out, "[B, L, H, Dv]"),
        detail::output_view<4>("d_q", std::forward<GQ>(d_q), "[B, L, H, D]"),
        detail::output_view<4>("d_k", std::forward<GK>(d_k), "[B, L, Hk, D]"),
        detail::output_view<4>("d_v", std::forward<GV>(d_v), "[B, L, Hk, Dv]"), opts);
}

}  // namespace attnkit
