// int8 K/V storage: symmetric int8 values with one float scale per (token, key/value head).
//
//   attnkit::quantize_kv(x, values, scales);   x [B,L,Hk,D] float, bfloat16 or half
//                                              values std::int8_t [B,L,Hk,D], scales float [B,L,Hk]
//   attnkit::int8_kv k8(values, scales);       a view of both (no copy; they must outlive it)
//   attnkit::softmax_attention(q, k8, v8, out[, lse], opts);   float q, out and lse
//
// Row (b, l, h) stands for scales(b, l, h) * values(b, l, h, :). quantize_kv takes
// s = max_d |x(b, l, h, d)| / 127 and values round(x / s) (to nearest, ties to even; 0 for a
// row of zeros), so every element is within s / 2 = max|row| / 254 of x: the bound
// docs/serving.md ("int8 K/V") carries to the attention output, and tests/int8_kv_test.cpp checks.
//
// Why one scale per row and not per block of 32 values (llama.cpp's q8_0): a row's scale
// factors out of each dot product and each weighted sum of value rows, so the kernels' inner
// loops are those of the 16-bit caches with an int8 widening load, and a scale costs one
// multiply per score and one per weight, while per-block scales put a multiply per 32 values
// into the inner loop and 4 bytes per 32 values (12.5%) into the stream decode is bound by.
// q8_0 is more accurate on rows with a few large channels; docs/serving.md ("int8 K/V") has both measured
// (bench/int8_kv_bench.cpp).
//
// The kernels read the values in place, widening them in their loads (decode) or into their
// float tiles (prefill), with the scales applied there: no dequantised copy of K or V exists.
// Scales must be finite (checked before anything is written); values are any int8, -128
// included, although quantize_kv writes [-127, 127] only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/memory_overlap.hpp"
#include "attnkit/detail/micro_kernels.hpp"
#include "attnkit/simd/convert.hpp"
#include "attnkit/view.hpp"

namespace attnkit {

// int8 K or V as attention takes them: values [B, L, Hk, D] (the last dimension contiguous,
// other strides free, as any K/V view) and scales [B, L, Hk] (any strides); or, for the packed
// rows of softmax_attention_varlen, values [T, Hk, D] and scales [T, Hk], held as a batch of one.
// Holds views, not data.
class int8_kv {
   public:
    template <class Values, class Scales>
    int8_kv(const Values& values, const Scales& scales)
        : values_(values_view(values)), scales_(scales_view<Values>(scales)) {
        static_assert(std::is_same<detail::scalar_of<Values>, std::int8_t>::value,
                      "attnkit::int8_kv: values must be a std::int8_t tensor [B, L, Hk, D] (or packed [T, Hk, D])");
        static_assert(std::is_same<detail::scalar_of<Scales>, float>::value,
                      "attnkit::int8_kv: scales must be a float tensor [B, L, Hk] (or packed [T, Hk])");
    }

    const view<const std::int8_t, 4>& values() const noexcept { return values_; }
    const view<const float, 3>& scales() const noexcept { return scales_; }

   private:
    template <class X>
    static constexpr bool kPacked = detail::tensor_traits<std::decay_t<X>>::kRank == 3;

    // Rank 3 values take rank 2 scales, rank 4 take rank 3 (input_view's static_assert names a
    // mismatch as a wrong rank).
    template <class Values>
    static view<const std::int8_t, 4> values_view(const Values& values) {
        if constexpr (kPacked<Values>)
            return detail::as_batch_of_one(detail::input_view<3>("values", values, "[T, Hk, D]"));
        else
            return detail::input_view<4>("values", values, "[B, L, Hk, D]");
    }
    template <class Values, class Scales>
    static view<const float, 3> scales_view(const Scales& scales) {
        if constexpr (kPacked<Values>)
            return detail::as_batch_of_one(detail::input_view<2>("scales", scales, "[T, Hk]"));
        else
            return detail::input_view<3>("scales", scales, "[B, L, Hk]");
    }
    view<const std::int8_t, 4> values_;
    view<const float, 3> scales_;
};

namespace detail {

// The scales of int8 K or V against the call's shape s ([B, Lk, Hk]), and finite: a scale of
// Inf or NaN would spread over every row that sees its key, where a float cache's NaN stays in
// its own element. Named "k.scales" / "v.scales" in messages.
inline void check_kv_scales(const char* name, const view<const float, 3>& scales, index_t batch, index_t len,
                            index_t heads_k) {
    using A = simd::default_arch;
    check_extent(name, scales);
    check_shape(name, scales, {batch, len, heads_k}, "[B, Lk, Hk]");
    // A decode call reads the scales once here and once in the kernel: the scan must stream
    // (vectors over a dense tensor, rows of Hk otherwise), not index element by element.
    const view<const float, 3> dense(scales.data, scales.dims);
    if (scales.strides == dense.strides || heads_k == 0) {
        if (all_finite<A>(scales.data, batch * len * heads_k)) return;
    } else if (scales.strides[2] == 1) {
        bool ok = true;
        for (index_t b = 0; b < batch && ok; ++b)
            for (index_t l = 0; l < len && ok; ++l) ok = all_finite<A>(scales.ptr(b, l, 0), heads_k);
        if (ok) return;
    } else if (scales.strides[1] == 1) {  // head-major [B, Hk, L]
        bool ok = true;
        for (index_t b = 0; b < batch && ok; ++b)
            for (index_t h = 0; h < heads_k && ok; ++h) ok = all_finite<A>(scales.ptr(b, 0, h), len);
        if (ok) return;
    }
    for (index_t b = 0; b < batch; ++b)
        for (index_t l = 0; l < len; ++l)
            for (index_t h = 0; h < heads_k; ++h) {
                const float s = scales(b, l, h);
                if (!std::isfinite(s))
                    fail(std::string(name) + ": scale (" + number(b) + ", " + number(l) + ", " + number(h) +
                         ") = " + number(s) + " is not finite, in shape " + shape_string(scales));
            }
}

// max |x[0, n)| (a NaN or Inf anywhere makes `finite` false).
template <class A, class T>
float row_amax(const T* x, index_t n, bool& finite) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    V m(0.0f), z(0.0f);
    index_t d = 0;
    for (; d + W <= n; d += W) {
        const V v = simd::load_float<A>(x + d);
        m = simd::max(m, simd::max(v, V(0.0f) - v));
        z = simd::fma(v, V(0.0f), z);  // x * 0 is NaN exactly for NaN and +-Inf
    }
    float amax = simd::hmax(m), zs = simd::hsum(z);
    for (; d < n; ++d) {
        const float v = simd::to_float(x[d]);
        amax = std::max(amax, std::fabs(v));
        zs += v * 0.0f;
    }
    finite = zs == 0.0f;
    return amax;
}

// x[0, n) as int8 values at out, given amax = max |x| (finite); returns the row's scale.
// Rounding to nearest even by the 1.5 * 2^52 addition in double (exact for |v| < 2^51, and
// vectorised where std::nearbyint is a library call); x / s as x * (1 / s) in double is within
// 2^-45 of the quotient, far below the half-step the rounding decides on.
template <class T>
float quantize_row(const T* x, index_t n, float amax, std::int8_t* out) {
    constexpr double kRound = 6755399441055744.0;
    const float s = amax / 127.0f;
    // Zeros, or values below 127 x the smallest subnormal: all 0.
    const double inv = s == 0.0f ? 0.0 : 1.0 / static_cast<double>(s);
    for (index_t d = 0; d < n; ++d) {
        const double q = (static_cast<double>(simd::to_float(x[d])) * inv + kRound) - kRound;
        out[d] = static_cast<std::int8_t>(q < -127.0 ? -127.0 : q > 127.0 ? 127.0 : q);
    }
    return s;
}

template <class T>
void quantize_kv_run(const view<const T, 4>& x, const view<std::int8_t, 4>& values, const view<float, 3>& scales) {
    using A = simd::default_arch;
    check_layout("x", x);
    check_layout("values", values);
    check_extent("scales", scales);
    const index_t B = x.dims[0], L = x.dims[1], H = x.dims[2], D = x.dims[3];
    check_shape("values", values, {B, L, H, D}, "[B, L, Hk, D] of x");
    check_shape("scales", scales, {B, L, H}, "[B, L, Hk] of x");
    check_outputs_apart({region_of("values", values), region_of("scales", scales)}, {region_of("x", x)});
    // First every row's max |x|, so that a non-finite input (int8 has no Inf or NaN) is refused,
    // not saturated, before anything is written.
    std::vector<float> amax(static_cast<std::size_t>(B * L * H));
    for (index_t b = 0, i = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < H; ++h, ++i) {
                bool finite = true;
                amax[static_cast<std::size_t>(i)] = row_amax<A>(x.ptr(b, l, h), D, finite);
                if (finite) continue;
                index_t d = 0;
                while (d < D && std::isfinite(simd::to_float(x.ptr(b, l, h)[d]))) ++d;
                fail("x: element (" + number(b) + ", " + number(l) + ", " + number(h) + ", " + number(d) +
                     ") of shape " + shape_string(x) + " is not finite; int8 values cannot hold it");
            }
    for (index_t b = 0, i = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < H; ++h, ++i)
                scales(b, l, h) = quantize_row(x.ptr(b, l, h), D, amax[static_cast<std::size_t>(i)], values.ptr(b, l, h));
}

}  // namespace detail

// values(b, l, h, :) and scales(b, l, h) for every row of x (float, bfloat16 or half) as
// described above. Every argument is checked (shapes, layouts, memory apart, x finite) before
// anything is written.
template <class X, class Values, class Scales>
void quantize_kv(const X& x, Values&& values, Scales&& scales) {
    const auto xv = detail::input_view<4>("x", x, "[B, L, Hk, D]");
    const auto qv = detail::output_view<4>("values", std::forward<Values>(values), "[B, L, Hk, D]");
    const auto sv = detail::output_view<3>("scales", std::forward<Scales>(scales), "[B, L, Hk]");
    using TX = detail::scalar_of<X>;
    constexpr bool kTypes = simd::kIsStorageType<TX> && std::is_same<detail::scalar_of<Values>, std::int8_t>::value &&
                            std::is_same<detail::scalar_of<Scales>, float>::value;
    static_assert(kTypes,
                  "attnkit::quantize_kv: x must be float, Eigen::bfloat16 or Eigen::half, values std::int8_t and "
                  "scales float");
    if constexpr (kTypes) detail::quantize_kv_run(xv, qv, sv);
}

}  // namespace attnkit
