// An allocator for the large buffers attnkit owns and streams (the paged KV cache's pages):
// blocks of at least kHugePageBytes are aligned to that size and, on Linux, advised to the kernel
// as transparent huge pages (madvise MADV_HUGEPAGE); smaller ones come from operator new.
//
// Why: decode streams the whole cache once per step, a new 4 KiB page every 4 KiB of each
// stream, and Linux backs memory with 2 MiB pages only where a program asks for them when THP is
// in its default "madvise" mode. Decode through the cache measured faster over 2 MiB pages than
// over 4 KiB ones on the same rows (docs/benchmarks.md, "Huge pages"). The advice changes no
// value: a kernel that declines it (THP "never", another OS) leaves the same memory in 4 KiB
// pages. The cache touches every page when it is built (zeroed), so nothing is reserved that is
// not used anyway.
// PyTorch's CPU allocator has the same advice behind an environment switch
// (C10_THP_MEM_ALLOC_ENABLE); a cache's pages are large and fully used, so here it is always on.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <limits>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace attnkit {
namespace detail {

constexpr std::size_t kHugePageBytes = std::size_t(2) << 20;

// n bytes rounded up to whole huge pages.
inline std::size_t huge_page_round(std::size_t n) { return (n + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes; }

template <class T>
struct huge_page_allocator {
    using value_type = T;

    huge_page_allocator() = default;
    template <class U>
    huge_page_allocator(const huge_page_allocator<U>&) noexcept {}

    T* allocate(std::size_t n) {
        // n elements and the rounding up to whole huge pages must fit a size_t.
        if (n > (std::numeric_limits<std::size_t>::max() - kHugePageBytes) / sizeof(T)) throw std::bad_array_new_length();
        const std::size_t bytes = n * sizeof(T);
        if (bytes < kHugePageBytes) return static_cast<T*>(::operator new(bytes));
        const std::size_t whole = huge_page_round(bytes);
        void* p = std::aligned_alloc(kHugePageBytes, whole);
        if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
        // Advice only: a refusal (THP off, no memory for huge pages) leaves small pages.
        (void)::madvise(p, whole, MADV_HUGEPAGE);
#endif
        return static_cast<T*>(p);
    }
    void deallocate(T* p, std::size_t n) noexcept {
        if (n * sizeof(T) < kHugePageBytes)
            ::operator delete(p);
        else
            std::free(p);
    }

    template <class U>
    bool operator==(const huge_page_allocator<U>&) const noexcept {
        return true;
    }
    template <class U>
    bool operator!=(const huge_page_allocator<U>&) const noexcept {
        return false;
    }
};

}  // namespace detail
}  // namespace attnkit
