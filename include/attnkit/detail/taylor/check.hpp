// Argument validation of the Taylor ("Approximate") entry points: the oracle
// (reference/taylor_attention.hpp), the fast kernel (taylor_attention.hpp) and taylor_state.
//
// Everything softmax rejects about shapes and layouts (detail/check.hpp), plus the Taylor
// options: eps finite and >= 0 (the denominator sum w + eps is then >= |vis| / 2 > 0 for any
// row that sees a key), scale 0 or finite > 0, key_lengths one per batch item in [0, Lk].
// Each failure throws std::invalid_argument naming the argument and the shapes, before
// anything is written.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

inline void check_eps(float eps) {
    if (!std::isfinite(eps) || eps < 0.0f)
        fail("opts.eps: expected a finite value >= 0, got " + number(eps));
}

// key_lengths and scale follow the softmax rules exactly: one routine checks them for both.
inline void check_key_lengths(const std::vector<std::int64_t>& key_lengths, const attention_shape& s) {
    if (key_lengths.empty()) return;
    softmax_options o;
    o.key_lengths = key_lengths;
    detail::check_options(o, s);
}

inline void check_options(const taylor_options& o, const attention_shape& s) {
    check_scale(o.scale);
    check_eps(o.eps);
    if (o.form != taylor_form::automatic && o.form != taylor_form::quadratic && o.form != taylor_form::linear)
        fail("opts.form: expected automatic, quadratic or linear, got " +
             std::to_string(static_cast<int>(o.form)));
    check_key_lengths(o.key_lengths, s);
}

// One attention call: q [B,Lq,H,D], k [B,Lk,Hk,D], v [B,Lk,Hk,Dv], out [B,Lq,H,Dv] and the options.
template <class TQ, class TK, class TV, class TO>
attention_shape check_call(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v,
                           const view<TO, 4>& out, const taylor_options& opts) {
    const attention_shape s = check_qkv(q, k, v);
    check_out("out", out, s);
    check_options(opts, s);
    // out shares no memory with k, v or itself; out = q, the very same view, is allowed: the
    // kernel packs a work item's queries and the oracle reads a query row before writing it.
    check_attention_memory(q, k, v, out, static_cast<const view<float, 3>*>(nullptr));
    return s;
}

// The fixed sizes of a taylor_state, checked at construction.
inline void check_state_sizes(index_t batch, index_t heads, index_t heads_kv, index_t dim, index_t dim_v,
                              const taylor_options& opts) {
    detail::check_state_sizes("taylor_state", batch, heads, heads_kv, dim, dim_v);
    check_scale(opts.scale);
    check_eps(opts.eps);
    check_state_key_lengths("taylor_state", opts.key_lengths);
}

// One state step: q [B,T,H,D], k [B,T,Hk,D], v [B,T,Hk,Dv], out [B,T,H,Dv] with T >= 1 and the
// sizes the state was built with.
template <class TQ, class TK, class TV, class TO>
attention_shape check_step(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v,
                           const view<TO, 4>& out, index_t batch, index_t heads, index_t heads_kv,
                           index_t dim, index_t dim_v) {
    check_layout("q", q);
    check_layout("k", k);
    check_layout("v", v);
    check_layout("out", out);
    const index_t T = q.dims[1];
    if (T < 1) fail("q: a step appends T >= 1 tokens, got q " + shape_string(q));
    check_shape("q", q, {batch, T, heads, dim}, "[B, T, H, D] of the state");
    check_shape("k", k, {batch, T, heads_kv, dim}, "[B, T, Hk, D] of the state");
    check_shape("v", v, {batch, T, heads_kv, dim_v}, "[B, T, Hk, Dv] of the state");
    check_shape("out", out, {batch, T, heads, dim_v}, "[B, T, H, Dv] of the state");
    return attention_shape{batch, T, T, heads, heads_kv, dim, dim_v};
}

}  // namespace taylor
}  // namespace detail
}  // namespace attnkit
