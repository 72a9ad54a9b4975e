// Oracles of attnkit::model::rms_norm and rms_norm_backward: plain loops in double. x, out,
// d_out, d_x [N, d] or [B, L, d] (outputs float or double), weight, d_weight [d].
#pragma once

#include <cmath>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace model {

template <class X, class Wt, class O>
void rms_norm(const X& x_in, const Wt& w_in, O&& out_in, double eps = 1e-6) {
    constexpr int N = attnkit::detail::tensor_traits<std::decay_t<X>>::kRank;
    static_assert(N == 2 || N == 3, "reference::model::rms_norm: x must be [N, d] or [B, L, d]");
    const auto x = attnkit::detail::input_view<N>("x", x_in, "[N, d] or [B, L, d]");
    const auto w = attnkit::detail::input_view<1>("weight", w_in, "[d]");
    const auto out = attnkit::detail::output_view<N>("out", std::forward<O>(out_in), "[N, d] or [B, L, d]");
    const index_t d = x.dims[N - 1];
    if (w.dims[0] != d || out.dims != x.dims)
        attnkit::detail::fail("reference::model::rms_norm: shapes x " + shape_string(x) + ", weight " +
                              shape_string(w) + ", out " + shape_string(out));
    const index_t outer = N == 3 ? x.dims[0] : 1, inner = N == 3 ? x.dims[1] : x.dims[0];
    for (index_t a = 0; a < outer; ++a)
        for (index_t r = 0; r < inner; ++r) {
            const auto* xr = N == 3 ? x.data + a * x.strides[0] + r * x.strides[1] : x.data + r * x.strides[0];
            auto* orow = N == 3 ? out.data + a * out.strides[0] + r * out.strides[1] : out.data + r * out.strides[0];
            double ss = 0.0;
            for (index_t c = 0; c < d; ++c) ss += static_cast<double>(xr[c]) * static_cast<double>(xr[c]);
            const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
            for (index_t c = 0; c < d; ++c)
                orow[c] = static_cast<std::remove_reference_t<decltype(orow[c])>>(static_cast<double>(xr[c]) * inv *
                                                                                 static_cast<double>(w.data[c]));
        }
}

// The gradients of rms_norm, from the chain rule in double, row by row: with
// inv = 1 / sqrt(mean x^2 + eps), out[c] = x[c] inv w[c] and dinv/dx[j] = -inv^3 x[j] / d,
//   d_x[j]      = inv w[j] g[j] - inv^3 x[j] / d * sum_c g[c] w[c] x[c]
//   d_weight[c] = sum over rows of g[c] x[c] inv
// d_x and d_weight are overwritten; d_x may be d_out itself (each row's d_out is read into
// doubles before its d_x is written).
template <class X, class Wt, class G, class DX, class DW>
void rms_norm_backward(const X& x_in, const Wt& w_in, const G& g_in, DX&& dx_in, DW&& dw_in, double eps = 1e-6) {
    constexpr int N = attnkit::detail::tensor_traits<std::decay_t<X>>::kRank;
    static_assert(N == 2 || N == 3, "reference::model::rms_norm_backward: x must be [N, d] or [B, L, d]");
    const auto x = attnkit::detail::input_view<N>("x", x_in, "[N, d] or [B, L, d]");
    const auto w = attnkit::detail::input_view<1>("weight", w_in, "[d]");
    const auto g = attnkit::detail::input_view<N>("d_out", g_in, "[N, d] or [B, L, d]");
    const auto dx = attnkit::detail::output_view<N>("d_x", std::forward<DX>(dx_in), "[N, d] or [B, L, d]");
    const auto dw = attnkit::detail::output_view<1>("d_weight", std::forward<DW>(dw_in), "[d]");
    const index_t d = x.dims[N - 1];
    if (w.dims[0] != d || g.dims != x.dims || dx.dims != x.dims || dw.dims[0] != d)
        attnkit::detail::fail("reference::model::rms_norm_backward: shapes x " + shape_string(x) + ", weight " +
                              shape_string(w) + ", d_out " + shape_string(g) + ", d_x " + shape_string(dx) +
                              ", d_weight " + shape_string(dw));
    using TX = std::remove_reference_t<decltype(*dx.data)>;
    using TW = std::remove_reference_t<decltype(dw(0))>;
    std::vector<double> sum_w(static_cast<std::size_t>(d), 0.0), gr(static_cast<std::size_t>(d));
    const index_t outer = N == 3 ? x.dims[0] : 1, inner = N == 3 ? x.dims[1] : x.dims[0];
    for (index_t a = 0; a < outer; ++a)
        for (index_t r = 0; r < inner; ++r) {
            const auto* xr = N == 3 ? x.data + a * x.strides[0] + r * x.strides[1] : x.data + r * x.strides[0];
            const auto* grow = N == 3 ? g.data + a * g.strides[0] + r * g.strides[1] : g.data + r * g.strides[0];
            auto* dxr = N == 3 ? dx.data + a * dx.strides[0] + r * dx.strides[1] : dx.data + r * dx.strides[0];
            double ss = 0.0, gwx = 0.0;
            for (index_t c = 0; c < d; ++c) {
                const double xc = static_cast<double>(xr[c]);
                gr[static_cast<std::size_t>(c)] = static_cast<double>(grow[c]);
                ss += xc * xc;
                gwx += gr[static_cast<std::size_t>(c)] * static_cast<double>(w(c)) * xc;
            }
            const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
            for (index_t c = 0; c < d; ++c) {
                const double xc = static_cast<double>(xr[c]), gc = gr[static_cast<std::size_t>(c)];
                sum_w[static_cast<std::size_t>(c)] += gc * xc * inv;
                dxr[c] = static_cast<TX>(inv * static_cast<double>(w(c)) * gc -
                                         inv * inv * inv * xc / static_cast<double>(d) * gwx);
            }
        }
    for (index_t c = 0; c < d; ++c) dw(c) = static_cast<TW>(sum_w[static_cast<std::size_t>(c)]);
}

}  // namespace model
}  // namespace reference
}  // namespace attnkit
