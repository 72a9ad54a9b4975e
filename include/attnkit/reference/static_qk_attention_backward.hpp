// attnkit::reference::static_qk_attention_backward and reference::static_attention_map_backward:
// the double oracles of static QK attention's gradients and of a from_weights map's.
//
//   reference::static_qk_attention(q_fixed, k_fixed, v, out, opts);          // the forward
//   reference::static_qk_attention_backward(q_fixed, k_fixed, v, out, d_out, d_q_fixed, d_k_fixed, d_v, opts);
//   reference::static_attention_map_backward(w, v, d_out, d_w, d_v);
//
// Static QK, per head h (key/value head kvh = h / (H / Hk)), with the forward's materialised
// weights A (reference/static_qk_attention.hpp, [L, L], causal, the same for every item b):
//   dA_b,ij  = <d_out[b, i, h], v[b, j, kvh]>
//   D_b,i    = sum_j A_ij dA_b,ij
//   dS_ij    = sum_b A_ij (dA_b,ij - D_b,i)
//   d_q_fixed[0, i, h]   = scale sum_j dS_ij k_fixed[0, j, kvh]            (i < L; rows >= L: 0)
//   d_k_fixed[0, j, kvh] = scale sum_{h of kvh} sum_i dS_ij q_fixed[0, i, h]   (j < L; rows >= L: 0)
//   d_v[b, j, kvh]       = sum_{h of kvh} sum_i A_ij d_out[b, i, h]
// Map from weights (out[b, i, h] = sum_{j <= i} w[h, i, j] v[b, j, kvh], Hk from v):
//   d_w[h, i, j] = sum_b <d_out[b, i, h], v[b, j, kvh]>   for j <= i < L, else 0
//   d_v[b, j, kvh] = sum_{h of kvh} sum_{i >= j} w[h, i, j] d_out[b, i, h]
// Everything recomputed in double from the inputs; out is validated but not read. Gradients
// float or double, overwritten; bad input throws std::invalid_argument before anything is written.
#pragma once

#include <cmath>
#include <utility>
#include <vector>

#include "attnkit/reference/static_qk_attention.hpp"

namespace attnkit {
namespace reference {
namespace static_qk_backward_impl {

template <class TQ, class TK, class TV, class TO, class TD, class TG>
void run(const view<const TQ, 4>& qf, const view<const TK, 4>& kf, const view<const TV, 4>& v, const view<const TO, 4>& out,
         const view<const TD, 4>& d_out, const view<TG, 4>& d_qf, const view<TG, 4>& d_kf, const view<TG, 4>& d_v,
         const static_qk_options& opts) {
    namespace sq = attnkit::detail::static_qk;
    sq::stream_shape st{};
    const sq::values_shape s = sq::check_backward(qf, kf, v, out, d_out, d_qf, d_kf, d_v, opts, st);
    const index_t B = s.batch, L = s.len, Lmax = st.max_len, H = st.heads, Hk = st.heads_k, D = st.dim, Dv = s.dim_v;
    const index_t G = st.group();
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(opts.scale, D));
    auto dbl = [](auto x) { return static_cast<double>(x); };

    Eigen::Tensor<double, 3, Eigen::RowMajor> a;
    Eigen::Tensor<double, 4, Eigen::RowMajor> o(B, L, H, Dv);
    static_qk_attention(qf, kf, v, o, a, opts);

    Eigen::Tensor<double, 4, Eigen::RowMajor> dq(1, Lmax, H, D), dk(1, Lmax, Hk, D), dv(B, L, Hk, Dv);
    dq.setZero();
    dk.setZero();
    dv.setZero();
    std::vector<double> ds(static_cast<std::size_t>(L * L));
    for (index_t h = 0; h < H; ++h) {
        const index_t kvh = h / G;
        std::fill(ds.begin(), ds.end(), 0.0);
        for (index_t b = 0; b < B; ++b)
            for (index_t i = 0; i < L; ++i) {
                std::vector<double> da(static_cast<std::size_t>(i + 1));
                double di = 0.0;
                for (index_t j = 0; j <= i; ++j) {
                    double acc = 0.0;
                    for (index_t c = 0; c < Dv; ++c) acc += dbl(d_out(b, i, h, c)) * dbl(v(b, j, kvh, c));
                    da[static_cast<std::size_t>(j)] = acc;
                    di += a(h, i, j) * acc;
                }
                for (index_t j = 0; j <= i; ++j) {
                    ds[static_cast<std::size_t>(i * L + j)] += a(h, i, j) * (da[static_cast<std::size_t>(j)] - di);
                    for (index_t c = 0; c < Dv; ++c) dv(b, j, kvh, c) += a(h, i, j) * dbl(d_out(b, i, h, c));
                }
            }
        for (index_t i = 0; i < L; ++i)
            for (index_t j = 0; j <= i; ++j) {
                const double x = scale * ds[static_cast<std::size_t>(i * L + j)];
                for (index_t d = 0; d < D; ++d) {
                    dq(0, i, h, d) += x * dbl(kf(0, j, kvh, d));
                    dk(0, j, kvh, d) += x * dbl(qf(0, i, h, d));
                }
            }
    }
    for (index_t i = 0; i < Lmax; ++i) {
        for (index_t h = 0; h < H; ++h)
            for (index_t d = 0; d < D; ++d) d_qf(0, i, h, d) = static_cast<TG>(dq(0, i, h, d));
        for (index_t h = 0; h < Hk; ++h)
            for (index_t d = 0; d < D; ++d) d_kf(0, i, h, d) = static_cast<TG>(dk(0, i, h, d));
    }
    for (index_t b = 0; b < B; ++b)
        for (index_t j = 0; j < L; ++j)
            for (index_t h = 0; h < Hk; ++h)
                for (index_t c = 0; c < Dv; ++c) d_v(b, j, h, c) = static_cast<TG>(dv(b, j, h, c));
}

template <class TW, class TV, class TD, class TG>
void run_map(const view<const TW, 3>& w, const view<const TV, 4>& v, const view<const TD, 4>& d_out, const view<TG, 3>& d_w,
             const view<TG, 4>& d_v) {
    namespace sq = attnkit::detail::static_qk;
    const sq::values_shape s = sq::check_map_backward(w, v, d_out, d_w, d_v);
    const index_t B = s.batch, L = s.len, H = s.heads, Hk = s.heads_k, G = H / Hk, Dv = s.dim_v, Lmax = w.dims[1];
    auto dbl = [](auto x) { return static_cast<double>(x); };
    Eigen::Tensor<double, 4, Eigen::RowMajor> dv(B, L, Hk, Dv);
    dv.setZero();
    for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < Lmax; ++i)
            for (index_t j = 0; j < Lmax; ++j) {
                double acc = 0.0;
                if (j <= i && i < L)
                    for (index_t b = 0; b < B; ++b)
                        for (index_t c = 0; c < Dv; ++c) {
                            acc += dbl(d_out(b, i, h, c)) * dbl(v(b, j, h / G, c));
                            dv(b, j, h / G, c) += dbl(w(h, i, j)) * dbl(d_out(b, i, h, c));
                        }
                d_w(h, i, j) = static_cast<TG>(acc);
            }
    for (index_t b = 0; b < B; ++b)
        for (index_t j = 0; j < L; ++j)
            for (index_t h = 0; h < Hk; ++h)
                for (index_t c = 0; c < Dv; ++c) d_v(b, j, h, c) = static_cast<TG>(dv(b, j, h, c));
}

}  // namespace static_qk_backward_impl

// Gradients through out = static_qk_attention(q_fixed, k_fixed, v, opts): d_q_fixed [1, Lmax, H, D]
// and d_k_fixed [1, Lmax, Hk, D] summed over the batch (rows >= L zero), d_v [B, L, Hk, Dv].
template <class QF, class KF, class V, class O, class DO, class GQ, class GK, class GV>
void static_qk_attention_backward(const QF& q_fixed, const KF& k_fixed, const V& v, const O& out, const DO& d_out,
                                  GQ&& d_q_fixed, GK&& d_k_fixed, GV&& d_v, const static_qk_options& opts = {}) {
    namespace sq = attnkit::detail::static_qk;
    static_qk_backward_impl::run(sq::q_fixed_view(q_fixed), sq::k_fixed_view(k_fixed), sq::v_view(v),
                                 attnkit::detail::input_view<4>("out", out, "[B, L, H, Dv]"),
                                 attnkit::detail::input_view<4>("d_out", d_out, "[B, L, H, Dv]"),
                                 attnkit::detail::output_view<4>("d_q_fixed", std::forward<GQ>(d_q_fixed), "[1, Lmax, H, D]"),
                                 attnkit::detail::output_view<4>("d_k_fixed", std::forward<GK>(d_k_fixed), "[1, Lmax, Hk, D]"),
                                 attnkit::detail::output_view<4>("d_v", std::forward<GV>(d_v), "[B, L, Hk, Dv]"), opts);
}

// Gradients through out = static_attention_map::from_weights(w).apply(v, out) (all L rows):
// d_w [H, Lmax, Lmax] (lower triangle of the first L rows; 0 elsewhere), d_v [B, L, Hk, Dv].
template <class W, class V, class DO, class GW, class GV>
void static_attention_map_backward(const W& w, const V& v, const DO& d_out, GW&& d_w, GV&& d_v) {
    namespace sq = attnkit::detail::static_qk;
    static_qk_backward_impl::run_map(sq::weights_view(w), sq::v_view(v),
                                     attnkit::detail::input_view<4>("d_out", d_out, "[B, L, H, Dv]"),
                                     attnkit::detail::output_view<3>("d_w", std::forward<GW>(d_w), "[H, Lmax, Lmax]"),
                                     attnkit::detail::output_view<4>("d_v", std::forward<GV>(d_v), "[B, L, Hk, Dv]"));
}

}  // namespace reference
}  // namespace attnkit
