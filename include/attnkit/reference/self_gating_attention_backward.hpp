// attnkit::reference::self_gating_attention_backward: the double oracle of self-gating
// ("Non-approximate") attention's gradients.
//
//   reference::self_gating_attention(q, k, v, out, opts);                      // the forward
//   loss = f(out);  d_out = dloss / dout;
//   reference::self_gating_attention_backward(q, k, v, out, d_out, d_q, d_k, d_v, opts);
//
// Per batch item b and query head h (key/value head kvh = h / (H / Hk)), with the forward's
// visible sets and notation (reference/self_gating_attention.hpp): gates g_j = scale <q_j, k_j>,
// the materialised [L, L] weight matrix W (row i: softmax of g over the tokens row i sees, 0
// elsewhere), then
//   dW_ij  = <d_out_i, v_j>
//   D_i    = sum_j W_ij dW_ij                  (= <d_out_i, out_i>)
//   dg_j   = sum_i W_ij (dW_ij - D_i)          (every row that sees token j scores it with g_j)
//   d_q_j  = scale dg_j k_j
//   d_k_j += scale dg_j q_j                    (summed over the query heads of kvh)
//   d_v_j += sum_i W_ij d_out_i                (likewise)
// Everything is recomputed from q, k and v in double: out is validated (its shape must be the
// forward's) but not read, so the oracle does not inherit a kernel's rounding. A row with no
// visible token contributes nothing; a token no row sees (past key_lengths) gets zero gradients.
// NaN or Inf in the inputs propagate to the gradients that depend on them (no special handling;
// an infinite gate makes NaN weights here, where the fast kernel takes the limit).
//
// Gradients are written (overwritten), float or double. They must not overlap each other or any
// input: std::invalid_argument naming the argument and the shapes, before anything is written.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "attnkit/reference/self_gating_attention.hpp"

namespace attnkit {
namespace reference {
namespace self_gating_backward_impl {

template <class TQ, class TK, class TV, class TO, class TD, class TG>
void run(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
         const view<const TO, 4>& out, const view<const TD, 4>& d_out, const view<TG, 4>& d_q, const view<TG, 4>& d_k,
         const view<TG, 4>& d_v, const self_gating_options& opts) {
    const attnkit::detail::attention_shape s =
        attnkit::detail::self_gating::check_backward(q, k, v, out, d_out, d_q, d_k, d_v, opts);
    const index_t B = s.batch, L = s.len_q, H = s.heads, Hk = s.heads_k, D = s.dim, Dv = s.dim_v, G = s.group();
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(opts.scale, D));
    auto dbl = [](auto x) { return static_cast<double>(x); };

    // The forward's weight matrices [B, H, L, L], from the oracle forward in double.
    Eigen::Tensor<double, 4, Eigen::RowMajor> qd(B, L, H, D), kd(B, L, Hk, D), vd(B, L, Hk, Dv), od(B, L, H, Dv), w;
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l) {
            for (index_t h = 0; h < H; ++h)
                for (index_t d = 0; d < D; ++d) qd(b, l, h, d) = dbl(q(b, l, h, d));
            for (index_t h = 0; h < Hk; ++h) {
                for (index_t d = 0; d < D; ++d) kd(b, l, h, d) = dbl(k(b, l, h, d));
                for (index_t d = 0; d < Dv; ++d) vd(b, l, h, d) = dbl(v(b, l, h, d));
            }
        }
    self_gating_attention(qd, kd, vd, od, w, opts);

    std::vector<double> dq(static_cast<std::size_t>(B * L * H * D), 0.0), dk(static_cast<std::size_t>(B * L * Hk * D), 0.0),
        dv(static_cast<std::size_t>(B * L * Hk * Dv), 0.0), dw(static_cast<std::size_t>(L * L)), dg(static_cast<std::size_t>(L));
    for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < H; ++h) {
            const index_t kvh = h / G;
            for (index_t i = 0; i < L; ++i)
                for (index_t j = 0; j < L; ++j) {
                    double acc = 0.0;
                    for (index_t c = 0; c < Dv; ++c) acc += dbl(d_out(b, i, h, c)) * vd(b, j, kvh, c);
                    dw[static_cast<std::size_t>(i * L + j)] = acc;
                }
            std::fill(dg.begin(), dg.end(), 0.0);
            for (index_t i = 0; i < L; ++i) {
                double di = 0.0;
                for (index_t j = 0; j < L; ++j)  // over the tokens row i weighs (a NaN v elsewhere stays out)
                    if (w(b, h, i, j) != 0.0) di += w(b, h, i, j) * dw[static_cast<std::size_t>(i * L + j)];
                for (index_t j = 0; j < L; ++j) {
                    const double wij = w(b, h, i, j);
                    if (wij == 0.0) continue;  // not visible (or a weight that underflowed: no gradient either)
                    dg[static_cast<std::size_t>(j)] += wij * (dw[static_cast<std::size_t>(i * L + j)] - di);
                    for (index_t c = 0; c < Dv; ++c)
                        dv[static_cast<std::size_t>(((b * L + j) * Hk + kvh) * Dv + c)] += wij * dbl(d_out(b, i, h, c));
                }
            }
            // Tokens past key_lengths are seen by no row: zero gradients (even next to a NaN q or k).
            const index_t len = opts.key_lengths.empty() ? L : static_cast<index_t>(opts.key_lengths[static_cast<std::size_t>(b)]);
            for (index_t j = 0; j < std::min(L, len); ++j) {
                const double g = scale * dg[static_cast<std::size_t>(j)];
                for (index_t d = 0; d < D; ++d) {
                    dq[static_cast<std::size_t>(((b * L + j) * H + h) * D + d)] = g * kd(b, j, kvh, d);
                    dk[static_cast<std::size_t>(((b * L + j) * Hk + kvh) * D + d)] += g * qd(b, j, h, d);
                }
            }
        }
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l) {
            for (index_t h = 0; h < H; ++h)
                for (index_t d = 0; d < D; ++d)
                    d_q(b, l, h, d) = static_cast<TG>(dq[static_cast<std::size_t>(((b * L + l) * H + h) * D + d)]);
            for (index_t h = 0; h < Hk; ++h) {
                for (index_t d = 0; d < D; ++d)
                    d_k(b, l, h, d) = static_cast<TG>(dk[static_cast<std::size_t>(((b * L + l) * Hk + h) * D + d)]);
                for (index_t c = 0; c < Dv; ++c)
                    d_v(b, l, h, c) = static_cast<TG>(dv[static_cast<std::size_t>(((b * L + l) * Hk + h) * Dv + c)]);
            }
        }
}

}  // namespace self_gating_backward_impl

// Gradients of a loss through out = self_gating_attention(q, k, v, opts), given d_out =
// dloss / dout [B, L, H, Dv]: d_q [B, L, H, D], d_k [B, L, Hk, D], d_v [B, L, Hk, Dv]. Views,
// row-major Tensors or TensorMaps of float or double.
template <class Q, class K, class V, class O, class DO, class GQ, class GK, class GV>
void self_gating_attention_backward(const Q& q, const K& k, const V& v, const O& out, const DO& d_out, GQ&& d_q,
                                    GK&& d_k, GV&& d_v, const self_gating_options& opts = {}) {
    self_gating_backward_impl::run(attnkit::detail::q_view(q), attnkit::detail::k_view(k), attnkit::detail::v_view(v),
                                   attnkit::detail::input_view<4>("out", out, "[B, L, H, Dv]"),
                                   attnkit::detail::input_view<4>("d_out", d_out, "[B, L, H, Dv]"),
                                   attnkit::detail::output_view<4>("d_q", std::forward<GQ>(d_q), "[B, L, H, D]"),
                                   attnkit::detail::output_view<4>("d_k", std::forward<GK>(d_k), "[B, L, Hk, D]"),
                                   attnkit::detail::output_view<4>("d_v", std::forward<GV>(d_v), "[B, L, Hk, Dv]"), opts);
}

}  // namespace reference
}  // namespace attnkit
