// Argument validation of the self-gating ("Non-approximate") entry points: the oracle
// (reference/self_gating_attention.hpp), the fast kernel (self_gating_attention.hpp) and
// self_gating_state.
//
// Everything softmax rejects about shapes, layouts, scale and key_lengths (detail/check.hpp),
// plus Lq == Lk: a token's gate g_j = scale <q_j, k_j> needs its own query and key. Each failure
// throws std::invalid_argument naming the argument and the shapes, before anything is written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/detail/backward/arguments.hpp"
#include "attnkit/detail/check.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {
namespace self_gating {

// key_lengths and scale follow the softmax rules exactly: one routine checks them for both.
inline void check_options(const self_gating_options& o, const attention_shape& s) {
    softmax_options so;
    so.scale = o.scale;
    so.key_lengths = o.key_lengths;
    detail::check_options(so, s);
}

// One call: q [B,L,H,D], k [B,L,Hk,D], v [B,L,Hk,Dv], out [B,L,H,Dv], the options and, where
// given, lse [B,L,H] (written by the forward, read by the backward: any strides, apart from out).
template <class TQ, class TK, class TV, class TO, class TL = float>
attention_shape check_call(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v,
                           const view<TO, 4>& out, const self_gating_options& opts,
                           const view<TL, 3>* lse = nullptr) {
    const attention_shape s = check_qkv(q, k, v);
    if (s.len_q != s.len_k)
        fail("q: self-gating needs Lq == Lk (each token's gate is scale <q_j, k_j>), got q " + shape_string(q) +
             " and k " + shape_string(k));
    check_out("out", out, s);
    if (lse) check_lse("lse", *lse, s);
    check_options(opts, s);
    // out over k or v (or over itself) would overwrite tokens before the scan reads them; out = q,
    // the same view, is fine: a query row is read before the output row at its address is written.
    check_attention_memory(q, k, v, out, lse);
    return s;
}

// The backward call (self_gating_attention_backward.hpp and its oracle): the forward's
// arguments exactly as check_call takes them, d_out shaped like out, gradients shaped like q, k
// and v with a contiguous last dimension, none of them overlapping another or any input.
template <class TQ, class TK, class TV, class TO, class TD, class TG, class TL = const float>
attention_shape check_backward(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v,
                               const view<TO, 4>& out, const view<TD, 4>& d_out, const view<TG, 4>& d_q,
                               const view<TG, 4>& d_k, const view<TG, 4>& d_v, const self_gating_options& opts,
                               const view<TL, 3>* lse = nullptr) {
    const attention_shape s = check_call(q, k, v, out, opts, lse);
    check_out("d_out", d_out, s);
    check_qkv_gradients(d_q, d_k, d_v, s);
    check_outputs_apart({region_of("d_q", d_q), region_of("d_k", d_k), region_of("d_v", d_v)},
                        {region_of("q", q), region_of("k", k), region_of("v", v), region_of("out", out),
                         region_of("d_out", d_out), lse ? region_of("lse", *lse) : memory_region{}});
    return s;
}

// The fixed sizes of a self_gating_state, checked at construction (detail/check.hpp: the sizes,
// and key_lengths empty as for every decode state), and the scale.
inline void check_state_sizes(index_t batch, index_t heads, index_t heads_kv, index_t dim, index_t dim_v,
                              const self_gating_options& opts) {
    detail::check_state_sizes("self_gating_state", batch, heads, heads_kv, dim, dim_v);
    check_scale(opts.scale);
    check_state_key_lengths("self_gating_state", opts.key_lengths);
}

}  // namespace self_gating
}  // namespace detail
}  // namespace attnkit
