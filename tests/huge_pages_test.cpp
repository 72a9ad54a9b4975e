// The huge-page allocator (detail/huge_pages.hpp) and the paged KV cache's use of it: blocks of
// at least 2 MiB come back aligned to 2 MiB (the granule the kernel's transparent huge pages
// need), smaller ones from operator new; a vector over it value-initialises and keeps its
// contents like any other; kv_cache's pages sit in such blocks. Whether the kernel grants huge
// pages is the system's choice (THP "never" is legal) and is not tested; what the advice may
// never change, the values, is.
#include "attnkit/detail/huge_pages.hpp"
#include "attnkit/kv_cache.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace {

using attnkit::index_t;
using attnkit::detail::huge_page_allocator;
using attnkit::detail::kHugePageBytes;

bool aligned_to_huge_page(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kHugePageBytes == 0; }

TEST(huge_pages, large_blocks_are_aligned_and_keep_their_values) {
    // Sizes around the threshold and a few pages past it, in elements of 4 bytes.
    for (std::size_t bytes : {kHugePageBytes, kHugePageBytes + 4, 3 * kHugePageBytes - 4, 5 * kHugePageBytes}) {
        const std::size_t n = bytes / sizeof(float);
        std::vector<float, huge_page_allocator<float>> x(n, 0.0f);
        EXPECT_TRUE(aligned_to_huge_page(x.data())) << bytes << " bytes";
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(x[i], 0.0f) << "element " << i << " of " << n;
        for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1009);
        std::vector<float, huge_page_allocator<float>> y = x;  // a copy is a second block
        EXPECT_TRUE(aligned_to_huge_page(y.data()));
        for (std::size_t i = 0; i < n; i += 997) ASSERT_EQ(y[i], static_cast<float>(i % 1009));
        ASSERT_EQ(y[n - 1], static_cast<float>((n - 1) % 1009));
    }
}

TEST(huge_pages, small_blocks_come_from_operator_new) {
    // Below the threshold the allocator must work for any size, growth included.
    std::vector<std::int8_t, huge_page_allocator<std::int8_t>> x;
    for (int i = 0; i < 100000; ++i) x.push_back(static_cast<std::int8_t>(i % 127));
    for (int i = 0; i < 100000; i += 777) ASSERT_EQ(x[static_cast<std::size_t>(i)], static_cast<std::int8_t>(i % 127));
    // Growing across the threshold moves the contents into an aligned block.
    std::vector<double, huge_page_allocator<double>> d(10, 1.5);
    d.resize(kHugePageBytes / sizeof(double) + 1, 2.5);
    EXPECT_TRUE(aligned_to_huge_page(d.data()));
    EXPECT_EQ(d[9], 1.5);
    EXPECT_EQ(d[10], 2.5);
    EXPECT_EQ(d.back(), 2.5);
}

TEST(huge_pages, kv_cache_pages_sit_in_huge_page_blocks) {
    // 64 pages of 64 rows x 8 heads x 128 floats: 16 MiB of K per layer (and of V).
    attnkit::kv_cache_config cfg;
    cfg.layers = 2;
    cfg.heads_kv = 8;
    cfg.dim = 128;
    cfg.pages = 64;
    cfg.page_rows = 64;
    attnkit::kv_cache<float> cache(cfg);
    for (index_t layer = 0; layer < cfg.layers; ++layer) {
        EXPECT_TRUE(aligned_to_huge_page(cache.k_pages(layer).data)) << "layer " << layer;
        EXPECT_TRUE(aligned_to_huge_page(cache.v_pages(layer).data)) << "layer " << layer;
    }
    // int8 pages: values and the scales beside them (the scales of this shape are 128 KiB,
    // below the threshold, and are not checked for alignment).
    attnkit::kv_cache<std::int8_t> cache8(cfg);
    EXPECT_TRUE(aligned_to_huge_page(cache8.k_pages(0).values().data));
}

}  // namespace
