// What a decoder's training forward keeps for its backward (model/decoder_training.hpp), and
// the buffers the backward works in. Owned by the decoder and reused from step to step: a
// training step allocates only when the batch shape grows.
//
// Kept per layer, for N = batch * L tokens (floats per token; d = d_model, H, Hk heads of D):
//   x_in, h        the layer's input and its RMSNorm              2 d
//   q, k, v        after RoPE (what the attention kernel read)     (H + 2 Hk) D
//   att            the attention output (the o_proj input)         H D
//   lse            log-sum-exp (softmax and self-gating layers)    H
//   q_lin          self-gating: Wq h before SiLU                   H D
//   x_mid, h2      the feed-forward sublayer's input and its norm  2 d
// so 4 d + 2 (H + Hk) D + H floats per token and layer (about 8 d with H = Hk, 32 KiB per token
// and layer at d = 1024); an mlp layer keeps 4 d. The SwiGLU intermediate [N, ffn] is not kept:
// gated_mlp_backward recomputes it from h2 block by block, as the attention backward passes
// recompute their probabilities from q, k and lse. Logits [N, vocab] exist once per step.
//
// With rnd_emb_qk / fixed_seq_qk layers, `stream` holds the same for the fixed stream's pass
// (batch 1, max_length rows, layers up to the highest static one, that one's x_in, h, q and k
// only), each static layer's d_q_fixed / d_k_fixed (what the main pass's static attention sends
// back to the stream's q and k), and `stream_grads` the stream backward's weight gradients before
// they are added to the main pass's.
#pragma once

#include <memory>
#include <vector>

#include "attnkit/model/decoder_gradients.hpp"
#include "attnkit/model/decoder_layer.hpp"

namespace attnkit {
namespace model {

struct decoder_activations {
    struct layer {
        tensor2 x_in, h, q, q_lin, k, v, att, x_mid, h2;
        tensor3 lse;
        tensor2 d_q_fixed, d_k_fixed;  // the stream's static layers: [max_length, H D], [max_length, Hk D]
    };
    std::vector<layer> layers;
    tensor2 x, xf, logits;           // the last residual, its norm, the logits (then their gradient)
    tensor2 dx, dh, dtmp, datt;      // gradients flowing down the residual and into a sublayer
    tensor2 dq, dk, dv;              // the attention backward's outputs
    tensor3 emb_qk;                  // StaticEmbQK: the stacked Q/K of every embedding_qk layer
    tensor2 d_emb_qk, d_emb_w, d_e;  // and its gradients
    std::unique_ptr<decoder_activations> stream;  // rnd_emb_qk / fixed_seq_qk: the fixed stream's pass
    std::unique_ptr<decoder_gradients> stream_grads;  // and its backward's weight gradients
};

// t as [rows, cols], reallocated only when the size changes (Eigen keeps the storage when the
// number of elements stays).
inline void fit(tensor2& t, index_t rows, index_t cols) {
    if (t.dimension(0) != rows || t.dimension(1) != cols) t.resize(rows, cols);
}
inline void fit(tensor3& t, index_t a, index_t b, index_t c) {
    if (t.dimension(0) != a || t.dimension(1) != b || t.dimension(2) != c) t.resize(a, b, c);
}

}  // namespace model
}  // namespace attnkit
