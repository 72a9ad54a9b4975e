// The linear form of Taylor attention (docs/variants.md section 2): O(L F Dv) time, F = 1 + D +
// D(D+1)/2, instead of the quadratic form's O(Lq Lk D).
//
// Keys are taken in chunks of kChunk. Causal: the queries whose positions fall in a chunk read
// the running state S = sum phi(k) v^T, z = sum phi(k) of all earlier chunks (one GEMM-shaped
// pass, features.hpp), see the chunk's own keys through the quadratic form (the tile engine's
// tile_kernel with the Taylor row policy, quadratic.hpp: raw sums, so the two parts add), and
// then the chunk's keys are added to the state. Not causal: every visible key goes into the
// state first, then every query reads it. key_lengths only shortens the keys that enter.
//
// Feature map or three-state split: the split's terms (sum v, sum k v^T, sum vec(k k^T) v^T)
// are rows of the same state; what matters is how many rows the D^2 term has. The symmetric
// map (a <= b) has D(D+1)/2, the plain split D^2, and both run the same micro-kernels at about
// the same efficiency, so their times go as their FLOPs (at D = 64, 2145 against 4161
// features). So the symmetric feature map, with the query-side coefficients (features.hpp) so
// that the key side, summed into the state, needs no multiply.
//
// Threads: work items are (batch, key/value head, segment of chunks). With few heads the chunks
// are split into segments (a number that depends on the shapes only): a first pass sums each
// segment's keys into a state of its own, those are combined in segment order, and a second
// pass runs each segment from its prefix state. Every value is computed by one item in a fixed
// order, so results are bitwise identical for any thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attnkit/detail/attention_driver.hpp"
#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/detail/taylor/features.hpp"
#include "attnkit/detail/taylor/quadratic.hpp"
#include "attnkit/detail/tile_kernel.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

// Keys per chunk: the quadratic part costs ~kChunk (D + Dv) / 2 per row against F (Dv + 1)
// for the state read, so a few percent at 64; smaller chunks add more per-chunk overhead.
constexpr index_t kChunk = 64;
// Keys per chunk of the backward's linear form (linear_backward.hpp): its five state products
// per chunk and feature block are GEMMs with K or N of the chunk's length, and at 64 the calls'
// fixed costs (packing, the features built per call, the register tiles' loads and stores of C)
// weigh more than at 128, where the chunk-local pairs through the tile kernel still cost little
// (docs/benchmarks.md, "Taylor attention backward": 64, 128, 192 and 256 measured).
constexpr index_t kBackwardChunk = 128;
// Work items to aim for before chunks are split into segments, and the fewest chunks a segment
// may have (each segment costs one extra pass over its keys' update).
constexpr index_t kLinearTargetItems = 4;
constexpr index_t kMinSegmentChunks = 4;

// One (batch, key/value head) sequence of the linear form: the rows of the chunk's queries and
// their outputs, over the views of one call (or one taylor_state step).
template <class A, class T>
struct linear_sequence {
    const basic_attention_problem<T, T>* p;
    view<float, 4> out;
    const feature_table* ft;
    float eps;
    index_t b, hk;
    // Powers of two for large queries and keys (pack_query): 2^-q_shift, 2^-k_shift; the weights
    // come out times 2^-2 (q_shift + k_shift), the chunk's quadratic part and eps alike.
    int q_shift = 0, k_shift = 0;

    index_t offset() const { return p->s.len_k - p->s.len_q; }
    index_t key_len() const { return p->key_lengths ? static_cast<index_t>(p->key_lengths[b]) : p->s.len_k; }
    index_t chunks() const { return (p->s.len_k + kChunk - 1) / kChunk; }

    // Adds keys of chunk c (those below key_len) to S.
    index_t pack_chunk_keys(chunk_buffers<A>& cb, index_t c) const {
        const index_t j0 = c * kChunk, n = std::min(kChunk, key_len() - j0);
        if (n <= 0) return 0;
        return pack_keys(cb, p->k.row(b, j0, hk), p->k.sl, p->v.row(b, j0, hk), p->v.sl, n, std::ldexp(1.0f, -k_shift));
    }

    // Queries [i0, i1) (all G heads of hk) read S; causal: plus the quadratic form over the keys
    // of chunk c they see; then, if update, chunk c enters S. Writes the rows' outputs.
    void run_queries(chunk_buffers<A>& cb, std::vector<float>& buf, float* S, index_t i0, index_t i1, index_t c,
                     bool update) const {
        constexpr index_t RT = chunk_buffers<A>::RT;
        const index_t G = p->s.group(), Dv = p->s.dim_v, dvp = cb.dvp, rows = (i1 - i0) * G;
        const index_t n_panels = (rows + RT - 1) / RT;
        quadratic_rows pol{eps};
        pol.score_shift = q_shift + k_shift;
        const float eps_w = std::ldexp(eps, -2 * pol.score_shift);
        std::fill(cb.qt.begin(), cb.qt.begin() + n_panels * (p->s.dim + 2) * RT, 0.0f);
        std::fill(cb.ot.begin(), cb.ot.begin() + n_panels * dvp * RT, 0.0f);
        for (index_t r = 0; r < rows; ++r)
            pack_query(cb, r, p->q.row(b, i0 + r / G, hk * G + r % G), p->q_scale, std::ldexp(1.0f, -q_shift));
        const index_t ld = update ? pack_chunk_keys(cb, c) : 0;
        chunk_step<A>(cb, *ft, S, n_panels, ld);

        const index_t len = key_len(), j0 = c * kChunk, j1 = std::min(j0 + kChunk, len);
        auto write = [&](index_t r, const float* intra, float intra_sum) {
            const index_t i = i0 + r / G, pos = i + offset();
            const index_t n_vis = p->causal ? std::min(pos + 1, len) : len;
            float* o = out.ptr(b, i, hk * G + r % G);
            const float* ot = cb.o_panel(r / RT) + r % RT;
            if (n_vis <= 0) {
                std::fill(o, o + Dv, 0.0f);
                return;
            }
            const float inv = 1.0f / (ot[Dv * RT] + intra_sum + eps_w);
            for (index_t d = 0; d < Dv; ++d) o[d] = (ot[d * RT] + (intra ? intra[d] : 0.0f)) * inv;
        };
        if (p->causal && j0 < j1) {
            row_block rb;
            rb.b = b, rb.hk = hk, rb.n_hk = 1, rb.i0 = i0, rb.n_pos = i1 - i0, rb.group = G;
            tile_kernel<A>(*p, pol, rb, j0, j1, buf,
                           [&](index_t, index_t r, const float* o_row, float sum) { write(r, o_row, sum); });
        } else {
            for (index_t r = 0; r < rows; ++r) write(r, nullptr, 0.0f);
        }
    }

    // Queries whose positions fall in chunk c: [i0, i1), possibly empty.
    void chunk_queries(index_t c, index_t& i0, index_t& i1) const {
        const index_t Lq = p->s.len_q;
        i0 = std::min(std::max<index_t>(c * kChunk - offset(), 0), Lq);
        i1 = std::min(std::max<index_t>((c + 1) * kChunk - offset(), 0), Lq);
    }
};

template <class A>
inline chunk_buffers<A> make_chunk_buffers(const attention_shape& s, index_t query_rows) {
    constexpr index_t RT = chunk_buffers<A>::RT;
    return chunk_buffers<A>(s.dim, s.dim_v, kChunk, (query_rows + RT - 1) / RT);
}

// The shift that brings a largest |x scale| of mx below 1 when it is 2^20 or more, else 0:
// features of degree 2 in q and in k (up to q^2 k^2) stay in float for inputs up to ~2^31 that
// way, and ordinary inputs are not scaled at all.
inline int shift_for_max(float mx) {
    if (!(mx >= 1048576.0f) || !std::isfinite(mx)) return 0;
    return std::min(std::ilogb(mx) + 1, 63);
}

// shift_for_max of the rows of x: one pass over x, small beside the form's work.
inline int large_shift(const view<const float, 4>& x, float scale) {
    float mx = 0.0f;
    for (index_t b = 0; b < x.dims[0]; ++b)
        for (index_t i = 0; i < x.dims[1]; ++i)
            for (index_t h = 0; h < x.dims[2]; ++h) {
                const float* r = x.ptr(b, i, h);
                for (index_t d = 0; d < x.dims[3]; ++d) mx = std::max(mx, std::fabs(r[d] * scale));
            }
    return shift_for_max(mx);
}

template <class A>
ATTNKIT_NOINLINE void linear_forward_split(const view<const float, 4>& q, const view<const float, 4>& k,
                          const view<const float, 4>& v, const view<float, 4>& out, const taylor_options& opts,
                          feature_split split) {
    const attention_shape s{q.dims[0], q.dims[1], k.dims[1], q.dims[2], k.dims[2], q.dims[3], v.dims[3]};
    using TT = tile_traits<A>;
    basic_attention_problem<float, float> p = make_base_problem(q, k, v, s, opts.causal, opts.key_lengths);
    p.q_scale = resolve_scale(opts.scale, s.dim);
    const feature_table ft(s.dim, TT::kMR, split);
    const index_t G = s.group(), items = s.batch * s.heads_k;
    const index_t n_chunks = (s.len_k + kChunk - 1) / kChunk;
    const index_t dvp = chunk_buffers<A>::padded_dim_v(s.dim_v);
    const std::size_t state_size = static_cast<std::size_t>(ft.padded * dvp);
    const index_t n_seg = std::max<index_t>(
        1, std::min((kLinearTargetItems + items - 1) / std::max<index_t>(items, 1), n_chunks / kMinSegmentChunks));
    // Chunks [seg * n_chunks / n_seg, (seg + 1) * n_chunks / n_seg) form segment seg.
    auto seg_begin = [&](index_t seg) { return seg * n_chunks / n_seg; };
    const int q_shift = large_shift(q, p.q_scale), k_shift = large_shift(k, 1.0f);
    auto sequence = [&](index_t item) {
        return linear_sequence<A, float>{&p, out, &ft, opts.eps, item / s.heads_k, item % s.heads_k, q_shift, k_shift};
    };
    if (s.len_q == 0) return;

    // Pass 1 (only with segments): slot seg + 1 of an item gets the keys of segment seg
    // (causal: every segment but the last; not causal: slot seg gets segment seg, all of them).
    std::vector<float> slots;
    const index_t n_slots = n_seg > 1 ? n_seg : 0;
    if (n_slots > 0) {
        slots.assign(state_size * static_cast<std::size_t>(items * n_slots), 0.0f);
        const index_t per_item = opts.causal ? n_seg - 1 : n_seg;
        parallel_for(opts.pool, items * per_item, [&](std::int64_t w) {
            const index_t item = w / per_item, seg = w % per_item;
            const auto sq = sequence(item);
            chunk_buffers<A> cb = make_chunk_buffers<A>(s, 0);
            float* S = slots.data() + state_size * static_cast<std::size_t>(item * n_slots + (opts.causal ? seg + 1 : seg));
            for (index_t c = seg_begin(seg); c < seg_begin(seg + 1); ++c) {
                const index_t ld = sq.pack_chunk_keys(cb, c);
                if (ld > 0) chunk_step<A>(cb, ft, S, 0, ld);
            }
        });
        // Fixed-order combination: causal prefix sums (slot seg = keys before segment seg),
        // not causal: the total in slot 0.
        parallel_for(opts.pool, items, [&](std::int64_t item) {
            float* base = slots.data() + state_size * static_cast<std::size_t>(item * n_slots);
            for (index_t seg = opts.causal ? 2 : 1; seg < n_seg; ++seg) {
                float* dst = opts.causal ? base + state_size * static_cast<std::size_t>(seg) : base;
                const float* src = base + state_size * static_cast<std::size_t>(opts.causal ? seg - 1 : seg);
                for (std::size_t x = 0; x < state_size; ++x) dst[x] += src[x];
            }
        });
    }

    const index_t q_rows = kChunk * G;
    if (opts.causal) {
        // Pass 2: each segment from its prefix state: reads, the quadratic form within the chunk,
        // updates (none after a segment's last chunk: nothing reads them).
        parallel_for(opts.pool, items * n_seg, [&](std::int64_t w) {
            const index_t item = w / n_seg, seg = w % n_seg;
            const auto sq = sequence(item);
            chunk_buffers<A> cb = make_chunk_buffers<A>(s, q_rows);
            std::vector<float> own, buf;
            float* S;
            if (n_slots > 0) {
                S = slots.data() + state_size * static_cast<std::size_t>(item * n_slots + seg);
            } else {
                own.assign(state_size, 0.0f);
                S = own.data();
            }
            for (index_t c = seg_begin(seg); c < seg_begin(seg + 1); ++c) {
                index_t i0, i1;
                sq.chunk_queries(c, i0, i1);
                const bool update = c + 1 < seg_begin(seg + 1);
                if (i0 < i1) {
                    sq.run_queries(cb, buf, S, i0, i1, c, update);
                } else if (update) {
                    const index_t ld = sq.pack_chunk_keys(cb, c);
                    if (ld > 0) chunk_step<A>(cb, ft, S, 0, ld);
                }
            }
            // Queries before position 0 (Lq > Lk) see nothing.
            if (seg == 0)
                for (index_t i = 0; i < std::min(s.len_q, -sq.offset()); ++i)
                    for (index_t g = 0; g < G; ++g) std::fill_n(out.ptr(sq.b, i, sq.hk * G + g), s.dim_v, 0.0f);
        });
        return;
    }

    // Not causal: the whole state (slot 0, or built here per item), then query blocks read it.
    const index_t q_blocks = (s.len_q + kChunk - 1) / kChunk;
    if (n_slots == 0) {
        slots.assign(state_size * static_cast<std::size_t>(items), 0.0f);
        parallel_for(opts.pool, items, [&](std::int64_t item) {
            const auto sq = sequence(item);
            chunk_buffers<A> cb = make_chunk_buffers<A>(s, 0);
            float* S = slots.data() + state_size * static_cast<std::size_t>(item);
            for (index_t c = 0; c < n_chunks; ++c) {
                const index_t ld = sq.pack_chunk_keys(cb, c);
                if (ld > 0) chunk_step<A>(cb, ft, S, 0, ld);
            }
        });
    }
    const index_t stride = n_slots > 0 ? n_slots : 1;
    parallel_for(opts.pool, items * q_blocks, [&](std::int64_t w) {
        const index_t item = w / q_blocks, qb = w % q_blocks;
        const auto sq = sequence(item);
        chunk_buffers<A> cb = make_chunk_buffers<A>(s, q_rows);
        std::vector<float> buf;
        float* S = slots.data() + state_size * static_cast<std::size_t>(item * stride);
        sq.run_queries(cb, buf, S, qb * kChunk, std::min(s.len_q, (qb + 1) * kChunk), 0, false);
    });
}

template <class A>
void linear_forward(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
                    const view<float, 4>& out, const taylor_options& opts) {
    linear_forward_split<A>(q, k, v, out, opts, feature_split::symmetric);
}

#ifdef ATTNKIT_KERNEL_INSTANCE  // compiled kernels (config.hpp)
ATTNKIT_KERNEL_INSTANCE void linear_forward_split<simd::default_arch>(const view<const float, 4>&,
                                                                      const view<const float, 4>&,
                                                                      const view<const float, 4>&,
                                                                      const view<float, 4>&, const taylor_options&,
                                                                      feature_split);
#endif

}  // namespace taylor
#ifdef ATTNKIT_KERNEL_INSTANCE  // Taylor's quadratic form through the forward driver
ATTNKIT_KERNEL_INSTANCE void attention_forward<simd::default_arch, taylor::quadratic_rows, float, float>(
    const basic_attention_problem<float, float>&, const taylor::quadratic_rows&, const forward_outputs&, thread_pool*);
#endif

}  // namespace detail
}  // namespace attnkit
