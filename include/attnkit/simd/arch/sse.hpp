// Kernels of the SIMD layer for the SSE family (tag xsimd::sse2 and what derives from it:
// sse3 ... sse4_2, fma3<sse4_2>, fma4): 4 float lanes. Only what the portable kernels in
// generic.hpp cannot express well is here. Not a public header (include attnkit/simd/simd.hpp).
//
//   stream_store / store_fence  movntps and sfence: xsimd has no non-temporal store.
//   load_float (16-bit)         four bfloat16 widened by one unpack against zero (bfloat16 is
//                               the upper half of a float); four half by vcvtph2ps where the
//                               target has F16C, else by an exact integer sequence (plain SSE2
//                               has no half conversion), instead of the generic element loop.
//   load_float (int8)           four int8 sign-extended by two self-unpacks and an arithmetic
//                               shift (SSE2 has no pmovsxbd), then cvtdq2ps.
//   load_bf16_pairs             even / odd elements by one shift and one mask per 8 elements.
//   swap_pairs                  one shufps.
//   transpose                   _MM_TRANSPOSE4_PS.
//   narrow                      two double vectors to one float vector: two cvtpd2ps, one movlhps.
// widen4 is also the building block of the AVX (no AVX2) 16-bit loads in avx.hpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attnkit/config.hpp"
#include "attnkit/simd/arch/common.hpp"

// Everything here needs the SSE2 intrinsics; without them the generic kernels serve.
#if XSIMD_WITH_SSE2
#include <immintrin.h>

namespace attnkit {
namespace simd {
namespace kernel {

using xsimd::sse2;

template <class A>
ATTNKIT_ALWAYS_INLINE void stream_store(float* p, const xsimd::batch<float, A>& v, requires_arch<sse2>) noexcept {
    _mm_stream_ps(p, v);
}
inline void store_fence(requires_arch<sse2>) noexcept { _mm_sfence(); }

// Four half values (low 16 bits of each int32 lane) to float bits, without F16C: zeros,
// subnormals, infinities and NaN exactly.
ATTNKIT_ALWAYS_INLINE __m128 half_bits_to_float_sse2(__m128i h) noexcept {
    const __m128i sign = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x8000)), 16);
    __m128i o = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x7fff)), 13);  // exponent + mantissa
    const __m128i exp = _mm_and_si128(o, _mm_set1_epi32(0x0f800000));
    o = _mm_add_epi32(o, _mm_set1_epi32((127 - 15) << 23));  // rebias
    // Inf / NaN: exponent all ones, rebias once more so it becomes 255.
    const __m128i is_inf = _mm_cmpeq_epi32(exp, _mm_set1_epi32(0x0f800000));
    o = _mm_add_epi32(o, _mm_and_si128(is_inf, _mm_set1_epi32((128 - 16) << 23)));
    // Zero / subnormal: value = mantissa * 2^-24, computed exactly as (2^-14 + m) - 2^-14 in float.
    const __m128i is_sub = _mm_cmpeq_epi32(exp, _mm_setzero_si128());
    const __m128 sub = _mm_sub_ps(_mm_castsi128_ps(_mm_add_epi32(o, _mm_set1_epi32(1 << 23))),
                                  _mm_castsi128_ps(_mm_set1_epi32(113 << 23)));
    o = _mm_or_si128(_mm_and_si128(is_sub, _mm_castps_si128(sub)), _mm_andnot_si128(is_sub, o));
    return _mm_castsi128_ps(_mm_or_si128(o, sign));
}

// Four values of T (Eigen::bfloat16 or Eigen::half) in the low 64 bits of x, as floats.
template <class T>
ATTNKIT_ALWAYS_INLINE __m128 widen4(__m128i x) noexcept {
    if constexpr (std::is_same<T, Eigen::bfloat16>::value) {
        // Unpacking against zero puts each value in the high half of its lane: the float.
        return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), x));
    } else {
#if defined(__F16C__)
        return _mm_cvtph_ps(x);
#else
        return half_bits_to_float_sse2(_mm_unpacklo_epi16(x, _mm_setzero_si128()));
#endif
    }
}

template <class A, class T>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> load_float(const T* p, requires_arch<sse2>) noexcept {
    return xsimd::batch<float, A>(widen4<T>(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Four int8 in the low 32 bits of x, as int32: each byte unpacked against itself twice fills
// its lane with four copies, and the arithmetic shift keeps one with its sign.
ATTNKIT_ALWAYS_INLINE __m128i widen4_i8(__m128i x) noexcept {
    x = _mm_unpacklo_epi8(x, x);
    return _mm_srai_epi32(_mm_unpacklo_epi16(x, x), 24);
}

// (More specialised than the template above, so int8 takes this one.)
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> load_float(const std::int8_t* p, requires_arch<sse2>) noexcept {
    std::int32_t w;
    std::memcpy(&w, p, sizeof(w));
    return xsimd::batch<float, A>(_mm_cvtepi32_ps(widen4_i8(_mm_cvtsi32_si128(w))));
}

template <class A, class T>
ATTNKIT_ALWAYS_INLINE void load_bf16_pairs(const T* p, xsimd::batch<float, A>& even, xsimd::batch<float, A>& odd,
                                           requires_arch<sse2>) noexcept {
    using B = xsimd::batch<float, A>;
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    even = B(_mm_castsi128_ps(_mm_slli_epi32(x, 16)));
    odd = B(_mm_castsi128_ps(_mm_and_si128(x, _mm_set1_epi32(static_cast<int>(0xffff0000u)))));
}

template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> swap_pairs(const xsimd::batch<float, A>& v, requires_arch<sse2>) noexcept {
    const __m128 x = v;
    return xsimd::batch<float, A>(_mm_shuffle_ps(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
}

template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> narrow(const xsimd::batch<double, A>& lo, const xsimd::batch<double, A>& hi,
                                                    requires_arch<sse2>) noexcept {
    return xsimd::batch<float, A>(_mm_movelh_ps(_mm_cvtpd_ps(lo), _mm_cvtpd_ps(hi)));
}

template <class A>
ATTNKIT_ALWAYS_INLINE void transpose(xsimd::batch<float, A>* v, requires_arch<sse2>) noexcept {
    __m128 r0 = v[0], r1 = v[1], r2 = v[2], r3 = v[3];
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    v[0] = r0;
    v[1] = r1;
    v[2] = r2;
    v[3] = r3;
}

}  // namespace kernel
}  // namespace simd
}  // namespace attnkit

#endif  // XSIMD_WITH_SSE2
