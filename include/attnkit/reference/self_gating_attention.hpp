// attnkit::reference::self_gating_attention: the naive oracle of self-gating ("Non-approximate")
// attention (docs/variants.md section 3).
//
// Plain loops in double; the L x L matrix of each (batch item, head) is materialised exactly as
// the paper writes it: row i holds the gates g masked to the keys row i sees, then a stable
// softmax per row. Nothing is shared with the fast kernel except the views and the argument
// checks (attnkit/detail/self_gating/check.hpp). It exists to be obviously right, not fast.
//
// Semantics, per batch b, query head h, row i, with kvh = h / (H / Hk):
//   g_j     = scale * <q[b,j,h], k[b,j,kvh]>      scale = opts.scale, or 1/sqrt(D) when 0
//   key j is visible to row i iff  j < key_lengths[b] (when set)  and  j <= i (when causal)
//   A_ij    = g_j for visible j, -inf otherwise
//   w_ij    = exp(A_ij - max_j A_ij) / sum_j exp(A_ij - max_j A_ij)
//   out_i   = sum_j w_ij v[b,j,kvh]
// A row with no visible key outputs zeros (and a zero weight row), never NaN. Lq must equal Lk.
// The scale actually used is detail::resolve_scale(opts.scale, D) (a float), widened to double.
#pragma once

#include <cmath>
#include <type_traits>
#include <limits>
#include <utility>
#include <vector>

#include "attnkit/eigen.hpp"

#include "attnkit/config.hpp"
#include "attnkit/detail/self_gating/check.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace self_gating_impl {

template <class TQ, class TK, class TV, class TO, class TL = double>
void run(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v, const view<TO, 4>& out,
         Eigen::Tensor<double, 4, Eigen::RowMajor>* weights, const self_gating_options& opts,
         const view<TL, 3>* lse = nullptr) {
    const attnkit::detail::attention_shape s = attnkit::detail::self_gating::check_call(q, k, v, out, opts, lse);
    const index_t B = s.batch, L = s.len_q, H = s.heads, D = s.dim, Dv = s.dim_v, group = s.group();
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(opts.scale, D));
    const double neg_inf = -std::numeric_limits<double>::infinity();
    if (weights) {
        weights->resize(B, H, L, L);
        weights->setZero();
    }
    std::vector<double> gate(static_cast<std::size_t>(L)), a(static_cast<std::size_t>(L * L)), acc(static_cast<std::size_t>(Dv));
    for (index_t b = 0; b < B; ++b) {
        const index_t len = opts.key_lengths.empty() ? L : static_cast<index_t>(opts.key_lengths[b]);
        for (index_t h = 0; h < H; ++h) {
            const index_t kvh = h / group;
            for (index_t j = 0; j < L; ++j) {
                double dot = 0.0;
                for (index_t d = 0; d < D; ++d)
                    dot += static_cast<double>(q(b, j, h, d)) * static_cast<double>(k(b, j, kvh, d));
                gate[j] = scale * dot;
            }
            // The materialised matrix: row i = g masked to the visible keys.
            for (index_t i = 0; i < L; ++i)
                for (index_t j = 0; j < L; ++j) {
                    const bool visible = j < len && (!opts.causal || j <= i);
                    a[i * L + j] = visible ? gate[j] : neg_inf;
                }
            for (index_t i = 0; i < L; ++i) {
                double* row = &a[i * L];
                double m = neg_inf;
                bool any = false;
                for (index_t j = 0; j < L; ++j) {
                    if (row[j] == neg_inf) continue;
                    any = true;
                    if (row[j] > m) m = row[j];  // a NaN gate makes the sum NaN below
                }
                for (index_t d = 0; d < Dv; ++d) acc[d] = 0.0;
                if (lse) (*lse)(b, i, h) = static_cast<TL>(neg_inf);
                if (any) {
                    double sum = 0.0;
                    for (index_t j = 0; j < L; ++j) sum += row[j] == neg_inf ? 0.0 : std::exp(row[j] - m);
                    if (lse) (*lse)(b, i, h) = static_cast<TL>(m + std::log(sum));
                    for (index_t j = 0; j < L; ++j) {
                        if (row[j] == neg_inf) continue;
                        const double w = std::exp(row[j] - m) / sum;
                        if (weights) (*weights)(b, h, i, j) = w;
                        for (index_t d = 0; d < Dv; ++d) acc[d] += w * static_cast<double>(v(b, j, kvh, d));
                    }
                }
                for (index_t d = 0; d < Dv; ++d) out(b, i, h, d) = static_cast<TO>(acc[d]);
            }
        }
    }
}

}  // namespace self_gating_impl

// out = softmax(row i: g masked to the visible keys) v; q [B, L, H, D], k [B, L, Hk, D],
// v [B, L, Hk, Dv], out [B, L, H, Dv]; views, row-major Tensors or TensorMaps of float or double.
template <class Q, class K, class V, class O>
void self_gating_attention(const Q& q, const K& k, const V& v, O&& out, const self_gating_options& opts = {}) {
    self_gating_impl::run(attnkit::detail::q_view(q), attnkit::detail::k_view(k), attnkit::detail::v_view(v),
                          attnkit::detail::out_view(std::forward<O>(out)), nullptr, opts);
}

// Also writes lse [B, L, H]: the natural log of sum_j exp(g_j) over the visible keys of row i,
// -inf for a row with none.
template <class Q, class K, class V, class O, class L,
          std::enable_if_t<attnkit::detail::kIsLseArg<L, self_gating_options>, int> = 0>
void self_gating_attention(const Q& q, const K& k, const V& v, O&& out, L&& lse, const self_gating_options& opts = {}) {
    const auto lv = attnkit::detail::lse_view(std::forward<L>(lse));
    self_gating_impl::run(attnkit::detail::q_view(q), attnkit::detail::k_view(k), attnkit::detail::v_view(v),
                          attnkit::detail::out_view(std::forward<O>(out)), nullptr, opts, &lv);
}

// Also returns the normalised weight matrix weights [B, H, L, L] (resized here; 0 for masked
// keys; rows sum to 1, or are all 0 for a row with no visible key).
template <class Q, class K, class V, class O>
void self_gating_attention(const Q& q, const K& k, const V& v, O&& out, Eigen::Tensor<double, 4, Eigen::RowMajor>& weights,
                           const self_gating_options& opts = {}) {
    self_gating_impl::run(attnkit::detail::q_view(q), attnkit::detail::k_view(k), attnkit::detail::v_view(v),
                          attnkit::detail::out_view(std::forward<O>(out)), &weights, opts);
}

}  // namespace reference
}  // namespace attnkit
