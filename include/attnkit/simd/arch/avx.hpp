// Kernels of the SIMD layer for the AVX family (tags xsimd::avx and xsimd::avx2, and what derives
// from them: fma3<avx>, fma3<avx2>): 8 float lanes. Only what the portable kernels in
// generic.hpp cannot express well is here. Not a public header (include attnkit/simd/simd.hpp).
//
//   stream_store / store_fence  vmovntps and sfence: xsimd has no non-temporal store.
//   load_float (16-bit)         AVX2: bfloat16 by one zero-extension and a shift; half by
//                               vcvtph2ps where the target has F16C. Plain AVX has no 256-bit
//                               integer shifts, so bfloat16 (and half without F16C) is two SSE
//                               halves (sse.hpp's widen4) joined, still no element loop.
//   load_float (int8)           AVX2: one vpmovsxbd and vcvtdq2ps; plain AVX: two SSE halves.
//   load_bf16_pairs             AVX2 only (it needs the 256-bit shift and mask); plain AVX
//                               uses the generic element loop.
//   store_float (16-bit)        half by vcvtps2ph where the target has F16C; bfloat16 on AVX2
//                               by integer round-to-nearest-even and one pack (Eigen's rule,
//                               NaN to the quiet NaN of its sign), not an element loop.
//   swap_pairs                  one vpermilps.
//   transpose                   8 x 8 in registers: unpacks, shuffles, one lane exchange.
//   narrow                      two double vectors to one float vector: two vcvtpd2ps, one insert.
// avx does not derive from sse2 in xsimd 8 (it does in later releases), so store_fence is
// repeated here rather than inherited.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attnkit/config.hpp"
#include "attnkit/simd/arch/common.hpp"
#include "attnkit/simd/arch/sse.hpp"

// Everything here needs the AVX intrinsics; without them the SSE or generic kernels serve.
#if XSIMD_WITH_AVX
#include <immintrin.h>

namespace attnkit {
namespace simd {
namespace kernel {

using xsimd::avx;

template <class A>
ATTNKIT_ALWAYS_INLINE void stream_store(float* p, const xsimd::batch<float, A>& v, requires_arch<avx>) noexcept {
    _mm256_stream_ps(p, v);
}
inline void store_fence(requires_arch<avx>) noexcept { _mm_sfence(); }

// Eight values of T (Eigen::bfloat16 or Eigen::half) in x, as floats.
template <class T>
ATTNKIT_ALWAYS_INLINE __m256 widen8(__m128i x, requires_arch<avx>) noexcept {
#if defined(__F16C__)
    if constexpr (std::is_same<T, Eigen::half>::value) return _mm256_cvtph_ps(x);
#endif
    return _mm256_insertf128_ps(_mm256_castps128_ps256(widen4<T>(x)), widen4<T>(_mm_srli_si128(x, 8)), 1);
}
#if XSIMD_WITH_AVX2
using xsimd::avx2;

template <class T>
ATTNKIT_ALWAYS_INLINE __m256 widen8(__m128i x, requires_arch<avx2>) noexcept {
    if constexpr (std::is_same<T, Eigen::bfloat16>::value)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
    else
        return widen8<T>(x, avx{});
}
#endif

// (Both widen8 overloads are declared above this call, so that it finds the avx2 one.)
template <class A, class T>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> load_float(const T* p, requires_arch<avx>) noexcept {
    return xsimd::batch<float, A>(widen8<T>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), A{}));
}

// Eight int8 (more specialised than the template above, so int8 takes this one).
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> load_float(const std::int8_t* p, requires_arch<avx>) noexcept {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
#if XSIMD_WITH_AVX2
    return xsimd::batch<float, A>(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)));
#else
    const __m128 lo = _mm_cvtepi32_ps(widen4_i8(x)), hi = _mm_cvtepi32_ps(widen4_i8(_mm_srli_si128(x, 4)));
    return xsimd::batch<float, A>(_mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1));
#endif
}

#if XSIMD_WITH_AVX2
template <class A, class T>
ATTNKIT_ALWAYS_INLINE void load_bf16_pairs(const T* p, xsimd::batch<float, A>& even, xsimd::batch<float, A>& odd,
                                           requires_arch<avx2>) noexcept {
    using B = xsimd::batch<float, A>;
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = B(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)));
    odd = B(_mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xffff0000u)))));
}
#endif  // XSIMD_WITH_AVX2

template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> swap_pairs(const xsimd::batch<float, A>& v, requires_arch<avx>) noexcept {
    return xsimd::batch<float, A>(_mm256_permute_ps(v, 0xB1));
}

#if defined(__F16C__)
template <class A>
ATTNKIT_ALWAYS_INLINE void store_float(Eigen::half* p, const xsimd::batch<float, A>& v, requires_arch<avx>) noexcept {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#endif
#if XSIMD_WITH_AVX2
// The bfloat16 bits of eight floats, one per 32-bit lane: round to nearest even on the bits (add
// 0x7fff plus the lowest kept bit, keep the top half); NaN becomes 0x7fc0 with its sign, as
// Eigen::bfloat16(float) does.
ATTNKIT_ALWAYS_INLINE __m256i bf16_bits(__m256 v) noexcept {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_and_si256(hi, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7fc0));
    return _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
template <class A>
ATTNKIT_ALWAYS_INLINE void store_float(Eigen::bfloat16* p, const xsimd::batch<float, A>& v,
                                       requires_arch<avx2>) noexcept {
    const __m256i r = bf16_bits(v);
    // Every lane is in [0, 0xffff]: the unsigned-saturating pack keeps it as it is.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
template <class A>
ATTNKIT_ALWAYS_INLINE void store_float(Eigen::half* p, const xsimd::batch<float, A>& v, requires_arch<avx2>) noexcept {
    store_float(p, v, avx{});
}
#endif  // XSIMD_WITH_AVX2

template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> narrow(const xsimd::batch<double, A>& lo, const xsimd::batch<double, A>& hi,
                                                    requires_arch<avx>) noexcept {
    return xsimd::batch<float, A>(
        _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(lo)), _mm256_cvtpd_ps(hi), 1));
}

// 8 x 8: transpose_quads leaves each 128-bit half a 4 x 4 block of the result; the halves are
// exchanged last.
template <class A>
ATTNKIT_ALWAYS_INLINE void transpose(xsimd::batch<float, A>* v, requires_arch<avx>) noexcept {
    __m256 r[8], u[8];
    for (int i = 0; i < 8; ++i) r[i] = v[i];
    transpose_quads<8>(
        r, u, [](__m256 a, __m256 b) { return _mm256_unpacklo_ps(a, b); },
        [](__m256 a, __m256 b) { return _mm256_unpackhi_ps(a, b); },
        [](__m256 a, __m256 b) { return _mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)); },
        [](__m256 a, __m256 b) { return _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)); });
    for (int j = 0; j < 4; ++j) {
        v[j] = xsimd::batch<float, A>(_mm256_permute2f128_ps(u[j], u[4 + j], 0x20));
        v[4 + j] = xsimd::batch<float, A>(_mm256_permute2f128_ps(u[j], u[4 + j], 0x31));
    }
}

}  // namespace kernel
}  // namespace simd
}  // namespace attnkit

#endif  // XSIMD_WITH_AVX
