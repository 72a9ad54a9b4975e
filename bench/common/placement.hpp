// attnkit benchmarks: where a benchmark's large tensors sit relative to each other.
//
// Tensors of the same size allocated one after another end up one size plus one 4 KiB page
// apart (glibc serves each from its own mmap, placed just below the previous one; Eigen and
// PyTorch's CPU allocator both go through malloc). When that size is a large power of two (a
// [1, 32768, 8, 128] float tensor is 128 MiB), row j of every tensor lies a whole number of
// 2^27 bytes plus a page or so from row j of the others. On the Zen 3 VM this project measures
// on, a loop that reads several tensors at the same index then runs about 20% slower than with
// the tensors placed a few MiB further apart: a plain five-tensor read loop as much as the
// self-gating backward (docs/benchmarks.md, "Where the tensors sit"). Nothing in the loop is
// different; the cost comes from the addresses alone, and the 8-stream read probe, whose
// streams are 128 KiB apart, does not pay it.
//
// spaced_arena places tensors so that no two starts are near a multiple of a large power of
// two: each starts 4 MiB + 4 KiB (plus its size rounded up to a page) past the previous one, at
// the same offset into its page as Eigen's own allocation (32 bytes), so the rows meet cache
// lines exactly as they do in an Eigen::Tensor. The memory is touched once, in address order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace attnkit_bench {

class spaced_arena {
public:
    static constexpr std::size_t kPage = 4096;
    static constexpr std::size_t kGap = (std::size_t(4) << 20) + kPage;
    static constexpr std::size_t kOffset = 32;  // into the first page, as Eigen's aligned malloc

    // One block for tensors of the given float counts, in that order.
    explicit spaced_arena(const std::vector<std::size_t>& floats) {
        std::size_t total = kPage;
        for (std::size_t n : floats) total += round_up(n * sizeof(float) + kOffset) + kGap;
        base_ = static_cast<char*>(std::aligned_alloc(kPage, total));
        if (!base_) throw std::bad_alloc();
        std::memset(base_, 0, total);
        char* p = base_;
        for (std::size_t n : floats) {
            starts_.push_back(reinterpret_cast<float*>(p + kOffset));
            p += round_up(n * sizeof(float) + kOffset) + kGap;
        }
    }
    spaced_arena(const spaced_arena&) = delete;
    spaced_arena& operator=(const spaced_arena&) = delete;
    ~spaced_arena() { std::free(base_); }

    float* operator[](std::size_t i) const { return starts_[i]; }

private:
    static std::size_t round_up(std::size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }
    char* base_ = nullptr;
    std::vector<float*> starts_;
};

}  // namespace attnkit_bench
