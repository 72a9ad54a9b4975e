// The backward pass of the gated MLP (docs/variants.md section 6).
//
//   attnkit::gated_mlp(x, w_gate, w_up, w_down, out, opts);      // forward
//   // ... loss, and d_out = dloss / dout (the shape of x) ...
//   attnkit::gated_mlp_backward(x, w_gate, w_up, w_down, d_out, d_x, d_w_gate, d_w_up, d_w_down, opts);
//
// Writes (overwrites) d_x (x's shape, [N, d_model] or [B, L, d_model]) and the weight gradients
// d_w_gate, d_w_up [d_model, m], d_w_down [m, d_model], summed over every token; float tensors,
// views or TensorMaps. No saved activations are needed: the forward's two input products are
// recomputed slice by slice of the hidden width, so no [N, m] intermediate exists
// (detail/gated_mlp/backward.hpp). Bitwise identical results for any thread count. Bad shapes
// or gradients that overlap each other or an input throw std::invalid_argument naming the
// argument, before anything is written. The oracle: attnkit::reference::gated_mlp_backward.
#pragma once

#include <utility>

#include "attnkit/detail/gated_mlp/backward.hpp"
#include "attnkit/gated_mlp.hpp"

namespace attnkit {

template <class X, class WG, class WU, class WD, class DO, class DX, class DWG, class DWU, class DWD>
void gated_mlp_backward(const X& x, const WG& w_gate, const WU& w_up, const WD& w_down, const DO& d_out, DX&& d_x,
                        DWG&& d_w_gate, DWU&& d_w_up, DWD&& d_w_down, const gated_mlp_options& opts = {}) {
    constexpr int R = detail::tensor_traits<std::decay_t<X>>::kRank;
    static_assert(R == 2 || R == 3, "attnkit::gated_mlp_backward: x must be rank 2 [N, d_model] or rank 3 [B, L, d_model]");
    const char* layout = detail::gated_mlp_layout(R);
    const auto xv = detail::input_view<R>("x", x, layout);
    const auto wg = detail::input_view<2>("w_gate", w_gate, "[d_model, m]");
    const auto wu = detail::input_view<2>("w_up", w_up, "[d_model, m]");
    const auto wd = detail::input_view<2>("w_down", w_down, "[m, d_model]");
    const auto dov = detail::input_view<R>("d_out", d_out, layout);
    const auto dxv = detail::output_view<R>("d_x", std::forward<DX>(d_x), layout);
    const auto dwg = detail::output_view<2>("d_w_gate", std::forward<DWG>(d_w_gate), "[d_model, m]");
    const auto dwu = detail::output_view<2>("d_w_up", std::forward<DWU>(d_w_up), "[d_model, m]");
    const auto dwd = detail::output_view<2>("d_w_down", std::forward<DWD>(d_w_down), "[m, d_model]");
    ATTNKIT_IF_FLOAT("attnkit::gated_mlp_backward: float tensors (double is for attnkit::reference)", xv, wg, wu, wd,
                     dov, dxv, dwg, dwu, dwd) {
        detail::gated_mlp_backward_run<simd::default_arch, R>(xv, wg, wu, wd, dov, dxv, dwg, dwu, dwd, opts.pool);
    }
}

}  // namespace attnkit
