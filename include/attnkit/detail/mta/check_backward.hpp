// Argument validation of mta_attention_backward, shared by the fused kernel and the oracle:
// the forward's checks (check_call's shapes and options), out and d_out shaped like the
// forward's output, d_q / d_k / d_v like q / k / v, and each weight gradient of mta_weight_grads
// shaped like its option, null where the stage is off. No gradient may share memory with
// another or with any input (the weights included). Throws std::invalid_argument naming the
// argument and the shapes, before anything is written.
#pragma once

#include <string>

#include "attnkit/detail/backward/arguments.hpp"
#include "attnkit/detail/memory_overlap.hpp"
#include "attnkit/detail/mta/check.hpp"
#include "attnkit/options.hpp"

namespace attnkit {
namespace detail {
namespace mta {

template <class T, int N>
bool is_null(const view<T, N>& w) {
    return w.data == nullptr && w.dims == std::array<index_t, N>{};
}

// One weight gradient against its option: null is always fine; set, it needs the option set and
// the option's shape.
template <int N>
void check_weight_grad(const char* name, const view<float, N>& g, const char* option, const view<const float, N>& w) {
    if (is_null(g)) return;
    if (is_null(w))
        fail(std::string(name) + ": a gradient was given (" + shape_string(g) + ") but " + option +
             " is not set (the stage is off); pass a null view");
    check_layout(name, g);
    if (g.dims != w.dims)
        fail(std::string(name) + ": expected the shape of " + option + " " + shape_string(w) + ", got " +
             shape_string(g));
}

template <class TQ, class TK, class TV, class TO, class TD, class TG>
shape check_backward(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v, const view<TO, 4>& out,
                     const view<TD, 4>& d_out, const view<TG, 4>& d_q, const view<TG, 4>& d_k, const view<TG, 4>& d_v,
                     const mta_weight_grads& dw, const mta_options& o) {
    const attention_shape s = check_self_qkv(q, k, v);
    check_out("out", out, s);
    check_out("d_out", d_out, s);
    check_qkv_gradients(d_q, d_k, d_v, s);
    const shape r = check_options(o, s);
    check_weight_grad("d_weights.kq_pre", dw.kq_pre, "opts.kq_pre", o.kq_pre);
    check_weight_grad("d_weights.head_pre", dw.head_pre, "opts.head_pre", o.head_pre);
    check_weight_grad("d_weights.kq_post", dw.kq_post, "opts.kq_post", o.kq_post);
    check_weight_grad("d_weights.head_post", dw.head_post, "opts.head_post", o.head_post);
    check_weight_grad("d_weights.norm_weight", dw.norm_weight, "opts.norm_weight", o.norm_weight);
    check_weight_grad("d_weights.gate_weight", dw.gate_weight, "opts.gate_weight", o.gate_weight);
    if (dw.gate_bias && is_null(o.gate_weight))
        fail("d_weights.gate_bias: a gradient was given but opts.gate_weight is not set (the gate is off); pass "
             "nullptr");
    const view<float, 1> bias = dw.gate_bias ? view<float, 1>(dw.gate_bias, {1}, {1}) : view<float, 1>{};
    check_outputs_apart(
        {region_of("d_q", d_q), region_of("d_k", d_k), region_of("d_v", d_v),
         region_of("d_weights.kq_pre", dw.kq_pre), region_of("d_weights.head_pre", dw.head_pre),
         region_of("d_weights.kq_post", dw.kq_post), region_of("d_weights.head_post", dw.head_post),
         region_of("d_weights.norm_weight", dw.norm_weight), region_of("d_weights.gate_weight", dw.gate_weight),
         region_of("d_weights.gate_bias", bias)},
        {region_of("q", q), region_of("k", k), region_of("v", v), region_of("out", out), region_of("d_out", d_out),
         region_of("opts.kq_pre", o.kq_pre), region_of("opts.head_pre", o.head_pre),
         region_of("opts.kq_post", o.kq_post), region_of("opts.head_post", o.head_post),
         region_of("opts.norm_weight", o.norm_weight), region_of("opts.gate_weight", o.gate_weight)});
    return r;
}

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
