// Oracle of attnkit::model::rms_norm: plain loops in double. x and out [N, d] or [B, L, d]
// (out float or double), weight [d].
#pragma once

#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

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

}  // namespace model
}  // namespace reference
}  // namespace attnkit
