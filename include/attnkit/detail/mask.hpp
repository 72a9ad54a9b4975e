// Masks as block ranges. Every mask of softmax_options is a predicate on (query position p, key j)
// with p = i + (Lk - Lq) (bottom-right alignment); the visible set is the intersection of the
// masks that are on. Kernels never build a mask tensor: for a block of query positions they ask
// for the key range that can be visible at all, and for each key block whether it is fully
// visible (no per-element test), partially visible, or (outside the range) skipped.
#pragma once

#include <algorithm>

#include "attnkit/config.hpp"

namespace attnkit {
namespace detail {

enum class block_kind { full, partial, empty };

struct mask_params {
    index_t offset = 0;       // Lk - Lq: position of query i is i + offset
    bool causal = false;      // j <= p
    index_t window = -1;      // w >= 0: j >= p - w
    index_t chunk = 0;        // c > 0: j in p's block [c floor(p/c), c floor(p/c) + c)
    index_t key_len = 0;      // j < key_len (Lk, or key_lengths[b])

    static index_t floor_div(index_t a, index_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
    index_t chunk_begin(index_t p) const { return floor_div(p, chunk) * chunk; }

    bool visible(index_t p, index_t j) const {
        if (j >= key_len || j < 0) return false;
        if (causal && j > p) return false;
        if (window >= 0 && j < p - window) return false;
        if (chunk > 0 && (j < chunk_begin(p) || j >= chunk_begin(p) + chunk)) return false;
        return true;
    }

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

    // Keys [j0, j1) against positions [p0, p1] (both non-empty).
    block_kind classify(index_t p0, index_t p1, index_t j0, index_t j1) const {
        index_t lo, hi;
        key_range(p0, p1, lo, hi);
        if (j1 <= lo || j0 >= hi) return block_kind::empty;
        // Full when every position sees every key: intersect the per-position ranges instead.
        index_t flo = 0, fhi = key_len;
        if (causal) fhi = std::min(fhi, p0 + 1);
        if (window >= 0) flo = std::max(flo, p1 - window);
        if (chunk > 0) {
            if (chunk_begin(p0) != chunk_begin(p1)) return block_kind::partial;
            flo = std::max(flo, chunk_begin(p0));
            fhi = std::min(fhi, chunk_begin(p0) + chunk);
        }
        return (j0 >= flo && j1 <= fhi) ? block_kind::full : block_kind::partial;
    }
};

}  // namespace detail
}  // namespace attnkit
