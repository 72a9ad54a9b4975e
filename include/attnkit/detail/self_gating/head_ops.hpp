// Per-head pieces of the self-gating scan (scan.hpp): the state scalars of W heads at a time,
// the weights that fix a chunk-local row with its prefix, and the one-pass update of a head's
// weighted sum n together with its output row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attnkit/config.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {
namespace self_gating {

// Per-head scalars are handled W heads at a time (one vector per quantity); a last group of
// fewer heads is loaded and stored partially. Every operation is elementwise, so a head's
// result does not depend on the group or lane it falls in.
template <class A>
ATTNKIT_ALWAYS_INLINE simd::vfloat<A> load_heads(const float* x, index_t cnt) {
    return cnt == simd::kLanes<A> ? simd::loadu<A>(x) : simd::load_partial<A>(x, cnt);
}
template <class A>
ATTNKIT_ALWAYS_INLINE void store_heads(float* x, const simd::vfloat<A>& v, index_t cnt) {
    if (cnt == simd::kLanes<A>)
        simd::storeu(x, v);
    else
        simd::store_partial(x, v, cnt);
}

// One token's gates gate[nh] entering the states (m, z) of nh heads, W heads at a time. A gate
// above m is the new max (also the first token: exp(-inf) = 0) and rescales: e = exp(m - g),
// z = z e + 1 (the caller then makes n = n e + v); one below it (or NaN, which then propagates
// into z and n) adds e = exp(g - m): z += e (n += e v). A gate of -inf weighs 0 even while the
// state is empty (where exp(-inf - -inf) would be NaN). up[h] = 1 where the max rose. The
// forward scan and the backward's row statistics (backward.hpp) both advance through here, so
// the backward sees the forward's very (m, z).
template <class A>
ATTNKIT_ALWAYS_INLINE void advance_states(const float* gate, float* m, float* z, float* e, float* up, index_t nh) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    for (index_t hh = 0; hh < nh; hh += W) {
        const index_t cnt = std::min(W, nh - hh);
        const V g = load_heads<A>(gate + hh, cnt), mv = load_heads<A>(m + hh, cnt), zv = load_heads<A>(z + hh, cnt);
        const auto raise = g > mv;
        V ev = simd::exp(simd::select(raise, mv - g, g - mv));
        ev = simd::select(g == V(-HUGE_VALF), V(0.0f), ev);
        store_heads<A>(e + hh, ev, cnt);
        store_heads<A>(up + hh, simd::select(raise, V(1.0f), V(0.0f)), cnt);
        store_heads<A>(z + hh, simd::select(raise, simd::fma(zv, ev, V(1.0f)), zv + ev), cnt);
        store_heads<A>(m + hh, simd::select(raise, g, mv), cnt);
    }
}

// inv[h] = 1 / z[h], or 0 for an empty state, for nh heads.
template <class A>
ATTNKIT_NOINLINE void inverse_sums(const float* z, index_t nh, float* inv) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    for (index_t h = 0; h < nh; h += W) {
        const index_t cnt = std::min(W, nh - h);
        const V zv = load_heads<A>(z + h, cnt);
        store_heads<A>(inv + h, simd::select(zv == V(0.0f), V(0.0f), V(1.0f) / zv), cnt);
    }
}

// The final row of a head from its chunk-local state (m, z, n) and the prefix state (m_pre,
// z_pre, n_pre) of every token before the chunk, the exact combination of the two token sets:
// o = (e^(m - M) n + e^(m_pre - M) n_pre) / (e^(m - M) z + e^(m_pre - M) z_pre), M = max(m, m_pre),
// i.e. o = n * wa + n_pre * wb. The weights of nh heads; scan_rows (rows made during the scan)
// and fix_rows (rows made later from a buffer) both take them from here, hence the same bits.
// With lse given, also lse[h * lse_stride] = M + log(denominator), the row's log-sum-exp.
template <class A>
ATTNKIT_NOINLINE void fix_weights(const float* m, const float* z, const float* m_pre, const float* z_pre, index_t nh,
                                  float* wa, float* wb, float* lse = nullptr, index_t lse_stride = 0) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    for (index_t h = 0; h < nh; h += W) {
        const index_t cnt = std::min(W, nh - h);
        const V mv = load_heads<A>(m + h, cnt), zv = load_heads<A>(z + h, cnt);
        const V mp = load_heads<A>(m_pre + h, cnt), zp = load_heads<A>(z_pre + h, cnt);
        const V mx = simd::select(mv > mp, mv, mp);
        const V el = simd::exp(mv - mx), ep = simd::exp(mp - mx);
        const V den = simd::fma(zp, ep, zv * el);
        const V inv = V(1.0f) / den;
        store_heads<A>(wa + h, el * inv, cnt);
        store_heads<A>(wb + h, ep * inv, cnt);
        if (lse) {
            // One scalar log per head: a vector log is not worth its own code for L H values.
            alignas(64) float mxs[W], dens[W];
            simd::storeu(mxs, mx);
            simd::storeu(dens, den);
            for (index_t i = 0; i < cnt; ++i) lse[(h + i) * lse_stride] = mxs[i] + std::log(dens[i]);
        }
    }
}

// What becomes of a head's row at a position once its n is updated: nothing (states only), the
// raw n (a buffered row, padded to dim_vp), n * a (n / z: no prefix) or n * a + np * b (fixed
// with a prefix, fix_weights).
enum class row_kind { none, raw, scaled, fixed };

// One vector of a row from the same vector of n (and of the prefix's n for a fixed row). Every
// row, made during the scan or later from a buffer, goes through this one expression, so a row
// has the same bits whichever way it was made.
// np is only read (at np + c) for a fixed row; the other kinds may pass null.
template <class A, row_kind kKind>
ATTNKIT_ALWAYS_INLINE simd::vfloat<A> row_value(const simd::vfloat<A>& nn, const float* np, index_t c,
                                                const simd::vfloat<A>& av, const simd::vfloat<A>& bv) {
    if (kKind == row_kind::raw) return nn;
    if (kKind == row_kind::scaled) return nn * av;
    return simd::fma(simd::loadu<A>(np + c), bv, nn * av);
}

// Stores dim_v floats of the row of x (x and np padded to the lane width) at dst; streamed
// when asked for and dst is vector-aligned, so that rows written once skip the
// read-for-ownership. A raw row is stored whole (dim_vp floats of a buffer).
// Elements [from, dim_v): the whole row from 0, or the tail of one whose full vectors are stored.
template <class A, row_kind kKind>
ATTNKIT_ALWAYS_INLINE void store_row(float* dst, const float* x, float a, const float* np, float b, index_t dim_v,
                                     bool stream, index_t from = 0) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const V av(a), bv(b);
    index_t c = from;
    if (kKind != row_kind::raw && stream && simd::stream_aligned<A>(dst)) {
        for (; c + W <= dim_v; c += W) simd::stream_store(dst + c, row_value<A, kKind>(simd::loadu<A>(x + c), np, c, av, bv));
    } else {
        for (; c + W <= dim_v; c += W) simd::storeu(dst + c, row_value<A, kKind>(simd::loadu<A>(x + c), np, c, av, bv));
    }
    if (c < dim_v) {
        if (kKind == row_kind::raw)
            simd::storeu(dst + c, simd::loadu<A>(x + c));
        else
            simd::store_partial(dst + c, row_value<A, kKind>(simd::loadu<A>(x + c), np, c, av, bv), dim_v - c);
    }
}

// One head at one position: n = n e + v (raise: a new max) or n = e v + n, and its row. kFused:
// one pass over n (it stays in registers between the update and the row). Otherwise the row is
// stored after the update, so that every load of this head's v precedes every store of its row:
// a load right after a store with the same low 12 address bits waits for that store (4 KiB
// aliasing), and where the row sits a little above v modulo 4 KiB the fused loop meets that on
// every vector: with out = v + 32 bytes mod 4 KiB it ran 2.6x slower than with out = v (Zen 2,
// L = 2048, D = 64, streamed rows). Both orders compute the row with row_value.
template <class A, row_kind kKind, bool kRaise, bool kStream, bool kFused>
ATTNKIT_ALWAYS_INLINE void update_head_as(float* n, const float* vr, float e, index_t dv, float* dst, float a,
                                          const float* np, float b) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const V ev(e), av(a), bv(b);
    auto next = [&](index_t c, const V& vv) {
        return kRaise ? simd::fma(simd::loadu<A>(n + c), ev, vv) : simd::fma(ev, vv, simd::loadu<A>(n + c));
    };
    index_t c = 0;
    for (; c + W <= dv; c += W) {
        const V nn = next(c, simd::loadu<A>(vr + c));
        simd::storeu(n + c, nn);
        if (kFused && kKind != row_kind::none) {
            if (kStream)
                simd::stream_store(dst + c, row_value<A, kKind>(nn, np, c, av, bv));
            else
                simd::storeu(dst + c, row_value<A, kKind>(nn, np, c, av, bv));
        }
    }
    const index_t full = c;
    if (c < dv) simd::storeu(n + c, next(c, simd::load_partial<A>(vr + c, dv - c)));
    if (kKind == row_kind::none) return;
    if (kFused)  // the tail of the row
        store_row<A, kKind>(dst, n, a, np, b, dv, false, full);
    else
        store_row<A, kKind>(dst, n, a, np, b, dv, kStream);
}

// Runs f with b as std::true_type or std::false_type: a runtime choice that selects one of a
// function's compile-time variants.
template <class F>
ATTNKIT_ALWAYS_INLINE void with_bool(bool b, F&& f) {
    if (b)
        f(std::true_type{});
    else
        f(std::false_type{});
}

template <class A, row_kind kKind>
ATTNKIT_ALWAYS_INLINE void update_head(bool raise, float* n, const float* vr, float e, index_t dv, float* dst, float a,
                                       const float* np, float b, bool stream) {
    constexpr bool kRow = kKind == row_kind::scaled || kKind == row_kind::fixed;
    const bool st = kRow && stream && simd::stream_aligned<A>(dst);
    // The row's distance above v modulo 4 KiB; under 256 bytes (8 AVX2 vectors) the loads that
    // alias a store follow it too closely, and the two-loop order is used.
    const std::uintptr_t gap = (reinterpret_cast<std::uintptr_t>(dst) - reinterpret_cast<std::uintptr_t>(vr)) & 4095u;
    const bool fused = !kRow || gap == 0 || gap >= 256;
    with_bool(raise, [&](auto r) {
        with_bool(st, [&](auto s) {
            with_bool(fused, [&](auto f) {
                update_head_as<A, kKind, decltype(r)::value, decltype(s)::value, decltype(f)::value>(n, vr, e, dv, dst, a,
                                                                                                     np, b);
            });
        });
    });
}

}  // namespace self_gating
}  // namespace detail
}  // namespace attnkit
