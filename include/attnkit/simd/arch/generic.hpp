// Kernels of the SIMD layer for any xsimd architecture (tag xsimd::generic, the root of xsimd's
// tag hierarchy): written on xsimd's portable API only, they are what an architecture uses
// where its own file (sse.hpp, avx.hpp, avx512.hpp) has no overload, and all that NEON and
// future targets use. Not a public header (include attnkit/simd/simd.hpp).
//
// Why some of these are not simply the xsimd call of the same name:
//   - max / min are a compare and a select, never xsimd::max / min, so that every target
//     returns the second operand when either is NaN (the x86 rule) and callers choose by operand
//     order whether NaN propagates;
//   - hsum goes through compat::reduce_add (xsimd 8 calls it hadd, later releases reduce_add);
//   - hmax walks the lanes in memory: the rule "NaN lanes are skipped unless all are NaN" is
//     not what any reduction instruction does;
//   - exp2 / exp are attnkit's own polynomial (accuracy, range and NaN rules documented in
//     simd.hpp, identical on every target), and test NaN with xsimd::isnan, not x != x: xsimd 8
//     compares AVX / AVX-512 lanes with the ordered NEQ, false for NaN.
// The per-ISA files are included before this one, so that a qualified kernel:: call made here
// (the exp polynomial's fma, for one) sees their overloads.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>

#include "attnkit/config.hpp"
#include "attnkit/simd/arch/common.hpp"

namespace attnkit {
namespace simd {
namespace kernel {

using xsimd::generic;

// ---- loads and stores ----

template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> loadu(const float* p, requires_arch<generic>) noexcept {
    return xsimd::batch<float, A>::load_unaligned(p);
}
template <class A>
ATTNKIT_ALWAYS_INLINE void storeu(float* p, const xsimd::batch<float, A>& v, requires_arch<generic>) noexcept {
    v.store_unaligned(p);
}

// ---- arithmetic ----

template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> fma(const xsimd::batch<float, A>& a, const xsimd::batch<float, A>& b,
                                                 const xsimd::batch<float, A>& c, requires_arch<generic>) noexcept {
    return xsimd::fma(a, b, c);
}
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> max(const xsimd::batch<float, A>& a, const xsimd::batch<float, A>& b,
                                                 requires_arch<generic>) noexcept {
    return xsimd::select(a > b, a, b);
}
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> min(const xsimd::batch<float, A>& a, const xsimd::batch<float, A>& b,
                                                 requires_arch<generic>) noexcept {
    return xsimd::select(a < b, a, b);
}
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> select(const xsimd::batch_bool<float, A>& c, const xsimd::batch<float, A>& a,
                                                    const xsimd::batch<float, A>& b, requires_arch<generic>) noexcept {
    return xsimd::select(c, a, b);
}

// ---- reductions ----

template <class A>
inline float hsum(const xsimd::batch<float, A>& v, requires_arch<generic>) noexcept {
    return compat::reduce_add(v);
}
template <class A>
inline float hmax(const xsimd::batch<float, A>& v, requires_arch<generic>) noexcept {
    alignas(64) float buf[xsimd::batch<float, A>::size];
    v.store_aligned(buf);
    float m = buf[0];
    // A NaN held in m (lane 0, or every lane so far) gives way to the next lane. Unrolled: at
    // -O2 the loop stayed a scalar loop, once per row and block of the online softmax.
    ATTNKIT_UNROLL for (std::size_t i = 1; i < xsimd::batch<float, A>::size; ++i) m = (buf[i] > m || m != m) ? buf[i] : m;
    return m;
}
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> hsum_each(const xsimd::batch<float, A>* v, requires_arch<generic>) noexcept {
    return xsimd::haddp(v);
}

// ---- exponentials ----

// 2^n * 2^r for |r| <= 0.5 (plus rounding), where t = n + 1.5 * 2^23 holds the integer n in its
// low bits and -127 <= n <= 127.
template <class A>
inline xsimd::batch<float, A> exp2_scaled(const xsimd::batch<float, A>& t, const xsimd::batch<float, A>& r) noexcept {
    using B = xsimd::batch<float, A>;
    const B kMagic(12582912.0f);
    // Minimax fit of 2^r on [-0.5, 0.5], degree 6.
    B p = kernel::fma(B(1.5345811e-4f), r, B(1.3399931e-3f), A{});
    p = kernel::fma(p, r, B(9.6184891e-3f), A{});
    p = kernel::fma(p, r, B(5.5503286e-2f), A{});
    p = kernel::fma(p, r, B(2.4022646e-1f), A{});
    p = kernel::fma(p, r, B(6.9314718e-1f), A{});
    p = kernel::fma(p, r, B(1.0f), A{});
    const auto ni = compat::as_int(t) - compat::as_int(kMagic);
    return compat::as_float(compat::as_int(p) + (ni << 23));
}

template <class A>
inline xsimd::batch<float, A> exp2(const xsimd::batch<float, A>& x, requires_arch<generic>) noexcept {
    using B = xsimd::batch<float, A>;
    // Clamp keeps n within the exponent range; operand order keeps NaN (min/max return their
    // second operand when one is NaN).
    const B xc = kernel::min(B(127.0f), kernel::max(B(-127.0f), x, A{}), A{});
    // Round to nearest via the 1.5 * 2^23 trick: needs no SSE4.1 and leaves n in the low bits.
    const B kMagic(12582912.0f);
    const B t = xc + kMagic;
    const B n = t - kMagic;
    const B r = xc - n;  // in [-0.5, 0.5]
    B res = exp2_scaled<A>(t, r);
    res = xsimd::select(x < B(-126.0f), B(0.0f), res);
    res = xsimd::select(x > B(127.0f), B(std::numeric_limits<float>::infinity()), res);
    // A NaN with payload bits would otherwise leak them into the exponent of the result.
    return xsimd::select(xsimd::isnan(x), x, res);
}

template <class A>
inline xsimd::batch<float, A> exp2_nonpositive(const xsimd::batch<float, A>& x, requires_arch<generic>) noexcept {
    using B = xsimd::batch<float, A>;
    const B xc = kernel::max(B(-127.0f), x, A{});  // NaN stays NaN (second operand)
    const B kMagic(12582912.0f);
    const B t = xc + kMagic;
    const B r = xc - (t - kMagic);
    const B res = xsimd::select(x < B(-126.0f), B(0.0f), exp2_scaled<A>(t, r));
    return xsimd::select(xsimd::isnan(x), x, res);
}

template <class A>
inline xsimd::batch<float, A> exp(const xsimd::batch<float, A>& x, requires_arch<generic>) noexcept {
    using B = xsimd::batch<float, A>;
    const B xl = x * B(kLog2e);
    const B xc = kernel::min(B(127.0f), kernel::max(B(-127.0f), xl, A{}), A{});
    const B kMagic(12582912.0f);
    const B t = xc + kMagic;
    const B n = t - kMagic;
    // ln2 = kLn2Hi + kLn2Lo; kLn2Hi has 9 significant bits, so n * kLn2Hi and x - n * kLn2Hi are
    // exact for |n| <= 127.
    constexpr float kLn2Hi = 0.693359375f;
    constexpr float kLn2Lo = -2.12194440e-4f;
    const B r = (x - n * B(kLn2Hi)) - n * B(kLn2Lo);  // |r| <= ln2 / 2 (plus rounding)
    B res = exp2_scaled<A>(t, r * B(kLog2e));
    res = xsimd::select(xl < B(-126.0f), B(0.0f), res);
    res = xsimd::select(xl > B(127.0f), B(std::numeric_limits<float>::infinity()), res);
    return xsimd::select(xsimd::isnan(x), x, res);
}

template <class A>
inline xsimd::batch<float, A> tanh(const xsimd::batch<float, A>& x, requires_arch<generic>) noexcept {
    return xsimd::tanh(x);
}

// ---- sine and cosine of double angles ----

// x = n pi/2 + r, |r| <= pi/4, in double by Cody-Waite in three parts of pi/2 (fdlibm's
// pio2_1, pio2_2, pio2_2t: 33, 33 and 53 bits, so n * part is exact for |n| < 2^20, i.e.
// |x| < 1.6e6, with or without FMA): the phase keeps double's precision at any such angle. r
// then goes to float, where cephes' sinf / cosf polynomials on [-pi/4, pi/4] (about 1 ulp) run
// on twice the lanes, and the quadrant n mod 4 picks and signs the result. A block with an
// angle beyond 1.6e6 or not finite takes std::sin / std::cos in double for each of its angles.
constexpr double kSincosMax = 1.6e6;

// Two double vectors as one float vector of twice the lanes (lo's then hi's), through memory.
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> narrow(const xsimd::batch<double, A>& lo, const xsimd::batch<double, A>& hi,
                                                    requires_arch<generic>) noexcept {
    constexpr std::size_t WD = xsimd::batch<double, A>::size;
    alignas(64) double d[2 * WD];
    alignas(64) float f[2 * WD];
    lo.store_aligned(d);
    hi.store_aligned(d + WD);
    for (std::size_t i = 0; i < 2 * WD; ++i) f[i] = static_cast<float>(d[i]);
    return xsimd::batch<float, A>::load_aligned(f);
}

// sin and cos of the 2 WD angles at a (one float vector's worth).
template <class A>
ATTNKIT_ALWAYS_INLINE void sincos_block(const double* a, float* s, float* c) noexcept {
    using D = xsimd::batch<double, A>;
    using F = xsimd::batch<float, A>;
    constexpr index_t WD = static_cast<index_t>(D::size), WF = static_cast<index_t>(F::size);
    static_assert(WF == 2 * WD, "sincos: a float vector holds two double vectors");
    const D v0 = D::load_unaligned(a), v1 = D::load_unaligned(a + WD);
    // !(|v| <= max) also catches NaN.
    if (xsimd::any(!(xsimd::abs(v0) <= D(kSincosMax)) || !(xsimd::abs(v1) <= D(kSincosMax)))) {
        for (index_t k = 0; k < WF; ++k) s[k] = static_cast<float>(std::sin(a[k])), c[k] = static_cast<float>(std::cos(a[k]));
        return;
    }
    const auto reduce = [](const D& v, D& r, D& q) {
        const D n = xsimd::nearbyint(v * D(0.63661977236758134308));  // 2 / pi
        r = xsimd::fnma(n, D(1.57079632673412561417e+00), v);
        r = xsimd::fnma(n, D(6.07710050630396597660e-11), r);
        r = xsimd::fnma(n, D(2.02226624879595063154e-21), r);
        q = xsimd::fnma(D(4.0), xsimd::floor(n * D(0.25)), n);  // n mod 4, exact
    };
    D r0, q0, r1, q1;
    reduce(v0, r0, q0);
    reduce(v1, r1, q1);
    const F r = kernel::narrow<A>(r0, r1, A{}), q = kernel::narrow<A>(q0, q1, A{});
    const F z = r * r;
    const F sr = xsimd::fma(r * z,
                            xsimd::fma(z, xsimd::fma(z, F(-1.9515295891e-4f), F(8.3321608736e-3f)), F(-1.6666654611e-1f)),
                            r);
    const F cr = xsimd::fma(z * z,
                            xsimd::fma(z, xsimd::fma(z, F(2.443315711809948e-5f), F(-1.388731625493765e-3f)),
                                       F(4.166664568298827e-2f)),
                            xsimd::fma(F(-0.5f), z, F(1.0f)));
    // q in {0, 1, 2, 3}: (sin, cos) = (s, c), (c, -s), (-s, -c), (-c, s).
    const auto odd = (q == F(1.0f)) || (q == F(3.0f));
    const F so = xsimd::select(odd, cr, sr), co = xsimd::select(odd, sr, cr);
    xsimd::select(q >= F(2.0f), -so, so).store_unaligned(s);
    xsimd::select((q == F(1.0f)) || (q == F(2.0f)), -co, co).store_unaligned(c);
}

template <class A>
inline void sincos(const double* x, float* s, float* c, index_t n, requires_arch<generic>) noexcept {
    constexpr index_t WF = static_cast<index_t>(xsimd::batch<float, A>::size);
    index_t i = 0;
    for (; i + WF <= n; i += WF) sincos_block<A>(x + i, s + i, c + i);
    if (i < n) {
        alignas(64) double a[WF] = {};
        alignas(64) float bs[WF], bc[WF];
        for (index_t k = 0; k < n - i; ++k) a[k] = x[i + k];
        sincos_block<A>(a, bs, bc);
        for (index_t k = 0; k < n - i; ++k) s[i + k] = bs[k], c[i + k] = bc[k];
    }
}

// ---- streaming stores ----

// No non-temporal store in xsimd's portable API: an aligned store (the caller checked the
// alignment), and nothing for store_fence to order.
template <class A>
ATTNKIT_ALWAYS_INLINE void stream_store(float* p, const xsimd::batch<float, A>& v, requires_arch<generic>) noexcept {
    v.store_aligned(p);
}
inline void store_fence(requires_arch<generic>) noexcept {}

// ---- 16-bit storage ----

// Element by element through a small buffer (T is Eigen::bfloat16, Eigen::half or std::int8_t).
template <class A, class T>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> load_float(const T* p, requires_arch<generic>) noexcept {
    constexpr std::size_t W = xsimd::batch<float, A>::size;
    alignas(64) float buf[W];
    for (std::size_t i = 0; i < W; ++i) buf[i] = to_float(p[i]);
    return kernel::loadu<A>(buf, A{});
}
template <class A, class T>
ATTNKIT_ALWAYS_INLINE void load_bf16_pairs(const T* p, xsimd::batch<float, A>& even, xsimd::batch<float, A>& odd,
                                           requires_arch<generic>) noexcept {
    constexpr std::size_t W = xsimd::batch<float, A>::size;
    alignas(64) float e[W], o[W];
    for (std::size_t i = 0; i < W; ++i) e[i] = to_float(p[2 * i]), o[i] = to_float(p[2 * i + 1]);
    even = kernel::loadu<A>(e, A{});
    odd = kernel::loadu<A>(o, A{});
}

// Rounded to T (Eigen::bfloat16 or Eigen::half) element by element through a small buffer, by
// Eigen's own conversion (round to nearest even), the rule the vector kernels reproduce.
template <class A, class T>
ATTNKIT_ALWAYS_INLINE void store_float(T* p, const xsimd::batch<float, A>& v, requires_arch<generic>) noexcept {
    constexpr std::size_t W = xsimd::batch<float, A>::size;
    alignas(64) float buf[W];
    v.store_aligned(buf);
    for (std::size_t i = 0; i < W; ++i) p[i] = T(buf[i]);
}

// ---- lane permutations ----

// Lanes 2i and 2i + 1 exchanged, through memory (the x86 files do it in one instruction).
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> swap_pairs(const xsimd::batch<float, A>& v, requires_arch<generic>) noexcept {
    constexpr std::size_t W = xsimd::batch<float, A>::size;
    static_assert(W % 2 == 0, "swap_pairs needs an even lane count");
    alignas(64) float a[W], b[W];
    v.store_aligned(a);
    for (std::size_t i = 0; i < W; ++i) b[i] = a[i ^ 1u];
    return xsimd::batch<float, A>::load_aligned(b);
}


// Through memory, for the architectures without a register transpose below.
template <class A>
ATTNKIT_ALWAYS_INLINE void transpose(xsimd::batch<float, A>* v, requires_arch<generic>) noexcept {
    constexpr std::size_t W = xsimd::batch<float, A>::size;
    alignas(64) float m[W * W];
    for (std::size_t i = 0; i < W; ++i) v[i].store_aligned(m + i * W);
    for (std::size_t i = 0; i < W; ++i) {
        alignas(64) float c[W];
        for (std::size_t j = 0; j < W; ++j) c[j] = m[j * W + i];
        v[i] = xsimd::batch<float, A>::load_aligned(c);
    }
}

}  // namespace kernel
}  // namespace simd
}  // namespace attnkit
