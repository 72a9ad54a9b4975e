// attnkit::reference::gated_mlp: the naive oracle of the gated MLP (docs/variants.md section 6).
//
//   h_j   = SiLU(sum_k x_k W_gate[k, j]) * (sum_k x_k W_up[k, j]),   SiLU(g) = g / (1 + e^-g)
//   out_i = sum_j h_j W_down[j, i]
//
// Per token, plain loops, double accumulation, the hidden row h materialised in double. Shares
// only the views and the argument validation with the fast kernel. Takes float or double tensors
// (one type for all), so that its backward (gated_mlp_backward.hpp) can be checked against
// finite differences in double.
#pragma once

#include <cmath>
#include <type_traits>
#include <vector>

#include "attnkit/detail/gated_mlp/check.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace gated_mlp_impl {

template <class T, int R>
void run(const view<const T, R>& x, const view<const T, 2>& wg, const view<const T, 2>& wu, const view<const T, 2>& wd,
         const view<T, R>& out) {
    const detail::gated_mlp_shape s = detail::check_gated_mlp<T, R>(x, wg, wu, wd, out);
    const index_t d = s.d_model, m = s.width;
    const index_t outer = R == 3 ? x.dims[0] : 1, inner = x.dims[R - 2];
    std::vector<double> h(static_cast<std::size_t>(m));
    for (index_t b = 0; b < outer; ++b)
        for (index_t t = 0; t < inner; ++t) {
            const T* xr = R == 3 ? x.data + b * x.strides[0] + t * x.strides[R - 2] : x.data + t * x.strides[0];
            T* orow = R == 3 ? out.data + b * out.strides[0] + t * out.strides[R - 2] : out.data + t * out.strides[0];
            for (index_t j = 0; j < m; ++j) {
                double g = 0.0, u = 0.0;
                for (index_t k = 0; k < d; ++k) {
                    g += static_cast<double>(xr[k]) * static_cast<double>(wg(k, j));
                    u += static_cast<double>(xr[k]) * static_cast<double>(wu(k, j));
                }
                h[static_cast<std::size_t>(j)] = g / (1.0 + std::exp(-g)) * u;
            }
            for (index_t i = 0; i < d; ++i) {
                double o = 0.0;
                for (index_t j = 0; j < m; ++j) o += h[static_cast<std::size_t>(j)] * static_cast<double>(wd(j, i));
                orow[i] = static_cast<T>(o);
            }
        }
}

// The arguments as views of one element type T, float or double (the oracles take both).
template <class X>
constexpr int kRankOf = detail::tensor_traits<std::decay_t<X>>::kRank;
template <class X>
constexpr bool kFloatOrDouble =
    std::is_same<detail::scalar_of<X>, float>::value || std::is_same<detail::scalar_of<X>, double>::value;

}  // namespace gated_mlp_impl

// The oracle of attnkit::gated_mlp: float tensors, or double ones (for finite differences).
template <class X, class WG, class WU, class WD, class O>
void gated_mlp(const X& x, const WG& w_gate, const WU& w_up, const WD& w_down, O&& out,
               const gated_mlp_options& = {}) {
    using T = detail::scalar_of<X>;
    constexpr int R = gated_mlp_impl::kRankOf<X>;
    static_assert(gated_mlp_impl::kFloatOrDouble<X>, "attnkit::reference::gated_mlp: float or double tensors");
    static_assert(R == 2 || R == 3, "attnkit::reference::gated_mlp: x must be [N, d_model] or [B, L, d_model]");
    const char* layout = detail::gated_mlp_layout(R);
    gated_mlp_impl::run<T, R>(detail::input_view<R>("x", x, layout), detail::input_view<2>("w_gate", w_gate, "[d_model, m]"),
                              detail::input_view<2>("w_up", w_up, "[d_model, m]"),
                              detail::input_view<2>("w_down", w_down, "[m, d_model]"),
                              detail::output_view<R>("out", std::forward<O>(out), layout));
}

}  // namespace reference
}  // namespace attnkit
