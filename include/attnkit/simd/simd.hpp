// The SIMD layer: float vectors on an architecture tag, with the handful of operations the
// kernels need.
//
//   using A = simd::default_arch;                 // what the compile flags select
//   using V = simd::vfloat<A>;                    // simd::kLanes<A> floats
//   V x = simd::loadu<A>(p), y = simd::set1<A>(2.0f);
//   V z = simd::fma(x, y, simd::exp2_nonpositive(x - simd::set1<A>(simd::hmax(x))));
//   simd::storeu(q, z);
//   float s = simd::hsum(z);
//
// Kernels are templates on the tag A; public entry points instantiate them on
// simd::default_arch. A vector is either an xsimd batch or, for simd::scalar_arch, a one-lane
// struct with the same operations, so every kernel also has a portable path.
//
// This header is the front: each function below forwards to simd::kernel::<op>(..., A{}), whose
// overloads on the architecture tag live one file per ISA family in simd/arch/ (scalar.hpp,
// generic.hpp for any xsimd architecture, sse.hpp, avx.hpp, avx512.hpp); the tag's place in
// xsimd's hierarchy picks the most specific one. The documented rules (NaN, ranges, accuracy)
// hold on every architecture; the per-ISA files say why their special cases exist.
// Loads of 16-bit storage (bfloat16, half) are in simd/convert.hpp.
#pragma once

#include <cstdint>
#include <cstring>

#include "attnkit/config.hpp"
#include "attnkit/simd/arch/common.hpp"
#include "attnkit/simd/arch/scalar.hpp"
#include "attnkit/simd/arch/sse.hpp"
#include "attnkit/simd/arch/avx.hpp"
#include "attnkit/simd/arch/avx512.hpp"
// Last: its qualified kernel:: calls (the exp polynomial's fma, ...) must see the ISA overloads.
#include "attnkit/simd/arch/generic.hpp"

namespace attnkit {
namespace simd {

// The widest architecture the compile flags enable, whatever ATTNKIT_SIMD_SCALAR says (for
// store_fence, which orders the stores of any kernel built for this target).
#if defined(XSIMD_NO_SUPPORTED_ARCHITECTURE)
using target_arch = scalar_arch;
#else
using target_arch = xsimd::default_arch;
#endif

#if defined(ATTNKIT_SIMD_SCALAR)
using default_arch = scalar_arch;
#else
using default_arch = target_arch;
#endif

// ---- loads and stores: unaligned always; attnkit never assumes alignment it does not own ----

template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> loadu(const float* p) noexcept {
    return kernel::loadu<A>(p, A{});
}
template <class A>
ATTNKIT_ALWAYS_INLINE vfloat<A> set1(float x) noexcept {
    return vfloat<A>(x);
}
ATTNKIT_ALWAYS_INLINE void storeu(float* p, scalar_float v) noexcept { kernel::storeu(p, v, scalar_arch{}); }
template <class A>
ATTNKIT_ALWAYS_INLINE void storeu(float* p, const xsimd::batch<float, A>& v) noexcept {
    kernel::storeu(p, v, A{});
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

// ---- register pinning ----

// Makes a loaded vector opaque to the optimiser, so that it stays in a register for the uses
// that follow. For a vector reused by several FMAs of an unrolled step, GCC 12 folds the load
// into each of them as a memory operand instead (the grouped decode's score step loaded each key
// vector once per query row: 12 loads per 8 FMAs, and ran load-bound). Emits no instruction.
ATTNKIT_ALWAYS_INLINE void keep_in_register(scalar_float&) noexcept {}
template <class A>
ATTNKIT_ALWAYS_INLINE void keep_in_register(xsimd::batch<float, A>& v) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    auto r = static_cast<typename xsimd::batch<float, A>::register_type>(v);
    __asm__("" : "+v"(r));
    v = r;
#else
    (void)v;
#endif
}

// ---- arithmetic ----

// a * b + c, rounded once wherever the target has FMA (and on the scalar path, std::fma);
// with two roundings where it has none (SSE2, AVX without FMA3).
ATTNKIT_ALWAYS_INLINE scalar_float fma(scalar_float a, scalar_float b, scalar_float c) noexcept {
    return kernel::fma(a, b, c, scalar_arch{});
}
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> fma(const xsimd::batch<float, A>& a, const xsimd::batch<float, A>& b,
                                                 const xsimd::batch<float, A>& c) noexcept {
    return kernel::fma(a, b, c, A{});
}

// max/min return b when either operand is NaN (the x86 rule, kept on every path) so that
// callers choose, by operand order, whether NaN propagates.
ATTNKIT_ALWAYS_INLINE scalar_float max(scalar_float a, scalar_float b) noexcept { return kernel::max(a, b, scalar_arch{}); }
ATTNKIT_ALWAYS_INLINE scalar_float min(scalar_float a, scalar_float b) noexcept { return kernel::min(a, b, scalar_arch{}); }
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> max(const xsimd::batch<float, A>& a, const xsimd::batch<float, A>& b) noexcept {
    return kernel::max(a, b, A{});
}
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> min(const xsimd::batch<float, A>& a, const xsimd::batch<float, A>& b) noexcept {
    return kernel::min(a, b, A{});
}

ATTNKIT_ALWAYS_INLINE scalar_float select(bool c, scalar_float a, scalar_float b) noexcept {
    return kernel::select(c, a, b, scalar_arch{});
}
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> select(const xsimd::batch_bool<float, A>& c, const xsimd::batch<float, A>& a,
                                                    const xsimd::batch<float, A>& b) noexcept {
    return kernel::select(c, a, b, A{});
}

// ---- permutations ----

// Lanes 2i and 2i + 1 exchanged (the pairs of interleaved RoPE). Vectors of an even lane count
// only: simd::scalar_arch has none, its callers work on pairs of scalars instead.
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> swap_pairs(const xsimd::batch<float, A>& v) noexcept {
    return kernel::swap_pairs(v, A{});
}

// v[i] lane j and v[j] lane i exchanged for the kLanes<A> vectors v[0 .. W): a W x W block
// transposed in registers (the GEMM packs transposed operands with it; one float at a time that
// is a strided scalar store per element). scalar_arch's single lane needs nothing.
ATTNKIT_ALWAYS_INLINE void transpose(scalar_float*) noexcept {}
template <class A>
ATTNKIT_ALWAYS_INLINE void transpose(xsimd::batch<float, A>* v) noexcept {
    kernel::transpose(v, A{});
}

// ---- reductions ----

ATTNKIT_ALWAYS_INLINE float hsum(scalar_float v) noexcept { return kernel::hsum(v, scalar_arch{}); }
template <class A>
ATTNKIT_ALWAYS_INLINE float hsum(const xsimd::batch<float, A>& v) noexcept {
    return kernel::hsum(v, A{});
}

// NaN lanes are skipped unless all lanes are NaN; -inf if all lanes are -inf.
ATTNKIT_ALWAYS_INLINE float hmax(scalar_float v) noexcept { return kernel::hmax(v, scalar_arch{}); }
template <class A>
ATTNKIT_ALWAYS_INLINE float hmax(const xsimd::batch<float, A>& v) noexcept {
    return kernel::hmax(v, A{});
}

// Lane i of the result = the sum of the lanes of v[i], for kLanes<A> vectors v[0 .. W): W
// horizontal sums as one transposing reduction (W - 1 adds and shuffles in place of W times
// log2(W)), so that a kernel computing many dot products never reduces them one by one.
ATTNKIT_ALWAYS_INLINE scalar_float hsum_each(const scalar_float* v) noexcept { return kernel::hsum_each(v, scalar_arch{}); }
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> hsum_each(const xsimd::batch<float, A>* v) noexcept {
    return kernel::hsum_each(v, A{});
}

// ---- exponentials ----

// 2^x with relative error below 2.5e-7 for finite results. x < -126 gives exactly 0 (so -inf,
// a masked score, gives 0 without a branch), x > 127 gives +inf, NaN gives NaN. Results below
// the normal range flush to 0, which the softmax never notices next to its max term (= 1).
ATTNKIT_ALWAYS_INLINE scalar_float exp2(scalar_float x) noexcept { return kernel::exp2(x, scalar_arch{}); }
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> exp2(const xsimd::batch<float, A>& x) noexcept {
    return kernel::exp2(x, A{});
}

// 2^x for x <= 0: the shifted scores of a softmax, the hot path of every attention kernel.
// Same accuracy and 0 / NaN rules as exp2 but without the overflow handling that x <= 0 never
// needs: a third fewer operations per vector. (x > 0 returns a wrong finite value.)
ATTNKIT_ALWAYS_INLINE scalar_float exp2_nonpositive(scalar_float x) noexcept {
    return kernel::exp2_nonpositive(x, scalar_arch{});
}
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> exp2_nonpositive(const xsimd::batch<float, A>& x) noexcept {
    return kernel::exp2_nonpositive(x, A{});
}

// e^x with the range rules of exp2(x * log2(e)) (0 below -126, +inf above 127, NaN for NaN) but
// the accuracy of exp2: x * log2(e) itself is rounded by up to 2^-17 near |x| = 88, so x is
// reduced against n * ln2 in two parts (Cody-Waite) and only the small remainder is rescaled.
ATTNKIT_ALWAYS_INLINE scalar_float exp(scalar_float x) noexcept { return kernel::exp(x, scalar_arch{}); }
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> exp(const xsimd::batch<float, A>& x) noexcept {
    return kernel::exp(x, A{});
}

// tanh to a few ulp (xsimd's, std::tanh on the scalar path).
ATTNKIT_ALWAYS_INLINE scalar_float tanh(scalar_float x) noexcept { return kernel::tanh(x, scalar_arch{}); }
template <class A>
ATTNKIT_ALWAYS_INLINE xsimd::batch<float, A> tanh(const xsimd::batch<float, A>& x) noexcept {
    return kernel::tanh(x, A{});
}

// ---- sine and cosine of double angles ----

// s[i] = sin(x[i]), c[i] = cos(x[i]) for i < n, as floats, of angles given in double (such as
// RoPE's p * f, up to ~1e6 radians, whose phase a float argument would lose): the reduction by
// pi/2 is done in double (exact phase up to |x| = 1.6e6), the polynomial on the reduced angle
// in float (arch/generic.hpp), within about 1.5 ulp of float of the true value; beyond 1.6e6,
// and on the scalar path, std::sin / std::cos in double, rounded. The path is chosen per block
// of W angles (W float lanes, from x[0]), so the bits of one result may depend on the other
// angles of its block: a caller that wants the same bits for the same angle calls with the
// same blocks.
template <class A>
inline void sincos(const double* x, float* s, float* c, index_t n) noexcept {
    kernel::sincos<A>(x, s, c, n, A{});
}

// ---- streaming kernels (self-gating attention: memory-bound) ----

// <a, b> over n floats: four independent accumulators (a dot of D = 128 at 8 lanes is 16 vector
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

// dot's downward twin: the same four accumulators, the vectors taken from the top of the rows
// down (the partial one first), for a scan that reads its rows from their ends (the
// self-gating backward's descending walk, detail/self_gating/backward.hpp). The order again
// depends only on n and the arch.
template <class A>
ATTNKIT_ALWAYS_INLINE float dot_down(const float* a, const float* b, index_t n) noexcept {
    using V = vfloat<A>;
    constexpr index_t W = kLanes<A>;
    V s0(0.0f), s1(0.0f), s2(0.0f), s3(0.0f);
    index_t i = n - n % W;
    if (i < n) s0 = fma(load_partial<A>(a + i, n - i), load_partial<A>(b + i, n - i), s0);
    for (i -= W; i >= 3 * W; i -= 4 * W) {
        s3 = fma(loadu<A>(a + i), loadu<A>(b + i), s3);
        s2 = fma(loadu<A>(a + i - W), loadu<A>(b + i - W), s2);
        s1 = fma(loadu<A>(a + i - 2 * W), loadu<A>(b + i - 2 * W), s1);
        s0 = fma(loadu<A>(a + i - 3 * W), loadu<A>(b + i - 3 * W), s0);
    }
    for (; i >= 0; i -= W) s0 = fma(loadu<A>(a + i), loadu<A>(b + i), s0);
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
// (no read-for-ownership), which saves a third of the traffic of a pure write stream. A plain
// store where the ISA has none. Call store_fence() before other threads read.
ATTNKIT_ALWAYS_INLINE void stream_store(float* p, scalar_float v) noexcept { kernel::stream_store(p, v, scalar_arch{}); }
template <class A>
ATTNKIT_ALWAYS_INLINE void stream_store(float* p, const xsimd::batch<float, A>& v) noexcept {
    kernel::stream_store(p, v, A{});
}

// Orders earlier non-temporal stores before later stores (x86 sfence; nothing elsewhere).
ATTNKIT_ALWAYS_INLINE void store_fence() noexcept { kernel::store_fence(target_arch{}); }

}  // namespace simd
}  // namespace attnkit
