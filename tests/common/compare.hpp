// Comparisons for GoogleTest, on any rank, through attnkit views.
//
//   all_close(actual, expected, rtol, atol[, equal_nan])  -> ::testing::AssertionResult
//   all_close(actual, expected, tolerance[, equal_nan])
//       actual / expected: attnkit::view, row-major Eigen::Tensor or TensorMap of float or double
//       (same rank, same dims; element types may differ; strided views are fine).
//       Element test: |a - e| <= atol + rtol * |e| (numpy/PyTorch style). Equal infinities match
//       (lse = -inf on both sides); inf vs anything else and NaN vs non-NaN are mismatches;
//       NaN vs NaN is a mismatch unless equal_nan. On failure the message gives the shape, the
//       number of mismatches, the first few with their multi-index, and the max absolute and max
//       relative error over the elements that are finite on both sides.
//   all_equal_to(x, value)       every element == value exactly (sentinel checks)
//   tolerance_for(k, magnitude)  see below
//   attention_magnitude(q, k, v, scale)
//
//   EXPECT_TRUE(all_close(out, expected, tolerance_for(32, attention_magnitude(q, k, v, scale))));
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "common/tensor.hpp"

namespace attnkit_test {

template <std::size_t N>
std::string index_string(const std::array<index_t, N>& idx) {
    std::string s = "[";
    for (std::size_t i = 0; i < N; ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
    return s + "]";
}

template <class A, class E>
::testing::AssertionResult all_close(const A& actual, const E& expected, double rtol, double atol,
                                     bool equal_nan = false) {
    constexpr int N = rank_of<A>;
    static_assert(N == rank_of<E>, "all_close: actual and expected must have the same rank");
    const auto av = as_view(actual);
    const auto ev = as_view(expected);
    if (av.dims != ev.dims)
        return ::testing::AssertionFailure()
               << "shape mismatch: actual " << attnkit::shape_string(av) << ", expected "
               << attnkit::shape_string(ev);

    constexpr int kShown = 8;
    std::ostringstream details;
    details << std::setprecision(9);
    index_t mismatches = 0;
    double max_abs_err = 0.0, max_rel_err = 0.0;
    std::array<index_t, N> max_abs_at{}, max_rel_at{};

    for_each_index<N>(av.dims, [&](const std::array<index_t, N>& idx) {
        const double a = static_cast<double>(at(av, idx));
        const double e = static_cast<double>(at(ev, idx));
        bool ok;
        if (std::isnan(a) || std::isnan(e)) {
            ok = equal_nan && std::isnan(a) && std::isnan(e);
        } else if (std::isinf(a) || std::isinf(e)) {
            ok = a == e;
        } else {
            const double err = std::fabs(a - e);
            const double rel = e != 0.0
                                   ? err / std::fabs(e)
                                   : (err != 0.0 ? std::numeric_limits<double>::infinity() : 0.0);
            if (err > max_abs_err) max_abs_err = err, max_abs_at = idx;
            if (rel > max_rel_err) max_rel_err = rel, max_rel_at = idx;
            ok = err <= atol + rtol * std::fabs(e);
        }
        if (!ok) {
            if (mismatches < kShown)
                details << "\n  at " << index_string(idx) << ": actual " << a << ", expected " << e
                        << ", |diff| " << std::fabs(a - e) << ", allowed "
                        << atol + rtol * std::fabs(e);
            ++mismatches;
        }
    });

    std::ostringstream summary;
    summary << std::setprecision(3) << "max abs error " << max_abs_err << " at "
            << index_string(max_abs_at) << ", max rel error " << max_rel_err << " at "
            << index_string(max_rel_at) << " (rtol " << rtol << ", atol " << atol << ")";
    if (mismatches == 0) return ::testing::AssertionSuccess() << summary.str();
    return ::testing::AssertionFailure()
           << "shape " << attnkit::shape_string(av) << ": " << mismatches << " of " << av.size()
           << " elements differ; " << summary.str() << (mismatches > kShown ? "; first ones:" : ":")
           << details.str();
}

// Tolerance that scales with float epsilon and the magnitude of the computation.
//
// A float computation that combines terms of size up to `magnitude` and is accurate to a few
// roundings per term has an absolute error of about k * eps_float * magnitude, with k a small
// number that grows mildly with the length of the reductions (use 8..64 for float kernels against
// a double reference; use a larger k, not a hand-picked absolute number, when a test needs
// more). So:
//   atol = k * eps_float * magnitude,  rtol = k * eps_float.
// For attention outputs, `magnitude` is attention_magnitude(q, k, v, scale) below; for lse it is
// 1 + the largest |score|, i.e. 1 + scale * max|q_i| * max|k_j|.
struct tolerance {
    double rtol;
    double atol;
};

constexpr double kEpsFloat = static_cast<double>(std::numeric_limits<float>::epsilon());

inline tolerance tolerance_for(double eps_multiple, double magnitude) {
    return {eps_multiple * kEpsFloat, eps_multiple * kEpsFloat * magnitude};
}

template <class A, class E>
::testing::AssertionResult all_close(const A& actual, const E& expected, tolerance tol,
                                     bool equal_nan = false) {
    return all_close(actual, expected, tol.rtol, tol.atol, equal_nan);
}

// Largest Euclidean norm over the last dimension of a rank-4 [B, L, H, D] tensor.
template <class X>
double max_row_norm(const X& x) {
    static_assert(rank_of<X> == 4, "max_row_norm takes a [B, L, H, D] tensor");
    const auto v = as_view(x);
    double m = 0.0;
    for_each_index<3>({v.dims[0], v.dims[1], v.dims[2]}, [&](const std::array<index_t, 3>& i) {
        double s = 0.0;
        for (index_t d = 0; d < v.dims[3]; ++d) {
            const double e = static_cast<double>(v(i[0], i[1], i[2], d));
            s += e * e;
        }
        if (s > m) m = s;
    });
    return std::sqrt(m);
}

// Error scale of a softmax attention output: an error eps * |s| in a score s (|s| <= scale *
// |q_i| |k_j| by Cauchy-Schwarz) becomes a relative error of the weights, and the output mixes
// values of size max|v|; so magnitude = max|v| * (1 + scale * max|q_i| * max|k_j|). A bound, not
// an estimate: typical errors are well below it.
template <class Q, class K, class V>
double attention_magnitude(const Q& q, const K& k, const V& v, double scale) {
    return max_abs(v) * (1.0 + scale * max_row_norm(q) * max_row_norm(k));
}

template <class X, class T>
::testing::AssertionResult all_equal_to(const X& x, T value) {
    const auto v = as_view(x);
    using S = typename decltype(v)::value_type;
    const S expected = static_cast<S>(value);
    index_t bad = 0;
    std::ostringstream details;
    for_each_index<rank_of<X>>(v.dims, [&](const auto& idx) {
        const S got = at(v, idx);
        if (!(got == expected)) {
            if (bad < 4) details << "\n  at " << index_string(idx) << ": " << got;
            ++bad;
        }
    });
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << bad << " of " << v.size() << " elements differ from "
                                         << +expected << ":" << details.str();
}

}  // namespace attnkit_test
