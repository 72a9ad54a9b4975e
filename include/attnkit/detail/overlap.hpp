// Memory-overlap tests on views, for argument validation: an output that shares memory with an
// input (or with itself) is rejected by name before anything runs.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {

// Do the memory spans of two views intersect? A GEMM output must not share memory with its
// inputs (the product would read what it already overwrote), so entry points reject that with
// the argument names before anything runs. A span is [lowest, highest] element address.
template <class T, int N>
void memory_span(const view<T, N>& v, std::uintptr_t& lo, std::uintptr_t& hi) {
    index_t first = 0, last = 0;
    for (int i = 0; i < N; ++i) {
        const index_t reach = (v.dims[i] - 1) * v.strides[i];
        (reach < 0 ? first : last) += reach;
    }
    const auto base = reinterpret_cast<std::uintptr_t>(v.data);
    lo = base - static_cast<std::uintptr_t>(-first) * sizeof(T);
    hi = base + static_cast<std::uintptr_t>(last + 1) * sizeof(T);
}
template <class T, int N, class U, int M>
bool memory_overlaps(const view<T, N>& a, const view<U, M>& b) {
    if (a.size() == 0 || b.size() == 0) return false;
    std::uintptr_t alo, ahi, blo, bhi;
    memory_span(a, alo, ahi);
    memory_span(b, blo, bhi);
    return alo < bhi && blo < ahi;
}

// Does a view address some element twice (a stride smaller than the extent inside it)? Such an
// output would be written by two blocks at once. Sufficient test: with the dimensions of size
// > 1 sorted by |stride|, each |stride| must exceed the reach of the dimensions inside it.
template <class T, int N>
bool self_overlapping(const view<T, N>& v) {
    if (v.size() == 0) return false;
    std::array<int, N> order{};
    for (int i = 0; i < N; ++i) order[i] = i;
    auto mag = [&](int i) { return v.strides[i] < 0 ? -v.strides[i] : v.strides[i]; };
    std::sort(order.begin(), order.end(), [&](int a, int b) { return mag(a) < mag(b); });
    index_t reach = 0;  // largest offset reachable with the dimensions seen so far
    for (int k = 0; k < N; ++k) {
        const int i = order[k];
        if (v.dims[i] <= 1) continue;
        if (mag(i) <= reach) return true;
        reach += (v.dims[i] - 1) * mag(i);
    }
    return false;
}

}  // namespace detail
}  // namespace attnkit
