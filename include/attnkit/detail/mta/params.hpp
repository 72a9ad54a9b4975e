// The options of multi-token attention as the kernels read them: every weight copied dense and
// the derived scalars computed once.
//
//   const mta::shape ms = mta::check_call(q, k, v, out, opts);   // or check_options at construction
//   const mta::params w = mta::make_params(opts, ms);
//
// The fused kernel and mta_state read only these copies, never the caller's views: a call
// copies at its start, a state once when it is built, so what the caller does with its weight
// tensors afterwards cannot reach a state (its documented contract).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "attnkit/detail/mta/check.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {
namespace mta {

// Row-major dense copies of (possibly strided) views.
inline std::vector<float> dense(const view<const float, 4>& t) {
    std::vector<float> d;
    for (index_t a = 0; a < t.dims[0]; ++a)
        for (index_t b = 0; b < t.dims[1]; ++b)
            for (index_t c = 0; c < t.dims[2]; ++c)
                for (index_t e = 0; e < t.dims[3]; ++e) d.push_back(t(a, b, c, e));
    return d;
}
inline std::vector<float> dense(const view<const float, 2>& t) {
    std::vector<float> d;
    for (index_t a = 0; a < t.dims[0]; ++a)
        for (index_t b = 0; b < t.dims[1]; ++b) d.push_back(t(a, b));
    return d;
}
inline std::vector<float> dense(const view<const float, 1>& t) {
    std::vector<float> d;
    for (index_t a = 0; a < t.dims[0]; ++a) d.push_back(t(a));
    return d;
}

// The depth scale of the group norm, 0.2 + 0.6 exp(-0.3 l) for the 0-based layer index l
// (docs/variants.md section 7), 1 without one (l = -1). Evaluated in double and rounded once,
// so that the kernel and the state multiply by the same float.
inline float depth_scale(std::int64_t layer) {
    return layer >= 0 ? static_cast<float>(0.2 + 0.6 * std::exp(-0.3 * static_cast<double>(layer))) : 1.0f;
}

struct params {
    conv_shape pre, post;               // off (groups 0) when the option is not set
    std::vector<float> kq_pre, kq_post;     // [H][G][c_q][c_k]; empty when off
    std::vector<float> head_pre, head_post;  // [H][H] as [out][in]; empty when off
    std::vector<float> norm_weight, gate_weight;  // [Dv]; empty when off
    float scale = 0.0f;  // as given (0: 1 / sqrt(D)); see resolve_scale
    float norm_eps = 1e-5f, gate_bias = 0.0f;
    float depth = 1.0f;  // depth_scale(norm_layer)
    // Post head mixing commutes with the value product when it only mixes heads that read the
    // same value head (GQA/MQA groups): then it is applied to the outputs, O'_h = sum_g W_hg O_g.
    // With MHA every head has its own V, so off-diagonal mixing needs the probabilities.
    bool mix_outputs = false;

    bool head_pre_on() const { return !head_pre.empty(); }
    bool head_post_on() const { return !head_post.empty(); }
};

// opts must have passed check_options against ms.s (ms is what it returned).
inline params make_params(const mta_options& o, const shape& ms) {
    params p;
    p.pre = ms.pre, p.post = ms.post;
    if (p.pre.on()) p.kq_pre = dense(o.kq_pre);
    if (p.post.on()) p.kq_post = dense(o.kq_post);
    if (o.head_pre.data) p.head_pre = dense(o.head_pre);
    if (o.head_post.data) p.head_post = dense(o.head_post);
    if (o.norm_weight.data) p.norm_weight = dense(o.norm_weight);
    if (o.gate_weight.data) p.gate_weight = dense(o.gate_weight);
    p.scale = o.scale;
    p.norm_eps = o.norm_eps;
    p.gate_bias = o.gate_bias;
    p.depth = depth_scale(o.norm_layer);
    if (p.head_post_on()) {
        const index_t H = ms.s.heads, group = ms.s.group();
        p.mix_outputs = true;
        for (index_t h = 0; h < H; ++h)
            for (index_t g = 0; g < H; ++g)
                if (h / group != g / group && p.head_post[static_cast<std::size_t>(h * H + g)] != 0.0f)
                    p.mix_outputs = false;
    }
    return p;
}

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
