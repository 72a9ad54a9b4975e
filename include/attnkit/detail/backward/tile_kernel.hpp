// The backward tile kernel (FlashAttention-2's algorithm on attnkit's micro-kernels): for one
// batch item and key/value head, all its query heads, the gradients of q, k and v without an
// L x L matrix. For each key block J (kBlockKeys keys) and each query block I whose rows see it:
//   S   = Q_I K_J^T           scores_panel  (query rows broadcast, keys in lanes)
//   dP  = dO_I V_J^T          scores_panel
//   P, dS                     the gradient row policy (grad_rows.hpp) from two per-row statistics
//                             the caller prepares (softmax: the forward's lse and <dO, O>)
//   dV_J^T += dO_I^T P        values_panel  (a reduction over the block's query rows)
//   dK_J^T += Q_I^T dS        values_panel
//   dQ_I   += dS K_J          the GEMM's macro-kernel (detail/gemm/): dS of the block is kept
//                             row-major [rows][keys], which is already the GEMM's packed A
//                             layout, and K_J is packed as its B once per key block
// K_J's gradients are complete after its query blocks and are written then; dQ of the item's
// rows accumulates in scratch, row-major, and is written last.
//
// Partition (bitwise identical results for any thread count, no atomics): a work item is a
// (batch, key/value head) pair with all G query heads sharing it. Every gradient element then has
// exactly one owner: d_k and d_v of that head, and d_q of its G query heads, so nothing is
// reduced across threads and each element is the same chain of FMAs whatever the pool.
// FlashAttention-2 instead parallelises over key blocks and adds dQ with atomics (or a second
// pass); with B * Hk items there is enough parallelism at the shapes training runs, and the
// alternative's second pass would recompute S and dP (7 products instead of 5).
//
// Memory beyond inputs and gradients: per running item the query side packed once (Q and dO
// rows, dQ accumulators: 3 Lq G max(D, Dv) floats) and one key block's tiles; O(L D).
//
// Value sets (attention_problem::n_sets, static QK: one fixed Q/K map for every batch item's V):
// set t is batch item b + t of d_out, V (at v + t * v_set_stride) and d_v. The sets' values are
// packed side by side as one value row of n_sets Dv columns, so dP = sum_t dO_t V_t^T is one
// scores product and dV^T += dO^T P one values product for all sets: with the statistics
// summed over the sets (D_r = sum_t <dO_t,r, O_t,r>), P, dS, dK and dQ are those of the map,
// computed once.
#pragma once

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/detail/backward/grad_rows.hpp"
#include "attnkit/detail/gemm/kernel.hpp"
#include "attnkit/detail/gemm/pack.hpp"
#include "attnkit/detail/micro_kernels.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {
namespace backward {

template <class A>
struct tiles {
    static constexpr index_t kLanes = tile_traits<A>::kLanes;
    static constexpr index_t kTileRows = tile_traits<A>::kTileRows;  // keys per tile (in lanes)
    static constexpr int kMR = tile_traits<A>::kMR;
    // Query rows per block: a multiple of both kMR (the broadcast rows of scores_panel) and
    // kTileRows (the dQ^T panels); 96 rows of S, P and dP per key tile stay in L1.
    static constexpr index_t kBlockRows = 96;
    // Keys per block: the dK^T and dV^T accumulators of a block ((D + Dv) x 64 floats) stay in
    // L1/L2 while the query blocks stream past them.
    static constexpr index_t kBlockKeys = 64;
    static_assert(kBlockRows % kMR == 0 && kBlockRows % kTileRows == 0, "query block must hold whole tiles");
    static_assert(kBlockKeys % kTileRows == 0, "key block must hold whole tiles");
};

// What the kernel writes: float gradients in caller memory.
struct gradient_outputs {
    view<float, 4> d_q, d_k, d_v;
    float dk_scale = 1.0f;  // dK = dk_scale * sum dS Q_packed (Q_packed carries q_scale)
    float dq_scale = 1.0f;  // dQ = dq_scale * sum dS K
};

// Per-row inputs of the item's rows (position-major, G query heads per position), prepared by
// the caller: the policy's two statistics and the visible key interval.
struct row_stats {
    const float* a = nullptr;
    const float* b = nullptr;
};

// Whether every element of rows [0, n) x [0, cols) is finite.
template <class A>
inline bool rows_finite(const float* x, index_t n, index_t ld) {
    return all_finite<A>(x, n * ld);
}

// The gradient contributions of one tile the slow, explicit way: only (row, key) pairs the row
// sees. Used where a masked tile meets non-finite values (0 * Inf = NaN would carry them into
// rows or keys that never see them); p and ds of masked pairs are 0 already.
template <class A>
void guarded_tile_updates(const float* qrows, index_t ldq, const float* dorows, index_t ldo, const float* p,
                          const float* ds, index_t n_rows, index_t key0, index_t n_keys, const index_t* lo,
                          const index_t* hi, index_t dim, index_t dim_v, float* dkt, float* dvt) {
    constexpr index_t RT = tile_traits<A>::kTileRows;
    for (index_t r = 0; r < n_rows; ++r)
        for (index_t u = 0; u < n_keys; ++u) {
            const index_t j = key0 + u;
            if (j < lo[r] || j >= hi[r]) continue;
            const float pv = p[r * RT + u], dsv = ds[r * RT + u];
            for (index_t c = 0; c < dim_v; ++c) dvt[c * RT + u] += dorows[r * ldo + c] * pv;
            for (index_t d = 0; d < dim; ++d) dkt[d * RT + u] += qrows[r * ldq + d] * dsv;
        }
}

template <class A>
void guarded_dq_updates(const float* krows, index_t ldk, const float* ds, index_t lds, index_t n_rows,
                        index_t n_keys, index_t key0, const index_t* lo, const index_t* hi, index_t dim, float* dq) {
    for (index_t r = 0; r < n_rows; ++r)
        for (index_t u = 0; u < n_keys; ++u) {
            const index_t j = key0 + u;
            if (j < lo[r] || j >= hi[r]) continue;
            const float dsv = ds[r * lds + u];
            for (index_t d = 0; d < dim; ++d) dq[r * dim + d] += krows[u * ldk + d] * dsv;
        }
}

// The key block's tiles hold keys in lanes (the GEMM's B panels' layout, detail/gemm/pack.hpp
// rows_into_tiles, which packs them). Moving dK / dV rows out of that layout one float at a time
// is a strided scalar access per element; W keys x W columns at a time it is W loads,
// simd::transpose and W row stores. RT is a whole number of vectors, so a group of W keys never
// straddles two tiles.

// The inverse: row(u)[c] = scale x element (u, col0 + c) of the tile, u < n, c < cols.
template <class A, class RowOf>
void tile_into_rows(const float* tile, index_t tile_cols, index_t col0, index_t n, index_t cols, float scale,
                    RowOf&& row) {
    constexpr index_t W = simd::kLanes<A>, RT = tile_traits<A>::kTileRows;
    index_t u = 0;
    if constexpr (W > 1) {
        const simd::vfloat<A> sv(scale);
        for (; u + W <= n; u += W) {
            const float* t = tile + (u / RT) * tile_cols * RT + u % RT;
            index_t c = 0;
            for (; c + W <= cols; c += W) {
                simd::vfloat<A> sq[W];
                ATTNKIT_UNROLL for (index_t e = 0; e < W; ++e) sq[e] = simd::loadu<A>(t + (col0 + c + e) * RT);
                simd::transpose(sq);
                ATTNKIT_UNROLL for (index_t r = 0; r < W; ++r) simd::storeu(row(u + r) + c, sq[r] * sv);
            }
            for (; c < cols; ++c)
                for (index_t r = 0; r < W; ++r) row(u + r)[c] = t[(col0 + c) * RT + r] * scale;
        }
    }
    for (; u < n; ++u) {
        const float* t = tile + (u / RT) * tile_cols * RT + u % RT;
        float* out = row(u);
        for (index_t c = 0; c < cols; ++c) out[c] = t[(col0 + c) * RT] * scale;
    }
}

// One work item: batch b, key/value head hk, all rows of its G query heads. stats and the
// intervals are per row of the item (n_rows = Lq G, padded to kBlockRows with empty intervals).
// d_out rows are read through dout (float, [B, Lq, H, Dv] strides).
template <class A, class Policy, class KVT, class QT>
ATTNKIT_NOINLINE void backward_item(const basic_attention_problem<KVT, QT>& p, const Policy& pol, index_t b, index_t hk,
                   const strided_rows_t<float>& dout, const row_stats& st, const index_t* lo, const index_t* hi,
                   const gradient_outputs& go, std::vector<float>& buf) {
    using TL = tiles<A>;
    constexpr index_t RT = TL::kTileRows;
    constexpr index_t RB = TL::kBlockRows;
    constexpr index_t BK = TL::kBlockKeys;
    constexpr int MR = TL::kMR;
    const attention_shape& s = p.s;
    const index_t NS = p.n_sets, Dv1 = s.dim_v;  // value sets, each of Dv1 columns
    const index_t G = s.group(), D = s.dim, Dv = Dv1 * NS, Lk = s.len_k;
    const index_t n_rows = s.len_q * G, rows_pad = (n_rows + RB - 1) / RB * RB;
    const index_t d_pad = (D + MR - 1) / MR * MR, dv_pad = (Dv + MR - 1) / MR * MR;
    const index_t n_kt = BK / RT;  // key tiles per block

    // Scratch: query side (Q rows, dO rows, dQ rows), one key block (K^T and V^T tiles, K rows
    // and K packed as the GEMM's B, dK^T and dV^T), one query block's S and dP per key tile and
    // its dS [RB][BK] over the whole key block.
    using GT = gemm_traits<A>;
    static_assert(TL::kBlockRows % GT::kMR == 0, "dS rows must fill whole GEMM micro-panels");
    const index_t q_size = rows_pad * d_pad, do_size = rows_pad * dv_pad, dq_size = rows_pad * D;
    const index_t kt_size = BK * D, vt_size = BK * Dv, kr_size = (BK + MR) * d_pad;
    const index_t kb_size = BK * ((D + GT::kNR - 1) / GT::kNR * GT::kNR);
    const index_t dkt_size = BK * d_pad, dvt_size = BK * dv_pad;
    const index_t s_size = RB * RT, ds_size = RB * BK;
    buf.assign(static_cast<std::size_t>(q_size + do_size + dq_size + kt_size + vt_size + kr_size + kb_size +
                                        dkt_size + dvt_size + 2 * s_size + ds_size),
               0.0f);
    float* qrows = buf.data();
    float* dorows = qrows + q_size;
    float* dq = dorows + do_size;
    float* kt = dq + dq_size;
    float* vt = kt + kt_size;
    float* krows = vt + vt_size;
    float* dkt = krows + kr_size;
    float* dvt = dkt + dkt_size;
    float* sc = dvt + dvt_size;
    float* dp = sc + s_size;
    float* dsb = dp + s_size;
    float* kb = dsb + ds_size;

    // Pack the query side once: Q rows scaled as the forward packs them, dO rows.
    for (index_t r = 0; r < n_rows; ++r) {
        const index_t pos = r / G, h = hk * G + r % G;
        const QT* qr = p.q.row(b, pos, h);
        for (index_t d = 0; d < D; ++d) qrows[r * d_pad + d] = simd::to_float(qr[d]) * p.q_scale;
        for (index_t t = 0; t < NS; ++t) std::copy_n(dout.row(b + t, pos, h), Dv1, dorows + r * dv_pad + t * Dv1);
    }
    // Per query block: the keys its rows see, and whether its Q and dO rows are finite.
    const index_t n_qb = rows_pad / RB;
    std::vector<index_t> qb_lo(static_cast<std::size_t>(n_qb)), qb_hi(static_cast<std::size_t>(n_qb));
    std::vector<index_t> qb_max_lo(static_cast<std::size_t>(n_qb)), qb_min_hi(static_cast<std::size_t>(n_qb));
    std::vector<char> qb_finite(static_cast<std::size_t>(n_qb));
    index_t k_lo = Lk, k_hi = 0;
    for (index_t qb = 0; qb < n_qb; ++qb) {
        index_t a = Lk, z = 0, max_lo = 0, min_hi = Lk;
        for (index_t r = qb * RB; r < (qb + 1) * RB; ++r) {
            max_lo = std::max(max_lo, lo[r]);
            min_hi = std::min(min_hi, hi[r]);
            if (lo[r] < hi[r]) {
                a = std::min(a, lo[r]);
                z = std::max(z, hi[r]);
            }
        }
        qb_lo[qb] = a;
        qb_hi[qb] = z;
        qb_max_lo[qb] = max_lo;
        qb_min_hi[qb] = min_hi;
        qb_finite[qb] = rows_finite<A>(qrows + qb * RB * d_pad, RB, d_pad) &&
                        rows_finite<A>(dorows + qb * RB * dv_pad, RB, dv_pad);
        if (a < z) {
            k_lo = std::min(k_lo, a);
            k_hi = std::max(k_hi, z);
        }
    }

    const KVT* kb0 = p.k.row(b, 0, hk);
    const KVT* vb0 = p.v.row(b, 0, hk);
    simd::vfloat<A> ones[tile_traits<A>::kNR], mx[tile_traits<A>::kNR];
    for (auto& o : ones) o = simd::vfloat<A>(1.0f);

    // Keys nobody sees get zero gradients.
    auto write_zero_keys = [&](index_t j0, index_t j1) {
        for (index_t j = j0; j < j1; ++j) {
            std::fill_n(go.d_k.ptr(b, j, hk), D, 0.0f);
            for (index_t t = 0; t < NS; ++t) std::fill_n(go.d_v.ptr(b + t, j, hk), Dv1, 0.0f);
        }
    };
    const index_t blk0 = k_lo < k_hi ? k_lo / BK * BK : Lk;
    write_zero_keys(0, std::min(blk0, Lk));

    for (index_t j0 = blk0; j0 < k_hi; j0 += BK) {
        const index_t nk = std::min(BK, Lk - j0);
        // Pack the key block: K^T and V^T tiles (keys in lanes) and K rows; zero the padding.
        std::fill(kt, kt + kt_size + vt_size + kr_size + dkt_size + dvt_size, 0.0f);
        rows_into_tiles<A, RT>(kb0 + j0 * p.k.sl, p.k.sl, nk, D, kt, D, 0, krows, d_pad);
        for (index_t t = 0; t < NS; ++t)  // value set t: columns [t Dv1, (t + 1) Dv1) of the V tile
            rows_into_tiles<A, RT>(vb0 + j0 * p.v.sl + t * p.v_set_stride, p.v.sl, nk, Dv1, vt, Dv, t * Dv1);
        const bool k_finite = all_finite<A>(krows, nk * d_pad) && all_finite<A>(vt, n_kt * Dv * RT);
        gemm_pack_b<GT::kNR>(krows, d_pad, BK, D, kb);

        for (index_t qb = 0; qb < n_qb; ++qb) {
            if (qb_lo[qb] >= std::min(j0 + nk, qb_hi[qb]) || qb_hi[qb] <= j0) continue;
            const float* qi = qrows + qb * RB * d_pad;
            const float* doi = dorows + qb * RB * dv_pad;
            const index_t* loi = lo + qb * RB;
            const index_t* hii = hi + qb * RB;
            const bool finite = qb_finite[qb] && k_finite;
            // Per key tile only the rows of the block that see one of its keys, rounded out to
            // whole register tiles ([r0, r1)): on the causal diagonal the rows above it would
            // compute scores only to mask them (4-5% of the products at L = 2048 with 96-row
            // blocks). dS of the other rows is 0 for the dQ product, which runs over the
            // union of the tiles' rows [q0, q1).
            index_t q0 = RB, q1 = 0;
            for (index_t u = 0; u < n_kt; ++u) {
                const index_t ju = j0 + u * RT, ju_end = std::min(ju + RT, j0 + nk);
                index_t r0 = RB, r1 = 0;
                if (ju < ju_end)
                    for (index_t r = 0; r < RB; ++r)
                        if (loi[r] < ju_end && hii[r] > ju && loi[r] < hii[r]) {
                            r0 = std::min(r0, r);
                            r1 = r + 1;
                        }
                if (r0 < r1) {
                    r0 = r0 / MR * MR;
                    r1 = (r1 + MR - 1) / MR * MR;
                } else {
                    r0 = r1 = RB;
                }
                for (index_t r = 0; r < r0; ++r) std::fill_n(dsb + r * BK + u * RT, RT, 0.0f);
                for (index_t r = r1; r < RB; ++r) std::fill_n(dsb + r * BK + u * RT, RT, 0.0f);
                if (r0 == r1) continue;
                q0 = std::min(q0, r0);
                q1 = std::max(q1, r1);
                const index_t n = r1 - r0;
                index_t max_lo = 0, min_hi = Lk;
                for (index_t r = r0; r < r1; ++r) {
                    max_lo = std::max(max_lo, loi[r]);
                    min_hi = std::min(min_hi, hii[r]);
                }
                const bool masked = !(ju >= max_lo && ju + RT <= min_hi);
                const float* qr = qi + r0 * d_pad;
                const float* dor = doi + r0 * dv_pad;
                scores_panel<A>(qr, n, kt + u * D * RT, D, sc, mx, d_pad);
                scores_panel<A>(dor, n, vt + u * Dv * RT, Dv, dp, mx, dv_pad);
                pol.template grads<A>(sc, dp, n, ju, masked, loi + r0, hii + r0, st.a + qb * RB + r0,
                                      st.b + qb * RB + r0);
                float* dkt_u = dkt + u * d_pad * RT;
                float* dvt_u = dvt + u * dv_pad * RT;
                if (masked && !finite) {
                    guarded_tile_updates<A>(qr, d_pad, dor, dv_pad, sc, dp, n, ju, RT, loi + r0, hii + r0, D, Dv,
                                            dkt_u, dvt_u);
                } else {
                    values_panel<A>(dor, dv_pad, n, sc, ones, dvt_u, 0, nullptr, nullptr, Dv);
                    values_panel<A>(qr, d_pad, n, dp, ones, dkt_u, 0, nullptr, nullptr, D);
                }
                for (index_t r = 0; r < n; ++r) std::copy_n(dp + r * RT, RT, dsb + (r0 + r) * BK + u * RT);
            }
            if (q0 >= q1) continue;
            float* dq_i = dq + qb * RB * D;
            if (!finite && !(j0 >= qb_max_lo[qb] && j0 + BK <= qb_min_hi[qb]))
                guarded_dq_updates<A>(krows, d_pad, dsb, BK, RB, nk, j0, loi, hii, D, dq_i);
            else
                gemm_macro<A>(dsb + q0 * BK, kb, q1 - q0, D, BK, dq_i + q0 * D, D, false);
        }
        // The block's dK and dV are complete.
        tile_into_rows<A>(dkt, d_pad, 0, nk, D, go.dk_scale, [&](index_t u) { return go.d_k.ptr(b, j0 + u, hk); });
        for (index_t t = 0; t < NS; ++t)
            tile_into_rows<A>(dvt, dv_pad, t * Dv1, nk, Dv1, 1.0f,
                              [&](index_t u) { return go.d_v.ptr(b + t, j0 + u, hk); });
    }
    write_zero_keys(std::max(blk0, std::min(Lk, (k_hi + BK - 1) / BK * BK)), Lk);

    for (index_t r = 0; r < n_rows; ++r) {
        float* dqr = go.d_q.ptr(b, r / G, hk * G + r % G);
        for (index_t d = 0; d < D; ++d) dqr[d] = dq[r * D + d] * go.dq_scale;
    }
}

// The backward of one call: every (batch, key/value head) item over the pool. stats(b, hk, a, bs)
// writes the policy's two statistics of the item's rows (position-major, G heads per position;
// a and bs hold Lq G floats). Rows past Lq G pad the last query block: no visible key,
// a = Policy::empty_row_a(), b = 0.
template <class A, class Policy, class KVT, class QT, class Stats>
void attention_backward(const basic_attention_problem<KVT, QT>& p, const Policy& pol, const strided_rows_t<float>& dout,
                        Stats&& stats, const gradient_outputs& go, thread_pool* pool) {
    const attention_shape& s = p.s;
    if (s.batch == 0) return;
    const index_t G = s.group(), n_rows = s.len_q * G;
    const index_t rows_pad = (n_rows + tiles<A>::kBlockRows - 1) / tiles<A>::kBlockRows * tiles<A>::kBlockRows;
    parallel_for(pool, s.batch * s.heads_k, [&](index_t it) {
        const index_t b = it / s.heads_k, hk = it % s.heads_k;
        if (s.len_k == 0) {  // no keys: every row sees nothing
            for (index_t i = 0; i < s.len_q; ++i)
                for (index_t g = 0; g < G; ++g) std::fill_n(go.d_q.ptr(b, i, hk * G + g), s.dim, 0.0f);
            return;
        }
        std::vector<float> a(static_cast<std::size_t>(rows_pad), Policy::empty_row_a());
        std::vector<float> bs(static_cast<std::size_t>(rows_pad), 0.0f);
        std::vector<index_t> lo(static_cast<std::size_t>(rows_pad), 0), hi(static_cast<std::size_t>(rows_pad), 0);
        const mask_params mp = p.mask(b);
        for (index_t r = 0; r < n_rows; ++r) row_interval(mp, r / G, 0, s.len_k, lo[r], hi[r]);
        stats(b, hk, a.data(), bs.data());
        scratch_lease<> buf;
        backward_item<A>(p, pol, b, hk, dout, row_stats{a.data(), bs.data()}, lo.data(), hi.data(), go, buf.get());
    });
}

#ifdef ATTNKIT_KERNEL_INSTANCE  // compiled kernels (config.hpp): softmax's backward item
#define ATTNKIT_SOFTMAX_BACKWARD_INSTANCE(KVT, QT)                                                             \
    ATTNKIT_KERNEL_INSTANCE void backward_item<simd::default_arch, softmax_grad_rows, KVT, QT>(                 \
        const basic_attention_problem<KVT, QT>&, const softmax_grad_rows&, index_t, index_t,                   \
        const strided_rows_t<float>&, const row_stats&, const index_t*, const index_t*, const gradient_outputs&, \
        std::vector<float>&);
ATTNKIT_SOFTMAX_BACKWARD_INSTANCE(float, float)
ATTNKIT_SOFTMAX_BACKWARD_INSTANCE(Eigen::bfloat16, Eigen::bfloat16)
ATTNKIT_SOFTMAX_BACKWARD_INSTANCE(Eigen::half, Eigen::half)
#undef ATTNKIT_SOFTMAX_BACKWARD_INSTANCE
#endif

}  // namespace backward
}  // namespace detail
}  // namespace attnkit
