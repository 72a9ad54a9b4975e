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
// rnd_emb_qk and fixed_seq_qk layers do not train here: their Q and K come from a fixed stream
// run through the whole model, whose gradient would need a second backward through the model
// over that stream; the call is rejected.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "attnkit/detail/gemm.hpp"
#include "attnkit/embedding_qk_backward.hpp"
#include "attnkit/gated_mlp_backward.hpp"
#include "attnkit/model/cross_entropy.hpp"
#include "attnkit/model/decoder.hpp"
#include "attnkit/mta_attention_backward.hpp"
#include "attnkit/self_gating_attention_backward.hpp"
#include "attnkit/softmax_attention_backward.hpp"
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
    for (attention_variant k : kinds_)
        if (is_static(k))
            throw std::invalid_argument(who + "layers of kind " + attention_variant_name(k) +
                                        " do not train (their Q and K come from the fixed stream)");
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

inline double decoder::train_pass(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>* targets,
                                  index_t batch, decoder_gradients* g) {
    using attnkit::detail::gemm_blocks;
    using attnkit::detail::gemm_mode;
    using attnkit::detail::gemm_op;
    using attnkit::detail::matrix_ref;
    const index_t L = check_batch(tokens, targets, batch);
    const index_t B = batch, N = B * L, d = c_.d_model, H = c_.heads, Hk = c_.heads_kv, D = c_.head_dim();
    const index_t V = c_.vocab;
    thread_pool* pool = c_.pool;
    decoder_activations& a = act_;
    a.layers.resize(layers_.size());

    // Products on a fixed grid of C's blocks (gemm_blocks): bitwise the same for any pool.
    constexpr index_t kRows = 64, kCols = 256;
    const auto cm = [](const tensor2& t) { return matrix_ref<const float>{t.data(), t.dimension(0), t.dimension(1), t.dimension(1)}; };
    const auto mm = [](tensor2& t) { return matrix_ref<float>{t.data(), t.dimension(0), t.dimension(1), t.dimension(1)}; };
    // C = op(A) op(B) (or +=), timed as GEMM.
    const auto product = [&](const tensor2& x, gemm_op ox, const tensor2& w, gemm_op ow, tensor2& c,
                             gemm_mode mode = gemm_mode::assign) {
        timed(prof_.gemm, [&] { gemm_blocks(cm(x), ox, cm(w), ow, mm(c), pool, kRows, kCols, mode); });
    };
    const auto none = gemm_op::none, tr = gemm_op::transpose;
    const auto v4 = [&](tensor2& t, index_t heads) { return view<float, 4>(t.data(), {B, L, heads, D}); };
    const auto v3 = [&](tensor2& t) { return view<float, 3>(t.data(), {B, L, t.dimension(1)}); };
    rope_options ro{c_.rope_theta, 0, pool};
    ro.cache = rope_cache_.get();
    softmax_options so;
    so.causal = true;
    so.pool = pool;
    taylor_options to;
    to.causal = true;
    to.pool = pool;
    self_gating_options go;
    go.causal = true;
    go.pool = pool;
    const gated_mlp_options mo{pool};

    // ---- forward ----
    fit(a.x, N, d);
    timed(prof_.other, [&] {
        for (index_t t = 0; t < N; ++t) std::copy_n(&embed_(tokens[static_cast<std::size_t>(t)], 0), d, &a.x(t, 0));
    });
    const index_t emb_width = emb_layout_.layers * (H + Hk) * D;
    if (emb_layout_.layers > 0) {  // StaticEmbQK: from the embeddings, before any layer
        fit(a.emb_qk, B, L, emb_width);
        timed(prof_.gemm, [&] { embedding_qk_projection(v3(a.x), emb_w_, a.emb_qk, emb_layout_, pool); });
        timed(prof_.kernels, [&] { rope(view<float, 4>(a.emb_qk.data(), {B, L, emb_width / D, D}), ro); });
    }
    for (std::size_t li = 0; li < layers_.size(); ++li) {
        decoder_layer& l = *layers_[li];
        decoder_activations::layer& s = a.layers[li];
        fit(s.x_in, N, d);
        fit(s.h, N, d);
        fit(s.x_mid, N, d);
        fit(s.h2, N, d);
        std::copy_n(a.x.data(), N * d, s.x_in.data());
        timed(prof_.kernels, [&] { rms_norm(v3(s.x_in), l.attn_norm, v3(s.h), c_.norm_eps, pool); });
        fit(a.dtmp, N, d);  // the sublayer's output before the residual add
        if (l.kind == attention_variant::mlp) {
            timed(prof_.gemm, [&] { gated_mlp(v3(s.h), l.mg, l.mu, l.md, v3(a.dtmp), mo); });
        } else {
            fit(s.q, N, H * D);
            fit(s.k, N, Hk * D);
            fit(s.v, N, Hk * D);
            fit(s.att, N, H * D);
            product(s.h, none, l.wv, none, s.v);
            if (l.bv.size() > 0) timed(prof_.other, [&] { add_row_bias(s.v.data(), N, l.bv); });
            if (l.kind == attention_variant::embedding_qk) {
                timed(prof_.other, [&] {  // copies out of the shared projection (already rotated)
                    const auto eq = embedding_q(a.emb_qk, emb_layout_, l.emb_index);
                    const auto ek = embedding_k(a.emb_qk, emb_layout_, l.emb_index);
                    const auto q = v4(s.q, H), k = v4(s.k, Hk);
                    for (index_t b = 0; b < B; ++b)
                        for (index_t t = 0; t < L; ++t) {
                            for (index_t hh = 0; hh < H; ++hh) std::copy_n(eq.ptr(b, t, hh), D, q.ptr(b, t, hh));
                            for (index_t hh = 0; hh < Hk; ++hh) std::copy_n(ek.ptr(b, t, hh), D, k.ptr(b, t, hh));
                        }
                });
            } else {
                product(s.h, none, l.wq, none, s.q);
                product(s.h, none, l.wk, none, s.k);
                if (l.bq.size() > 0)
                    timed(prof_.other, [&] {
                        add_row_bias(s.q.data(), N, l.bq);
                        add_row_bias(s.k.data(), N, l.bk);
                    });
                if (l.kind == attention_variant::self_gating) {  // q = SiLU(h Wq), before RoPE (decoder.hpp)
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
                    rope(v4(s.q, H), ro);
                    rope(v4(s.k, Hk), ro);
                });
            }
            const auto q = v4(s.q, H), k = v4(s.k, Hk), v = v4(s.v, Hk), att = v4(s.att, H);
            timed(prof_.kernels, [&] {
                switch (l.kind) {
                    case attention_variant::taylor:
                        taylor_attention(q, k, v, att, to);
                        break;
                    case attention_variant::self_gating:
                        self_gating_attention(q, k, v, att, go);
                        break;
                    case attention_variant::mta:
                        mta_attention(q, k, v, att, l.mta_opts(c_));
                        break;
                    default:  // standard, embedding_qk
                        fit(s.lse, B, L, H);
                        softmax_attention(q, k, v, att, s.lse, so);
                }
            });
            product(s.att, none, l.wo, none, a.dtmp);
        }
        timed(prof_.other, [&] { add_rows(a.x, a.dtmp, N); });
        std::copy_n(a.x.data(), N * d, s.x_mid.data());
        timed(prof_.kernels, [&] { rms_norm(v3(s.x_mid), l.ffn_norm, v3(s.h2), c_.norm_eps, pool); });
        timed(prof_.gemm, [&] { gated_mlp(v3(s.h2), l.fg, l.fu, l.fd, v3(a.dtmp), mo); });
        timed(prof_.other, [&] { add_rows(a.x, a.dtmp, N); });
    }
    fit(a.xf, N, d);
    fit(a.logits, N, V);
    timed(prof_.kernels, [&] { rms_norm(v3(a.x), final_norm_, v3(a.xf), c_.norm_eps, pool); });
    product(a.xf, none, head_t_, none, a.logits);
    if (!targets) return 0.0;  // batch_logits
    double loss = 0.0;
    // The logits' gradient replaces them: nothing after the loss reads the logits.
    timed(prof_.kernels, [&] { loss = cross_entropy(a.logits, *targets, a.logits, pool); });
    if (!g) return loss;

    // ---- backward ----
    fit(a.dx, N, d);
    fit(a.dh, N, d);
    if (c_.tie_word_embeddings) {
        product(a.logits, tr, a.xf, none, g->embed());  // the tied head: dE = dlogits^T xf
    } else {
        product(a.logits, tr, a.xf, none, g->lm_head());  // dW = dlogits^T xf
        g->embed().setZero();                              // only the token rows below
    }
    product(a.logits, none, head(), none, a.dtmp);  // d xf = dlogits W (W = E when tied)
    // A bias's gradient: the column sums of its projection's output gradient, one running sum
    // per column in token order on one thread (the same bits for any pool).
    const auto column_sums = [&](const tensor2& dy, tensor1& db) {
        timed(prof_.other, [&] {
            const index_t n = db.size();
            db.setZero();
            float* out = db.data();
            for (index_t t = 0; t < N; ++t) {
                const float* row = dy.data() + t * n;
                for (index_t i = 0; i < n; ++i) out[i] += row[i];
            }
        });
    };
    timed(prof_.kernels, [&] { rms_norm_backward(v3(a.x), final_norm_, v3(a.dtmp), v3(a.dx), g->final_norm(), c_.norm_eps, pool); });
    if (emb_layout_.layers > 0) fit(a.d_emb_qk, N, emb_width);
    for (std::size_t li = layers_.size(); li-- > 0;) {
        decoder_layer& l = *layers_[li];
        decoder_activations::layer& s = a.layers[li];
        layer_gradients& gl = g->layer(static_cast<index_t>(li));
        timed(prof_.gemm, [&] { gated_mlp_backward(v3(s.h2), l.fg, l.fu, l.fd, v3(a.dx), v3(a.dh), gl.fg, gl.fu, gl.fd, mo); });
        timed(prof_.kernels, [&] { rms_norm_backward(v3(s.x_mid), l.ffn_norm, v3(a.dh), v3(a.dtmp), gl.ffn_norm, c_.norm_eps, pool); });
        timed(prof_.other, [&] { add_rows(a.dx, a.dtmp, N); });
        if (l.kind == attention_variant::mlp) {
            timed(prof_.gemm, [&] { gated_mlp_backward(v3(s.h), l.mg, l.mu, l.md, v3(a.dx), v3(a.dh), gl.mg, gl.mu, gl.md, mo); });
        } else {
            fit(a.datt, N, H * D);
            fit(a.dq, N, H * D);
            fit(a.dk, N, Hk * D);
            fit(a.dv, N, Hk * D);
            product(s.att, tr, a.dx, none, gl.wo);
            product(a.dx, none, l.wo, tr, a.datt);
            const auto q = v4(s.q, H), k = v4(s.k, Hk), v = v4(s.v, Hk), att = v4(s.att, H), datt = v4(a.datt, H);
            const auto dq = v4(a.dq, H), dk = v4(a.dk, Hk), dv = v4(a.dv, Hk);
            timed(prof_.kernels, [&] {
                switch (l.kind) {
                    case attention_variant::taylor:
                        taylor_attention_backward(q, k, v, att, datt, dq, dk, dv, to);
                        break;
                    case attention_variant::self_gating:
                        self_gating_attention_backward(q, k, v, att, datt, dq, dk, dv, go);
                        break;
                    case attention_variant::mta: {
                        mta_weight_grads w;
                        w.kq_pre = gl.kq_pre;
                        w.head_pre = gl.head_pre;
                        w.head_post = gl.head_post;
                        w.norm_weight = gl.group_norm;
                        w.gate_weight = gl.gate;
                        mta_attention_backward(q, k, v, att, datt, dq, dk, dv, w, l.mta_opts(c_));
                        break;
                    }
                    default:
                        softmax_attention_backward(q, k, v, att, s.lse, datt, dq, dk, dv, so);
                }
            });
            product(s.h, tr, a.dv, none, gl.wv);
            product(a.dv, none, l.wv, tr, a.dh);
            if (l.bv.size() > 0) column_sums(a.dv, gl.bv);
            if (l.kind == attention_variant::embedding_qk) {
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
                    rope_backward(dq, ro);
                    rope_backward(dk, ro);
                });
                if (l.kind == attention_variant::self_gating)  // SiLU'(z) = s (1 + z (1 - s)), s = sigmoid(z)
                    timed(prof_.other, [&] {
                        for (index_t i = 0; i < N * H * D; ++i) {
                            const float z = s.q_lin.data()[i], sg = 1.0f / (1.0f + std::exp(-z));
                            a.dq.data()[i] *= sg * (1.0f + z * (1.0f - sg));
                        }
                    });
                product(s.h, tr, a.dq, none, gl.wq);
                product(s.h, tr, a.dk, none, gl.wk);
                if (l.bq.size() > 0) {  // added before SiLU and RoPE: dq and dk as they are here
                    column_sums(a.dq, gl.bq);
                    column_sums(a.dk, gl.bk);
                }
                product(a.dq, none, l.wq, tr, a.dh, gemm_mode::add);
                product(a.dk, none, l.wk, tr, a.dh, gemm_mode::add);
            }
        }
        timed(prof_.kernels, [&] { rms_norm_backward(v3(s.x_in), l.attn_norm, v3(a.dh), v3(a.dtmp), gl.attn_norm, c_.norm_eps, pool); });
        timed(prof_.other, [&] { add_rows(a.dx, a.dtmp, N); });
    }
    if (emb_layout_.layers > 0) {
        // The embeddings fed the shared projection too: d_e joins the residual's gradient, and
        // the stacked weight's gradient goes back to each layer's Wq and Wk.
        fit(a.d_e, N, d);
        fit(a.d_emb_w, d, emb_width);
        const auto& e = a.layers.front().x_in;  // the token embeddings, the first layer's input
        timed(prof_.kernels, [&] { rope_backward(view<float, 4>(a.d_emb_qk.data(), {B, L, emb_width / D, D}), ro); });
        timed(prof_.gemm, [&] {
            embedding_qk_projection_backward(view<const float, 3>(e.data(), {B, L, d}), emb_w_,
                                             view<const float, 3>(a.d_emb_qk.data(), {B, L, emb_width}), v3(a.d_e),
                                             a.d_emb_w, emb_layout_, pool);
        });
        timed(prof_.other, [&] {
            add_rows(a.dx, a.d_e, N);
            const index_t w = (H + Hk) * D;
            for (const auto& lp : layers_) {
                if (lp->emb_index < 0) continue;
                layer_gradients& gl = g->layer(lp->index);
                for (index_t i = 0; i < d; ++i) {
                    std::copy_n(&a.d_emb_w(i, lp->emb_index * w), H * D, &gl.wq(i, 0));
                    std::copy_n(&a.d_emb_w(i, lp->emb_index * w + H * D), Hk * D, &gl.wk(i, 0));
                }
            }
        });
    }
    // The embedding rows: one running sum per row in token order, on one thread (a token that
    // repeats adds its rows in the same order for any pool).
    timed(prof_.other, [&] {
        tensor2& ge = g->embed();
        for (index_t t = 0; t < N; ++t) {
            float* row = &ge(tokens[static_cast<std::size_t>(t)], 0);
            const float* src = &a.dx(t, 0);
            for (index_t i = 0; i < d; ++i) row[i] += src[i];
        }
    });
    return loss;
}

}  // namespace model
}  // namespace attnkit
