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

// The backward's elementwise pass over n dense floats: from G (in g), U (in u) and
// dZ = d_out W_down^T (in dz), Z = SiLU(G) U into z (for d_w_down), dG = dZ U SiLU'(G) into g
// and dU = dZ SiLU(G) into u. SiLU'(x) = s (1 + x (1 - s)) with s = sigmoid(x) = 1 / (1 + e^-x);
// e^-x = +inf for x < -88.7 gives s = 0 and SiLU = -0, SiLU' = 0, the limits.
template <class A>
void silu_backward(float* ATTNKIT_RESTRICT g, float* ATTNKIT_RESTRICT u, const float* ATTNKIT_RESTRICT dz,
                   float* ATTNKIT_RESTRICT z, index_t n) noexcept {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const V one = simd::set1<A>(1.0f), zero = simd::set1<A>(0.0f);
    auto step = [&](index_t i, index_t len) {
        const bool full = len == W;
        const V x = full ? simd::loadu<A>(g + i) : simd::load_partial<A>(g + i, len);
        const V up = full ? simd::loadu<A>(u + i) : simd::load_partial<A>(u + i, len);
        const V d = full ? simd::loadu<A>(dz + i) : simd::load_partial<A>(dz + i, len);
        const V s = one / (one + simd::exp(zero - x));
        const V a = x * s;
        const V zz = a * up, du = d * a, dg = d * up * s * (one + x * (one - s));
        if (full) {
            simd::storeu(z + i, zz);
            simd::storeu(g + i, dg);
            simd::storeu(u + i, du);
        } else {
            simd::store_partial(z + i, zz, len);
            simd::store_partial(g + i, dg, len);
            simd::store_partial(u + i, du, len);
        }
    };
    index_t i = 0;
    for (; i + W <= n; i += W) step(i, W);
    if (i < n) step(i, n - i);
}

}  // namespace detail
}  // namespace attnkit
