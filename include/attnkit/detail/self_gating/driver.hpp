// The schedule of a self-gating call: fixed chunks of positions, and two ways of running them
// that give the same bits.
//
// The arithmetic is fixed by the shapes alone: the visible tokens of an item are cut into
// chunks of chunk_len(L) positions; a row's output is its chunk-local (o, m, z) combined with
// the prefix state P_c of all chunks before it (fix_rows), and P_{c+1} = P_c (+) S_c in chunk
// order, S_c being chunk c's own state. Two schedules run that arithmetic:
//  - sequential: one work item per (batch item, slice of key/value heads) walks its chunks in
//    order, P_c known when chunk c starts. Local rows go to a small L2-resident buffer and are
//    fixed from there into out, so q, k, v and out each cross the memory bus once.
//  - chunk-parallel, for a few heads and several threads: (1) every chunk's local rows into out
//    and its state S_c, in parallel; (2) the prefix states in chunk order; (3) every chunk's
//    rows fixed in place, in parallel. Out is read and written once more.
// Both call the same non-inlined scan_rows / merge_state / fix_rows on the same rows, so any
// thread count and either schedule give identical results. A cost model picks the schedule.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/self_gating/scan.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {
namespace self_gating {

// States of every (batch item, query head) as a state object keeps them: m [B*H], z [B*H],
// n [B*H][dim_vp].
struct state_arrays {
    float* m = nullptr;
    float* z = nullptr;
    float* n = nullptr;
};

// About 64 chunks per item (enough pieces for any thread count), multiples of 16 positions.
inline index_t chunk_len(index_t len) {
    constexpr index_t kChunks = 64, kMin = 16;
    const index_t c = (len + kChunks - 1) / kChunks;
    return std::max(kMin, (c + kMin - 1) / kMin * kMin);
}

inline void load_states(states& st, const problem& p, const state_arrays* init, index_t b, index_t h0, index_t nh) {
    st.resize(nh, p.dim_vp);
    if (!init) return;
    const index_t o = b * p.heads + h0;
    std::copy(init->m + o, init->m + o + nh, st.m.begin());
    std::copy(init->z + o, init->z + o + nh, st.z.begin());
    std::copy(init->n + o * p.dim_vp, init->n + (o + nh) * p.dim_vp, st.n.begin());
}

inline void save_states(const states& st, const problem& p, const state_arrays* fin, index_t b, index_t h0) {
    if (!fin) return;
    const index_t o = b * p.heads + h0;
    std::copy(st.m.begin(), st.m.end(), fin->m + o);
    std::copy(st.z.begin(), st.z.end(), fin->z + o);
    std::copy(st.n.begin(), st.n.end(), fin->n + o * p.dim_vp);
}

inline void merge_states(states& a, const states& b, index_t dvp) {
    for (std::size_t h = 0; h < a.m.size(); ++h)
        merge_state(a.m[h], a.z[h], a.n.data() + h * dvp, b.m[h], b.z[h], b.n.data() + h * dvp, dvp);
}

inline row_dest out_dest(const problem& p, index_t b, index_t l, index_t h0) {
    return {p.out_row(b, l, h0), p.ol, p.oh};
}

// Sequential schedule for item b, key/value heads [hk0, hk1).
template <class A>
void run_sequential(const problem& p, index_t b, index_t hk0, index_t hk1, const state_arrays* init,
                    const state_arrays* fin) {
    const index_t G = p.group, nh = (hk1 - hk0) * G, h0 = hk0 * G, dvp = p.dim_vp;
    const index_t C = chunk_len(p.len), nv = p.visible[static_cast<std::size_t>(b)];
    // Local rows are fixed from a buffer of at most 64 KiB (stays in L2 next to the streams).
    const index_t sub = std::max<index_t>(1, std::min<index_t>(16, 16384 / (nh * dvp)));
    states pre, loc;
    load_states(pre, p, init, b, h0, nh);
    loc.resize(nh, dvp);
    std::vector<float> tmp(static_cast<std::size_t>(sub * nh * dvp)), mz(static_cast<std::size_t>(2 * sub * nh));
    const row_dest tmp_dest{tmp.data(), nh * dvp, dvp};
    for (index_t c0 = 0; c0 < nv; c0 += C) {
        const index_t c1 = std::min(c0 + C, nv);
        loc.clear();
        const bool pre_empty = std::all_of(pre.z.begin(), pre.z.end(), [](float z) { return z == 0.0f; });
        for (index_t l0 = c0; l0 < c1; l0 += sub) {
            const index_t l1 = std::min(l0 + sub, c1);
            const row_dest od = out_dest(p, b, l0, h0);
            if (pre_empty) {
                scan_rows<A>(p, b, hk0, hk1, l0, l1, loc, &od, mz.data(), p.stream);
            } else {
                scan_rows<A>(p, b, hk0, hk1, l0, l1, loc, &tmp_dest, mz.data(), false);
                fix_rows<A>(p, hk0, hk1, l1 - l0, pre, tmp_dest, mz.data(), od, p.stream);
            }
        }
        merge_states(pre, loc, dvp);
    }
    fill_rows<A>(p, b, hk0, hk1, nv, p.len, pre, p.stream);
    save_states(pre, p, fin, b, h0);
    simd::store_fence();
}

// Chunk-parallel schedule over every item and all heads (causal), or the non-causal call.
template <class A>
void run_chunked(const problem& p, thread_pool* pool, const state_arrays* init, const state_arrays* fin) {
    const index_t B = p.batch, L = p.len, H = p.heads, Hk = p.heads_kv, dvp = p.dim_vp;
    const index_t C = chunk_len(L), nc = (L + C - 1) / C;
    std::vector<states> sum(static_cast<std::size_t>(B * nc)), pre(static_cast<std::size_t>(B * (nc + 1)));
    std::vector<float> mz(p.causal ? static_cast<std::size_t>(2 * B * L * H) : 0);
    // (1) chunk states, and in the causal case the chunk-local rows.
    parallel_for(pool, B * nc, [&](std::int64_t it) {
        const index_t b = it / nc, c0 = (it % nc) * C, nv = p.visible[static_cast<std::size_t>(b)];
        states& s = sum[static_cast<std::size_t>(it)];
        s.resize(H, dvp);
        const index_t c1 = std::min(c0 + C, nv);
        if (c0 >= c1) return;
        const row_dest od = out_dest(p, b, c0, 0);
        scan_rows<A>(p, b, 0, Hk, c0, c1, s, p.causal ? &od : nullptr, p.causal ? mz.data() + 2 * (b * L + c0) * H : nullptr,
                     p.stream);
        simd::store_fence();
    });
    // (2) prefix states in chunk order.
    parallel_for(pool, B, [&](std::int64_t b) {
        states* pb = pre.data() + b * (nc + 1);
        load_states(pb[0], p, init, b, 0, H);
        for (index_t c = 0; c < nc; ++c) {
            pb[c + 1] = pb[c];
            merge_states(pb[c + 1], sum[static_cast<std::size_t>(b * nc + c)], dvp);
        }
        save_states(pb[nc], p, fin, b, 0);
    });
    // (3) final rows: fixed in place (causal) or the item's mean (non-causal, and causal rows
    // past the visible tokens).
    parallel_for(pool, B * nc, [&](std::int64_t it) {
        const index_t b = it / nc, c = it % nc, c0 = c * C, c1 = std::min(c0 + C, L);
        const index_t nv = p.visible[static_cast<std::size_t>(b)];
        const states* pb = pre.data() + b * (nc + 1);
        if (!p.causal) {
            fill_rows<A>(p, b, 0, Hk, c0, c1, pb[nc], p.stream);
        } else {
            const index_t vis_end = std::min(c1, nv);
            if (c0 < vis_end) {
                const row_dest od = out_dest(p, b, c0, 0);
                fix_rows<A>(p, 0, Hk, vis_end - c0, pb[c], od, mz.data() + 2 * (b * L + c0) * H, od, p.stream);
            }
            fill_rows<A>(p, b, 0, Hk, std::max(c0, nv), c1, pb[nc], p.stream);
        }
        simd::store_fence();
    });
}

// Runs the call; init (optional) is the state before position 0, fin (optional) receives the
// state after the last visible token.
template <class A>
void run(const problem& p, thread_pool* pool, const state_arrays* init, const state_arrays* fin) {
    if (p.batch == 0 || p.len == 0) return;
    const index_t T = pool ? static_cast<index_t>(pool->size()) : 1;
    if (!p.causal) return run_chunked<A>(p, pool, nullptr, fin);
    // Cost model in units of one sequential pass over everything: slices of heads cost their
    // share, rounded up to whole items per thread; the chunk-parallel schedule streams out once
    // more (about 1.5 passes), spread over every thread.
    const index_t slices = std::min(p.heads_kv, std::max<index_t>(1, (T + p.batch - 1) / p.batch));
    const index_t items = p.batch * slices;
    const double t_seq = static_cast<double>((items + T - 1) / T) / static_cast<double>(items);
    const index_t pieces = p.batch * ((p.len + chunk_len(p.len) - 1) / chunk_len(p.len));
    const double t_chunk = 1.5 * static_cast<double>((pieces + T - 1) / T) / static_cast<double>(pieces);
    if (T == 1 || t_seq <= t_chunk) {
        parallel_for(pool, items, [&](std::int64_t it) {
            const index_t b = it / slices, s = it % slices;
            run_sequential<A>(p, b, p.heads_kv * s / slices, p.heads_kv * (s + 1) / slices, init, fin);
        });
    } else {
        run_chunked<A>(p, pool, init, fin);
    }
}

}  // namespace self_gating
}  // namespace detail
}  // namespace attnkit
