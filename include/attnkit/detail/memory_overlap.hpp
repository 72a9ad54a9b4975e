// Do two strided views share memory? The check every entry point runs on its outputs, so that an
// output laid over an input (or over another output, or over itself through a zero stride) is
// rejected with a clear error instead of giving wrong or racy results.
//
//   memory_region r = region_of("out", out_view);     // the bytes a view addresses
//   check_outputs_apart({out_r, lse_r}, {q_r, k_r, v_r});
//
// Inputs may overlap each other freely (fused QKV buffers, k and v the same tensor). An output
// may coincide with an input only when both carry a common bit in `in_place` and the two are the
// same view (same address, element size, shape and strides): the caller sets those bits where
// its kernel reads each input element before writing the output element at the same place.
//
// The test is exact for the layouts attention uses (dense tensors, BHSD permutations, slots of
// a fused buffer, which interleave with each other without touching): a view is split along its
// outermost dimension only where its address range meets the other's, down to contiguous rows.
// Layouts that would need more than kOverlapBudget splits are reported as overlapping (a
// conservative answer, never a wrong "apart").
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {

constexpr int kMaxRegionRank = 8;
constexpr long kOverlapBudget = 1L << 20;

// The bytes of a view: base + sum_k i_k stride_k + [0, run), i_k < dims_k, strides positive and
// in decreasing order, dimensions of size 1 dropped, the innermost contiguous dimensions folded
// into `run`. `span` is the distance from base to one past the last byte.
struct memory_region {
    const char* name = "";
    bool empty = true;
    bool zero_stride = false;  // a dimension of size > 1 with stride 0: elements coincide
    std::uintptr_t base = 0;
    std::uint64_t run = 0, span = 0;
    int rank = 0;
    std::array<std::uint64_t, kMaxRegionRank> dims{}, strides{};
    unsigned in_place = 0;  // see check_outputs_apart
    // Identity of the original view, for exact in-place aliasing.
    const void* data = nullptr;
    std::size_t elem = 0;
    std::array<index_t, kMaxRegionRank> view_dims{}, view_strides{};
    int view_rank = 0;

    // "[d0, d1, ...]" of the view, for messages: built only when one is thrown, so that a
    // valid call allocates nothing here.
    std::string shape() const {
        std::string s = "[";
        for (int i = 0; i < view_rank; ++i) {
            if (i) s += ", ";
            s += std::to_string(view_dims[static_cast<std::size_t>(i)]);
        }
        return s + "]";
    }

    std::uintptr_t lo() const { return base; }
    std::uintptr_t hi() const {  // one past the last byte, saturated at the top of the address space
        const std::uintptr_t h = base + static_cast<std::uintptr_t>(span);
        return h < base ? ~std::uintptr_t(0) : h;
    }
};

// Views must have passed check_layout (no negative dims, offsets within int64) first.
template <class T, int N>
memory_region region_of(const char* name, const view<T, N>& v) {
    static_assert(N <= kMaxRegionRank, "region_of: rank too large");
    memory_region r;
    r.name = name;
    r.data = static_cast<const void*>(v.data);
    r.elem = sizeof(T);
    r.view_rank = N;
    for (int i = 0; i < N; ++i) r.view_dims[i] = v.dims[i], r.view_strides[i] = v.strides[i];
    for (int i = 0; i < N; ++i)
        if (v.dims[i] == 0) return r;
    r.empty = false;
    // Negative strides: start from the lowest element instead, which gives the same set.
    std::uintptr_t base = reinterpret_cast<std::uintptr_t>(v.data);
    std::array<std::uint64_t, kMaxRegionRank> d{}, s{};  // kMaxRegionRank, not N: no false -Warray-bounds at N = 1
    int n = 0;
    for (int i = 0; i < N; ++i) {
        if (v.dims[i] == 1) continue;
        if (v.strides[i] == 0) {
            r.zero_stride = true;
            continue;
        }
        const index_t st = v.strides[i];
        const std::uint64_t mag = static_cast<std::uint64_t>(st < 0 ? -st : st) * sizeof(T);
        if (st < 0) base -= static_cast<std::uintptr_t>(mag * static_cast<std::uint64_t>(v.dims[i] - 1));
        d[n] = static_cast<std::uint64_t>(v.dims[i]);
        s[n] = mag;
        ++n;
    }
    // Decreasing strides (insertion sort: N is tiny).
    for (int i = 1; i < n; ++i)
        for (int j = i; j > 0 && s[j] > s[j - 1]; --j) std::swap(s[j], s[j - 1]), std::swap(d[j], d[j - 1]);
    // Fold contiguous innermost dimensions into the run.
    std::uint64_t run = sizeof(T);
    while (n > 0 && s[n - 1] == run) {
        run *= d[n - 1];
        --n;
    }
    r.base = base;
    r.run = run;
    r.rank = n;
    r.span = run;
    for (int i = 0; i < n; ++i) {
        r.dims[i] = d[i];
        r.strides[i] = s[i];
        r.span += (d[i] - 1) * s[i];
    }
    return r;
}

// True if two distinct indices of the view may address the same byte: a zero stride, or strides
// that are not nested (each at least the extent of the dimensions inside it). Nested strides are
// what every dense, permuted or sliced layout has; anything else is reported as overlapping.
inline bool region_overlaps_itself(const memory_region& r) {
    if (r.empty) return false;
    if (r.zero_stride) return true;
    std::uint64_t extent = r.run;
    for (int i = r.rank - 1; i >= 0; --i) {
        if (r.strides[i] < extent) return true;
        extent += (r.dims[i] - 1) * r.strides[i];
    }
    return false;
}

inline bool same_view(const memory_region& a, const memory_region& b) {
    return a.data == b.data && a.elem == b.elem && a.view_rank == b.view_rank && a.view_dims == b.view_dims &&
           a.view_strides == b.view_strides;
}

namespace overlap_impl {

inline bool apart(const memory_region& a, const memory_region& b) { return a.hi() <= b.lo() || b.hi() <= a.lo(); }

// The sub-region of x at index i of its outermost dimension.
inline memory_region outer_slice(const memory_region& x, std::uint64_t i) {
    memory_region s;
    s.empty = false;
    s.base = x.base + static_cast<std::uintptr_t>(i * x.strides[0]);
    s.run = x.run;
    s.rank = x.rank - 1;
    s.span = x.span - (x.dims[0] - 1) * x.strides[0];
    for (int k = 0; k < s.rank; ++k) s.dims[k] = x.dims[k + 1], s.strides[k] = x.strides[k + 1];
    return s;
}

inline bool meet(const memory_region& a, const memory_region& b, long& budget) {
    if (apart(a, b)) return false;
    if (a.rank == 0 && b.rank == 0) return true;  // two byte intervals that intersect
    if (--budget < 0) return true;                // too many pieces: answer conservatively
    // Split the wider one, along its outermost dimension, and visit only the slices that reach
    // into the other's address range.
    const bool split_a = b.rank == 0 || (a.rank > 0 && a.span >= b.span);
    const memory_region& x = split_a ? a : b;
    const memory_region& y = split_a ? b : a;
    const std::uint64_t s = x.strides[0];
    const std::uint64_t sub_span = x.span - (x.dims[0] - 1) * s;
    // Slice i covers [x.base + i s, x.base + i s + sub_span); it meets y iff it starts below
    // y.hi() and ends above y.lo().
    const std::uint64_t top = static_cast<std::uint64_t>(y.hi() - x.base - 1) / s;  // y.hi() > x.base here
    std::uint64_t first = 0;
    if (y.lo() > x.base && static_cast<std::uint64_t>(y.lo() - x.base) >= sub_span)
        first = (static_cast<std::uint64_t>(y.lo() - x.base) - sub_span) / s + 1;
    const std::uint64_t last = std::min<std::uint64_t>(top, x.dims[0] - 1);
    for (std::uint64_t i = first; i <= last; ++i)
        if (meet(outer_slice(x, i), y, budget)) return true;
    return false;
}

}  // namespace overlap_impl

// True if some byte is addressed by both views (or if that could not be ruled out cheaply).
inline bool regions_overlap(const memory_region& a, const memory_region& b) {
    if (a.empty || b.empty) return false;
    long budget = kOverlapBudget;
    return overlap_impl::meet(a, b, budget);
}

[[noreturn]] inline void fail_overlap(const memory_region& o, const memory_region& x) {
    throw std::invalid_argument(std::string("attnkit: ") + o.name + " " + o.shape() + " and " + x.name + " " +
                                x.shape() +
                                " overlap in memory: an output must not share memory with an input or "
                                "another output (only an exact in-place output, the very same view as "
                                "an input that allows it, may)");
}

// Throws std::invalid_argument unless every output is element-wise apart from every input, from
// every other output and from itself. An output may be the same view as an input when
// (output.in_place & input.in_place) != 0. Empty regions (a missing optional output) are skipped.
inline void check_outputs_apart(std::initializer_list<memory_region> outputs,
                                std::initializer_list<memory_region> inputs) {
    for (const memory_region& o : outputs) {
        if (region_overlaps_itself(o))
        {
            std::string st = "[";
            for (int i = 0; i < o.view_rank; ++i) st += (i ? ", " : "") + std::to_string(o.view_strides[i]);
            throw std::invalid_argument(std::string("attnkit: ") + o.name + ": strides " + st + "] of shape " +
                                        o.shape() +
                                        " make its elements overlap in memory (an output needs its own "
                                        "memory for every element; zero strides are for inputs only)");
        }
        for (const memory_region& x : inputs) {
            if ((o.in_place & x.in_place) != 0 && same_view(o, x)) continue;
            if (regions_overlap(o, x)) fail_overlap(o, x);
        }
    }
    for (auto a = outputs.begin(); a != outputs.end(); ++a)
        for (auto b = a + 1; b != outputs.end(); ++b)
            if (regions_overlap(*a, *b)) fail_overlap(*a, *b);
}

// A copy of r that may coincide with outputs/inputs sharing a bit of `bits`.
inline memory_region in_place(memory_region r, unsigned bits) {
    r.in_place = bits;
    return r;
}

}  // namespace detail
}  // namespace attnkit
