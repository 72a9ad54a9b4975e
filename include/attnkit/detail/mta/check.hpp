// Argument validation of multi-token attention (the kernel, the oracle and the decode state
// share it): everything softmax_attention rejects, plus the shapes and ranges of the MTA stages.
// Throws std::invalid_argument naming the option and the shapes, before anything is written.
#pragma once

#include <cmath>
#include <string>

#include "attnkit/detail/check.hpp"
#include "attnkit/options.hpp"

namespace attnkit {
namespace detail {
namespace mta {

// Sizes of one key-query convolution kernel theta [H, G, c_q, c_k]; off when G == 0.
struct conv_shape {
    index_t groups = 0, c_q = 1, c_k = 1;
    bool on() const { return groups > 0; }
    index_t key_halo() const { return (c_k - 1) / 2; }
};

struct shape {
    attention_shape s;
    conv_shape pre, post;
};

inline conv_shape check_conv(const char* name, const view<const float, 4>& w, index_t heads) {
    if (w.data == nullptr && w.size() == 0 && w.dims == std::array<index_t, 4>{}) return {};
    check_layout(name, w);
    const auto dims = [&] { return shape_string(w); };
    if (w.dims[0] != heads)
        fail(std::string(name) + ": expected [H, G, c_q, c_k] with H = " + std::to_string(heads) +
             " (the query heads), got " + dims());
    const index_t g = w.dims[1], cq = w.dims[2], ck = w.dims[3];
    if (g < 1 || heads % g != 0)
        fail(std::string(name) + ": the group size G must be >= 1 and divide H = " + std::to_string(heads) +
             ", got " + dims());
    if (cq < 1) fail(std::string(name) + ": c_q (query taps) must be >= 1, got " + dims());
    if (ck < 1 || ck % 2 == 0)
        fail(std::string(name) + ": c_k (key taps, centred) must be odd and >= 1, got " + dims());
    return {g, cq, ck};
}

inline void check_head_matrix(const char* name, const view<const float, 2>& w, index_t heads) {
    if (w.data == nullptr && w.dims == std::array<index_t, 2>{}) return;
    check_layout(name, w);
    check_shape(name, w, {heads, heads}, "[H, H] as [out, in]");
}

inline void check_vector(const char* name, const view<const float, 1>& w, index_t dim_v) {
    if (w.data == nullptr && w.dims == std::array<index_t, 1>{}) return;
    check_layout(name, w);
    check_shape(name, w, {dim_v}, "[Dv]");
}

// Options against the attention shape (heads H, value dim Dv).
inline shape check_options(const mta_options& o, const attention_shape& s) {
    check_scale(o.scale);
    shape r{s, check_conv("opts.kq_pre", o.kq_pre, s.heads), check_conv("opts.kq_post", o.kq_post, s.heads)};
    check_head_matrix("opts.head_pre", o.head_pre, s.heads);
    check_head_matrix("opts.head_post", o.head_post, s.heads);
    check_vector("opts.norm_weight", o.norm_weight, s.dim_v);
    check_vector("opts.gate_weight", o.gate_weight, s.dim_v);
    if (!std::isfinite(o.norm_eps) || !(o.norm_eps > 0.0f))
        fail("opts.norm_eps: expected a finite value > 0, got " + number(o.norm_eps));
    if (o.norm_layer < -1)
        fail("opts.norm_layer: expected -1 (no depth scale) or a layer index >= 0, got " +
             std::to_string(o.norm_layer));
    if (!std::isfinite(o.gate_bias)) fail("opts.gate_bias: expected a finite value, got " + number(o.gate_bias));
    return r;
}

// q, k, v of a forward or backward call: the softmax checks, then Lq == Lk (MTA is causal
// self-attention).
template <class TQ, class TK, class TV>
attention_shape check_self_qkv(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v) {
    const attention_shape s = check_qkv(q, k, v);
    if (s.len_q != s.len_k)
        fail("q, k: multi-token attention needs Lq == Lk (causal self-attention), got q " + shape_string(q) +
             ", k " + shape_string(k));
    check_max_keys("k", s.len_k, "keys per call", "Lk", k);
    return s;
}

// q, k, v, out of one call.
template <class TQ, class TK, class TV, class TO>
shape check_call(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v, const view<TO, 4>& out,
                 const mta_options& o) {
    const attention_shape s = check_self_qkv(q, k, v);
    check_out("out", out, s);
    const shape r = check_options(o, s);
    // out shares memory with no input, not even as q itself: a query block re-reads the c_q - 1
    // rows before it (convolution halo), which another work item may already have written.
    check_outputs_apart({region_of("out", out)}, {region_of("q", q), region_of("k", k), region_of("v", v)});
    return r;
}

// mta_head_kernel_to_matrix: kernel [groups, c_h, c_h] and w [groups * c_h, groups * c_h], apart
// in memory (w is cleared before the kernel is read, so a w laid over it would read its own
// zeros).
template <class TK, class TW>
void check_head_kernel(const view<TK, 3>& kernel, const view<TW, 2>& w) {
    check_layout("kernel", kernel);
    check_layout("w", w);
    const index_t n = kernel.dims[0], c = kernel.dims[1];
    if (kernel.dims[2] != c)
        fail("kernel: expected [groups, c_h, c_h] (square blocks), got " + shape_string(kernel));
    check_shape("w", w, {n * c, n * c}, "[H, H] with H = groups * c_h");
    check_outputs_apart({region_of("w", w)}, {region_of("kernel", kernel)});
}

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
