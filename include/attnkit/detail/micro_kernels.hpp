// Packing and register-blocked micro-kernels (rows in lanes, kTileRows rows per panel).
//
//   scores_tile: S^T[j][r] = sum_d K[j][d] * QT[d][r]
//   values_tile: OT[c][r]  = alpha[r] * OT[c][r] + sum_j V[j][c] * PT[j][r]
//
// K and V tiles are dense row-major copies (see copy_rows); each broadcast element feeds kNR
// FMAs and each loaded row vector kMR FMAs.
#pragma once

#include <algorithm>
#include <type_traits>

#include "attnkit/detail/tile_traits.hpp"
#include "attnkit/simd/convert.hpp"

namespace attnkit {
namespace detail {

// Copies n rows of a K or V block into a dense float buffer with row stride ld (>= n_cols). Rows
// of one head sit H * D elements apart in BSHD, usually a multiple of 4 KiB, so every row of a
// block would fall into the same L1 set; dense copies with a 512-byte-ish stride stream instead.
// The copy is O(keys x D) per block against O(rows x keys x D) of FMAs, which also makes it the
// one place where a narrower storage type (half, bfloat16) is converted to float.
template <class SrcT>
inline void copy_rows(const SrcT* src, index_t src_stride, index_t n, index_t n_cols, index_t ld, float* dst) {
    for (index_t j = 0; j < n; ++j) {
        if constexpr (std::is_same<SrcT, float>::value)
            std::copy_n(src + j * src_stride, n_cols, dst + j * ld);
        else
            simd::convert_row<simd::default_arch>(src + j * src_stride, dst + j * ld, n_cols);
    }
}

// Row j of the dense buffer (n_cols of ld) times scale[j * scale_stride], j < n: the row scales
// of int8 K/V (attnkit/int8_kv.hpp) applied to a copied tile.
inline void scale_rows(const float* scale, index_t scale_stride, index_t n, index_t n_cols, index_t ld, float* dst) {
    for (index_t j = 0; j < n; ++j) simd::scale_into<simd::default_arch>(dst + j * ld, scale[j * scale_stride], n_cols);
}

// Packs one query row, scaled, as column `r % RT` of a Q^T panel (d-major, stride RT): the
// other conversion point of a narrower storage type.
template <class SrcT>
inline void pack_q_row(const SrcT* src, index_t dim, float scale, float* dst, index_t stride) {
    for (index_t d = 0; d < dim; ++d) dst[d * stride] = simd::to_float(src[d]) * scale;
}

// Whether a dense tile holds only finite values (x * 0 is NaN exactly for NaN and +-inf).
template <class A>
inline bool all_finite(const float* x, index_t n) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    V acc(0.0f);
    index_t i = 0;
    for (; i + W <= n; i += W) acc = simd::fma(simd::loadu<A>(x + i), V(0.0f), acc);
    float tail = 0.0f;
    for (; i < n; ++i) tail += x[i] * 0.0f;
    const float z = simd::hsum(acc) + tail;
    return z == z;
}

// Each row is a page-sized stride away from the last, which hardware prefetchers do not follow,
// so kernels prefetch the rows of the next block while computing this one, a slice per panel:
// a burst of a whole block's lines would exhaust the miss buffers and stall.
template <class SrcT>
inline void prefetch_rows(const SrcT* src, index_t src_stride, index_t j_begin, index_t j_end, index_t n_cols) {
    constexpr index_t kLine = 64 / sizeof(SrcT);
    for (index_t j = j_begin; j < j_end; ++j)
        for (index_t c = 0; c < n_cols; c += kLine) ATTNKIT_PREFETCH(src + j * src_stride + c);
}

// The register tile itself: acc[m][n] = sum_d kp[m * ld + d] * qt[d * RT + n * W .. + W), every
// chain k ascending. scores_tile stores it as S^T with the rows' max; the GEMM (gemm/kernel.hpp)
// adds it to C straight from the registers. One loop for both, so a GEMM's element and a score
// are the same chain of FMAs.
template <class A>
ATTNKIT_ALWAYS_INLINE void tile_product(const float* ATTNKIT_RESTRICT kp, index_t ld, const float* ATTNKIT_RESTRICT qt,
                                        index_t dim,
                                        simd::vfloat<A> (&acc)[tile_traits<A>::kMR][tile_traits<A>::kNR]) {
    using V = simd::vfloat<A>;
    constexpr int kNR = tile_traits<A>::kNR;
    constexpr int MR = tile_traits<A>::kMR;
    constexpr index_t W = tile_traits<A>::kLanes;
    constexpr index_t RT = tile_traits<A>::kTileRows;
    ATTNKIT_UNROLL for (int m = 0; m < MR; ++m)
        ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) acc[m][n] = V(0.0f);
    for (index_t d = 0; d < dim; ++d) {
        V qv[kNR];
        ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) qv[n] = simd::loadu<A>(qt + d * RT + n * W);
        ATTNKIT_UNROLL for (int m = 0; m < MR; ++m) {
            const V kb(kp[m * ld + d]);
            ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) acc[m][n] = simd::fma(kb, qv[n], acc[m][n]);
        }
    }
}

template <class A>
ATTNKIT_ALWAYS_INLINE void scores_tile(const float* ATTNKIT_RESTRICT kp, index_t ld, const float* ATTNKIT_RESTRICT qt,
                                       index_t dim, float* ATTNKIT_RESTRICT st, index_t valid,
                                       simd::vfloat<A>* ATTNKIT_RESTRICT mx) {
    using V = simd::vfloat<A>;
    constexpr int kNR = tile_traits<A>::kNR;
    constexpr int MR = tile_traits<A>::kMR;
    constexpr index_t W = tile_traits<A>::kLanes;
    constexpr index_t RT = tile_traits<A>::kTileRows;
    V acc[MR][kNR];
    tile_product<A>(kp, ld, qt, dim, acc);
    // The softmax needs each row's max over the block: taking it here, from registers, saves a
    // pass over S^T.
    ATTNKIT_UNROLL for (int m = 0; m < MR; ++m)
        ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) {
            simd::storeu(st + m * RT + n * W, acc[m][n]);
            if (m < valid) mx[n] = simd::max(acc[m][n], mx[n]);
        }
}

// All keys of a dense K tile [rounded-up n_keys][ld] (ld >= dim, ld = dim unless given) against
// one row panel; S^T rows past n_keys are computed from whatever the tile holds there and never
// read. mx[n] (in/out) takes the max over the block's scores of each row. The backward runs the
// same kernel with the roles turned (query rows broadcast, keys in lanes: detail/backward/).
// Panel-level functions stay out of line: each call is tens of thousands of FMAs, and separate
// symbols keep profiles readable.
template <class A>
ATTNKIT_NOINLINE void scores_panel(const float* kp, index_t n_keys, const float* qt, index_t dim, float* st,
                                   simd::vfloat<A>* mx, index_t ld = 0) {
    constexpr int MR = tile_traits<A>::kMR;
    constexpr index_t RT = tile_traits<A>::kTileRows;
    if (ld == 0) ld = dim;
    for (index_t j = 0; j < n_keys; j += MR) scores_tile<A>(kp + j * ld, ld, qt, dim, st + j * RT, n_keys - j, mx);
}

// kGuardMasked: a masked row has p = 0 for a key it must not see, and 0 * inf = NaN would carry
// a non-finite value of that key into it; the guarded form skips the keys outside each row's
// [lo, hi) (visible keys still contribute at weight 0, as in the reference). Only partially
// masked panels over a tile with non-finite values need it.
template <class A, bool kGuardMasked, int MC = tile_traits<A>::kMR>
ATTNKIT_ALWAYS_INLINE void values_tile(const float* ATTNKIT_RESTRICT vp, index_t ld, index_t n_keys,
                                       const float* ATTNKIT_RESTRICT pt, const simd::vfloat<A>* alpha,
                                       float* ATTNKIT_RESTRICT ot, index_t j0, const simd::vfloat<A>* lo,
                                       const simd::vfloat<A>* hi) {
    using V = simd::vfloat<A>;
    constexpr int kNR = tile_traits<A>::kNR;
    constexpr index_t W = tile_traits<A>::kLanes;
    constexpr index_t RT = tile_traits<A>::kTileRows;
    V acc[MC][kNR];
    ATTNKIT_UNROLL for (int c = 0; c < MC; ++c)
        ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) acc[c][n] = simd::loadu<A>(ot + c * RT + n * W) * alpha[n];
    for (index_t j = 0; j < n_keys; ++j) {
        V pv[kNR];
        ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) pv[n] = simd::loadu<A>(pt + j * RT + n * W);
        const V jf(static_cast<float>(j0 + j));
        ATTNKIT_UNROLL for (int c = 0; c < MC; ++c) {
            const V vb(vp[j * ld + c]);
            ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) {
                if constexpr (kGuardMasked)
                    acc[c][n] = simd::select(jf < lo[n], acc[c][n],
                                             simd::select(jf >= hi[n], acc[c][n], simd::fma(vb, pv[n], acc[c][n])));
                else
                    acc[c][n] = simd::fma(vb, pv[n], acc[c][n]);
            }
        }
    }
    ATTNKIT_UNROLL for (int c = 0; c < MC; ++c)
        ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) simd::storeu(ot + c * RT + n * W, acc[c][n]);
}

// Value columns [0, cols) of a dense V tile [n_keys][ld] against one row panel; ld (a multiple
// of kMR) is the padded Dv, and columns past Dv are zero in the tile. cols = 0 means all ld.
// The last register tile narrows to 8 or 4 columns where that covers the rest: at Dv = 128 and
// kMR = 12 a full tile would compute 4 columns of padding (3% of the product), at Dv = 64, 8
// (11%). Rows of O^T past cols are then left as they were.
// With kGuardMasked, j0 is the first key of the tile and lo/hi hold the panel's rows' visible
// key intervals (as floats, like softmax_panel's).
template <class A, bool kGuardMasked = false>
ATTNKIT_NOINLINE void values_panel(const float* vp, index_t ld, index_t n_keys, const float* pt,
                                   const simd::vfloat<A>* alpha, float* ot, index_t j0 = 0,
                                   const float* lo = nullptr, const float* hi = nullptr, index_t cols = 0) {
    using V = simd::vfloat<A>;
    constexpr int kNR = tile_traits<A>::kNR;
    constexpr int MC = tile_traits<A>::kMR;
    constexpr index_t W = tile_traits<A>::kLanes;
    constexpr index_t RT = tile_traits<A>::kTileRows;
    V lov[kNR], hiv[kNR];
    ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) {
        lov[n] = kGuardMasked ? simd::loadu<A>(lo + n * W) : V(0.0f);
        hiv[n] = kGuardMasked ? simd::loadu<A>(hi + n * W) : V(0.0f);
    }
    if (cols <= 0 || cols > ld) cols = ld;
    index_t c = 0;
    for (; c + MC <= cols; c += MC)
        values_tile<A, kGuardMasked>(vp + c, ld, n_keys, pt, alpha, ot + c * RT, j0, lov, hiv);
    // c + MC <= ld (both multiples of MC, c < cols <= ld): the narrower tiles stay inside rows.
    const index_t rest = cols - c;
    if (rest <= 0) return;
    if constexpr (MC > 4) {
        if (rest <= 4) return values_tile<A, kGuardMasked, 4>(vp + c, ld, n_keys, pt, alpha, ot + c * RT, j0, lov, hiv);
    }
    if constexpr (MC > 8) {
        if (rest <= 8) return values_tile<A, kGuardMasked, 8>(vp + c, ld, n_keys, pt, alpha, ot + c * RT, j0, lov, hiv);
    }
    values_tile<A, kGuardMasked>(vp + c, ld, n_keys, pt, alpha, ot + c * RT, j0, lov, hiv);
}

}  // namespace detail
}  // namespace attnkit
