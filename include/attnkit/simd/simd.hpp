// The SIMD layer: float vectors on an architecture tag, with the handful of operations the
// kernels need. Kernels are templates on the tag `A`; public functions instantiate them on
// simd::default_arch. Everything here is either an xsimd batch or, for simd::scalar_arch, a
// one-lane struct with the same operations, so every kernel also has a portable path.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attnkit/config.hpp"
#include "attnkit/simd/xsimd_compat.hpp"

namespace attnkit {
namespace simd {

struct scalar_arch {
    static constexpr const char* name() noexcept { return "scalar"; }
};

#if defined(ATTNKIT_SIMD_SCALAR) || defined(XSIMD_NO_SUPPORTED_ARCHITECTURE)
using default_arch = scalar_arch;
#else
using default_arch = xsimd::default_arch;
#endif

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

template <class A>
struct vec_of {
    using type = xsimd::batch<float, A>;
};
template <>
struct vec_of<scalar_arch> {
    using type = scalar_float;
};
template <class A>
using vfloat = typename vec_of<A>::type;

template <class A>
constexpr index_t kLanes = static_cast<index_t>(vfloat<A>::size);

// ---- loads and stores: unaligned always; attnkit never assumes alignment it does not own ----

template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> loadu(const float* p) noexcept {
    if constexpr (std::is_same<A, scalar_arch>::value)
        return scalar_float(*p);
    else
        return xsimd::batch<float, A>::load_unaligned(p);
}
template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> set1(float x) noexcept {
    return vfloat<A>(x);
}
ATTNKIT_ALWAYS_INLINE void storeu(float* p, scalar_float v) noexcept { *p = v.v; }
template <class A>
ATTNKIT_ALWAYS_INLINE void storeu(float* p, const xsimd::batch<float, A>& v) noexcept {
    v.store_unaligned(p);
}

// Loads n < lanes floats (the rest zero) without reading past p + n.
template <class A>
inline vfloat<A> load_partial(const float* p, index_t n) noexcept {
    alignas(64) float buf[kLanes<A>] = {};
    std::memcpy(buf, p, static_cast<std::size_t>(n) * sizeof(float));
    return loadu<A>(buf);
}
// Stores the first n lanes without writing past p + n.
template <class V>
inline void store_partial(float* p, const V& v, index_t n) noexcept {
    alignas(64) float buf[V::size];
    storeu(buf, v);
    std::memcpy(p, buf, static_cast<std::size_t>(n) * sizeof(float));
}

// ---- arithmetic ----

ATTNKIT_ALWAYS_INLINE scalar_float fma(scalar_float a, scalar_float b, scalar_float c) noexcept {
    return std::fma(a.v, b.v, c.v);
}
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> fma(const xsimd::batch<float, A>& a, const xsimd::batch<float, A>& b,
                                                 const xsimd::batch<float, A>& c) noexcept {
#if defined(__AVX512F__)
    // xsimd 8.1 has no AVX-512 fma: its generic x * y + z is fused only where the compiler
    // contracts it (GCC at -O2/-O3, not at the sanitizer builds' -O1), so the instruction is
    // named here and every build rounds once.
    if constexpr (xsimd::batch<float, A>::size == 16) return _mm512_fmadd_ps(a, b, c);
#endif
    return xsimd::fma(a, b, c);
}

// max/min return b when either operand is NaN (the x86 rule, kept for the scalar path) so that
// callers choose, by operand order, whether NaN propagates.
ATTNKIT_ALWAYS_INLINE scalar_float max(scalar_float a, scalar_float b) noexcept { return a.v > b.v ? a.v : b.v; }
ATTNKIT_ALWAYS_INLINE scalar_float min(scalar_float a, scalar_float b) noexcept { return a.v < b.v ? a.v : b.v; }
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> max(const xsimd::batch<float, A>& a, const xsimd::batch<float, A>& b) noexcept {
    return xsimd::select(a > b, a, b);
}
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> min(const xsimd::batch<float, A>& a, const xsimd::batch<float, A>& b) noexcept {
    return xsimd::select(a < b, a, b);
}

ATTNKIT_ALWAYS_INLINE scalar_float select(bool c, scalar_float a, scalar_float b) noexcept { return c ? a : b; }
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> select(const xsimd::batch_bool<float, A>& c, const xsimd::batch<float, A>& a,
                                                    const xsimd::batch<float, A>& b) noexcept {
    return xsimd::select(c, a, b);
}

inline float hsum(scalar_float v) noexcept { return v.v; }
template <class A>
inline float hsum(const xsimd::batch<float, A>& v) noexcept {
    return compat::reduce_add(v);
}

// NaN lanes are skipped unless all lanes are NaN; -inf if all lanes are -inf.
inline float hmax(scalar_float v) noexcept { return v.v; }
template <class A>
inline float hmax(const xsimd::batch<float, A>& v) noexcept {
    alignas(64) float buf[xsimd::batch<float, A>::size];
    v.store_aligned(buf);
    float m = buf[0];
    // A NaN held in m (lane 0, or every lane so far) gives way to the next lane.
    for (std::size_t i = 1; i < xsimd::batch<float, A>::size; ++i) m = (buf[i] > m || m != m) ? buf[i] : m;
    return m;
}

// 2^x with relative error below 2.5e-7 for finite results. x < -126 gives exactly 0 (so -inf,
// a masked score, gives 0 without a branch), x > 127 gives +inf, NaN gives NaN. Results below
// the normal range flush to 0, which the softmax never notices next to its max term (= 1).
inline scalar_float exp2(scalar_float x) noexcept {
    if (x.v > 127.0f) return std::numeric_limits<float>::infinity();  // 2^(127, 128) is finite
    const float y = std::exp2(x.v);
    return y < std::numeric_limits<float>::min() ? 0.0f : y;
}
namespace detail {
// 2^n * 2^r for |r| <= 0.5 (plus rounding), where t = n + 1.5 * 2^23 holds the integer n in its
// low bits and -127 <= n <= 127.
template <class A>
inline xsimd::batch<float, A> exp2_scaled(const xsimd::batch<float, A>& t, const xsimd::batch<float, A>& r) noexcept {
    using B = xsimd::batch<float, A>;
    const B kMagic(12582912.0f);
    // Minimax fit of 2^r on [-0.5, 0.5], degree 6.
    B p = simd::fma(B(1.5345811e-4f), r, B(1.3399931e-3f));
    p = simd::fma(p, r, B(9.6184891e-3f));
    p = simd::fma(p, r, B(5.5503286e-2f));
    p = simd::fma(p, r, B(2.4022646e-1f));
    p = simd::fma(p, r, B(6.9314718e-1f));
    p = simd::fma(p, r, B(1.0f));
    const auto ni = compat::as_int(t) - compat::as_int(kMagic);
    return compat::as_float(compat::as_int(p) + (ni << 23));
}
}  // namespace detail
template <class A>
inline xsimd::batch<float, A> exp2(const xsimd::batch<float, A>& x) noexcept {
    using B = xsimd::batch<float, A>;
    // Clamp keeps n within the exponent range; operand order keeps NaN (simd::min/max return
    // their second operand when one is NaN).
    const B xc = simd::min(B(127.0f), simd::max(B(-127.0f), x));
    // Round to nearest via the 1.5 * 2^23 trick: needs no SSE4.1 and leaves n in the low bits.
    const B kMagic(12582912.0f);
    const B t = xc + kMagic;
    const B n = t - kMagic;
    const B r = xc - n;  // in [-0.5, 0.5]
    B res = detail::exp2_scaled(t, r);
    res = xsimd::select(x < B(-126.0f), B(0.0f), res);
    res = xsimd::select(x > B(127.0f), B(std::numeric_limits<float>::infinity()), res);
    // A NaN with payload bits would otherwise leak them into the exponent of the result. (Not
    // x != x: xsimd 8 compares AVX/AVX-512 lanes with the ordered NEQ, false for NaN.)
    return xsimd::select(xsimd::isnan(x), x, res);
}

// 2^x for x <= 0: the shifted scores of a softmax, the hot path of every attention kernel.
// Same accuracy and 0 / NaN rules as exp2 but without the overflow handling that x <= 0 never
// needs: a third fewer operations per vector. (x > 0 returns a wrong finite value.)
inline scalar_float exp2_nonpositive(scalar_float x) noexcept { return exp2(x); }
template <class A>
inline xsimd::batch<float, A> exp2_nonpositive(const xsimd::batch<float, A>& x) noexcept {
    using B = xsimd::batch<float, A>;
    const B xc = simd::max(B(-127.0f), x);  // NaN stays NaN (second operand)
    const B kMagic(12582912.0f);
    const B t = xc + kMagic;
    const B r = xc - (t - kMagic);
    const B res = xsimd::select(x < B(-126.0f), B(0.0f), detail::exp2_scaled(t, r));
    return xsimd::select(xsimd::isnan(x), x, res);
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// e^x with the range rules of exp2(x * log2(e)) (0 below -126, +inf above 127, NaN for NaN) but
// the accuracy of exp2: x * log2(e) itself is rounded by up to 2^-17 near |x| = 88, so x is
// reduced against n * ln2 in two parts (Cody-Waite) and only the small remainder is rescaled.
inline scalar_float exp(scalar_float x) noexcept {
    const float t = x.v * kLog2e;
    if (t > 127.0f) return std::numeric_limits<float>::infinity();
    if (t < -126.0f) return 0.0f;
    return std::exp(x.v);
}
template <class A>
inline xsimd::batch<float, A> exp(const xsimd::batch<float, A>& x) noexcept {
    using B = xsimd::batch<float, A>;
    const B xl = x * B(kLog2e);
    const B xc = simd::min(B(127.0f), simd::max(B(-127.0f), xl));
    const B kMagic(12582912.0f);
    const B t = xc + kMagic;
    const B n = t - kMagic;
    // ln2 = kLn2Hi + kLn2Lo; kLn2Hi has 9 significant bits, so n * kLn2Hi and x - n * kLn2Hi are
    // exact for |n| <= 127.
    constexpr float kLn2Hi = 0.693359375f;
    constexpr float kLn2Lo = -2.12194440e-4f;
    const B r = (x - n * B(kLn2Hi)) - n * B(kLn2Lo);  // |r| <= ln2 / 2 (plus rounding)
    B res = detail::exp2_scaled(t, r * B(kLog2e));
    res = xsimd::select(xl < B(-126.0f), B(0.0f), res);
    res = xsimd::select(xl > B(127.0f), B(std::numeric_limits<float>::infinity()), res);
    return xsimd::select(xsimd::isnan(x), x, res);
}

inline scalar_float tanh(scalar_float x) noexcept { return std::tanh(x.v); }
template <class A>
inline xsimd::batch<float, A> tanh(const xsimd::batch<float, A>& x) noexcept {
    return xsimd::tanh(x);
}

// ---- appended for self-gating attention (memory-bound streaming kernels) ----

// <a, b> over n floats: four independent accumulators (a dot of D = 128 on AVX2 is 16 vector
// FMAs; one accumulator would serialise them on the FMA latency), tail by a partial load. The
// summation order depends only on n and the arch, so results are reproducible.
template <class A>
inline float dot(const float* a, const float* b, index_t n) noexcept {
    using V = vfloat<A>;
    constexpr index_t W = kLanes<A>;
    V s0(0.0f), s1(0.0f), s2(0.0f), s3(0.0f);
    index_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        s0 = fma(loadu<A>(a + i), loadu<A>(b + i), s0);
        s1 = fma(loadu<A>(a + i + W), loadu<A>(b + i + W), s1);
        s2 = fma(loadu<A>(a + i + 2 * W), loadu<A>(b + i + 2 * W), s2);
        s3 = fma(loadu<A>(a + i + 3 * W), loadu<A>(b + i + 3 * W), s3);
    }
    for (; i + W <= n; i += W) s0 = fma(loadu<A>(a + i), loadu<A>(b + i), s0);
    if (i < n) s1 = fma(load_partial<A>(a + i, n - i), load_partial<A>(b + i, n - i), s1);
    return hsum((s0 + s1) + (s2 + s3));
}

// True when a full vector store at p may bypass the cache (stream_store below): p is aligned to
// the vector size. Checked at run time on the caller's pointer, never assumed.
template <class A>
inline bool stream_aligned(const float* p) noexcept {
    return reinterpret_cast<std::uintptr_t>(p) % (sizeof(float) * static_cast<std::size_t>(kLanes<A>)) == 0;
}

// Non-temporal store of a full vector at p, which must satisfy stream_aligned<A>(p): output that
// is written once and not read again soon goes to memory without first reading the line
// (no read-for-ownership), which saves a third of the traffic of a pure write stream. Falls back
// to a plain store where the ISA has none. Call store_fence() before other threads read.
ATTNKIT_ALWAYS_INLINE void stream_store(float* p, scalar_float v) noexcept { *p = v.v; }
template <class A>
ATTNKIT_ALWAYS_INLINE void stream_store(float* p, const xsimd::batch<float, A>& v) noexcept {
    constexpr std::size_t bytes = sizeof(float) * xsimd::batch<float, A>::size;
#if defined(__AVX512F__)
    if constexpr (bytes == 64) { _mm512_stream_ps(p, v); return; }
#endif
#if defined(__AVX__)
    if constexpr (bytes == 32) { _mm256_stream_ps(p, v); return; }
#endif
#if defined(__SSE__)
    if constexpr (bytes == 16) { _mm_stream_ps(p, v); return; }
#endif
    v.store_aligned(p);
}

// Orders earlier non-temporal stores before later stores (x86 sfence; nothing elsewhere).
inline void store_fence() noexcept {
#if defined(__SSE__)
    _mm_sfence();
#endif
}

}  // namespace simd
}  // namespace attnkit

// ---- reductions of several vectors (appended) ----

namespace attnkit {
namespace simd {

// Lane i of the result = the sum of the lanes of v[i], for kLanes<A> vectors v[0 .. W): W
// horizontal sums as one transposing reduction (W - 1 adds and shuffles in place of W times
// log2(W)), so that a kernel computing many dot products never reduces them one by one.
inline scalar_float hsum_each(const scalar_float* v) noexcept { return v[0]; }

#if defined(__AVX512F__)
namespace detail_hsum {
// Sixteen 16-lane vectors. xsimd 8.1's avx512f haddp returns wrong lanes (three of sixteen are
// sums of other vectors' halves; the Simd.HsumEachReducesEveryVector test catches it), so the
// AVX-512 form is our own. Three levels, each halving the data:
//   1. 128-bit blocks: pair(a, b) = [a0+a2, a1+a3, b0+b2, b1+b3] (blocks 0-1 sum to a, 2-3 to b);
//   2. pair of pairs: g = [a, b, c, d], one 4-float block per vector;
//   3. within each block, two unpack / shuffle-and-add steps, as SSE's four-vector haddp.
// Level 3 puts block b of g_j into lane 4 b + j, so g_j holds the vectors j, 4 + j, 8 + j, 12 + j.
ATTNKIT_ALWAYS_INLINE __m512 fold_pair(__m512 a, __m512 b) noexcept {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
ATTNKIT_ALWAYS_INLINE __m512 fold_quad(__m512 ab, __m512 cd) noexcept {
    return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
}
ATTNKIT_ALWAYS_INLINE __m512 hsum16(const __m512* v) noexcept {
    __m512 g[4];
    for (int j = 0; j < 4; ++j) g[j] = fold_quad(fold_pair(v[j], v[4 + j]), fold_pair(v[8 + j], v[12 + j]));
    const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(g[0], g[1]), _mm512_unpackhi_ps(g[0], g[1]));
    const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(g[2], g[3]), _mm512_unpackhi_ps(g[2], g[3]));
    return _mm512_add_ps(_mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
}
}  // namespace detail_hsum
#endif

template <class A>
inline xsimd::batch<float, A> hsum_each(const xsimd::batch<float, A>* v) noexcept {
#if defined(__AVX512F__)
    if constexpr (xsimd::batch<float, A>::size == 16) {
        __m512 r[16];
        for (int i = 0; i < 16; ++i) r[i] = v[i];
        return detail_hsum::hsum16(r);
    }
#endif
    return xsimd::haddp(v);
}

}  // namespace simd
}  // namespace attnkit
