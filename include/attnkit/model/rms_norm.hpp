// RMSNorm, the pre-norm of Llama / Qwen2.5 decoders:
//
//   out[t, :] = x[t, :] / sqrt(mean_c x[t, c]^2 + eps) * weight[:]
//
//   attnkit::model::rms_norm(x, weight, out, eps[, pool]);
//   x and out [N, d] or [B, L, d] (same shape; out may be x itself: the row is read before it
//   is written; any other overlap is rejected), weight [d], eps > 0 and finite. The sum of squares runs in float over
//   SIMD lanes and then in double across lanes, so a row of 10^4 values keeps float accuracy; a
//   row whose float sum overflows (|x| above ~1e19) is summed in double, so any finite scale
//   normalises as the oracle does.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include "attnkit/detail/check.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace model {
namespace detail {

template <class A>
void rms_norm_row(const float* x, const float* w, float* out, index_t d, float eps) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    V a0(0.0f), a1(0.0f);
    index_t c = 0;
    for (; c + 2 * W <= d; c += 2 * W) {
        const V x0 = simd::loadu<A>(x + c), x1 = simd::loadu<A>(x + c + W);
        a0 = simd::fma(x0, x0, a0);
        a1 = simd::fma(x1, x1, a1);
    }
    double ss = static_cast<double>(simd::hsum(a0)) + static_cast<double>(simd::hsum(a1));
    for (; c < d; ++c) ss += static_cast<double>(x[c]) * x[c];
    // Squares past FLT_MAX (|x| above ~1.8e19) make a float lane inf, and the row would come out
    // 0: such a row (rare; also any row holding inf or NaN) is summed again in double, whose
    // range holds the square of every float. The common row pays one test.
    if (ATTNKIT_UNLIKELY(!std::isfinite(ss))) {
        ss = 0.0;
        for (c = 0; c < d; ++c) ss += static_cast<double>(x[c]) * x[c];
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    const V iv(inv);
    c = 0;
    for (; c + W <= d; c += W) simd::storeu(out + c, simd::loadu<A>(x + c) * iv * simd::loadu<A>(w + c));
    for (; c < d; ++c) out[c] = x[c] * inv * w[c];
}

// Rows of x / out as (pointer, stride) whatever the rank.
template <class T, int N>
index_t rows_of(const view<T, N>& v) {
    index_t r = 1;
    for (int i = 0; i < N - 1; ++i) r *= v.dims[i];
    return r;
}
template <class T, int N>
T* row_ptr(const view<T, N>& v, index_t r) {
    if constexpr (N == 2) {
        return v.data + r * v.strides[0];
    } else {
        return v.data + (r / v.dims[1]) * v.strides[0] + (r % v.dims[1]) * v.strides[1];
    }
}

template <int N, class X, class Wt, class O>
void rms_norm_impl(const X& x_in, const Wt& w_in, O&& out_in, float eps, thread_pool* pool) {
    const auto x = attnkit::detail::input_view<N>("x", x_in, N == 2 ? "[N, d]" : "[B, L, d]");
    const auto w = attnkit::detail::input_view<1>("weight", w_in, "[d]");
    const auto out = attnkit::detail::output_view<N>("out", std::forward<O>(out_in), N == 2 ? "[N, d]" : "[B, L, d]");
    static_assert(std::is_same<typename decltype(x)::value_type, float>::value &&
                      std::is_same<typename decltype(out)::value_type, float>::value,
                  "attnkit::model::rms_norm: float tensors");
    attnkit::detail::check_layout("x", x);
    attnkit::detail::check_layout("weight", w);
    attnkit::detail::check_layout("out", out);
    const index_t d = x.dims[N - 1];
    if (w.dims[0] != d)
        attnkit::detail::fail("weight: expected shape [d] = [" + std::to_string(d) + "] for x " + shape_string(x) +
                              ", got " + shape_string(w));
    if (out.dims != x.dims)
        attnkit::detail::fail("out: expected the shape of x " + shape_string(x) + ", got " + shape_string(out));
    if (!(eps > 0.0f) || !std::isfinite(eps))
        attnkit::detail::fail("eps: expected a finite value > 0, got " + attnkit::detail::number(eps));
    // out = x (the same view) is in place; any other overlap with x, the weight or itself would
    // normalise rows twice or race between threads.
    attnkit::detail::check_outputs_apart(
        {attnkit::detail::in_place(attnkit::detail::region_of("out", out), 1)},
        {attnkit::detail::in_place(attnkit::detail::region_of("x", x), 1), attnkit::detail::region_of("weight", w)});
    const index_t rows = rows_of(x);
    if (rows == 0 || d == 0) return;
    constexpr index_t kRowsPerTask = 16;
    parallel_for(pool, (rows + kRowsPerTask - 1) / kRowsPerTask, [&](index_t t) {
        const index_t r1 = std::min(rows, (t + 1) * kRowsPerTask);
        for (index_t r = t * kRowsPerTask; r < r1; ++r)
            rms_norm_row<simd::default_arch>(row_ptr(x, r), w.data, row_ptr(out, r), d, eps);
    });
}

}  // namespace detail

template <class X, class Wt, class O>
void rms_norm(const X& x, const Wt& weight, O&& out, float eps = 1e-6f, thread_pool* pool = nullptr) {
    constexpr int N = attnkit::detail::tensor_traits<std::decay_t<X>>::kRank;
    static_assert(N == 2 || N == 3, "attnkit::model::rms_norm: x must be [N, d] or [B, L, d]");
    detail::rms_norm_impl<N>(x, weight, std::forward<O>(out), eps, pool);
}

}  // namespace model
}  // namespace attnkit
