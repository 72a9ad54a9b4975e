// attnkit::reference::gated_mlp: the naive oracle of the gated MLP (docs/variants.md section 6).
//
//   h_j   = SiLU(sum_k x_k W_gate[k, j]) * (sum_k x_k W_up[k, j]),   SiLU(g) = g / (1 + e^-g)
//   out_i = sum_j h_j W_down[j, i]
//
// Per token, plain loops, double accumulation, the hidden row h materialised in double. Shares
// only the views and the argument validation with the fast kernel.
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

template <int R>
void run(const view<const float, R>& x, const view<const float, 2>& wg, const view<const float, 2>& wu,
         const view<const float, 2>& wd, const view<float, R>& out) {
    const detail::gated_mlp_shape s = detail::check_gated_mlp<R>(x, wg, wu, wd, out);
    const index_t d = s.d_model, m = s.width;
    const index_t outer = R == 3 ? x.dims[0] : 1, inner = x.dims[R - 2];
    std::vector<double> h(static_cast<std::size_t>(m));
    for (index_t b = 0; b < outer; ++b)
        for (index_t t = 0; t < inner; ++t) {
            const float* xr = R == 3 ? x.data + b * x.strides[0] + t * x.strides[R - 2] : x.data + t * x.strides[0];
            float* orow = R == 3 ? out.data + b * out.strides[0] + t * out.strides[R - 2] : out.data + t * out.strides[0];
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
                orow[i] = static_cast<float>(o);
            }
        }
}

}  // namespace gated_mlp_impl

template <class X, class WG, class WU, class WD, class O>
void gated_mlp(const X& x, const WG& w_gate, const WU& w_up, const WD& w_down, O&& out,
               const gated_mlp_options& = {}) {
    const auto a = detail::gated_mlp_arguments(x, w_gate, w_up, w_down, std::forward<O>(out));
    gated_mlp_impl::run<decltype(a.x)::kRank>(a.x, a.w_gate, a.w_up, a.w_down, a.out);
}

}  // namespace reference
}  // namespace attnkit
