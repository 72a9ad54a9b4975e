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
// two: start to start, a tensor's size rounded up to whole pages plus kGap (4 MiB + 4 KiB). Each
// starts at the same offset into its page as the caller asks, so that the rows meet cache lines
// (and the kernels' streamed stores their alignment) exactly as in the allocation it stands in
// for. The memory is touched once, in address order.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "common/machine.hpp"

namespace attnkit_bench {

class spaced_arena {
public:
    static constexpr std::size_t kPage = 4096;
    static constexpr std::size_t kGap = (std::size_t(4) << 20) + kPage;

    // One block for tensors of the given float counts, in that order, each `offset` bytes
    // (< kPage) into a page.
    spaced_arena(const std::vector<std::size_t>& floats, std::size_t offset) {
        offset %= kPage;
        std::size_t total = 0;
        for (std::size_t n : floats) total += stride(n);  // kGap leaves room for the offset
        buf_.reset(static_cast<float*>(std::aligned_alloc(kPage, total)));
        if (!buf_) throw std::bad_alloc();
        char* p = reinterpret_cast<char*>(buf_.get());
        std::memset(p, 0, total);
        for (std::size_t n : floats) {
            starts_.push_back(reinterpret_cast<float*>(p + offset));
            p += stride(n);
        }
    }

    float* operator[](std::size_t i) const { return starts_[i]; }

private:
    static std::size_t stride(std::size_t n) { return (n * sizeof(float) + kPage - 1) / kPage * kPage + kGap; }
    float_buffer buf_;
    std::vector<float*> starts_;
};

}  // namespace attnkit_bench
