// Argument validation of the gated MLP, shared by the kernel and the oracle: every shape and
// overlap rule is checked here, before either writes anything.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/memory_overlap.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {

struct gated_mlp_shape {
    index_t rows;     // N, or B * L
    index_t d_model;  // x's last dimension
    index_t width;    // m, the hidden width
};

inline const char* gated_mlp_layout(int rank) { return rank == 2 ? "[N, d_model]" : "[B, L, d_model]"; }

// The inputs: x [N, d_model] or [B, L, d_model], w_gate and w_up [d_model, m], w_down
// [m, d_model]. T is float (the kernels) or double (the oracles).
template <class T, int R>
gated_mlp_shape check_gated_mlp_inputs(const view<const T, R>& x, const view<const T, 2>& w_gate,
                                       const view<const T, 2>& w_up, const view<const T, 2>& w_down) {
    static_assert(R == 2 || R == 3, "gated_mlp: x is [N, d_model] or [B, L, d_model]");
    check_layout("x", x);
    check_layout("w_gate", w_gate);
    check_layout("w_up", w_up);
    check_layout("w_down", w_down);
    const index_t d = x.dims[R - 1];
    const index_t m = w_gate.dims[1];
    if (w_gate.dims[0] != d)
        fail("w_gate: expected [d_model, m] with d_model = " + std::to_string(d) + " (the last dimension of x " +
             shape_string(x) + "), got " + shape_string(w_gate));
    check_shape("w_up", w_up, {d, m}, "[d_model, m] (the shape of w_gate)");
    check_shape("w_down", w_down, {m, d}, "[m, d_model]");
    index_t rows = 1;
    for (int i = 0; i < R - 1; ++i) rows *= x.dims[i];
    return {rows, d, m};
}

// A tensor of x's shape (out, d_out, d_x).
template <class T, class TX, int R>
void check_like_x(const char* name, const view<T, R>& y, const view<const TX, R>& x) {
    check_layout(name, y);
    check_shape<T, R>(name, y, x.dims, R == 2 ? "[N, d_model] (the shape of x)" : "[B, L, d_model] (the shape of x)");
}

template <class T, int R>
gated_mlp_shape check_gated_mlp(const view<const T, R>& x, const view<const T, 2>& w_gate,
                                const view<const T, 2>& w_up, const view<const T, 2>& w_down,
                                const view<T, R>& out) {
    const gated_mlp_shape s = check_gated_mlp_inputs<T, R>(x, w_gate, w_up, w_down);
    check_like_x("out", out, x);
    // Rows are written block by block while other blocks still read x: out needs its own memory.
    check_outputs_apart({region_of("out", out)}, {region_of("x", x), region_of("w_gate", w_gate),
                                                  region_of("w_up", w_up), region_of("w_down", w_down)});
    return s;
}

// The backward's arguments: the forward's inputs, d_out and d_x of x's shape, the weight
// gradients of the weights' shapes; no gradient may overlap another or an input.
template <class T, int R>
gated_mlp_shape check_gated_mlp_backward(const view<const T, R>& x, const view<const T, 2>& w_gate,
                                         const view<const T, 2>& w_up, const view<const T, 2>& w_down,
                                         const view<const T, R>& d_out, const view<T, R>& d_x,
                                         const view<T, 2>& d_w_gate, const view<T, 2>& d_w_up,
                                         const view<T, 2>& d_w_down) {
    const gated_mlp_shape s = check_gated_mlp_inputs<T, R>(x, w_gate, w_up, w_down);
    check_like_x("d_out", d_out, x);
    check_like_x("d_x", d_x, x);
    check_layout("d_w_gate", d_w_gate);
    check_shape<T, 2>("d_w_gate", d_w_gate, w_gate.dims, "[d_model, m] (the shape of w_gate)");
    check_layout("d_w_up", d_w_up);
    check_shape<T, 2>("d_w_up", d_w_up, w_up.dims, "[d_model, m] (the shape of w_up)");
    check_layout("d_w_down", d_w_down);
    check_shape<T, 2>("d_w_down", d_w_down, w_down.dims, "[m, d_model] (the shape of w_down)");
    check_outputs_apart({region_of("d_x", d_x), region_of("d_w_gate", d_w_gate), region_of("d_w_up", d_w_up),
                         region_of("d_w_down", d_w_down)},
                        {region_of("x", x), region_of("w_gate", w_gate), region_of("w_up", w_up),
                         region_of("w_down", w_down), region_of("d_out", d_out)});
    return s;
}

// The public arguments as views, named for messages; shared by the kernel and the oracle. x
// picks the rank (2 or 3, checked at compile time) and out must have the same.
template <int R>
struct gated_mlp_views {
    view<const float, R> x;
    view<const float, 2> w_gate, w_up, w_down;
    view<float, R> out;
};

template <class X, class WG, class WU, class WD, class O>
auto gated_mlp_arguments(const X& x, const WG& w_gate, const WU& w_up, const WD& w_down, O&& out) {
    using traits = tensor_traits<std::decay_t<X>>;
    static_assert(traits::kIsTensorish, "attnkit takes attnkit::view, Eigen::Tensor or Eigen::TensorMap");
    constexpr int R = traits::kRank;
    static_assert(R == 2 || R == 3, "attnkit::gated_mlp: x must be rank 2 [N, d_model] or rank 3 [B, L, d_model]");
    static_assert(tensor_traits<std::decay_t<O>>::kRank == R, "attnkit::gated_mlp: out must have the rank of x");
    const char* layout = gated_mlp_layout(R);
    const auto xv = input_view<R>("x", x, layout);
    const auto wg = input_view<2>("w_gate", w_gate, "[d_model, m]");
    const auto wu = input_view<2>("w_up", w_up, "[d_model, m]");
    const auto wd = input_view<2>("w_down", w_down, "[m, d_model]");
    const auto ov = output_view<R>("out", std::forward<O>(out), layout);
    ATTNKIT_IF_FLOAT("attnkit::gated_mlp: float tensors", xv, wg, wu, wd, ov) {
        return gated_mlp_views<R>{xv, wg, wu, wd, ov};
    } else {
        return gated_mlp_views<R>{};  // never run: the static_assert above has failed, alone
    }
}

}  // namespace detail
}  // namespace attnkit
