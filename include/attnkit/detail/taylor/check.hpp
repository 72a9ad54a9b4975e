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
#include <limits>
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
    const std::string got = detail::check_state_sizes("taylor_state", batch, heads, heads_kv, dim, dim_v);
    // A state that may go linear holds, per batch item and key/value head, F = 1 + D + D(D+1)/2
    // feature rows of Dv + 1 floats (each padded to whole micro tiles, bounded here by 64 more)
    // and a chunk of 64 keys and values: that size in bytes must be a number.
    if (opts.form != taylor_form::quadratic) {
        constexpr index_t kMax = std::numeric_limits<index_t>::max();
        index_t tri = 0, rows = 0, per_item = 0, items = 0, total = 0;
        const bool ok = dim < kMax / 2 && mul_fits(dim, dim + 1, tri) && (tri /= 2, tri <= kMax - dim - 65) &&
                        dim_v < kMax - 65 && mul_fits(tri + dim + 65, dim_v + 65, rows) &&
                        rows <= kMax - 64 * (dim + dim_v) && mul_fits(batch, heads_kv, items) &&
                        mul_fits(items, rows + 64 * (dim + dim_v), per_item) &&
                        mul_fits(per_item, index_t(sizeof(float)), total);
        if (!ok) fail("taylor_state: the linear state of " + got + " overflows int64 bytes (use form = quadratic)");
    }
    check_scale(opts.scale);
    check_eps(opts.eps);
    check_state_key_lengths("taylor_state", opts.key_lengths);
}

}  // namespace taylor
}  // namespace detail
}  // namespace attnkit
