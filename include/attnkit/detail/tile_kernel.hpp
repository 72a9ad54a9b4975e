// The tiled forward kernel for one row block (FlashAttention-style): Q^T packed once, then for
// each key block S^T = K Q^T, online softmax, O^T += V^T P^T, all on row panels in lanes. The
// L x L score matrix never exists; extra memory is a few panels per call.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/detail/micro_kernels.hpp"

namespace attnkit {
namespace detail {

// emit(r, o_row, lse) receives each row's output normalised over keys [ks0, ks1) and its lse.
// buf is reused scratch (any contents; resized and cleared here).
template <class A, class Emit>
void tile_kernel(const attention_problem& p, const row_block& rb, index_t ks0, index_t ks1, std::vector<float>& buf,
                 Emit&& emit) {
    using TT = tile_traits<A>;
    using V = simd::vfloat<A>;
    constexpr index_t RT = TT::kTileRows;
    constexpr index_t BK = TT::kBlockKeys;
    constexpr int MR = TT::kMR;  // V tile rows padded to whole micro tiles of columns
    const index_t D = p.s.dim, Dv = p.s.dim_v, R = rb.rows();
    const index_t n_panels = (R + RT - 1) / RT, rows_pad = n_panels * RT;
    const index_t dv_pad = (Dv + MR - 1) / MR * MR;

    // One allocation per row block: Q^T and O^T panels, one S^T panel, K and V tiles, row state.
    // K tile: MR spare rows, since a panel's key range may start inside the tile and the scores
    // micro-kernel reads whole groups of MR keys.
    buf.assign(static_cast<std::size_t>(rows_pad * (D + dv_pad + 4) + BK * (RT + dv_pad) + (BK + MR) * D + RT * Dv), 0.0f);
    float* qt = buf.data();
    float* ot = qt + rows_pad * D;
    float* st = ot + rows_pad * dv_pad;
    float* kp = st + BK * RT;
    float* vp = kp + (BK + MR) * D;
    float* m = vp + BK * dv_pad;
    float* l = m + rows_pad;
    float* lo = l + rows_pad;
    float* hi = lo + rows_pad;
    float* orows = hi + rows_pad;
    std::fill(m, m + rows_pad, kNegInf);  // padded rows keep lo = hi = 0: nothing visible

    // Per panel: the smallest and largest first and last visible key of its rows. A key block is
    // skipped by a panel that sees none of it, and runs without mask tests where all its rows
    // see all of it.
    std::vector<index_t> bounds(static_cast<std::size_t>(4 * n_panels));
    index_t* min_lo = bounds.data();
    index_t* max_lo = min_lo + n_panels;
    index_t* min_hi = max_lo + n_panels;
    index_t* max_hi = min_hi + n_panels;
    std::fill(min_lo, min_lo + n_panels, ks1);
    std::fill(max_lo, max_lo + n_panels, ks0);
    std::fill(min_hi, min_hi + n_panels, ks1);
    std::fill(max_hi, max_hi + n_panels, ks0);
    const mask_params mp = p.mask(rb.b);
    for (index_t r = 0; r < R; ++r) {
        const index_t t = r / RT;
        const float* qr = p.q.row(rb.b, rb.pos(r), rb.head(r));
        float* dst = qt + t * D * RT + r % RT;
        for (index_t d = 0; d < D; ++d) dst[d * RT] = qr[d] * p.q_scale;
        index_t a, z;
        row_interval(mp, rb.pos(r), ks0, ks1, a, z);
        lo[r] = static_cast<float>(a);
        hi[r] = static_cast<float>(z);
        // Every real row decides whether a block is fully visible (a row that sees nothing
        // forces the masked path); only rows that see keys widen the range to compute.
        max_lo[t] = std::max(max_lo[t], a);
        min_hi[t] = std::min(min_hi[t], z);
        if (a < z) {
            min_lo[t] = std::min(min_lo[t], a);
            max_hi[t] = std::max(max_hi[t], z);
        }
    }
    const index_t k_lo = *std::min_element(min_lo, min_lo + n_panels);
    const index_t k_hi = *std::max_element(max_hi, max_hi + n_panels);

    if (k_lo < k_hi) {
        const index_t n_blocks = (k_hi - k_lo + BK - 1) / BK;
        const float* kb0 = p.k.row(rb.b, 0, rb.hk);
        const float* vb0 = p.v.row(rb.b, 0, rb.hk);
        // Last block first: under causal and window masks the partial blocks sit at the ends of
        // the range, and the blocks between them run without per-element mask tests.
        for (index_t bi = n_blocks - 1; bi >= 0; --bi) {
            const index_t j0 = k_lo + bi * BK, j1 = std::min(j0 + BK, k_hi), nk = j1 - j0;
            copy_rows(kb0 + j0 * p.k.sl, p.k.sl, nk, D, D, kp);
            copy_rows(vb0 + j0 * p.v.sl, p.v.sl, nk, Dv, dv_pad, vp);
            const bool v_finite = all_finite<A>(vp, nk * dv_pad);
            for (index_t t = 0; t < n_panels; ++t) {
                if (bi > 0) {
                    const index_t a = t * BK / n_panels, z = (t + 1) * BK / n_panels;
                    prefetch_rows(kb0 + (j0 - BK) * p.k.sl, p.k.sl, a, z, D);
                    prefetch_rows(vb0 + (j0 - BK) * p.v.sl, p.v.sl, a, z, Dv);
                }
                // Only the keys some row of this panel sees: on the causal diagonal this trims
                // the block to the panel's rows instead of computing scores to be masked.
                const index_t jb = std::max(j0, min_lo[t]), je = std::min(j1, max_hi[t]), n = je - jb;
                if (n <= 0) continue;
                const bool masked = !(jb >= max_lo[t] && je <= min_hi[t]);
                V alpha[TT::kNR], block_max[TT::kNR];
                for (auto& x : block_max) x = V(kNegInf);
                scores_panel<A>(kp + (jb - j0) * D, n, qt + t * D * RT, D, st, block_max);
                softmax_panel<A>(st, n, jb, masked, lo + t * RT, hi + t * RT, p.tf, m + t * RT, l + t * RT,
                                 block_max, alpha);
                const float* vpj = vp + (jb - j0) * dv_pad;
                if (masked && !v_finite)
                    values_panel<A, true>(vpj, dv_pad, n, st, alpha, ot + t * dv_pad * RT, jb, lo + t * RT,
                                          hi + t * RT);
                else
                    values_panel<A>(vpj, dv_pad, n, st, alpha, ot + t * dv_pad * RT);
            }
        }
    }

    // Transpose each O^T panel back to rows in 16 x 16 tiles that stay in L1: walking a column
    // of O^T touches a new cache line per element.
    constexpr index_t kTile = 16;
    for (index_t t = 0; t < n_panels; ++t) {
        const index_t r0 = t * RT, nr = std::min(RT, R - r0);
        const float* ot_t = ot + t * dv_pad * RT;
        float inv[RT];
        for (index_t i = 0; i < nr; ++i) inv[i] = row_inv_sum(l[r0 + i]);
        for (index_t c0 = 0; c0 < Dv; c0 += kTile)
            for (index_t i0 = 0; i0 < nr; i0 += kTile)
                for (index_t i = i0; i < std::min(i0 + kTile, nr); ++i)
                    for (index_t c = c0; c < std::min(c0 + kTile, Dv); ++c) orows[i * Dv + c] = ot_t[c * RT + i] * inv[i];
        for (index_t i = 0; i < nr; ++i) emit(r0 + i, orows + i * Dv, row_lse(m[r0 + i], l[r0 + i]));
    }
}

}  // namespace detail
}  // namespace attnkit
