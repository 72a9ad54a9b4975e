// Shims over xsimd API changes, so that the rest of attnkit compiles against Debian's xsimd 8.1
// and against current releases alike. This header and simd.hpp are the only ones naming xsimd.
#pragma once

// GCC 12 reports -Wmaybe-uninitialized (and -Wuninitialized) inside its own AVX-512 intrinsic
// headers whenever xsimd inlines one of the "undefined register" idioms (`__m512 __Y = __Y;` in
// _mm512_undefined_ps, used by the masked conversions and rounding): a false positive, GCC bug
// 105593, fixed in GCC 13. GCC applies a diagnostic pragma if any location of the inlining chain
// lies inside it, and every such chain passes through xsimd's headers, so ignoring the two
// warnings around this include silences exactly them, in users' -Werror builds too, without
// hiding warnings about attnkit's or the user's own code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <xsimd/xsimd.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

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
