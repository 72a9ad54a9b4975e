// Masks as key ranges. Every mask of softmax_options is a predicate on (query position p, key j)
// with p = i + (Lk - Lq) (bottom-right alignment), and each one keeps an interval of keys, so
// the visible set of a position is one interval too. Kernels never build a mask tensor: from the
// rows' intervals they derive which key blocks a panel of rows skips, runs without mask tests
// (every row sees every key) or runs with per-element tests.
#pragma once

#include <algorithm>

#include "attnkit/config.hpp"

namespace attnkit {
namespace detail {

struct mask_params {
    index_t offset = 0;       // Lk - Lq: position of query i is i + offset
    bool causal = false;      // j <= p
    index_t window = -1;      // w >= 0: j >= p - w
    index_t chunk = 0;        // c > 0: j in p's block [c floor(p/c), c floor(p/c) + c)
    index_t key_len = 0;      // j < key_len (Lk, or key_lengths[b])
    // Where key 0 sits in a longer sequence (ring attention's blocks): the chunk mask's blocks
    // are aligned on that sequence's positions, p + key_origin and j + key_origin. Causal,
    // window and key_len compare p and j directly, so only chunk needs it.
    index_t key_origin = 0;

    static index_t floor_div(index_t a, index_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
    index_t chunk_begin(index_t p) const { return floor_div(p + key_origin, chunk) * chunk - key_origin; }

    // Keys [lo, hi) that any position in [p0, p1] may see; empty when hi <= lo.
    void key_range(index_t p0, index_t p1, index_t& lo, index_t& hi) const {
        lo = 0;
        hi = key_len;
        if (causal) hi = std::min(hi, p1 + 1);
        if (window >= 0) lo = std::max(lo, p0 - window);
        if (chunk > 0) {
            lo = std::max(lo, chunk_begin(p0));
            hi = std::min(hi, chunk_begin(p1) + chunk);
        }
        if (hi < lo) hi = lo;
    }

    // Keys [lo, hi) that position p sees: every mask is an interval, so their intersection is one.
    void interval(index_t p, index_t& lo, index_t& hi) const { key_range(p, p, lo, hi); }
};

}  // namespace detail
}  // namespace attnkit
