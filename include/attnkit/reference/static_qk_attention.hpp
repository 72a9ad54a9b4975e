// attnkit::reference::static_qk_attention: the naive oracle of static QK attention (RndEmbQK /
// FixedSeqQK, docs/variants.md section 4).
//
// Plain loops, double accumulation, the [H, L, L] weight matrix materialised; nothing shared with
// the fast kernels except the views and the argument checks (detail/static_qk/check.hpp).
//
// q_fixed [1, Lmax, H, D] and k_fixed [1, Lmax, Hk, D] come from a fixed stream, v [B, L, Hk, Dv]
// with L <= Lmax, out [B, L, H, Dv]. Always causal, and aligned top-left: query i of every batch
// item uses row i of the top-left L x L block of the stream's scores, so with kvh = h / (H / Hk)
//   s_ij  = scale * <q_fixed[0, i, h], k_fixed[0, j, kvh]>      j <= i   (scale: 1/sqrt(D) if 0)
//   a_ij  = exp(s_ij - max_j' s_ij') / sum_j' exp(s_ij' - max)   j, j' <= i
//   out[b, i, h] = sum_{j <= i} a_ij v[b, j, kvh]
// The weights do not depend on b, nor on L beyond which rows exist (row i never sees j > i).
// NaN or Inf in the inputs propagate to the rows that see them.
#pragma once

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "attnkit/eigen.hpp"

#include "attnkit/config.hpp"
#include "attnkit/detail/static_qk/check.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace static_qk_impl {

using weights3 = Eigen::Tensor<double, 3, Eigen::RowMajor>;

template <class TQ, class TK, class TV, class TO>
void run(const view<const TQ, 4>& qf, const view<const TK, 4>& kf, const view<const TV, 4>& v, const view<TO, 4>& out,
         weights3* weights, const static_qk_options& opts) {
    namespace sq = attnkit::detail::static_qk;
    const sq::stream_shape st = sq::check_stream(qf, kf);
    const sq::values_shape s = sq::check_values(v, out, st.max_len, st.heads, st.heads_k, false);
    sq::check_options(opts);
    sq::check_apart(qf, kf, v, out);

    const index_t B = s.batch, L = s.len, H = st.heads, D = st.dim, Dv = s.dim_v, G = st.group();
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(opts.scale, D));

    // The weights of every head, materialised (upper triangle 0).
    weights3 a(H, L, L);
    a.setZero();
    std::vector<double> score(static_cast<std::size_t>(L));
    for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < L; ++i) {
            double m = -std::numeric_limits<double>::infinity();
            for (index_t j = 0; j <= i; ++j) {
                double dot = 0.0;
                for (index_t d = 0; d < D; ++d)
                    dot += static_cast<double>(qf(0, i, h, d)) * static_cast<double>(kf(0, j, h / G, d));
                score[j] = scale * dot;
                if (score[j] > m) m = score[j];
            }
            double z = 0.0;
            for (index_t j = 0; j <= i; ++j) z += std::exp(score[j] - m);
            for (index_t j = 0; j <= i; ++j) a(h, i, j) = std::exp(score[j] - m) / z;
        }

    std::vector<double> acc(static_cast<std::size_t>(Dv));
    for (index_t b = 0; b < B; ++b)
        for (index_t i = 0; i < L; ++i)
            for (index_t h = 0; h < H; ++h) {
                for (auto& x : acc) x = 0.0;
                for (index_t j = 0; j <= i; ++j)
                    for (index_t c = 0; c < Dv; ++c) acc[c] += a(h, i, j) * static_cast<double>(v(b, j, h / G, c));
                for (index_t c = 0; c < Dv; ++c) out(b, i, h, c) = static_cast<TO>(acc[c]);
            }
    if (weights) *weights = std::move(a);
}

}  // namespace static_qk_impl

// out [B, L, H, Dv] = the fixed causal attention of the stream (q_fixed, k_fixed) applied to v.
// Arguments: attnkit::view, row-major Eigen::Tensor or TensorMap, of float or double.
template <class QF, class KF, class V, class O>
void static_qk_attention(const QF& q_fixed, const KF& k_fixed, const V& v, O&& out,
                         const static_qk_options& opts = {}) {
    namespace sq = attnkit::detail::static_qk;
    static_qk_impl::run(sq::q_fixed_view(q_fixed), sq::k_fixed_view(k_fixed), sq::v_view(v),
                        sq::out_view(std::forward<O>(out)), nullptr, opts);
}

// Also returns the weights [H, L, L] (resized here): row i of head h holds a_ij for j <= i and 0
// above the diagonal; every row sums to 1.
template <class QF, class KF, class V, class O>
void static_qk_attention(const QF& q_fixed, const KF& k_fixed, const V& v, O&& out,
                         Eigen::Tensor<double, 3, Eigen::RowMajor>& weights, const static_qk_options& opts = {}) {
    namespace sq = attnkit::detail::static_qk;
    static_qk_impl::run(sq::q_fixed_view(q_fixed), sq::k_fixed_view(k_fixed), sq::v_view(v),
                        sq::out_view(std::forward<O>(out)), &weights, opts);
}

}  // namespace reference
}  // namespace attnkit
