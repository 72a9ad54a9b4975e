// Loads of 16-bit storage (Eigen::bfloat16, Eigen::half) as float vectors, so that kernels read
// a half-precision K/V cache in place and compute in float: no converted copy of a tensor ever
// exists, at most a packed tile in a float scratch panel.
//
//   simd::load_float<A>(p)            W elements at p (float, bfloat16 or half) as vfloat<A>
//   simd::load_float_partial<A>(p, n) n < W elements, the other lanes 0, nothing read past p + n
//   simd::to_float(x)                 one element
//   simd::convert_row<A>(src, dst, n) n elements to float (packing a tile)
//   simd::split_bf16x3 / dot_bf16x3   bfloat16 dot products with vdpbf16ps (AVX-512 BF16)
//
// bfloat16 is the upper half of a float: widening is a shift (or an unpack against zero). half
// needs its exponent rebased: F16C / AVX-512F do it in one instruction; plain SSE2 builds use an
// integer sequence that handles zeros, subnormals, infinities and NaN exactly. Every conversion
// is exact (both formats are subsets of float), so kernels see exactly the stored values.
// This header and simd.hpp are the only ones that name intrinsics.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attnkit/eigen_core.hpp"

#include "attnkit/simd/simd.hpp"

#if defined(__SSE2__) || defined(__AVX__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace attnkit {
namespace simd {

// Element types a kernel may read as float.
template <class T>
constexpr bool kIsStorageType = std::is_same<T, float>::value || std::is_same<T, Eigen::bfloat16>::value ||
                                std::is_same<T, Eigen::half>::value;

ATTNKIT_ALWAYS_INLINE float to_float(float x) noexcept { return x; }
ATTNKIT_ALWAYS_INLINE float to_float(Eigen::bfloat16 x) noexcept {
    std::uint16_t h;
    std::memcpy(&h, &x, sizeof(h));
    const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}
ATTNKIT_ALWAYS_INLINE float to_float(Eigen::half x) noexcept { return static_cast<float>(x); }

namespace detail {

#if defined(__SSE2__)
// Four half values (low 16 bits of each int32 lane) to float bits, without F16C.
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
#endif

// The generic path: element by element through a small buffer.
template <class A, class T>
ATTNKIT_ALWAYS_INLINE vfloat<A> load_float_scalar(const T* p) noexcept {
    alignas(64) float buf[kLanes<A>];
    for (index_t i = 0; i < kLanes<A>; ++i) buf[i] = to_float(p[i]);
    return loadu<A>(buf);
}

}  // namespace detail

template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> load_float(const float* p) noexcept {
    return loadu<A>(p);
}

namespace detail {

// 16-bit storage bits to float, one helper per register width, for T = bfloat16 (the upper
// half of a float: a zero-extension and a shift, or an unpack against zero) or half (F16C /
// AVX-512F vcvtph2ps, the exact integer sequence without F16C). load_float below is one body
// for both types over these.
#if defined(__SSE2__)
// Four values in the low 64 bits of x.
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
#endif
#if defined(__AVX__)
// Eight values in x.
template <class T>
ATTNKIT_ALWAYS_INLINE __m256 widen8(__m128i x) noexcept {
#if defined(__AVX2__)
    if constexpr (std::is_same<T, Eigen::bfloat16>::value)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
#endif
#if defined(__F16C__)
    if constexpr (std::is_same<T, Eigen::half>::value) return _mm256_cvtph_ps(x);
#endif
    return _mm256_insertf128_ps(_mm256_castps128_ps256(widen4<T>(x)), widen4<T>(_mm_srli_si128(x, 8)), 1);
}
#endif
#if defined(__AVX512F__)
// Sixteen values in x. The zero-masked forms with a full mask are the same instructions; the
// plain intrinsics pass an undefined merge source, which GCC 12 reports as
// -Wmaybe-uninitialized in every caller (a false positive, silenced at its source).
template <class T>
ATTNKIT_ALWAYS_INLINE __m512 widen16(__m256i x) noexcept {
    const __mmask16 all = __mmask16(0xffff);
    if constexpr (std::is_same<T, Eigen::bfloat16>::value)
        return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, x), 16));
    else
        return _mm512_maskz_cvtph_ps(all, x);
}
#endif

template <class A, class T>
ATTNKIT_ALWAYS_INLINE vfloat<A> load_float_16bit(const T* p) noexcept {
    if constexpr (std::is_same<A, scalar_arch>::value) {
        return scalar_float(to_float(*p));
    } else {
        constexpr index_t W = kLanes<A>;
        using B = vfloat<A>;
#if defined(__AVX512F__)
        if constexpr (W == 16) return B(widen16<T>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#endif
#if defined(__AVX__)
        if constexpr (W == 8) return B(widen8<T>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#endif
#if defined(__SSE2__)
        if constexpr (W == 4) return B(widen4<T>(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#endif
        return load_float_scalar<A>(p);
    }
}

}  // namespace detail

template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> load_float(const Eigen::bfloat16* p) noexcept {
    return detail::load_float_16bit<A>(p);
}
template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> load_float(const Eigen::half* p) noexcept {
    return detail::load_float_16bit<A>(p);
}

// 2W bfloat16 at p as two float vectors, even = elements 0, 2, 4, ... and odd = 1, 3, 5, ...: a
// fixed permutation that costs one shift and one mask per 2W elements (where load_float needs
// a widening shuffle and a shift per W), for kernels that keep their float operands in the same
// permuted order (a dot product or an axpy does not care about the order of its elements).
template <class A>
ATTNKIT_ALWAYS_INLINE void load_bf16_pairs(const Eigen::bfloat16* p, vfloat<A>& even, vfloat<A>& odd) noexcept {
    constexpr index_t W = kLanes<A>;
    using B = vfloat<A>;
    if constexpr (std::is_same<A, scalar_arch>::value) {
        even = scalar_float(to_float(p[0]));
        odd = scalar_float(to_float(p[1]));
        return;
    } else {
#if defined(__AVX512F__)
        if constexpr (W == 16) {
            const __m512i x = _mm512_loadu_si512(static_cast<const void*>(p));
            even = B(_mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), x, 16)));
            odd = B(_mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xffff0000u)))));
            return;
        }
#endif
#if defined(__AVX2__)
        if constexpr (W == 8) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
            even = B(_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)));
            odd = B(_mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xffff0000u)))));
            return;
        }
#endif
#if defined(__SSE2__)
        if constexpr (W == 4) {
            const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
            even = B(_mm_castsi128_ps(_mm_slli_epi32(x, 16)));
            odd = B(_mm_castsi128_ps(_mm_and_si128(x, _mm_set1_epi32(static_cast<int>(0xffff0000u)))));
            return;
        }
#endif
        alignas(64) float e[W], o[W];
        for (index_t i = 0; i < W; ++i) e[i] = to_float(p[2 * i]), o[i] = to_float(p[2 * i + 1]);
        even = loadu<A>(e);
        odd = loadu<A>(o);
    }
}

// ---- bfloat16 dot products on AVX-512 BF16 (vdpbf16ps) ----
// vdpbf16ps multiplies bfloat16 pairs and adds both products to a float lane (each product of
// two bfloat16 is exact in float), so a bfloat16 key needs no widening at all; the query, a
// float, is split into three bfloat16 parts hi + mid + lo (24 significant bits: q to within
// 2^-24 relative, except parts below bfloat16's normal range, which the instruction reads as 0)
// and each part meets the same key register. kBf16Dot<A> says whether the target has it at A's
// width; elsewhere dot_bf16x3 computes the same sum with widening loads (tests, any arch).
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define ATTNKIT_SIMD_AVX512BF16 1
#endif
template <class A>
constexpr bool kBf16Dot =
#if defined(ATTNKIT_SIMD_AVX512BF16)
    kLanes<A> == 16;
#else
    false;
#endif

// The operand layout of dot_bf16x3: q[0, n), n a multiple of 2W, as three bfloat16 parts per
// 2W elements, natural order: dst[6W c + [0, 2W)] = hi, [2W, 4W) = mid, [4W, 6W) = lo of chunk c.
template <class A>
inline void split_bf16x3(const float* q, index_t n, Eigen::bfloat16* dst) noexcept {
    constexpr index_t W2 = 2 * kLanes<A>;
    for (index_t c = 0; c < n / W2; ++c)
        for (index_t i = 0; i < W2; ++i) {
            const float x = q[c * W2 + i];
            const Eigen::bfloat16 hi(x);  // round to nearest even
            const float r1 = x - to_float(hi);  // exact: hi holds x's leading bits
            const Eigen::bfloat16 mid(r1);
            const Eigen::bfloat16 lo(r1 - to_float(mid));
            dst[c * 3 * W2 + i] = hi;
            dst[c * 3 * W2 + W2 + i] = mid;
            dst[c * 3 * W2 + 2 * W2 + i] = lo;
        }
}

// acc + <q, k> over 2W elements, lane i holding the pair (2i, 2i + 1): qx is one chunk of
// split_bf16x3, k 2W bfloat16 in natural order. Lanes pair elements in their own order, so only
// the horizontal sum of the result is the dot product.
template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> dot_bf16x3(const vfloat<A>& acc, const Eigen::bfloat16* qx,
                                           const Eigen::bfloat16* k) noexcept {
    constexpr index_t W = kLanes<A>;
#if defined(ATTNKIT_SIMD_AVX512BF16)
    if constexpr (W == 16) {
        const __m512bh kv = (__m512bh)_mm512_loadu_si512(static_cast<const void*>(k));
        __m512 a = acc;
        for (index_t part = 0; part < 3; ++part)
            a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(static_cast<const void*>(qx + part * 2 * W)), kv);
        return vfloat<A>(a);
    }
#endif
    // Portable: widen both operands; lane i gets element i and i + W (a different pairing, the
    // same sum).
    vfloat<A> a = acc;
    for (index_t part = 0; part < 3; ++part)
        for (index_t h = 0; h < 2; ++h)
            a = fma(load_float<A>(qx + part * 2 * W + h * W), load_float<A>(k + h * W), a);
    return a;
}

// n < W elements; the other lanes are 0 and nothing at or past p + n is read.
template <class A, class T>
ATTNKIT_ALWAYS_INLINE vfloat<A> load_float_partial(const T* p, index_t n) noexcept {
    alignas(64) float buf[kLanes<A>] = {};
    for (index_t i = 0; i < n; ++i) buf[i] = to_float(p[i]);
    return loadu<A>(buf);
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
