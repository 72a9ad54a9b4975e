// attnkit::reference::softmax_attention_backward: the double oracle of softmax attention's
// gradients.
//
//   reference::softmax_attention(q, k, v, out, lse, opts);                        // the forward
//   loss = f(out);  d_out = dloss / dout;
//   reference::softmax_attention_backward(q, k, v, out, lse, d_out, d_q, d_k, d_v, opts);
//   reference::softmax_attention_backward(q, k, v, out, lse, d_out, d_q, d_k, d_v, d_sinks, opts);
//
// Per batch item b and query head h (key/value head kvh = h / (H / Hk)), with the forward's
// visible sets and notation (reference/softmax_attention.hpp): raw scores r_ij = scale <q_i, k_j>,
// capped t_ij = c tanh(r_ij / c) (t = r without a soft-cap), the probability matrix
// P_ij = exp(t_ij - lse_i) over the visible keys (0 elsewhere) and, with sinks, the sink's share
// P_i,sink = exp(sink_h - lse_i). Materialised as [Lq, Lk] matrices:
//   dP_ij    = <d_out_i, v_j>
//   D_i      = sum_j P_ij dP_ij                  (= <d_out_i, out_i>; the sink's value is zero)
//   dT_ij    = P_ij (dP_ij - D_i)
//   dR_ij    = dT_ij (1 - tanh^2(r_ij / c))      (dR = dT without a soft-cap)
//   d_q_i    = scale sum_j dR_ij k_j
//   d_k_j   += scale sum_i dR_ij q_i             (summed over the query heads of kvh)
//   d_v_j   += sum_i P_ij d_out_i                (likewise)
//   d_sink_h = -sum_{b,i} P_i,sink D_i
// Everything is recomputed from q, k and v in double: out and lse are validated (their shapes
// must be the forward's) but not read, so the oracle does not inherit a kernel's rounding. A
// row with no visible key (and no sink) contributes nothing. NaN or Inf in the inputs propagate
// to the gradients that depend on them (no special handling).
//
// Gradients are written (overwritten), float or double. They must not overlap each other or any
// input: std::invalid_argument naming the argument and the shapes, before anything is written.
// d_sinks [H] is allowed only with opts.sinks set.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/backward/arguments.hpp"
#include "attnkit/reference/gradient_sums.hpp"
#include "attnkit/reference/softmax_attention.hpp"

namespace attnkit {
namespace reference {
namespace softmax_backward_impl {

using attnkit::detail::attention_shape;

template <class T>
double to_double(const T& x) {
    return static_cast<double>(x);
}

template <class TG>
void check_grad(const char* name, const view<TG, 4>& g, const std::array<index_t, 4>& dims, const char* layout) {
    attnkit::detail::check_layout(name, g);
    attnkit::detail::check_shape<TG, 4>(name, g, dims, layout);
}

template <class TQ, class TK, class TV, class TO, class TL, class TD, class TG, class TS>
void run(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
         const view<const TO, 4>& out, const view<const TL, 3>& lse, const view<const TD, 4>& d_out,
         const view<TG, 4>& d_q, const view<TG, 4>& d_k, const view<TG, 4>& d_v, const view<TS, 1>* d_sinks,
         const softmax_options& opts) {
    // Validate everything before writing anything.
    const attention_shape s = attnkit::detail::check_qkv(q, k, v);
    attnkit::detail::check_out("out", out, s);
    attnkit::detail::check_lse("lse", lse, s);
    attnkit::detail::check_out("d_out", d_out, s);
    check_grad("d_q", d_q, q.dims, "[B, Lq, H, D]");
    check_grad("d_k", d_k, k.dims, "[B, Lk, Hk, D]");
    check_grad("d_v", d_v, v.dims, "[B, Lk, Hk, Dv]");
    attnkit::detail::check_options(opts, s);
    if (d_sinks) {
        if (opts.sinks.empty())
            attnkit::detail::fail("d_sinks: given, but opts.sinks is empty (no sinks, no gradient for them); d_sinks " +
                                  attnkit::shape_string(*d_sinks));
        attnkit::detail::check_extent("d_sinks", *d_sinks);
        attnkit::detail::check_shape("d_sinks", *d_sinks, {s.heads}, "[H]");
    }
    namespace ad = attnkit::detail;
    ad::check_outputs_apart({ad::region_of("d_q", d_q), ad::region_of("d_k", d_k), ad::region_of("d_v", d_v),
                             d_sinks ? ad::region_of("d_sinks", *d_sinks) : ad::memory_region{}},
                            {ad::region_of("q", q), ad::region_of("k", k), ad::region_of("v", v),
                             ad::region_of("out", out), ad::region_of("lse", lse), ad::region_of("d_out", d_out)});

    const index_t B = s.batch, Lq = s.len_q, Lk = s.len_k, H = s.heads, Hk = s.heads_k, D = s.dim, Dv = s.dim_v;
    const index_t group = s.group();
    const double scale = static_cast<double>(ad::resolve_scale(opts.scale, D));
    const double cap = static_cast<double>(opts.softcap);
    const double neg_inf = -std::numeric_limits<double>::infinity();
    const bool has_sink = !opts.sinks.empty();

    // Gradient accumulators in double: [B, Lq, H, D], [B, Lk, Hk, D], [B, Lk, Hk, Dv], [H].
    backward_impl::gradient_sums g(B, Lq, Lk, H, Hk, D, Dv);
    std::vector<double> gs(static_cast<std::size_t>(H), 0.0);

    // The materialised matrices of one (b, h): raw scores, probabilities, dP, visibility.
    const std::size_t n = static_cast<std::size_t>(Lq * Lk);
    std::vector<double> raw(n), prob(n), dp(n);
    std::vector<char> vis(n);
    std::vector<double> p_sink(static_cast<std::size_t>(Lq));

    for (index_t b = 0; b < B; ++b) {
        const index_t len = opts.key_lengths.empty() ? Lk : static_cast<index_t>(opts.key_lengths[b]);
        for (index_t h = 0; h < H; ++h) {
            const index_t kvh = h / group;
            const double sink = has_sink ? static_cast<double>(opts.sinks[h]) : neg_inf;
            // P = softmax over the visible keys (and the sink), row by row.
            for (index_t i = 0; i < Lq; ++i) {
                const index_t p = i + (Lk - Lq);
                double m = sink;
                for (index_t j = 0; j < Lk; ++j) {
                    const std::size_t ij = static_cast<std::size_t>(i * Lk + j);
                    vis[ij] = softmax_impl::key_visible(opts, p, j, len);
                    if (!vis[ij]) continue;
                    double dot = 0.0;
                    for (index_t d = 0; d < D; ++d) dot += to_double(q(b, i, h, d)) * to_double(k(b, j, kvh, d));
                    raw[ij] = scale * dot;
                    const double t = cap > 0.0 ? cap * std::tanh(raw[ij] / cap) : raw[ij];
                    prob[ij] = t;  // the capped score until the row's max is known
                    if (t > m) m = t;  // as the forward: a NaN score leaves m and turns the row NaN via z
                }
                double z = has_sink && sink > neg_inf ? std::exp(sink - m) : 0.0;
                bool any = has_sink && sink > neg_inf;
                for (index_t j = 0; j < Lk; ++j) {
                    const std::size_t ij = static_cast<std::size_t>(i * Lk + j);
                    if (!vis[ij]) continue;
                    any = true;
                    z += std::exp(prob[ij] - m);
                }
                for (index_t j = 0; j < Lk; ++j) {
                    const std::size_t ij = static_cast<std::size_t>(i * Lk + j);
                    prob[ij] = vis[ij] && any ? std::exp(prob[ij] - m) / z : 0.0;
                }
                p_sink[static_cast<std::size_t>(i)] = has_sink && sink > neg_inf ? std::exp(sink - m) / z : 0.0;
            }
            // dP = d_out V^T on the visible entries.
            for (index_t i = 0; i < Lq; ++i)
                for (index_t j = 0; j < Lk; ++j) {
                    const std::size_t ij = static_cast<std::size_t>(i * Lk + j);
                    if (!vis[ij]) continue;
                    double dot = 0.0;
                    for (index_t c = 0; c < Dv; ++c) dot += to_double(d_out(b, i, h, c)) * to_double(v(b, j, kvh, c));
                    dp[ij] = dot;
                }
            for (index_t i = 0; i < Lq; ++i) {
                double di = 0.0;  // D_i = sum_j P_ij dP_ij
                for (index_t j = 0; j < Lk; ++j) {
                    const std::size_t ij = static_cast<std::size_t>(i * Lk + j);
                    if (vis[ij]) di += prob[ij] * dp[ij];
                }
                if (has_sink) gs[static_cast<std::size_t>(h)] -= p_sink[static_cast<std::size_t>(i)] * di;
                for (index_t j = 0; j < Lk; ++j) {
                    const std::size_t ij = static_cast<std::size_t>(i * Lk + j);
                    if (!vis[ij]) continue;
                    double ds = prob[ij] * (dp[ij] - di);
                    if (cap > 0.0) {
                        const double th = std::tanh(raw[ij] / cap);
                        ds *= 1.0 - th * th;
                    }
                    g.add_pair(q, k, d_out, b, i, h, j, kvh, scale, ds, prob[ij]);
                }
            }
        }
    }

    g.store(d_q, d_k, d_v);
    if (d_sinks)
        for (index_t h = 0; h < H; ++h) (*d_sinks)(h) = static_cast<TS>(gs[static_cast<std::size_t>(h)]);
}

// The d_sinks overload takes anything but the options as its tenth argument.
template <class X>
using enable_if_grad = std::enable_if_t<attnkit::detail::kIsLseArg<X, softmax_options>, int>;

}  // namespace softmax_backward_impl

// Gradients of a loss with respect to q, k and v, given d_out = dloss / dout, for the forward
// softmax_attention(q, k, v, out, lse, opts) with the same options. q, k, v of float, double,
// Eigen::bfloat16 or Eigen::half (widened exactly); out, lse and d_out float or double; d_q
// [B, Lq, H, D], d_k [B, Lk, Hk, D], d_v [B, Lk, Hk, Dv] float or double (one type).
template <class Q, class K, class V, class O, class L, class DO, class GQ, class GK, class GV>
void softmax_attention_backward(const Q& q, const K& k, const V& v, const O& out, const L& lse, const DO& d_out,
                                GQ&& d_q, GK&& d_k, GV&& d_v, const softmax_options& opts = {}) {
    const auto a = attnkit::detail::softmax_backward_arguments(q, k, v, out, lse, d_out, std::forward<GQ>(d_q),
                                                               std::forward<GK>(d_k), std::forward<GV>(d_v));
    using TG = typename decltype(a.d_q)::value_type;
    softmax_backward_impl::run(a.q, a.k, a.v, a.out, a.lse, a.d_out, a.d_q, view<TG, 4>(a.d_k), view<TG, 4>(a.d_v),
                               static_cast<const view<TG, 1>*>(nullptr), opts);
}

// The same, also writing the sinks' gradient d_sinks [H] (opts.sinks must be set).
template <class Q, class K, class V, class O, class L, class DO, class GQ, class GK, class GV, class GS,
          softmax_backward_impl::enable_if_grad<GS> = 0>
void softmax_attention_backward(const Q& q, const K& k, const V& v, const O& out, const L& lse, const DO& d_out,
                                GQ&& d_q, GK&& d_k, GV&& d_v, GS&& d_sinks, const softmax_options& opts = {}) {
    const auto a = attnkit::detail::softmax_backward_arguments(q, k, v, out, lse, d_out, std::forward<GQ>(d_q),
                                                               std::forward<GK>(d_k), std::forward<GV>(d_v));
    const auto gs = attnkit::detail::output_view<1>("d_sinks", std::forward<GS>(d_sinks), "[H]");
    using TG = typename decltype(a.d_q)::value_type;
    softmax_backward_impl::run(a.q, a.k, a.v, a.out, a.lse, a.d_out, a.d_q, view<TG, 4>(a.d_k), view<TG, 4>(a.d_v),
                               &gs, opts);
}

}  // namespace reference
}  // namespace attnkit
