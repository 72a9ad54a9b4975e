// Compile-time tile sizes per architecture.
//
// The kernels put query rows in SIMD lanes and keys in registers (S^T = K Q^T): row statistics of
// the online softmax (max, sum, rescale) are then lane-wise vector operations with no horizontal
// reduction, and K and V elements are broadcast from dense row-major copies of their tiles (no
// transposing of K/V); only Q (once per query block) and the output (once per block) are
// transposed.
#pragma once

#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {

template <class A>
struct tile_traits {
    static constexpr index_t kLanes = simd::kLanes<A>;
    // AVX-512 has 32 vector registers, SSE/AVX2 16; the scalar path keeps everything in GPRs.
    static constexpr int kRegisters = kLanes >= 16 ? 32 : 16;
    // Micro tile: kNR row vectors x kMR keys (or kMR value columns) of accumulators. With 16
    // registers 6 x 2 = 12 accumulators + 2 row loads + 1 broadcast fit without spills, and each
    // broadcast feeds 2 FMAs, each row load 6: loads stay below the 2 FMA/cycle the core can retire.
    // With 32 registers 12 x 2 = 24 accumulators.
    static constexpr int kNR = 2;
    static constexpr int kMR = kRegisters == 32 ? 12 : 6;
    // Rows per micro tile: the unit of the packed Q^T, S^T and O^T panels.
    static constexpr index_t kTileRows = kNR * kLanes;
    // Rows per block: every K/V tile copied into the block's buffers is reused by all its rows,
    // so more rows make the copy cheaper, while the block's Q^T and O^T panels ((D + Dv) floats
    // per row) must stay in L2 beside the K/V tiles streaming through: kBlockPanelBytes of them,
    // half of a 512 KiB L2: 256 rows up to D = Dv = 128, 128 at 256, 64 at 512. Panels that
    // see none of a key block skip it, so large blocks cost nothing extra on a causal diagonal.
    static constexpr index_t kBlockPanelBytes = 256 * 1024;
    static constexpr index_t kMinBlockRows = 4 * kTileRows;
    static constexpr index_t kMaxBlockRows = 256;  // more rows ran slower (docs/benchmarks.md)
    static index_t block_rows(index_t dim, index_t dim_v) {
        const index_t rows = kBlockPanelBytes / (static_cast<index_t>(sizeof(float)) * (dim + dim_v));
        const index_t clamped = rows < kMinBlockRows ? kMinBlockRows : (rows > kMaxBlockRows ? kMaxBlockRows : rows);
        return clamped / kTileRows * kTileRows;
    }
    // Keys per block: a multiple of kMR; 96 amortises the per-block softmax bookkeeping (max,
    // rescale) over many keys while one panel's S^T (96 x kTileRows floats, 6 KiB) stays in L1.
    static constexpr index_t kBlockKeys = kMR * (96 / kMR);
};

// Decode and short queries: fewer rows than this per key/value head use the row kernel (head
// dim in lanes, one dot product per key), since a mostly empty row tile would waste lanes.
template <class A>
constexpr index_t kRowKernelMaxRows = tile_traits<A>::kTileRows / 2;

// Keys per block in the row kernel (row_kernel.hpp): the block's scores ([rows][keys]) stay in
// L1, and the policy's per-block bookkeeping (softmax: the max, the rescale of the output rows)
// is paid once per 64 keys.
constexpr index_t kRowBlockKeys = 64;

// Split-KV: aim for at least this many independent work items so that a few heads still feed
// every thread, but never split keys into pieces shorter than kMinSplitKeys (merging costs O(Dv)
// per row and piece). Both depend only on the shapes, never on the thread count, so results are
// bitwise identical for any pool.
constexpr index_t kTargetWorkItems = 64;
constexpr index_t kMinSplitKeys = 256;

}  // namespace detail
}  // namespace attnkit
