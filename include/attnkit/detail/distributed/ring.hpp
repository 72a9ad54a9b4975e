// Ring attention and sharded decode over MPI, composed of the single-process kernels: each
// block pair is one softmax_attention (or its backward) call placed in the global sequence
// (detail::sequence_frame), and partial results meet through detail::merge_row, the library's
// one lse merge. The ring adds only the movement of K/V (and of dK/dV) and the order of merges.
//
// Determinism: every rank merges its partials, and adds its gradient contributions, in ring
// order (step 0, 1, ...), and a travelling dK/dV accumulator is summed in the same order on its
// way round, so a given rank count and layout give the same bits on every run and for any
// thread count. Across rank counts results differ by rounding only (a different merge tree).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnkit/detail/distributed/communicator.hpp"
#include "attnkit/distributed_options.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/softmax_attention_backward.hpp"

namespace attnkit {
namespace distributed {

namespace detail {

namespace ad = ::attnkit::detail;

constexpr int kTagKv = 11, kTagGrad = 12;

// Rows [at, at + n) of x along its sequence dimension (1).
template <class T, int N>
view<T, N> row_slice(const view<T, N>& x, index_t at, index_t n) {
    view<T, N> s = x;
    s.data = x.data + at * x.strides[1];
    s.dims[1] = n;
    return s;
}

template <class T, int N>
view<T, N> dense(std::vector<std::remove_const_t<T>>& buf, index_t at, const std::array<index_t, N>& dims) {
    return view<T, N>(buf.data() + at, dims);
}

// The same options on every rank: their scalars and a hash of their vectors travel with the
// shapes, so that a rank called with different options is an error on every rank, not a silent
// mismatch of masks.
inline std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

inline std::vector<std::int64_t> options_signature(const softmax_options& o, int layout) {
    std::uint32_t scale_bits = 0, cap_bits = 0;
    std::memcpy(&scale_bits, &o.scale, sizeof scale_bits);
    std::memcpy(&cap_bits, &o.softcap, sizeof cap_bits);
    std::uint64_t h = fnv1a(o.key_lengths.data(), o.key_lengths.size() * sizeof(std::int64_t));
    h = fnv1a(o.sinks.data(), o.sinks.size() * sizeof(float), h);
    return {o.causal ? 1 : 0, o.window_left, o.chunk, scale_bits, cap_bits,
            static_cast<std::int64_t>(o.key_lengths.size()), static_cast<std::int64_t>(o.sinks.size()),
            static_cast<std::int64_t>(h >> 1), layout};
}

// What every rank agrees on before the first transfer.
struct ring_geometry {
    index_t length = 0;                           // L (ring) or Lk (sharded decode)
    std::vector<std::vector<row_range>> pieces;   // per rank, in local order
    std::vector<index_t> rows;                    // per rank: rows held
    index_t max_rows = 0;
};

// Phase two of validation, on what every rank sent: the same shapes and options everywhere,
// each rank holding the rows the layout gives it, the options valid for the whole sequence.
// shape: {B, H, Hk, D, Dv} of this rank; n: rows of this rank.
// names: of the shape's entries, for the message.
inline ring_geometry agree_geometry(const comm_info& c, const char* entry, index_t n,
                                    const std::vector<std::int64_t>& shape, const std::vector<const char*>& names,
                                    const softmax_options& opts, int layout_code, bool sharded,
                                    const ad::attention_shape& local) {
    std::vector<std::int64_t> mine{n};
    mine.insert(mine.end(), shape.begin(), shape.end());
    const std::vector<std::int64_t> sig = options_signature(opts, layout_code);
    mine.insert(mine.end(), sig.begin(), sig.end());
    const std::vector<std::int64_t> all = all_gather(c, mine);
    const std::size_t w = mine.size();

    ring_geometry g;
    g.rows.resize(static_cast<std::size_t>(c.size));
    for (int r = 0; r < c.size; ++r) {
        g.rows[static_cast<std::size_t>(r)] = all[r * w];
        g.length += all[r * w];
    }
    const sequence_layout layout = static_cast<sequence_layout>(layout_code);
    agree(c, entry, [&] {
        for (int r = 1; r < c.size; ++r)
            for (std::size_t i = 0; i < w - 1; ++i)
                if (all[r * w + 1 + i] != all[1 + i]) {
                    if (i < shape.size())
                        ad::fail(std::string("rank ") + std::to_string(r) + " has " + names[i] + " = " +
                                 ad::number(all[r * w + 1 + i]) + ", rank 0 " + ad::number(all[1 + i]) +
                                 " (every rank holds rows of the same tensors)");
                    ad::fail("rank " + std::to_string(r) + " was called with options (or layout) other than rank 0's");
                }
        for (int r = 0; r < c.size; ++r) {
            const index_t want = sharded ? shard_rows(g.length, c.size, r).size()
                                         : rank_length(layout, g.length, c.size, r);
            if (g.rows[static_cast<std::size_t>(r)] != want)
                ad::fail(std::string(sharded ? "k" : "q") + ": rank " + std::to_string(r) + " holds " +
                         ad::number(g.rows[static_cast<std::size_t>(r)]) + " rows, but " +
                         (sharded ? std::string("the shards") : std::string("the layout")) + " of " +
                         ad::number(g.length) + " rows over " + std::to_string(c.size) + " ranks give it " +
                         ad::number(want));
        }
        ad::attention_shape whole = local;
        whole.len_k = g.length;
        if (!sharded) whole.len_q = g.length;
        ad::check_options(opts, whole);
    });
    for (int r = 0; r < c.size; ++r) {
        g.pieces.push_back(sharded ? std::vector<row_range>{shard_rows(g.length, c.size, r)}
                                   : rank_rows(layout, g.length, c.size, r));
        g.max_rows = std::max(g.max_rows, g.rows[static_cast<std::size_t>(r)]);
    }
    return g;
}

// The options of one block pair: the whole call's, without sinks (a sink enters once per row,
// merged at the end) and with key_lengths clipped to the block's keys [ka, ka + nk).
inline softmax_options block_options(const softmax_options& o, index_t ka, index_t nk) {
    softmax_options b;
    b.scale = o.scale;
    b.causal = o.causal;
    b.window_left = o.window_left;
    b.chunk = o.chunk;
    b.softcap = o.softcap;
    b.pool = o.pool;
    for (const std::int64_t len : o.key_lengths) b.key_lengths.push_back(std::min(std::max<index_t>(len - ka, 0), nk));
    return b;
}

// Whether any query of rows [qa, qa + nq) sees any key of [ka, ka + nk) (ignoring key_lengths,
// which the kernel applies): pairs that cannot are not computed.
inline bool block_visible(const softmax_options& o, index_t length, index_t qa, index_t nq, index_t ka, index_t nk) {
    if (nq == 0 || nk == 0) return false;
    ad::mask_params mp;
    mp.offset = qa - ka;
    mp.key_origin = ka;
    mp.causal = o.causal || o.chunk > 0;
    mp.window = o.window_left < 0 ? -1 : std::min<index_t>(o.window_left, 2 * length + 1);
    mp.chunk = o.chunk <= 0 ? 0 : std::min<index_t>(o.chunk, 2 * length + 1);
    mp.key_len = nk;
    index_t lo = 0, hi = 0;
    mp.key_range(mp.offset, nq - 1 + mp.offset, lo, hi);
    return lo < hi;
}

// A rank's K and V (or dK and dV) rows as one contiguous buffer: [B, n, Hk, D] then [B, n, Hk, Dv].
struct kv_geometry {
    index_t batch, heads_k, dim, dim_v;
    index_t k_size(index_t n) const { return batch * n * heads_k * dim; }
    index_t size(index_t n) const { return batch * n * heads_k * (dim + dim_v); }
    template <class T>
    view<T, 4> k(T* buf, index_t n) const {
        return view<T, 4>(buf, {batch, n, heads_k, dim});
    }
    template <class T>
    view<T, 4> v(T* buf, index_t n) const {
        return view<T, 4>(buf + k_size(n), {batch, n, heads_k, dim_v});
    }
};

template <class T>
void copy_rows_into(const view<const T, 4>& from, const view<T, 4>& to) {
    for (index_t b = 0; b < from.dims[0]; ++b)
        for (index_t l = 0; l < from.dims[1]; ++l)
            for (index_t h = 0; h < from.dims[2]; ++h) std::copy_n(from.ptr(b, l, h), from.dims[3], to.ptr(b, l, h));
}

template <class T>
void add_rows_into(const view<const float, 4>& from, const view<T, 4>& to) {
    for (index_t b = 0; b < from.dims[0]; ++b)
        for (index_t l = 0; l < from.dims[1]; ++l)
            for (index_t h = 0; h < from.dims[2]; ++h) {
                const float* f = from.ptr(b, l, h);
                T* t = to.ptr(b, l, h);
                for (index_t c = 0; c < from.dims[3]; ++c) t[c] += f[c];
            }
}

// out = 0 and lse = -inf over a rank's rows: the identity of merge_row.
inline void clear_result(const view<float, 4>& out, const view<float, 3>& lse) {
    for (index_t b = 0; b < out.dims[0]; ++b)
        for (index_t i = 0; i < out.dims[1]; ++i)
            for (index_t h = 0; h < out.dims[2]; ++h) {
                std::fill_n(out.ptr(b, i, h), out.dims[3], 0.0f);
                lse(b, i, h) = -std::numeric_limits<float>::infinity();
            }
}

// Folds a partial result over rows [at, at + n) into (out, lse); then, once, the sinks.
inline void merge_into(const view<float, 4>& out, const view<float, 3>& lse, index_t at,
                       const view<const float, 4>& part, const view<const float, 3>& part_lse) {
    for (index_t b = 0; b < part.dims[0]; ++b)
        for (index_t i = 0; i < part.dims[1]; ++i)
            for (index_t h = 0; h < part.dims[2]; ++h)
                ad::merge_row(out.ptr(b, at + i, h), lse(b, at + i, h), part.ptr(b, i, h), part_lse(b, i, h),
                              part.dims[3]);
}

inline void merge_sinks(const view<float, 4>& out, const view<float, 3>& lse, const std::vector<float>& sinks) {
    if (sinks.empty()) return;
    for (index_t b = 0; b < out.dims[0]; ++b)
        for (index_t i = 0; i < out.dims[1]; ++i)
            for (index_t h = 0; h < out.dims[2]; ++h)
                ad::merge_row(out.ptr(b, i, h), lse(b, i, h), nullptr, sinks[static_cast<std::size_t>(h)], out.dims[3]);
}

// What the forward and the backward share: phase one of validation (q, k, v and the layout, then
// the call's own arguments in `more`), the geometry every rank agrees on, and this rank's K/V
// copied into the first block to travel (cur; nxt receives the next).
template <class TK>
struct ring_setup {
    comm_info c;
    ad::attention_shape s{};
    ring_geometry g;
    kv_geometry kg{};
    std::vector<TK> cur, nxt;

    template <class TQ, class More>
    ring_setup(const char* entry, const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TK, 4>& v,
               const ring_options& opts, MPI_Comm comm, More&& more)
        : c(comm) {
        agree(c, entry, [&] {
            s = ad::check_qkv(q, k, v);
            if (s.len_q != s.len_k)
                ad::fail("q and k: a rank holds the same rows of q, k and v, got q " + attnkit::shape_string(q) +
                         ", k " + attnkit::shape_string(k));
            more(s);
            if (opts.layout != sequence_layout::zigzag && opts.layout != sequence_layout::contiguous)
                ad::fail("opts.layout: not a sequence_layout");
        });
        g = agree_geometry(c, entry, s.len_q, {s.batch, s.heads, s.heads_k, s.dim, s.dim_v}, {"B", "H", "Hk", "D", "Dv"},
                           opts.attention, static_cast<int>(opts.layout), false, s);
        kg = kv_geometry{s.batch, s.heads_k, s.dim, s.dim_v};
        cur.resize(static_cast<std::size_t>(kg.size(g.max_rows)));
        nxt.resize(cur.size());
        copy_rows_into(k, kg.k(cur.data(), s.len_k));
        copy_rows_into(v, kg.v(cur.data(), s.len_k));
        t_start = MPI_Wtime();
    }

    double t_start = 0.0, waited = 0.0;  // seconds: MPI_Wtime at the first step, blocked on transfers

    void report(const ring_options& opts) const {
        if (!opts.stats) return;
        opts.stats->wait_seconds = waited;
        opts.stats->compute_seconds = MPI_Wtime() - t_start - waited;
        opts.stats->steps = c.size;
    }
};

template <class A, class TQ, class TK>
void ring_forward(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TK, 4>& v,
                  const view<float, 4>& out, const view<float, 3>& lse, const ring_options& opts, MPI_Comm comm) {
    ring_setup<TK> r("attnkit::distributed::ring_attention", q, k, v, opts, comm, [&](const ad::attention_shape& s) {
        ad::check_out("out", out, s);
        ad::check_lse("lse", lse, s);
        // out is merged into step by step while q is still read: no in-place out.
        ad::check_outputs_apart({ad::region_of("out", out), ad::region_of("lse", lse)},
                                {ad::region_of("q", q), ad::region_of("k", k), ad::region_of("v", v)});
    });
    const comm_info& c = r.c;
    const ad::attention_shape& s = r.s;
    const ring_geometry& g = r.g;
    const kv_geometry& kg = r.kg;
    std::vector<TK>&cur = r.cur, &nxt = r.nxt;
    const int P = c.size, me = c.rank, next = (me + 1) % P, prev = (me + P - 1) % P;
    double& waited = r.waited;
    clear_result(out, lse);

    index_t max_piece = 0;
    for (const row_range& a : g.pieces[static_cast<std::size_t>(me)]) max_piece = std::max(max_piece, a.size());
    std::vector<float> part(static_cast<std::size_t>(s.batch * max_piece * s.heads * s.dim_v));
    std::vector<float> part_lse(static_cast<std::size_t>(s.batch * max_piece * s.heads));

    for (int step = 0; step < P; ++step) {
        const int origin = (me - step + P) % P;
        const index_t n_origin = g.rows[static_cast<std::size_t>(origin)];
        transfers t(c.comm);
        if (step + 1 < P) {
            const int incoming = (me - step - 1 + 2 * P) % P;
            t.receive(nxt.data(), kg.size(g.rows[static_cast<std::size_t>(incoming)]) * index_t(sizeof(TK)), prev,
                      kTagKv);
            t.send(cur.data(), kg.size(n_origin) * index_t(sizeof(TK)), next, kTagKv);
        }
        const view<const TK, 4> kb = kg.k(static_cast<const TK*>(cur.data()), n_origin);
        const view<const TK, 4> vb = kg.v(static_cast<const TK*>(cur.data()), n_origin);
        index_t qoff = 0;
        for (const row_range& a : g.pieces[static_cast<std::size_t>(me)]) {
            index_t koff = 0;
            for (const row_range& kc : g.pieces[static_cast<std::size_t>(origin)]) {
                if (block_visible(opts.attention, g.length, a.begin, a.size(), kc.begin, kc.size())) {
                    const view<float, 4> po(part.data(), {s.batch, a.size(), s.heads, s.dim_v});
                    const view<float, 3> pl(part_lse.data(), {s.batch, a.size(), s.heads});
                    const ad::sequence_frame f{a.begin, kc.begin, g.length};
                    ad::softmax_attention_run<A>(row_slice(q, qoff, a.size()), row_slice(kb, koff, kc.size()),
                                                 row_slice(vb, koff, kc.size()), po, &pl,
                                                 block_options(opts.attention, kc.begin, kc.size()), &f);
                    merge_into(out, lse, qoff, po, pl);
                    t.progress();
                }
                koff += kc.size();
            }
            qoff += a.size();
        }
        waited += t.wait();
        std::swap(cur, nxt);
    }
    merge_sinks(out, lse, opts.attention.sinks);
    r.report(opts);
}

template <class A, class TQ, class TK>
void ring_backward(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TK, 4>& v,
                   const view<const float, 4>& out, const view<const float, 3>& lse,
                   const view<const float, 4>& d_out, const view<float, 4>& d_q, const view<float, 4>& d_k,
                   const view<float, 4>& d_v, const ring_options& opts, MPI_Comm comm) {
    ring_setup<TK> r("attnkit::distributed::ring_attention_backward", q, k, v, opts, comm,
                     [&](const ad::attention_shape& s) {
                         ad::check_out("out", out, s);
                         ad::check_lse("lse", lse, s);
                         ad::check_out("d_out", d_out, s);
                         ad::check_qkv_gradients(d_q, d_k, d_v, s);
                         ad::check_outputs_apart(
                             {ad::region_of("d_q", d_q), ad::region_of("d_k", d_k), ad::region_of("d_v", d_v)},
                             {ad::region_of("q", q), ad::region_of("k", k), ad::region_of("v", v),
                              ad::region_of("out", out), ad::region_of("lse", lse), ad::region_of("d_out", d_out)});
                     });
    const comm_info& c = r.c;
    const ad::attention_shape& s = r.s;
    const ring_geometry& g = r.g;
    const kv_geometry& kg = r.kg;
    std::vector<TK>&cur = r.cur, &nxt = r.nxt;
    const int P = c.size, me = c.rank, next = (me + 1) % P, prev = (me + P - 1) % P;
    double& waited = r.waited;
    // dK/dV of the K/V in hand: this step's contributions (mine), the accumulator arriving from
    // the previous rank (incoming), and the one leaving for the next (outgoing).
    std::vector<float> mine(static_cast<std::size_t>(kg.size(g.max_rows))), incoming(mine.size()),
        outgoing(mine.size());
    for (index_t b = 0; b < s.batch; ++b)
        for (index_t i = 0; i < s.len_q; ++i)
            for (index_t h = 0; h < s.heads; ++h) std::fill_n(d_q.ptr(b, i, h), s.dim, 0.0f);

    index_t max_piece = 0;  // of any rank: dK/dV parts are for the pieces of others
    for (const auto& pieces : g.pieces)
        for (const row_range& a : pieces) max_piece = std::max(max_piece, a.size());
    std::vector<float> dq_part(static_cast<std::size_t>(s.batch * max_piece * s.heads * s.dim));
    std::vector<float> dkv_part(static_cast<std::size_t>(kg.size(max_piece)));
    const softmax_options& o = opts.attention;

    index_t n_outgoing = 0;
    for (int step = 0; step <= P; ++step) {
        transfers t(c.comm);
        // The accumulator finished last step goes on; the one for this step's K/V comes in (at
        // step P, that is this rank's own, complete).
        if (P > 1 && step > 0) {
            const int acc_origin = (me - step + P) % P;
            t.receive(incoming.data(), kg.size(g.rows[static_cast<std::size_t>(acc_origin)]) * index_t(sizeof(float)),
                      prev, kTagGrad);
            t.send(outgoing.data(), kg.size(n_outgoing) * index_t(sizeof(float)), next, kTagGrad);
        }
        if (step == P) {
            waited += t.wait();
            break;
        }
        const int origin = (me - step + P) % P;
        const index_t n_origin = g.rows[static_cast<std::size_t>(origin)];
        if (step + 1 < P) {
            const int in_kv = (me - step - 1 + 2 * P) % P;
            t.receive(nxt.data(), kg.size(g.rows[static_cast<std::size_t>(in_kv)]) * index_t(sizeof(TK)), prev,
                      kTagKv);
            t.send(cur.data(), kg.size(n_origin) * index_t(sizeof(TK)), next, kTagKv);
        }
        std::fill_n(mine.data(), kg.size(n_origin), 0.0f);
        const view<const TK, 4> kb = kg.k(static_cast<const TK*>(cur.data()), n_origin);
        const view<const TK, 4> vb = kg.v(static_cast<const TK*>(cur.data()), n_origin);
        const view<float, 4> mk = kg.k(mine.data(), n_origin), mv = kg.v(mine.data(), n_origin);
        index_t qoff = 0;
        for (const row_range& a : g.pieces[static_cast<std::size_t>(me)]) {
            index_t koff = 0;
            for (const row_range& kc : g.pieces[static_cast<std::size_t>(origin)]) {
                if (block_visible(o, g.length, a.begin, a.size(), kc.begin, kc.size())) {
                    const view<float, 4> dq(dq_part.data(), {s.batch, a.size(), s.heads, s.dim});
                    const view<float, 4> dk = kg.k(dkv_part.data(), kc.size()), dv = kg.v(dkv_part.data(), kc.size());
                    const ad::sequence_frame f{a.begin, kc.begin, g.length};
                    ad::softmax_attention_backward_run<A>(
                        row_slice(q, qoff, a.size()), row_slice(kb, koff, kc.size()), row_slice(vb, koff, kc.size()),
                        row_slice(out, qoff, a.size()), row_slice(lse, qoff, a.size()),
                        row_slice(d_out, qoff, a.size()), dq, dk, dv, static_cast<const view<float, 1>*>(nullptr),
                        block_options(o, kc.begin, kc.size()), &f);
                    add_rows_into<float>(dq, row_slice(d_q, qoff, a.size()));
                    add_rows_into<float>(dk, row_slice(mk, koff, kc.size()));
                    add_rows_into<float>(dv, row_slice(mv, koff, kc.size()));
                    t.progress();
                }
                koff += kc.size();
            }
            qoff += a.size();
        }
        waited += t.wait();
        // outgoing = incoming (what the ranks before added) + mine, in that order on every rank.
        const index_t n = kg.size(n_origin);
        for (std::size_t e = 0; e < static_cast<std::size_t>(n); ++e)
            outgoing[e] = (step > 0 ? incoming[e] : 0.0f) + mine[e];
        n_outgoing = n_origin;
        if (step + 1 < P) std::swap(cur, nxt);
        if (P == 1) break;
    }
    // This rank's own dK/dV: arrived at step P from the previous rank (or computed here, P = 1).
    const std::vector<float>& own = P > 1 ? incoming : outgoing;
    const view<const float, 4> ok = kg.k(own.data(), s.len_k), ov = kg.v(own.data(), s.len_k);
    for (index_t b = 0; b < s.batch; ++b)
        for (index_t l = 0; l < s.len_k; ++l)
            for (index_t h = 0; h < s.heads_k; ++h) {
                std::copy_n(ok.ptr(b, l, h), s.dim, d_k.ptr(b, l, h));
                std::copy_n(ov.ptr(b, l, h), s.dim_v, d_v.ptr(b, l, h));
            }
    r.report(opts);
}

template <class A, class TQ, class TK>
void sharded_decode(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TK, 4>& v,
                    const view<float, 4>& out, const view<float, 3>* lse, const softmax_options& opts, MPI_Comm comm) {
    static constexpr const char* kEntry = "attnkit::distributed::sharded_decode";
    const comm_info c(comm);
    ad::attention_shape s{};
    agree(c, kEntry, [&] {
        s = ad::check_qkv(q, k, v);
        ad::check_out("out", out, s);
        if (lse) ad::check_lse("lse", *lse, s);
        ad::check_outputs_apart({ad::region_of("out", out), lse ? ad::region_of("lse", *lse) : ad::memory_region{}},
                                {ad::region_of("q", q), ad::region_of("k", k), ad::region_of("v", v)});
    });
    const ring_geometry g = agree_geometry(c, kEntry, s.len_k,
                                           {s.batch, s.len_q, s.heads, s.heads_k, s.dim, s.dim_v},
                                           {"B", "Lq", "H", "Hk", "D", "Dv"}, opts, 0, true, s);
    const row_range mine = g.pieces[static_cast<std::size_t>(c.rank)].front();

    // This rank's partial (out, lse), then everyone's, merged in rank order on every rank.
    const index_t n_out = s.batch * s.len_q * s.heads * s.dim_v, n_lse = s.batch * s.len_q * s.heads;
    std::vector<float> part(static_cast<std::size_t>(n_out + n_lse));
    const view<float, 4> po(part.data(), {s.batch, s.len_q, s.heads, s.dim_v});
    const view<float, 3> pl(part.data() + n_out, {s.batch, s.len_q, s.heads});
    clear_result(po, pl);
    if (mine.size() > 0) {
        const ad::sequence_frame f{g.length - s.len_q, mine.begin, g.length};
        ad::softmax_attention_run<A>(q, k, v, po, &pl, block_options(opts, mine.begin, mine.size()), &f);
    }
    std::vector<float> all(part.size() * static_cast<std::size_t>(c.size));
    if (part.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
        throw std::invalid_argument(std::string(kEntry) + ": out holds more than 2^31 - 1 floats per rank");
    check_mpi(MPI_Allgather(part.data(), static_cast<int>(part.size()), MPI_FLOAT, all.data(),
                            static_cast<int>(part.size()), MPI_FLOAT, c.comm),
              "MPI_Allgather");

    std::vector<float> lse_buf(lse ? 0 : static_cast<std::size_t>(n_lse));
    const view<float, 3> l = lse ? *lse : view<float, 3>(lse_buf.data(), {s.batch, s.len_q, s.heads});
    clear_result(out, l);
    for (int r = 0; r < c.size; ++r) {
        const float* base = all.data() + static_cast<std::size_t>(r) * part.size();
        merge_into(out, l, 0, view<const float, 4>(base, {s.batch, s.len_q, s.heads, s.dim_v}),
                   view<const float, 3>(base + n_out, {s.batch, s.len_q, s.heads}));
    }
    merge_sinks(out, l, opts.sinks);
}

}  // namespace detail
}  // namespace distributed
}  // namespace attnkit
