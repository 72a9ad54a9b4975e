// Gradient row policies of the backward tile kernel (backward/tile_kernel.hpp): what a variant
// does to a tile of recomputed scores to get the weights that multiply V (P) and, from
// dP = dO V^T, the gradient of the raw scores (dS). The kernel owns everything else (tiling,
// packing, masks, block skipping, the micro-kernels, the partition), as the forward's tile
// kernel does with row_transform.hpp's policies.
//
// A tile is [n_rows][kTileRows] with query rows broadcast and keys in lanes (the backward turns
// the forward's roles: its reductions over query rows, dK and dV, then run along lanes). Per
// row the policy gets two statistics that the kernel's caller prepared (from the forward's
// outputs, or recomputed where the API does not pass them):
//   stat_a[r]   softmax: lse in log2 units (+inf for a row without visible keys)
//               Taylor (taylor/quadratic_backward.hpp): 1 / (Z_r + eps), 0 without visible keys
//   stat_b[r]   softmax: D_r = <dO_r, O_r>; Taylor: D_r / (Z_r + eps)
// and the row's visible key interval [lo[r], hi[r]). A policy is a small copyable struct with
//   grads<A>(s, dp, n_rows, key0, masked, lo, hi, stat_a, stat_b)
//       s:  in the scores as the forward's packed queries give them, out P
//       dp: in dP, out dS (the gradient of the score before scaling)
//       entries of keys a row does not see become exactly 0 (by selection, never by a product,
//       so that a NaN or Inf there stays out of the gradients)
//   empty_row_a()  (static) stat_a of the rows that pad the last query block (they see no key)
#pragma once

#include <limits>

#include "attnkit/detail/online_softmax.hpp"
#include "attnkit/detail/tile_traits.hpp"

namespace attnkit {
namespace detail {
namespace backward {

// The walk of a tile every policy shares: for each row r, row(r) gives the row's element
// function g(x, d) (per-row constants taken once), which turns one vector of scores x into P
// and one of dP d into dS in place; entries of keys outside [lo[r], hi[r]) then become exactly 0
// by selection, and both are stored back.
template <class A, class Row>
ATTNKIT_ALWAYS_INLINE void tile_grads(float* s, float* dp, index_t n_rows, index_t key0, bool masked,
                                      const index_t* lo, const index_t* hi, Row&& row) {
    using V = simd::vfloat<A>;
    constexpr int kNR = tile_traits<A>::kNR;
    constexpr index_t W = tile_traits<A>::kLanes;
    constexpr index_t RT = tile_traits<A>::kTileRows;
    const V zero(0.0f);
    V key[kNR];
    ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) {
        alignas(64) float idx[W];
        ATTNKIT_UNROLL for (index_t l = 0; l < W; ++l) idx[l] = static_cast<float>(key0 + n * W + l);
        key[n] = simd::loadu<A>(idx);
    }
    for (index_t r = 0; r < n_rows; ++r) {
        const auto g = row(r);
        const V lov(static_cast<float>(lo[r])), hiv(static_cast<float>(hi[r]));
        ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) {
            float* sp = s + r * RT + n * W;
            float* dpp = dp + r * RT + n * W;
            V p = simd::loadu<A>(sp), ds = simd::loadu<A>(dpp);
            g(p, ds);
            if (masked) {
                p = simd::select(key[n] < lov, zero, simd::select(key[n] >= hiv, zero, p));
                ds = simd::select(key[n] < lov, zero, simd::select(key[n] >= hiv, zero, ds));
            }
            simd::storeu(sp, p);
            simd::storeu(dpp, ds);
        }
    }
}

// Softmax: P = 2^(s - lse2), dS = P (dP - D_r); under a soft-cap the scores arrive raw (scaled,
// not in log2 units, as the forward packs them), are capped here exactly as the forward caps
// them, and dS takes the factor 1 - tanh^2.
struct softmax_grad_rows {
    float softcap = 0.0f;  // > 0: the forward's soft-cap c

    static float empty_row_a() { return std::numeric_limits<float>::infinity(); }

    template <class A>
    ATTNKIT_NOINLINE void grads(float* s, float* dp, index_t n_rows, index_t key0, bool masked, const index_t* lo,
                                const index_t* hi, const float* lse2, const float* d_row) const {
        using V = simd::vfloat<A>;
        const V one(1.0f);
        const V inv_cap(softcap > 0.0f ? 1.0f / softcap : 0.0f), cap_log2(softcap * simd::kLog2e);
        const bool capped = softcap > 0.0f;
        tile_grads<A>(s, dp, n_rows, key0, masked, lo, hi, [&](index_t r) {
            const V m(lse2[r]), d(d_row[r]);
            return [=](V& x, V& dpv) {
                V th(0.0f);
                if (capped) {  // as the forward: c log2(e) tanh(raw / c)
                    th = simd::tanh(x * inv_cap);
                    x = cap_log2 * th;
                }
                const V p = simd::exp2(x - m);
                dpv = p * (dpv - d);
                if (capped) dpv = dpv * (one - th * th);
                x = p;
            };
        });
    }
};

}  // namespace backward
}  // namespace detail
}  // namespace attnkit
