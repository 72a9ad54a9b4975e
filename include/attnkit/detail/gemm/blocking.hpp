// Cache blocking of the packed GEMM (detail/gemm.hpp), BLIS-style: C [M, N] += A [M, K] B [K, N]
// in five loops around one register tile,
//
//   jc: N in slices of <= kMaxNc columns   the packed kc x nc block of B lives in the L3
//   pc: K in pieces of <= kMaxKc           B packed once per (jc, pc)
//   ic: M in slices of <= kMaxMc rows      the packed mc x kc block of A lives in the L2
//   jr: nc in steps of kNR columns         one kc x kNR micro-panel of B stays in the L1
//   ir: mc in steps of kMR rows            one kMR x kc micro-panel of A streams from the L2
//
// The register tile is the attention engine's (tile_traits: kMR broadcast rows x kNR vectors),
// and so is its micro-kernel (micro_kernels.hpp scores_tile): 6 x 16 floats on AVX2 (12
// accumulators of 16 registers), 12 x 32 on AVX-512 (24 of 32), 6 x 8 on SSE2.
//
// Sizes per level for a Zen 2 / Skylake-class core (32 KiB L1d, 512 KiB - 1 MiB L2, MiBs of
// L3): a B micro-panel of kc = 256 rows is 16 KiB on AVX2, half the L1 beside the A micro-panel
// (6 KiB). AVX-512's 32-column panel at kc = 192 is 24 KiB beside a 9 KiB A micro-panel: the
// L1 of a Zen 4 (32 KiB) nearly full, a Sapphire Rapids' (48 KiB) two thirds; against kc = 128
// (16 KiB) the longer chains halve the C tile's loads and stores per FMA, and kc = 256 (32
// KiB, the whole of a Zen 4's L1) gained little more (measured in docs/benchmarks.md). The A block is 144 KiB (mc = 144 rows
// at kc = 256, 192 at kc = 192), a quarter of the L2; nc = 4096 columns make the B block
// 4 - 6 MiB, in the L3.
//
// Every extent is cut into near-equal pieces (ceil(n / max) pieces of ceil(n / pieces), rounded
// to the tile) so that no piece is a sliver. K pieces depend on K only: every element of C is
// the same chain of FMAs in the same order (k ascending inside a piece, pieces added in order)
// wherever its tile sits, so the result does not depend on M, N, on how a caller cuts C into
// blocks, or on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/detail/tile_traits.hpp"

namespace attnkit {
namespace detail {

template <class A>
struct gemm_traits {
    static constexpr index_t kMR = tile_traits<A>::kMR;        // rows of a register tile
    static constexpr index_t kNR = tile_traits<A>::kTileRows;  // columns of a register tile
    // The B micro-panel kc x kNR: 16 KiB at kc = 256 up to 16 columns, 24 KiB at 192 for 32.
    static constexpr index_t kMaxKc = kNR <= 16 ? 256 : 6144 / kNR;
    // The A block mc x kc at most 144 KiB: 144 rows at kc = 256, 192 at 192 (multiples of kMR).
    static constexpr index_t kMaxMc = 36864 / kMaxKc;
    static constexpr index_t kMaxNc = 4096;  // a multiple of kNR for 8, 16 and 32
};

// The size of each of ceil(n / max_piece) near-equal pieces of n, rounded up to `unit`.
inline index_t gemm_piece(index_t n, index_t max_piece, index_t unit) {
    const index_t pieces = (n + max_piece - 1) / max_piece;
    const index_t size = (n + pieces - 1) / pieces;
    return (size + unit - 1) / unit * unit;
}

// Packed A and B blocks of one thread, kept for the thread's lifetime: a product is often one of
// many small ones (a 256-row block of an MLP, a decoder step), and allocating its 4 MiB B block
// each time would fault in and zero fresh pages on every call.
struct gemm_scratch {
    std::vector<float> a, b;
    // 64-byte aligned pointers to at least n floats; packed panels then start on cache lines.
    static float* aligned(std::vector<float>& v, index_t n) {
        const std::size_t need = static_cast<std::size_t>(n) + 16;
        if (v.size() < need) v.resize(need);
        const std::uintptr_t p = reinterpret_cast<std::uintptr_t>(v.data());
        return v.data() + ((64 - p % 64) % 64) / sizeof(float);
    }
};

inline gemm_scratch& thread_gemm_scratch() {
    static thread_local gemm_scratch s;
    return s;
}

}  // namespace detail
}  // namespace attnkit
