// The row operations of mta_state: one new token's rows of the [H, L, L] pipeline, each a whole
// row of keys 0 .. i in natural order (no tiles, no panels), for one head at a time so that the
// state can spread heads over its pool.
//
//   conv_row(ring, base, cq_ring, i, theta, cs, h, y, n)   y = KQConv of the ring rows, head h
//   mix_row(y, n, w, H, h, out)                            out = HeadMix(y), head h
//   softmax_row<A>(y, n, p)                                p = softmax(y) over all n keys
//
// A decode row sees every key 0 .. i, so no masks appear here: Mask0 is implicit (only j <= i is
// computed) and keys past i do not exist yet.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attnkit/detail/mta/check.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {
namespace mta {

// y[j] (j < n, row i, output head h) += sum_{m, a, c} th[h, m, a, c] x_r[(h / G) G + m][j + c - hk]
// over the ring rows r = i + a - c_q + 1 (slots ring[base + r % cq_ring], each [H][r + 1], 0
// outside [0, r] and for r < 0). y must hold zeros on entry.
inline void conv_row(const std::vector<std::vector<float>>& ring, index_t base, index_t cq_ring, index_t i,
                     const float* th, const conv_shape& cs, index_t h, float* y, index_t n) {
    const index_t G = cs.groups, cq = cs.c_q, ck = cs.c_k, hk = cs.key_halo();
    // Tiles of kConvTile outputs stay in L1 over the c_q c_k G passes that add into them.
    constexpr index_t kConvTile = 512;
    for (index_t t0 = 0; t0 < n; t0 += kConvTile) {
        const index_t t1 = std::min(n, t0 + kConvTile);
        for (index_t a = 0; a < cq; ++a) {
            const index_t r = i + a - (cq - 1);
            if (r < 0) continue;
            const float* x = ring[static_cast<std::size_t>(base + r % cq_ring)].data();
            const index_t len = r + 1;
            for (index_t m = 0; m < G; ++m) {
                const float* xr = x + ((h / G) * G + m) * len;
                for (index_t c = 0; c < ck; ++c) {
                    const float w = th[((h * G + m) * cq + a) * ck + c];
                    const index_t sh = c - hk, j0 = std::max(t0, -sh), j1 = std::min(t1, len - sh);
                    for (index_t j = j0; j < j1; ++j) y[j] += w * xr[j + sh];
                }
            }
        }
    }
}

// out[j] (j < n) += sum_g w[h][g] y[g][j], y [H][n], w [H][H] as [out][in]; out holds zeros on
// entry.
inline void mix_row(const float* y, index_t n, const float* w, index_t H, index_t h, float* out) {
    for (index_t g = 0; g < H; ++g) {
        const float wg = w[h * H + g];
        for (index_t j = 0; j < n; ++j) out[j] += wg * y[g * n + j];
    }
}

// p = exp(y - max y) / sum, over the whole row (every key of a decode row is visible). In natural
// units with simd::exp, as the state has always computed it (the fused kernel's online softmax
// works in log2 units over key blocks; the two agree to rounding, not to the bit).
template <class A>
void softmax_row(const float* y, index_t n, float* p) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const float m = *std::max_element(y, y + n);
    const V mv(m);
    V acc(0.0f);
    index_t j = 0;
    for (; j + W <= n; j += W) {
        const V e = simd::exp(simd::loadu<A>(y + j) - mv);
        simd::storeu(p + j, e);
        acc = acc + e;
    }
    float z = simd::hsum(acc);
    for (; j < n; ++j) z += (p[j] = std::exp(y[j] - m));
    const float rz = 1.0f / z;
    for (j = 0; j < n; ++j) p[j] *= rz;
}

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
