// attnkit::reference::model::decoder_loss: the double-precision oracle of the decoder template's
// (model/decoder.hpp) training loss and the gradient of every parameter.
//
//   reference::model::parameter_map w;  // name -> row-major values, shapes decoder_parameter_shapes(cfg)
//   reference::model::parameter_map g;
//   double loss = reference::model::decoder_loss(cfg, w, tokens, targets, B, L, &g);
//   // rnd_emb_qk / fixed_seq_qk: also the fixed stream's input (from the decoder)
//   reference::model::fixed_stream s{model.fixed_stream_input() as doubles, model.fixed_stream_tokens()};
//   loss = reference::model::decoder_loss(cfg, w, tokens, targets, B, L, &g, &s);
//
// The training forward is the decoder's model, batched ([B, L] tokens, every item at positions
// 0 .. L-1) and without caches:
//   x = embed[tokens]
//   e = x (the raw embeddings; only when some layer is embedding_qk)
//   per layer l (standard where hybrid_schedule(cfg.schedule, cfg.layers) says so, else cfg.variant):
//     h = RMSNorm(x; input_layernorm)
//     mlp:   a = (SiLU(h Wg) * (h Wu)) Wd                 the token_mlp weights, width gated_mlp_width(d)
//     other: v = h Wv + bv; q, k = h Wq + bq, h Wk + bk (embedding_qk: e Wq, e Wk, no bias);
//            the biases only with cfg.attention_bias; self_gating: q = SiLU(q);
//            q, k = RoPE(q), RoPE(k) (rotate-half, cfg.rope_theta, positions 0 .. L-1);
//            att = causal attention of the kind (GQA: H query heads, Hk key/value heads, D = d / H);
//            rnd_emb_qk / fixed_seq_qk: att = static_qk_attention(q_fixed, k_fixed, v), below;
//            a = att Wo
//     x += a;  x += SwiGLU(RMSNorm(x; post_attention_layernorm); mlp weights)
//   logits = RMSNorm(x; model.norm) W^T, W = embed (cfg.tie_word_embeddings) or lm_head.weight
//   loss = mean over the targets >= 0 of -log softmax(logits)[target]  (0 when every target is < 0)
// The fixed stream (rnd_emb_qk / fixed_seq_qk, when some layer is of those kinds): the same layers
// over one sequence of max_length rows, x = stream.embeddings (rnd_emb_qk, a constant) or
// embed[stream.tokens] (fixed_seq_qk), with every attention layer standard; at each static layer
// its q and k after RoPE are that layer's q_fixed [1, max_length, H, D] and k_fixed. Its output is
// not used; its gradient is autograd's: the backward runs through the whole stream from zero at
// the top, the static layers' d_q_fixed / d_k_fixed (reference::static_qk_attention_backward,
// summed over the batch) added to the gradients of its q and k; its weight gradients add to the
// main pass's, and fixed_seq_qk's reach the stream tokens' embedding rows.
// MTA is decoder_layer::mta_opts: kq_pre [H, 1, 6, 11], head_pre / head_post [H, H] as [out, in],
// group norm [D] (eps mta_options' default), depth scale of layer l, gate [D] (bias 0).
//
// Built from attnkit's reference oracles in double (reference::model::rms_norm and rope forward,
// reference::softmax / taylor / self_gating / static_qk attention and their backward, reference::gated_mlp
// and its backward, and MTA's double-weight forward and backward of mta_attention_backward.hpp)
// and plain double loops: the projections, the logits, cross-entropy, the RMSNorm backward, the
// RoPE backward (the rotation transposed), SiLU and the embedding scatter. Nothing of the fast
// path (no attnkit::model kernel, no GEMM, no SIMD). Slow: for tests on tiny configurations.
//
// Parameters are stored row-major, projections as [in, out] (the transpose of Hugging Face's
// [out, in]), lm_head.weight as [vocab, d] (Hugging Face's, the embedding's);
// decoder_parameter_shapes lists every name and shape of a configuration. Bad input
// throws std::invalid_argument before anything is computed: a config check_decoder_config
// rejects; batch or length < 1 or length > max_length; tokens or targets not of size batch *
// length; a token outside [0, vocab) or a target >= vocab; a parameter missing, of the wrong
// size, or not of the config; with rnd_emb_qk / fixed_seq_qk layers, no stream, or its
// embeddings not max_length * d_model values (rnd_emb_qk), or its tokens not max_length ids
// in [0, vocab) (fixed_seq_qk).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/config.hpp"
#include "attnkit/model/decoder_config.hpp"
#include "attnkit/model/hybrid_schedule.hpp"
#include "attnkit/model/rope_options.hpp"
#include "attnkit/options.hpp"
#include "attnkit/reference/gated_mlp.hpp"
#include "attnkit/reference/gated_mlp_backward.hpp"
#include "attnkit/reference/model/rms_norm.hpp"
#include "attnkit/reference/model/rope.hpp"
#include "attnkit/reference/mta_attention.hpp"
#include "attnkit/reference/mta_attention_backward.hpp"
#include "attnkit/reference/self_gating_attention.hpp"
#include "attnkit/reference/self_gating_attention_backward.hpp"
#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/reference/softmax_attention_backward.hpp"
#include "attnkit/reference/static_qk_attention.hpp"
#include "attnkit/reference/static_qk_attention_backward.hpp"
#include "attnkit/reference/taylor_attention.hpp"
#include "attnkit/reference/taylor_attention_backward.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace model {

using parameter_map = std::map<std::string, std::vector<double>>;  // name -> row-major values

// The input of the fixed stream that rnd_emb_qk / fixed_seq_qk layers take Q and K from
// (model/decoder.hpp): rnd_emb_qk: embeddings [max_length, d_model] row-major, a constant
// (decoder::fixed_stream_input()); fixed_seq_qk: tokens [max_length] (decoder::fixed_stream_tokens()),
// whose rows of model.embed_tokens.weight are the input and get their gradient.
struct fixed_stream {
    std::vector<double> embeddings;
    std::vector<std::int32_t> tokens;
};

namespace decoder_impl {

using attnkit::model::attention_variant;
using attnkit::model::decoder_config;

// MTA's key-query convolution taps (decoder_layer::kMtaQueryTaps, kMtaKeyTaps).
constexpr index_t kMtaQueryTaps = 6, kMtaKeyTaps = 11;

// attnkit::gated_mlp_width(d) (gated_mlp.hpp, not included: it is the fast kernel's header);
// the test holds the two equal.
constexpr index_t token_mlp_width(index_t d) { return (4 * d + 1) / 3; }

[[noreturn]] inline void fail(const std::string& what) {
    throw std::invalid_argument("attnkit::reference::model::decoder_loss: " + what);
}

// Each layer's kind.
inline std::vector<attention_variant> layer_kinds(const decoder_config& c) {
    attnkit::model::check_decoder_config(c);
    const std::vector<bool> standard = attnkit::model::hybrid_schedule(c.schedule, c.layers);
    std::vector<attention_variant> kinds;
    for (index_t l = 0; l < c.layers; ++l)
        kinds.push_back(standard[static_cast<std::size_t>(l)] ? attention_variant::standard : c.variant);
    return kinds;
}

inline bool is_static(attention_variant k) {
    return k == attention_variant::rnd_emb_qk || k == attention_variant::fixed_seq_qk;
}

inline std::string layer_name(index_t l, const char* rest) {
    return "model.layers." + std::to_string(l) + "." + rest;
}

inline std::size_t sz(index_t n) { return static_cast<std::size_t>(n); }

// y [N, n] = x [N, k] w [k, n].
inline std::vector<double> matmul(const double* x, const double* w, index_t N, index_t k, index_t n) {
    std::vector<double> y(sz(N * n), 0.0);
    for (index_t r = 0; r < N; ++r)
        for (index_t c = 0; c < n; ++c) {
            double s = 0.0;
            for (index_t i = 0; i < k; ++i) s += x[r * k + i] * w[i * n + c];
            y[sz(r * n + c)] = s;
        }
    return y;
}

// The backward of y = x w given dy [N, n]: dx [N, k] += dy w^T (when dx is set), dw [k, n] += x^T dy.
inline void matmul_backward(const double* x, const double* w, const double* dy, double* dx, double* dw, index_t N,
                            index_t k, index_t n) {
    for (index_t r = 0; r < N; ++r)
        for (index_t i = 0; i < k; ++i) {
            double s = 0.0;
            for (index_t c = 0; c < n; ++c) {
                s += dy[r * n + c] * w[i * n + c];
                dw[i * n + c] += x[r * k + i] * dy[r * n + c];
            }
            if (dx) dx[r * k + i] += s;
        }
}

// out [N, d] = RMSNorm(x; w) through the oracle.
inline std::vector<double> rms_norm_forward(const std::vector<double>& x, const std::vector<double>& w, index_t N,
                                            index_t d, double eps) {
    std::vector<double> out(sz(N * d));
    reference::model::rms_norm(view<const double, 2>(x.data(), {N, d}), view<const double, 1>(w.data(), {d}),
                               view<double, 2>(out.data(), {N, d}), eps);
    return out;
}

// The backward of y = x r w, r = (mean x^2 + eps)^(-1/2), per row, given dy:
//   dw += dy x r,   dx += r w dy - (r^3 / d) x sum_c dy_c w_c x_c.
inline void rms_norm_backward(const double* x, const double* w, const double* dy, double* dx, double* dw, index_t N,
                              index_t d, double eps) {
    for (index_t r = 0; r < N; ++r) {
        const double* xr = x + r * d;
        const double* gr = dy + r * d;
        double ss = 0.0, e = 0.0;
        for (index_t c = 0; c < d; ++c) {
            ss += xr[c] * xr[c];
            e += gr[c] * w[c] * xr[c];
        }
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
        const double r3 = inv * inv * inv / static_cast<double>(d);
        for (index_t c = 0; c < d; ++c) {
            dw[c] += gr[c] * xr[c] * inv;
            dx[r * d + c] += inv * w[c] * gr[c] - r3 * xr[c] * e;
        }
    }
}

inline attnkit::model::rope_options rope_opts(const decoder_config& c) {
    attnkit::model::rope_options o;
    o.theta = c.rope_theta;
    return o;
}

// RoPE of x [B, L, heads, D] (row (b, l) at position l) through the oracle.
inline std::vector<double> rope_forward(const decoder_config& c, const std::vector<double>& x, index_t B, index_t L,
                                        index_t heads, index_t D) {
    std::vector<double> out(x.size());
    reference::model::rope(view<const double, 4>(x.data(), {B, L, heads, D}),
                           view<double, 4>(out.data(), {B, L, heads, D}), rope_opts(c));
    return out;
}

// The backward of rotate-half RoPE: each pair (c, c + D/2) rotated back by its angle (the
// rotation transposed): du = cos dy1 + sin dy2, dv = -sin dy1 + cos dy2. In place on g.
inline void rope_backward(const decoder_config& c, std::vector<double>& g, index_t B, index_t L, index_t heads,
                          index_t D) {
    const attnkit::model::rope_options o = rope_opts(c);
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < heads; ++h) {
                double* row = g.data() + ((b * L + l) * heads + h) * D;
                for (index_t p = 0; p < D / 2; ++p) {
                    const double angle = static_cast<double>(l) * reference::model::rope_inv_freq(o, D, p);
                    const double cs = std::cos(angle), sn = std::sin(angle);
                    const double g1 = row[p], g2 = row[p + D / 2];
                    row[p] = cs * g1 + sn * g2;
                    row[p + D / 2] = -sn * g1 + cs * g2;
                }
            }
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// MTA's weights of layer l in double, as decoder_layer::mta_opts sets them.
inline mta_backward_impl::dweights mta_weights(const parameter_map& w, index_t l) {
    mta_backward_impl::dweights m;
    m.pre.G = 1;
    m.pre.cq = kMtaQueryTaps;
    m.pre.ck = kMtaKeyTaps;
    m.pre.w = w.at(layer_name(l, "self_attn.mta.kq_pre"));
    m.head_pre = w.at(layer_name(l, "self_attn.mta.head_pre"));
    m.head_post = w.at(layer_name(l, "self_attn.mta.head_post"));
    m.norm_w = w.at(layer_name(l, "self_attn.mta.group_norm.weight"));
    m.gate_w = w.at(layer_name(l, "self_attn.mta.gate.weight"));
    m.gate_bias = 0.0;
    m.eps = static_cast<double>(mta_options{}.norm_eps);
    m.depth = mta_impl::depth_scale(l);
    m.scale = 0.0;
    return m;
}

// Everything one layer's forward keeps for the backward.
struct layer_tape {
    attention_variant kind = attention_variant::standard;
    std::vector<double> x_in, h;        // [N, d]: the layer's input and its normed rows
    std::vector<double> q_lin, k_lin;   // [N, H D], [N, Hk D]: the projections (before SiLU and RoPE)
    std::vector<double> q, k, v;        // [B, L, H, D], [B, L, Hk, D] x2: what the attention takes
    std::vector<double> att, lse;       // [B, L, H, D], [B, L, H]
    std::vector<double> x_mid, h2;      // [N, d]: after the attention sublayer, and normed
};

}  // namespace decoder_impl

// The names and stored shapes of every parameter of a configuration, in a fixed order: the
// embedding, then per layer input_layernorm, q/k/v/o_proj (each q/k/v weight followed by its
// bias with attention_bias; embedding_qk layers: v only) or token_mlp gate/up/down, mta.*
// (kq_pre, head_pre, head_post, group_norm, gate), post_attention_layernorm, mlp gate/up/down;
// then model.norm.weight and, untied, lm_head.weight. Throws std::invalid_argument as
// decoder_loss does for the config.
inline std::vector<std::pair<std::string, std::vector<index_t>>> decoder_parameter_shapes(
    const attnkit::model::decoder_config& c) {
    using attnkit::model::attention_variant;
    using decoder_impl::layer_name;
    const std::vector<attention_variant> kinds = decoder_impl::layer_kinds(c);
    const index_t d = c.d_model, H = c.heads, Hk = c.heads_kv, D = c.head_dim(), f = c.ffn_width();
    std::vector<std::pair<std::string, std::vector<index_t>>> s;
    s.push_back({"model.embed_tokens.weight", {c.vocab, d}});
    for (index_t l = 0; l < c.layers; ++l) {
        const attention_variant k = kinds[static_cast<std::size_t>(l)];
        s.push_back({layer_name(l, "input_layernorm.weight"), {d}});
        if (k == attention_variant::mlp) {
            const index_t m = decoder_impl::token_mlp_width(d);
            s.push_back({layer_name(l, "token_mlp.gate_proj.weight"), {d, m}});
            s.push_back({layer_name(l, "token_mlp.up_proj.weight"), {d, m}});
            s.push_back({layer_name(l, "token_mlp.down_proj.weight"), {m, d}});
        } else {
            const bool qk_bias = c.attention_bias && k != attention_variant::embedding_qk;
            s.push_back({layer_name(l, "self_attn.q_proj.weight"), {d, H * D}});
            if (qk_bias) s.push_back({layer_name(l, "self_attn.q_proj.bias"), {H * D}});
            s.push_back({layer_name(l, "self_attn.k_proj.weight"), {d, Hk * D}});
            if (qk_bias) s.push_back({layer_name(l, "self_attn.k_proj.bias"), {Hk * D}});
            s.push_back({layer_name(l, "self_attn.v_proj.weight"), {d, Hk * D}});
            if (c.attention_bias) s.push_back({layer_name(l, "self_attn.v_proj.bias"), {Hk * D}});
            s.push_back({layer_name(l, "self_attn.o_proj.weight"), {H * D, d}});
        }
        if (k == attention_variant::mta) {
            s.push_back({layer_name(l, "self_attn.mta.kq_pre"),
                         {H, 1, decoder_impl::kMtaQueryTaps, decoder_impl::kMtaKeyTaps}});
            s.push_back({layer_name(l, "self_attn.mta.head_pre"), {H, H}});
            s.push_back({layer_name(l, "self_attn.mta.head_post"), {H, H}});
            s.push_back({layer_name(l, "self_attn.mta.group_norm.weight"), {D}});
            s.push_back({layer_name(l, "self_attn.mta.gate.weight"), {D}});
        }
        s.push_back({layer_name(l, "post_attention_layernorm.weight"), {d}});
        s.push_back({layer_name(l, "mlp.gate_proj.weight"), {d, f}});
        s.push_back({layer_name(l, "mlp.up_proj.weight"), {d, f}});
        s.push_back({layer_name(l, "mlp.down_proj.weight"), {f, d}});
    }
    s.push_back({"model.norm.weight", {d}});
    if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {c.vocab, d}});
    return s;
}

// The mean cross-entropy loss of the decoder on tokens [batch, length] against targets [batch,
// length] (a target < 0 is ignored; 0 when all are). When grads is set it is overwritten with
// the gradient of the loss for every parameter: the same names as w, in double. stream: the
// fixed stream's input, required when a layer is rnd_emb_qk or fixed_seq_qk (ignored otherwise).
inline double decoder_loss(const attnkit::model::decoder_config& c, const parameter_map& w,
                           const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
                           index_t batch, index_t length, parameter_map* grads = nullptr,
                           const fixed_stream* stream = nullptr) {
    using namespace decoder_impl;
    using attnkit::model::attention_variant;
    // --- validation, before anything is computed ---
    const std::vector<attention_variant> kinds = layer_kinds(c);
    const auto shapes = decoder_parameter_shapes(c);
    if (batch < 1 || length < 1)
        fail("batch and length must be >= 1, got batch = " + std::to_string(batch) + ", length = " +
             std::to_string(length));
    if (length > c.max_length)
        fail("length = " + std::to_string(length) + " exceeds max_length = " + std::to_string(c.max_length));
    const index_t N = batch * length;
    if (static_cast<index_t>(tokens.size()) != N || static_cast<index_t>(targets.size()) != N)
        fail("tokens and targets must hold batch * length = " + std::to_string(N) + " values, got " +
             std::to_string(tokens.size()) + " and " + std::to_string(targets.size()));
    for (std::size_t n = 0; n < tokens.size(); ++n) {
        if (tokens[n] < 0 || tokens[n] >= c.vocab)
            fail("token " + std::to_string(tokens[n]) + " at " + std::to_string(n) + " outside [0, vocab = " +
                 std::to_string(c.vocab) + ")");
        if (targets[n] >= c.vocab)
            fail("target " + std::to_string(targets[n]) + " at " + std::to_string(n) + " >= vocab = " +
                 std::to_string(c.vocab) + " (a target < 0 is ignored)");
    }
    for (const auto& s : shapes) {
        const auto it = w.find(s.first);
        if (it == w.end()) fail("parameter \"" + s.first + "\" missing");
        index_t n = 1;
        for (index_t e : s.second) n *= e;
        if (static_cast<index_t>(it->second.size()) != n)
            fail("parameter \"" + s.first + "\" holds " + std::to_string(it->second.size()) + " values, expected " +
                 std::to_string(n));
    }
    if (w.size() != shapes.size())
        for (const auto& p : w)
            if (std::none_of(shapes.begin(), shapes.end(), [&](const auto& s) { return s.first == p.first; }))
                fail("parameter \"" + p.first + "\" is not one of this config's");
    const bool any_static = std::any_of(kinds.begin(), kinds.end(), is_static);
    const index_t Lmax = c.max_length;
    if (any_static) {
        const std::string kind = attnkit::model::attention_variant_name(c.variant);
        if (!stream) fail("stream: layers of kind " + kind + " take Q and K from the fixed stream; give its input");
        if (c.variant == attention_variant::rnd_emb_qk) {
            if (static_cast<index_t>(stream->embeddings.size()) != Lmax * c.d_model)
                fail("stream: embeddings: expected max_length * d_model = " + std::to_string(Lmax * c.d_model) +
                     " values, got " + std::to_string(stream->embeddings.size()));
        } else {
            if (static_cast<index_t>(stream->tokens.size()) != Lmax)
                fail("stream: tokens: expected max_length = " + std::to_string(Lmax) + " values, got " +
                     std::to_string(stream->tokens.size()));
            for (std::int32_t t : stream->tokens)
                if (t < 0 || t >= c.vocab)
                    fail("stream: token " + std::to_string(t) + " outside [0, vocab = " + std::to_string(c.vocab) +
                         ")");
        }
    }

    const index_t d = c.d_model, H = c.heads, Hk = c.heads_kv, D = c.head_dim();
    const index_t f = c.ffn_width(), V = c.vocab, m = token_mlp_width(d);
    const double eps = static_cast<double>(c.norm_eps);
    const auto P = [&](const std::string& name) -> const std::vector<double>& { return w.at(name); };
    const auto at = [](index_t i) { return static_cast<std::size_t>(i); };

    index_t count = 0;
    for (std::int32_t t : targets) count += t >= 0 ? 1 : 0;
    if (count == 0) {  // no target: the loss is 0 and so is every gradient
        if (grads) {
            parameter_map g;
            for (const auto& s : shapes) g[s.first].assign(w.at(s.first).size(), 0.0);
            *grads = std::move(g);
        }
        return 0.0;
    }

    softmax_options so;
    so.causal = true;
    taylor_options to;
    to.causal = true;
    self_gating_options go;
    go.causal = true;
    const static_qk_options qo{};
    const auto v4 = [](const std::vector<double>& t, index_t b, index_t l, index_t h, index_t dd) {
        return view<const double, 4>(t.data(), {b, l, h, dd});
    };
    const auto m4 = [](std::vector<double>& t, index_t b, index_t l, index_t h, index_t dd) {
        return view<double, 4>(t.data(), {b, l, h, dd});
    };
    const auto mlp_forward = [&](const std::vector<double>& in, const std::string& prefix, index_t width, index_t n) {
        std::vector<double> out(at(n * d));
        const view<const double, 2> wg(P(prefix + "gate_proj.weight").data(), {d, width});
        const view<const double, 2> wu(P(prefix + "up_proj.weight").data(), {d, width});
        const view<const double, 2> wd(P(prefix + "down_proj.weight").data(), {width, d});
        reference::gated_mlp(view<const double, 2>(in.data(), {n, d}), wg, wu, wd, view<double, 2>(out.data(), {n, d}));
        return out;
    };

    // One pass of the model over x [B * L, d], every item at positions 0 .. L-1: the main pass
    // over the tokens, or the fixed stream (B 1, L max_length, every attention layer standard,
    // as decoder::run_fixed_stream runs it), whose q and k after RoPE at each static layer are
    // that layer's q_fixed and k_fixed in the main pass.
    struct pass {
        index_t B, L;
        bool stream;
        std::vector<double> x;  // the input rows, then the last residual
        std::vector<layer_tape> tape;
    };
    const auto forward = [&](pass& p, const pass* st) {
        const index_t B = p.B, L = p.L, n = B * L;
        std::vector<double>& x = p.x;
        const bool any_emb = std::any_of(kinds.begin(), kinds.end(),
                                         [](attention_variant k) { return k == attention_variant::embedding_qk; });
        const std::vector<double> e = any_emb && !p.stream ? x : std::vector<double>();  // the raw embeddings
        p.tape.assign(at(c.layers), layer_tape());
        for (index_t l = 0; l < c.layers; ++l) {
            layer_tape& t = p.tape[at(l)];
            t.kind = p.stream && kinds[at(l)] != attention_variant::mlp ? attention_variant::standard : kinds[at(l)];
            t.x_in = x;
            t.h = rms_norm_forward(x, P(layer_name(l, "input_layernorm.weight")), n, d, eps);
            std::vector<double> a;
            if (t.kind == attention_variant::mlp) {
                a = mlp_forward(t.h, layer_name(l, "token_mlp."), m, n);
            } else {
                const auto add_bias = [&](std::vector<double>& y, const char* name) {
                    const std::vector<double>& b = P(layer_name(l, name));
                    for (std::size_t i = 0; i < y.size(); ++i) y[i] += b[i % b.size()];
                };
                t.v = matmul(t.h.data(), P(layer_name(l, "self_attn.v_proj.weight")).data(), n, d, Hk * D);
                if (c.attention_bias) add_bias(t.v, "self_attn.v_proj.bias");
                t.att.assign(at(n * H * D), 0.0);
                const auto vv4 = v4(t.v, B, L, Hk, D);
                if (is_static(t.kind)) {  // the stream's q and k, the same for every item
                    const layer_tape& s = st->tape[at(l)];
                    reference::static_qk_attention(v4(s.q, 1, Lmax, H, D), v4(s.k, 1, Lmax, Hk, D), vv4,
                                                   m4(t.att, B, L, H, D), qo);
                } else {
                    const std::vector<double>& src = t.kind == attention_variant::embedding_qk ? e : t.h;
                    t.q_lin = matmul(src.data(), P(layer_name(l, "self_attn.q_proj.weight")).data(), n, d, H * D);
                    t.k_lin = matmul(src.data(), P(layer_name(l, "self_attn.k_proj.weight")).data(), n, d, Hk * D);
                    if (c.attention_bias && t.kind != attention_variant::embedding_qk) {
                        add_bias(t.q_lin, "self_attn.q_proj.bias");
                        add_bias(t.k_lin, "self_attn.k_proj.bias");
                    }
                    std::vector<double> qs = t.q_lin;
                    if (t.kind == attention_variant::self_gating)  // SiLU before RoPE
                        for (double& z : qs) z = z * sigmoid(z);
                    t.q = rope_forward(c, qs, B, L, H, D);
                    t.k = rope_forward(c, t.k_lin, B, L, Hk, D);
                    const auto q4 = v4(t.q, B, L, H, D), k4 = v4(t.k, B, L, Hk, D);
                    switch (t.kind) {
                        case attention_variant::standard:
                        case attention_variant::embedding_qk:
                            t.lse.assign(at(n * H), 0.0);
                            reference::softmax_attention(q4, k4, vv4, m4(t.att, B, L, H, D),
                                                         view<double, 3>(t.lse.data(), {B, L, H}), so);
                            break;
                        case attention_variant::taylor:
                            reference::taylor_attention(q4, k4, vv4, m4(t.att, B, L, H, D), to);
                            break;
                        case attention_variant::self_gating:
                            reference::self_gating_attention(q4, k4, vv4, m4(t.att, B, L, H, D), go);
                            break;
                        case attention_variant::mta:
                            t.att = mta_backward_impl::forward(q4, k4, vv4, mta_weights(w, l));
                            break;
                        default:
                            fail("unsupported layer kind");
                    }
                }
                a = matmul(t.att.data(), P(layer_name(l, "self_attn.o_proj.weight")).data(), n, H * D, d);
            }
            for (std::size_t i = 0; i < x.size(); ++i) x[i] += a[i];
            t.x_mid = x;
            t.h2 = rms_norm_forward(x, P(layer_name(l, "post_attention_layernorm.weight")), n, d, eps);
            const std::vector<double> y = mlp_forward(t.h2, layer_name(l, "mlp."), f, n);
            for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
        }
    };

    // --- forward ---
    const std::vector<double>& embed = P("model.embed_tokens.weight");
    pass st{1, Lmax, true, {}, {}};
    if (any_static) {
        if (c.variant == attention_variant::rnd_emb_qk) {
            st.x = stream->embeddings;
        } else {
            st.x.resize(at(Lmax * d));
            for (index_t t = 0; t < Lmax; ++t)
                std::copy_n(embed.data() + stream->tokens[at(t)] * d, d, st.x.data() + t * d);
        }
        forward(st, nullptr);
    }
    pass mp{batch, length, false, std::vector<double>(at(N * d)), {}};
    for (index_t n = 0; n < N; ++n) std::copy_n(embed.data() + tokens[at(n)] * d, d, mp.x.data() + n * d);
    forward(mp, &st);
    const std::vector<double>& x = mp.x;
    const std::vector<double> xf = rms_norm_forward(x, P("model.norm.weight"), N, d, eps);
    const std::string head_name = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    const std::vector<double>& head = P(head_name);

    // Logits (xf head^T) and the cross-entropy; dlogits = (softmax - onehot) / count.
    std::vector<double> dlogits(at(N * V), 0.0);
    double loss = 0.0;
    std::vector<double> logit(at(V));
    for (index_t n = 0; n < N; ++n) {
        const std::int32_t target = targets[at(n)];
        if (target < 0) continue;
        for (index_t t = 0; t < V; ++t) {
            double s = 0.0;
            for (index_t i = 0; i < d; ++i) s += xf[at(n * d + i)] * head[at(t * d + i)];
            logit[at(t)] = s;
        }
        const double mx = *std::max_element(logit.begin(), logit.end());
        double z = 0.0;
        for (index_t t = 0; t < V; ++t) z += std::exp(logit[at(t)] - mx);
        loss += mx + std::log(z) - logit[at(target)];
        for (index_t t = 0; t < V; ++t)
            dlogits[at(n * V + t)] = (std::exp(logit[at(t)] - mx) / z - (t == target ? 1.0 : 0.0)) /
                                     static_cast<double>(count);
    }
    loss /= static_cast<double>(count);
    if (!grads) return loss;

    // --- backward ---
    parameter_map g;
    for (const auto& s : shapes) g[s.first].assign(w.at(s.first).size(), 0.0);
    const auto G = [&](const std::string& name) { return g.at(name).data(); };

    std::vector<double>& d_embed = g.at("model.embed_tokens.weight");
    std::vector<double>& d_head = g.at(head_name);
    std::vector<double> dxf(at(N * d), 0.0);
    // logits [N, V] = xf [N, d] head^T: dxf = dlogits head, d_head += dlogits^T xf.
    for (index_t n = 0; n < N; ++n)
        for (index_t t = 0; t < V; ++t) {
            const double gl = dlogits[at(n * V + t)];
            if (gl == 0.0) continue;
            for (index_t i = 0; i < d; ++i) {
                dxf[at(n * d + i)] += gl * head[at(t * d + i)];
                d_head[at(t * d + i)] += gl * xf[at(n * d + i)];
            }
        }
    std::vector<double> dx(at(N * d), 0.0);
    rms_norm_backward(x.data(), P("model.norm.weight").data(), dxf.data(), dx.data(), G("model.norm.weight"), N, d,
                      eps);

    // The gated MLP's backward through the oracle: d_in += ..., the weights' gradients added.
    const auto mlp_backward = [&](const std::vector<double>& in, const std::string& prefix, index_t width,
                                  const std::vector<double>& dout, std::vector<double>& d_in, index_t n) {
        std::vector<double> dxi(at(n * d)), dwg(at(d * width)), dwu(at(d * width)), dwd(at(width * d));
        reference::gated_mlp_backward(
            view<const double, 2>(in.data(), {n, d}), view<const double, 2>(P(prefix + "gate_proj.weight").data(), {d, width}),
            view<const double, 2>(P(prefix + "up_proj.weight").data(), {d, width}),
            view<const double, 2>(P(prefix + "down_proj.weight").data(), {width, d}),
            view<const double, 2>(dout.data(), {n, d}), view<double, 2>(dxi.data(), {n, d}),
            view<double, 2>(dwg.data(), {d, width}), view<double, 2>(dwu.data(), {d, width}),
            view<double, 2>(dwd.data(), {width, d}));
        for (std::size_t i = 0; i < dxi.size(); ++i) d_in[i] += dxi[i];
        const auto add = [&](const std::string& name, const std::vector<double>& src) {
            double* dst = G(name);
            for (std::size_t i = 0; i < src.size(); ++i) dst[i] += src[i];
        };
        add(prefix + "gate_proj.weight", dwg);
        add(prefix + "up_proj.weight", dwu);
        add(prefix + "down_proj.weight", dwd);
    };

    // Each static layer's gradient of the stream's q and k (after RoPE) [Lmax, H D], [Lmax, Hk D]:
    // from the main pass's static attention backward, summed over its items.
    std::vector<std::vector<double>> d_qf(at(c.layers)), d_kf(at(c.layers));
    // One pass's backward from dx, the gradient of its last residual, to dx of its input rows
    // (de: of the raw embeddings, for embedding_qk), adding into g. The main pass writes d_qf and
    // d_kf; the stream adds them to the gradients of its own q and k at the static layers.
    const auto backward = [&](const pass& p, const pass* st, std::vector<double>& dx, std::vector<double>& de) {
        const index_t B = p.B, L = p.L, n = B * L;
        const bool any_emb = !de.empty();
        for (index_t l = c.layers - 1; l >= 0; --l) {
            const layer_tape& t = p.tape[at(l)];
            // x_out = x_mid + MLP(RMSNorm(x_mid)): dx_mid = dx + the norm's backward of dh2.
            std::vector<double> dh(at(n * d), 0.0);
            mlp_backward(t.h2, layer_name(l, "mlp."), f, dx, dh, n);
            rms_norm_backward(t.x_mid.data(), P(layer_name(l, "post_attention_layernorm.weight")).data(), dh.data(),
                              dx.data(), G(layer_name(l, "post_attention_layernorm.weight")), n, d, eps);
            // x_mid = x_in + a: da = dx_mid.
            std::fill(dh.begin(), dh.end(), 0.0);
            if (t.kind == attention_variant::mlp) {
                mlp_backward(t.h, layer_name(l, "token_mlp."), m, dx, dh, n);
            } else {
                std::vector<double> datt(at(n * H * D), 0.0);
                matmul_backward(t.att.data(), P(layer_name(l, "self_attn.o_proj.weight")).data(), dx.data(),
                                datt.data(), G(layer_name(l, "self_attn.o_proj.weight")), n, H * D, d);
                std::vector<double> dq(at(n * H * D), 0.0), dk(at(n * Hk * D), 0.0), dv(at(n * Hk * D), 0.0);
                const auto q4 = v4(t.q, B, L, H, D), k4 = v4(t.k, B, L, Hk, D), vv4 = v4(t.v, B, L, Hk, D);
                const auto o4 = v4(t.att, B, L, H, D), do4 = v4(datt, B, L, H, D);
                switch (t.kind) {
                    case attention_variant::standard:
                    case attention_variant::embedding_qk:
                        reference::softmax_attention_backward(q4, k4, vv4, o4,
                                                              view<const double, 3>(t.lse.data(), {B, L, H}), do4,
                                                              m4(dq, B, L, H, D), m4(dk, B, L, Hk, D),
                                                              m4(dv, B, L, Hk, D), so);
                        break;
                    case attention_variant::taylor:
                        reference::taylor_attention_backward(q4, k4, vv4, o4, do4, m4(dq, B, L, H, D),
                                                             m4(dk, B, L, Hk, D), m4(dv, B, L, Hk, D), to);
                        break;
                    case attention_variant::self_gating:
                        reference::self_gating_attention_backward(q4, k4, vv4, o4, do4, m4(dq, B, L, H, D),
                                                                  m4(dk, B, L, Hk, D), m4(dv, B, L, Hk, D), go);
                        break;
                    case attention_variant::mta: {
                        const mta_backward_impl::dgrads mg =
                            mta_backward_impl::backward(q4, k4, vv4, do4, mta_weights(w, l));
                        dq = mg.dq;
                        dk = mg.dk;
                        dv = mg.dv;
                        const auto add = [&](const char* name, const std::vector<double>& src) {
                            double* dst = G(layer_name(l, name));
                            for (std::size_t i = 0; i < src.size(); ++i) dst[i] += src[i];
                        };
                        add("self_attn.mta.kq_pre", mg.kq_pre);
                        add("self_attn.mta.head_pre", mg.head_pre);
                        add("self_attn.mta.head_post", mg.head_post);
                        add("self_attn.mta.group_norm.weight", mg.norm_w);
                        add("self_attn.mta.gate.weight", mg.gate_w);
                        break;
                    }
                    case attention_variant::rnd_emb_qk:
                    case attention_variant::fixed_seq_qk: {
                        // Q and K are the stream's: their gradient goes to it, none to this pass's h.
                        const layer_tape& s = st->tape[at(l)];
                        d_qf[at(l)].assign(at(Lmax * H * D), 0.0);
                        d_kf[at(l)].assign(at(Lmax * Hk * D), 0.0);
                        reference::static_qk_attention_backward(v4(s.q, 1, Lmax, H, D), v4(s.k, 1, Lmax, Hk, D), vv4,
                                                                o4, do4, m4(d_qf[at(l)], 1, Lmax, H, D),
                                                                m4(d_kf[at(l)], 1, Lmax, Hk, D), m4(dv, B, L, Hk, D),
                                                                qo);
                        break;
                    }
                    default:
                        fail("unsupported layer kind");
                }
                const bool fixed = is_static(t.kind);
                if (p.stream && is_static(kinds[at(l)])) {  // q_fixed, k_fixed of the main pass
                    for (std::size_t i = 0; i < dq.size(); ++i) dq[i] += d_qf[at(l)][i];
                    for (std::size_t i = 0; i < dk.size(); ++i) dk[i] += d_kf[at(l)][i];
                }
                const bool emb = t.kind == attention_variant::embedding_qk;
                // A bias's gradient: the sum over the rows of its projection's output gradient.
                const auto bias_grad = [&](const std::vector<double>& dy, const char* name) {
                    std::vector<double>& db = g.at(layer_name(l, name));
                    for (std::size_t i = 0; i < dy.size(); ++i) db[i % db.size()] += dy[i];
                };
                if (c.attention_bias) bias_grad(dv, "self_attn.v_proj.bias");
                if (!fixed) {
                    // RoPE back (the rotation transposed), then SiLU' for self-gating's query.
                    rope_backward(c, dq, B, L, H, D);
                    rope_backward(c, dk, B, L, Hk, D);
                    if (t.kind == attention_variant::self_gating)
                        for (std::size_t i = 0; i < dq.size(); ++i) {
                            const double z = t.q_lin[i], s = sigmoid(z);
                            dq[i] *= s * (1.0 + z * (1.0 - s));
                        }
                    if (c.attention_bias && !emb) {
                        bias_grad(dq, "self_attn.q_proj.bias");
                        bias_grad(dk, "self_attn.k_proj.bias");
                    }
                    const std::vector<double>& src = emb ? p.tape.front().x_in : t.h;  // e: the first layer's input
                    std::vector<double>& dsrc = emb ? de : dh;
                    matmul_backward(src.data(), P(layer_name(l, "self_attn.q_proj.weight")).data(), dq.data(),
                                    dsrc.data(), G(layer_name(l, "self_attn.q_proj.weight")), n, d, H * D);
                    matmul_backward(src.data(), P(layer_name(l, "self_attn.k_proj.weight")).data(), dk.data(),
                                    dsrc.data(), G(layer_name(l, "self_attn.k_proj.weight")), n, d, Hk * D);
                }
                matmul_backward(t.h.data(), P(layer_name(l, "self_attn.v_proj.weight")).data(), dv.data(), dh.data(),
                                G(layer_name(l, "self_attn.v_proj.weight")), n, d, Hk * D);
            }
            rms_norm_backward(t.x_in.data(), P(layer_name(l, "input_layernorm.weight")).data(), dh.data(), dx.data(),
                              G(layer_name(l, "input_layernorm.weight")), n, d, eps);
        }
        if (any_emb)
            for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += de[i];
    };

    const bool any_emb = std::any_of(kinds.begin(), kinds.end(),
                                     [](attention_variant k) { return k == attention_variant::embedding_qk; });
    std::vector<double> de(any_emb ? at(N * d) : 0, 0.0);
    backward(mp, &st, dx, de);
    // x = embed[tokens] (and e = x): scatter into the embedding's rows.
    for (index_t n = 0; n < N; ++n)
        for (index_t i = 0; i < d; ++i) d_embed[at(tokens[at(n)] * d + i)] += dx[at(n * d + i)];
    if (any_static) {
        // The stream's output is not used: its backward starts from zero, and its q and k at the
        // static layers take d_qf and d_kf. Its weight gradients add to the main pass's (the same
        // weights); fixed_seq_qk's input rows are embedding rows, rnd_emb_qk's a constant.
        std::vector<double> dxs(at(Lmax * d), 0.0), no_de;
        backward(st, nullptr, dxs, no_de);
        if (c.variant == attention_variant::fixed_seq_qk)
            for (index_t t = 0; t < Lmax; ++t)
                for (index_t i = 0; i < d; ++i) d_embed[at(stream->tokens[at(t)] * d + i)] += dxs[at(t * d + i)];
    }
    *grads = std::move(g);
    return loss;
}

}  // namespace model
}  // namespace reference
}  // namespace attnkit
