// Building a static attention map from the fixed stream: per (head, panel of kTileRows query
// rows), the scores S^T = K Q^T come from the engine's scores micro-kernel (micro_kernels.hpp,
// rows in lanes), then a stable softmax over each whole causal row (the exact row max first, so
// scores of 1e4 stay finite), written as packed lower-triangular rows of probabilities:
// row i of head h at h * Lmax (Lmax + 1) / 2 + i (i + 1) / 2, i + 1 floats.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/micro_kernels.hpp"
#include "attnkit/detail/online_softmax.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/detail/static_qk/check.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {
namespace static_qk {

inline index_t packed_size(index_t max_len) { return max_len * (max_len + 1) / 2; }
inline index_t packed_row(index_t i) { return i * (i + 1) / 2; }

// Fills p (H * packed_size(Lmax) floats). Work items are (head, panel), last panels (the longest
// rows) first; each row is computed by exactly one item, so any pool gives the same bits.
template <class A>
void build_map(const view<const float, 4>& qf, const view<const float, 4>& kf, const stream_shape& s, float scale,
               float* p, thread_pool* pool) {
    using TT = tile_traits<A>;
    using V = simd::vfloat<A>;
    constexpr index_t RT = TT::kTileRows;
    constexpr index_t W = TT::kLanes;
    constexpr int NR = TT::kNR;
    constexpr int MR = TT::kMR;
    const index_t Lmax = s.max_len, D = s.dim, G = s.group();
    if (Lmax == 0) return;

    // Each key head once as a dense [Lmax + MR][D] copy: the micro-kernel reads K rows D floats
    // apart, in whole groups of MR keys (the spare rows are zeros, computed and never used).
    const index_t k_rows = Lmax + MR;
    std::vector<float> kd(static_cast<std::size_t>(s.heads_k * k_rows * D), 0.0f);
    for (index_t hk = 0; hk < s.heads_k; ++hk) copy_rows(kf.ptr(0, 0, hk), kf.strides[1], Lmax, D, D, kd.data() + hk * k_rows * D);

    const index_t n_panels = (Lmax + RT - 1) / RT;
    const float q_scale = scale * simd::kLog2e;  // scores in log2 units: one exp2 per score
    const index_t tri = packed_size(Lmax);
    alignas(64) float iota[RT];
    for (index_t r = 0; r < RT; ++r) iota[r] = static_cast<float>(r);

    parallel_for(pool, s.heads * n_panels, [&](index_t it) {
        const index_t t = n_panels - 1 - it / s.heads, h = it % s.heads;
        const index_t i0 = t * RT, nr = std::min(RT, Lmax - i0), i_end = i0 + nr;
        scratch_lease<> lease;
        std::vector<float>& buf = lease.get();
        buf.assign(static_cast<std::size_t>(D * RT + (i_end + MR) * RT), 0.0f);
        float* qt = buf.data();
        float* st = qt + D * RT;
        for (index_t r = 0; r < nr; ++r) {
            const float* q = qf.ptr(0, i0 + r, h);
            for (index_t d = 0; d < D; ++d) qt[d * RT + r] = q[d] * q_scale;
        }
        const float* kp = kd.data() + (h / G) * k_rows * D;

        // Keys [0, i0] are visible to every row of the panel: their max comes from registers.
        // Keys (i0, i_end) are the diagonal, masked per row below.
        V mx[NR];
        for (auto& x : mx) x = V(kNegInf);
        scores_panel<A>(kp, i0 + 1, qt, D, st, mx);
        if (i_end > i0 + 1) {
            V unused[NR];
            scores_panel<A>(kp + (i0 + 1) * D, i_end - i0 - 1, qt, D, st + (i0 + 1) * RT, unused);
        }
        float inv[RT];
        for (int n = 0; n < NR; ++n) {
            float* sn = st + n * W;
            const V rel = simd::loadu<A>(iota + n * W);  // row offsets r within the panel
            V m = mx[n];
            for (index_t j = i0 + 1; j < i_end; ++j) {
                const V x = simd::select(V(static_cast<float>(j - i0)) > rel, V(kNegInf), simd::loadu<A>(sn + j * RT));
                simd::storeu(sn + j * RT, x);
                m = simd::max(x, m);
            }
            const V mu = simd::select(m == V(kNegInf), V(0.0f), m);
            V sum(0.0f);
            for (index_t j = 0; j < i_end; ++j) {
                const V e = simd::exp2_nonpositive(simd::loadu<A>(sn + j * RT) - mu);
                simd::storeu(sn + j * RT, e);
                sum += e;
            }
            simd::storeu(inv + n * W, V(1.0f) / sum);
        }
        // Rows out of the lanes, key by key: each S^T line is read once, front to back, and
        // scattered to the nr packed rows (nr write streams); key j goes to the rows r >= j - i0.
        float* dst[RT];
        for (index_t r = 0; r < nr; ++r) dst[r] = p + h * tri + packed_row(i0 + r);
        for (index_t j = 0; j < i_end; ++j) {
            const float* sj = st + j * RT;
            for (index_t r = std::max<index_t>(0, j - i0); r < nr; ++r) dst[r][j] = sj[r] * inv[r];
        }
    });
}

}  // namespace static_qk
}  // namespace detail
}  // namespace attnkit
