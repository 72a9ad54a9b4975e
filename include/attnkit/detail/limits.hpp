// Integer limits shared by every argument check (detail/check.hpp) and the model's configuration
// checks, in a header of their own so that those need not include the views and Eigen.
#pragma once

#include <limits>

#include "attnkit/config.hpp"

namespace attnkit {
namespace detail {

// a * b for sizes and offsets >= 0, false when it does not fit in int64. Every check that
// multiplies sizes goes through it: a wrapped product would pass the check and size a buffer.
inline bool mul_fits(index_t a, index_t b, index_t& r) {
    if (a != 0 && b > std::numeric_limits<index_t>::max() / a) return false;
    r = a * b;
    return true;
}

// Masks compare their bounds to key indices in float lanes, exact integers only below 2^24: the
// most keys (or positions) one call of the engine, or a cache a call reads, may hold.
constexpr index_t kMaxKeys = (index_t(1) << 24) - 1;

}  // namespace detail
}  // namespace attnkit
