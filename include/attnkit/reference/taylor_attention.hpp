// attnkit::reference::taylor_attention: the naive oracles of second-order Taylor ("Approximate")
// attention, docs/variants.md section 2, in both of its exact forms.
//
//   reference::taylor_attention(q, k, v, out, opts)            quadratic form
//   reference::taylor_attention(q, k, v, out, weights, opts)   ... and the normalised weights
//   reference::taylor_attention_linear(q, k, v, out, opts)     linear form (feature map)
//
// Plain loops, double accumulation; nothing shared with the fast kernels except the views and
// the validation routines (detail/check.hpp, detail/taylor/check.hpp).
//
// Semantics, per batch b, query head h, query i, with key/value head kvh = h / (H / Hk), query
// position p = i + (Lk - Lq) and len = key_lengths[b] (or Lk):
//   key j is visible iff j < len and, when causal, j <= p
//   s_ij = scale * <q_i, k_j>                     scale = opts.scale, or 1/sqrt(D) when 0
//   w_ij = 1 + s_ij + s_ij^2 / 2                  (>= 1/2; 0 for masked keys)
//   o_i  = sum_j w_ij v_j / (sum_j w_ij + eps)
//   weights[b, h, i, j] = w_ij / (sum_j' w_ij' + eps)
// A row with no visible key outputs zeros (and a zero weight row), never NaN, whatever eps.
//
// The linear form uses the feature map of docs/variants.md literally,
//   phi(x) = [1, x / D^(1/4), x_a x_b / sqrt(D) (a < b), x_a^2 / (sqrt(2) sqrt(D))],
// F = 1 + D + D(D+1)/2 features, so phi(x)·phi(y) = 1 + <x,y>/sqrt(D) + <x,y>^2/(2D). Another
// scale enters by scaling q first: phi(scale sqrt(D) q)·phi(k) = 1 + s + s^2/2. Queries walk in
// position order over running prefix sums S = sum phi(k_j) v_j^T and z = sum phi(k_j), so it
// is a genuinely different computation from the quadratic form; in double the two agree to
// ~1e-12 relative, which is what the tests hold them to (1e-9).
//
// NaN or Inf in the inputs propagate to the rows that see them (no special handling).
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/eigen.hpp"

#include "attnkit/config.hpp"
#include "attnkit/detail/check.hpp"
#include "attnkit/detail/taylor/check.hpp"
#include "attnkit/options.hpp"
#include "attnkit/reference/dense.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace taylor_impl {

template <class T>
double to_double(const T& x) {
    return static_cast<double>(x);
}

// Number of keys query i sees: keys [0, n) (the visible set is always a prefix).
inline index_t visible_prefix(const taylor_options& o, index_t i, index_t Lq, index_t Lk, index_t len) {
    index_t n = len;
    if (o.causal) {
        const index_t p = i + (Lk - Lq);
        if (p + 1 < n) n = p + 1;
    }
    return n < 0 ? 0 : n;
}

template <class TQ, class TK, class TV, class TO>
void quadratic(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
               const view<TO, 4>& out, Eigen::Tensor<double, 4, Eigen::RowMajor>* weights,
               const taylor_options& opts) {
    const attnkit::detail::attention_shape s = attnkit::detail::taylor::check_call(q, k, v, out, opts);
    const index_t B = s.batch, Lq = s.len_q, Lk = s.len_k, H = s.heads, D = s.dim, Dv = s.dim_v;
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(opts.scale, D));
    const double eps = static_cast<double>(opts.eps);
    if (weights) {
        weights->resize(B, H, Lq, Lk);
        weights->setZero();
    }
    std::vector<double> w(static_cast<std::size_t>(Lk));
    std::vector<double> acc(static_cast<std::size_t>(Dv));
    // The inputs in double, converted once (reference/dense.hpp): exact, same summation order.
    const dense_impl::dense_bshd qd(q), kd(k), vd(v);
    for (index_t b = 0; b < B; ++b) {
        const index_t len = opts.key_lengths.empty() ? Lk : static_cast<index_t>(opts.key_lengths[b]);
        for (index_t h = 0; h < H; ++h) {
            const index_t kvh = h / s.group();
            for (index_t i = 0; i < Lq; ++i) {
                const index_t n = visible_prefix(opts, i, Lq, Lk, len);
                const double* qr = qd.row(b, i, h);
                double den = 0.0;
                for (index_t j = 0; j < n; ++j) {
                    const double* kr = kd.row(b, j, kvh);
                    double dot = 0.0;
                    for (index_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
                    const double sj = scale * dot;
                    w[j] = 1.0 + sj + 0.5 * sj * sj;
                    den += w[j];
                }
                for (index_t d = 0; d < Dv; ++d) acc[d] = 0.0;
                if (n > 0) {
                    den += eps;
                    for (index_t j = 0; j < n; ++j) {
                        const double a = w[j] / den;
                        if (weights) (*weights)(b, h, i, j) = a;
                        const double* vr = vd.row(b, j, kvh);
                        for (index_t d = 0; d < Dv; ++d) acc[d] += a * vr[d];
                    }
                }
                for (index_t d = 0; d < Dv; ++d) out(b, i, h, d) = static_cast<TO>(acc[d]);
            }
        }
    }
}

// phi(alpha x) of docs/variants.md, written into f (size 1 + D + D(D+1)/2).
template <class T>
void feature_map(const T* x, index_t D, double alpha, std::vector<double>& f) {
    const double r4 = std::pow(static_cast<double>(D), 0.25);
    const double r2 = std::sqrt(static_cast<double>(D));
    std::size_t n = 0;
    f[n++] = 1.0;
    for (index_t a = 0; a < D; ++a) f[n++] = alpha * to_double(x[a]) / r4;
    for (index_t a = 0; a < D; ++a)
        for (index_t b = a; b < D; ++b) {
            const double xa = alpha * to_double(x[a]), xb = alpha * to_double(x[b]);
            f[n++] = a == b ? xa * xa / (std::sqrt(2.0) * r2) : xa * xb / r2;
        }
}

template <class TQ, class TK, class TV, class TO>
void linear(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
            const view<TO, 4>& out, const taylor_options& opts) {
    const attnkit::detail::attention_shape s = attnkit::detail::taylor::check_call(q, k, v, out, opts);
    const index_t B = s.batch, Lq = s.len_q, Lk = s.len_k, H = s.heads, D = s.dim, Dv = s.dim_v;
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(opts.scale, D));
    const double alpha = scale * std::sqrt(static_cast<double>(D));  // scale q first
    const double eps = static_cast<double>(opts.eps);
    const std::size_t F = static_cast<std::size_t>(1 + D + D * (D + 1) / 2);
    std::vector<double> S(F * static_cast<std::size_t>(Dv)), z(F), fk(F), fq(F);
    for (index_t b = 0; b < B; ++b) {
        const index_t len = opts.key_lengths.empty() ? Lk : static_cast<index_t>(opts.key_lengths[b]);
        for (index_t h = 0; h < H; ++h) {
            const index_t kvh = h / s.group();
            std::fill(S.begin(), S.end(), 0.0);
            std::fill(z.begin(), z.end(), 0.0);
            index_t n_in = 0;  // keys [0, n_in) are in S and z; the visible prefix never shrinks with i
            for (index_t i = 0; i < Lq; ++i) {
                const index_t n = visible_prefix(opts, i, Lq, Lk, len);
                for (; n_in < n; ++n_in) {
                    feature_map(k.ptr(b, n_in, kvh), D, 1.0, fk);
                    for (std::size_t f = 0; f < F; ++f) {
                        z[f] += fk[f];
                        for (index_t d = 0; d < Dv; ++d)
                            S[f * static_cast<std::size_t>(Dv) + static_cast<std::size_t>(d)] +=
                                fk[f] * to_double(v(b, n_in, kvh, d));
                    }
                }
                if (n == 0) {
                    for (index_t d = 0; d < Dv; ++d) out(b, i, h, d) = static_cast<TO>(0.0);
                    continue;
                }
                feature_map(q.ptr(b, i, h), D, alpha, fq);
                double den = eps;
                for (std::size_t f = 0; f < F; ++f) den += fq[f] * z[f];
                for (index_t d = 0; d < Dv; ++d) {
                    double num = 0.0;
                    for (std::size_t f = 0; f < F; ++f)
                        num += fq[f] * S[f * static_cast<std::size_t>(Dv) + static_cast<std::size_t>(d)];
                    out(b, i, h, d) = static_cast<TO>(num / den);
                }
            }
        }
    }
}

}  // namespace taylor_impl

// out = (W V) / (W 1 + eps) with W = 1 + S + S.^2 / 2 on the visible keys. q [B, Lq, H, D],
// k [B, Lk, Hk, D], v [B, Lk, Hk, Dv], out [B, Lq, H, Dv]; attnkit::view, row-major
// Eigen::Tensor or TensorMap, of float or double (element types may differ).
template <class Q, class K, class V, class O>
void taylor_attention(const Q& q, const K& k, const V& v, O&& out, const taylor_options& opts = {}) {
    taylor_impl::quadratic(attnkit::detail::q_view(q), attnkit::detail::k_view(k), attnkit::detail::v_view(v),
                           attnkit::detail::out_view(std::forward<O>(out)), nullptr, opts);
}

// Also returns the normalised weights [B, H, Lq, Lk] (resized here): w_ij / (sum_j w_ij + eps),
// 0 for masked keys, an all-zero row for a query that sees no key. The weights argument is a
// concrete double tensor, so this overload never competes with the one above.
template <class Q, class K, class V, class O>
void taylor_attention(const Q& q, const K& k, const V& v, O&& out,
                      Eigen::Tensor<double, 4, Eigen::RowMajor>& weights, const taylor_options& opts = {}) {
    taylor_impl::quadratic(attnkit::detail::q_view(q), attnkit::detail::k_view(k), attnkit::detail::v_view(v),
                           attnkit::detail::out_view(std::forward<O>(out)), &weights, opts);
}

// The same outputs through the feature map and prefix sums (O(L F Dv), F = 1 + D + D(D+1)/2).
// opts.form is ignored: this is always the linear form.
template <class Q, class K, class V, class O>
void taylor_attention_linear(const Q& q, const K& k, const V& v, O&& out, const taylor_options& opts = {}) {
    taylor_impl::linear(attnkit::detail::q_view(q), attnkit::detail::k_view(k), attnkit::detail::v_view(v),
                        attnkit::detail::out_view(std::forward<O>(out)), opts);
}

}  // namespace reference
}  // namespace attnkit
