// attnkit: configuration macros shared by every header, and attnkit::index_t.
//
//   ATTNKIT_ALWAYS_INLINE, ATTNKIT_NOINLINE, ATTNKIT_RESTRICT, ATTNKIT_PREFETCH(p),
//   ATTNKIT_LIKELY(x), ATTNKIT_UNLIKELY(x)     portable spellings of compiler hints
//   -DATTNKIT_SIMD_SCALAR                      force the one-lane portable SIMD path
//   attnkit::index_t                           the signed 64-bit size type of every shape
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnkit/version.hpp"

#if defined(__GNUC__) || defined(__clang__)
#define ATTNKIT_ALWAYS_INLINE inline __attribute__((always_inline))
#define ATTNKIT_RESTRICT __restrict__
#define ATTNKIT_PREFETCH(p) __builtin_prefetch(p)
#define ATTNKIT_NOINLINE __attribute__((noinline))
#define ATTNKIT_LIKELY(x) __builtin_expect(!!(x), 1)
#define ATTNKIT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define ATTNKIT_ALWAYS_INLINE inline
#define ATTNKIT_RESTRICT
#define ATTNKIT_LIKELY(x) (x)
#define ATTNKIT_UNLIKELY(x) (x)
#define ATTNKIT_PREFETCH(p) ((void)(p))
#define ATTNKIT_NOINLINE
#endif

// Define ATTNKIT_SIMD_SCALAR to force the portable one-lane path (debugging, exotic targets).
// It is chosen automatically when xsimd finds no SIMD architecture for the compile flags.

namespace attnkit {
// Sizes and strides are signed so that differences and reverse loops need no casts.
using index_t = std::int64_t;
}  // namespace attnkit
