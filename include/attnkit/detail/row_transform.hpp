// Row transforms: what a variant of attention does to each block of scores, and how it finishes
// a row. The tile engine (tile_kernel.hpp, attention_driver.hpp) owns tiling, packing, masks,
// block skipping, the micro-kernels and the work partition; a variant supplies one of these
// policies and nothing else. A policy is a small copyable struct with
//
//   kStateArrays       floats of running state per row, stored as that many arrays of rows_pad
//                      (state + a * stride is array a; a panel's rows are consecutive)
//   kRowKernel         whether the driver may use row_kernel.hpp (softmax only) for short queries
//   init(state, stride)                     the state before the first key
//   transform<A>(st, n, j0, masked, lo, hi, state, stride, block_max, alpha)
//                      one panel's S^T tile [n][kTileRows] of keys j0.. -> the weights that
//                      values_panel multiplies into V; masked keys (outside [lo, hi)) get 0;
//                      alpha[n] is the factor for the output accumulated so far
//   emit_scale(state, stride), summary(state, stride)
//                      per row (state points at the row): the factor applied to its O^T when a
//                      work item emits it, and the one float that goes with it (lse, or a sum)
//   merge(o_a, sum_a, o_b, sum_b, dv)       folds the emitted rows of two disjoint key pieces
//   finish(o, sum, head, dv)                the last step before a row is written
//
// Softmax emits normalised rows with their lse; a polynomial transform (Taylor) emits raw sums,
// so its pieces merge by addition and its denominator (with eps) is applied once, in finish.
#pragma once

#include <algorithm>

#include "attnkit/detail/online_softmax.hpp"

namespace attnkit {
namespace detail {

// Online softmax with a running max and rescaling, in log2 units (online_softmax.hpp); sinks
// (one logit per query head, or null) are folded in as a zero-valued key at the end.
struct softmax_rows {
    static constexpr int kStateArrays = 2;  // m (running max, log2 units), l (running sum)
    static constexpr bool kRowKernel = true;

    score_transform tf;
    const float* sinks = nullptr;

    void init(float* state, index_t stride) const {
        std::fill(state, state + stride, kNegInf);
        std::fill(state + stride, state + 2 * stride, 0.0f);
    }
    template <class A>
    ATTNKIT_ALWAYS_INLINE void transform(float* st, index_t n_keys, index_t j0, bool masked, const float* lo,
                                         const float* hi, float* state, index_t stride,
                                         const simd::vfloat<A>* block_max, simd::vfloat<A>* alpha) const {
        softmax_panel<A>(st, n_keys, j0, masked, lo, hi, tf, state, state + stride, block_max, alpha);
    }
    float emit_scale(const float* state, index_t stride) const { return row_inv_sum(state[stride]); }
    float summary(const float* state, index_t stride) const { return row_lse(state[0], state[stride]); }
    void merge(float* o_a, float& lse_a, const float* o_b, float lse_b, index_t dim_v) const {
        merge_row(o_a, lse_a, o_b, lse_b, dim_v);
    }
    void finish(float* o, float& lse, index_t head, index_t dim_v) const {
        if (sinks) merge_row(o, lse, nullptr, sinks[head], dim_v);  // a virtual key with zero value
    }
};

}  // namespace detail
}  // namespace attnkit
