// Options of standard softmax attention. A default-constructed struct means: no mask,
// scale 1/sqrt(D), calling thread only.
#pragma once

#include <cstdint>
#include <vector>

namespace attnkit {

class thread_pool;

struct softmax_options {
    float scale = 0.0f;                     // 0: 1/sqrt(D); otherwise finite and > 0
    bool causal = false;                    // bottom-right aligned (query i at i + Lk - Lq)
    std::int64_t window_left = -1;          // -1: unlimited; w >= 0: keys j >= p - w
    std::int64_t chunk = 0;                 // 0: off; c > 0: keys in p's block of c (Llama-4)
    std::vector<std::int64_t> key_lengths;  // empty: off; else one per batch item, keys j < len
    float softcap = 0.0f;                   // <= 0: off; else s -> softcap * tanh(s / softcap)
    std::vector<float> sinks;               // empty: off; else one logit per query head
    thread_pool* pool = nullptr;            // null: run on the calling thread
};

}  // namespace attnkit
