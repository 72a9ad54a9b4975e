// One attention call with pointers and strides taken once from the views, and the mapping of
// work items (batch, key/value head, block of query positions) to rows. Rows of an item are
// position-major: row r is query position i0 + r / G of query head hk * G + r % G, so all query
// heads sharing a key/value head run against the same K/V rows (GQA by index, never by copy).
//
// The storage element types of K/V and of Q are template parameters: kernels convert to float
// only where they pack (copy_rows, pack_q_rows in micro_kernels.hpp) or load (row_kernel.hpp),
// so a half or bfloat16 cache needs no other change; an int8 cache adds its row scales. Every variant's row transform is a policy (row_transform.hpp);
// the problem holds what all of them share: shapes, rows, mask, query scale, value sets.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/mask.hpp"
#include "attnkit/detail/online_softmax.hpp"

namespace attnkit {
namespace detail {

// Rows of a [B, L, H, D] operand. Two other layouts address the same (b, l, h):
//  - packed (varlen): item b's rows start at sequence index start[b] of one [1, total, H, D]
//    tensor (FlashAttention's cu_seqlens); sb is unused;
//  - paged (a KV cache): item b's row l sits in page table[b * table_stride + l / page_rows], at
//    row l % page_rows of it, pages page_stride elements apart (vLLM's block table).
// Kernels read rows in runs (runs(), run_end()): a run is contiguous with stride sl, so a kernel
// that walks a block of rows by pointer arithmetic walks one run at a time and reads pages in
// place, never gathered into a copy.
template <class T>
struct strided_rows_t {
    const T* data = nullptr;
    index_t sb = 0, sl = 0, sh = 0;  // strides of batch, sequence, head; the head dim is contiguous
    const std::int64_t* start = nullptr;
    const std::int32_t* table = nullptr;
    index_t table_stride = 0, page_rows = 0, page_stride = 0;

    const T* row(index_t b, index_t l, index_t h) const {
        if (table)
            return data + static_cast<index_t>(table[b * table_stride + l / page_rows]) * page_stride +
                   (l % page_rows) * sl + h * sh;
        return data + (start ? start[b] * sl : b * sb) + l * sl + h * sh;
    }
    // The end of the run that holds row l: rows [l, run_end(l)) are sl apart in memory.
    index_t run_end(index_t l) const {
        return table ? (l / page_rows + 1) * page_rows : std::numeric_limits<index_t>::max();
    }
    // fn(pointer to row l + i of head h, i, n) over rows [l, l + n) of item b, one run at a time.
    template <class Fn>
    void runs(index_t b, index_t l, index_t n, index_t h, Fn&& fn) const {
        for (index_t i = 0; i < n;) {
            const index_t m = std::min(n - i, run_end(l + i) - (l + i));
            fn(row(b, l + i, h), i, m);
            i += m;
        }
    }
};
using strided_rows = strided_rows_t<float>;

template <class T>
strided_rows_t<T> rows_of(const view<const T, 4>& x) {
    return {x.data, x.strides[0], x.strides[1], x.strides[2]};
}
// The per-row scales [B, L, Hk] of int8 K or V (attnkit/int8_kv.hpp), addressed as rows of one
// element: scale_rows_of(s).row(b, l, h) points at the scale of row (b, l, h).
inline strided_rows_t<float> scale_rows_of(const view<const float, 3>& s) {
    return {s.data, s.strides[0], s.strides[1], s.strides[2]};
}

// KVT: storage of K and V; QT: storage of Q.
template <class KVT = float, class QT = KVT>
struct basic_attention_problem {
    using kv_type = KVT;
    using q_type = QT;

    attention_shape s{};
    strided_rows_t<QT> q;
    strided_rows_t<KVT> k, v;
    // int8 K/V (simd::kIsScaledStorage<KVT>): row (b, l, h) of k is k_scale.row(b, l, h)[0] times
    // its int8 values, and so for v. Kernels apply a key's scale to its scores and a value row's
    // to its weights (one multiply per score, not per element). Unused for other storage.
    strided_rows_t<float> k_scale, v_scale;
    float q_scale = 1.0f;  // folded into the packed queries (softmax: times log2(e) unless capped)
    score_transform tf;    // softmax only: soft-capping
    bool causal = false;
    index_t window = -1, chunk = 0;
    const std::int64_t* key_lengths = nullptr;
    // Per item query counts (varlen and paged batches; null: s.len_q each). With them, causal
    // and window masks align each item bottom-right on its own lengths: query i of item b sits
    // at key position key_len(b) - query_len(b) + i (FlashAttention's varlen rule).
    const std::int64_t* query_lengths = nullptr;
    // Value sets: one score tile and row transform applied to n_sets value tensors, set t read
    // at v + t * v_set_stride (static QK: one fixed Q/K map, every batch item's V). Each set has
    // its own O^T accumulators and output rows; all share the row state (m, l).
    index_t n_sets = 1;
    index_t v_set_stride = 0;
    // A block of one longer sequence (ring attention, sharded decode; set by in_sequence): query
    // i sits at position q_origin + i and key j at k_origin + j of it, and masks keep their
    // meaning there. Not framed: the bottom-right rule above.
    bool framed = false;
    index_t q_origin = 0, k_origin = 0;

    mask_params mask(index_t b) const {
        mask_params mp;
        mp.offset = framed ? q_origin - k_origin : s.len_k - s.len_q;
        mp.key_origin = k_origin;
        mp.causal = causal;
        mp.window = window;
        mp.chunk = chunk;
        mp.key_len = key_lengths ? key_lengths[b] : s.len_k;
        if (query_lengths) mp.offset = mp.key_len - query_lengths[b];
        return mp;
    }
    index_t query_len(index_t b) const { return query_lengths ? query_lengths[b] : s.len_q; }
};
using attention_problem = basic_attention_problem<float>;

// A block of rows: n_pos query positions from i0, all G query heads of each key/value head in
// [hk, hk + n_hk). Rows are head-major, position-major within a head: row r belongs to key/value
// head hk + r / (n_pos * G).
struct row_block {
    index_t b = 0, hk = 0, n_hk = 1, i0 = 0, n_pos = 0, group = 1;

    index_t rows_per_kv_head() const { return n_pos * group; }
    index_t rows() const { return n_hk * n_pos * group; }
    index_t kv_head(index_t r) const { return hk + r / rows_per_kv_head(); }
    index_t pos(index_t r) const { return i0 + (r % rows_per_kv_head()) / group; }
    index_t head(index_t r) const { return kv_head(r) * group + r % group; }
};

// What every variant shares: rows, shapes, causal (bottom-right) and key_lengths. The caller
// sets q_scale and any other mask.
template <class KVT, class QT>
basic_attention_problem<KVT, QT> make_base_problem(const view<const QT, 4>& q, const view<const KVT, 4>& k,
                                                   const view<const KVT, 4>& v, const attention_shape& s,
                                                   bool causal, const std::vector<std::int64_t>& key_lengths) {
    basic_attention_problem<KVT, QT> p;
    p.s = s;
    p.q = rows_of(q);
    p.k = rows_of(k);
    p.v = rows_of(v);
    p.causal = causal;
    p.key_lengths = key_lengths.empty() ? nullptr : key_lengths.data();
    return p;
}

template <class KVT, class QT>
basic_attention_problem<KVT, QT> make_problem(const view<const QT, 4>& q, const view<const KVT, 4>& k,
                                              const view<const KVT, 4>& v, const attention_shape& s,
                                              const softmax_options& o) {
    // chunked local attention is causal within its chunk
    basic_attention_problem<KVT, QT> p = make_base_problem(q, k, v, s, o.causal || o.chunk > 0, o.key_lengths);
    const float scale = resolve_scale(o.scale, s.dim);
    p.tf.softcap = o.softcap > 0.0f ? o.softcap : 0.0f;
    p.q_scale = p.tf.softcap > 0.0f ? scale : scale * simd::kLog2e;
    // A window or chunk longer than every position and key changes nothing; clamping keeps the
    // position arithmetic of mask.hpp far from overflow for any value the options accept.
    const index_t span = s.len_q + s.len_k + 1;
    p.window = o.window_left < 0 ? -1 : std::min<index_t>(o.window_left, span);
    p.chunk = o.chunk <= 0 ? 0 : std::min<index_t>(o.chunk, span);
    return p;
}

// Rows [q_origin, q_origin + Lq) and keys [k_origin, k_origin + Lk) of a sequence of `length`
// positions: the mask options keep their meaning in that sequence (key_lengths are the caller's,
// already clipped to the block's keys).
struct sequence_frame {
    index_t q_origin = 0, k_origin = 0, length = 0;
};

// Places problem p in frame f; window and chunk are clamped on the whole sequence's span, as
// make_problem clamps them on the call's.
template <class KVT, class QT>
void in_sequence(basic_attention_problem<KVT, QT>& p, const sequence_frame& f, const softmax_options& o) {
    p.framed = true;
    p.q_origin = f.q_origin;
    p.k_origin = f.k_origin;
    const index_t span = 2 * f.length + 1;
    p.window = o.window_left < 0 ? -1 : std::min<index_t>(o.window_left, span);
    p.chunk = o.chunk <= 0 ? 0 : std::min<index_t>(o.chunk, span);
}

// Keys [lo, hi) that a query at position `pos` sees, clipped to the piece [ks0, ks1) of the
// keys a work item covers; lo == hi when it sees none of them.
inline void row_interval(const mask_params& mp, index_t pos, index_t ks0, index_t ks1, index_t& lo, index_t& hi) {
    mp.interval(pos + mp.offset, lo, hi);
    lo = std::min(std::max(lo, ks0), ks1);
    hi = std::max(lo, std::min(hi, ks1));
}

}  // namespace detail
}  // namespace attnkit
