// attnkit::reference::softmax_attention: the naive oracle of standard softmax attention.
//
//   reference::softmax_attention(q, k, v, out[, lse], opts);
//   reference::softmax_attention_weights(q, k, v, out[, lse], weights, opts);  // also [B,H,Lq,Lk]
//
// Plain loops, double accumulation, one materialised score row per query; nothing shared with
// the fast kernels except the views and the validation routines (attnkit/detail/check.hpp).
// It exists to be obviously right, not fast: tests and benchmarks hold the kernels against it.
//
// Semantics (docs/design.md "Conventions", docs/variants.md section 1), per batch b, query head h,
// query i, with key/value head kvh = h / (H / Hk) and query position p = i + (Lk - Lq):
//   s_ij   = scale * <q_i, k_j>                    scale = opts.scale, or 1/sqrt(D) when 0
//   s_ij   = softcap * tanh(s_ij / softcap)        only when opts.softcap > 0
//   key j is visible to query i iff all of
//     j < key_lengths[b]                            when key_lengths is set
//     j <= p                                        when causal, or when chunk > 0 (see below)
//     j >= p - window_left                          when window_left >= 0 (a left bound only:
//                                                   w = 0 sees only j = p together with causal,
//                                                   every j >= p without it)
//     c*floor(p/c) <= j < c*floor(p/c) + c          when chunk = c > 0
//   m_i    = max(max_{j visible} s_ij, sink_h)      sink_h only when opts.sinks is set
//   Z_i    = sum_{j visible} exp(s_ij - m_i) + exp(sink_h - m_i)
//   a_ij   = exp(s_ij - m_i) / Z_i                  (0 for masked keys)
//   o_i    = sum_j a_ij v_j
//   lse_i  = m_i + log(Z_i)                         natural log, includes the sink term
// A row with no visible key (and no sink, or a sink of -inf) outputs zeros and lse = -inf.
//
// Decisions where the brief leaves room:
//  - Chunked local attention (chunk > 0) is causal within the chunk, as in Llama-4: chunk > 0
//    implies j <= p whether or not opts.causal is set ("combined with causal" in docs/design.md).
//  - The query position p uses the tensor length Lk, not key_lengths[b]; key_lengths is a pure
//    key mask on top of the other masks (docs/design.md, "key_lengths and causal alignment").
//  - Sinks are raw logits: they are neither scaled nor soft-capped, and have a zero value.
//  - The scale actually used is detail::resolve_scale(opts.scale, D) (a float), widened to double.
//
// NaN or Inf in the inputs propagate to the rows that see them (no special handling).
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/eigen.hpp"

#include "attnkit/config.hpp"
#include "attnkit/detail/check.hpp"
#include "attnkit/int8_kv.hpp"
#include "attnkit/options.hpp"
#include "attnkit/reference/dense.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace softmax_impl {

// floor(a / b) for b > 0, also for negative a (query positions are negative when Lq > Lk).
inline index_t floor_div(index_t a, index_t b) {
    index_t q = a / b;
    if (a % b != 0 && a < 0) --q;
    return q;
}

// Is key j visible from query position p? len = key_lengths[b] (or Lk).
inline bool key_visible(const softmax_options& o, index_t p, index_t j, index_t len) {
    if (j >= len) return false;
    const bool causal = o.causal || o.chunk > 0;  // chunked local attention is causal
    if (causal && j > p) return false;
    if (o.window_left >= 0 && p - j > o.window_left) return false;  // no overflow for any window
    if (o.chunk > 0) {
        const index_t start = o.chunk * floor_div(p, o.chunk);
        if (j < start || j >= start + o.chunk) return false;
    }
    return true;
}

template <class TQ, class TK, class TV, class TO, class TL>
void run(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
         const view<TO, 4>& out, const view<TL, 3>* lse,
         Eigen::Tensor<double, 4, Eigen::RowMajor>* weights, const softmax_options& opts) {
    // Validate everything before writing anything.
    const attnkit::detail::attention_shape s = attnkit::detail::check_qkv(q, k, v);
    attnkit::detail::check_out("out", out, s);
    if (lse) attnkit::detail::check_lse("lse", *lse, s);
    attnkit::detail::check_options(opts, s);
    attnkit::detail::check_attention_memory(q, k, v, out, lse);

    const index_t B = s.batch, Lq = s.len_q, Lk = s.len_k, H = s.heads, D = s.dim, Dv = s.dim_v;
    const index_t group = s.group();
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(opts.scale, D));
    const double softcap = static_cast<double>(opts.softcap);
    const double neg_inf = -std::numeric_limits<double>::infinity();

    if (weights) {
        weights->resize(B, H, Lq, Lk);
        weights->setZero();
    }

    std::vector<double> score(static_cast<std::size_t>(Lk));
    std::vector<char> visible(static_cast<std::size_t>(Lk));
    std::vector<double> acc(static_cast<std::size_t>(Dv));

    // The inputs in double, converted once (reference/dense.hpp): exact, same summation order.
    const dense_impl::dense_bshd qd(q), kd(k), vd(v);

    for (index_t b = 0; b < B; ++b) {
        const index_t len =
            opts.key_lengths.empty() ? Lk : static_cast<index_t>(opts.key_lengths[b]);
        for (index_t h = 0; h < H; ++h) {
            const index_t kvh = h / group;
            const bool has_sink = !opts.sinks.empty();
            const double sink = has_sink ? static_cast<double>(opts.sinks[h]) : neg_inf;
            for (index_t i = 0; i < Lq; ++i) {
                const index_t p = i + (Lk - Lq);

                // Scores of the visible keys and their maximum (with the sink).
                index_t n_visible = 0;
                double m = neg_inf;
                for (index_t j = 0; j < Lk; ++j) {
                    visible[j] = key_visible(opts, p, j, len);
                    if (!visible[j]) continue;
                    ++n_visible;
                    const double* qr = qd.row(b, i, h);
                    const double* kr = kd.row(b, j, kvh);
                    double dot = 0.0;
                    for (index_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
                    double sj = scale * dot;
                    if (softcap > 0.0) sj = softcap * std::tanh(sj / softcap);
                    score[j] = sj;
                    if (sj > m) m = sj;
                }
                if (sink > m) m = sink;

                if (n_visible == 0 && !(sink > neg_inf)) {
                    // No visible key and no sink: zeros and lse = -inf, never NaN.
                    for (index_t d = 0; d < Dv; ++d) out(b, i, h, d) = static_cast<TO>(0.0);
                    if (lse) (*lse)(b, i, h) = static_cast<TL>(neg_inf);
                    continue;
                }

                double denom = has_sink ? std::exp(sink - m) : 0.0;
                for (index_t j = 0; j < Lk; ++j)
                    if (visible[j]) denom += std::exp(score[j] - m);

                for (index_t d = 0; d < Dv; ++d) acc[d] = 0.0;
                for (index_t j = 0; j < Lk; ++j) {
                    if (!visible[j]) continue;
                    const double a = std::exp(score[j] - m) / denom;
                    if (weights) (*weights)(b, h, i, j) = a;
                    const double* vr = vd.row(b, j, kvh);
                    for (index_t d = 0; d < Dv; ++d) acc[d] += a * vr[d];
                }
                for (index_t d = 0; d < Dv; ++d) out(b, i, h, d) = static_cast<TO>(acc[d]);
                if (lse) (*lse)(b, i, h) = static_cast<TL>(m + std::log(denom));
            }
        }
    }
}

// The lse overload takes anything but the options as its fifth argument, so that a wrong type
// there stops at lse_view's static_assert (a rank-4 weights tensor: "wrong rank").
template <class X>
using enable_if_lse = std::enable_if_t<attnkit::detail::kIsLseArg<X, softmax_options>, int>;

using weights_tensor = Eigen::Tensor<double, 4, Eigen::RowMajor>;

// int8 K or V (attnkit/int8_kv.hpp) dequantised to double: scale * value, exact.
inline Eigen::Tensor<double, 4, Eigen::RowMajor> dequantised(const char* name, const char* scales_name,
                                                             const int8_kv& x) {
    const view<const std::int8_t, 4>& q = x.values();
    attnkit::detail::check_layout(name, q);
    attnkit::detail::check_kv_scales(scales_name, x.scales(), q.dims[0], q.dims[1], q.dims[2]);
    Eigen::Tensor<double, 4, Eigen::RowMajor> d(q.dims[0], q.dims[1], q.dims[2], q.dims[3]);
    for (index_t b = 0; b < q.dims[0]; ++b)
        for (index_t l = 0; l < q.dims[1]; ++l)
            for (index_t h = 0; h < q.dims[2]; ++h) {
                const double s = static_cast<double>(x.scales()(b, l, h));
                for (index_t c = 0; c < q.dims[3]; ++c) d(b, l, h, c) = s * static_cast<double>(q(b, l, h, c));
            }
    return d;
}

}  // namespace softmax_impl

// int8 K/V (attnkit::int8_kv): the same oracle on the dequantised values in double, with or
// without lse.
template <class Q, class O>
void softmax_attention(const Q& q, const int8_kv& k, const int8_kv& v, O&& out, const softmax_options& opts = {}) {
    const auto kd = softmax_impl::dequantised("k", "k.scales", k);
    const auto vd = softmax_impl::dequantised("v", "v.scales", v);
    const auto ov = attnkit::detail::out_view(std::forward<O>(out));
    softmax_impl::run(attnkit::detail::q_view(q), attnkit::detail::k_view(kd), attnkit::detail::v_view(vd), ov,
                      static_cast<const view<float, 3>*>(nullptr), nullptr, opts);
}
template <class Q, class O, class L, softmax_impl::enable_if_lse<L> = 0>
void softmax_attention(const Q& q, const int8_kv& k, const int8_kv& v, O&& out, L&& lse,
                       const softmax_options& opts = {}) {
    const auto kd = softmax_impl::dequantised("k", "k.scales", k);
    const auto vd = softmax_impl::dequantised("v", "v.scales", v);
    const auto ov = attnkit::detail::out_view(std::forward<O>(out));
    const auto lv = attnkit::detail::lse_view(std::forward<L>(lse));
    softmax_impl::run(attnkit::detail::q_view(q), attnkit::detail::k_view(kd), attnkit::detail::v_view(vd), ov, &lv,
                      nullptr, opts);
}

// out = softmax(scale * q k^T [masked]) v. q [B, Lq, H, D], k [B, Lk, Hk, D], v [B, Lk, Hk, Dv],
// out [B, Lq, H, Dv]; each an attnkit::view, a row-major Eigen::Tensor or a TensorMap, of float
// or double, inputs also of Eigen::bfloat16 or Eigen::half (element types may differ between
// arguments; every element is widened to double exactly, so a half-precision cache is compared
// on the very values it stores).
template <class Q, class K, class V, class O>
void softmax_attention(const Q& q, const K& k, const V& v, O&& out,
                       const softmax_options& opts = {}) {
    const auto qv = attnkit::detail::q_view(q);
    const auto kv = attnkit::detail::k_view(k);
    const auto vv = attnkit::detail::v_view(v);
    const auto ov = attnkit::detail::out_view(std::forward<O>(out));
    using TL = float;
    softmax_impl::run(qv, kv, vv, ov, static_cast<const view<TL, 3>*>(nullptr), nullptr, opts);
}

// Also writes lse [B, Lq, H] (natural log-sum-exp of the visible scores, -inf for empty rows).
template <class Q, class K, class V, class O, class L, softmax_impl::enable_if_lse<L> = 0>
void softmax_attention(const Q& q, const K& k, const V& v, O&& out, L&& lse,
                       const softmax_options& opts = {}) {
    const auto qv = attnkit::detail::q_view(q);
    const auto kv = attnkit::detail::k_view(k);
    const auto vv = attnkit::detail::v_view(v);
    const auto ov = attnkit::detail::out_view(std::forward<O>(out));
    const auto lv = attnkit::detail::lse_view(std::forward<L>(lse));
    softmax_impl::run(qv, kv, vv, ov, &lv, nullptr, opts);
}

// The same, also returning the attention weights [B, H, Lq, Lk] for tests and diagnostics
// (resized here; 0 for masked keys; rows sum to 1, or to less than 1 when a sink takes its
// share; all 0 for a row with no visible key). A function of its own name, so that a weights
// tensor can never be taken for lse or the other way round.
template <class Q, class K, class V, class O>
void softmax_attention_weights(const Q& q, const K& k, const V& v, O&& out, softmax_impl::weights_tensor& weights,
                               const softmax_options& opts = {}) {
    const auto qv = attnkit::detail::q_view(q);
    const auto kv = attnkit::detail::k_view(k);
    const auto vv = attnkit::detail::v_view(v);
    const auto ov = attnkit::detail::out_view(std::forward<O>(out));
    softmax_impl::run(qv, kv, vv, ov, static_cast<const view<float, 3>*>(nullptr), &weights, opts);
}

template <class Q, class K, class V, class O, class L>
void softmax_attention_weights(const Q& q, const K& k, const V& v, O&& out, L&& lse,
                               softmax_impl::weights_tensor& weights, const softmax_options& opts = {}) {
    const auto qv = attnkit::detail::q_view(q);
    const auto kv = attnkit::detail::k_view(k);
    const auto vv = attnkit::detail::v_view(v);
    const auto ov = attnkit::detail::out_view(std::forward<O>(out));
    const auto lv = attnkit::detail::lse_view(std::forward<L>(lse));
    softmax_impl::run(qv, kv, vv, ov, &lv, &weights, opts);
}

}  // namespace reference
}  // namespace attnkit
