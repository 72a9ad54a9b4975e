// Softmax attention over a packed ragged batch (FlashAttention's varlen API).
//
//   attnkit::softmax_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, out, opts);
//   attnkit::softmax_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, opts);
//     q [Tq, H, D], k [Tk, Hk, D], v [Tk, Hk, Dv], out [Tq, H, Dv], lse [Tq, H] (natural log)
//   attnkit::softmax_attention_varlen(q, k8, v8, cu_seqlens_q, cu_seqlens_k, out[, lse], opts);
//     int8 K/V: int8_kv(values [Tk, Hk, D], scales [Tk, Hk]) each (int8_kv.hpp)
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
#include "attnkit/int8_kv.hpp"
#include "attnkit/softmax_attention.hpp"

namespace attnkit {
namespace detail {

// The checks and row offsets of a packed call, for any K/V storage: k and v as batch-of-one
// views ([1, Tk, Hk, D]); run(s, kr, vr, q_start, q_len, k_len) gets the call's shape (B the
// sequence count, Lq and Lk the longest sequence's) and K/V rows addressed per sequence, after
// every check and before anything is written.
template <class TQ, class TK, class TV, class Shape, class Run>
void varlen_frame(const packed_rows<TQ>& rows, const view<const TK, 4>& k, const view<const TV, 4>& v,
                  const Shape& k_shape, const std::vector<std::int64_t>& cu_q, const std::vector<std::int64_t>& cu_k,
                  const std::string& q_shape, const softmax_options& opts, Run&& run) {
    attention_shape s = check_qkv(rows.q, k, v);
    check_out("out", rows.out, s);
    if (rows.has_lse) check_lse("lse", rows.lse, s);
    // Per-thread scratch (detail/scratch.hpp): a call allocates nothing after the first.
    scratch_lease<std::int64_t> q_len_lease, k_len_lease, q_start_lease, k_start_lease;
    std::vector<std::int64_t>& q_len = q_len_lease.get();
    std::vector<std::int64_t>& k_len = k_len_lease.get();
    check_cu_seqlens("cu_seqlens_q", cu_q, s.len_q, "q", [&] { return q_shape; }, q_len);
    check_cu_seqlens("cu_seqlens_k", cu_k, s.len_k, "k", [&] { return shape_string(k_shape); }, k_len);
    if (q_len.size() != k_len.size())
        fail("cu_seqlens_k: expected B + 1 = " + number(cu_q.size()) + " offsets as cu_seqlens_q, got " +
             number(cu_k.size()));
    s.batch = static_cast<index_t>(q_len.size());
    s.len_q = q_len.empty() ? 0 : *std::max_element(q_len.begin(), q_len.end());
    s.len_k = k_len.empty() ? 0 : *std::max_element(k_len.begin(), k_len.end());
    check_max_keys("cu_seqlens_k", s.len_k, "keys per sequence", "the longest sequence's Lk", k_shape);
    check_packed_options(opts, s);
    check_attention_memory(rows.q, k, v, rows.out, rows.lse_ptr());

    std::vector<std::int64_t>& q_start = q_start_lease.get();
    std::vector<std::int64_t>& k_start = k_start_lease.get();
    q_start.assign(cu_q.begin(), cu_q.end() - 1);
    k_start.assign(cu_k.begin(), cu_k.end() - 1);
    strided_rows_t<TK> kr = rows_of(k);
    strided_rows_t<TV> vr = rows_of(v);
    kr.start = vr.start = k_start.data();
    run(s, kr, vr, q_start, q_len, k_len);
}

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
        varlen_frame(rows, as_batch_of_one(k3), as_batch_of_one(v3), k3, cu_q, cu_k, shape_string(q3), opts,
                     [&](const attention_shape& s, const strided_rows_t<TK>& kr, const strided_rows_t<TV>& vr,
                         const std::vector<std::int64_t>& q_start, const std::vector<std::int64_t>& q_len,
                         const std::vector<std::int64_t>& k_len) {
                         packed_forward<A>(rows.q, kr, vr, s, q_start, q_len, k_len, rows.out, rows.lse_ptr(), opts);
                     });
    }
}

// int8 K/V (int8_kv.hpp), packed: values [Tk, Hk, D] and scales [Tk, Hk] (an int8_kv built from
// rank-3 values holds them as a batch of one); the scales' rows are addressed per sequence as
// the values' are.
template <class A, class TQ, class TO, class TL>
void softmax_attention_varlen_int8_impl(const view<const TQ, 3>& q3, const int8_kv& k, const int8_kv& v,
                                        const std::vector<std::int64_t>& cu_q, const std::vector<std::int64_t>& cu_k,
                                        const view<TO, 3>& out3, const view<TL, 2>* lse2, const softmax_options& opts) {
    constexpr bool kStorage =
        std::is_same<TQ, float>::value && std::is_same<TO, float>::value && std::is_same<TL, float>::value;
    static_assert(kStorage, "attnkit::softmax_attention_varlen with int8 K/V: q, out and lse must be float tensors");
    if constexpr (kStorage) {
        for (const auto* x : {&k, &v})
            if (x->values().dims[0] != 1)
                fail(std::string(x == &k ? "k" : "v") +
                     ": softmax_attention_varlen takes packed int8 K/V (values [Tk, Hk, D], scales [Tk, Hk]), got "
                     "values " +
                     shape_string(x->values()));
        const packed_rows<float> rows(q3, out3, lse2);
        varlen_frame(rows, k.values(), v.values(), k.values(), cu_q, cu_k, shape_string(q3), opts,
                     [&](const attention_shape& s, const strided_rows_t<std::int8_t>& kr,
                         const strided_rows_t<std::int8_t>& vr, const std::vector<std::int64_t>& q_start,
                         const std::vector<std::int64_t>& q_len, const std::vector<std::int64_t>& k_len) {
                         const index_t total = k.values().dims[1];
                         check_outputs_apart({region_of("out", rows.out), rows.has_lse ? region_of("lse", rows.lse)
                                                                                       : memory_region{}},
                                             {region_of("k.scales", k.scales()), region_of("v.scales", v.scales())});
                         check_kv_scales("k.scales", k.scales(), 1, total, s.heads_k);
                         check_kv_scales("v.scales", v.scales(), 1, total, s.heads_k);
                         strided_rows_t<float> ks = scale_rows_of(k.scales()), vs = scale_rows_of(v.scales());
                         ks.start = vs.start = kr.start;
                         packed_forward<A>(rows.q, kr, vr, s, q_start, q_len, k_len, rows.out, rows.lse_ptr(), opts,
                                           ks, vs);
                     });
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

// int8 K/V (int8_kv.hpp), packed rows: int8_kv(values [Tk, Hk, D], scales [Tk, Hk]).
template <class Q, class O>
void softmax_attention_varlen(const Q& q, const int8_kv& k, const int8_kv& v,
                              const std::vector<std::int64_t>& cu_seqlens_q,
                              const std::vector<std::int64_t>& cu_seqlens_k, O&& out,
                              const softmax_options& opts = {}) {
    detail::softmax_attention_varlen_int8_impl<simd::default_arch>(
        detail::input_view<3>("q", q, "[Tq, H, D]"), k, v, cu_seqlens_q, cu_seqlens_k,
        detail::output_view<3>("out", std::forward<O>(out), "[Tq, H, Dv]"),
        static_cast<const view<float, 2>*>(nullptr), opts);
}

template <class Q, class O, class L, std::enable_if_t<detail::kIsLseArg<L, softmax_options>, int> = 0>
void softmax_attention_varlen(const Q& q, const int8_kv& k, const int8_kv& v,
                              const std::vector<std::int64_t>& cu_seqlens_q,
                              const std::vector<std::int64_t>& cu_seqlens_k, O&& out, L&& lse,
                              const softmax_options& opts = {}) {
    const auto lse_v = detail::output_view<2>("lse", std::forward<L>(lse), "[Tq, H]");
    detail::softmax_attention_varlen_int8_impl<simd::default_arch>(
        detail::input_view<3>("q", q, "[Tq, H, D]"), k, v, cu_seqlens_q, cu_seqlens_k,
        detail::output_view<3>("out", std::forward<O>(out), "[Tq, H, Dv]"), &lse_v, opts);
}

}  // namespace attnkit
