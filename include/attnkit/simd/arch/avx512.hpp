// Kernels of the SIMD layer for the AVX-512 family (tag xsimd::avx512f and what derives from it:
// avx512cd, avx512dq, avx512bw): 16 float lanes. Not a public header (include
// attnkit/simd/simd.hpp). Each kernel here exists for a reason the portable one cannot meet:
//
//   fma             xsimd 8.1 has no AVX-512 fma: its generic x * y + z is fused only where the
//                   compiler contracts it (GCC at -O2 / -O3, not at the sanitizer builds' -O1),
//                   so the instruction is named here and every build rounds once.
//   hsum_each       xsimd 8.1's avx512f haddp returns wrong lanes (three of sixteen are sums of
//                   other vectors' halves; Simd.HsumEachReducesEveryVector catches it), so the
//                   sixteen-vector transposing reduction is our own.
//   stream_store /  vmovntps and sfence: xsimd has no non-temporal store.
//   store_fence
//   load_float      sixteen bfloat16 by one zero-extension and a shift, sixteen half by one
//   (16-bit)        vcvtph2ps, instead of the generic element loop.
//   load_float      sixteen int8 by one vpmovsxbd and vcvtdq2ps.
//   (int8)
//   load_bf16_pairs even / odd elements by one shift and one mask per 32 elements.
//   store_float     sixteen half by one vcvtps2ph; sixteen bfloat16 by integer
//   (16-bit)        round-to-nearest-even and one vpmovdw (Eigen's rule, NaN to the quiet NaN
//                   of its sign: vcvtneps2bf16 would flush subnormals).
//   swap_pairs      one vpermilps.
//   transpose       16 x 16 in registers: unpacks, shuffles, two rounds of vshuff32x4.
//   narrow          two double vectors to one float vector: two vcvtpd2ps, two inserts.
//
// GCC 12 reports -Wmaybe-uninitialized in every caller of an AVX-512 intrinsic that passes an
// undefined merge source (GCC bug 105593, a false positive), so where a plain intrinsic does
// that, the zero-masked form with a full mask (the same instruction) is used instead.
// avx512f does not derive from avx in xsimd 8 (it does in later releases), so store_fence is
// repeated here rather than inherited.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attnkit/config.hpp"
#include "attnkit/simd/arch/common.hpp"

// Everything here needs the AVX-512F intrinsics; without them the other kernels serve.
#if XSIMD_WITH_AVX512F
#include <immintrin.h>

namespace attnkit {
namespace simd {
namespace kernel {

using xsimd::avx512f;

template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> fma(const xsimd::batch<float, A>& a, const xsimd::batch<float, A>& b,
                                                 const xsimd::batch<float, A>& c, requires_arch<avx512f>) noexcept {
    return _mm512_fmadd_ps(a, b, c);
}

// Sixteen 16-lane vectors to one: lane i = the sum of the lanes of v[i]. Three levels, each
// halving the data:
//   1. 128-bit blocks: pair(a, b) = [a0+a2, a1+a3, b0+b2, b1+b3] (blocks 0-1 sum to a, 2-3 to b);
//   2. pair of pairs: g = [a, b, c, d], one 4-float block per vector;
//   3. within each block, two unpack / shuffle-and-add steps, as SSE's four-vector haddp.
// Level 3 puts block b of g_j into lane 4 b + j, so g_j holds the vectors j, 4 + j, 8 + j, 12 + j.
ATTNKIT_ALWAYS_INLINE __m512 hsum_fold_pair(__m512 a, __m512 b) noexcept {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
ATTNKIT_ALWAYS_INLINE __m512 hsum_fold_quad(__m512 ab, __m512 cd) noexcept {
    return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
}
ATTNKIT_ALWAYS_INLINE __m512 hsum16(const __m512* v) noexcept {
    __m512 g[4];
    for (int j = 0; j < 4; ++j)
        g[j] = hsum_fold_quad(hsum_fold_pair(v[j], v[4 + j]), hsum_fold_pair(v[8 + j], v[12 + j]));
    const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(g[0], g[1]), _mm512_unpackhi_ps(g[0], g[1]));
    const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(g[2], g[3]), _mm512_unpackhi_ps(g[2], g[3]));
    return _mm512_add_ps(_mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
}
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> hsum_each(const xsimd::batch<float, A>* v, requires_arch<avx512f>) noexcept {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = v[i];
    return hsum16(r);
}

template <class A>
ATTNKIT_ALWAYS_INLINE void stream_store(float* p, const xsimd::batch<float, A>& v, requires_arch<avx512f>) noexcept {
    _mm512_stream_ps(p, v);
}
inline void store_fence(requires_arch<avx512f>) noexcept { _mm_sfence(); }

// Sixteen values of T (Eigen::bfloat16 or Eigen::half) in x, as floats (zero-masked forms: see
// the GCC 12 note above).
template <class T>
ATTNKIT_ALWAYS_INLINE __m512 widen16(__m256i x) noexcept {
    const __mmask16 all = __mmask16(0xffff);
    if constexpr (std::is_same<T, Eigen::bfloat16>::value)
        return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, x), 16));
    else
        return _mm512_maskz_cvtph_ps(all, x);
}

template <class A, class T>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> load_float(const T* p, requires_arch<avx512f>) noexcept {
    return xsimd::batch<float, A>(widen16<T>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}

// Sixteen int8 (more specialised than the template above, so int8 takes this one).
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> load_float(const std::int8_t* p, requires_arch<avx512f>) noexcept {
    const __mmask16 all = __mmask16(0xffff);
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return xsimd::batch<float, A>(_mm512_maskz_cvtepi32_ps(all, _mm512_maskz_cvtepi8_epi32(all, x)));
}

template <class A, class T>
ATTNKIT_ALWAYS_INLINE void load_bf16_pairs(const T* p, xsimd::batch<float, A>& even, xsimd::batch<float, A>& odd,
                                           requires_arch<avx512f>) noexcept {
    using B = xsimd::batch<float, A>;
    const __m512i x = _mm512_loadu_si512(static_cast<const void*>(p));
    even = B(_mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), x, 16)));
    odd = B(_mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))));
}


template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> swap_pairs(const xsimd::batch<float, A>& v, requires_arch<avx512f>) noexcept {
    return xsimd::batch<float, A>(_mm512_permute_ps(v, 0xB1));
}

template <class A>
ATTNKIT_ALWAYS_INLINE void store_float(Eigen::half* p, const xsimd::batch<float, A>& v, requires_arch<avx512f>) noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_maskz_cvtps_ph(__mmask16(0xffff), v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
template <class A>
ATTNKIT_ALWAYS_INLINE void store_float(Eigen::bfloat16* p, const xsimd::batch<float, A>& v,
                                       requires_arch<avx512f>) noexcept {
    const __mmask16 all = __mmask16(0xffff);
    const __m512i u = _mm512_castps_si512(v);
    const __m512i hi = _mm512_maskz_srli_epi32(all, u, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i r = _mm512_maskz_srli_epi32(
        all, _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan =
        _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i quiet = _mm512_or_si512(_mm512_and_si512(hi, _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7fc0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_maskz_cvtepi32_epi16(all, _mm512_mask_blend_epi32(nan, r, quiet)));
}

template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> narrow(const xsimd::batch<double, A>& lo, const xsimd::batch<double, A>& hi,
                                                    requires_arch<avx512f>) noexcept {
    const __m512d both = _mm512_insertf64x4(_mm512_insertf64x4(_mm512_setzero_pd(), _mm256_castps_pd(_mm512_cvtpd_ps(lo)), 0),
                                            _mm256_castps_pd(_mm512_cvtpd_ps(hi)), 1);
    return xsimd::batch<float, A>(_mm512_castpd_ps(both));
}

// 16 x 16: transpose_quads leaves each 128-bit chunk a 4 x 4 block of the result; two rounds of
// vshuff32x4 gather the chunks.
template <class A>
ATTNKIT_ALWAYS_INLINE void transpose(xsimd::batch<float, A>* v, requires_arch<avx512f>) noexcept {
    __m512 r[16], u[16];
    for (int i = 0; i < 16; ++i) r[i] = v[i];
    transpose_quads<16>(
        r, u, [](__m512 a, __m512 b) { return _mm512_unpacklo_ps(a, b); },
        [](__m512 a, __m512 b) { return _mm512_unpackhi_ps(a, b); },
        [](__m512 a, __m512 b) { return _mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)); },
        [](__m512 a, __m512 b) { return _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)); });
    // u[4k + j], chunk c: column 4c + j of rows 4k .. 4k + 3.
    for (int j = 0; j < 4; ++j) {
        const __m512 w0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);       // k 0, 1 at chunks 0, 2
        const __m512 w1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);       // k 0, 1 at chunks 1, 3
        const __m512 w2 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);  // k 2, 3 at chunks 0, 2
        const __m512 w3 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);  // k 2, 3 at chunks 1, 3
        v[j] = xsimd::batch<float, A>(_mm512_shuffle_f32x4(w0, w2, 0x88));
        v[4 + j] = xsimd::batch<float, A>(_mm512_shuffle_f32x4(w1, w3, 0x88));
        v[8 + j] = xsimd::batch<float, A>(_mm512_shuffle_f32x4(w0, w2, 0xDD));
        v[12 + j] = xsimd::batch<float, A>(_mm512_shuffle_f32x4(w1, w3, 0xDD));
    }
}

}  // namespace kernel
}  // namespace simd
}  // namespace attnkit

#endif  // XSIMD_WITH_AVX512F
