// Loads of 16-bit storage (Eigen::bfloat16, Eigen::half) as float vectors, so that kernels read
// a half-precision K/V cache in place and compute in float: no converted copy of a tensor ever
// exists, at most a packed tile in a float scratch panel.
//
//   simd::load_float<A>(p)            W elements at p (float, bfloat16, half or int8) as vfloat<A>
//   simd::load_float_partial<A>(p, n) n < W elements, the other lanes 0, nothing read past p + n
//   simd::to_float(x)                 one element
//   simd::convert_row<A>(src, dst, n) n elements to float (packing a tile)
//   simd::store_float<A>(p, v)        W floats stored as T, rounded to nearest even (Eigen's rule)
//
// bfloat16 is the upper half of a float: widening is a shift (or an unpack against zero). half
// needs its exponent rebased: F16C / AVX-512F do it in one instruction; plain SSE2 builds use an
// integer sequence that handles zeros, subnormals, infinities and NaN exactly. Every conversion
// is exact (both formats are subsets of float), so kernels see exactly the stored values.
// This header is a front, as simd.hpp: load_float, load_bf16_pairs and store_float forward to
// simd::kernel overloads on the architecture tag in simd/arch/ (one file per ISA family, each
// saying which instructions it uses and why); load_float_partial and convert_row are written on those.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attnkit/eigen_core.hpp"

#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace simd {

// Element types a kernel may read as float.
template <class T>
constexpr bool kIsStorageType = std::is_same<T, float>::value || std::is_same<T, Eigen::bfloat16>::value ||
                                std::is_same<T, Eigen::half>::value;

// One element (declared in simd/arch/common.hpp, with to_float(float), for the kernels).
ATTNKIT_ALWAYS_INLINE float to_float(Eigen::bfloat16 x) noexcept {
    std::uint16_t h;
    std::memcpy(&h, &x, sizeof(h));
    const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}
ATTNKIT_ALWAYS_INLINE float to_float(Eigen::half x) noexcept { return static_cast<float>(x); }

template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> load_float(const float* p) noexcept {
    return loadu<A>(p);
}
template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> load_float(const Eigen::bfloat16* p) noexcept {
    return kernel::load_float<A>(p, A{});
}
template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> load_float(const Eigen::half* p) noexcept {
    return kernel::load_float<A>(p, A{});
}
// int8 values of a scaled row (attnkit/int8_kv.hpp) as float, unscaled: exact.
template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> load_float(const std::int8_t* p) noexcept {
    return kernel::load_float<A>(p, A{});
}

// Element types stored as values times a per-row float scale that kernels apply outside the
// row (to a whole dot product or a weight), never element by element.
template <class T>
constexpr bool kIsScaledStorage = std::is_same<T, std::int8_t>::value;

// 2W bfloat16 at p as two float vectors, even = elements 0, 2, 4, ... and odd = 1, 3, 5, ...: a
// fixed permutation that costs one shift and one mask per 2W elements (where load_float needs
// a widening shuffle and a shift per W), for kernels that keep their float operands in the same
// permuted order (a dot product or an axpy does not care about the order of its elements).
template <class A>
ATTNKIT_ALWAYS_INLINE void load_bf16_pairs(const Eigen::bfloat16* p, vfloat<A>& even, vfloat<A>& odd) noexcept {
    kernel::load_bf16_pairs(p, even, odd, A{});
}

// W floats stored at p as T: float as they are, bfloat16 and half rounded to nearest even, as
// Eigen::bfloat16(float) and Eigen::half(float) round one element (NaN stays NaN, overflow gives
// infinity), so a kernel that computes in float and stores 16-bit gives exactly what rounding
// its float result would.
template <class A>
ATTNKIT_ALWAYS_INLINE void store_float(float* p, const vfloat<A>& v) noexcept {
    storeu(p, v);
}
template <class A>
ATTNKIT_ALWAYS_INLINE void store_float(Eigen::bfloat16* p, const vfloat<A>& v) noexcept {
    kernel::store_float(p, v, A{});
}
template <class A>
ATTNKIT_ALWAYS_INLINE void store_float(Eigen::half* p, const vfloat<A>& v) noexcept {
    kernel::store_float(p, v, A{});
}

// n < W elements; the other lanes are 0 and nothing at or past p + n is read.
template <class A, class T>
ATTNKIT_ALWAYS_INLINE vfloat<A> load_float_partial(const T* p, index_t n) noexcept {
    alignas(64) float buf[kLanes<A>] = {};
    for (index_t i = 0; i < n; ++i) buf[i] = to_float(p[i]);
    return loadu<A>(buf);
}

// x[i] *= y[i] and x[i] *= s for i < n, in vectors (GCC 12 at -O2 vectorises neither loop
// form: the row scales of int8 K/V are applied through these).
template <class A>
inline void multiply_into(float* ATTNKIT_RESTRICT x, const float* ATTNKIT_RESTRICT y, index_t n) noexcept {
    constexpr index_t W = kLanes<A>;
    index_t i = 0;
    for (; i + W <= n; i += W) storeu(x + i, loadu<A>(x + i) * loadu<A>(y + i));
    for (; i < n; ++i) x[i] *= y[i];
}
template <class A>
inline void scale_into(float* x, float s, index_t n) noexcept {
    constexpr index_t W = kLanes<A>;
    const vfloat<A> sv(s);
    index_t i = 0;
    for (; i + W <= n; i += W) storeu(x + i, loadu<A>(x + i) * sv);
    for (; i < n; ++i) x[i] *= s;
}

// dst[0, n) = src[0, n) as float.
template <class A, class T>
inline void convert_row(const T* ATTNKIT_RESTRICT src, float* ATTNKIT_RESTRICT dst, index_t n) noexcept {
    if constexpr (std::is_same<T, float>::value) {
        std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
    } else {
        constexpr index_t W = kLanes<A>;
        index_t i = 0;
        for (; i + W <= n; i += W) storeu(dst + i, load_float<A>(src + i));
        for (; i < n; ++i) dst[i] = to_float(src[i]);
    }
}

}  // namespace simd
}  // namespace attnkit
