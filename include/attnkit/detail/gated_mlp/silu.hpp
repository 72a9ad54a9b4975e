// SiLU(g) * u, in place over g, for the gated MLP's row blocks (docs/variants.md section 6).
//
//   silu(x) = x / (1 + e^-x) = x * sigmoid(x)
//
// Written on the simd:: layer only (simd::exp, vector arithmetic), so it has the same code on
// every architecture tag, including the one-lane scalar path. e^-x overflows to +inf for
// x < -88.7, and x / inf = -0, the correct limit; NaN stays NaN.
#pragma once

#include "attnkit/config.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {

template <class A>
ATTNKIT_ALWAYS_INLINE simd::vfloat<A> silu(const simd::vfloat<A>& x) noexcept {
    const simd::vfloat<A> one = simd::set1<A>(1.0f);
    return x / (one + simd::exp(simd::set1<A>(0.0f) - x));
}

// g[i] = silu(g[i]) * u[i] for i < n.
template <class A>
void silu_mul(float* ATTNKIT_RESTRICT g, const float* ATTNKIT_RESTRICT u, index_t n) noexcept {
    constexpr index_t W = simd::kLanes<A>;
    index_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {  // two vectors per step: exp's latency chains interleave
        const auto a = silu<A>(simd::loadu<A>(g + i)) * simd::loadu<A>(u + i);
        const auto b = silu<A>(simd::loadu<A>(g + i + W)) * simd::loadu<A>(u + i + W);
        simd::storeu(g + i, a);
        simd::storeu(g + i + W, b);
    }
    for (; i + W <= n; i += W) simd::storeu(g + i, silu<A>(simd::loadu<A>(g + i)) * simd::loadu<A>(u + i));
    if (i < n) {
        const auto r = silu<A>(simd::load_partial<A>(g + i, n - i)) * simd::load_partial<A>(u + i, n - i);
        simd::store_partial(g + i, r, n - i);
    }
}

}  // namespace detail
}  // namespace attnkit
