// attnkit: configuration macros shared by every header, and attnkit::index_t.
//
//   ATTNKIT_ALWAYS_INLINE, ATTNKIT_NOINLINE, ATTNKIT_UNROLL, ATTNKIT_RESTRICT, ATTNKIT_PREFETCH(p),
//   ATTNKIT_LIKELY(x), ATTNKIT_UNLIKELY(x)     portable spellings of compiler hints
//   ATTNKIT_INLINE_LAMBDA                      the same as ATTNKIT_ALWAYS_INLINE for a lambda,
//                                              after its parameter list: a loop body passed to a
//                                              helper, which GCC at -O2 may leave as a call
//   -DATTNKIT_SIMD_SCALAR                      force the one-lane portable SIMD path
//   -DATTNKIT_EXTERN_KERNELS                   the kernels compiled once, elsewhere (below)
//   attnkit::index_t                           the signed 64-bit size type of every shape
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnkit/version.hpp"

#if defined(__GNUC__) || defined(__clang__)
#define ATTNKIT_ALWAYS_INLINE inline __attribute__((always_inline))
#define ATTNKIT_INLINE_LAMBDA __attribute__((always_inline))
#define ATTNKIT_RESTRICT __restrict__
#define ATTNKIT_PREFETCH(p) __builtin_prefetch(p)
#define ATTNKIT_PREFETCH_L2(p) __builtin_prefetch(p, 0, 1)  // prefetcht2 on x86: the line to L2
#define ATTNKIT_NOINLINE __attribute__((noinline))
#ifndef ATTNKIT_UNROLL
#if defined(__clang__)
#define ATTNKIT_UNROLL _Pragma("unroll")
#else
#define ATTNKIT_UNROLL _Pragma("GCC unroll 64")
#endif
#endif
#define ATTNKIT_LIKELY(x) __builtin_expect(!!(x), 1)
#define ATTNKIT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define ATTNKIT_ALWAYS_INLINE inline
#define ATTNKIT_INLINE_LAMBDA
#define ATTNKIT_RESTRICT
#define ATTNKIT_LIKELY(x) (x)
#define ATTNKIT_UNLIKELY(x) (x)
#define ATTNKIT_PREFETCH(p) ((void)(p))
#define ATTNKIT_PREFETCH_L2(p) ((void)(p))
#define ATTNKIT_NOINLINE
#ifndef ATTNKIT_UNROLL
#define ATTNKIT_UNROLL
#endif
#endif

// The capture default of a member function's lambda that copies its locals and uses the object:
// [=] captures `this` implicitly up to C++17 and is deprecated for it in C++20, whose spelling
// [=, this] C++17 does not have.
#if __cplusplus > 201703L
#define ATTNKIT_COPY_CAPTURE =, this
#else
#define ATTNKIT_COPY_CAPTURE =
#endif

// ATTNKIT_UNROLL before a loop over a compile-time count of vector registers (an array of
// accumulators): GCC unrolls such a loop completely at -O3, but at -O2 not when that grows the
// code, and a loop left rolled keeps its array in memory, a load and a store around every FMA
// (the prefill kernels ran 2.4-2.6x slower at -O2: docs/benchmarks.md, "-O2 against -O3").
// Defined empty beforehand (-DATTNKIT_UNROLL=) it leaves the loops to the compiler: the same
// results, in less compile time (attnkit's -O1 test builds, which exist for coverage).

// Define ATTNKIT_SIMD_SCALAR to force the portable one-lane path (debugging, exotic targets).
// It is chosen automatically when xsimd finds no SIMD architecture for the compile flags.

// Compiled kernels (docs/building.md, "Compile time"). Each kernel is a template instantiated in
// every translation unit that calls it, and its vector code is most of such a unit's compile
// time. A project with many of them may compile the common instantiations once: every unit is
// compiled with -DATTNKIT_EXTERN_KERNELS (the instantiations listed in the headers become
// `extern template` declarations), and one unit, compiled with the same flags, defines
// ATTNKIT_INSTANTIATE_KERNELS before including <attnkit/attnkit.hpp> (explicit instantiation
// definitions). The instantiations depend on the SIMD flags (simd::default_arch), so every flag
// set needs its own such unit. The code is the same either way; only where it is compiled
// differs. A listed entry is ATTNKIT_NOINLINE: GCC instantiates an extern template that it may
// inline, which would keep the cost this saves.
#if defined(ATTNKIT_INSTANTIATE_KERNELS)
#define ATTNKIT_KERNEL_INSTANCE template
#elif defined(ATTNKIT_EXTERN_KERNELS)
#define ATTNKIT_KERNEL_INSTANCE extern template
#endif

namespace attnkit {
// Sizes and strides are signed so that differences and reverse loops need no casts.
using index_t = std::int64_t;
}  // namespace attnkit
