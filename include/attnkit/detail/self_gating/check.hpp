// Argument validation of the self-gating ("Non-approximate") entry points: the oracle
// (reference/self_gating_attention.hpp), the fast kernel (self_gating_attention.hpp) and
// self_gating_state.
//
// Everything softmax rejects about shapes, layouts, scale and key_lengths (detail/check.hpp),
// plus Lq == Lk: a token's gate g_j = scale <q_j, k_j> needs its own query and key. Each failure
// throws std::invalid_argument naming the argument and the shapes, before anything is written.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

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

// One call: q [B,L,H,D], k [B,L,Hk,D], v [B,L,Hk,Dv], out [B,L,H,Dv] and the options.
template <class TQ, class TK, class TV, class TO>
attention_shape check_call(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v,
                           const view<TO, 4>& out, const self_gating_options& opts) {
    const attention_shape s = check_qkv(q, k, v);
    if (s.len_q != s.len_k)
        fail("q: self-gating needs Lq == Lk (each token's gate is scale <q_j, k_j>), got q " + shape_string(q) +
             " and k " + shape_string(k));
    check_out("out", out, s);
    check_options(opts, s);
    // out over k or v (or over itself) would overwrite tokens before the scan reads them; out = q,
    // the same view, is fine: a query row is read before the output row at its address is written.
    check_attention_memory(q, k, v, out, static_cast<const view<float, 3>*>(nullptr));
    return s;
}

// The fixed sizes of a self_gating_state, checked at construction; key_lengths must be empty,
// as for every decode state (detail/check.hpp).
inline void check_state_sizes(index_t batch, index_t heads, index_t heads_kv, index_t dim, index_t dim_v,
                              const self_gating_options& opts) {
    const std::string got = detail::check_state_sizes("self_gating_state", batch, heads, heads_kv, dim, dim_v);
    // The state is B * H * Dv floats (Dv rounded up to a vector, at most 64 more): its size in
    // bytes must be a number.
    index_t bh = 0, elems = 0, bytes = 0;
    if (!mul_fits(batch, heads, bh) || dim_v > std::numeric_limits<index_t>::max() - 64 ||
        !mul_fits(bh, dim_v + 64, elems) || !mul_fits(elems, index_t(sizeof(float)), bytes))
        fail("self_gating_state: the state of " + got + " overflows int64 bytes");
    check_scale(opts.scale);
    check_state_key_lengths("self_gating_state", opts.key_lengths);
}

// One state step: q [B,T,H,D], k [B,T,Hk,D], v [B,T,Hk,Dv], out [B,T,H,Dv] with T >= 1 and the
// sizes the state was built with.
template <class TQ, class TK, class TV, class TO>
attention_shape check_step(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v,
                           const view<TO, 4>& out, index_t batch, index_t heads, index_t heads_kv,
                           index_t dim, index_t dim_v) {
    check_layout("q", q);
    const index_t T = q.dims[1];
    if (T < 1) fail("q: a step appends T >= 1 tokens, got " + shape_string(q));
    check_shape("q", q, {batch, T, heads, dim}, "[B, T, H, D] of the state");
    check_layout("k", k);
    check_shape("k", k, {batch, T, heads_kv, dim}, "[B, T, Hk, D] of the state");
    check_layout("v", v);
    check_shape("v", v, {batch, T, heads_kv, dim_v}, "[B, T, Hk, Dv] of the state");
    const attention_shape s = check_qkv(q, k, v);
    check_out("out", out, s);
    check_attention_memory(q, k, v, out, static_cast<const view<float, 3>*>(nullptr));
    return s;
}

}  // namespace self_gating
}  // namespace detail
}  // namespace attnkit
