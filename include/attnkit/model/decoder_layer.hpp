// One layer of the decoder template (model/decoder.hpp): its weights, its KV cache or variant
// state, and the attention step of its kind. Weights are N(0, 0.02) from the decoder's seeded
// generator (norm weights 1; q/k/v biases 0; MTA kernels identity plus N(0, 0.01) noise, the
// initialisation under which MTA starts as standard attention).
#pragma once

#include <algorithm>
#include <memory>
#include <string>

#include "attnkit/eigen.hpp"
#include "attnkit/embedding_qk.hpp"
#include "attnkit/gated_mlp.hpp"
#include "attnkit/model/rms_norm.hpp"
#include "attnkit/model/rope.hpp"
#include "attnkit/mta_attention.hpp"
#include "attnkit/reference/mta_attention.hpp"
#include "attnkit/reference/self_gating_attention.hpp"
#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/reference/static_qk_attention.hpp"
#include "attnkit/reference/taylor_attention.hpp"
#include "attnkit/self_gating_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/static_qk_attention.hpp"
#include "attnkit/model/decoder_config.hpp"
#include "attnkit/taylor_attention.hpp"

namespace attnkit {
namespace model {

using tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;

// Every trainable tensor of layer l of kind `kind`, in a fixed order, under its Hugging Face
// Llama / Qwen2 name (model.layers.l.self_attn.q_proj.weight, ...) or, for a variant's own
// weights, a name beside them (token_mlp.*, self_attn.mta.*). Projections are stored [in, out],
// the transpose of Hugging Face's [out, in], so that a projection is one row-major GEMM of the
// activations; checkpoint code (model/checkpoint.hpp) transposes every *_proj.weight. With
// `bias` (decoder_config::attention_bias) the q/k/v biases follow their weights, as in Qwen2's
// modules; an embedding_qk layer has no q/k bias (decoder_config.hpp). `p` is a decoder_layer or
// a layer_gradients: the two share the member names, so one walk names both the weights and
// their gradients.
template <class Layer, class F>
void for_each_layer_parameter(attention_variant kind, bool bias, index_t l, Layer& p, F&& f) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    f(pre + "input_layernorm.weight", p.attn_norm);
    if (kind == attention_variant::mlp) {
        f(pre + "token_mlp.gate_proj.weight", p.mg);
        f(pre + "token_mlp.up_proj.weight", p.mu);
        f(pre + "token_mlp.down_proj.weight", p.md);
    } else {
        const bool qk_bias = bias && kind != attention_variant::embedding_qk;
        f(pre + "self_attn.q_proj.weight", p.wq);
        if (qk_bias) f(pre + "self_attn.q_proj.bias", p.bq);
        f(pre + "self_attn.k_proj.weight", p.wk);
        if (qk_bias) f(pre + "self_attn.k_proj.bias", p.bk);
        f(pre + "self_attn.v_proj.weight", p.wv);
        if (bias) f(pre + "self_attn.v_proj.bias", p.bv);
        f(pre + "self_attn.o_proj.weight", p.wo);
    }
    if (kind == attention_variant::mta) {
        f(pre + "self_attn.mta.kq_pre", p.kq_pre);
        f(pre + "self_attn.mta.head_pre", p.head_pre);
        f(pre + "self_attn.mta.head_post", p.head_post);
        f(pre + "self_attn.mta.group_norm.weight", p.group_norm);
        f(pre + "self_attn.mta.gate.weight", p.gate);
    }
    f(pre + "post_attention_layernorm.weight", p.ffn_norm);
    f(pre + "mlp.gate_proj.weight", p.fg);
    f(pre + "mlp.up_proj.weight", p.fu);
    f(pre + "mlp.down_proj.weight", p.fd);
}

// y [rows, b.size()] += b on every row: a projection's bias. Rows are independent and each
// element one add, so the result is the same whatever splits the rows.
inline void add_row_bias(float* y, index_t rows, const tensor1& b) {
    const index_t n = b.size();
    const float* bb = b.data();
    for (index_t r = 0; r < rows; ++r) {
        float* row = y + r * n;
        for (index_t i = 0; i < n; ++i) row[i] += bb[i];
    }
}

struct decoder_layer {
    // MTA's key-query convolution: c_q query taps, c_k key taps (the paper's 6 x 11).
    static constexpr index_t kMtaQueryTaps = 6, kMtaKeyTaps = 11;

    attention_variant kind;
    index_t index;
    index_t emb_index = -1;             // embedding_qk: this layer's slot in the stacked projection
    tensor1 attn_norm, ffn_norm;
    tensor2 wq, wk, wv, wo;             // [d, H*D], [d, Hk*D], [d, Hk*D], [H*D, d]
    tensor1 bq, bk, bv;                 // attention_bias: [H*D], [Hk*D], [Hk*D] (embedding_qk: bv only)
    tensor2 mg, mu, md;                 // mlp kind: the sublayer's gated MLP
    tensor2 fg, fu, fd;                 // the SwiGLU feed-forward
    tensor4 k_cache, v_cache;           // [1, max_length, Hk, D] (static kinds: values only)
    tensor4 q_fixed, k_fixed;           // static kinds: the fixed stream's Q and K
    tensor4 kq_pre;                     // mta: [H, 1, c_q, c_k]
    tensor2 head_pre, head_post;        // mta: [H, H]
    tensor1 group_norm, gate;           // mta: [D]
    std::unique_ptr<static_attention_map> map;
    std::unique_ptr<taylor_state> taylor;
    std::unique_ptr<self_gating_state> gating;
    std::unique_ptr<mta_state> mta;

    // rng == nullptr: every tensor allocated and zero, nothing drawn (a checkpoint's load
    // overwrites them all; drawing first would cost as long as reading the file).
    decoder_layer(const decoder_config& c, attention_variant k, index_t l, weight_rng* rng) : kind(k), index(l) {
        const index_t d = c.d_model, H = c.heads, Hk = c.heads_kv, D = c.head_dim(), f = c.ffn_width();
        attn_norm = ones(d);
        ffn_norm = ones(d);
        if (kind == attention_variant::mlp) {
            const index_t m = gated_mlp_width(d);
            mg = random(rng, d, m);
            mu = random(rng, d, m);
            md = random(rng, m, d);
        } else {
            wq = random(rng, d, H * D);
            wk = random(rng, d, Hk * D);
            wv = random(rng, d, Hk * D);
            wo = random(rng, H * D, d);
            if (c.attention_bias) {  // zeros: no draw, so a seed gives the same weights with or without
                if (kind != attention_variant::embedding_qk) {
                    bq = zeros(H * D);
                    bk = zeros(Hk * D);
                }
                bv = zeros(Hk * D);
            }
            k_cache = tensor4(1, c.max_length, Hk, D);
            v_cache = tensor4(1, c.max_length, Hk, D);
        }
        if (kind == attention_variant::mta) {
            kq_pre = tensor4(H, 1, kMtaQueryTaps, kMtaKeyTaps);
            head_pre = tensor2(H, H);
            head_post = tensor2(H, H);
            gate = tensor1(D);
            if (rng) {
                rng->fill(kq_pre, 0.01f);
                rng->fill(head_pre, 0.01f);
                rng->fill(head_post, 0.01f);
                for (index_t h = 0; h < H; ++h) {
                    kq_pre(h, 0, kMtaQueryTaps - 1, (kMtaKeyTaps - 1) / 2) += 1.0f;
                    head_pre(h, h) += 1.0f;
                    head_post(h, h) += 1.0f;
                }
                rng->fill(gate, 0.02f);
            } else {
                kq_pre.setZero();
                head_pre.setZero();
                head_post.setZero();
                gate.setZero();
            }
            group_norm = ones(D);
        }
        fg = random(rng, d, f);
        fu = random(rng, d, f);
        fd = random(rng, f, d);
    }

    mta_options mta_opts(const decoder_config& c) const {
        mta_options o;
        o.kq_pre = kq_pre;
        o.head_pre = head_pre;
        o.head_post = head_post;
        o.norm_weight = group_norm;
        o.norm_layer = index;
        o.gate_weight = gate;
        o.pool = c.pool;
        return o;
    }

    // Fresh decode state for a new sequence (caches are overwritten as positions fill).
    void reset_state(const decoder_config& c) {
        const index_t H = c.heads, Hk = c.heads_kv, D = c.head_dim();
        if (kind == attention_variant::taylor) {
            taylor_options o;
            o.causal = true;
            o.pool = c.pool;
            taylor = std::make_unique<taylor_state>(1, H, Hk, D, D, o);
        } else if (kind == attention_variant::self_gating) {
            self_gating_options o;
            o.causal = true;
            o.pool = c.pool;
            gating = std::make_unique<self_gating_state>(1, H, Hk, D, D, o);
        } else if (kind == attention_variant::mta) {
            mta = std::make_unique<mta_state>(1, H, Hk, D, D, mta_opts(c));
        }
    }

    void build_map(const decoder_config& c) {
        static_qk_options o;
        o.pool = c.pool;
        map = std::make_unique<static_attention_map>(q_fixed, k_fixed, o);
    }

    // att = this layer's attention for T new tokens at positions pos .. pos + T - 1. In the
    // fixed-stream pass (stream) every layer is standard attention over the stream, and the
    // static layers keep the stream's Q and K.
    void attend(const decoder_config& c, const view<float, 4>& q, const view<float, 4>& k, const view<float, 4>& v,
                const view<float, 4>& att, index_t pos, bool stream) {
        const index_t T = q.dims[1], H = c.heads, Hk = c.heads_kv, D = c.head_dim();
        softmax_options so;
        so.causal = true;
        so.pool = c.pool;
        if (stream) {
            softmax_attention(q, k, v, att, so);
            if (kind == attention_variant::rnd_emb_qk || kind == attention_variant::fixed_seq_qk) {
                q_fixed = tensor4(1, T, H, D);
                k_fixed = tensor4(1, T, Hk, D);
                std::copy_n(q.data, T * H * D, q_fixed.data());
                std::copy_n(k.data, T * Hk * D, k_fixed.data());
            }
            return;
        }
        const auto cache_prefix = [&](tensor4& t) {
            return view<const float, 4>(t.data(), {1, pos + T, Hk, D});
        };
        switch (kind) {
            case attention_variant::standard:
            case attention_variant::embedding_qk:
                std::copy_n(k.data, T * Hk * D, k_cache.data() + pos * Hk * D);
                std::copy_n(v.data, T * Hk * D, v_cache.data() + pos * Hk * D);
                softmax_attention(q, cache_prefix(k_cache), cache_prefix(v_cache), att, so);
                break;
            case attention_variant::taylor:
                taylor->step(q, k, v, att);
                break;
            case attention_variant::self_gating:  // q is SiLU(Wq . n) here (decoder.hpp)
                gating->step(q, k, v, att);
                break;
            case attention_variant::mta:
                mta->step(q, k, v, att);
                break;
            case attention_variant::rnd_emb_qk:
            case attention_variant::fixed_seq_qk: {
                std::copy_n(v.data, T * Hk * D, v_cache.data() + pos * Hk * D);
                if (pos == 0) {
                    static_qk_options o;
                    o.pool = c.pool;
                    static_qk_attention(q_fixed, k_fixed, cache_prefix(v_cache), att, o);
                } else {
                    map->apply(cache_prefix(v_cache), att, c.pool);
                }
                break;
            }
            case attention_variant::mlp:
                break;  // no attention: the decoder runs the sublayer's MLP instead
        }
    }

    // The normalised weights [H, T, T] this layer's oracle gives for a whole sequence from
    // position 0 (q, k, v as attend() gets them): what the diagnostics of Xue et al. read.
    Eigen::Tensor<double, 3, Eigen::RowMajor> reference_weights(const decoder_config& c, const view<float, 4>& q,
                                                                const view<float, 4>& k, const view<float, 4>& v) const {
        const index_t T = q.dims[1], H = c.heads, D = c.head_dim();
        Eigen::Tensor<double, 4, Eigen::RowMajor> out(1, T, H, D), w4;
        Eigen::Tensor<double, 3, Eigen::RowMajor> w3;
        const view<const float, 4> cq = q, ck = k, cv = v;
        switch (kind) {
            case attention_variant::standard:
            case attention_variant::embedding_qk: {
                softmax_options o;
                o.causal = true;
                reference::softmax_attention_weights(cq, ck, cv, out, w4, o);
                break;
            }
            case attention_variant::taylor: {
                taylor_options o;
                o.causal = true;
                reference::taylor_attention(cq, ck, cv, out, w4, o);
                break;
            }
            case attention_variant::self_gating: {
                self_gating_options o;
                o.causal = true;
                reference::self_gating_attention(cq, ck, cv, out, w4, o);
                break;
            }
            case attention_variant::mta:
                reference::mta_attention(cq, ck, cv, out, w4, mta_opts(c));
                break;
            case attention_variant::rnd_emb_qk:
            case attention_variant::fixed_seq_qk:
                reference::static_qk_attention(q_fixed, k_fixed, cv, out, w3, static_qk_options{});
                return w3;
            case attention_variant::mlp:
                return w3;  // no token mixing: no weights
        }
        w3 = Eigen::Tensor<double, 3, Eigen::RowMajor>(H, T, T);
        for (index_t h = 0; h < H; ++h)
            for (index_t i = 0; i < T; ++i)
                for (index_t j = 0; j < T; ++j) w3(h, i, j) = w4(0, h, i, j);
        return w3;
    }

   private:
    static tensor1 ones(index_t n) {
        tensor1 t(n);
        t.setConstant(1.0f);
        return t;
    }
    static tensor1 zeros(index_t n) {
        tensor1 t(n);
        t.setZero();
        return t;
    }
    static tensor2 random(weight_rng* rng, index_t r, index_t c) {
        tensor2 t(r, c);
        if (rng)
            rng->fill(t, 0.02f);
        else
            t.setZero();
        return t;
    }
};

}  // namespace model
}  // namespace attnkit
