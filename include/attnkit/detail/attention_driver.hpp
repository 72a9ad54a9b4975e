// Work partition of a forward call: row blocks over (batch, key/value head, query block), keys
// split into fixed pieces when there are too few blocks to feed the threads (decode), the pieces
// merged in a fixed order by the row policy (softmax: with their lse; Taylor: by addition), the
// policy's finish (sinks, Taylor's denominator) last. Every decision depends on the shapes only,
// so any thread count gives bitwise identical results.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/function_ref.hpp"
#include "attnkit/detail/row_kernel.hpp"
#include "attnkit/detail/row_transform.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/detail/tile_kernel.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {

struct forward_outputs {
    view<float, 4> out;
    view<float, 3> lse;  // data == nullptr: not wanted
    const float* sinks = nullptr;  // softmax overload of attention_forward: one logit per head
    // Value sets (attention_problem::n_sets): set t writes at out + t * out_set_stride (and lse).
    index_t out_set_stride = 0, lse_set_stride = 0;
    // Packed rows (varlen, paged batches): item b's rows of out and lse start at sequence index
    // out_start[b] of batch 0.
    const std::int64_t* out_start = nullptr;
};

struct forward_plan {
    bool row_path = false;
    index_t heads_per_item = 1;  // key/value heads of a row block: all of them on the row path
    index_t n_pos = 1, n_qblocks = 0, n_items = 0, n_split = 1, split_len = 0;

    // Heavy blocks first: under a causal mask the last query blocks see the most keys, and
    // handing them out first keeps the threads' loads even at the end. The row kernel takes all
    // key/value heads at once so that it reads token-major K and V front to back, one head at a
    // time for short head-major rows (row_kernel.hpp).
    row_block item(const attention_shape& s, index_t idx) const {
        const index_t n_hk = s.heads_k / heads_per_item;  // row blocks per batch item and query block
        const index_t per_qb = s.batch * n_hk;
        const index_t qb = n_qblocks - 1 - idx / per_qb, rem = idx % per_qb;
        row_block rb;
        rb.b = rem / n_hk;
        rb.hk = rem % n_hk * heads_per_item;
        rb.n_hk = heads_per_item;
        rb.group = s.group();
        rb.i0 = qb * n_pos;
        rb.n_pos = std::min(n_pos, s.len_q - rb.i0);
        return rb;
    }
};

// allow_row_path: the row kernel may take the call (one value set); head_per_row_block: it takes
// one key/value head per call (short head-major rows), with the keys split as for all heads
// at once, so that a row's pieces, and its bits, do not depend on it. n_sets value sets share
// each row block. The block is sized as for one set: a panel's O^T of every set is touched one
// panel at a time, so the sets' panels need not sit in L2 together, while a bigger block reuses
// every K tile and the sets' V tiles over more rows. An item carries n_sets items' work and its
// split-KV partials are n_sets times larger, so it counts n_sets times towards kTargetWorkItems.
template <class A>
forward_plan make_plan(const attention_shape& s, bool allow_row_path = true, index_t n_sets = 1,
                       bool head_per_row_block = false) {
    forward_plan pl;
    const index_t G = s.group();
    pl.row_path = allow_row_path && s.len_q * G <= kRowKernelMaxRows<A>;
    pl.heads_per_item = pl.row_path && !head_per_row_block ? s.heads_k : 1;
    pl.n_pos = pl.row_path ? s.len_q : std::max<index_t>(1, tile_traits<A>::block_rows(s.dim, s.dim_v) / G);
    pl.n_qblocks = (s.len_q + pl.n_pos - 1) / pl.n_pos;
    pl.n_items = s.batch * (s.heads_k / pl.heads_per_item) * pl.n_qblocks;
    const index_t split_items = s.batch * (pl.row_path ? 1 : s.heads_k) * pl.n_qblocks;
    if (split_items * n_sets < kTargetWorkItems && s.len_k >= 2 * kMinSplitKeys) {
        const index_t want = (kTargetWorkItems + split_items * n_sets - 1) / (split_items * n_sets);
        pl.n_split = std::min(want, s.len_k / kMinSplitKeys);
    }
    // Pieces start on the kernel's block grid: the row kernel's blocks never straddle a page of
    // a paged cache (row_kernel.hpp), and a paged call splits exactly as a contiguous one.
    const index_t bk = pl.row_path ? kRowBlockKeys : tile_traits<A>::kBlockKeys;
    pl.split_len = (((s.len_k + pl.n_split - 1) / pl.n_split + bk - 1) / bk) * bk;
    if (pl.split_len == 0) pl.split_len = bk;
    pl.n_split = std::max<index_t>(1, (s.len_k + pl.split_len - 1) / pl.split_len);
    return pl;
}

// One forward call of any row policy (row_transform.hpp) over every value set of p.
template <class A, class Policy, class KVT, class QT>
ATTNKIT_NOINLINE void attention_forward(const basic_attention_problem<KVT, QT>& p, const Policy& pol,
                                        const forward_outputs& fo, thread_pool* pool) {
    const attention_shape& s = p.s;
    if (s.batch == 0 || s.len_q == 0) return;
    // The row kernel (row_kernel.hpp) takes one value set; the tile kernel any number.
    const index_t n_sets = p.n_sets;
    const forward_plan pl = make_plan<A>(s, n_sets == 1, n_sets, short_head_major_rows(p));
    const index_t Dv = s.dim_v;

    // Item it's rows: a varlen or paged batch's item has its own query count (rows past it do
    // not exist; an item with none is skipped).
    auto item = [&](index_t it) {
        row_block rb = pl.item(s, it);
        rb.n_pos = std::max<index_t>(0, std::min(rb.n_pos, p.query_len(rb.b) - rb.i0));
        return rb;
    };
    // emit(set, r, o, summary) for every row of the item, under policy `rp` (pol or its rescaled()).
    // One instantiation of each kernel serves every callback below (function_ref.hpp).
    using emit_fn = function_ref<void(index_t, index_t, float*, float)>;
    auto run = [&](const Policy& rp, const row_block& rb, index_t ks0, index_t ks1, emit_fn emit) {
        scratch_lease<> buf;
        if (pl.row_path)
            row_kernel<A>(p, rp, rb, ks0, ks1, buf.get(), [&](index_t r, float* o, float sum) { emit(0, r, o, sum); });
        else
            tile_kernel<A>(p, rp, rb, ks0, ks1, buf.get(), emit);
    };
    auto write = [&](const row_block& rb, index_t set, index_t r, const float* o, float summary) {
        const index_t h = rb.head(r);
        const index_t b = fo.out_start ? 0 : rb.b, i = fo.out_start ? fo.out_start[rb.b] + rb.pos(r) : rb.pos(r);
        std::copy(o, o + Dv, fo.out.ptr(b, i, h) + set * fo.out_set_stride);
        if (fo.lse.data) fo.lse.ptr(b, i, h)[set * fo.lse_set_stride] = summary;
    };
    // A finished row that is not finite (an element, or its summary: a Taylor sum past FLT_MAX)
    // is held back: its item runs again with the rescaled policy (row_transform.hpp), and the
    // row is written from both runs (combine). The item's query rows are intact then: out may
    // be q, and the held rows have not been written. A -inf lse (no visible key) is finite here.
    auto finite_summary = [](float summary) { return std::isfinite(summary) || summary == kNegInf; };
    auto finite = [&](const float* o, float summary) {
        if (!finite_summary(summary)) return false;
        for (index_t c = 0; c < Dv; ++c)
            if (!std::isfinite(o[c])) return false;
        return true;
    };
    // Held rows of an item: (set, r), the first run's row and summary.
    struct held_rows {
        std::vector<std::pair<index_t, index_t>> at;
        std::vector<float> o, summary;
        void add(index_t set, index_t r, const float* x, float sum, index_t dv) {
            at.emplace_back(set, r);
            o.insert(o.end(), x, x + dv);
            summary.push_back(sum);
        }
        std::ptrdiff_t find(index_t set, index_t r) const {
            const auto i = std::find(at.begin(), at.end(), std::make_pair(set, r));
            return i == at.end() ? -1 : i - at.begin();
        }
    };
    // The first run's row where it is finite, the rescaled run's elsewhere: with a summary that
    // is not finite (the row's sum overflowed) all of the second; else the elements that are not
    // (values near FLT_MAX), so that an element made NaN by an input keeps the first run's row
    // around it bit for bit.
    auto combine = [&](const held_rows& h, std::ptrdiff_t i, float* o, float& summary) {
        const float* first = h.o.data() + i * Dv;
        const float first_sum = h.summary[static_cast<std::size_t>(i)];
        if (!finite_summary(first_sum)) return;
        for (index_t c = 0; c < Dv; ++c)
            if (std::isfinite(first[c])) o[c] = first[c];
        summary = first_sum;
    };

    if (pl.n_split == 1) {
        parallel_for(pool, pl.n_items, [&](index_t it) {
            const row_block rb = item(it);
            if (rb.n_pos == 0) return;
            held_rows held;
            run(pol, rb, 0, s.len_k, [&](index_t set, index_t r, float* o, float summary) {
                pol.finish(o, summary, rb.head(r), Dv);
                if (finite(o, summary))
                    write(rb, set, r, o, summary);
                else
                    held.add(set, r, o, summary, Dv);
            });
            if (held.at.empty()) return;
            const Policy rp = pol.rescaled();
            run(rp, rb, 0, s.len_k, [&](index_t set, index_t r, float* o, float summary) {
                const std::ptrdiff_t i = held.find(set, r);
                if (i < 0) return;
                rp.finish(o, summary, rb.head(r), Dv);
                combine(held, i, o, summary);
                write(rb, set, r, o, summary);
            });
        });
        return;
    }

    // Split-KV: each piece writes its emitted rows, then rows merge pieces in order.
    const index_t rows_max = pl.n_pos * s.group() * pl.heads_per_item;
    const index_t part_rows = pl.n_items * pl.n_split * n_sets * rows_max;
    scratch_lease<> part_o_lease, part_sum_lease;  // this thread's; the workers fill them
    std::vector<float>& part_o = part_o_lease.get();
    std::vector<float>& part_sum = part_sum_lease.get();
    part_o.resize(static_cast<std::size_t>(part_rows * Dv));
    part_sum.resize(static_cast<std::size_t>(part_rows));
    // Row r of set `set` of piece sp of item it.
    auto part_row = [&](index_t it, index_t sp, index_t set, index_t r) {
        return ((it * pl.n_split + sp) * n_sets + set) * rows_max + r;
    };
    parallel_for(pool, pl.n_items * pl.n_split, [&](index_t w) {
        const index_t it = w / pl.n_split, sp = w % pl.n_split;
        const row_block rb = item(it);
        if (rb.n_pos == 0) return;
        const index_t ks0 = sp * pl.split_len, ks1 = std::min(s.len_k, ks0 + pl.split_len);
        run(pol, rb, ks0, ks1, [&](index_t set, index_t r, float* o, float summary) {
            const index_t at = part_row(it, sp, set, r);
            std::copy(o, o + Dv, part_o.data() + at * Dv);
            part_sum[static_cast<std::size_t>(at)] = summary;
        });
    });
    // Row r of set `set`: its pieces merged in order and finished, into o.
    auto merge_pieces = [&](const auto& rp, const float* po, const float* ps, auto&& row_of, const row_block& rb,
                            index_t set, index_t r, float* o) {
        const index_t first = row_of(0, set, r);
        std::copy_n(po + first * Dv, Dv, o);
        float summary = ps[first];
        for (index_t sp = 1; sp < pl.n_split; ++sp) {
            const index_t at = row_of(sp, set, r);
            rp.merge(o, summary, po + at * Dv, ps[at], Dv);
        }
        rp.finish(o, summary, rb.head(r), Dv);
        return summary;
    };
    parallel_for(pool, pl.n_items, [&](index_t it) {
        const row_block rb = item(it);
        if (rb.n_pos == 0) return;
        scratch_lease<> o_lease;
        std::vector<float>& o = o_lease.get();
        o.resize(static_cast<std::size_t>(Dv));
        held_rows held;
        auto row_of = [&](index_t sp, index_t set, index_t r) { return part_row(it, sp, set, r); };
        for (index_t set = 0; set < n_sets; ++set)
            for (index_t r = 0; r < rb.rows(); ++r) {
                const float summary = merge_pieces(pol, part_o.data(), part_sum.data(), row_of, rb, set, r, o.data());
                if (finite(o.data(), summary))
                    write(rb, set, r, o.data(), summary);
                else
                    held.add(set, r, o.data(), summary, Dv);
            }
        if (held.at.empty()) return;
        // Every piece of the item again with the rescaled policy (pieces of one policy merge).
        const Policy rp = pol.rescaled();
        std::vector<float> ro(static_cast<std::size_t>(pl.n_split * n_sets * rows_max * Dv));
        std::vector<float> rs(static_cast<std::size_t>(pl.n_split * n_sets * rows_max));
        auto local_row = [&](index_t sp, index_t set, index_t r) { return (sp * n_sets + set) * rows_max + r; };
        for (index_t sp = 0; sp < pl.n_split; ++sp) {
            const index_t ks0 = sp * pl.split_len, ks1 = std::min(s.len_k, ks0 + pl.split_len);
            run(rp, rb, ks0, ks1, [&](index_t set, index_t r, float* x, float summary) {
                const index_t at = local_row(sp, set, r);
                std::copy(x, x + Dv, ro.data() + at * Dv);
                rs[static_cast<std::size_t>(at)] = summary;
            });
        }
        for (std::size_t i = 0; i < held.at.size(); ++i) {
            const index_t set = held.at[i].first, r = held.at[i].second;
            float summary = merge_pieces(rp, ro.data(), rs.data(), local_row, rb, set, r, o.data());
            combine(held, static_cast<std::ptrdiff_t>(i), o.data(), summary);
            write(rb, set, r, o.data(), summary);
        }
    });
}

// Softmax: the online softmax policy with the problem's soft-capping and fo.sinks.
template <class A, class KVT, class QT>
void attention_forward(const basic_attention_problem<KVT, QT>& p, const forward_outputs& fo, thread_pool* pool) {
    softmax_rows pol;
    pol.tf = p.tf;
    pol.sinks = fo.sinks;
    attention_forward<A>(p, pol, fo, pool);
}

#ifdef ATTNKIT_KERNEL_INSTANCE
// The softmax forward of every storage type: the kernel most translation units call.
#define ATTNKIT_SOFTMAX_FORWARD_INSTANCE(KVT, QT)                                                          \
    ATTNKIT_KERNEL_INSTANCE void attention_forward<simd::default_arch, softmax_rows, KVT, QT>(           \
        const basic_attention_problem<KVT, QT>&, const softmax_rows&, const forward_outputs&, thread_pool*);
ATTNKIT_SOFTMAX_FORWARD_INSTANCE(float, float)
ATTNKIT_SOFTMAX_FORWARD_INSTANCE(Eigen::bfloat16, float)
ATTNKIT_SOFTMAX_FORWARD_INSTANCE(Eigen::half, float)
ATTNKIT_SOFTMAX_FORWARD_INSTANCE(Eigen::bfloat16, Eigen::bfloat16)
ATTNKIT_SOFTMAX_FORWARD_INSTANCE(Eigen::half, Eigen::half)
ATTNKIT_SOFTMAX_FORWARD_INSTANCE(std::int8_t, float)
#undef ATTNKIT_SOFTMAX_FORWARD_INSTANCE
#endif

}  // namespace detail
}  // namespace attnkit
