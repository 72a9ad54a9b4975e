// Oracle of attnkit::model::rope: rotate-half RoPE in double, out of place, straight from the
// formula (the angle of every element computed on its own).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "attnkit/detail/check.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace model {

// out [B, L, H, D] (double or float) = RoPE of x at positions position_offset + l.
template <class X, class O>
void rope(const X& x_in, O&& out_in, double theta, std::int64_t position_offset) {
    const auto x = attnkit::detail::input_view<4>("x", x_in, "[B, L, H, D]");
    const auto out = attnkit::detail::output_view<4>("out", std::forward<O>(out_in), "[B, L, H, D]");
    if (out.dims != x.dims || x.dims[3] % 2 != 0)
        attnkit::detail::fail("reference::model::rope: shapes x " + shape_string(x) + ", out " + shape_string(out));
    const index_t half = x.dims[3] / 2;
    const double D = static_cast<double>(x.dims[3]);
    for (index_t b = 0; b < x.dims[0]; ++b)
        for (index_t l = 0; l < x.dims[1]; ++l)
            for (index_t h = 0; h < x.dims[2]; ++h)
                for (index_t c = 0; c < half; ++c) {
                    const double p = static_cast<double>(position_offset + l);
                    const double angle = p / std::pow(theta, 2.0 * static_cast<double>(c) / D);
                    const double x1 = static_cast<double>(x(b, l, h, c));
                    const double x2 = static_cast<double>(x(b, l, h, c + half));
                    using T = std::remove_reference_t<decltype(out(b, l, h, c))>;
                    out(b, l, h, c) = static_cast<T>(x1 * std::cos(angle) - x2 * std::sin(angle));
                    out(b, l, h, c + half) = static_cast<T>(x2 * std::cos(angle) + x1 * std::sin(angle));
                }
}

}  // namespace model
}  // namespace reference
}  // namespace attnkit
