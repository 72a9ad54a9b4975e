// What every per-ISA kernel file of the SIMD layer shares: the vector type of an architecture
// tag, the tag-dispatch convention, the constants of the exponential, and the declarations of
// the one-element conversions. Not a public header (include attnkit/simd/simd.hpp).
//
// The layer is built as xsimd itself is: each operation is a small public function in
// attnkit::simd (simd.hpp, convert.hpp) that calls simd::kernel::<op>(args..., A{}), and the
// kernels are overloads on the architecture tag, one file per ISA family (arch/*.hpp). xsimd's
// tags form an inheritance chain (fma3<avx2> -> avx2 -> avx -> ..., avx512bw -> ... -> avx512f,
// sse4_2 -> ... -> sse2, each ending in xsimd::generic), so overload resolution picks the most
// specific kernel an architecture has and falls back to the generic one. Only the files under
// simd/ name xsimd or intrinsics.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnkit/config.hpp"
#include "attnkit/simd/xsimd_compat.hpp"

// The 16-bit storage types, declared only: the kernels tell them apart and read their bits, but
// only simd/convert.hpp, which defines the conversions, needs Eigen itself.
namespace Eigen {
struct bfloat16;
struct half;
}  // namespace Eigen

namespace attnkit {
namespace simd {

// The vector of floats on tag A: an xsimd batch, or (arch/scalar.hpp) one float.
template <class A>
struct vec_of {
    using type = xsimd::batch<float, A>;
};
template <class A>
using vfloat = typename vec_of<A>::type;

template <class A>
constexpr index_t kLanes = static_cast<index_t>(vfloat<A>::size);

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// One stored element as float (exact for every value of both 16-bit formats and of int8); the
// 16-bit overloads are defined in simd/convert.hpp. An int8 element is a quantised value whose
// row scale the kernel applies outside the row (attnkit/int8_kv.hpp).
ATTNKIT_ALWAYS_INLINE float to_float(float x) noexcept { return x; }
ATTNKIT_ALWAYS_INLINE float to_float(std::int8_t x) noexcept { return static_cast<float>(x); }
ATTNKIT_ALWAYS_INLINE float to_float(Eigen::bfloat16 x) noexcept;
ATTNKIT_ALWAYS_INLINE float to_float(Eigen::half x) noexcept;

namespace kernel {
// A kernel's last parameter: the most derived tag that has an overload wins.
template <class A>
using requires_arch = const A&;

// The first two rounds of an N x N register transpose (AVX's 8 and AVX-512's 16 rows, N a
// multiple of 4), on the intrinsics given: rows paired by lo / hi (unpacklo / unpackhi), then
// pairs of pairs by even / odd (shuffles taking lanes 0-1 / 2-3 of each), so that in u[4k + j]
// each 128-bit chunk c holds column 4c + j of rows 4k .. 4k + 3. What joins the chunks differs
// by width and stays with each kernel.
template <int N, class R, class Lo, class Hi, class Even, class Odd>
ATTNKIT_ALWAYS_INLINE void transpose_quads(const R* v, R* u, Lo lo, Hi hi, Even even, Odd odd) noexcept {
    R t[N];
    for (int k = 0; k < N / 2; ++k) {
        t[2 * k] = lo(v[2 * k], v[2 * k + 1]);
        t[2 * k + 1] = hi(v[2 * k], v[2 * k + 1]);
    }
    for (int k = 0; k < N / 4; ++k) {
        u[4 * k + 0] = even(t[4 * k], t[4 * k + 2]);
        u[4 * k + 1] = odd(t[4 * k], t[4 * k + 2]);
        u[4 * k + 2] = even(t[4 * k + 1], t[4 * k + 3]);
        u[4 * k + 3] = odd(t[4 * k + 1], t[4 * k + 3]);
    }
}
}  // namespace kernel

}  // namespace simd
}  // namespace attnkit
