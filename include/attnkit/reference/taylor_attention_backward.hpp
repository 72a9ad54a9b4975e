// attnkit::reference::taylor_attention_backward: the double oracle of Taylor ("Approximate")
// attention's gradients, docs/variants.md section 2.
//
//   reference::taylor_attention(q, k, v, out, opts);                        // the forward
//   loss = f(out);  d_out = dloss / dout;
//   reference::taylor_attention_backward(q, k, v, out, d_out, d_q, d_k, d_v, opts);
//
// Per batch item b and query head h (key/value head kvh = h / (H / Hk)), with the forward's
// visible sets (reference/taylor_attention.hpp), materialised as [Lq, Lk] matrices:
//   s_ij  = scale <q_i, k_j>,  w_ij = 1 + s_ij + s_ij^2 / 2 (visible keys; 0 elsewhere)
//   Z_i   = sum_j w_ij + eps,  P_ij = w_ij / Z_i,  out_i = sum_j P_ij v_j
//   dP_ij = <d_out_i, v_j>,    D_i = sum_j P_ij dP_ij            (= <d_out_i, out_i>)
//   dW_ij = (dP_ij - D_i) / Z_i                                  (the gradient of w_ij)
//   dS_ij = dW_ij (1 + s_ij)
//   d_q_i  = scale sum_j dS_ij k_j
//   d_k_j += scale sum_i dS_ij q_i                                (summed over the query heads of kvh)
//   d_v_j += sum_i P_ij d_out_i                                   (likewise)
// Every option of the forward applies (causal, key_lengths, scale, eps, GQA, Lq != Lk); opts.form
// does not matter (both forms compute the same function). Everything is recomputed from q, k
// and v in double: out is validated (its shape must be the forward's) but not read, so the
// oracle does not inherit a kernel's rounding. A row with no visible key contributes nothing;
// keys nobody sees get zero gradients. NaN or Inf in the inputs propagate to the gradients that
// depend on them (no special handling).
//
// Gradients are written (overwritten), float or double. They must not overlap each other or any
// input: std::invalid_argument naming the argument and the shapes, before anything is written.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "attnkit/detail/taylor/backward_check.hpp"
#include "attnkit/reference/gradient_sums.hpp"
#include "attnkit/reference/taylor_attention.hpp"

namespace attnkit {
namespace reference {
namespace taylor_backward_impl {

template <class T>
double to_double(const T& x) {
    return static_cast<double>(x);
}

template <class TQ, class TK, class TV, class TO, class TD, class TG>
void run(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
         const view<const TO, 4>& out, const view<const TD, 4>& d_out, const view<TG, 4>& d_q, const view<TG, 4>& d_k,
         const view<TG, 4>& d_v, const taylor_options& opts) {
    namespace ad = attnkit::detail;
    const ad::attention_shape s = ad::taylor::check_backward_call(q, k, v, out, d_out, d_q, d_k, d_v, opts);
    const index_t B = s.batch, Lq = s.len_q, Lk = s.len_k, H = s.heads, Hk = s.heads_k, D = s.dim, Dv = s.dim_v;
    const index_t group = s.group();
    const double scale = static_cast<double>(ad::resolve_scale(opts.scale, D));
    const double eps = static_cast<double>(opts.eps);

    backward_impl::gradient_sums g(B, Lq, Lk, H, Hk, D, Dv);

    // The materialised matrices of one (b, h): scores, normalised weights, dP; visible keys are a
    // prefix [0, n_i) of each row.
    const std::size_t n = static_cast<std::size_t>(Lq * Lk);
    std::vector<double> score(n), prob(n), dp(n), z(static_cast<std::size_t>(Lq));
    std::vector<index_t> n_vis(static_cast<std::size_t>(Lq));
    for (index_t b = 0; b < B; ++b) {
        const index_t len = opts.key_lengths.empty() ? Lk : static_cast<index_t>(opts.key_lengths[b]);
        for (index_t h = 0; h < H; ++h) {
            const index_t kvh = h / group;
            for (index_t i = 0; i < Lq; ++i) {
                const index_t nv = taylor_impl::visible_prefix(opts, i, Lq, Lk, len);
                n_vis[static_cast<std::size_t>(i)] = nv;
                double den = 0.0;
                for (index_t j = 0; j < nv; ++j) {
                    const std::size_t ij = static_cast<std::size_t>(i * Lk + j);
                    double dot = 0.0;
                    for (index_t d = 0; d < D; ++d) dot += to_double(q(b, i, h, d)) * to_double(k(b, j, kvh, d));
                    score[ij] = scale * dot;
                    prob[ij] = 1.0 + score[ij] + 0.5 * score[ij] * score[ij];
                    den += prob[ij];
                }
                den += eps;
                z[static_cast<std::size_t>(i)] = den;
                for (index_t j = 0; j < nv; ++j) prob[static_cast<std::size_t>(i * Lk + j)] /= den;
                for (index_t j = 0; j < nv; ++j) {
                    double dot = 0.0;
                    for (index_t c = 0; c < Dv; ++c) dot += to_double(d_out(b, i, h, c)) * to_double(v(b, j, kvh, c));
                    dp[static_cast<std::size_t>(i * Lk + j)] = dot;
                }
            }
            for (index_t i = 0; i < Lq; ++i) {
                const index_t nv = n_vis[static_cast<std::size_t>(i)];
                double di = 0.0;  // D_i = sum_j P_ij dP_ij
                for (index_t j = 0; j < nv; ++j) di += prob[static_cast<std::size_t>(i * Lk + j)] * dp[static_cast<std::size_t>(i * Lk + j)];
                for (index_t j = 0; j < nv; ++j) {
                    const std::size_t ij = static_cast<std::size_t>(i * Lk + j);
                    const double ds = (dp[ij] - di) / z[static_cast<std::size_t>(i)] * (1.0 + score[ij]);
                    g.add_pair(q, k, d_out, b, i, h, j, kvh, scale, ds, prob[ij]);
                }
            }
        }
    }

    g.store(d_q, d_k, d_v);
}

}  // namespace taylor_backward_impl

// Gradients of a loss with respect to q, k and v, given d_out = dloss / dout, for the forward
// taylor_attention(q, k, v, out, opts) with the same options. q, k, v of float, double,
// Eigen::bfloat16 or Eigen::half (widened exactly); out and d_out float or double; d_q
// [B, Lq, H, D], d_k [B, Lk, Hk, D], d_v [B, Lk, Hk, Dv] float or double (one type).
template <class Q, class K, class V, class O, class DO, class GQ, class GK, class GV>
void taylor_attention_backward(const Q& q, const K& k, const V& v, const O& out, const DO& d_out, GQ&& d_q,
                               GK&& d_k, GV&& d_v, const taylor_options& opts = {}) {
    const auto a = attnkit::detail::taylor::backward_arguments(q, k, v, out, d_out, std::forward<GQ>(d_q),
                                                               std::forward<GK>(d_k), std::forward<GV>(d_v));
    using TG = typename decltype(a.d_q)::value_type;
    taylor_backward_impl::run(a.q, a.k, a.v, a.out, a.d_out, a.d_q, view<TG, 4>(a.d_k), view<TG, 4>(a.d_v), opts);
}

}  // namespace reference
}  // namespace attnkit
