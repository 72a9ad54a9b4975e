// The backward pass of multi-token attention, every stage, fused.
//
//   attnkit::mta_attention(q, k, v, out, opts);                       // forward, keep out
//   // ... loss, and d_out = dloss / dout [B, L, H, Dv] ...
//   attnkit::mta_weight_grads dw;                                     // the weight gradients wanted
//   dw.kq_pre = d_kq_pre; dw.head_post = d_head_post; dw.gate_bias = &d_bias;   // ...
//   attnkit::mta_attention_backward(q, k, v, out, d_out, d_q, d_k, d_v, dw, opts);
//
// The options are the forward's, unchanged (every stage, scale, GQA, pool). d_q [B, L, H, D],
// d_k [B, L, Hk, D], d_v [B, L, Hk, Dv] are float and overwritten; d_k and d_v sum over the query
// heads that share a key/value head. Each member of mta_weight_grads is the gradient of the
// option of the same name, shaped like it and overwritten; a null member is not computed and
// must be null where its stage is off. q, k, v, out and d_out float (as the forward takes them),
// row-major Eigen::Tensor / TensorMap or attnkit::view (any strides, contiguous last dimension).
// out is validated but not read: the forward is recomputed.
//
// How (detail/mta/backward.hpp): per batch item, blocks of query rows for all heads, in order;
// each block recomputes the forward for its rows and the halo rows its convolutions' transposes
// need (c_q - 1 after the block per convolution, and before it for the forward), then reverses
// the stages; the transpose of a key-query cross-correlation is the correlation with the flipped
// kernel over the same band. Scratch: a few [H, block rows + halos, L] float arrays, the block
// height bounded so that they stay within ATTNKIT_MTA_BACKWARD_SCRATCH_MIB (96 MiB), kept by the
// calling thread for its next call (detail/scratch.hpp: freed when the thread exits); no
// [H, L, L] tensor. Each stage of a block is split over the heads, and every gradient element
// and weight-gradient partial is summed by one task in a fixed order (weights in double), so the
// results are bitwise identical for any thread count.
//
// A NaN or Inf stays in the gradients that depend on it: its batch item, and the rows that see it
// (a causal zero never multiplies a non-finite value: those products take a guarded path). The
// weight gradients sum over every row and item, so they carry it.
//
// Bad input (shapes that do not match the forward's, a weight gradient of the wrong shape or for
// a stage that is off, gradients that overlap each other or an input) throws
// std::invalid_argument naming the argument, before anything is written.
#pragma once

#include <utility>

#include "attnkit/detail/mta/backward.hpp"
#include "attnkit/detail/mta/check_backward.hpp"
#include "attnkit/detail/mta/params.hpp"
#include "attnkit/mta_attention.hpp"

namespace attnkit {
namespace detail {
namespace mta {

template <class A, class TQ, class TK, class TV, class TO, class TD, class TG>
void attention_backward_impl(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
                             const view<const TO, 4>& out, const view<const TD, 4>& d_out, const view<TG, 4>& d_q,
                             const view<TG, 4>& d_k, const view<TG, 4>& d_v, const mta_weight_grads& dw,
                             const mta_options& opts, index_t block_rows = 0) {
    ATTNKIT_IF_FLOAT("attnkit::mta_attention_backward: float storage (q, k, v, out, d_out and the gradients float "
                     "tensors)",
                     q, k, v, out, d_out, d_q) {
        const shape ms = check_backward(q, k, v, out, d_out, d_q, d_k, d_v, dw, opts);
        const params w = make_params(opts, ms);
        run_backward<A>(backward_args{q, k, v, d_out, d_q, d_k, d_v, dw}, ms, w, opts.pool, block_rows);
    }
}

}  // namespace mta
}  // namespace detail

// Gradients of a loss through out = mta_attention(q, k, v, opts), given d_out = dloss / dout:
// d_q [B, L, H, D], d_k [B, L, Hk, D], d_v [B, L, Hk, Dv] and the wanted weight gradients
// (d_weights), all overwritten.
template <class Q, class K, class V, class O, class DO, class GQ, class GK, class GV>
void mta_attention_backward(const Q& q, const K& k, const V& v, const O& out, const DO& d_out, GQ&& d_q, GK&& d_k,
                            GV&& d_v, const mta_weight_grads& d_weights, const mta_options& opts = {}) {
    detail::mta::attention_backward_impl<simd::default_arch>(
        detail::q_view(q), detail::k_view(k), detail::v_view(v), detail::input_view<4>("out", out, "[B, L, H, Dv]"),
        detail::input_view<4>("d_out", d_out, "[B, L, H, Dv]"),
        detail::output_view<4>("d_q", std::forward<GQ>(d_q), "[B, L, H, D]"),
        detail::output_view<4>("d_k", std::forward<GK>(d_k), "[B, L, Hk, D]"),
        detail::output_view<4>("d_v", std::forward<GV>(d_v), "[B, L, Hk, Dv]"), d_weights, opts);
}

}  // namespace attnkit
