// The lse of a finished row, and the merge of two partial results over disjoint key sets
// (docs/variants.md section 1, "Partial merge"). Split-KV decode, attention sinks and
// attnkit::merge_partials all merge through merge_row, so there is one merge in the library.
//
// Why the weights are not exp(lse_a - lse), exp(lse_b - lse): the combined lse is rounded to
// float, and at |lse| = 1e4 a float step is 1e-3 (at 1e6, 0.06), so those two exponentials
// can miss summing to 1 by that much: outputs of v = 1 came out 0.9996 (1e4) and 0.975 (1e6).
// Only the difference d = lse_b - lse_a matters for the weights. With e = exp(-|d|) in (0, 1]:
//   w_small = e / (1 + e)     (the side with the smaller lse; full relative precision even
//                              when it is tiny, which a zero-valued sink side needs)
//   w_large = 1 - w_small     (w_small <= 1/2, so w_small + w_large rounds to exactly 1)
//   lse     = max(lse_a, lse_b) + log1p(e)
// and the result never depends on the size of lse itself.
#pragma once

#include <cmath>
#include <limits>

#include "attnkit/config.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {

// Natural-log lse of a row from its log2-domain running max m and sum l (online_softmax.hpp);
// l = 0 (no visible key) gives -inf; NaN stays NaN.
inline float row_lse(float m, float l) {
    return l == 0.0f ? -std::numeric_limits<float>::infinity() : (m + std::log2(l)) * simd::kLn2;
}

// Folds a partial result (o_b normalised over its keys, lse_b) into (o_a, lse_a). A side with
// lse = -inf contributes nothing; NaN in either lse gives NaN. A side with lse = +inf (scores
// past the float range) outweighs any finite one, and two sides at +inf count as a tie: equal
// weights 1/2 (the mean of the two outputs) and lse = +inf, as the limit of two equal large lse
// would give, where lse_b - lse_a itself would be NaN. o_b may be null for a side whose
// value is zero (an attention sink: a virtual key that only enters the denominator). The result
// does not depend on which side is a and which is b.
inline void merge_row(float* o_a, float& lse_a, const float* o_b, float lse_b, index_t dim_v) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    if (lse_b == kNegInf) return;
    if (lse_a == kNegInf) {
        for (index_t c = 0; c < dim_v; ++c) o_a[c] = o_b ? o_b[c] : 0.0f;
        lse_a = lse_b;
        return;
    }
    // d is NaN if either lse is NaN; e and both weights are then NaN too. Equal lse (both +inf
    // included) are a tie, d = 0.
    const float d = lse_a == lse_b ? 0.0f : lse_b - lse_a;
    const float e = std::exp(-std::fabs(d));
    const float w_small = e / (1.0f + e), w_large = 1.0f - w_small;
    // On a tie (d = 0) both weights are exactly 1/2, so swapping a and b changes nothing.
    const bool b_larger = d > 0.0f;
    const float fa = b_larger ? w_small : w_large, fb = b_larger ? w_large : w_small;
    for (index_t c = 0; c < dim_v; ++c) o_a[c] = fa * o_a[c] + (o_b ? fb * o_b[c] : 0.0f);
    lse_a = (b_larger ? lse_b : lse_a) + std::log1p(e);
}

}  // namespace detail
}  // namespace attnkit
