// The schedule of a self-gating call: fixed chunks of positions, combined in a fixed order.
//
// The arithmetic is fixed by the shapes alone: the positions of an item are cut into chunks of
// chunk_len() positions; a causal row's output is its chunk-local (o, m, z) combined with the
// prefix state P_c of all chunks before it (fix_rows), and P_{c+1} = P_c (+) S_c in chunk
// order, S_c being chunk c's own state (merge_state). Only who computes what depends on the
// thread count, so results are bitwise identical for any number of threads.
//
// Causal: a single pass with decoupled look-back (as in single-pass GPU scans). Workers claim
// chunks in increasing order from one counter. A chunk scans its tokens into a buffer sized to
// stay in L2, waits until its predecessor has published P_c, publishes P_{c+1}, then fixes its
// rows from the buffer into out; a chunk that finds P_c already published (always, with one
// worker) writes its final rows during the scan instead, which saves the buffer's round trip
// (measured on Zen 2: 3 read streams with 1 interleaved streamed store reach ~22 GB/s, the same
// with the stores in a separate pass over an L2 buffer ~18). q, k, v and out each cross the
// memory bus once, and a few heads (or one) still keep every thread busy. The wait cannot deadlock: a chunk's predecessors were
// claimed before it by threads that are running them, and chunk 0 waits for nothing.
// Non-causal: chunk states in parallel, their combination in order, then the rows (all equal).
#pragma once

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "attnkit/detail/scratch.hpp"
#include "attnkit/detail/self_gating/scan.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {
namespace self_gating {

// States of every (batch item, query head) as a state object keeps them: m [B*H], z [B*H],
// n [B*H][dim_vp].
using state_arrays = state_ref;

// Chunk length from the shapes: local rows of one chunk (all heads) fit in 256 KiB, so they are
// still in L2 when they are fixed; at most L/16 so that a few heads give every thread work;
// a multiple of 16 positions.
inline index_t chunk_len(const problem& p) {
    constexpr index_t kBufferBytes = index_t(256) << 10, kStep = 16;
    const index_t by_cache = kBufferBytes / (index_t(sizeof(float)) * p.heads * p.dim_vp) / kStep * kStep;
    const index_t by_len = ((p.len + 15) / 16 + kStep - 1) / kStep * kStep;
    return std::max(kStep, std::min(by_cache, by_len));
}

// Slot `at` of a flat array of per-head states (nh heads each).
inline state_ref slot(std::vector<float>& m, std::vector<float>& z, std::vector<float>& n, index_t at, index_t nh,
                      index_t dvp) {
    return {m.data() + at * nh, z.data() + at * nh, n.data() + at * nh * dvp};
}

inline void copy_state(const state_ref& to, const state_ref& from, index_t nh, index_t dvp) {
    std::copy(from.m, from.m + nh, to.m);
    std::copy(from.z, from.z + nh, to.z);
    std::copy(from.n, from.n + nh * dvp, to.n);
}

inline void merge_states(const state_ref& a, const state_ref& b, index_t nh, index_t dvp) {
    for (index_t h = 0; h < nh; ++h) merge_state(a.m[h], a.z[h], a.n + h * dvp, b.m[h], b.z[h], b.n + h * dvp, dvp);
}

inline row_dest out_dest(const problem& p, index_t b, index_t l) { return {p.out_row(b, l, 0), p.ol, p.oh}; }

// A ready flag of a prefix_table slot; copies are fresh flags (the table sets every flag it
// uses), so that a vector of them can be resized.
struct ready_flag {
    std::atomic<int> v{0};
    ready_flag() = default;
    ready_flag(const ready_flag&) noexcept {}
    ready_flag& operator=(const ready_flag&) noexcept { return *this; }
};

// Published prefix states P_c of every (item, chunk), c = 0 .. nc, and their ready flags, in
// buffers of the calling thread's (scratch.hpp): a decode step allocates nothing.
struct prefix_table {
    index_t nc, nh, dvp;
    scratch_lease<> m_lease, z_lease, n_lease;
    scratch_lease<ready_flag> ready_lease;
    std::vector<float>& m = m_lease.get();
    std::vector<float>& z = z_lease.get();
    std::vector<float>& n = n_lease.get();
    std::vector<ready_flag>& flags = ready_lease.get();

    prefix_table(const problem& p, index_t chunks, const state_arrays* init)
        : prefix_table(p.batch, p.heads, p.dim_vp, chunks, init) {}
    // The table alone: `batch` items of `chunks` + 1 slots of `heads` states; slot 0 of every
    // item is `init` (or empty) and ready. The backward (backward.hpp) keeps its suffix states
    // here, slot t holding the state of the last t chunks of an item.
    prefix_table(index_t batch, index_t heads, index_t dim_vp, index_t chunks, const state_arrays* init)
        : nc(chunks), nh(heads), dvp(dim_vp) {
        const index_t slots = batch * (nc + 1);
        m.assign(static_cast<std::size_t>(slots * nh), -HUGE_VALF);
        z.assign(static_cast<std::size_t>(slots * nh), 0.0f);
        n.assign(static_cast<std::size_t>(slots * nh * dvp), 0.0f);
        flags.resize(static_cast<std::size_t>(slots));
        for (index_t s = 0; s < slots; ++s) ready(s).store(0, std::memory_order_relaxed);
        for (index_t b = 0; b < batch; ++b) {
            if (init) copy_state(at(b, 0), {init->m + b * nh, init->z + b * nh, init->n + b * nh * dvp}, nh, dvp);
            ready(b * (nc + 1)).store(1, std::memory_order_release);
        }
    }
    std::atomic<int>& ready(index_t s) { return flags[static_cast<std::size_t>(s)].v; }
    state_ref at(index_t b, index_t c) { return slot(m, z, n, b * (nc + 1) + c, nh, dvp); }
    void wait(index_t b, index_t c) {
        std::atomic<int>& f = ready(b * (nc + 1) + c);
        for (int spin = 0; f.load(std::memory_order_acquire) == 0; ++spin)
            if (spin > 64) std::this_thread::yield();
    }
    bool ready_now(index_t b, index_t c) { return ready(b * (nc + 1) + c).load(std::memory_order_acquire) != 0; }
    void publish(index_t b, index_t c) { ready(b * (nc + 1) + c).store(1, std::memory_order_release); }
    void save(index_t b, const state_arrays* fin) {
        if (fin) copy_state({fin->m + b * nh, fin->z + b * nh, fin->n + b * nh * dvp}, at(b, nc), nh, dvp);
    }
};

template <class A>
void run_causal(const problem& p, thread_pool* pool, const state_arrays* init, const state_arrays* fin) {
    const index_t B = p.batch, L = p.len, H = p.heads, Hk = p.heads_kv, dvp = p.dim_vp;
    const index_t C = chunk_len(p), nc = (L + C - 1) / C, total = B * nc;
    prefix_table pre(p, nc, init);
    std::atomic<index_t> next{0};
    const index_t T = pool ? static_cast<index_t>(pool->size()) : 1;
    const index_t workers = std::min(T, total);
    parallel_for(pool, workers, [&](std::int64_t) {
        // Everything a chunk needs is allocated before the first claim: an exception after a
        // claim would leave the chunk's successors waiting. A lone worker finds every prefix
        // published when it claims the next chunk, and needs no row buffer.
        // The worker's buffers are its thread's scratch (scratch.hpp).
        scratch_object<states> loc_lease;
        states& loc = loc_lease.get();
        loc.resize(H, dvp);
        const index_t rows = workers > 1 ? std::min(C, L) : 0;  // a decode step (L = 1) needs one row
        scratch_lease<> buf_lease, mz_lease;
        std::vector<float>& buf = buf_lease.get();
        std::vector<float>& mz = mz_lease.get();
        buf.assign(static_cast<std::size_t>(rows * H * dvp), 0.0f);
        mz.assign(static_cast<std::size_t>(2 * rows * H), 0.0f);
        const row_dest buf_dest{buf.data(), H * dvp, dvp};
        for (index_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < total;) {
            const index_t b = it / nc, c = it % nc, c0 = c * C, c1 = std::min(c0 + C, L);
            const index_t nv = p.visible[static_cast<std::size_t>(b)], vis_end = std::min(c1, nv);
            loc.clear();
            const row_dest od = out_dest(p, b, c0);
            const state_ref pc = pre.at(b, c), pn = pre.at(b, c + 1);
            // A chunk whose prefix is already published writes its final rows as it scans (the
            // bits do not depend on which way a row is made: see scan_rows); the others scan
            // into the buffer, wait for the prefix, then fix the rows from the buffer.
            const bool direct = pre.ready_now(b, c);
            if (c0 < vis_end) {
                if (direct)
                    scan_rows<A>(p, b, 0, Hk, c0, vis_end, loc, &od, nullptr, p.stream, &pc);
                else
                    scan_rows<A>(p, b, 0, Hk, c0, vis_end, loc, &buf_dest, mz.data(), false);
            }
            pre.wait(b, c);
            copy_state(pn, pc, H, dvp);
            merge_states(pn, ref(loc), H, dvp);
            pre.publish(b, c + 1);
            if (c0 < vis_end && !direct) fix_rows<A>(p, b, c0, 0, Hk, vis_end - c0, pc, buf_dest, mz.data(), od, loc, p.stream);
            // Rows past the visible tokens see all of them: P_{c+1} is already the final state.
            fill_rows<A>(p, b, 0, Hk, std::max(c0, nv), c1, pn, p.stream);
        }
        simd::store_fence();
    });
    for (index_t b = 0; b < B; ++b) pre.save(b, fin);
}

template <class A>
void run_noncausal(const problem& p, thread_pool* pool) {
    const index_t B = p.batch, L = p.len, H = p.heads, Hk = p.heads_kv, dvp = p.dim_vp;
    const index_t C = chunk_len(p), nc = (L + C - 1) / C;
    std::vector<float> sm(static_cast<std::size_t>(B * nc * H), -HUGE_VALF), sz(sm.size(), 0.0f),
        sn(sm.size() * static_cast<std::size_t>(dvp), 0.0f);
    std::vector<float> tm(static_cast<std::size_t>(B * H), -HUGE_VALF), tz(tm.size(), 0.0f),
        tn(tm.size() * static_cast<std::size_t>(dvp), 0.0f);
    parallel_for(pool, B * nc, [&](std::int64_t it) {
        const index_t b = it / nc, c0 = (it % nc) * C, c1 = std::min(c0 + C, p.visible[static_cast<std::size_t>(b)]);
        if (c0 >= c1) return;
        states s;
        s.resize(H, dvp);
        scan_rows<A>(p, b, 0, Hk, c0, c1, s, nullptr, nullptr, false);
        copy_state(slot(sm, sz, sn, it, H, dvp), ref(s), H, dvp);
    });
    for (index_t b = 0; b < B; ++b)
        for (index_t c = 0; c < nc; ++c) merge_states(slot(tm, tz, tn, b, H, dvp), slot(sm, sz, sn, b * nc + c, H, dvp), H, dvp);
    parallel_for(pool, B * nc, [&](std::int64_t it) {
        const index_t b = it / nc, c0 = (it % nc) * C;
        fill_rows<A>(p, b, 0, Hk, c0, std::min(c0 + C, L), slot(tm, tz, tn, b, H, dvp), p.stream);
        simd::store_fence();
    });
}

// Runs the call; init (optional) is the state before position 0, fin (optional) receives the
// state after the last visible token (both causal only, for self_gating_state).
template <class A>
ATTNKIT_NOINLINE void run(const problem& p, thread_pool* pool, const state_arrays* init, const state_arrays* fin) {
    if (p.batch == 0 || p.len == 0) return;
    if (p.causal)
        run_causal<A>(p, pool, init, fin);
    else
        run_noncausal<A>(p, pool);
}

#ifdef ATTNKIT_KERNEL_INSTANCE  // compiled kernels (config.hpp)
ATTNKIT_KERNEL_INSTANCE void run<simd::default_arch>(const problem&, thread_pool*, const state_arrays*,
                                                     const state_arrays*);
#endif

}  // namespace self_gating
}  // namespace detail
}  // namespace attnkit
