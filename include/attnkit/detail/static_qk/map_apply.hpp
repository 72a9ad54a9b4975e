// Applying a packed lower-triangular attention map to a batch of value sets:
//   out[b, t, h] = sum_{j <= i} P_h[i][j] v[b, j, h / G],  i = L - T + t,
// for every batch item against the same P. A lower-triangular product over all B at once:
//
//  - Micro tile (map_tile): kRows packed rows of P times kCols vectors of V columns. Each P
//    element is broadcast once and feeds kCols FMAs, each V vector loaded once feeds kRows FMAs.
//    The packed rows have no common stride (row i starts at i (i + 1) / 2), so this is not a job
//    for a strided GEMM: every row has its own pointer.
//  - Cache blocks: a work item is (query head, block of query rows); it walks key blocks of
//    kBlockKeys, and within one key block every batch item's V tile (a dense padded copy,
//    copy_rows, L1-sized) meets every row of the block, while the block's P (rows x kBlockKeys)
//    stays in L2 for all B items. Partial sums live in a per-item [B, rows, Dv] scratch.
//  - The triangle: a micro tile runs the keys its first row sees; the few diagonal keys beyond
//    that (< kRows per row) run one row at a time, so no masked key is ever touched (a NaN in an
//    invisible value stays out, as in the reference).
// Summation order per output element: key blocks ascending, keys ascending within a block: fixed
// by the shapes, identical for any thread count.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/micro_kernels.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/detail/static_qk/map_build.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {
namespace static_qk {

template <class A>
struct map_traits {
    static constexpr index_t kLanes = simd::kLanes<A>;
    // 16 registers (SSE2/AVX2): 6 x 2 accumulators + 2 V vectors + 1 broadcast; 32 (AVX-512):
    // 6 x 4 + 4 + 1. Loads per FMA stay below the 1 : 1 the core sustains.
    static constexpr int kRows = 6;
    static constexpr int kCols = kLanes >= 16 ? 4 : 2;
    // 64 keys: the dense V tile is 64 x Dv floats (16 KiB at Dv = 64), reused from L1 by every
    // micro tile of the block; the accumulators are loaded and stored once per 64 keys.
    static constexpr index_t kBlockKeys = 64;
    // Query rows per work item: the [B, rows, Dv] partial sums kept near L2 size.
    static constexpr index_t kAccBytes = 256 * 1024;
    static constexpr index_t kMaxBlockRows = 128;
    static index_t block_rows(index_t batch, index_t dv_pad) {
        index_t rows = kAccBytes / (static_cast<index_t>(sizeof(float)) * std::max<index_t>(1, batch) * dv_pad);
        rows = std::min(std::max<index_t>(rows, kRows), kMaxBlockRows);
        return rows / kRows * kRows;
    }
};

// acc[r][0 .. C W) += sum_{j < n} p[r][j] * vt[j][0 .. C W), for R rows (acc rows acc_ld apart).
template <class A, int R, int C>
ATTNKIT_ALWAYS_INLINE void map_tile(const float* const* p, index_t n, const float* ATTNKIT_RESTRICT vt, index_t ld,
                                    float* ATTNKIT_RESTRICT acc, index_t acc_ld) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    V a[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) a[r][c] = simd::loadu<A>(acc + r * acc_ld + c * W);
    for (index_t j = 0; j < n; ++j) {
        V x[C];
        for (int c = 0; c < C; ++c) x[c] = simd::loadu<A>(vt + j * ld + c * W);
        for (int r = 0; r < R; ++r) {
            const V pr(p[r][j]);
            for (int c = 0; c < C; ++c) a[r][c] = simd::fma(pr, x[c], a[r][c]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) simd::storeu(acc + r * acc_ld + c * W, a[r][c]);
}

// The last rem < kCols vectors of the columns.
template <class A, int R, int C>
ATTNKIT_ALWAYS_INLINE void map_tile_tail(int rem, const float* const* p, index_t n, const float* vt, index_t ld,
                                         float* acc, index_t acc_ld) {
    if constexpr (C > 0) {
        if (rem == C)
            map_tile<A, R, C>(p, n, vt, ld, acc, acc_ld);
        else
            map_tile_tail<A, R, C - 1>(rem, p, n, vt, ld, acc, acc_ld);
    }
}

// R rows over all ld (padded Dv, a multiple of the lane count) columns.
template <class A, int R>
ATTNKIT_NOINLINE void map_rows(const float* const* p, index_t n, const float* vt, index_t ld, float* acc,
                               index_t acc_ld) {
    constexpr int C = map_traits<A>::kCols;
    constexpr index_t W = simd::kLanes<A>;
    index_t c0 = 0;
    for (; c0 + C * W <= ld; c0 += C * W) map_tile<A, R, C>(p, n, vt + c0, ld, acc + c0, acc_ld);
    if (c0 < ld) map_tile_tail<A, R, C - 1>(static_cast<int>((ld - c0) / W), p, n, vt + c0, ld, acc + c0, acc_ld);
}

// p: the map's packed rows (heads * packed_size(max_len) floats); v [B, L, Hk, Dv]; out
// [B, T, H, Dv] receives rows L - T .. L - 1. Shapes are checked by the caller.
template <class A>
void apply_map(const float* p, index_t max_len, const values_shape& s, const view<const float, 4>& v,
               const view<float, 4>& out, thread_pool* pool) {
    using MT = map_traits<A>;
    constexpr int R = MT::kRows;
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t KB = MT::kBlockKeys;
    const index_t B = s.batch, L = s.len, T = s.rows, H = s.heads, G = s.heads / s.heads_k, Dv = s.dim_v;
    if (B == 0 || T == 0) return;
    const index_t dv_pad = (Dv + W - 1) / W * W;
    const index_t QB = MT::block_rows(B, dv_pad);
    const index_t n_qb = (T + QB - 1) / QB, first = L - T, tri = packed_size(max_len);

    // Last query blocks (longest rows) first, so the threads finish together.
    parallel_for(pool, H * n_qb, [&](index_t it) {
        const index_t qb = n_qb - 1 - it / H, h = it % H, hk = h / G;
        const index_t i_begin = first + qb * QB, i_end = std::min(i_begin + QB, L), nr = i_end - i_begin;
        scratch_lease<> lease;
        std::vector<float>& buf = lease.get();
        buf.assign(static_cast<std::size_t>((B * QB + KB) * dv_pad), 0.0f);  // zero V padding columns
        float* acc = buf.data();
        float* vt = acc + B * QB * dv_pad;
        const float* ph = p + h * tri;
        const float* rows[R];

        for (index_t j0 = 0; j0 < i_end; j0 += KB) {
            const index_t j1 = std::min(j0 + KB, i_end);
            const index_t r_first = std::max<index_t>(0, j0 - i_begin);  // rows before see none of it
            for (index_t b = 0; b < B; ++b) {
                copy_rows(v.ptr(b, j0, hk), v.strides[1], j1 - j0, Dv, dv_pad, vt);
                float* acc_b = acc + b * QB * dv_pad;
                index_t r = r_first;
                for (; r + R <= nr; r += R) {
                    const index_t i = i_begin + r;  // the tile's first row sees keys [j0, i]
                    for (int k = 0; k < R; ++k) rows[k] = ph + packed_row(i + k) + j0;
                    const index_t n_all = std::min(j1, i + 1) - j0;
                    map_rows<A, R>(rows, n_all, vt, dv_pad, acc_b + r * dv_pad, dv_pad);
                    for (int k = 1; k < R; ++k) {  // the diagonal beyond the first row
                        const index_t n_k = std::min(j1, i + k + 1) - j0;
                        if (n_k <= n_all) continue;
                        const float* row = rows[k] + n_all;
                        map_rows<A, 1>(&row, n_k - n_all, vt + n_all * dv_pad, dv_pad, acc_b + (r + k) * dv_pad,
                                       dv_pad);
                    }
                }
                for (; r < nr; ++r) {
                    const float* row = ph + packed_row(i_begin + r) + j0;
                    map_rows<A, 1>(&row, std::min(j1, i_begin + r + 1) - j0, vt, dv_pad, acc_b + r * dv_pad, dv_pad);
                }
            }
        }
        for (index_t b = 0; b < B; ++b)
            for (index_t r = 0; r < nr; ++r) {
                const float* src = acc + (b * QB + r) * dv_pad;
                std::copy(src, src + Dv, out.ptr(b, i_begin + r - first, h));
            }
    });
}

}  // namespace static_qk
}  // namespace detail
}  // namespace attnkit
