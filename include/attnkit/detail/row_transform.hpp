// Row transforms: what a variant of attention does to each block of scores, and how it finishes
// a row. The engine owns tiling, packing, masks, block skipping, the micro-kernels and the work
// partition: the tile kernel (tile_kernel.hpp: query rows in lanes) for prefill, the row kernel
// (row_kernel.hpp: head dim in lanes, one dot product per key) for decode and short queries, and
// the driver (attention_driver.hpp) that picks one and splits keys. A variant supplies one of
// these policies and nothing else, and both kernels take it. A policy is a small copyable struct
// with
//
//   kStateArrays       floats of running state per row, stored as that many arrays of `stride`
//                      rows (state + a * stride is array a; a panel's rows are consecutive)
//   init(state, stride)                     the state before the first key
//   transform<A>(st, n, j0, masked, lo, hi, state, stride, block_max, alpha)
//                      tile kernel: one panel's S^T tile [n][kTileRows] of keys j0.. -> the
//                      weights that values_panel multiplies into V; masked keys (outside
//                      [lo, hi)) get 0; alpha[n] is the factor for the output accumulated so far
//   row_weights<A>(s, n, a, z, state, stride) -> alpha
//                      row kernel: one row's scores of a block, s[0, n) (s has kRowBlockKeys
//                      floats, all writable) -> the weights of the keys [a, z) the row sees
//                      (a < z; the kernel never reads the others: it skips those keys), the
//                      state (state points at the row) updated; returns the factor for the
//                      output accumulated so far
//   emit_scale(state, stride), summary(state, stride)
//                      per row (state points at the row): the factor applied to its output when
//                      a work item emits it, and the one float that goes with it (lse, or a sum)
//   merge(o_a, sum_a, o_b, sum_b, dv)       folds the emitted rows of two disjoint key pieces
//   finish(o, sum, head, dv)                the last step before a row is written
//   rescaled()         the same policy with its weights scaled down by an exact power of two,
//                      far enough that sums which overflowed float fit; the driver computes the
//                      work items whose finished rows are not finite again with it and keeps
//                      its rows for those (the others keep their bits). Inputs that are not
//                      finite give the same rows both times.
//
// Softmax emits normalised rows with their lse; a polynomial transform (Taylor) emits raw sums,
// so its pieces merge by addition and its denominator (with eps) is applied once, in finish.
#pragma once

#include <algorithm>
#include <cmath>

#include "attnkit/detail/online_softmax.hpp"

namespace attnkit {
namespace detail {

// Online softmax with a running max and rescaling, in log2 units (online_softmax.hpp); sinks
// (one logit per query head, or null) are folded in as a zero-valued key at the end.
struct softmax_rows {
    static constexpr int kStateArrays = 2;  // m (running max, log2 units), l (running sum)

    score_transform tf;
    const float* sinks = nullptr;
    // > 0 (rescaled()): the weights p are multiplied by 2^-weight_shift after the running sum
    // took them, so the output accumulates sum p v 2^-shift, and emit_scale puts 2^shift back
    // after dividing by the sum: the output of a row whose sum over keys overflowed (values near
    // FLT_MAX) stays finite, and the lse is unchanged.
    int weight_shift = 0;

    void init(float* state, index_t stride) const {
        std::fill(state, state + stride, kNegInf);
        std::fill(state + stride, state + 2 * stride, 0.0f);
    }
    template <class A>
    ATTNKIT_ALWAYS_INLINE void transform(float* st, index_t n_keys, index_t j0, bool masked, const float* lo,
                                         const float* hi, float* state, index_t stride,
                                         const simd::vfloat<A>* block_max, simd::vfloat<A>* alpha) const {
        softmax_panel<A>(st, n_keys, j0, masked, lo, hi, tf, state, state + stride, block_max, alpha);
        if (weight_shift != 0) {
            const simd::vfloat<A> f(std::ldexp(1.0f, -weight_shift));
            for (index_t i = 0; i < n_keys * tile_traits<A>::kTileRows; i += simd::kLanes<A>)
                simd::storeu(st + i, simd::loadu<A>(st + i) * f);
        }
    }
    template <class A>
    ATTNKIT_ALWAYS_INLINE float row_weights(float* s, index_t n_keys, index_t a, index_t z, float* state,
                                            index_t stride) const {
        const float alpha = softmax_row<A>(s, n_keys, a, z, tf, state[0], state[stride]);
        if (weight_shift != 0) {
            const float f = std::ldexp(1.0f, -weight_shift);
            for (index_t j = a; j < z; ++j) s[j] *= f;
        }
        return alpha;
    }
    float emit_scale(const float* state, index_t stride) const {
        return weight_shift == 0 ? row_inv_sum(state[stride]) : std::ldexp(row_inv_sum(state[stride]), weight_shift);
    }
    float summary(const float* state, index_t stride) const { return row_lse(state[0], state[stride]); }
    void merge(float* o_a, float& lse_a, const float* o_b, float lse_b, index_t dim_v) const {
        merge_row(o_a, lse_a, o_b, lse_b, dim_v);
    }
    void finish(float* o, float& lse, index_t head, index_t dim_v) const {
        if (sinks) merge_row(o, lse, nullptr, sinks[head], dim_v);  // a virtual key with zero value
    }
    // Each weight is at most 1, so 2^-64 keeps any key count's sum of values below FLT_MAX.
    softmax_rows rescaled() const {
        softmax_rows r = *this;
        r.weight_shift = 64;
        return r;
    }
};

}  // namespace detail
}  // namespace attnkit
