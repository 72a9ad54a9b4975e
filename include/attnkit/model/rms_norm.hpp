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
//
//   attnkit::model::rms_norm_backward(x, weight, d_out, d_x, d_weight, eps[, pool]);
//   its gradients (at the end of this file).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace model {
namespace detail {

// 1 / sqrt(mean_c x[c]^2 + eps) of one row, in double (the forward rounds it to float once).
// The sum of squares runs in float over SIMD lanes and then in double across lanes.
template <class A>
double rms_inv(const float* x, index_t d, float eps) {
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
    return 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
}

template <class A>
void rms_norm_row(const float* x, const float* w, float* out, index_t d, float eps) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const float inv = static_cast<float>(rms_inv<A>(x, d, eps));
    const V iv(inv);
    index_t c = 0;
    for (; c + W <= d; c += W) simd::storeu(out + c, simd::loadu<A>(x + c) * iv * simd::loadu<A>(w + c));
    for (; c < d; ++c) out[c] = x[c] * inv * w[c];
}

// One row of the backward pass. With xh = x * inv (the forward's normalised row, float) and
// g = d_out:
//   d_x[c] = inv * (w[c] g[c] - xh[c] k),  k = sum_j g[j] w[j] xh[j] / d
//   p[c]  += g[c] xh[c]                     (the row's share of d_weight, into its chunk's partial)
// k is taken over xh rather than x so that a row of any finite scale stays in range: x * inv is
// O(1) where x^2 or inv^2 alone would leave float (|x| ~ 1e20 or 1e-20). d_x may be g itself:
// the last loop reads g[c] before it writes d_x[c], and nothing reads g after it.
template <class A>
void rms_norm_backward_row(const float* x, const float* w, const float* g, float* dx, float* p, index_t d,
                           float eps) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const float inv = static_cast<float>(rms_inv<A>(x, d, eps));
    const V iv(inv);
    V a0(0.0f), a1(0.0f);
    index_t c = 0;
    for (; c + 2 * W <= d; c += 2 * W) {
        a0 = simd::fma(simd::loadu<A>(g + c) * simd::loadu<A>(w + c), simd::loadu<A>(x + c) * iv, a0);
        a1 = simd::fma(simd::loadu<A>(g + c + W) * simd::loadu<A>(w + c + W), simd::loadu<A>(x + c + W) * iv, a1);
    }
    double dot = static_cast<double>(simd::hsum(a0)) + static_cast<double>(simd::hsum(a1));
    for (; c < d; ++c) dot += static_cast<double>(g[c] * w[c]) * static_cast<double>(x[c] * inv);
    // As the sum of squares: a product past FLT_MAX (huge gradients) is summed again in double.
    if (ATTNKIT_UNLIKELY(!std::isfinite(dot))) {
        dot = 0.0;
        for (c = 0; c < d; ++c)
            dot += static_cast<double>(g[c]) * w[c] * static_cast<double>(x[c] * inv);
    }
    const float k = static_cast<float>(dot / static_cast<double>(d));
    const V nk(-k);
    c = 0;
    for (; c + W <= d; c += W) {
        const V gv = simd::loadu<A>(g + c), xh = simd::loadu<A>(x + c) * iv;
        simd::storeu(p + c, simd::fma(gv, xh, simd::loadu<A>(p + c)));
        simd::storeu(dx + c, simd::fma(xh, nk, simd::loadu<A>(w + c) * gv) * iv);
    }
    for (; c < d; ++c) {
        const float gc = g[c], xh = x[c] * inv;
        p[c] += gc * xh;
        dx[c] = (w[c] * gc - xh * k) * inv;
    }
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

// d_weight sums a product over every row. Rows go in chunks of kRmsGradChunkRows, a cut fixed by
// the row count alone (never by the pool): each chunk sums its rows in row order into a float
// partial of its own, and the partials are added in chunk order into a double accumulator. So
// d_weight has the same bits for any thread count, which a shared accumulator that threads add
// to in the order they finish would not. The chunks run in waves of kRmsGradWave, which bounds
// the partials at kRmsGradWave * d floats (1 MiB at d = 4096) whatever the number of rows.
constexpr index_t kRmsGradChunkRows = 32;
constexpr index_t kRmsGradWave = 64;
// Columns per task of the fold of a wave's partials into the accumulator.
constexpr index_t kRmsGradFoldColumns = 512;

template <int N, class X, class Wt, class G, class DX, class DW>
void rms_norm_backward_impl(const X& x_in, const Wt& w_in, const G& g_in, DX&& dx_in, DW&& dw_in, float eps,
                            thread_pool* pool) {
    const char* layout = N == 2 ? "[N, d]" : "[B, L, d]";
    const auto x = attnkit::detail::input_view<N>("x", x_in, layout);
    const auto w = attnkit::detail::input_view<1>("weight", w_in, "[d]");
    const auto g = attnkit::detail::input_view<N>("d_out", g_in, layout);
    const auto dx = attnkit::detail::output_view<N>("d_x", std::forward<DX>(dx_in), layout);
    const auto dw = attnkit::detail::output_view<1>("d_weight", std::forward<DW>(dw_in), "[d]");
    static_assert(attnkit::detail::kFloatViews<decltype(x), decltype(w), decltype(g), decltype(dx), decltype(dw)>,
                  "attnkit::model::rms_norm_backward: float tensors (double is for attnkit::reference)");
    attnkit::detail::check_layout("x", x);
    attnkit::detail::check_layout("weight", w);
    attnkit::detail::check_layout("d_out", g);
    attnkit::detail::check_layout("d_x", dx);
    attnkit::detail::check_layout("d_weight", dw);
    const index_t d = x.dims[N - 1];
    if (w.dims[0] != d)
        attnkit::detail::fail("weight: expected shape [d] = [" + std::to_string(d) + "] for x " + shape_string(x) +
                              ", got " + shape_string(w));
    if (g.dims != x.dims)
        attnkit::detail::fail("d_out: expected the shape of x " + shape_string(x) + ", got " + shape_string(g));
    if (dx.dims != x.dims)
        attnkit::detail::fail("d_x: expected the shape of x " + shape_string(x) + ", got " + shape_string(dx));
    if (dw.dims[0] != d)
        attnkit::detail::fail("d_weight: expected shape [d] = [" + std::to_string(d) + "] for x " + shape_string(x) +
                              ", got " + shape_string(dw));
    if (!(eps > 0.0f) || !std::isfinite(eps))
        attnkit::detail::fail("eps: expected a finite value > 0, got " + attnkit::detail::number(eps));
    // d_x = d_out (the same view) is in place: a row's d_out is read by no other row, and its last
    // pass reads each element before it writes d_x's at that place. Only d_out may be given up
    // so: x and the weight are the forward's inputs, which the caller keeps, and d_x laid over
    // them (or shifted over d_out) would change what rows still to come read, or race between
    // threads. d_weight is written after every row is read, and is apart from everything too.
    attnkit::detail::check_outputs_apart(
        {attnkit::detail::in_place(attnkit::detail::region_of("d_x", dx), 1),
         attnkit::detail::region_of("d_weight", dw)},
        {attnkit::detail::region_of("x", x), attnkit::detail::region_of("weight", w),
         attnkit::detail::in_place(attnkit::detail::region_of("d_out", g), 1)});
    if (d == 0) return;
    const index_t rows = rows_of(x);
    const index_t chunks = (rows + kRmsGradChunkRows - 1) / kRmsGradChunkRows;
    attnkit::detail::scratch_lease<double> acc_lease;
    attnkit::detail::scratch_lease<float> part_lease;
    std::vector<double>& acc = acc_lease.get();
    std::vector<float>& part = part_lease.get();
    acc.assign(static_cast<std::size_t>(d), 0.0);
    part.resize(static_cast<std::size_t>(std::min(chunks, kRmsGradWave) * d));
    for (index_t c0 = 0; c0 < chunks; c0 += kRmsGradWave) {
        const index_t n = std::min(kRmsGradWave, chunks - c0);
        parallel_for(pool, n, [&](index_t k) {
            float* p = part.data() + k * d;
            std::fill(p, p + d, 0.0f);
            const index_t r0 = (c0 + k) * kRmsGradChunkRows, r1 = std::min(rows, r0 + kRmsGradChunkRows);
            for (index_t r = r0; r < r1; ++r)
                rms_norm_backward_row<simd::default_arch>(row_ptr(x, r), w.data, row_ptr(g, r), row_ptr(dx, r), p,
                                                          d, eps);
        });
        // Columns are independent: any split of them adds each column's partials in chunk order.
        parallel_for(pool, (d + kRmsGradFoldColumns - 1) / kRmsGradFoldColumns, [&](index_t t) {
            const index_t j0 = t * kRmsGradFoldColumns, j1 = std::min(d, j0 + kRmsGradFoldColumns);
            for (index_t k = 0; k < n; ++k) {
                const float* p = part.data() + k * d;
                for (index_t j = j0; j < j1; ++j) acc[static_cast<std::size_t>(j)] += static_cast<double>(p[j]);
            }
        });
    }
    for (index_t j = 0; j < d; ++j) dw.data[j] = static_cast<float>(acc[static_cast<std::size_t>(j)]);
}

}  // namespace detail

template <class X, class Wt, class O>
void rms_norm(const X& x, const Wt& weight, O&& out, float eps = 1e-6f, thread_pool* pool = nullptr) {
    constexpr int N = attnkit::detail::tensor_traits<std::decay_t<X>>::kRank;
    static_assert(N == 2 || N == 3, "attnkit::model::rms_norm: x must be [N, d] or [B, L, d]");
    detail::rms_norm_impl<N>(x, weight, std::forward<O>(out), eps, pool);
}

// The gradients of rms_norm, given d_out = dLoss/d(out):
//
//   d_x[t, c]    = inv_t (weight[c] d_out[t, c] - xh[t, c] sum_j d_out[t, j] weight[j] xh[t, j] / d)
//   d_weight[c]  = sum_t d_out[t, c] xh[t, c],   xh[t, :] = x[t, :] inv_t,  inv_t = 1 / sqrt(mean x[t, :]^2 + eps)
//
//   attnkit::model::rms_norm_backward(x, weight, d_out, d_x, d_weight, eps[, pool]);
//   x, d_out, d_x [N, d] or [B, L, d] (same shape), weight, d_weight [d]; float. d_x and
//   d_weight are overwritten (d_weight is the sum over every row, not added to). d_x may be d_out
//   itself, the same view (in place); any other overlap of d_x with an input, and any overlap of
//   d_weight with anything, is rejected. d_weight has the same bits for any thread count (a fixed
//   chunking of the rows, added in chunk order; see kRmsGradChunkRows). Errors as rms_norm's,
//   before anything is written. The oracle: attnkit::reference::model::rms_norm_backward.
template <class X, class Wt, class G, class DX, class DW>
void rms_norm_backward(const X& x, const Wt& weight, const G& d_out, DX&& d_x, DW&& d_weight, float eps = 1e-6f,
                       thread_pool* pool = nullptr) {
    constexpr int N = attnkit::detail::tensor_traits<std::decay_t<X>>::kRank;
    static_assert(N == 2 || N == 3, "attnkit::model::rms_norm_backward: x must be [N, d] or [B, L, d]");
    detail::rms_norm_backward_impl<N>(x, weight, d_out, std::forward<DX>(d_x), std::forward<DW>(d_weight), eps,
                                      pool);
}

}  // namespace model
}  // namespace attnkit
