// attnkit::reference::gated_mlp_backward: the double oracle of the gated MLP's gradients.
//
//   reference::gated_mlp_backward(x, w_gate, w_up, w_down, d_out, d_x, d_w_gate, d_w_up, d_w_down);
//
// With G = x W_gate, U = x W_up, A = SiLU(G), Z = A * U and out = Z W_down (per token, the
// forward of reference/gated_mlp.hpp), and d_out = dloss / dout:
//   dZ       = d_out W_down^T
//   d_w_down = Z^T d_out
//   dU       = dZ * A
//   dG       = dZ * U * SiLU'(G),    SiLU'(g) = s (1 + g (1 - s)), s = 1 / (1 + e^-g)
//   d_w_gate = x^T dG,  d_w_up = x^T dU
//   d_x      = dG W_gate^T + dU W_up^T
// Materialised per token in double (G, U, A, Z, dZ, dG, dU rows), the weight gradients summed
// over tokens in double; float or double tensors, one type for all; gradients overwritten.
// Shares only the views and the argument validation with the fast kernel.
#pragma once

#include <cmath>
#include <type_traits>
#include <vector>

#include "attnkit/reference/gated_mlp.hpp"

namespace attnkit {
namespace reference {
namespace gated_mlp_impl {

template <class T, int R>
void run_backward(const view<const T, R>& x, const view<const T, 2>& wg, const view<const T, 2>& wu,
                  const view<const T, 2>& wd, const view<const T, R>& dout, const view<T, R>& dx,
                  const view<T, 2>& dwg, const view<T, 2>& dwu, const view<T, 2>& dwd) {
    const detail::gated_mlp_shape s = detail::check_gated_mlp_backward<T, R>(x, wg, wu, wd, dout, dx, dwg, dwu, dwd);
    const index_t d = s.d_model, m = s.width;
    const index_t outer = R == 3 ? x.dims[0] : 1, inner = x.dims[R - 2];
    std::vector<double> gwg(static_cast<std::size_t>(d * m), 0.0), gwu(gwg.size(), 0.0), gwd(gwg.size(), 0.0);
    std::vector<double> g(static_cast<std::size_t>(m)), u(g.size()), dg(g.size()), du(g.size());
    auto row = [&](const auto& v, index_t b, index_t t) {
        return R == 3 ? v.data + b * v.strides[0] + t * v.strides[R - 2] : v.data + t * v.strides[0];
    };
    for (index_t b = 0; b < outer; ++b)
        for (index_t t = 0; t < inner; ++t) {
            const T* xr = row(x, b, t);
            const T* dor = row(dout, b, t);
            T* dxr = row(dx, b, t);
            for (index_t j = 0; j < m; ++j) {
                double gj = 0.0, uj = 0.0, dz = 0.0;
                for (index_t k = 0; k < d; ++k) {
                    gj += static_cast<double>(xr[k]) * static_cast<double>(wg(k, j));
                    uj += static_cast<double>(xr[k]) * static_cast<double>(wu(k, j));
                }
                for (index_t i = 0; i < d; ++i) dz += static_cast<double>(dor[i]) * static_cast<double>(wd(j, i));
                const double sg = 1.0 / (1.0 + std::exp(-gj)), a = gj * sg, z = a * uj;
                for (index_t i = 0; i < d; ++i) gwd[static_cast<std::size_t>(j * d + i)] += z * static_cast<double>(dor[i]);
                du[static_cast<std::size_t>(j)] = dz * a;
                dg[static_cast<std::size_t>(j)] = dz * uj * sg * (1.0 + gj * (1.0 - sg));
            }
            for (index_t k = 0; k < d; ++k) {
                double acc = 0.0;
                for (index_t j = 0; j < m; ++j) {
                    gwg[static_cast<std::size_t>(k * m + j)] += static_cast<double>(xr[k]) * dg[static_cast<std::size_t>(j)];
                    gwu[static_cast<std::size_t>(k * m + j)] += static_cast<double>(xr[k]) * du[static_cast<std::size_t>(j)];
                    acc += dg[static_cast<std::size_t>(j)] * static_cast<double>(wg(k, j)) +
                           du[static_cast<std::size_t>(j)] * static_cast<double>(wu(k, j));
                }
                dxr[k] = static_cast<T>(acc);
            }
        }
    for (index_t k = 0; k < d; ++k)
        for (index_t j = 0; j < m; ++j) {
            dwg(k, j) = static_cast<T>(gwg[static_cast<std::size_t>(k * m + j)]);
            dwu(k, j) = static_cast<T>(gwu[static_cast<std::size_t>(k * m + j)]);
            dwd(j, k) = static_cast<T>(gwd[static_cast<std::size_t>(j * d + k)]);
        }
}

}  // namespace gated_mlp_impl

template <class X, class WG, class WU, class WD, class DO, class DX, class DWG, class DWU, class DWD>
void gated_mlp_backward(const X& x, const WG& w_gate, const WU& w_up, const WD& w_down, const DO& d_out, DX&& d_x,
                        DWG&& d_w_gate, DWU&& d_w_up, DWD&& d_w_down, const gated_mlp_options& = {}) {
    using T = detail::scalar_of<X>;
    constexpr int R = gated_mlp_impl::kRankOf<X>;
    static_assert(gated_mlp_impl::kFloatOrDouble<X>, "attnkit::reference::gated_mlp_backward: float or double tensors");
    static_assert(R == 2 || R == 3, "attnkit::reference::gated_mlp_backward: x must be [N, d_model] or [B, L, d_model]");
    const char* layout = detail::gated_mlp_layout(R);
    gated_mlp_impl::run_backward<T, R>(
        detail::input_view<R>("x", x, layout), detail::input_view<2>("w_gate", w_gate, "[d_model, m]"),
        detail::input_view<2>("w_up", w_up, "[d_model, m]"), detail::input_view<2>("w_down", w_down, "[m, d_model]"),
        detail::input_view<R>("d_out", d_out, layout), detail::output_view<R>("d_x", std::forward<DX>(d_x), layout),
        detail::output_view<2>("d_w_gate", std::forward<DWG>(d_w_gate), "[d_model, m]"),
        detail::output_view<2>("d_w_up", std::forward<DWU>(d_w_up), "[d_model, m]"),
        detail::output_view<2>("d_w_down", std::forward<DWD>(d_w_down), "[m, d_model]"));
}

}  // namespace reference
}  // namespace attnkit
