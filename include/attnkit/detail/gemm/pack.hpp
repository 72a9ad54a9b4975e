// Packing of the GEMM operands into the layouts the register tile reads (micro_kernels.hpp
// scores_tile: kp[m * kc + d] broadcast, qt[d * kNR + n * W] loaded):
//
//   A block  [mc, kc] of row-major A -> ceil(mc / kMR) micro-panels of kMR x kc, each row its kc
//            floats copied as they are (a row of A is already contiguous)
//   B block  [kc, nc] of row-major B -> ceil(nc / kNR) micro-panels of kc x kNR, row d of a
//            panel the kNR floats B[d][j0 .. j0 + kNR)
//
// A transposed operand (the backward passes' A^T B and A B^T) is packed into the same layouts
// from its stored form, so the register tile and the blocking never see the difference:
//   gemm_pack_a_t: A = At^T, At [K, M] row-major: row d of At gives column d of a micro-panel
//   gemm_pack_b_t: B = Bt^T, Bt [N, K] row-major: row j of Bt gives column j of a micro-panel
//
// Rows and columns past the block's edge are zero, so edge tiles run the same full-size
// kernel; their extra results are computed and never stored.
#pragma once

#include <algorithm>
#include <cstring>

#include "attnkit/config.hpp"
#include "attnkit/simd/convert.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {

template <index_t kMR>
inline void gemm_pack_a(const float* a, index_t lda, index_t mc, index_t kc, float* ATTNKIT_RESTRICT ap) {
    const std::size_t bytes = static_cast<std::size_t>(kc) * sizeof(float);
    for (index_t i0 = 0; i0 < mc; i0 += kMR)
        for (index_t m = 0; m < kMR; ++m, ap += kc) {
            if (i0 + m < mc)
                std::memcpy(ap, a + (i0 + m) * lda, bytes);
            else
                std::fill_n(ap, kc, 0.0f);
        }
}

// B is read row by row (each row of the block is nc contiguous floats, the order hardware
// prefetchers follow when B comes from DRAM, as the StaticEmbQK weights do) and scattered to
// the panels, one kNR-float line of each per row.
template <index_t kNR>
inline void gemm_pack_b(const float* b, index_t ldb, index_t kc, index_t nc, float* ATTNKIT_RESTRICT bp) {
    const index_t full = nc / kNR, rest = nc % kNR;
    const index_t panel = kc * kNR;
    for (index_t d = 0; d < kc; ++d) {
        const float* src = b + d * ldb;
        float* dst = bp + d * kNR;
        for (index_t p = 0; p < full; ++p) std::memcpy(dst + p * panel, src + p * kNR, kNR * sizeof(float));
        if (rest) {
            float* tail = dst + full * panel;
            std::memcpy(tail, src + full * kNR, static_cast<std::size_t>(rest) * sizeof(float));
            std::fill_n(tail + rest, kNR - rest, 0.0f);
        }
    }
}

// Transposed operands are moved W x W floats at a time: W vectors loaded along the stored rows,
// transposed in registers (simd::transpose), stored along the panel's rows (gemm_pack_a_t here,
// rows_into_tiles below for B). Element by element
// each float would be a load and a store to a different cache line of the panel (its rows are
// kc or kNR floats apart), a cost that shows where a product's blocks each pack their own B
// (docs/benchmarks.md, "Gated MLP and StaticEmbQK backward"). What does not fill a W x W square (a block's last rows or
// columns, kc % W) is copied one float at a time.

// A [mc, kc] block of A = At^T, At row-major with row stride ldat (the block starts at At's
// column i0 = 0 of the pointer given, row 0): row d of At gives column d of a micro-panel. A
// square covers W columns of At from a micro-panel's first; kMR may be less than W (12 of 16
// lanes, 6 of 8), and the square's extra columns, inside the block, are loaded and dropped;
// a square that would leave the block is copied one float at a time.
template <class A, index_t kMR>
inline void gemm_pack_a_t(const float* at, index_t ldat, index_t mc, index_t kc, float* ATTNKIT_RESTRICT ap) {
    constexpr index_t W = simd::kLanes<A>;
    for (index_t i0 = 0; i0 < mc; i0 += kMR, ap += kMR * kc) {
        const index_t nm = mc - i0 < kMR ? mc - i0 : kMR;
        for (index_t m0 = 0; m0 < nm; m0 += W) {
            const index_t n = nm - m0 < W ? nm - m0 : W;
            index_t d = 0;
            if constexpr (W > 1) {
                if (i0 + m0 + W <= mc)  // the square stays inside the block
                    for (; d + W <= kc; d += W) {
                        simd::vfloat<A> sq[W];
                        ATTNKIT_UNROLL for (index_t r = 0; r < W; ++r)
                            sq[r] = simd::loadu<A>(at + (d + r) * ldat + i0 + m0);
                        simd::transpose(sq);
                        for (index_t r = 0; r < n; ++r) simd::storeu(ap + (m0 + r) * kc + d, sq[r]);
                    }
            }
            for (; d < kc; ++d)
                for (index_t r = 0; r < n; ++r) ap[(m0 + r) * kc + d] = at[d * ldat + i0 + m0 + r];
        }
        for (index_t m = nm; m < kMR; ++m)
            for (index_t e = 0; e < kc; ++e) ap[m * kc + e] = 0.0f;
    }
}

// Rows u < n (row u at src + u sl, as stored: float, bfloat16, half or int8) into tiles of kT
// rows in lanes: element (u, c) at tile + (u / kT) tile_cols kT + (col0 + c) kT + u % kT, for
// c < cols. The GEMM's B panels (gemm_pack_b_t: a row of Bt is a column of B) and the backward
// tile kernel's K / V tiles (keys in lanes) are this layout. W rows x W columns at a time (kT is
// a whole number of vectors, so such a square stays in one tile); the rest one float at a time.
// rows_out, if given, also gets the rows row-major as floats (stride ld_rows).
template <class A, index_t kT, class T>
void rows_into_tiles(const T* src, index_t sl, index_t n, index_t cols, float* tile, index_t tile_cols, index_t col0,
                     float* rows_out = nullptr, index_t ld_rows = 0) {
    constexpr index_t W = simd::kLanes<A>;
    static_assert(kT % W == 0, "a tile is whole vectors wide");
    index_t u = 0;
    if constexpr (W > 1) {
        for (; u + W <= n; u += W) {
            float* t = tile + (u / kT) * tile_cols * kT + u % kT;
            index_t c = 0;
            for (; c + W <= cols; c += W) {
                simd::vfloat<A> sq[W];
                ATTNKIT_UNROLL for (index_t r = 0; r < W; ++r) {
                    sq[r] = simd::load_float<A>(src + (u + r) * sl + c);
                    if (rows_out) simd::storeu(rows_out + (u + r) * ld_rows + c, sq[r]);
                }
                simd::transpose(sq);
                ATTNKIT_UNROLL for (index_t e = 0; e < W; ++e) simd::storeu(t + (col0 + c + e) * kT, sq[e]);
            }
            for (; c < cols; ++c)
                for (index_t r = 0; r < W; ++r) {
                    const float x = simd::to_float(src[(u + r) * sl + c]);
                    t[(col0 + c) * kT + r] = x;
                    if (rows_out) rows_out[(u + r) * ld_rows + c] = x;
                }
        }
    }
    for (; u < n; ++u) {
        float* t = tile + (u / kT) * tile_cols * kT + u % kT;
        for (index_t c = 0; c < cols; ++c) {
            const float x = simd::to_float(src[u * sl + c]);
            t[(col0 + c) * kT] = x;
            if (rows_out) rows_out[u * ld_rows + c] = x;
        }
    }
}

// A [kc, nc] block of B = Bt^T, Bt row-major with row stride ldbt: column j of the block is the
// contiguous row j of Bt, so the panels are rows_into_tiles of Bt's rows; the last panel's lanes
// past nc are zero.
template <class A, index_t kNR>
inline void gemm_pack_b_t(const float* bt, index_t ldbt, index_t kc, index_t nc, float* ATTNKIT_RESTRICT bp) {
    rows_into_tiles<A, kNR>(bt, ldbt, nc, kc, bp, kc, 0);
    const index_t rest = nc % kNR;
    if (rest) {
        float* last = bp + nc / kNR * kc * kNR;
        for (index_t e = 0; e < kc; ++e) std::fill_n(last + e * kNR + rest, kNR - rest, 0.0f);
    }
}

}  // namespace detail
}  // namespace attnkit
