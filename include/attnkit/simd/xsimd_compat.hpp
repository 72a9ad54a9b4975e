// Shims over xsimd API changes, so that the rest of attnkit compiles against Debian's xsimd 8.1
// and against current releases alike. Only the headers under attnkit/simd/ name xsimd.
#pragma once

// xsimd inside the GCC 12 false AVX-512 warning region (detail/avx512_warnings.hpp).
#include "attnkit/detail/avx512_warnings.hpp"

ATTNKIT_AVX512_WARNINGS_OFF
#include <xsimd/xsimd.hpp>
ATTNKIT_AVX512_WARNINGS_ON

#ifndef XSIMD_VERSION_MAJOR
#error "attnkit: xsimd did not define XSIMD_VERSION_MAJOR"
#endif

namespace attnkit {
namespace simd {
namespace compat {

// Horizontal sum: 8.x calls it hadd, later releases reduce_add (hadd was removed).
template <class A>
inline float reduce_add(const xsimd::batch<float, A>& x) noexcept {
#if XSIMD_VERSION_MAJOR >= 9
    return xsimd::reduce_add(x);
#else
    return xsimd::hadd(x);
#endif
}

// Reinterpret float lanes as int32 lanes and back: the template argument was the target batch
// type up to xsimd 10 and became the target element type in 11.
template <class A>
inline xsimd::batch<std::int32_t, A> as_int(const xsimd::batch<float, A>& x) noexcept {
#if XSIMD_VERSION_MAJOR >= 11
    return xsimd::bitwise_cast<std::int32_t>(x);
#else
    return xsimd::bitwise_cast<xsimd::batch<std::int32_t, A>>(x);
#endif
}
template <class A>
inline xsimd::batch<float, A> as_float(const xsimd::batch<std::int32_t, A>& x) noexcept {
#if XSIMD_VERSION_MAJOR >= 11
    return xsimd::bitwise_cast<float>(x);
#else
    return xsimd::bitwise_cast<xsimd::batch<float, A>>(x);
#endif
}

}  // namespace compat
}  // namespace simd
}  // namespace attnkit
