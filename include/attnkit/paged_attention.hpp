// Softmax attention of a ragged batch over a paged KV cache (vLLM's and FlashAttention's
// block_table), prefill chunks and decode steps in one call (continuous batching).
//
//   attnkit::paged_kv kv;                    // which pages hold which sequence's keys
//   kv.cu_seqlens_q = {0, 1, 2, 130};        // B + 1 offsets into q's rows: two decode steps, a
//   chunk kv.seq_lengths = {900, 17, 128};         // keys per sequence, the step's own included
//   kv.pages_per_seq = 16;                   // the block table's row length
//   kv.block_table = {...};                  // [B * pages_per_seq] page indices, int32
//   attnkit::paged_attention(q, k_pages, v_pages, kv, out, opts);
//   attnkit::paged_attention(q, k_pages, v_pages, kv, out, lse, opts);
//     q [Tq, H, D], k_pages [P, page_rows, Hk, D], v_pages [P, page_rows, Hk, Dv],
//     out [Tq, H, Dv], lse [Tq, H]
//   attnkit::paged_attention(q, k8_pages, v8_pages, kv, out[, lse], opts);   int8 pages: int8_kv
//     views of values [P, page_rows, Hk, D] and scales [P, page_rows, Hk] (int8_kv.hpp)
//
// Key j of sequence b is row j % page_rows of page block_table[b * pages_per_seq + j /
// page_rows]; only the pages that hold keys j < seq_lengths[b] are read (the rest of a table row
// may hold anything). Query rows and masks are as softmax_attention_varlen's (each sequence
// aligned bottom-right on its own lengths: its new tokens are its last seq_lengths[b] keys'
// tail). attnkit::kv_cache (kv_cache.hpp) owns pages and tables and calls this.
//
// The kernels read K and V in the pages, never through a gathered copy: page_rows must be a
// multiple of 64, the decode kernel's key block (FlashAttention 2 asks for multiples of 256), so
// a block never straddles two pages. The result is bitwise the softmax_attention_varlen result on
// the same keys packed contiguously, for any thread count.
//
// Errors (std::invalid_argument naming the argument, before anything is written): the offsets as
// in softmax_attention_varlen; seq_lengths of another count, negative, shorter than a
// sequence's queries is allowed (those queries see only what precedes them), or longer than
// pages_per_seq * page_rows; a block table of the wrong size or with a page index outside
// [0, P) where a key is read; page_rows not a multiple of 64; shapes and options as
// softmax_attention's (key_lengths must be empty); out or lse overlapping an input.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/detail/varlen.hpp"
#include "attnkit/softmax_attention.hpp"

namespace attnkit {

// Which pages hold a ragged batch's keys and which rows of q are whose.
struct paged_kv {
    std::vector<std::int64_t> cu_seqlens_q;  // B + 1 offsets into q's rows (0 first, Tq last)
    std::vector<std::int64_t> seq_lengths;   // B key counts, each <= pages_per_seq * page_rows
    std::vector<std::int32_t> block_table;   // B * pages_per_seq page indices
    index_t pages_per_seq = 0;
};

namespace detail {

// The key length of a page of a paged cache is a multiple of this (the row kernel's block).
constexpr index_t kPageRowsMultiple = kRowBlockKeys;

template <class TK, class TV>
void check_paged_kv(const paged_kv& kv, const view<const TK, 4>& kp, const view<const TV, 4>& vp,
                    const std::vector<std::int64_t>& q_len) {
    const index_t P = kp.dims[0], rows = kp.dims[1];
    if (rows % kPageRowsMultiple != 0 || rows == 0)
        fail("k_pages: page_rows (dimension 1) must be a positive multiple of " +
             number(kPageRowsMultiple) + ", got " + shape_string(kp));
    const std::size_t B = q_len.size();
    if (kv.seq_lengths.size() != B)
        fail("kv.seq_lengths: expected one per sequence, B = " + number(B) +
             " (from kv.cu_seqlens_q), got " + number(kv.seq_lengths.size()));
    if (kv.pages_per_seq < 0)
        fail("kv.pages_per_seq: expected >= 0, got " + number(kv.pages_per_seq));
    if (kv.pages_per_seq > 0 &&
        static_cast<index_t>(B) > std::numeric_limits<index_t>::max() / kv.pages_per_seq)
        fail("kv.pages_per_seq: B * pages_per_seq overflows int64 (B = " + number(B) +
             ", pages_per_seq = " + number(kv.pages_per_seq) + ")");
    if (static_cast<index_t>(kv.block_table.size()) != static_cast<index_t>(B) * kv.pages_per_seq)
        fail("kv.block_table: expected B * pages_per_seq = " + number(B) + " * " +
             number(kv.pages_per_seq) + " entries, got " + number(kv.block_table.size()));
    const index_t capacity = kv.pages_per_seq > std::numeric_limits<index_t>::max() / rows
                                 ? std::numeric_limits<index_t>::max()
                                 : kv.pages_per_seq * rows;
    for (std::size_t b = 0; b < B; ++b) {
        const std::int64_t n = kv.seq_lengths[b];
        if (n < 0 || n > capacity)
            fail("kv.seq_lengths[" + number(b) +
                 "]: expected 0 <= length <= pages_per_seq * page_rows = " + number(capacity) +
                 ", got " + number(n));
        for (index_t pg = 0; pg * rows < n; ++pg) {
            const std::int32_t at = kv.block_table[b * static_cast<std::size_t>(kv.pages_per_seq) +
                                                   static_cast<std::size_t>(pg)];
            if (at < 0 || at >= P)
                fail("kv.block_table[" + number(b) + " * pages_per_seq + " + number(pg) +
                     "]: expected a page in [0, " + number(P) + ") of k_pages " + shape_string(kp) +
                     ", got " + number(at));
        }
    }
    check_shape("v_pages", vp, {P, rows, kp.dims[2], vp.dims[3]}, "[P, page_rows, Hk, Dv]");
}

// ks, vs: the scale pages [P, page_rows, Hk] of int8 pages (int8_kv.hpp), else null.
template <class A, class TQ, class TK, class TV, class TO, class TL>
void paged_attention_impl(const view<const TQ, 3>& q3, const view<const TK, 4>& kp,
                          const view<const TV, 4>& vp, const paged_kv& kv, const view<TO, 3>& out3,
                          const view<TL, 2>* lse2, const softmax_options& opts,
                          const view<const float, 3>* ks = nullptr, const view<const float, 3>* vs = nullptr) {
    constexpr bool kInt8 = std::is_same<TK, std::int8_t>::value && std::is_same<TV, std::int8_t>::value &&
                           std::is_same<TQ, float>::value && std::is_same<TO, float>::value &&
                           std::is_same<TL, float>::value;
    constexpr bool kStorage = kIsAttentionStorage<TQ, TK, TV, TO, TL> || kInt8;
    static_assert(kStorage,
                  "attnkit::paged_attention: the pages must be float, Eigen::bfloat16 or "
                  "Eigen::half of one type, q "
                  "float or that type, out and lse float");
    if constexpr (kStorage) {
        const packed_rows<TQ> rows(q3, out3, lse2);
        const auto& q = rows.q;
        const auto& out = rows.out;
        check_layout("q", q);
        check_layout("k_pages", kp);
        check_layout("v_pages", vp);
        attention_shape s{1, q.dims[1], 0, q.dims[2], kp.dims[2], q.dims[3], vp.dims[3]};
        if (s.heads < 1 || s.dim < 1)
            fail("q: heads and head dim must be >= 1, got " + shape_string(q3));
        if (s.heads_k < 1) fail("k_pages: heads must be >= 1, got " + shape_string(kp));
        if (s.dim_v < 1) fail("v_pages: head dim must be >= 1, got " + shape_string(vp));
        check_shape("k_pages", kp, {kp.dims[0], kp.dims[1], s.heads_k, s.dim},
                    "[P, page_rows, Hk, D]");
        if (s.heads % s.heads_k != 0)
            fail("k_pages: query heads H = " + number(s.heads) +
                 " must be a multiple of key heads Hk = " + number(s.heads_k) + " (q " +
                 shape_string(q3) + ", k_pages " + shape_string(kp) + ")");
        check_out("out", out, s);
        if (rows.has_lse) check_lse("lse", rows.lse, s);
        // Per-thread scratch (detail/scratch.hpp): a decode step allocates nothing after the first.
        scratch_lease<std::int64_t> q_len_lease, q_start_lease;
        std::vector<std::int64_t>& q_len = q_len_lease.get();
        check_cu_seqlens("kv.cu_seqlens_q", kv.cu_seqlens_q, s.len_q, "q", [&] { return shape_string(q3); }, q_len);
        check_paged_kv(kv, kp, vp, q_len);
        s.batch = static_cast<index_t>(q_len.size());
        s.len_q = q_len.empty() ? 0 : *std::max_element(q_len.begin(), q_len.end());
        s.len_k = kv.seq_lengths.empty()
                      ? 0
                      : *std::max_element(kv.seq_lengths.begin(), kv.seq_lengths.end());
        check_max_keys("kv.seq_lengths", s.len_k, "keys per sequence",
                       "the longest sequence's length", kp);
        check_packed_options(opts, s);
        constexpr unsigned kOutIsQ = 1;
        check_outputs_apart({in_place(region_of("out", out), kOutIsQ),
                             rows.has_lse ? region_of("lse", rows.lse) : memory_region{}},
                            {in_place(region_of("q", q), kOutIsQ), region_of("k_pages", kp),
                             region_of("v_pages", vp)});
        if constexpr (kInt8) {
            check_outputs_apart({region_of("out", out), rows.has_lse ? region_of("lse", rows.lse) : memory_region{}},
                                {region_of("k_pages.scales", *ks), region_of("v_pages.scales", *vs)});
            check_kv_scales("k_pages.scales", *ks, kp.dims[0], kp.dims[1], s.heads_k);
            check_kv_scales("v_pages.scales", *vs, kp.dims[0], kp.dims[1], s.heads_k);
        }

        std::vector<std::int64_t>& q_start = q_start_lease.get();
        q_start.assign(kv.cu_seqlens_q.begin(), kv.cu_seqlens_q.end() - 1);
        auto paged = [&](auto r, const auto& pages) {
            r.table = kv.block_table.data();
            r.table_stride = kv.pages_per_seq;
            r.page_rows = pages.dims[1];
            r.page_stride = pages.strides[0];
            return r;
        };
        strided_rows_t<float> k_scale, v_scale;
        if (ks) k_scale = paged(scale_rows_of(*ks), *ks);
        if (vs) v_scale = paged(scale_rows_of(*vs), *vs);
        packed_forward<A>(q, paged(rows_of(kp), kp), paged(rows_of(vp), vp), s, q_start, q_len, kv.seq_lengths, out,
                          rows.lse_ptr(), opts, k_scale, v_scale);
    }
}

}  // namespace detail

// int8 pages (int8_kv.hpp): values [P, page_rows, Hk, D] with scales [P, page_rows, Hk] (and so
// for V), in the same pages as the values; q, out and lse float.
template <class Q, class O>
void paged_attention(const Q& q, const int8_kv& k_pages, const int8_kv& v_pages, const paged_kv& kv, O&& out,
                     const softmax_options& opts = {}) {
    detail::paged_attention_impl<simd::default_arch>(
        detail::input_view<3>("q", q, "[Tq, H, D]"), k_pages.values(), v_pages.values(), kv,
        detail::output_view<3>("out", std::forward<O>(out), "[Tq, H, Dv]"),
        static_cast<const view<float, 2>*>(nullptr), opts, &k_pages.scales(), &v_pages.scales());
}
template <class Q, class O, class L, std::enable_if_t<detail::kIsLseArg<L, softmax_options>, int> = 0>
void paged_attention(const Q& q, const int8_kv& k_pages, const int8_kv& v_pages, const paged_kv& kv, O&& out,
                     L&& lse, const softmax_options& opts = {}) {
    const auto lse_v = detail::output_view<2>("lse", std::forward<L>(lse), "[Tq, H]");
    detail::paged_attention_impl<simd::default_arch>(
        detail::input_view<3>("q", q, "[Tq, H, D]"), k_pages.values(), v_pages.values(), kv,
        detail::output_view<3>("out", std::forward<O>(out), "[Tq, H, Dv]"), &lse_v, opts, &k_pages.scales(),
        &v_pages.scales());
}

template <class Q, class K, class V, class O>
void paged_attention(const Q& q, const K& k_pages, const V& v_pages, const paged_kv& kv, O&& out,
                     const softmax_options& opts = {}) {
    detail::paged_attention_impl<simd::default_arch>(
        detail::input_view<3>("q", q, "[Tq, H, D]"),
        detail::input_view<4>("k_pages", k_pages, "[P, page_rows, Hk, D]"),
        detail::input_view<4>("v_pages", v_pages, "[P, page_rows, Hk, Dv]"), kv,
        detail::output_view<3>("out", std::forward<O>(out), "[Tq, H, Dv]"),
        static_cast<const view<float, 2>*>(nullptr), opts);
}

template <class Q, class K, class V, class O, class L,
          std::enable_if_t<detail::kIsLseArg<L, softmax_options>, int> = 0>
void paged_attention(const Q& q, const K& k_pages, const V& v_pages, const paged_kv& kv, O&& out,
                     L&& lse, const softmax_options& opts = {}) {
    const auto lse_v = detail::output_view<2>("lse", std::forward<L>(lse), "[Tq, H]");
    detail::paged_attention_impl<simd::default_arch>(
        detail::input_view<3>("q", q, "[Tq, H, D]"),
        detail::input_view<4>("k_pages", k_pages, "[P, page_rows, Hk, D]"),
        detail::input_view<4>("v_pages", v_pages, "[P, page_rows, Hk, Dv]"), kv,
        detail::output_view<3>("out", std::forward<O>(out), "[Tq, H, Dv]"), &lse_v, opts);
}

}  // namespace attnkit
