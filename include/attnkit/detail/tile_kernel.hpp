// The tiled forward kernel for one row block (FlashAttention-style): Q^T packed once, then for
// each key block S^T = K Q^T, the policy's row transform (online softmax, Taylor polynomial,
// ...; row_transform.hpp), O^T = alpha O^T + V^T P^T for each value set, all on row panels in
// lanes. The L x L score matrix never exists; extra memory is a few panels per call.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/detail/micro_kernels.hpp"
#include "attnkit/detail/row_transform.hpp"
#include "attnkit/detail/scratch.hpp"

namespace attnkit {
namespace detail {

// emit(set, r, o_row, summary) receives each row of each value set over keys [ks0, ks1),
// scaled by the policy's emit_scale, with the policy's summary (softmax: normalised, lse).
// buf is reused scratch (any contents; resized and cleared here).
template <class A, class Policy, class KVT, class QT, class Emit>
void tile_kernel(const basic_attention_problem<KVT, QT>& p, const Policy& pol, const row_block& rb, index_t ks0,
                 index_t ks1, std::vector<float>& buf, Emit&& emit) {
    using TT = tile_traits<A>;
    using V = simd::vfloat<A>;
    constexpr index_t RT = TT::kTileRows;
    constexpr index_t BK = TT::kBlockKeys;
    constexpr int MR = TT::kMR;  // V tile rows padded to whole micro tiles of columns
    constexpr index_t NS = Policy::kStateArrays;
    const index_t D = p.s.dim, Dv = p.s.dim_v, R = rb.rows(), n_sets = p.n_sets;
    const index_t n_panels = (R + RT - 1) / RT, rows_pad = n_panels * RT;
    const index_t dv_pad = (Dv + MR - 1) / MR * MR;
    const index_t ot_size = rows_pad * dv_pad, vp_size = BK * dv_pad;

    // One allocation per row block: Q^T and (per value set) O^T panels, one S^T panel, K and
    // (per set) V tiles, row state and intervals. K tile: MR spare rows, since a panel's key
    // range may start inside the tile and the scores micro-kernel reads whole groups of MR keys.
    buf.assign(static_cast<std::size_t>(rows_pad * (D + n_sets * dv_pad + NS + 2) + BK * RT + n_sets * vp_size +
                                        (BK + MR) * D + RT * Dv),
               0.0f);
    float* qt = buf.data();
    float* ot = qt + rows_pad * D;
    float* st = ot + n_sets * ot_size;
    float* kp = st + BK * RT;
    float* vp = kp + (BK + MR) * D;
    float* state = vp + n_sets * vp_size;
    float* lo = state + NS * rows_pad;
    float* hi = lo + rows_pad;
    float* orows = hi + rows_pad;
    pol.init(state, rows_pad);  // padded rows keep lo = hi = 0: nothing visible

    // Per panel: the smallest and largest first and last visible key of its rows. A key block is
    // skipped by a panel that sees none of it, and runs without mask tests where all its rows
    // see all of it.
    scratch_lease<index_t> bounds_lease;  // this thread's (scratch.hpp): no allocation per call
    std::vector<index_t>& bounds = bounds_lease.get();
    bounds.resize(static_cast<std::size_t>(4 * n_panels));
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
        pack_q_row(p.q.row(rb.b, rb.pos(r), rb.head(r)), D, p.q_scale, qt + t * D * RT + r % RT, RT);
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
        scratch_lease<char> v_finite_lease;  // per set: its V tile is finite
        std::vector<char>& v_finite = v_finite_lease.get();
        v_finite.assign(static_cast<std::size_t>(n_sets), 0);
        // Last block first: under causal and window masks the partial blocks sit at the ends of
        // the range, and the blocks between them run without per-element mask tests.
        for (index_t bi = n_blocks - 1; bi >= 0; --bi) {
            const index_t j0 = k_lo + bi * BK, j1 = std::min(j0 + BK, k_hi), nk = j1 - j0;
            // K and V rows are read in runs (attention_problem.hpp): one for a strided tensor,
            // one per page of a paged cache.
            // int8 K/V are dequantised here, into the float tiles: each row times its scale.
            p.k.runs(rb.b, j0, nk, rb.hk, [&](const KVT* src, index_t i, index_t n) {
                copy_rows(src, p.k.sl, n, D, D, kp + i * D);
                if constexpr (simd::kIsScaledStorage<KVT>)
                    scale_rows(p.k_scale.row(rb.b, j0 + i, rb.hk), p.k_scale.sl, n, D, D, kp + i * D);
            });
            for (index_t set = 0; set < n_sets; ++set) {
                float* vps = vp + set * vp_size;
                p.v.runs(rb.b, j0, nk, rb.hk, [&](const KVT* src, index_t i, index_t n) {
                    copy_rows(src + set * p.v_set_stride, p.v.sl, n, Dv, dv_pad, vps + i * dv_pad);
                    if constexpr (simd::kIsScaledStorage<KVT>)
                        scale_rows(p.v_scale.row(rb.b, j0 + i, rb.hk), p.v_scale.sl, n, Dv, dv_pad, vps + i * dv_pad);
                });
                v_finite[static_cast<std::size_t>(set)] = all_finite<A>(vps, nk * dv_pad);
            }
            for (index_t t = 0; t < n_panels; ++t) {
                if (bi > 0) {
                    const index_t a = t * BK / n_panels, z = (t + 1) * BK / n_panels;
                    p.k.runs(rb.b, j0 - BK + a, z - a, rb.hk, [&](const KVT* src, index_t, index_t n) {
                        prefetch_rows(src, p.k.sl, 0, n, D);
                    });
                    for (index_t set = 0; set < n_sets; ++set)
                        p.v.runs(rb.b, j0 - BK + a, z - a, rb.hk, [&](const KVT* src, index_t, index_t n) {
                            prefetch_rows(src + set * p.v_set_stride, p.v.sl, 0, n, Dv);
                        });
                }
                // Only the keys some row of this panel sees: on the causal diagonal this trims
                // the block to the panel's rows instead of computing scores to be masked.
                const index_t jb = std::max(j0, min_lo[t]), je = std::min(j1, max_hi[t]), n = je - jb;
                if (n <= 0) continue;
                const bool masked = !(jb >= max_lo[t] && je <= min_hi[t]);
                V alpha[TT::kNR], block_max[TT::kNR];
                for (auto& x : block_max) x = V(kNegInf);
                scores_panel<A>(kp + (jb - j0) * D, n, qt + t * D * RT, D, st, block_max);
                pol.template transform<A>(st, n, jb, masked, lo + t * RT, hi + t * RT, state + t * RT, rows_pad,
                                          block_max, alpha);
                for (index_t set = 0; set < n_sets; ++set) {
                    const float* vpj = vp + set * vp_size + (jb - j0) * dv_pad;
                    float* ot_t = ot + set * ot_size + t * dv_pad * RT;
                    if (masked && !v_finite[static_cast<std::size_t>(set)])
                        values_panel<A, true>(vpj, dv_pad, n, st, alpha, ot_t, jb, lo + t * RT, hi + t * RT, Dv);
                    else
                        values_panel<A>(vpj, dv_pad, n, st, alpha, ot_t, 0, nullptr, nullptr, Dv);
                }
            }
        }
    }

    // Transpose each O^T panel back to rows in 16 x 16 tiles that stay in L1: walking a column
    // of O^T touches a new cache line per element.
    constexpr index_t kTile = 16;
    for (index_t t = 0; t < n_panels; ++t) {
        const index_t r0 = t * RT, nr = std::min(RT, R - r0);
        float scale[RT], summary[RT];
        for (index_t i = 0; i < nr; ++i) {
            scale[i] = pol.emit_scale(state + r0 + i, rows_pad);
            summary[i] = pol.summary(state + r0 + i, rows_pad);
        }
        for (index_t set = 0; set < n_sets; ++set) {
            const float* ot_t = ot + set * ot_size + t * dv_pad * RT;
            for (index_t c0 = 0; c0 < Dv; c0 += kTile)
                for (index_t i0 = 0; i0 < nr; i0 += kTile)
                    for (index_t i = i0; i < std::min(i0 + kTile, nr); ++i)
                        for (index_t c = c0; c < std::min(c0 + kTile, Dv); ++c)
                            orows[i * Dv + c] = ot_t[c * RT + i] * scale[i];
            for (index_t i = 0; i < nr; ++i) emit(set, r0 + i, orows + i * Dv, summary[i]);
        }
    }
}

}  // namespace detail
}  // namespace attnkit
