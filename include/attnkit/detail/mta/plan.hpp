// The shape-only decisions of one multi-token attention call: which passes run, block sizes,
// the convolution kernels packed for the SIMD loop, and the scratch layout of one work item.
// Everything depends on the shapes and options only, never on the thread count, which is what
// makes the results the same bits for any pool.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/mta/check.hpp"
#include "attnkit/detail/mta/params.hpp"
#include "attnkit/detail/mta/tile_ops.hpp"
#include "attnkit/detail/tile_traits.hpp"

namespace attnkit {
namespace detail {
namespace mta {

#ifndef ATTNKIT_MTA_CONV_BLOCK_ROWS
#define ATTNKIT_MTA_CONV_BLOCK_ROWS 128
#endif
#ifndef ATTNKIT_MTA_CONV_BLOCK_KEYS
#define ATTNKIT_MTA_CONV_BLOCK_KEYS 120
#endif
#ifndef ATTNKIT_MTA_BLOCK_ROWS
#define ATTNKIT_MTA_BLOCK_ROWS 64
#endif
#ifndef ATTNKIT_MTA_BLOCK_KEYS
#define ATTNKIT_MTA_BLOCK_KEYS 60
#endif
constexpr index_t kConvBlockRows = ATTNKIT_MTA_CONV_BLOCK_ROWS;
constexpr index_t kConvBlockKeys = ATTNKIT_MTA_CONV_BLOCK_KEYS;
constexpr index_t kBlockRows = ATTNKIT_MTA_BLOCK_ROWS;
constexpr index_t kBlockKeys = ATTNKIT_MTA_BLOCK_KEYS;

// Where each array of a work item sits in its scratch buffer: float offsets, each rounded up to
// 16 floats, sized for a full block. Query rows come in panels of kTileRows (RT) rows, in lanes;
// key counts are padded to kKeyPad. A block's outputs need Y for c_q,post - 1 more rows above
// them (the post convolution's halo), and Y needs X for c_q,pre - 1 more rows above those.
struct scratch_layout {
    index_t out_panels = 0;     // panels of output rows: block_rows / RT
    index_t y_panels = 0;       // panels of Y rows: the output rows and the post halo
    index_t x_panels = 0;       // panels of X rows: the Y rows and the pre halo
    index_t y_keys = 0;         // key rows of a Y (or P) panel, its key stride: a key block and the post halos
    index_t x_keys = 0;         // key rows of a wide X tile: y_keys and the pre halos
    index_t x_wide_stride = 0;  // floats per key row of a wide X tile: x_panels * RT
    index_t p_wide_stride = 0;  // floats per key row of a wide P tile: y_panels * RT
    index_t dv_pad = 0;         // Dv rounded up to kMR (the value micro-kernel's columns)

    // Offsets (floats) of the regions, what each holds and its shape:
    index_t q_transposed = 0;    // Q^T of every head, scaled                [H][x_panels][D][RT]
    index_t y = 0;               // Y, then P, of every head                 [H][y_panels][y_keys][RT]
    index_t y_mixed = 0;         // the other tile set of a head mixing      as y; empty without one
    index_t x_wide = 0;          // X of one convolution group, Mask0        [G_pre][x_keys][x_wide_stride]
    index_t p_wide = 0;          // P of one convolution group               [G_post][y_keys][p_wide_stride]
    index_t out_transposed = 0;  // O^T of every head                        [H][out_panels][dv_pad][RT]
    index_t row_max = 0;         // running max of each row (one pass)       [H][out_panels * RT]
    index_t row_sum = 0;         // running sum of each row (one pass)       [H][out_panels * RT]
    index_t row_lse = 0;         // final lse of each Y row (two passes)     [H][y_panels * RT]
    index_t score_panel = 0;     // one panel of raw scores                  [x_keys][RT]
    index_t k_tile = 0;          // K of one key/value head                  [x_keys + kMR][D]
    index_t v_tile = 0;          // V of one key/value head                  [y_keys + kMR][dv_pad]
    index_t out_rows = 0;        // the outputs as rows, then a mixed row    [block_rows + 2][H][Dv]
    index_t total = 0;           // floats of the whole buffer
};

struct plan {
    index_t B = 0, L = 0, H = 0, Hk = 0, group = 1, D = 0, Dv = 0;
    float q_scale = 1.0f;  // scale * log2(e): the whole pre-softmax pipeline is linear, so it runs in log2 units
    const params* w = nullptr;  // the options' weights and scalars (outlive the plan)
    conv_shape pre, post;
    std::vector<float> kq_pre_packed, kq_post_packed;  // the kernels as conv_panels reads them (pack_conv_weights)
    index_t kq_pre_packed_head = 0, kq_post_packed_head = 0;  // packed floats per output head
    bool head_pre = false, head_post = false;
    bool mix_outputs = false;  // post head mixing on the outputs (params::mix_outputs)
    bool two_pass = false;  // a post-softmax stage needs final probabilities: row statistics first

    // Halo rows (c_q - 1) and keys ((c_k - 1) / 2, each side) of the pre and post convolutions.
    index_t pre_halo_rows = 0, pre_halo_keys = 0, post_halo_rows = 0, post_halo_keys = 0;
    index_t block_rows = 0, block_keys = 0, n_qblocks = 0;
    scratch_layout at;

    index_t n_items() const { return B * n_qblocks; }
};

template <class A>
plan make_plan(const shape& ms, const params& w) {
    using TT = tile_traits<A>;
    constexpr index_t RT = TT::kTileRows;
    plan p;
    const attention_shape& s = ms.s;
    p.B = s.batch, p.L = s.len_q, p.H = s.heads, p.Hk = s.heads_k, p.group = s.group(), p.D = s.dim, p.Dv = s.dim_v;
    p.q_scale = resolve_scale(w.scale, s.dim) * simd::kLog2e;
    p.w = &w;
    p.pre = w.pre, p.post = w.post;
    if (p.pre.on()) {
        p.kq_pre_packed = pack_conv_weights<A>(w.kq_pre, p.H * p.pre.groups * p.pre.c_q, p.pre.c_k);
        p.kq_pre_packed_head = static_cast<index_t>(p.kq_pre_packed.size()) / p.H;
    }
    if (p.post.on()) {
        p.kq_post_packed = pack_conv_weights<A>(w.kq_post, p.H * p.post.groups * p.post.c_q, p.post.c_k);
        p.kq_post_packed_head = static_cast<index_t>(p.kq_post_packed.size()) / p.H;
    }
    p.head_pre = w.head_pre_on();
    p.head_post = w.head_post_on();
    p.mix_outputs = w.mix_outputs;
    p.two_pass = p.post.on() || (p.head_post && !p.mix_outputs);
    if (p.pre.on()) p.pre_halo_rows = p.pre.c_q - 1, p.pre_halo_keys = p.pre.key_halo();
    if (p.post.on()) p.post_halo_rows = p.post.c_q - 1, p.post_halo_keys = p.post.key_halo();

    // Query rows of all heads per item, keys per block (a multiple of kKeyPad). Each
    // convolution recomputes c_q - 1 halo rows and c_k - 1 halo keys of the scores, rounded up
    // to whole panels: with a convolution the blocks are larger so that the halos stay a small
    // fraction of the work, without one smaller blocks keep the tiles of all heads in L2.
    const bool conv = p.pre.on() || p.post.on();
    p.block_rows = std::min<index_t>(round_up(std::max<index_t>(p.L, 1), RT), std::max<index_t>(conv ? kConvBlockRows : kBlockRows, RT));
    p.block_keys = conv ? kConvBlockKeys : kBlockKeys;
    p.n_qblocks = (p.L + p.block_rows - 1) / p.block_rows;

    scratch_layout& a = p.at;
    a.out_panels = p.block_rows / RT;
    a.y_panels = p.two_pass ? (a.out_panels * RT + p.post_halo_rows + RT - 1) / RT : a.out_panels;
    a.x_panels = p.pre.on() ? (a.y_panels * RT + p.pre_halo_rows + RT - 1) / RT : a.y_panels;
    // Y keys of a block: the block rounded to the convolution's key blocks plus the post halo,
    // then room for rounding that to key blocks again (the pre convolution's output) and to kMR
    // (the score micro-kernel's output).
    a.y_keys = round_up(round_up(p.block_keys, kConvKeys<A>) + 2 * p.post_halo_keys, kKeyPad) + kKeyPad;
    a.x_keys = round_up(a.y_keys + 2 * p.pre_halo_keys, kKeyPad) + kKeyPad;
    a.x_wide_stride = a.x_panels * RT;
    a.p_wide_stride = a.y_panels * RT;
    a.dv_pad = round_up(p.Dv, TT::kMR);
    const index_t G1 = p.pre.on() ? p.pre.groups : 0, G2 = p.post.on() ? p.post.groups : 0;
    index_t end = 0;
    auto take = [&](index_t n) { const index_t r = end; end += round_up(n, 16); return r; };
    a.q_transposed = take(p.H * a.x_panels * RT * p.D);
    a.y = take(p.H * a.y_panels * a.y_keys * RT);
    a.y_mixed = take((p.head_pre || (p.head_post && !p.mix_outputs)) ? p.H * a.y_panels * a.y_keys * RT : 0);
    a.x_wide = take(G1 * a.x_keys * a.x_wide_stride);
    a.p_wide = take(G2 * a.y_keys * a.p_wide_stride);
    a.out_transposed = take(p.H * a.out_panels * RT * a.dv_pad);
    a.row_max = take(p.H * a.out_panels * RT);
    a.row_sum = take(p.H * a.out_panels * RT);
    a.row_lse = take(p.H * a.y_panels * RT);
    a.score_panel = take(a.x_keys * RT);
    a.k_tile = take((a.x_keys + TT::kMR) * p.D);
    a.v_tile = take((a.y_keys + TT::kMR) * a.dv_pad);
    a.out_rows = take(p.block_rows * p.H * p.Dv + 2 * p.H * p.Dv);
    a.total = end;
    return p;
}

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
