// Options of every attention entry point. Plain structs with defaults: a default-constructed
// struct means no mask, scale 1/sqrt(D), calling thread only. Weights passed in options are
// non-owning views (an Eigen tensor converts implicitly); a default (null) view means "this
// stage is off". Borrowed weights must outlive the call and any state built from the options.
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/view.hpp"

namespace attnkit {

class thread_pool;

// Standard softmax attention (softmax_attention.hpp; docs/design.md, docs/variants.md section 1).
//
// Query i of Lq sits at position p = i + (Lk - Lq), Lk the tensor's key length (bottom-right
// alignment). Two rules worth stating outright:
//  - window_left is a left bound only: w = 0 sees only the key at p together with causal, and
//    every key j >= p without it.
//  - key_lengths only masks keys (j >= key_lengths[b] is invisible); positions still come from
//    Lk. So a right-padded item's queries sit at the tensor's end, not at the end of its own
//    keys as in FlashAttention's varlen API. That is the same thing for plain causal decode
//    (Lq = 1), not for Lq > 1 or with a window or chunk: for varlen alignment, call once per
//    item over its own keys (README, "Layout and conventions"). Kept so that every mask decision
//    depends on shapes only.
struct softmax_options {
    float scale = 0.0f;                     // 0: 1/sqrt(D); otherwise finite, > 0, below ~2.36e38
    bool causal = false;                    // keys j <= p (bottom-right aligned)
    std::int64_t window_left = -1;          // -1: unlimited; w >= 0: keys j >= p - w (left bound only)
    std::int64_t chunk = 0;                 // 0: off; c > 0: keys in p's block of c, causal (Llama-4)
    std::vector<std::int64_t> key_lengths;  // empty: off; else one per batch item, keys j < len only
    float softcap = 0.0f;                   // <= 0: off; else normal and below ~2.36e38:
                                            //   s -> softcap * tanh(s / softcap)
    std::vector<float> sinks;               // empty: off; else one raw logit per query head
    thread_pool* pool = nullptr;            // null: run on the calling thread
};

// Second-order Taylor ("Approximate") attention (taylor_attention.hpp).
enum class taylor_form { automatic, quadratic, linear };
struct taylor_options {
    float scale = 0.0f;                     // 0: 1/sqrt(D)
    bool causal = false;                    // bottom-right aligned, as softmax
    std::vector<std::int64_t> key_lengths;  // empty: off; else one per batch item
    float eps = 1e-6f;                      // o = sum w v / (sum w + eps); finite, >= 0
    taylor_form form = taylor_form::automatic;
    thread_pool* pool = nullptr;
};

// Self-gating ("Non-approximate") attention (self_gating_attention.hpp).
struct self_gating_options {
    float scale = 0.0f;
    bool causal = false;
    std::vector<std::int64_t> key_lengths;
    thread_pool* pool = nullptr;
};

// Static QK (RndEmbQK / FixedSeqQK) attention (static_qk_attention.hpp); always causal.
struct static_qk_options {
    float scale = 0.0f;
    thread_pool* pool = nullptr;
};

// StaticEmbQK: the shape of the stacked Q/K projection of every layer (embedding_qk.hpp).
struct embedding_qk_layout {
    index_t layers = 0, heads = 0, heads_kv = 0, dim = 0;
};

// Gated MLP, no token mixing (gated_mlp.hpp).
struct gated_mlp_options {
    thread_pool* pool = nullptr;
};

// Multi-token attention (mta_attention.hpp); always causal, Lq == Lk.
struct mta_options {
    float scale = 0.0f;
    view<const float, 4> kq_pre;       // [H, G, c_q, c_k], convolution of the scores
    view<const float, 2> head_pre;     // [H, H] as [out, in], head mixing of the scores
    view<const float, 4> kq_post;      // [H, G, c_q, c_k], convolution of the probabilities
    view<const float, 2> head_post;    // [H, H] as [out, in], head mixing of the probabilities
    view<const float, 1> norm_weight;  // [Dv], RMSNorm of each (token, head) output
    float norm_eps = 1e-5f;
    std::int64_t norm_layer = -1;      // >= 0: depth scale 0.2 + 0.6 exp(-0.3 l)
    view<const float, 1> gate_weight;  // [Dv], out *= sigmoid(out . g + b)
    float gate_bias = 0.0f;
    thread_pool* pool = nullptr;
};

// The gradients of multi-token attention's weights (mta_attention_backward.hpp), each shaped like
// the option it belongs to and overwritten. A null member is "not wanted"; it must be null where
// the stage is off (the option is not set). norm_weight's and gate_weight's gradients and
// gate_bias (a single float) follow norm_weight and gate_weight.
struct mta_weight_grads {
    view<float, 4> kq_pre;       // [H, G, c_q, c_k]
    view<float, 2> head_pre;     // [H, H]
    view<float, 4> kq_post;      // [H, G, c_q, c_k]
    view<float, 2> head_post;    // [H, H]
    view<float, 1> norm_weight;  // [Dv]
    view<float, 1> gate_weight;  // [Dv]
    float* gate_bias = nullptr;
};

}  // namespace attnkit
