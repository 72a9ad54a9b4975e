// Online softmax (FlashAttention's running max and sum) on a panel of rows in lanes, in log2
// units: scores arrive multiplied by log2(e) so that one exp2 per score suffices.
//
// -inf guards: a row that has seen no visible key keeps m = -inf; its scores and rescale factor
// are computed against 0 instead, so exp2(-inf - -inf) = NaN never happens, p = 0 and l = 0. A
// row that ends with l = 0 outputs zeros and lse = -inf.
#pragma once

#include <cmath>
#include <limits>

#include "attnkit/detail/lse_merge.hpp"  // row_lse, merge_row
#include "attnkit/detail/tile_traits.hpp"

namespace attnkit {
namespace detail {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per-row score transform before the softmax; the identity unless soft-capping is on.
struct score_transform {
    float softcap = 0.0f;  // > 0: s -> softcap * tanh(s / softcap), then to log2 units
};

// The update of one row vector of a panel (kTileRows keys apart in s) once its new max mx over
// the block is known (m_old: the max before it): s becomes p = 2^(s - mx) in place, l = l alpha
// + sum p, m = mx; returns alpha = 2^(m_old - mx), the factor for the output so far. The -inf
// guard of the header comment: a row with nothing visible yet computes against 0.
template <class A>
ATTNKIT_ALWAYS_INLINE simd::vfloat<A> online_softmax_update(float* s, index_t n_keys, const simd::vfloat<A>& m_old,
                                                            const simd::vfloat<A>& mx, float* m, float* l) {
    using V = simd::vfloat<A>;
    constexpr index_t RT = tile_traits<A>::kTileRows;
    const V mu = simd::select(mx == V(kNegInf), V(0.0f), mx);
    const V alpha = simd::exp2_nonpositive(m_old - mu);
    V sum(0.0f);
    for (index_t j = 0; j < n_keys; ++j) {
        const V p = simd::exp2_nonpositive(simd::loadu<A>(s + j * RT) - mu);
        simd::storeu(s + j * RT, p);
        sum += p;
    }
    simd::storeu(l, simd::fma(simd::loadu<A>(l), alpha, sum));
    simd::storeu(m, mx);
    return alpha;
}

// One panel (kTileRows rows) of an S^T tile [n_keys][kTileRows], for keys j0 .. j0 + n_keys.
// When `masked`, row r sees keys in [lo[r], hi[r]) only (every mask of the library gives each
// row one interval). On return the tile holds p = 2^(s - m_new), m and l are updated and
// alpha[n] is the factor to apply to the output accumulated so far. block_max[n] is each row's
// max over the raw block (from scores_panel); masks and soft-capping change it, and then it is
// taken again here.
template <class A>
ATTNKIT_NOINLINE void softmax_panel(float* st, index_t n_keys, index_t j0, bool masked, const float* lo,
                                    const float* hi, const score_transform& tf, float* m, float* l,
                                    const simd::vfloat<A>* block_max, simd::vfloat<A>* alpha) {
    using V = simd::vfloat<A>;
    constexpr int kNR = tile_traits<A>::kNR;
    constexpr index_t W = tile_traits<A>::kLanes;
    constexpr index_t RT = tile_traits<A>::kTileRows;
    const V neg_inf(kNegInf);
    ATTNKIT_UNROLL for (int n = 0; n < kNR; ++n) {
        float* s = st + n * W;
        if (tf.softcap > 0.0f) {
            const V inv(1.0f / tf.softcap), cap(tf.softcap * simd::kLog2e);
            for (index_t j = 0; j < n_keys; ++j) simd::storeu(s + j * RT, cap * simd::tanh(simd::loadu<A>(s + j * RT) * inv));
        }
        const V m_old = simd::loadu<A>(m + n * W);
        V mx = m_old;
        if (!masked && tf.softcap <= 0.0f) {
            mx = simd::max(block_max[n], mx);
        } else if (masked) {
            const V lov = simd::loadu<A>(lo + n * W), hiv = simd::loadu<A>(hi + n * W);
            for (index_t j = 0; j < n_keys; ++j) {
                const V jf(static_cast<float>(j0 + j));
                V x = simd::loadu<A>(s + j * RT);
                x = simd::select(jf < lov, neg_inf, simd::select(jf >= hiv, neg_inf, x));
                simd::storeu(s + j * RT, x);
                mx = simd::max(x, mx);
            }
        } else {
            for (index_t j = 0; j < n_keys; ++j) mx = simd::max(simd::loadu<A>(s + j * RT), mx);
        }
        alpha[n] = online_softmax_update<A>(s, n_keys, m_old, mx, m + n * W, l + n * W);
    }
}

// One row of the row kernel (row_kernel.hpp): s holds kRowBlockKeys scores of a block, the first
// n_keys of them keys, [a, z) the ones the row sees. On return s holds p = 2^(s - m_new) (0 for
// the keys it does not see), m and l are updated, and the factor for the output so far is
// returned. The same guards as the panels: a row with nothing visible yet computes against 0.
template <class A>
ATTNKIT_ALWAYS_INLINE float softmax_row(float* s, index_t n_keys, index_t a, index_t z, const score_transform& tf,
                                        float& m, float& l) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t BK = kRowBlockKeys;
    static_assert(BK % W == 0, "whole vectors per block");
    if (tf.softcap > 0.0f) {
        const float inv = 1.0f / tf.softcap, cap = tf.softcap * simd::kLog2e;
        for (index_t j = 0; j < n_keys; ++j) s[j] = cap * std::tanh(s[j] * inv);
    }
    for (index_t j = 0; j < a; ++j) s[j] = kNegInf;
    for (index_t j = z; j < BK; ++j) s[j] = kNegInf;
    V mv(m);
    for (index_t j = 0; j < BK; j += W) mv = simd::max(simd::loadu<A>(s + j), mv);
    const float mx = simd::hmax(mv);
    const float mu = mx == kNegInf ? 0.0f : mx;
    const float alpha = simd::exp2(simd::scalar_float(m - mu)).v;
    V sum(0.0f);
    for (index_t j = 0; j < BK; j += W) {
        const V e = simd::exp2_nonpositive(simd::loadu<A>(s + j) - V(mu));
        simd::storeu(s + j, e);
        sum += e;
    }
    l = l * alpha + simd::hsum(sum);
    m = mx;
    return alpha;
}

inline float row_inv_sum(float l) { return l == 0.0f ? 0.0f : 1.0f / l; }

}  // namespace detail
}  // namespace attnkit
