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
    // A NaN held in m (lane 0, or every lane so far) gives way to the next lane.
    for (std::size_t i = 1; i < xsimd::batch<float, A>::size; ++i) m = (buf[i] > m || m != m) ? buf[i] : m;
    return m;
}
template <class A>
inline xsimd::batch<float, A> hsum_each(const xsimd::batch<float, A>* v, requires_arch<generic>) noexcept {
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

// ---- double-precision sine and cosine ----

// x = n pi/2 + r, |r| <= pi/4, by Cody-Waite in three parts of pi/2 (fdlibm's pio2_1, pio2_2,
// pio2_2t: 33, 33 and 53 bits, so n * part is exact for |n| < 2^20, i.e. |x| < 1.6e6, with or
// without FMA), then fdlibm's degree-13 / degree-14 kernels for sin r and cos r in double (below
// an ulp of double on |r| <= pi/4) and the quadrant n mod 4. xsimd's own sincos gives the same
// accuracy at about twice the cost at these arguments (its reduction for |x| > 20 pi carries the
// tail terms that only much larger arguments need). A vector with a lane beyond 1.6e6 or not
// finite takes std::sin / std::cos for every lane.
constexpr double kSincosMax = 1.6e6;

template <class A>
ATTNKIT_ALWAYS_INLINE void sincos_vector(const xsimd::batch<double, A>& x, xsimd::batch<double, A>& s,
                                         xsimd::batch<double, A>& c) noexcept {
    using D = xsimd::batch<double, A>;
    const D n = xsimd::nearbyint(x * D(0.63661977236758134308));  // 2 / pi
    D r = xsimd::fnma(n, D(1.57079632673412561417e+00), x);
    r = xsimd::fnma(n, D(6.07710050630396597660e-11), r);
    r = xsimd::fnma(n, D(2.02226624879595063154e-21), r);
    const D z = r * r;
    const D ps = D(8.33333333332248946124e-03) +
                 z * (D(-1.98412698298579493134e-04) +
                      z * (D(2.75573137070700676789e-06) +
                           z * (D(-2.50507602534068634195e-08) + z * D(1.58969099521155010221e-10))));
    const D sr = r + r * z * (D(-1.66666666666666324348e-01) + z * ps);
    const D pc = D(-1.38888888888741095749e-03) +
                 z * (D(2.48015872894767294178e-05) +
                      z * (D(-2.75573143513906633035e-07) +
                           z * (D(2.08757232129817482790e-09) + z * D(-1.13596475577881948265e-11))));
    const D cr = D(1.0) - D(0.5) * z + z * z * (D(4.16666666666666019037e-02) + z * pc);
    // q = n mod 4 in {0, 1, 2, 3}: (sin, cos) = (s, c), (c, -s), (-s, -c), (-c, s).
    const D q = n - D(4.0) * xsimd::floor(n * D(0.25));
    const auto odd = (q == D(1.0)) || (q == D(3.0));
    const D sv = xsimd::select(odd, cr, sr), cv = xsimd::select(odd, sr, cr);
    s = xsimd::select(q >= D(2.0), -sv, sv);
    c = xsimd::select((q == D(1.0)) || (q == D(2.0)), -cv, cv);
}

template <class A>
inline void sincos(const double* x, double* s, double* c, index_t n, requires_arch<generic>) noexcept {
    using D = xsimd::batch<double, A>;
    constexpr index_t W = static_cast<index_t>(D::size);
    const auto one = [&](const double* xp, double* sp, double* cp) {
        const D v = D::load_unaligned(xp);
        // !(|v| <= max) also catches NaN.
        if (xsimd::any(!(xsimd::abs(v) <= D(kSincosMax)))) {
            for (index_t k = 0; k < W; ++k) sp[k] = std::sin(xp[k]), cp[k] = std::cos(xp[k]);
            return;
        }
        D sv, cv;
        sincos_vector(v, sv, cv);
        sv.store_unaligned(sp);
        cv.store_unaligned(cp);
    };
    index_t i = 0;
    for (; i + W <= n; i += W) one(x + i, s + i, c + i);
    if (i < n) {
        alignas(64) double a[W] = {}, bs[W], bc[W];
        for (index_t k = 0; k < n - i; ++k) a[k] = x[i + k];
        one(a, bs, bc);
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

// Element by element through a small buffer (T is Eigen::bfloat16 or Eigen::half).
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

// No bfloat16 dot-product instruction: both operands widened (lane i gets element i and i + W
// of the chunk, a different pairing from vdpbf16ps, the same sum).
constexpr bool has_bf16_dot(requires_arch<generic>) noexcept { return false; }
template <class A, class T>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> dot_bf16x3(const xsimd::batch<float, A>& acc, const T* qx, const T* k,
                                                        requires_arch<generic>) noexcept {
    constexpr std::size_t W = xsimd::batch<float, A>::size;
    xsimd::batch<float, A> a = acc;
    for (std::size_t part = 0; part < 3; ++part)
        for (std::size_t h = 0; h < 2; ++h)
            a = kernel::fma(kernel::load_float<A>(qx + part * 2 * W + h * W, A{}),
                            kernel::load_float<A>(k + h * W, A{}), a, A{});
    return a;
}

}  // namespace kernel
}  // namespace simd
}  // namespace attnkit
