// Work partition of a forward call: row blocks over (batch, key/value head, query block), keys
// split into fixed pieces when there are too few blocks to feed the threads (decode), the pieces
// merged with their lse in a fixed order, attention sinks folded in last. Every decision depends
// on the shapes only, so any thread count gives bitwise identical results.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/row_kernel.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/detail/tile_kernel.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {

struct forward_outputs {
    view<float, 4> out;
    view<float, 3> lse;  // data == nullptr: not wanted
    const float* sinks = nullptr;
};

struct forward_plan {
    bool row_path = false;
    index_t n_pos = 1, n_qblocks = 0, n_items = 0, n_split = 1, split_len = 0;

    // Heavy blocks first: under a causal mask the last query blocks see the most keys, and
    // handing them out first keeps the threads' loads even at the end. The row kernel takes all
    // key/value heads at once so that it reads K and V front to back.
    row_block item(const attention_shape& s, index_t idx) const {
        const index_t n_hk = row_path ? 1 : s.heads_k;
        const index_t per_qb = s.batch * n_hk;
        const index_t qb = n_qblocks - 1 - idx / per_qb, rem = idx % per_qb;
        row_block rb;
        rb.b = rem / n_hk;
        rb.hk = row_path ? 0 : rem % n_hk;
        rb.n_hk = row_path ? s.heads_k : 1;
        rb.group = s.group();
        rb.i0 = qb * n_pos;
        rb.n_pos = std::min(n_pos, s.len_q - rb.i0);
        return rb;
    }
};

template <class A>
forward_plan make_plan(const attention_shape& s) {
    forward_plan pl;
    const index_t G = s.group();
    pl.row_path = s.len_q * G <= kRowKernelMaxRows<A>;
    pl.n_pos = pl.row_path ? s.len_q : std::max<index_t>(1, tile_traits<A>::block_rows(s.dim, s.dim_v) / G);
    pl.n_qblocks = (s.len_q + pl.n_pos - 1) / pl.n_pos;
    pl.n_items = s.batch * (pl.row_path ? 1 : s.heads_k) * pl.n_qblocks;
    if (pl.n_items < kTargetWorkItems && s.len_k >= 2 * kMinSplitKeys) {
        const index_t want = (kTargetWorkItems + pl.n_items - 1) / pl.n_items;
        pl.n_split = std::min(want, s.len_k / kMinSplitKeys);
    }
    const index_t bk = tile_traits<A>::kBlockKeys;
    pl.split_len = (((s.len_k + pl.n_split - 1) / pl.n_split + bk - 1) / bk) * bk;
    if (pl.split_len == 0) pl.split_len = bk;
    pl.n_split = std::max<index_t>(1, (s.len_k + pl.split_len - 1) / pl.split_len);
    return pl;
}

template <class A>
void attention_forward(const attention_problem& p, const forward_outputs& fo, thread_pool* pool) {
    const attention_shape& s = p.s;
    if (s.batch == 0 || s.len_q == 0) return;
    const forward_plan pl = make_plan<A>(s);
    const index_t Dv = s.dim_v;

    scratch_slots scratch;
    auto run = [&](const row_block& rb, index_t ks0, index_t ks1, auto&& emit) {
        scratch_lease buf(scratch);
        if (pl.row_path)
            row_kernel<A>(p, rb, ks0, ks1, buf.get(), emit);
        else
            tile_kernel<A>(p, rb, ks0, ks1, buf.get(), emit);
    };
    auto write_final = [&](const row_block& rb, index_t r, float* o, float lse) {
        const index_t h = rb.head(r), i = rb.pos(r);
        if (fo.sinks) merge_row(o, lse, nullptr, fo.sinks[h], Dv);  // a virtual key with zero value
        float* dst = fo.out.ptr(rb.b, i, h);
        std::copy(o, o + Dv, dst);
        if (fo.lse.data) fo.lse(rb.b, i, h) = lse;
    };

    if (pl.n_split == 1) {
        parallel_for(pool, pl.n_items, [&](index_t it) {
            const row_block rb = pl.item(s, it);
            run(rb, 0, s.len_k, [&](index_t r, float* o, float lse) { write_final(rb, r, o, lse); });
        });
        return;
    }

    // Split-KV: each piece writes its normalised partial, then rows merge pieces in order.
    const index_t rows_max = pl.n_pos * s.group() * (pl.row_path ? s.heads_k : 1);
    const index_t part_rows = pl.n_items * pl.n_split * rows_max;
    std::vector<float> part_o(static_cast<std::size_t>(part_rows * Dv));
    std::vector<float> part_lse(static_cast<std::size_t>(part_rows));
    parallel_for(pool, pl.n_items * pl.n_split, [&](index_t w) {
        const index_t it = w / pl.n_split, sp = w % pl.n_split;
        const row_block rb = pl.item(s, it);
        const index_t ks0 = sp * pl.split_len, ks1 = std::min(s.len_k, ks0 + pl.split_len);
        const index_t base = w * rows_max;
        run(rb, ks0, ks1, [&](index_t r, float* o, float lse) {
            std::copy(o, o + Dv, part_o.data() + (base + r) * Dv);
            part_lse[static_cast<std::size_t>(base + r)] = lse;
        });
    });
    parallel_for(pool, pl.n_items, [&](index_t it) {
        const row_block rb = pl.item(s, it);
        std::vector<float> o(static_cast<std::size_t>(Dv));
        for (index_t r = 0; r < rb.rows(); ++r) {
            const index_t first = it * pl.n_split * rows_max + r;
            std::copy_n(part_o.data() + first * Dv, Dv, o.data());
            float lse = part_lse[static_cast<std::size_t>(first)];
            for (index_t sp = 1; sp < pl.n_split; ++sp) {
                const index_t at = first + sp * rows_max;
                merge_row(o.data(), lse, part_o.data() + at * Dv, part_lse[static_cast<std::size_t>(at)], Dv);
            }
            write_final(rb, r, o.data(), lse);
        }
    });
}

}  // namespace detail
}  // namespace attnkit
