// attnkit::reference::mta_attention: the naive oracle of multi-token attention
// (docs/variants.md section 7, Golovneva et al.).
//
// Every stage is materialised on whole [H, L, L] tensors in double, with plain loops, exactly in
// the order of docs/variants.md; nothing is shared with the fast kernel except the views and the
// argument checks. Per batch item (always causal, Lq = Lk = L):
//
//   X  = Mask0(scale * q k^T)                 j > i -> 0; head h reads key/value head h / (H / Hk)
//   Y  = KQConv(X; kq_pre)                    when opts.kq_pre is set
//   Y  = HeadMix(Y; head_pre)                 when opts.head_pre is set: Y[h] = sum_g W[h, g] Y[g]
//   P  = softmax_j(MaskInf(Y))                j > i -> -inf
//   P  = Mask0(KQConv(Mask0(P); kq_post))     when opts.kq_post is set; not renormalised
//   P  = HeadMix(P; head_post)                when opts.head_post is set
//   O  = P V
//   O  = O / sqrt(mean_d O^2 + eps) * w       when opts.norm_weight is set (per token and head)
//   O *= 0.2 + 0.6 exp(-0.3 l)                when opts.norm_layer = l >= 0
//   O *= sigmoid(O . g + b)                   when opts.gate_weight is set
//
//   KQConv: Y[h, i, j] = sum_{m<G, a<c_q, c<c_k} theta[h, m, a, c] *
//                        X[(h / G) * G + m, i + a - (c_q - 1), j + c - (c_k - 1) / 2]
//   with X = 0 out of range: query taps are causal (a = c_q - 1 reads the current query), key
//   taps centred, a cross-correlation (the kernel is not flipped).
//
// Decision where the brief leaves room: the depth scale is its own stage (it applies whenever
// norm_layer >= 0, with or without norm_weight), so that each stage can be tested alone.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/eigen.hpp"

#include "attnkit/config.hpp"
#include "attnkit/detail/mta/check.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace mta_impl {

// A [H, L, L] tensor of one batch item, row-major.
struct cube {
    index_t H, L;
    std::vector<double> a;
    cube(index_t h, index_t l) : H(h), L(l), a(static_cast<std::size_t>(h * l * l), 0.0) {}
    double& operator()(index_t h, index_t i, index_t j) { return a[static_cast<std::size_t>((h * L + i) * L + j)]; }
    double at(index_t h, index_t i, index_t j) const {  // 0 out of range
        if (i < 0 || j < 0 || i >= L || j >= L) return 0.0;
        return a[static_cast<std::size_t>((h * L + i) * L + j)];
    }
};

inline void mask_zero(cube& x) {
    for (index_t h = 0; h < x.H; ++h)
        for (index_t i = 0; i < x.L; ++i)
            for (index_t j = i + 1; j < x.L; ++j) x(h, i, j) = 0.0;
}

inline cube kq_conv(const cube& x, const view<const float, 4>& theta) {
    const index_t G = theta.dims[1], cq = theta.dims[2], ck = theta.dims[3], hk = (ck - 1) / 2;
    cube y(x.H, x.L);
    for (index_t h = 0; h < x.H; ++h)
        for (index_t i = 0; i < x.L; ++i)
            for (index_t j = 0; j < x.L; ++j) {
                double s = 0.0;
                for (index_t m = 0; m < G; ++m)
                    for (index_t a = 0; a < cq; ++a)
                        for (index_t c = 0; c < ck; ++c)
                            s += static_cast<double>(theta(h, m, a, c)) *
                                 x.at((h / G) * G + m, i + a - (cq - 1), j + c - hk);
                y(h, i, j) = s;
            }
    return y;
}

inline cube head_mix(const cube& x, const view<const float, 2>& w) {
    cube y(x.H, x.L);
    for (index_t h = 0; h < x.H; ++h)
        for (index_t g = 0; g < x.H; ++g) {
            const double wg = static_cast<double>(w(h, g));
            for (index_t i = 0; i < x.L; ++i)
                for (index_t j = 0; j < x.L; ++j) y(h, i, j) += wg * x.at(g, i, j);
        }
    return y;
}

// The group norm's depth scale for 0-based layer l, 1 without one (l = -1). Written here again
// rather than shared with the kernel: the oracle must not inherit a mistake of the fast path.
inline double depth_scale(std::int64_t layer) {
    return layer >= 0 ? 0.2 + 0.6 * std::exp(-0.3 * static_cast<double>(layer)) : 1.0;
}

template <class TQ, class TK, class TV, class TO>
void run(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v, const view<TO, 4>& out,
         Eigen::Tensor<double, 4, Eigen::RowMajor>* weights, const mta_options& o) {
    const auto ms = attnkit::detail::mta::check_call(q, k, v, out, o);  // before anything is written
    const auto& s = ms.s;
    const index_t B = s.batch, L = s.len_q, H = s.heads, D = s.dim, Dv = s.dim_v, group = s.group();
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(o.scale, D));
    if (weights) {
        weights->resize(B, H, L, L);
        weights->setZero();
    }
    std::vector<double> acc(static_cast<std::size_t>(Dv));
    for (index_t b = 0; b < B; ++b) {
        cube x(H, L);
        for (index_t h = 0; h < H; ++h)
            for (index_t i = 0; i < L; ++i)
                for (index_t j = 0; j <= i; ++j) {
                    double dot = 0.0;
                    for (index_t d = 0; d < D; ++d)
                        dot += static_cast<double>(q(b, i, h, d)) * static_cast<double>(k(b, j, h / group, d));
                    x(h, i, j) = scale * dot;
                }
        if (ms.pre.on()) x = kq_conv(x, o.kq_pre);
        if (o.head_pre.data) x = head_mix(x, o.head_pre);
        // Causal softmax of each row over j <= i (never empty: j = i is always visible).
        cube p(H, L);
        for (index_t h = 0; h < H; ++h)
            for (index_t i = 0; i < L; ++i) {
                double m = x(h, i, 0);
                for (index_t j = 1; j <= i; ++j) m = std::max(m, x(h, i, j));
                double z = 0.0;
                for (index_t j = 0; j <= i; ++j) z += std::exp(x(h, i, j) - m);
                for (index_t j = 0; j <= i; ++j) p(h, i, j) = std::exp(x(h, i, j) - m) / z;
            }
        if (ms.post.on()) {
            p = kq_conv(p, o.kq_post);
            mask_zero(p);
        }
        if (o.head_post.data) p = head_mix(p, o.head_post);
        const double depth = depth_scale(o.norm_layer);
        for (index_t i = 0; i < L; ++i)
            for (index_t h = 0; h < H; ++h) {
                for (index_t d = 0; d < Dv; ++d) acc[d] = 0.0;
                for (index_t j = 0; j <= i; ++j) {
                    const double pj = p(h, i, j);
                    if (weights) (*weights)(b, h, i, j) = pj;
                    for (index_t d = 0; d < Dv; ++d) acc[d] += pj * static_cast<double>(v(b, j, h / group, d));
                }
                if (o.norm_weight.data) {
                    double ss = 0.0;
                    for (index_t d = 0; d < Dv; ++d) ss += acc[d] * acc[d];
                    const double r = 1.0 / std::sqrt(ss / static_cast<double>(Dv) + static_cast<double>(o.norm_eps));
                    for (index_t d = 0; d < Dv; ++d) acc[d] *= r * static_cast<double>(o.norm_weight(d));
                }
                for (index_t d = 0; d < Dv; ++d) acc[d] *= depth;
                if (o.gate_weight.data) {
                    double t = static_cast<double>(o.gate_bias);
                    for (index_t d = 0; d < Dv; ++d) t += acc[d] * static_cast<double>(o.gate_weight(d));
                    const double g = 1.0 / (1.0 + std::exp(-t));
                    for (index_t d = 0; d < Dv; ++d) acc[d] *= g;
                }
                for (index_t d = 0; d < Dv; ++d) out(b, i, h, d) = static_cast<TO>(acc[d]);
            }
    }
}

}  // namespace mta_impl

// out = MTA(q, k, v). q [B, L, H, D], k [B, L, Hk, D], v [B, L, Hk, Dv], out [B, L, H, Dv]; each
// an attnkit::view, a row-major Eigen::Tensor or a TensorMap, of float or double.
template <class Q, class K, class V, class O>
void mta_attention(const Q& q, const K& k, const V& v, O&& out, const mta_options& opts = {}) {
    mta_impl::run(attnkit::detail::q_view(q), attnkit::detail::k_view(k), attnkit::detail::v_view(v),
                  attnkit::detail::out_view(std::forward<O>(out)), nullptr, opts);
}

// Also returns the final mixing weights [B, H, L, L] (resized here): the matrix that multiplies V,
// after every post-softmax stage; 0 above the diagonal.
template <class Q, class K, class V, class O>
void mta_attention(const Q& q, const K& k, const V& v, O&& out, Eigen::Tensor<double, 4, Eigen::RowMajor>& weights,
                   const mta_options& opts = {}) {
    mta_impl::run(attnkit::detail::q_view(q), attnkit::detail::k_view(k), attnkit::detail::v_view(v),
                  attnkit::detail::out_view(std::forward<O>(out)), &weights, opts);
}

// The block-diagonal [H, H] matrix of a grouped head convolution kernel [H / c_h, c_h, c_h] as
// [group, in, out]: block g is kernel[g]^T, i.e. w[g c_h + o, g c_h + i] = kernel[g, i, o].
inline Eigen::Tensor<double, 2, Eigen::RowMajor> head_kernel_to_matrix(const view<const float, 3>& kernel) {
    const index_t n = kernel.dims[0], c = kernel.dims[1];
    Eigen::Tensor<double, 2, Eigen::RowMajor> w(n * c, n * c);
    w.setZero();
    for (index_t g = 0; g < n; ++g)
        for (index_t i = 0; i < c; ++i)
            for (index_t oo = 0; oo < c; ++oo) w(g * c + oo, g * c + i) = static_cast<double>(kernel(g, i, oo));
    return w;
}

}  // namespace reference
}  // namespace attnkit
