// attnkit::reference::mta_attention_backward: the double oracle of multi-token attention's
// gradients (docs/variants.md section 7).
//
//   reference::mta_attention(q, k, v, out, opts);                                // the forward
//   loss = f(out);  d_out = dloss / dout;
//   reference::mta_attention_backward(q, k, v, out, d_out, d_q, d_k, d_v, d_weights, opts);
//
// Per batch item the forward is recomputed in double on materialised [H, L, L] tensors, every
// intermediate kept (X, Y after the pre convolution, Y after the pre mixing, P, P after the post
// convolution, P after the post mixing, O), then each stage is reversed by hand, last first:
//
//   gate      out = D s, s = sigmoid(D . g + b):  dD = s d_out + (d_out . D) s (1 - s) g,
//             dg += (d_out . D) s (1 - s) D,  db += (d_out . D) s (1 - s)
//   depth     D = c N:  dN = c dD
//   norm      N = O r w, r = (mean O^2 + eps)^(-1/2):  dw += dN O r,
//             dO = r w dN - (r^3 / Dv) O sum_e dN_e w_e O_e
//   P V       dP2_ij = dO_i . v_j (j <= i),  dv_j += P2_ij dO_i (over the query heads of v_j's head)
//   mixing    Z[h] = sum_g W[h, g] Z'[g]:  dZ'[g] = sum_h W[h, g] dZ[h],  dW[h, g] = <dZ[h], Z'[g]>
//   KQConv    Y[h, i, j] = sum theta[h, m, a, c] X[g0 + m, i + a - (c_q - 1), j + c - (c_k - 1) / 2]:
//             dX[g0 + m, i', j'] += theta[h, m, a, c] dY[h, i, j] at those offsets (the same band
//             read the other way, a correlation with the flipped kernel),
//             dtheta[h, m, a, c] = sum_ij dY[h, i, j] X[g0 + m, i + a - (c_q - 1), j + c - (c_k - 1) / 2]
//   Mask0     the gradient is zeroed where the forward wrote 0 (j > i)
//   softmax   dY_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij') over j <= i (masked entries get 0)
//   scores    s_ij = scale <q_i, k_j>:  d_q_i += scale ds_ij k_j,  d_k_j += scale ds_ij q_i
//
// out is validated (its shape must be the forward's) but not read: the oracle recomputes
// everything from q, k, v and the weights. mta_backward_impl::backward also works on double
// weights (dweights), which the finite-difference test perturbs; the public entry point
// converts the options' float weights exactly.
//
// Gradients are written (overwritten): d_q, d_k, d_v float or double, the weight gradients float
// (mta_weight_grads; a null member is not written). Bad input: std::invalid_argument naming the
// argument, before anything is written (detail/mta/check_backward.hpp, shared with the kernel).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "attnkit/detail/mta/check_backward.hpp"
#include "attnkit/reference/mta_attention.hpp"

namespace attnkit {
namespace reference {
namespace mta_backward_impl {

using mta_impl::cube;

// One key-query convolution kernel [H, G, c_q, c_k] in double; off when G == 0.
struct dconv {
    index_t G = 0, cq = 1, ck = 1;
    std::vector<double> w;
    bool on() const { return G > 0; }
    double at(index_t h, index_t m, index_t a, index_t c) const {
        return w[static_cast<std::size_t>(((h * G + m) * cq + a) * ck + c)];
    }
};

// Every weight of the call in double; an empty vector is a stage that is off.
struct dweights {
    dconv pre, post;
    std::vector<double> head_pre, head_post;  // [H][H] as [out][in]
    std::vector<double> norm_w, gate_w;       // [Dv]
    double gate_bias = 0.0, eps = 1e-5, depth = 1.0;
    double scale = 0.0;  // 0: 1 / sqrt(D) rounded to float, as the forward resolves it
};

template <int N>
std::vector<double> to_double(const view<const float, N>& w) {
    std::vector<double> d;
    if (w.data == nullptr) return d;
    const index_t n = w.size();
    for (index_t e = 0; e < n; ++e) d.push_back(static_cast<double>(w.data[element_offset(w, e)]));
    return d;
}

inline dconv conv_of(const view<const float, 4>& w) {
    dconv c;
    if (w.data == nullptr) return c;
    c.G = w.dims[1], c.cq = w.dims[2], c.ck = w.dims[3];
    c.w = to_double(w);
    return c;
}

// The options' weights as doubles (exact); opts must have passed the checks.
inline dweights weights_of(const mta_options& o) {
    dweights w;
    w.pre = conv_of(o.kq_pre);
    w.post = conv_of(o.kq_post);
    w.head_pre = to_double(o.head_pre);
    w.head_post = to_double(o.head_post);
    w.norm_w = to_double(o.norm_weight);
    w.gate_w = to_double(o.gate_weight);
    w.gate_bias = static_cast<double>(o.gate_bias);
    w.eps = static_cast<double>(o.norm_eps);
    w.depth = mta_impl::depth_scale(o.norm_layer);
    w.scale = static_cast<double>(o.scale);
    return w;
}

// The gradients in double: weights shaped like dweights' (empty where the stage is off), d_q
// [B, L, H, D], d_k [B, L, Hk, D], d_v [B, L, Hk, Dv] row-major.
struct dgrads {
    std::vector<double> kq_pre, head_pre, kq_post, head_post, norm_w, gate_w;
    double gate_bias = 0.0;
    std::vector<double> dq, dk, dv;
};

inline cube conv(const cube& x, const dconv& k) {
    const index_t hk = (k.ck - 1) / 2;
    cube y(x.H, x.L);
    for (index_t h = 0; h < x.H; ++h)
        for (index_t i = 0; i < x.L; ++i)
            for (index_t j = 0; j < x.L; ++j) {
                double s = 0.0;
                for (index_t m = 0; m < k.G; ++m)
                    for (index_t a = 0; a < k.cq; ++a)
                        for (index_t c = 0; c < k.ck; ++c)
                            s += k.at(h, m, a, c) * x.at((h / k.G) * k.G + m, i + a - (k.cq - 1), j + c - hk);
                y(h, i, j) = s;
            }
    return y;
}

// dx of the convolution y = conv(x) given dy, and dtheta (+=, [H][G][c_q][c_k]).
inline cube conv_backward(const cube& dy, const cube& x, const dconv& k, std::vector<double>& dtheta) {
    const index_t hk = (k.ck - 1) / 2, L = x.L;
    cube dx(x.H, L);
    for (index_t h = 0; h < x.H; ++h)
        for (index_t i = 0; i < L; ++i)
            for (index_t j = 0; j < L; ++j) {
                const double g = dy.at(h, i, j);
                if (g == 0.0) continue;
                for (index_t m = 0; m < k.G; ++m)
                    for (index_t a = 0; a < k.cq; ++a)
                        for (index_t c = 0; c < k.ck; ++c) {
                            const index_t n = (h / k.G) * k.G + m, ii = i + a - (k.cq - 1), jj = j + c - hk;
                            if (ii < 0 || jj < 0 || ii >= L || jj >= L) continue;
                            dx(n, ii, jj) += k.at(h, m, a, c) * g;
                            const std::size_t t = static_cast<std::size_t>(((h * k.G + m) * k.cq + a) * k.ck + c);
                            dtheta[t] += g * x.at(n, ii, jj);
                        }
            }
    return dx;
}

inline cube mix(const cube& x, const std::vector<double>& w) {
    cube y(x.H, x.L);
    for (index_t h = 0; h < x.H; ++h)
        for (index_t g = 0; g < x.H; ++g) {
            const double wg = w[static_cast<std::size_t>(h * x.H + g)];
            const std::size_t n = static_cast<std::size_t>(x.L * x.L);
            for (std::size_t e = 0; e < n; ++e)
                y.a[static_cast<std::size_t>(h) * n + e] += wg * x.a[static_cast<std::size_t>(g) * n + e];
        }
    return y;
}

// dx of y = mix(x, w) given dy, and dw (+=, [H][H]).
inline cube mix_backward(const cube& dy, const cube& x, const std::vector<double>& w, std::vector<double>& dw) {
    const index_t H = x.H;
    const std::size_t n = static_cast<std::size_t>(x.L * x.L);
    cube dx(H, x.L);
    for (index_t h = 0; h < H; ++h)
        for (index_t g = 0; g < H; ++g) {
            const double wg = w[static_cast<std::size_t>(h * H + g)];
            double s = 0.0;
            for (std::size_t e = 0; e < n; ++e) {
                dx.a[static_cast<std::size_t>(g) * n + e] += wg * dy.a[static_cast<std::size_t>(h) * n + e];
                s += dy.a[static_cast<std::size_t>(h) * n + e] * x.a[static_cast<std::size_t>(g) * n + e];
            }
            dw[static_cast<std::size_t>(h * H + g)] += s;
        }
    return dx;
}

// Everything the forward of one batch item computes.
struct tape {
    cube x, y1, y2, p, p1, p2;
    std::vector<double> o;  // [L][H][Dv], P V before the row stages
    tape(index_t H, index_t L) : x(H, L), y1(H, L), y2(H, L), p(H, L), p1(H, L), p2(H, L) {}
};

template <class TQ, class TK, class TV>
tape item_forward(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v, index_t b,
                  const dweights& w) {
    const index_t L = q.dims[1], H = q.dims[2], D = q.dims[3], Hk = k.dims[2], Dv = v.dims[3], group = H / Hk;
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(static_cast<float>(w.scale), D));
    tape t(H, L);
    for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < L; ++i)
            for (index_t j = 0; j <= i; ++j) {
                double dot = 0.0;
                for (index_t d = 0; d < D; ++d)
                    dot += static_cast<double>(q(b, i, h, d)) * static_cast<double>(k(b, j, h / group, d));
                t.x(h, i, j) = scale * dot;
            }
    t.y1 = w.pre.on() ? conv(t.x, w.pre) : t.x;
    t.y2 = w.head_pre.empty() ? t.y1 : mix(t.y1, w.head_pre);
    for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < L; ++i) {
            double m = t.y2(h, i, 0);
            for (index_t j = 1; j <= i; ++j) m = std::max(m, t.y2(h, i, j));
            double z = 0.0;
            for (index_t j = 0; j <= i; ++j) z += std::exp(t.y2(h, i, j) - m);
            for (index_t j = 0; j <= i; ++j) t.p(h, i, j) = std::exp(t.y2(h, i, j) - m) / z;
        }
    if (w.post.on()) {
        t.p1 = conv(t.p, w.post);
        mta_impl::mask_zero(t.p1);
    } else {
        t.p1 = t.p;
    }
    t.p2 = w.head_post.empty() ? t.p1 : mix(t.p1, w.head_post);
    t.o.assign(static_cast<std::size_t>(L * H * Dv), 0.0);
    for (index_t i = 0; i < L; ++i)
        for (index_t h = 0; h < H; ++h)
            for (index_t j = 0; j <= i; ++j)
                for (index_t c = 0; c < Dv; ++c)
                    t.o[static_cast<std::size_t>((i * H + h) * Dv + c)] +=
                        t.p2(h, i, j) * static_cast<double>(v(b, j, h / group, c));
    return t;
}

// The row stages of one output row o [Dv]: out = gate(depth * norm(o)).
struct row_result {
    std::vector<double> n;  // norm(o) (o without a norm)
    double r = 1.0;         // 1 / rms
    double s = 1.0;         // the gate's sigmoid (1 without a gate)
};
inline row_result row_forward(const double* o, index_t Dv, const dweights& w, double* out) {
    row_result rr;
    rr.n.assign(o, o + Dv);
    if (!w.norm_w.empty()) {
        double ss = 0.0;
        for (index_t c = 0; c < Dv; ++c) ss += o[c] * o[c];
        rr.r = 1.0 / std::sqrt(ss / static_cast<double>(Dv) + w.eps);
        for (index_t c = 0; c < Dv; ++c) rr.n[c] = o[c] * rr.r * w.norm_w[static_cast<std::size_t>(c)];
    }
    if (!w.gate_w.empty()) {
        double t = w.gate_bias;
        for (index_t c = 0; c < Dv; ++c) t += rr.n[c] * w.depth * w.gate_w[static_cast<std::size_t>(c)];
        rr.s = 1.0 / (1.0 + std::exp(-t));
    }
    if (out)
        for (index_t c = 0; c < Dv; ++c) out[c] = rr.n[c] * w.depth * rr.s;
    return rr;
}

// out [B, L, H, Dv] row-major in double: the forward with double weights (the finite-difference
// test's loss; equals reference::mta_attention on the options' weights).
template <class TQ, class TK, class TV>
std::vector<double> forward(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
                            const dweights& w) {
    const index_t B = q.dims[0], L = q.dims[1], H = q.dims[2], Dv = v.dims[3];
    std::vector<double> out(static_cast<std::size_t>(B * L * H * Dv));
    for (index_t b = 0; b < B; ++b) {
        const tape t = item_forward(q, k, v, b, w);
        for (index_t i = 0; i < L; ++i)
            for (index_t h = 0; h < H; ++h)
                row_forward(t.o.data() + (i * H + h) * Dv, Dv, w,
                            out.data() + ((b * L + i) * H + h) * Dv);
    }
    return out;
}

// Every gradient in double; q, k, v, d_out of checked shapes.
template <class TQ, class TK, class TV, class TD>
dgrads backward(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
                const view<const TD, 4>& d_out, const dweights& w) {
    const index_t B = q.dims[0], L = q.dims[1], H = q.dims[2], D = q.dims[3], Hk = k.dims[2], Dv = v.dims[3];
    const index_t group = H / Hk;
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(static_cast<float>(w.scale), D));
    dgrads g;
    g.kq_pre.assign(w.pre.w.size(), 0.0);
    g.kq_post.assign(w.post.w.size(), 0.0);
    g.head_pre.assign(w.head_pre.size(), 0.0);
    g.head_post.assign(w.head_post.size(), 0.0);
    g.norm_w.assign(w.norm_w.size(), 0.0);
    g.gate_w.assign(w.gate_w.size(), 0.0);
    g.dq.assign(static_cast<std::size_t>(B * L * H * D), 0.0);
    g.dk.assign(static_cast<std::size_t>(B * L * Hk * D), 0.0);
    g.dv.assign(static_cast<std::size_t>(B * L * Hk * Dv), 0.0);
    std::vector<double> dD(static_cast<std::size_t>(Dv)), dO(static_cast<std::size_t>(L * H * Dv));
    for (index_t b = 0; b < B; ++b) {
        const tape t = item_forward(q, k, v, b, w);
        // Row stages, last first.
        for (index_t i = 0; i < L; ++i)
            for (index_t h = 0; h < H; ++h) {
                const double* o = t.o.data() + (i * H + h) * Dv;
                const row_result rr = row_forward(o, Dv, w, nullptr);
                double dot = 0.0;  // d_out . D
                for (index_t c = 0; c < Dv; ++c) dot += static_cast<double>(d_out(b, i, h, c)) * rr.n[c] * w.depth;
                const double ds = dot * rr.s * (1.0 - rr.s);
                for (index_t c = 0; c < Dv; ++c) {
                    double x = static_cast<double>(d_out(b, i, h, c)) * rr.s;
                    if (!w.gate_w.empty()) {
                        x += ds * w.gate_w[static_cast<std::size_t>(c)];
                        g.gate_w[static_cast<std::size_t>(c)] += ds * rr.n[c] * w.depth;
                    }
                    dD[c] = x * w.depth;  // dN
                }
                if (!w.gate_w.empty()) g.gate_bias += ds;
                double* d = dO.data() + (i * H + h) * Dv;
                if (!w.norm_w.empty()) {
                    double e = 0.0;
                    for (index_t c = 0; c < Dv; ++c) e += dD[c] * w.norm_w[static_cast<std::size_t>(c)] * o[c];
                    const double r3 = rr.r * rr.r * rr.r / static_cast<double>(Dv);
                    for (index_t c = 0; c < Dv; ++c) {
                        g.norm_w[static_cast<std::size_t>(c)] += dD[c] * o[c] * rr.r;
                        d[c] = rr.r * w.norm_w[static_cast<std::size_t>(c)] * dD[c] - r3 * o[c] * e;
                    }
                } else {
                    for (index_t c = 0; c < Dv; ++c) d[c] = dD[c];
                }
            }
        // P V.
        cube dp2(H, L);
        for (index_t h = 0; h < H; ++h)
            for (index_t i = 0; i < L; ++i)
                for (index_t j = 0; j <= i; ++j) {
                    double s = 0.0;
                    for (index_t c = 0; c < Dv; ++c) {
                        const double doc = dO[static_cast<std::size_t>((i * H + h) * Dv + c)];
                        s += doc * static_cast<double>(v(b, j, h / group, c));
                        const std::size_t at_v = static_cast<std::size_t>(((b * L + j) * Hk + h / group) * Dv + c);
                        g.dv[at_v] += t.p2.at(h, i, j) * doc;
                    }
                    dp2(h, i, j) = s;
                }
        cube dp1 = w.head_post.empty() ? dp2 : mix_backward(dp2, t.p1, w.head_post, g.head_post);
        cube dp = dp1;
        if (w.post.on()) {
            mta_impl::mask_zero(dp1);
            dp = conv_backward(dp1, t.p, w.post, g.kq_post);
        }
        // Softmax over j <= i.
        cube dy2(H, L);
        for (index_t h = 0; h < H; ++h)
            for (index_t i = 0; i < L; ++i) {
                double s = 0.0;
                for (index_t j = 0; j <= i; ++j) s += t.p.at(h, i, j) * dp(h, i, j);
                for (index_t j = 0; j <= i; ++j) dy2(h, i, j) = t.p.at(h, i, j) * (dp(h, i, j) - s);
            }
        const cube dy1 = w.head_pre.empty() ? dy2 : mix_backward(dy2, t.y1, w.head_pre, g.head_pre);
        cube dx = w.pre.on() ? conv_backward(dy1, t.x, w.pre, g.kq_pre) : dy1;
        mta_impl::mask_zero(dx);
        for (index_t h = 0; h < H; ++h)
            for (index_t i = 0; i < L; ++i)
                for (index_t j = 0; j <= i; ++j) {
                    const double ds = scale * dx(h, i, j);
                    for (index_t d = 0; d < D; ++d) {
                        g.dq[static_cast<std::size_t>(((b * L + i) * H + h) * D + d)] +=
                            ds * static_cast<double>(k(b, j, h / group, d));
                        g.dk[static_cast<std::size_t>(((b * L + j) * Hk + h / group) * D + d)] +=
                            ds * static_cast<double>(q(b, i, h, d));
                    }
                }
    }
    return g;
}

template <int N>
void store(const std::vector<double>& src, const view<float, N>& dst) {
    if (dst.data == nullptr) return;
    for (index_t e = 0; e < dst.size(); ++e)
        dst.data[element_offset(dst, e)] = static_cast<float>(src[static_cast<std::size_t>(e)]);
}

template <class TQ, class TK, class TV, class TO, class TD, class TG>
void run(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
         const view<const TO, 4>& out, const view<const TD, 4>& d_out, const view<TG, 4>& d_q, const view<TG, 4>& d_k,
         const view<TG, 4>& d_v, const mta_weight_grads& dw, const mta_options& opts) {
    attnkit::detail::mta::check_backward(q, k, v, out, d_out, d_q, d_k, d_v, dw, opts);  // before any write
    const dgrads g = backward(q, k, v, d_out, weights_of(opts));
    const index_t B = q.dims[0], L = q.dims[1], H = q.dims[2], D = q.dims[3], Hk = k.dims[2], Dv = v.dims[3];
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l) {
            for (index_t h = 0; h < H; ++h)
                for (index_t d = 0; d < D; ++d)
                    d_q(b, l, h, d) = static_cast<TG>(g.dq[static_cast<std::size_t>(((b * L + l) * H + h) * D + d)]);
            for (index_t h = 0; h < Hk; ++h) {
                for (index_t d = 0; d < D; ++d)
                    d_k(b, l, h, d) = static_cast<TG>(g.dk[static_cast<std::size_t>(((b * L + l) * Hk + h) * D + d)]);
                for (index_t c = 0; c < Dv; ++c)
                    d_v(b, l, h, c) = static_cast<TG>(g.dv[static_cast<std::size_t>(((b * L + l) * Hk + h) * Dv + c)]);
            }
        }
    store(g.kq_pre, dw.kq_pre);
    store(g.head_pre, dw.head_pre);
    store(g.kq_post, dw.kq_post);
    store(g.head_post, dw.head_post);
    store(g.norm_w, dw.norm_weight);
    store(g.gate_w, dw.gate_weight);
    if (dw.gate_bias) *dw.gate_bias = static_cast<float>(g.gate_bias);
}

}  // namespace mta_backward_impl

// Gradients of a loss through out = mta_attention(q, k, v, opts), given d_out = dloss / dout:
// d_q [B, L, H, D], d_k [B, L, Hk, D], d_v [B, L, Hk, Dv] (float or double) and the wanted weight
// gradients (d_weights), all overwritten.
template <class Q, class K, class V, class O, class DO, class GQ, class GK, class GV>
void mta_attention_backward(const Q& q, const K& k, const V& v, const O& out, const DO& d_out, GQ&& d_q, GK&& d_k,
                            GV&& d_v, const mta_weight_grads& d_weights, const mta_options& opts = {}) {
    mta_backward_impl::run(attnkit::detail::q_view(q), attnkit::detail::k_view(k), attnkit::detail::v_view(v),
                           attnkit::detail::input_view<4>("out", out, "[B, L, H, Dv]"),
                           attnkit::detail::input_view<4>("d_out", d_out, "[B, L, H, Dv]"),
                           attnkit::detail::output_view<4>("d_q", std::forward<GQ>(d_q), "[B, L, H, D]"),
                           attnkit::detail::output_view<4>("d_k", std::forward<GK>(d_k), "[B, L, Hk, D]"),
                           attnkit::detail::output_view<4>("d_v", std::forward<GV>(d_v), "[B, L, Hk, Dv]"), d_weights,
                           opts);
}

}  // namespace reference
}  // namespace attnkit
