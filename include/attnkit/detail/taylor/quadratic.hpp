// The quadratic form of Taylor attention (docs/variants.md section 2) as a row transform of the tile
// engine: w = 1 + s + s^2 / 2 for visible keys, 0 for masked ones, and a running sum of w per
// row. 1 + s + s^2/2 >= 1/2 for every s, so there is no max to track and nothing to rescale
// (alpha = 1): accumulating raw sums is exact up to float rounding for any score magnitude.
// Rows are emitted unnormalised with their sum, so key pieces (split-KV) merge by addition and
// the denominator sum + eps is applied once, when the row is written.
#pragma once

#include "attnkit/detail/row_transform.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

struct quadratic_rows {
    static constexpr int kStateArrays = 1;  // l: the running sum of w

    float eps = 1e-6f;

    void init(float* state, index_t stride) const { std::fill(state, state + stride, 0.0f); }

    template <class A>
    ATTNKIT_NOINLINE void transform(float* st, index_t n_keys, index_t j0, bool masked, const float* lo,
                                    const float* hi, float* state, index_t /*stride*/,
                                    const simd::vfloat<A>* /*block_max*/, simd::vfloat<A>* alpha) const {
        using V = simd::vfloat<A>;
        constexpr int kNR = tile_traits<A>::kNR;
        constexpr index_t W = tile_traits<A>::kLanes;
        constexpr index_t RT = tile_traits<A>::kTileRows;
        const V one(1.0f), half(0.5f), zero(0.0f);
        for (int n = 0; n < kNR; ++n) {
            float* s = st + n * W;
            V sum(0.0f);
            if (masked) {
                const V lov = simd::loadu<A>(lo + n * W), hiv = simd::loadu<A>(hi + n * W);
                for (index_t j = 0; j < n_keys; ++j) {
                    const V x = simd::loadu<A>(s + j * RT), jf(static_cast<float>(j0 + j));
                    const V w = simd::fma(x, simd::fma(x, half, one), one);
                    const V wm = simd::select(jf < lov, zero, simd::select(jf >= hiv, zero, w));
                    simd::storeu(s + j * RT, wm);
                    sum += wm;
                }
            } else {
                for (index_t j = 0; j < n_keys; ++j) {
                    const V x = simd::loadu<A>(s + j * RT);
                    const V w = simd::fma(x, simd::fma(x, half, one), one);
                    simd::storeu(s + j * RT, w);
                    sum += w;
                }
            }
            simd::storeu(state + n * W, simd::loadu<A>(state + n * W) + sum);
            alpha[n] = one;
        }
    }
    // The row kernel's block: weights of the visible keys only (the kernel skips the others).
    template <class A>
    ATTNKIT_ALWAYS_INLINE float row_weights(float* s, index_t /*n_keys*/, index_t a, index_t z, float* state,
                                            index_t /*stride*/) const {
        using V = simd::vfloat<A>;
        constexpr index_t W = simd::kLanes<A>;
        const V one(1.0f), half(0.5f);
        V sum(0.0f);
        index_t j = a;
        for (; j + W <= z; j += W) {
            const V x = simd::loadu<A>(s + j);
            const V w = simd::fma(x, simd::fma(x, half, one), one);
            simd::storeu(s + j, w);
            sum += w;
        }
        float total = simd::hsum(sum);
        for (; j < z; ++j) {
            const float x = s[j];
            s[j] = x * (x * 0.5f + 1.0f) + 1.0f;
            total += s[j];
        }
        state[0] += total;
        return 1.0f;
    }
    float emit_scale(const float*, index_t) const { return 1.0f; }
    float summary(const float* state, index_t) const { return state[0]; }
    void merge(float* o_a, float& sum_a, const float* o_b, float sum_b, index_t dim_v) const {
        for (index_t c = 0; c < dim_v; ++c) o_a[c] += o_b[c];
        sum_a += sum_b;
    }
    // A row with no visible key has sum 0 and a zero numerator: zeros, also when eps = 0.
    void finish(float* o, float& sum, index_t /*head*/, index_t dim_v) const {
        const float inv = sum == 0.0f ? 0.0f : 1.0f / (sum + eps);
        for (index_t c = 0; c < dim_v; ++c) o[c] *= inv;
    }
};

}  // namespace taylor
}  // namespace detail
}  // namespace attnkit
