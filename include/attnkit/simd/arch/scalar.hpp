// Kernels of the SIMD layer for simd::scalar_arch: one float per "vector" (simd::scalar_float),
// with the operators kernels use on xsimd batches, so that every kernel template also has a
// portable path (ATTNKIT_SIMD_SCALAR builds, targets xsimd does not know) and the tests have a
// one-lane reference for each vector operation. Included by simd.hpp; not a public header.
//
// Its special cases mirror the vector kernels' documented rules rather than the C library's:
// max/min return the second operand when either is NaN (the x86 rule), and exp2 / exp flush
// results below the normal range to 0 and saturate to +inf at the same thresholds as the
// polynomial in generic.hpp, so the scalar path and the vector path agree on every edge.
#pragma once

#include <cmath>
#include <limits>

#include "attnkit/config.hpp"
#include "attnkit/simd/arch/common.hpp"

namespace attnkit {
namespace simd {

struct scalar_arch {
    static constexpr const char* name() noexcept { return "scalar"; }
};

// One lane of float with the operators kernels use on xsimd batches.
struct scalar_float {
    static constexpr std::size_t size = 1;
    float v;
    scalar_float() = default;
    constexpr scalar_float(float x) : v(x) {}
    friend scalar_float operator+(scalar_float a, scalar_float b) { return a.v + b.v; }
    friend scalar_float operator-(scalar_float a, scalar_float b) { return a.v - b.v; }
    friend scalar_float operator*(scalar_float a, scalar_float b) { return a.v * b.v; }
    friend scalar_float operator/(scalar_float a, scalar_float b) { return a.v / b.v; }
    scalar_float& operator+=(scalar_float b) { v += b.v; return *this; }
    scalar_float& operator-=(scalar_float b) { v -= b.v; return *this; }
    scalar_float& operator*=(scalar_float b) { v *= b.v; return *this; }
    friend bool operator<(scalar_float a, scalar_float b) { return a.v < b.v; }
    friend bool operator>(scalar_float a, scalar_float b) { return a.v > b.v; }
    friend bool operator>=(scalar_float a, scalar_float b) { return a.v >= b.v; }
    friend bool operator==(scalar_float a, scalar_float b) { return a.v == b.v; }
};

template <>
struct vec_of<scalar_arch> {
    using type = scalar_float;
};

namespace kernel {

using S = scalar_float;

template <class A>
ATTNKIT_ALWAYS_INLINE S loadu(const float* p, requires_arch<scalar_arch>) noexcept { return S(*p); }
ATTNKIT_ALWAYS_INLINE void storeu(float* p, S v, requires_arch<scalar_arch>) noexcept { *p = v.v; }

ATTNKIT_ALWAYS_INLINE S fma(S a, S b, S c, requires_arch<scalar_arch>) noexcept { return std::fma(a.v, b.v, c.v); }
ATTNKIT_ALWAYS_INLINE S max(S a, S b, requires_arch<scalar_arch>) noexcept { return a.v > b.v ? a.v : b.v; }
ATTNKIT_ALWAYS_INLINE S min(S a, S b, requires_arch<scalar_arch>) noexcept { return a.v < b.v ? a.v : b.v; }
ATTNKIT_ALWAYS_INLINE S select(bool c, S a, S b, requires_arch<scalar_arch>) noexcept { return c ? a : b; }

inline float hsum(S v, requires_arch<scalar_arch>) noexcept { return v.v; }
inline float hmax(S v, requires_arch<scalar_arch>) noexcept { return v.v; }
// One vector of one lane: its sum is itself.
ATTNKIT_ALWAYS_INLINE S hsum_each(const S* v, requires_arch<scalar_arch>) noexcept { return v[0]; }

// std::exp2 with the vector rules: (127, 128) would be finite in the C library but is +inf in
// the polynomial, and subnormal results are 0 there.
inline S exp2(S x, requires_arch<scalar_arch>) noexcept {
    if (x.v > 127.0f) return std::numeric_limits<float>::infinity();  // 2^(127, 128) is finite
    const float y = std::exp2(x.v);
    return y < std::numeric_limits<float>::min() ? 0.0f : y;
}
// The vector form drops the overflow handling for speed; one lane has nothing to save.
inline S exp2_nonpositive(S x, requires_arch<scalar_arch>) noexcept { return exp2(x, scalar_arch{}); }
// std::exp with the thresholds of exp2(x * log2 e), as the vector form.
inline S exp(S x, requires_arch<scalar_arch>) noexcept {
    const float t = x.v * kLog2e;
    if (t > 127.0f) return std::numeric_limits<float>::infinity();
    if (t < -126.0f) return 0.0f;
    return std::exp(x.v);
}
inline S tanh(S x, requires_arch<scalar_arch>) noexcept { return std::tanh(x.v); }

template <class A>
inline void sincos(const double* x, float* s, float* c, index_t n, requires_arch<scalar_arch>) noexcept {
    for (index_t i = 0; i < n; ++i) s[i] = static_cast<float>(std::sin(x[i])), c[i] = static_cast<float>(std::cos(x[i]));
}

// No non-temporal store for one float: a plain store (nothing for store_fence to order).
ATTNKIT_ALWAYS_INLINE void stream_store(float* p, S v, requires_arch<scalar_arch>) noexcept { *p = v.v; }
inline void store_fence(requires_arch<scalar_arch>) noexcept {}

// 16-bit storage, one element (T is Eigen::bfloat16 or Eigen::half; templates so that the
// element is read only where simd/convert.hpp has defined the type).
template <class A, class T>
ATTNKIT_ALWAYS_INLINE S load_float(const T* p, requires_arch<scalar_arch>) noexcept {
    return S(to_float(*p));
}
template <class T>
ATTNKIT_ALWAYS_INLINE void load_bf16_pairs(const T* p, S& even, S& odd, requires_arch<scalar_arch>) noexcept {
    even = S(to_float(p[0]));
    odd = S(to_float(p[1]));
}
template <class T>
ATTNKIT_ALWAYS_INLINE void store_float(T* p, S v, requires_arch<scalar_arch>) noexcept {
    *p = T(v.v);  // Eigen's conversion: round to nearest even
}

}  // namespace kernel
}  // namespace simd
}  // namespace attnkit
