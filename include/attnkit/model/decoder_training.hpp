// The decoder's training pass: a batched forward over tokens [B, L] that keeps what its backward
// needs (model/decoder_activations.hpp), the next-token cross-entropy, and the backward through
// every block into a decoder_gradients. Included by model/decoder.hpp.
//
// Forward, per layer (the same model as decoder::prefill, batched, every sequence from position
// 0): h = RMSNorm(x); q, k, v = h Wq + bq, h Wk + bk, h Wv + bv (biases with attention_bias;
// StaticEmbQK: q, k from the token embeddings' one projection, no q/k bias; self-gating:
// q = SiLU(h Wq + bq)); RoPE on q and k; att = the layer's causal attention; x += att Wo (an mlp
// layer: x += gated_mlp(h)); x += SwiGLU(RMSNorm(x)). Then RMSNorm, the output projection (the
// embedding when tied, else lm_head.weight) and the cross-entropy.
//
// Backward: every product's gradient is a GEMM of the engine (detail/gemm.hpp, operands read
// transposed in place), every block's gradient its own kernel: gated_mlp_backward,
// rms_norm_backward, rope_backward, the attention variants' backward passes (which recompute
// their probabilities from q, k and, for softmax, lse), embedding_qk_projection_backward,
// cross_entropy. The weight gradients are GEMMs over all N tokens (each element of a block one
// chain of FMAs), the biases' gradients (column sums of dq, dk, dv) and the embedding's row sums
// run serially in token order, so the gradients are bitwise identical for any thread count, as
// every kernel's are.
//
// rnd_emb_qk and fixed_seq_qk layers take Q and K from the fixed stream (decoder.hpp): every
// call first runs the stream pass, the same forward over batch 1 and max_length rows (rnd_emb_qk:
// the seeded random rows; fixed_seq_qk: the fixed tokens' embedding rows) with every attention
// layer standard, up to the highest static layer's q and k; each static layer of the main pass
// then runs static_qk_attention(q_fixed, k_fixed, v) on that layer's stream q and k (after RoPE).
// The backward is autograd's: the main pass's static_qk_attention_backward gives d_q_fixed and
// d_k_fixed (summed over the batch); then the stream's backward runs from zero at the top (its
// output is not used) down to its input, adding them to the gradients of its own q and k at the
// static layers before RoPE's backward. Its weight gradients (into a second gradients object)
// are added to the main pass's in parameter order, and fixed_seq_qk's input rows to their tokens'
// embedding rows in token order; rnd_emb_qk's rows are a constant. Cost: one more forward and
// backward over max_length tokens (up to the highest static layer) per step.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/detail/gemm.hpp"
#include "attnkit/embedding_qk_backward.hpp"
#include "attnkit/gated_mlp_backward.hpp"
#include "attnkit/model/cross_entropy.hpp"
#include "attnkit/model/decoder.hpp"
#include "attnkit/mta_attention_backward.hpp"
#include "attnkit/self_gating_attention_backward.hpp"
#include "attnkit/softmax_attention_backward.hpp"
#include "attnkit/static_qk_attention_backward.hpp"
#include "attnkit/taylor_attention_backward.hpp"

namespace attnkit {
namespace model {

inline double decoder::loss_and_gradients(const std::vector<std::int32_t>& tokens,
                                          const std::vector<std::int32_t>& targets, index_t batch,
                                          decoder_gradients& g) {
    if (g.layer_kinds() != kinds_ || g.attention_bias() != c_.attention_bias ||
        g.tie_word_embeddings() != c_.tie_word_embeddings)
        throw std::invalid_argument(
            "attnkit::model::decoder::loss_and_gradients: g: gradients of a decoder with other layers, biases or "
            "output head (build them with decoder_gradients(model))");
    return train_pass(tokens, &targets, batch, &g);
}

inline double decoder::loss(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
                            index_t batch) {
    return train_pass(tokens, &targets, batch, nullptr);
}

inline const tensor2& decoder::batch_logits(const std::vector<std::int32_t>& tokens, index_t batch) {
    train_pass(tokens, nullptr, batch, nullptr);
    return act_.logits;
}

inline index_t decoder::check_batch(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>* targets,
                                    index_t batch) const {
    const std::string who = "attnkit::model::decoder::loss_and_gradients: ";
    const index_t n = static_cast<index_t>(tokens.size());
    if (batch < 1 || n == 0 || n % batch != 0)
        throw std::invalid_argument(who + "tokens: expected batch * L values with batch >= 1 and L >= 1, got " +
                                    std::to_string(n) + " values for batch = " + std::to_string(batch));
    const index_t L = n / batch;
    if (L > c_.max_length)
        throw std::invalid_argument(who + "tokens: L = " + std::to_string(L) + " exceeds max_length = " +
                                    std::to_string(c_.max_length));
    if (targets && static_cast<index_t>(targets->size()) != n)
        throw std::invalid_argument(who + "targets: expected " + std::to_string(n) + " values ([" +
                                    std::to_string(batch) + ", " + std::to_string(L) + "]), got " +
                                    std::to_string(targets->size()));
    for (index_t i = 0; i < n; ++i) {
        const std::int32_t t = tokens[static_cast<std::size_t>(i)], y = targets ? (*targets)[static_cast<std::size_t>(i)] : -1;
        if (t < 0 || t >= c_.vocab)
            throw std::invalid_argument(who + "tokens: token " + std::to_string(t) + " at " + std::to_string(i) +
                                        " outside [0, vocab = " + std::to_string(c_.vocab) + ")");
        if (y >= c_.vocab)
            throw std::invalid_argument(who + "targets: target " + std::to_string(y) + " at " + std::to_string(i) +
                                        " >= vocab = " + std::to_string(c_.vocab));
    }
    return L;
}

// One pass of the training forward / backward: the main pass over the tokens, or the fixed
// stream's (batch 1, max_length rows, every attention layer standard, up to layer `top`, of
// which only q and k are computed).
struct decoder::train_input {
    decoder_activations* a;                   // what the pass keeps, and its buffers
    const std::vector<std::int32_t>* tokens;  // the input rows' tokens (main pass; fixed_seq_qk's stream)
    const tensor2* x0;                        // or the input rows themselves (rnd_emb_qk's stream)
    index_t B, L;
    bool stream;
    index_t top;                 // the last layer the pass runs
    decoder_activations* fixed;  // main pass: the stream's pass (the static layers' q_fixed, k_fixed)
};

// The shapes, options and helpers of one pass.
struct decoder::train_kit {
    decoder& m;
    const index_t B, L, N, d, H, Hk, D;
    rope_options ro;
    softmax_options so;
    taylor_options to;
    self_gating_options go;
    gated_mlp_options mo;
    static_qk_options qo;

    train_kit(decoder& model, index_t batch, index_t length)
        : m(model),
          B(batch),
          L(length),
          N(batch * length),
          d(model.c_.d_model),
          H(model.c_.heads),
          Hk(model.c_.heads_kv),
          D(model.c_.head_dim()),
          ro{model.c_.rope_theta, 0, model.c_.pool},
          mo{model.c_.pool} {
        thread_pool* pool = model.c_.pool;
        ro.cache = model.rope_cache_.get();
        so.causal = true;
        so.pool = pool;
        to.causal = true;
        to.pool = pool;
        go.causal = true;
        go.pool = pool;
        qo.pool = pool;
    }

    // The layer's kind in this pass: the stream runs every attention layer as standard.
    static attention_variant kind(const decoder_layer& l, bool stream) {
        return stream && l.kind != attention_variant::mlp ? attention_variant::standard : l.kind;
    }

    // C = op(A) op(B) (or +=), timed as GEMM, on a grid of C's blocks (gemm_blocks). A block
    // packs its slice of op(B) once for all its rows, so large blocks, 256 x 512 (smaller ones
    // re-pack B more often: docs/benchmarks.md, "Training"), unless the grid would then leave a
    // thread idle; any grid gives the same bits (detail/gemm.hpp), so the pool's size may
    // choose it.
    void product(const tensor2& x, attnkit::detail::gemm_op ox, const tensor2& w, attnkit::detail::gemm_op ow,
                 tensor2& c, attnkit::detail::gemm_mode mode = attnkit::detail::gemm_mode::assign) {
        using attnkit::detail::matrix_ref;
        const index_t rows = c.dimension(0), cols = c.dimension(1);
        const index_t threads = m.c_.pool ? static_cast<index_t>(m.c_.pool->size()) : 1;
        index_t br = 256, bc = 512;
        const auto blocks = [&] { return ((rows + br - 1) / br) * ((cols + bc - 1) / bc); };
        while (threads > 1 && blocks() < 2 * threads && br > 64) br /= 2;
        while (threads > 1 && blocks() < 2 * threads && bc > 128) bc /= 2;
        const matrix_ref<const float> a{x.data(), x.dimension(0), x.dimension(1), x.dimension(1)};
        const matrix_ref<const float> b{w.data(), w.dimension(0), w.dimension(1), w.dimension(1)};
        const matrix_ref<float> o{c.data(), rows, cols, cols};
        m.timed(m.prof_.gemm, [&] { attnkit::detail::gemm_blocks(a, ox, b, ow, o, m.c_.pool, br, bc, mode); });
    }
    view<float, 4> v4(tensor2& t, index_t heads) const { return view<float, 4>(t.data(), {B, L, heads, D}); }
    view<float, 3> v3(tensor2& t) const { return view<float, 3>(t.data(), {B, L, t.dimension(1)}); }
    // A bias's gradient: the column sums of its projection's output gradient, one running sum
    // per column in token order on one thread (the same bits for any pool).
    void column_sums(const tensor2& dy, tensor1& db) {
        m.timed(m.prof_.other, [&] {
            const index_t n = db.size();
            db.setZero();
            float* out = db.data();
            for (index_t t = 0; t < N; ++t) {
                const float* row = dy.data() + t * n;
                for (index_t i = 0; i < n; ++i) out[i] += row[i];
            }
        });
    }
};

inline void decoder::train_forward(const train_input& p) {
    train_kit k(*this, p.B, p.L);
    const index_t B = k.B, L = k.L, N = k.N, d = k.d, H = k.H, Hk = k.Hk, D = k.D, Lmax = c_.max_length;
    const auto none = attnkit::detail::gemm_op::none;
    thread_pool* pool = c_.pool;
    decoder_activations& a = *p.a;
    a.layers.resize(layers_.size());

    fit(a.x, N, d);
    timed(prof_.other, [&] {
        if (p.tokens)
            for (index_t t = 0; t < N; ++t) std::copy_n(&embed_((*p.tokens)[static_cast<std::size_t>(t)], 0), d, &a.x(t, 0));
        else
            std::copy_n(p.x0->data(), N * d, a.x.data());
    });
    const index_t emb_width = emb_layout_.layers * (H + Hk) * D;
    if (emb_layout_.layers > 0 && !p.stream) {  // StaticEmbQK: from the embeddings, before any layer
        fit(a.emb_qk, B, L, emb_width);
        timed(prof_.gemm, [&] { embedding_qk_projection(k.v3(a.x), emb_w_, a.emb_qk, emb_layout_, pool); });
        timed(prof_.kernels, [&] { rope(view<float, 4>(a.emb_qk.data(), {B, L, emb_width / D, D}), k.ro); });
    }
    for (index_t li = 0; li <= p.top; ++li) {
        decoder_layer& l = *layers_[static_cast<std::size_t>(li)];
        decoder_activations::layer& s = a.layers[static_cast<std::size_t>(li)];
        const attention_variant kind = train_kit::kind(l, p.stream);
        const bool last = p.stream && li == p.top;  // the stream's top layer: only its q and k are used
        fit(s.x_in, N, d);
        fit(s.h, N, d);
        std::copy_n(a.x.data(), N * d, s.x_in.data());
        timed(prof_.kernels, [&] { rms_norm(k.v3(s.x_in), l.attn_norm, k.v3(s.h), c_.norm_eps, pool); });
        fit(a.dtmp, N, d);  // the sublayer's output before the residual add
        if (kind == attention_variant::mlp) {
            timed(prof_.gemm, [&] { gated_mlp(k.v3(s.h), l.mg, l.mu, l.md, k.v3(a.dtmp), k.mo); });
        } else {
            if (kind == attention_variant::embedding_qk) {
                fit(s.q, N, H * D);
                fit(s.k, N, Hk * D);
                timed(prof_.other, [&] {  // copies out of the shared projection (already rotated)
                    const auto eq = embedding_q(a.emb_qk, emb_layout_, l.emb_index);
                    const auto ek = embedding_k(a.emb_qk, emb_layout_, l.emb_index);
                    const auto q = k.v4(s.q, H), kk = k.v4(s.k, Hk);
                    for (index_t b = 0; b < B; ++b)
                        for (index_t t = 0; t < L; ++t) {
                            for (index_t hh = 0; hh < H; ++hh) std::copy_n(eq.ptr(b, t, hh), D, q.ptr(b, t, hh));
                            for (index_t hh = 0; hh < Hk; ++hh) std::copy_n(ek.ptr(b, t, hh), D, kk.ptr(b, t, hh));
                        }
                });
            } else if (!is_static(kind)) {  // (a static layer's q and k are the stream's)
                fit(s.q, N, H * D);
                fit(s.k, N, Hk * D);
                k.product(s.h, none, l.wq, none, s.q);
                k.product(s.h, none, l.wk, none, s.k);
                if (l.bq.size() > 0)
                    timed(prof_.other, [&] {
                        add_row_bias(s.q.data(), N, l.bq);
                        add_row_bias(s.k.data(), N, l.bk);
                    });
                if (kind == attention_variant::self_gating) {  // q = SiLU(h Wq), before RoPE (decoder.hpp)
                    fit(s.q_lin, N, H * D);
                    timed(prof_.other, [&] {
                        for (index_t i = 0; i < N * H * D; ++i) {
                            const float z = s.q.data()[i];
                            s.q_lin.data()[i] = z;
                            s.q.data()[i] = z / (1.0f + std::exp(-z));
                        }
                    });
                }
                timed(prof_.kernels, [&] {
                    rope(k.v4(s.q, H), k.ro);
                    rope(k.v4(s.k, Hk), k.ro);
                });
            }
            if (last) break;
            fit(s.v, N, Hk * D);
            fit(s.att, N, H * D);
            k.product(s.h, none, l.wv, none, s.v);
            if (l.bv.size() > 0) timed(prof_.other, [&] { add_row_bias(s.v.data(), N, l.bv); });
            const auto v = k.v4(s.v, Hk), att = k.v4(s.att, H);
            timed(prof_.kernels, [&] {
                switch (kind) {
                    case attention_variant::taylor:
                        taylor_attention(k.v4(s.q, H), k.v4(s.k, Hk), v, att, k.to);
                        break;
                    case attention_variant::self_gating:  // lse spares the backward a pass over q and k
                        fit(s.lse, B, L, H);
                        self_gating_attention(k.v4(s.q, H), k.v4(s.k, Hk), v, att, s.lse, k.go);
                        break;
                    case attention_variant::mta:
                        mta_attention(k.v4(s.q, H), k.v4(s.k, Hk), v, att, l.mta_opts(c_));
                        break;
                    case attention_variant::rnd_emb_qk:
                    case attention_variant::fixed_seq_qk: {
                        decoder_activations::layer& f = p.fixed->layers[static_cast<std::size_t>(li)];
                        static_qk_attention(view<const float, 4>(f.q.data(), {1, Lmax, H, D}),
                                            view<const float, 4>(f.k.data(), {1, Lmax, Hk, D}), v, att, k.qo);
                        break;
                    }
                    default:  // standard, embedding_qk
                        fit(s.lse, B, L, H);
                        softmax_attention(k.v4(s.q, H), k.v4(s.k, Hk), v, att, s.lse, k.so);
                }
            });
            k.product(s.att, none, l.wo, none, a.dtmp);
        }
        fit(s.x_mid, N, d);
        fit(s.h2, N, d);
        timed(prof_.other, [&] { add_rows(a.x, a.dtmp, N); });
        std::copy_n(a.x.data(), N * d, s.x_mid.data());
        timed(prof_.kernels, [&] { rms_norm(k.v3(s.x_mid), l.ffn_norm, k.v3(s.h2), c_.norm_eps, pool); });
        timed(prof_.gemm, [&] { gated_mlp(k.v3(s.h2), l.fg, l.fu, l.fd, k.v3(a.dtmp), k.mo); });
        timed(prof_.other, [&] { add_rows(a.x, a.dtmp, N); });
    }
}

// From a.dx, the gradient at the output of layer p.top, down to the input rows; the weight
// gradients into g (overwritten, layers 0 .. p.top). The main pass also writes the embedding's
// token rows (g.embed() initialised by the caller) and each static layer's d_q_fixed / d_k_fixed
// into p.fixed; the stream adds those to its q and k gradients and leaves its input rows'
// gradient in a.dx.
inline void decoder::train_backward(const train_input& p, decoder_gradients& g) {
    using attnkit::detail::gemm_mode;
    train_kit k(*this, p.B, p.L);
    const index_t B = k.B, L = k.L, N = k.N, d = k.d, H = k.H, Hk = k.Hk, D = k.D, Lmax = c_.max_length;
    const auto none = attnkit::detail::gemm_op::none, tr = attnkit::detail::gemm_op::transpose;
    thread_pool* pool = c_.pool;
    decoder_activations& a = *p.a;
    fit(a.dh, N, d);
    fit(a.dtmp, N, d);
    const index_t emb_width = emb_layout_.layers * (H + Hk) * D;
    const bool emb = emb_layout_.layers > 0 && !p.stream;
    if (emb) fit(a.d_emb_qk, N, emb_width);
    for (index_t li = p.top; li >= 0; --li) {
        decoder_layer& l = *layers_[static_cast<std::size_t>(li)];
        decoder_activations::layer& s = a.layers[static_cast<std::size_t>(li)];
        layer_gradients& gl = g.layer(li);
        const attention_variant kind = train_kit::kind(l, p.stream);
        const bool last = p.stream && li == p.top;  // nothing flows in from above: q and k's gradients only
        if (!last) {
            timed(prof_.gemm, [&] { gated_mlp_backward(k.v3(s.h2), l.fg, l.fu, l.fd, k.v3(a.dx), k.v3(a.dh), gl.fg, gl.fu, gl.fd, k.mo); });
            timed(prof_.kernels, [&] { rms_norm_backward(k.v3(s.x_mid), l.ffn_norm, k.v3(a.dh), k.v3(a.dtmp), gl.ffn_norm, c_.norm_eps, pool); });
            timed(prof_.other, [&] { add_rows(a.dx, a.dtmp, N); });
        }
        if (kind == attention_variant::mlp) {
            timed(prof_.gemm, [&] { gated_mlp_backward(k.v3(s.h), l.mg, l.mu, l.md, k.v3(a.dx), k.v3(a.dh), gl.mg, gl.mu, gl.md, k.mo); });
        } else {
            fit(a.dq, N, H * D);
            fit(a.dk, N, Hk * D);
            const auto dq = k.v4(a.dq, H), dk = k.v4(a.dk, Hk);
            if (!last) {
                fit(a.datt, N, H * D);
                fit(a.dv, N, Hk * D);
                k.product(s.att, tr, a.dx, none, gl.wo);
                k.product(a.dx, none, l.wo, tr, a.datt);
                const auto v = k.v4(s.v, Hk), att = k.v4(s.att, H), datt = k.v4(a.datt, H), dv = k.v4(a.dv, Hk);
                timed(prof_.kernels, [&] {
                    switch (kind) {
                        case attention_variant::taylor:
                            taylor_attention_backward(k.v4(s.q, H), k.v4(s.k, Hk), v, att, datt, dq, dk, dv, k.to);
                            break;
                        case attention_variant::self_gating:
                            self_gating_attention_backward(k.v4(s.q, H), k.v4(s.k, Hk), v, att, s.lse, datt, dq, dk, dv,
                                                           k.go);
                            break;
                        case attention_variant::mta: {
                            mta_weight_grads w;
                            w.kq_pre = gl.kq_pre;
                            w.head_pre = gl.head_pre;
                            w.head_post = gl.head_post;
                            w.norm_weight = gl.group_norm;
                            w.gate_weight = gl.gate;
                            mta_attention_backward(k.v4(s.q, H), k.v4(s.k, Hk), v, att, datt, dq, dk, dv, w, l.mta_opts(c_));
                            break;
                        }
                        case attention_variant::rnd_emb_qk:
                        case attention_variant::fixed_seq_qk: {
                            // Q and K are the stream's: their gradient, summed over the batch, goes
                            // to the stream's pass (train_pass), none to this pass's h.
                            decoder_activations::layer& f = p.fixed->layers[static_cast<std::size_t>(li)];
                            fit(f.d_q_fixed, Lmax, H * D);
                            fit(f.d_k_fixed, Lmax, Hk * D);
                            static_qk_attention_backward(view<const float, 4>(f.q.data(), {1, Lmax, H, D}),
                                                         view<const float, 4>(f.k.data(), {1, Lmax, Hk, D}), v, att,
                                                         datt, view<float, 4>(f.d_q_fixed.data(), {1, Lmax, H, D}),
                                                         view<float, 4>(f.d_k_fixed.data(), {1, Lmax, Hk, D}), dv, k.qo);
                            break;
                        }
                        default:
                            softmax_attention_backward(k.v4(s.q, H), k.v4(s.k, Hk), v, att, s.lse, datt, dq, dk, dv, k.so);
                    }
                });
                k.product(s.h, tr, a.dv, none, gl.wv);
                k.product(a.dv, none, l.wv, tr, a.dh);
                if (l.bv.size() > 0) k.column_sums(a.dv, gl.bv);
            }
            if (p.stream && is_static(l.kind)) {
                // The stream's q and k were the main pass's q_fixed and k_fixed: their gradients
                // join those of the stream's own attention (none at the top layer).
                const decoder_activations::layer& s2 = s;
                timed(prof_.other, [&] {
                    if (last) {
                        std::copy_n(s2.d_q_fixed.data(), N * H * D, a.dq.data());
                        std::copy_n(s2.d_k_fixed.data(), N * Hk * D, a.dk.data());
                    } else {
                        add_rows(a.dq, s2.d_q_fixed, N);
                        add_rows(a.dk, s2.d_k_fixed, N);
                    }
                });
            }
            if (is_static(kind)) {  // the main pass: Wq, Wk, bq, bk have gradients through the stream only
                gl.wq.setZero();
                gl.wk.setZero();
                if (l.bq.size() > 0) {
                    gl.bq.setZero();
                    gl.bk.setZero();
                }
            } else if (kind == attention_variant::embedding_qk) {
                // Q and K came from the shared projection: their gradients go to its slices,
                // which run back through RoPE and the projection once, after the last layer.
                timed(prof_.other, [&] {
                    const index_t w = (H + Hk) * D, at = l.emb_index * w;
                    for (index_t t = 0; t < N; ++t) {
                        std::copy_n(&a.dq(t, 0), H * D, &a.d_emb_qk(t, at));
                        std::copy_n(&a.dk(t, 0), Hk * D, &a.d_emb_qk(t, at + H * D));
                    }
                });
            } else {
                timed(prof_.kernels, [&] {
                    rope_backward(dq, k.ro);
                    rope_backward(dk, k.ro);
                });
                if (kind == attention_variant::self_gating)  // SiLU'(z) = s (1 + z (1 - s)), s = sigmoid(z)
                    timed(prof_.other, [&] {
                        for (index_t i = 0; i < N * H * D; ++i) {
                            const float z = s.q_lin.data()[i], sg = 1.0f / (1.0f + std::exp(-z));
                            a.dq.data()[i] *= sg * (1.0f + z * (1.0f - sg));
                        }
                    });
                k.product(s.h, tr, a.dq, none, gl.wq);
                k.product(s.h, tr, a.dk, none, gl.wk);
                if (l.bq.size() > 0) {  // added before SiLU and RoPE: dq and dk as they are here
                    k.column_sums(a.dq, gl.bq);
                    k.column_sums(a.dk, gl.bk);
                }
                k.product(a.dq, none, l.wq, tr, a.dh, last ? gemm_mode::assign : gemm_mode::add);
                k.product(a.dk, none, l.wk, tr, a.dh, gemm_mode::add);
            }
        }
        timed(prof_.kernels, [&] { rms_norm_backward(k.v3(s.x_in), l.attn_norm, k.v3(a.dh), k.v3(a.dtmp), gl.attn_norm, c_.norm_eps, pool); });
        timed(prof_.other, [&] { add_rows(a.dx, a.dtmp, N); });
    }
    if (emb) {
        // The embeddings fed the shared projection too: d_e joins the residual's gradient, and
        // the stacked weight's gradient goes back to each layer's Wq and Wk.
        fit(a.d_e, N, d);
        fit(a.d_emb_w, d, emb_width);
        const auto& e = a.layers.front().x_in;  // the token embeddings, the first layer's input
        timed(prof_.kernels, [&] { rope_backward(view<float, 4>(a.d_emb_qk.data(), {B, L, emb_width / D, D}), k.ro); });
        timed(prof_.gemm, [&] {
            embedding_qk_projection_backward(view<const float, 3>(e.data(), {B, L, d}), emb_w_,
                                             view<const float, 3>(a.d_emb_qk.data(), {B, L, emb_width}), k.v3(a.d_e),
                                             a.d_emb_w, emb_layout_, pool);
        });
        timed(prof_.other, [&] {
            add_rows(a.dx, a.d_e, N);
            const index_t w = (H + Hk) * D;
            for (const auto& lp : layers_) {
                if (lp->emb_index < 0) continue;
                layer_gradients& gl = g.layer(lp->index);
                for (index_t i = 0; i < d; ++i) {
                    std::copy_n(&a.d_emb_w(i, lp->emb_index * w), H * D, &gl.wq(i, 0));
                    std::copy_n(&a.d_emb_w(i, lp->emb_index * w + H * D), Hk * D, &gl.wk(i, 0));
                }
            }
        });
    }
    if (p.stream) return;
    // The embedding rows: one running sum per row in token order, on one thread (a token that
    // repeats adds its rows in the same order for any pool).
    timed(prof_.other, [&] {
        tensor2& ge = g.embed();
        for (index_t t = 0; t < N; ++t) {
            float* row = &ge((*p.tokens)[static_cast<std::size_t>(t)], 0);
            const float* src = &a.dx(t, 0);
            for (index_t i = 0; i < d; ++i) row[i] += src[i];
        }
    });
}

inline double decoder::train_pass(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>* targets,
                                  index_t batch, decoder_gradients* g) {
    using attnkit::detail::gemm_op;
    const index_t L = check_batch(tokens, targets, batch);
    const index_t N = batch * L, d = c_.d_model, V = c_.vocab, Lmax = c_.max_length;
    thread_pool* pool = c_.pool;
    decoder_activations& a = act_;

    // The fixed stream's pass (rnd_emb_qk / fixed_seq_qk), up to the highest static layer: its
    // q and k there are the static layers' q_fixed and k_fixed, from the current weights.
    index_t top = -1;
    for (std::size_t li = 0; li < kinds_.size(); ++li)
        if (is_static(kinds_[li])) top = static_cast<index_t>(li);
    if (top >= 0 && !a.stream) a.stream = std::make_unique<decoder_activations>();
    const train_input sp{a.stream.get(), stream_tokens_.empty() ? nullptr : &stream_tokens_, &stream_x_, 1, Lmax, true,
                         top, nullptr};
    if (top >= 0) train_forward(sp);

    const train_input mp{&a, &tokens, nullptr, batch, L, false, static_cast<index_t>(layers_.size()) - 1,
                         a.stream.get()};
    train_forward(mp);
    train_kit k(*this, batch, L);
    const auto none = gemm_op::none, tr = gemm_op::transpose;
    fit(a.xf, N, d);
    fit(a.logits, N, V);
    timed(prof_.kernels, [&] { rms_norm(k.v3(a.x), final_norm_, k.v3(a.xf), c_.norm_eps, pool); });
    k.product(a.xf, none, head_t_, none, a.logits);
    if (!targets) return 0.0;  // batch_logits
    double loss = 0.0;
    // The logits' gradient replaces them: nothing after the loss reads the logits.
    timed(prof_.kernels, [&] { loss = cross_entropy(a.logits, *targets, a.logits, pool); });
    if (!g) return loss;

    // ---- backward ----
    fit(a.dx, N, d);
    fit(a.dtmp, N, d);
    if (c_.tie_word_embeddings) {
        k.product(a.logits, tr, a.xf, none, g->embed());  // the tied head: dE = dlogits^T xf
    } else {
        k.product(a.logits, tr, a.xf, none, g->lm_head());  // dW = dlogits^T xf
        g->embed().setZero();                                // only the token rows below
    }
    k.product(a.logits, none, head(), none, a.dtmp);  // d xf = dlogits W (W = E when tied)
    timed(prof_.kernels, [&] { rms_norm_backward(k.v3(a.x), final_norm_, k.v3(a.dtmp), k.v3(a.dx), g->final_norm(), c_.norm_eps, pool); });
    train_backward(mp, *g);
    if (top < 0) return loss;

    // The stream's backward, from zero at its top (its output is not used), into its own
    // gradients, then added to the main pass's in a fixed order (the same bits for any pool).
    decoder_activations& s = *a.stream;
    if (!a.stream_grads) a.stream_grads = std::make_unique<decoder_gradients>(*this);
    decoder_gradients& sg = *a.stream_grads;
    fit(s.dx, Lmax, d);
    s.dx.setZero();
    train_backward(sp, sg);
    timed(prof_.other, [&] {
        const auto add = [](auto& dst, const auto& src) {
            for (index_t i = 0; i < static_cast<index_t>(dst.size()); ++i) dst.data()[i] += src.data()[i];
        };
        for (index_t li = 0; li <= top; ++li) {
            layer_gradients &gl = g->layer(li), &sl = sg.layer(li);
            if (li == top) {  // the top layer: only its q and k ran in the stream
                add(gl.attn_norm, sl.attn_norm);
                add(gl.wq, sl.wq);
                add(gl.wk, sl.wk);
                if (gl.bq.size() > 0) {
                    add(gl.bq, sl.bq);
                    add(gl.bk, sl.bk);
                }
                continue;
            }
            std::vector<std::pair<const float*, index_t>> from;
            const decoder_layer& l = *layers_[static_cast<std::size_t>(li)];
            for_each_layer_parameter(l.kind, c_.attention_bias, li, sl, [&](const std::string&, const auto& t) {
                from.emplace_back(t.data(), static_cast<index_t>(t.size()));
            });
            std::size_t i = 0;
            for_each_layer_parameter(l.kind, c_.attention_bias, li, gl, [&](const std::string&, auto& t) {
                const float* src = from[i++].first;
                for (index_t j = 0; j < static_cast<index_t>(t.size()); ++j) t.data()[j] += src[j];
            });
        }
        // fixed_seq_qk: the stream's input rows are its tokens' embedding rows (in token order);
        // rnd_emb_qk's are a constant.
        if (!stream_tokens_.empty()) {
            tensor2& ge = g->embed();
            for (index_t t = 0; t < Lmax; ++t) {
                float* row = &ge(stream_tokens_[static_cast<std::size_t>(t)], 0);
                const float* src = &s.dx(t, 0);
                for (index_t i = 0; i < d; ++i) row[i] += src[i];
            }
        }
    });
    return loss;
}

}  // namespace model
}  // namespace attnkit
