// Oracle of attnkit::model::cross_entropy: plain loops in double, row by row.
//
//   double loss = attnkit::reference::model::cross_entropy(logits, targets, d_logits);
//
// logits [N, V] (float or double), targets [N] int32 (a view, an Eigen tensor or a
// std::vector<std::int32_t>), d_logits [N, V] (float or double, overwritten). With n the number
// of rows whose target is >= 0 (a negative target ignores its row; one >= V is an error):
//   loss = (1/n) sum_t [log sum_j exp(z[t, j]) - z[t, target[t]]]   (0 when n = 0)
//   d_logits[t, j] = (exp(z[t, j]) / sum_k exp(z[t, k]) - [j == target[t]]) / n, 0 for ignored rows
// with the kernel's conventions for a row without a finite logit (loss +inf, softmax taken as 0)
// and for NaN (the row's loss and gradient NaN).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace model {
namespace detail {

inline view<const std::int32_t, 1> targets_of(const std::vector<std::int32_t>& t) {
    return view<const std::int32_t, 1>(t.data(), {static_cast<index_t>(t.size())});
}
template <class T>
view<const std::int32_t, 1> targets_of(const T& t) {
    return attnkit::detail::input_view<1>("targets", t, "[N]");
}

}  // namespace detail

template <class L, class T, class DL>
double cross_entropy(const L& logits_in, const T& targets_in, DL&& d_in) {
    const auto z = attnkit::detail::input_view<2>("logits", logits_in, "[N, V]");
    const view<const std::int32_t, 1> tg = detail::targets_of(targets_in);
    const auto dz = attnkit::detail::output_view<2>("d_logits", std::forward<DL>(d_in), "[N, V]");
    const index_t N = z.dims[0], V = z.dims[1];
    if (tg.dims[0] != N || dz.dims != z.dims)
        attnkit::detail::fail("reference::model::cross_entropy: shapes logits " + shape_string(z) + ", targets " +
                              shape_string(tg) + ", d_logits " + shape_string(dz));
    index_t n = 0;
    for (index_t r = 0; r < N; ++r) {
        if (tg(r) >= V)
            attnkit::detail::fail("reference::model::cross_entropy: targets[" + std::to_string(r) + "] = " +
                                  std::to_string(tg(r)) + " >= V = " + std::to_string(V));
        if (tg(r) >= 0) ++n;
    }
    using TD = std::remove_reference_t<decltype(dz(0, 0))>;
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    double total = 0.0;
    std::vector<double> zr(static_cast<std::size_t>(V));
    for (index_t r = 0; r < N; ++r) {
        const std::int32_t t = tg(r);
        if (t < 0) {
            for (index_t j = 0; j < V; ++j) dz(r, j) = TD(0);
            continue;
        }
        // The row in doubles first: d_logits may be logits itself.
        double m = -inf;
        bool has_nan = false;
        for (index_t j = 0; j < V; ++j) {
            zr[static_cast<std::size_t>(j)] = static_cast<double>(z(r, j));
            has_nan = has_nan || std::isnan(zr[static_cast<std::size_t>(j)]);
            if (zr[static_cast<std::size_t>(j)] > m) m = zr[static_cast<std::size_t>(j)];
        }
        if (has_nan || m == inf) {
            for (index_t j = 0; j < V; ++j) dz(r, j) = static_cast<TD>(nan);
            total += nan;
            continue;
        }
        if (m == -inf) {  // no finite logit: nothing to normalise over
            for (index_t j = 0; j < V; ++j) dz(r, j) = static_cast<TD>(j == t ? -1.0 / static_cast<double>(n) : 0.0);
            total += inf;
            continue;
        }
        double s = 0.0;
        for (index_t j = 0; j < V; ++j) s += std::exp(zr[static_cast<std::size_t>(j)] - m);
        total += m + std::log(s) - zr[static_cast<std::size_t>(t)];
        for (index_t j = 0; j < V; ++j) {
            const double p = std::exp(zr[static_cast<std::size_t>(j)] - m) / s;
            dz(r, j) = static_cast<TD>((p - (j == t ? 1.0 : 0.0)) / static_cast<double>(n));
        }
    }
    return n > 0 ? total / static_cast<double>(n) : 0.0;
}

}  // namespace model
}  // namespace reference
}  // namespace attnkit
