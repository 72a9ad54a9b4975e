// The shape-only decisions of one multi-token attention call: dense copies of the weights, which
// passes run, block sizes, and the scratch layout of one work item. Everything depends on the
// shapes and options only, never on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attnkit/detail/mta/check.hpp"
#include "attnkit/detail/mta/tile_ops.hpp"
#include "attnkit/detail/tile_traits.hpp"

namespace attnkit {
namespace detail {
namespace mta {

struct strided4 {  // a BSHD tensor's pointer and strides (head dim contiguous)
    const float* data = nullptr;
    index_t sb = 0, sl = 0, sh = 0;
    const float* row(index_t b, index_t l, index_t h) const { return data + b * sb + l * sl + h * sh; }
};

inline std::vector<float> dense(const view<const float, 4>& t) {
    std::vector<float> d;
    for (index_t a = 0; a < t.dims[0]; ++a)
        for (index_t b = 0; b < t.dims[1]; ++b)
            for (index_t c = 0; c < t.dims[2]; ++c)
                for (index_t e = 0; e < t.dims[3]; ++e) d.push_back(t(a, b, c, e));
    return d;
}
inline std::vector<float> dense(const view<const float, 2>& t) {
    std::vector<float> d;
    for (index_t a = 0; a < t.dims[0]; ++a)
        for (index_t b = 0; b < t.dims[1]; ++b) d.push_back(t(a, b));
    return d;
}
inline std::vector<float> dense(const view<const float, 1>& t) {
    std::vector<float> d;
    for (index_t a = 0; a < t.dims[0]; ++a) d.push_back(t(a));
    return d;
}

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

struct plan {
    index_t B = 0, L = 0, H = 0, Hk = 0, group = 1, D = 0, Dv = 0;
    float q_scale = 1.0f;  // scale * log2(e): the whole pre-softmax pipeline is linear, so it runs in log2 units
    conv_shape pre, post;
    std::vector<float> th_pre, th_post, w_pre, w_post, norm_w, gate_w;
    std::vector<float> pk_pre, pk_post;  // the kernels packed for conv_panels (pack_conv_weights)
    index_t pk_pre_head = 0, pk_post_head = 0;  // packed floats per output head
    bool head_pre = false, head_post = false;
    // Post head mixing commutes with the value product when it only mixes heads that read the
    // same value head (GQA/MQA groups): then it is applied to the outputs, O'_h = sum_g W_hg O_g.
    // With MHA every head has its own V, so off-diagonal mixing needs the probabilities.
    bool mix_outputs = false;
    bool two_pass = false;  // a post-softmax stage needs final probabilities: row statistics first
    float eps = 1e-5f, depth = 1.0f, gate_b = 0.0f;

    // Halo rows and keys of each convolution.
    index_t hq1 = 0, hk1 = 0, hq2 = 0, hk2 = 0;
    index_t block_rows = 0, block_keys = 0, n_qblocks = 0;
    // Scratch layout of a work item (floats).
    index_t npo = 0, npy = 0, npx = 0, nkp = 0, nkx = 0, rsx = 0, rsp = 0, dv_pad = 0;
    index_t o_qt = 0, o_y = 0, o_y2 = 0, o_xw = 0, o_pw = 0, o_ot = 0, o_m = 0, o_l = 0, o_lse = 0, o_st = 0,
            o_kp = 0, o_vp = 0, o_rows = 0, total = 0;

    index_t n_items() const { return B * n_qblocks; }
};

template <class A>
plan make_plan(const shape& ms, const mta_options& o) {
    using TT = tile_traits<A>;
    constexpr index_t RT = TT::kTileRows;
    plan p;
    const attention_shape& s = ms.s;
    p.B = s.batch, p.L = s.len_q, p.H = s.heads, p.Hk = s.heads_k, p.group = s.group(), p.D = s.dim, p.Dv = s.dim_v;
    p.q_scale = resolve_scale(o.scale, s.dim) * simd::kLog2e;
    p.pre = ms.pre, p.post = ms.post;
    if (p.pre.on()) {
        p.th_pre = dense(o.kq_pre);
        p.pk_pre = pack_conv_weights<A>(p.th_pre, p.H * p.pre.groups * p.pre.c_q, p.pre.c_k);
        p.pk_pre_head = static_cast<index_t>(p.pk_pre.size()) / p.H;
    }
    if (p.post.on()) {
        p.th_post = dense(o.kq_post);
        p.pk_post = pack_conv_weights<A>(p.th_post, p.H * p.post.groups * p.post.c_q, p.post.c_k);
        p.pk_post_head = static_cast<index_t>(p.pk_post.size()) / p.H;
    }
    p.head_pre = o.head_pre.data != nullptr;
    p.head_post = o.head_post.data != nullptr;
    if (p.head_pre) p.w_pre = dense(o.head_pre);
    if (p.head_post) {
        p.w_post = dense(o.head_post);
        p.mix_outputs = true;
        for (index_t h = 0; h < p.H; ++h)
            for (index_t g = 0; g < p.H; ++g)
                if (h / p.group != g / p.group && p.w_post[static_cast<std::size_t>(h * p.H + g)] != 0.0f)
                    p.mix_outputs = false;
    }
    if (o.norm_weight.data) p.norm_w = dense(o.norm_weight);
    if (o.gate_weight.data) p.gate_w = dense(o.gate_weight);
    p.eps = o.norm_eps;
    p.gate_b = o.gate_bias;
    p.depth = o.norm_layer >= 0 ? static_cast<float>(0.2 + 0.6 * std::exp(-0.3 * static_cast<double>(o.norm_layer))) : 1.0f;
    p.two_pass = p.post.on() || (p.head_post && !p.mix_outputs);
    if (p.pre.on()) p.hq1 = p.pre.c_q - 1, p.hk1 = p.pre.key_halo();
    if (p.post.on()) p.hq2 = p.post.c_q - 1, p.hk2 = p.post.key_halo();

    // Query rows of all heads per item, keys per block (a multiple of kKeyPad). Each
    // convolution recomputes c_q - 1 halo rows and c_k - 1 halo keys of the scores, rounded up
    // to whole panels: with a convolution the blocks are larger so that the halos stay a small
    // fraction (measured at H = 16, D = 96: 128 x 120 against 64 x 60), without one smaller
    // blocks keep the tiles of all heads in L2.
    const bool conv = p.pre.on() || p.post.on();
    p.block_rows = std::min<index_t>(round_up(std::max<index_t>(p.L, 1), RT), std::max<index_t>(conv ? kConvBlockRows : kBlockRows, RT));
    p.block_keys = conv ? kConvBlockKeys : kBlockKeys;
    p.n_qblocks = (p.L + p.block_rows - 1) / p.block_rows;

    p.npo = p.block_rows / RT;
    p.npy = p.two_pass ? (p.npo * RT + p.hq2 + RT - 1) / RT : p.npo;
    p.npx = p.pre.on() ? (p.npy * RT + p.hq1 + RT - 1) / RT : p.npy;
    // Y keys of a block: the block rounded to the convolution's key blocks plus the post halo,
    // then room for rounding that to key blocks again (the pre convolution's output) and to kMR
    // (the score micro-kernel's output).
    p.nkp = round_up(round_up(p.block_keys, kConvKeys<A>) + 2 * p.hk2, kKeyPad) + kKeyPad;
    p.nkx = round_up(p.nkp + 2 * p.hk1, kKeyPad) + kKeyPad;
    p.rsx = p.npx * RT;
    p.rsp = p.npy * RT;
    p.dv_pad = round_up(p.Dv, TT::kMR);
    const index_t G1 = p.pre.on() ? p.pre.groups : 0, G2 = p.post.on() ? p.post.groups : 0;
    index_t at = 0;
    auto take = [&](index_t n) { const index_t r = at; at += round_up(n, 16); return r; };
    p.o_qt = take(p.H * p.npx * RT * p.D);
    p.o_y = take(p.H * p.npy * p.nkp * RT);
    p.o_y2 = take((p.head_pre || (p.head_post && !p.mix_outputs)) ? p.H * p.npy * p.nkp * RT : 0);
    p.o_xw = take(G1 * p.nkx * p.rsx);
    p.o_pw = take(G2 * p.nkp * p.rsp);
    p.o_ot = take(p.H * p.npo * RT * p.dv_pad);
    p.o_m = take(p.H * p.npo * RT);
    p.o_l = take(p.H * p.npo * RT);
    p.o_lse = take(p.H * p.npy * RT);
    p.o_st = take(p.nkx * RT);
    p.o_kp = take((p.nkx + TT::kMR) * p.D);
    p.o_vp = take((p.nkp + TT::kMR) * p.dv_pad);
    p.o_rows = take(p.block_rows * p.H * p.Dv + 2 * p.H * p.Dv);
    p.total = at;
    return p;
}

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
