// Per-head pieces of the self-gating scan (scan.hpp): the state scalars of W heads at a time,
// the weights that fix a chunk-local row with its prefix, and the one-pass update of a head's
// weighted sum n together with its output row.
#pragma once

#include <algorithm>
#include <cstdint>

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
template <class A>
ATTNKIT_NOINLINE void fix_weights(const float* m, const float* z, const float* m_pre, const float* z_pre, index_t nh,
                                  float* wa, float* wb) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    for (index_t h = 0; h < nh; h += W) {
        const index_t cnt = std::min(W, nh - h);
        const V mv = load_heads<A>(m + h, cnt), zv = load_heads<A>(z + h, cnt);
        const V mp = load_heads<A>(m_pre + h, cnt), zp = load_heads<A>(z_pre + h, cnt);
        const V mx = simd::select(mv > mp, mv, mp);
        const V el = simd::exp(mv - mx), ep = simd::exp(mp - mx);
        const V inv = V(1.0f) / simd::fma(zp, ep, zv * el);
        store_heads<A>(wa + h, el * inv, cnt);
        store_heads<A>(wb + h, ep * inv, cnt);
    }
}

// Stores dim_v floats of x * s (x padded to the lane width) at dst; streamed when asked for
// and dst is vector-aligned, so that rows written once skip the read-for-ownership.
template <class A>
ATTNKIT_ALWAYS_INLINE void store_scaled(float* dst, const float* x, float s, index_t dim_v, bool stream) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const V sv(s);
    index_t c = 0;
    if (stream && simd::stream_aligned<A>(dst)) {
        for (; c + W <= dim_v; c += W) simd::stream_store(dst + c, simd::loadu<A>(x + c) * sv);
    } else {
        for (; c + W <= dim_v; c += W) simd::storeu(dst + c, simd::loadu<A>(x + c) * sv);
    }
    if (c < dim_v) simd::store_partial(dst + c, simd::loadu<A>(x + c) * sv, dim_v - c);
}

// Stores dim_v floats of the final row x * a + np * b at dst (x, np padded to the lane width).
template <class A>
ATTNKIT_ALWAYS_INLINE void store_fixed(float* dst, const float* x, float a, const float* np, float b, index_t dim_v,
                                       bool stream) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const V av(a), bv(b);
    index_t c = 0;
    if (stream && simd::stream_aligned<A>(dst)) {
        for (; c + W <= dim_v; c += W) simd::stream_store(dst + c, simd::fma(simd::loadu<A>(np + c), bv, simd::loadu<A>(x + c) * av));
    } else {
        for (; c + W <= dim_v; c += W) simd::storeu(dst + c, simd::fma(simd::loadu<A>(np + c), bv, simd::loadu<A>(x + c) * av));
    }
    if (c < dim_v) simd::store_partial(dst + c, simd::fma(simd::loadu<A>(np + c), bv, simd::loadu<A>(x + c) * av), dim_v - c);
}

// What becomes of a head's row at a position once its n is updated: nothing (states only), the
// raw n (a buffered row, padded to dim_vp), n * a (n / z: no prefix) or n * a + np * b (fixed
// with a prefix, fix_weights).
enum class row_kind { none, raw, scaled, fixed };

// One head at one position: n = n e + v (raise: a new max) or n = e v + n, and its row. kFused:
// one pass over n (it stays in registers between the update and the row). Otherwise two loops,
// so that every load of this head's v precedes every store of its row: a load right after a
// store with the same low 12 address bits waits for that store (4 KiB aliasing), and where the
// row sits a little above v modulo 4 KiB the fused loop meets that on every vector: with
// out = v + 32 bytes mod 4 KiB it ran 2.6x slower than with out = v (Zen 2, L = 2048, D = 64,
// streamed rows). Both orders apply the same operations to the same values, and the row's are
// those of store_scaled / store_fixed, so a fixed row has the bits that fix_rows would give it.
template <class A, row_kind kKind, bool kRaise, bool kStream, bool kFused>
ATTNKIT_ALWAYS_INLINE void update_head_as(float* n, const float* vr, float e, index_t dv, float* dst, float a,
                                          const float* np, float b) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const V ev(e), av(a), bv(b);
    auto next = [&](index_t c, const V& vv) {
        return kRaise ? simd::fma(simd::loadu<A>(n + c), ev, vv) : simd::fma(ev, vv, simd::loadu<A>(n + c));
    };
    auto row = [&](index_t c, const V& nn) {
        return kKind == row_kind::scaled ? nn * av : simd::fma(simd::loadu<A>(np + c), bv, nn * av);
    };
    auto put = [&](index_t c, const V& nn) {
        if (kKind == row_kind::raw)
            simd::storeu(dst + c, nn);
        else if (kStream)
            simd::stream_store(dst + c, row(c, nn));
        else
            simd::storeu(dst + c, row(c, nn));
    };
    index_t c = 0;
    for (; c + W <= dv; c += W) {
        const V nn = next(c, simd::loadu<A>(vr + c));
        simd::storeu(n + c, nn);
        if (kFused && kKind != row_kind::none) put(c, nn);
    }
    const index_t full = c;
    if (c < dv) simd::storeu(n + c, next(c, simd::load_partial<A>(vr + c, dv - c)));
    if (kKind == row_kind::none) return;
    if (!kFused)
        for (c = 0; c < full; c += W) put(c, simd::loadu<A>(n + c));
    if (full < dv) {
        if (kKind == row_kind::raw)
            simd::storeu(dst + full, simd::loadu<A>(n + full));
        else
            simd::store_partial(dst + full, row(full, simd::loadu<A>(n + full)), dv - full);
    }
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
    if (raise) {
        if (fused)
            st ? update_head_as<A, kKind, true, true, true>(n, vr, e, dv, dst, a, np, b)
               : update_head_as<A, kKind, true, false, true>(n, vr, e, dv, dst, a, np, b);
        else
            st ? update_head_as<A, kKind, true, true, false>(n, vr, e, dv, dst, a, np, b)
               : update_head_as<A, kKind, true, false, false>(n, vr, e, dv, dst, a, np, b);
    } else {
        if (fused)
            st ? update_head_as<A, kKind, false, true, true>(n, vr, e, dv, dst, a, np, b)
               : update_head_as<A, kKind, false, false, true>(n, vr, e, dv, dst, a, np, b);
        else
            st ? update_head_as<A, kKind, false, true, false>(n, vr, e, dv, dst, a, np, b)
               : update_head_as<A, kKind, false, false, false>(n, vr, e, dv, dst, a, np, b);
    }
}

}  // namespace self_gating
}  // namespace detail
}  // namespace attnkit
