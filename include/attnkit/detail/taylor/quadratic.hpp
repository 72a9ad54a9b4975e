// The quadratic form of Taylor attention (docs/variants.md section 2) as a row transform of the tile
// engine: w = 1 + s + s^2 / 2 for visible keys, 0 for masked ones, and a running sum of w per
// row. 1 + s + s^2/2 >= 1/2 for every s, so there is no max to track and nothing to rescale
// (alpha = 1): accumulating raw sums is exact up to float rounding while they fit in float
// (scores past ~2.6e19 do not: rescaled() scales scores and weights by exact powers of two).
// Rows are emitted unnormalised with their sum, so key pieces (split-KV) merge by addition and
// the denominator sum + eps is applied once, when the row is written.
#pragma once

#include <cmath>

#include "attnkit/detail/row_transform.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

struct quadratic_rows {
    static constexpr int kStateArrays = 1;  // l: the running sum of w

    float eps = 1e-6f;
    // > 0 (rescaled()): scores are taken as x = s 2^-score_shift and the weights computed as
    // x^2/2 + x c + c^2 with c = 2^-score_shift, which is w c^2 exactly (powers of two); the
    // sums and eps are scaled by c^2 alike, so the row is the same where w fits in float, and
    // finite where w (~ s^2/2, past FLT_MAX from |s| ~ 2.6e19 on) does not.
    int score_shift = 0;

    void init(float* state, index_t stride) const { std::fill(state, state + stride, 0.0f); }

    template <class A>
    ATTNKIT_NOINLINE void transform(float* st, index_t n_keys, index_t j0, bool masked, const float* lo,
                                    const float* hi, float* state, index_t /*stride*/,
                                    const simd::vfloat<A>* /*block_max*/, simd::vfloat<A>* alpha) const {
        if (score_shift == 0)
            panel_weights<A, false>(st, n_keys, j0, masked, lo, hi, state, alpha);
        else
            panel_weights<A, true>(st, n_keys, j0, masked, lo, hi, state, alpha);
    }
    // The row kernel's block: weights of the visible keys only (the kernel skips the others).
    template <class A>
    ATTNKIT_ALWAYS_INLINE float row_weights(float* s, index_t /*n_keys*/, index_t a, index_t z, float* state,
                                            index_t /*stride*/) const {
        using V = simd::vfloat<A>;
        constexpr index_t W = simd::kLanes<A>;
        const float c = shift_factor(), c2 = c * c;
        const V one(1.0f), half(0.5f), cv(c), c2v(c2);
        V sum(0.0f);
        index_t j = a;
        if (score_shift == 0) {
            for (; j + W <= z; j += W) {
                const V x = simd::loadu<A>(s + j);
                const V w = simd::fma(x, simd::fma(x, half, one), one);
                simd::storeu(s + j, w);
                sum += w;
            }
        } else {
            for (; j + W <= z; j += W) {
                const V x = simd::loadu<A>(s + j) * cv;
                const V w = simd::fma(x, simd::fma(x, half, cv), c2v);
                simd::storeu(s + j, w);
                sum += w;
            }
        }
        float total = simd::hsum(sum);
        for (; j < z; ++j) {
            const float x = s[j] * c;
            s[j] = x * (x * 0.5f + c) + c2;
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
        const float e = score_shift == 0 ? eps : std::ldexp(eps, -2 * score_shift);
        const float inv = sum == 0.0f ? 0.0f : 1.0f / (sum + e);
        for (index_t c = 0; c < dim_v; ++c) o[c] *= inv;
    }
    // 2^-64: scores up to ~2^127 / sqrt(keys) give finite sums. The 1 and s terms of w then sit
    // near float's smallest numbers, where they are negligible beside s^2/2 of the keys that
    // overflowed (a row only reruns when one did).
    quadratic_rows rescaled() const {
        quadratic_rows r = *this;
        r.score_shift = 64;
        return r;
    }
    float shift_factor() const { return score_shift == 0 ? 1.0f : std::ldexp(1.0f, -score_shift); }

   private:
    template <class A, bool kScaled>
    void panel_weights(float* st, index_t n_keys, index_t j0, bool masked, const float* lo, const float* hi,
                       float* state, simd::vfloat<A>* alpha) const {
        using V = simd::vfloat<A>;
        constexpr int kNR = tile_traits<A>::kNR;
        constexpr index_t W = tile_traits<A>::kLanes;
        constexpr index_t RT = tile_traits<A>::kTileRows;
        const float c = shift_factor();
        const V one(1.0f), half(0.5f), zero(0.0f), cv(c), c2v(c * c);
        auto weight = [&](V x) {
            if constexpr (kScaled) {
                x = x * cv;
                return simd::fma(x, simd::fma(x, half, cv), c2v);
            } else {
                return simd::fma(x, simd::fma(x, half, one), one);
            }
        };
        ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) {
            float* s = st + n * W;
            V sum(0.0f);
            if (masked) {
                const V lov = simd::loadu<A>(lo + n * W), hiv = simd::loadu<A>(hi + n * W);
                for (index_t j = 0; j < n_keys; ++j) {
                    const V jf(static_cast<float>(j0 + j));
                    const V w = weight(simd::loadu<A>(s + j * RT));
                    const V wm = simd::select(jf < lov, zero, simd::select(jf >= hiv, zero, w));
                    simd::storeu(s + j * RT, wm);
                    sum += wm;
                }
            } else {
                for (index_t j = 0; j < n_keys; ++j) {
                    const V w = weight(simd::loadu<A>(s + j * RT));
                    simd::storeu(s + j * RT, w);
                    sum += w;
                }
            }
            simd::storeu(state + n * W, simd::loadu<A>(state + n * W) + sum);
            alpha[n] = one;
        }
    }
};

}  // namespace taylor
}  // namespace detail
}  // namespace attnkit
