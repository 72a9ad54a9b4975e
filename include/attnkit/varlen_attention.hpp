// Softmax attention over a packed ragged batch (FlashAttention's varlen API).
//
//   attnkit::softmax_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, out, opts);
//   attnkit::softmax_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, opts);
//     q [Tq, H, D], k [Tk, Hk, D], v [Tk, Hk, Dv], out [Tq, H, Dv], lse [Tq, H] (natural log)
//     cu_seqlens_q, cu_seqlens_k: B + 1 row offsets, std::vector<std::int64_t>
//
// Sequence b owns query rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and key/value rows
// [cu_seqlens_k[b], cu_seqlens_k[b + 1]); no sequence sees another's keys. Masks align each
// sequence bottom-right on its own lengths, as FlashAttention's varlen kernels do: with Lq_b
// queries and Lk_b keys, query i sits at key position Lk_b - Lq_b + i, so a chunk of a prefill
// (Lq_b < Lk_b, the chunk's keys last) or a few speculative tokens after a cache see exactly
// their prefix, causal or windowed (opts.window_left) or chunked. A query that sees no key
// (Lq_b > Lk_b, causal) gets zeros and lse = -inf. Every option of softmax_attention applies
// except key_lengths (the lengths are the sequences'); storage types as softmax_attention.
//
// The call is one pass of the engine over every sequence's work items, split and threaded as
// softmax_attention splits a batch; results are bitwise those of any thread count.
//
// Errors (std::invalid_argument naming the argument, before anything is written): offsets not
// starting at 0, decreasing, or not ending at the row count; different sequence counts; shapes
// as softmax_attention's; opts.key_lengths set; out or lse overlapping an input.
#pragma once

#include <cstdint>
#include <vector>

#include "attnkit/detail/varlen.hpp"
#include "attnkit/softmax_attention.hpp"

namespace attnkit {
namespace detail {

template <class A, class TQ, class TK, class TV, class TO, class TL>
void softmax_attention_varlen_impl(const view<const TQ, 3>& q3, const view<const TK, 3>& k3,
                                   const view<const TV, 3>& v3,
                                   const std::vector<std::int64_t>& cu_q,
                                   const std::vector<std::int64_t>& cu_k, const view<TO, 3>& out3,
                                   const view<TL, 2>* lse2, const softmax_options& opts) {
    constexpr bool kStorage = kIsAttentionStorage<TQ, TK, TV, TO, TL>;
    static_assert(kStorage,
                  "attnkit::softmax_attention_varlen: k and v must be float, Eigen::bfloat16 or "
                  "Eigen::half tensors "
                  "of one type, q float or that type, out and lse float");
    if constexpr (kStorage) {
        const packed_rows<TQ> rows(q3, out3, lse2);
        const auto& q = rows.q;
        const auto& out = rows.out;
        const auto k = as_batch_of_one(k3);
        const auto v = as_batch_of_one(v3);
        attention_shape s = check_qkv(q, k, v);
        check_out("out", out, s);
        if (rows.has_lse) check_lse("lse", rows.lse, s);
        // Per-thread scratch (detail/scratch.hpp): a call allocates nothing after the first.
        scratch_lease<std::int64_t> q_len_lease, k_len_lease, q_start_lease, k_start_lease;
        std::vector<std::int64_t>& q_len = q_len_lease.get();
        std::vector<std::int64_t>& k_len = k_len_lease.get();
        check_cu_seqlens("cu_seqlens_q", cu_q, s.len_q, "q", [&] { return shape_string(q3); }, q_len);
        check_cu_seqlens("cu_seqlens_k", cu_k, s.len_k, "k", [&] { return shape_string(k3); }, k_len);
        if (q_len.size() != k_len.size())
            fail("cu_seqlens_k: expected B + 1 = " + number(cu_q.size()) +
                 " offsets as cu_seqlens_q, got " + number(cu_k.size()));
        s.batch = static_cast<index_t>(q_len.size());
        s.len_q = q_len.empty() ? 0 : *std::max_element(q_len.begin(), q_len.end());
        s.len_k = k_len.empty() ? 0 : *std::max_element(k_len.begin(), k_len.end());
        check_max_keys("cu_seqlens_k", s.len_k, "keys per sequence", "the longest sequence's Lk",
                       k3);
        check_packed_options(opts, s);
        check_attention_memory(q, k, v, out, rows.lse_ptr());

        std::vector<std::int64_t>& q_start = q_start_lease.get();
        std::vector<std::int64_t>& k_start = k_start_lease.get();
        q_start.assign(cu_q.begin(), cu_q.end() - 1);
        k_start.assign(cu_k.begin(), cu_k.end() - 1);
        strided_rows_t<TK> kr = rows_of(k), vr = rows_of(v);
        kr.start = vr.start = k_start.data();
        packed_forward<A>(q, kr, vr, s, q_start, q_len, k_len, out, rows.lse_ptr(), opts);
    }
}

}  // namespace detail

template <class Q, class K, class V, class O>
void softmax_attention_varlen(const Q& q, const K& k, const V& v,
                              const std::vector<std::int64_t>& cu_seqlens_q,
                              const std::vector<std::int64_t>& cu_seqlens_k, O&& out,
                              const softmax_options& opts = {}) {
    detail::softmax_attention_varlen_impl<simd::default_arch>(
        detail::input_view<3>("q", q, "[Tq, H, D]"), detail::input_view<3>("k", k, "[Tk, Hk, D]"),
        detail::input_view<3>("v", v, "[Tk, Hk, Dv]"), cu_seqlens_q, cu_seqlens_k,
        detail::output_view<3>("out", std::forward<O>(out), "[Tq, H, Dv]"),
        static_cast<const view<float, 2>*>(nullptr), opts);
}

template <class Q, class K, class V, class O, class L,
          std::enable_if_t<detail::kIsLseArg<L, softmax_options>, int> = 0>
void softmax_attention_varlen(const Q& q, const K& k, const V& v,
                              const std::vector<std::int64_t>& cu_seqlens_q,
                              const std::vector<std::int64_t>& cu_seqlens_k, O&& out, L&& lse,
                              const softmax_options& opts = {}) {
    const auto lse_v = detail::output_view<2>("lse", std::forward<L>(lse), "[Tq, H]");
    detail::softmax_attention_varlen_impl<simd::default_arch>(
        detail::input_view<3>("q", q, "[Tq, H, D]"), detail::input_view<3>("k", k, "[Tk, Hk, D]"),
        detail::input_view<3>("v", v, "[Tk, Hk, Dv]"), cu_seqlens_q, cu_seqlens_k,
        detail::output_view<3>("out", std::forward<O>(out), "[Tq, H, Dv]"), &lse_v, opts);
}

}  // namespace attnkit
