// Sequence-parallel softmax attention over MPI (optional: CMake target attnkit::distributed,
// configured where MPI is found; the rest of attnkit never includes this header).
//
//   // every rank holds its rows of the global [B, L, ...] tensors (distributed_options.hpp):
//   attnkit::distributed::ring_options ro;            // ro.attention: causal, window, sinks, ...
//   attnkit::distributed::ring_attention(q, k, v, out, lse, ro, MPI_COMM_WORLD);
//   attnkit::distributed::ring_attention_backward(q, k, v, out, lse, d_out, d_q, d_k, d_v, ro, MPI_COMM_WORLD);
//   // a KV cache sharded by position, q [B, Lq, H, D] the same on every rank; every rank gets out:
//   attnkit::distributed::sharded_decode(q, k_shard, v_shard, out, opts, MPI_COMM_WORLD);
//   attnkit::distributed::sharded_decode(q, k_shard, v_shard, out, lse, opts, MPI_COMM_WORLD);
//
// Ring attention (Liu et al., 2023): K/V blocks travel round the ring of ranks, sent while the
// block in hand is attended to, and each rank merges its partial results exactly by lse; the
// backward sends the K/V again with their dK/dV accumulators, which end at their owners. The
// default zigzag layout gives every rank the same share of a causal sequence. Masks keep their
// meaning in the whole sequence (query i of L at position i; key_lengths of the whole sequence),
// so the result is the single-process softmax_attention on the global tensors up to rounding,
// and the same bits on every run for a given rank count and layout.
//
// Arguments and storage types are softmax_attention's (float q, k, v; k and v bfloat16 or half
// with q float or that type; out, lse and gradients float). Every call is collective: bad input
// on any rank (shapes, options that differ between ranks, a rank holding other rows than its
// layout gives it) makes every rank throw the same std::invalid_argument, naming the rank, before
// anything is written or sent.
#pragma once

#include <mpi.h>

#include <type_traits>
#include <utility>

#include "attnkit/detail/backward/arguments.hpp"
#include "attnkit/detail/distributed/ring.hpp"
#include "attnkit/distributed_options.hpp"

namespace attnkit {
namespace distributed {

// out [B, n, H, Dv] and lse [B, n, H] of this rank's n rows (natural log; -inf where no key is
// visible, with out = 0).
template <class Q, class K, class V, class O, class L>
void ring_attention(const Q& q, const K& k, const V& v, O&& out, L&& lse, const ring_options& opts, MPI_Comm comm) {
    const auto qv = attnkit::detail::q_view(q);
    const auto kv = attnkit::detail::k_view(k);
    const auto vv = attnkit::detail::v_view(v);
    const auto ov = attnkit::detail::out_view(std::forward<O>(out));
    const auto lv = attnkit::detail::lse_view(std::forward<L>(lse));
    using TQ = typename decltype(qv)::value_type;
    using TK = typename decltype(kv)::value_type;
    constexpr bool kStorage = attnkit::detail::kIsAttentionStorage<TQ, TK, typename decltype(vv)::value_type,
                                                                   typename decltype(ov)::value_type,
                                                                   typename decltype(lv)::value_type>;
    static_assert(kStorage,
                  "attnkit::distributed::ring_attention: k and v must be float, Eigen::bfloat16 or Eigen::half tensors "
                  "of one type, q float or that type, out and lse float");
    if constexpr (kStorage) detail::ring_forward<simd::default_arch, TQ, TK>(qv, kv, vv, ov, lv, opts, comm);
}

// d_q, d_k, d_v of this rank's rows, overwritten; out and lse are ring_attention's.
template <class Q, class K, class V, class O, class L, class DO, class GQ, class GK, class GV>
void ring_attention_backward(const Q& q, const K& k, const V& v, const O& out, const L& lse, const DO& d_out,
                             GQ&& d_q, GK&& d_k, GV&& d_v, const ring_options& opts, MPI_Comm comm) {
    const auto a = attnkit::detail::softmax_backward_arguments(q, k, v, out, lse, d_out, std::forward<GQ>(d_q),
                                                               std::forward<GK>(d_k), std::forward<GV>(d_v));
    using TQ = typename decltype(a.q)::value_type;
    using TK = typename decltype(a.k)::value_type;
    using TG = typename decltype(a.d_q)::value_type;
    constexpr bool kStorage =
        attnkit::detail::kIsKernelStorage<TQ, TK, typename decltype(a.v)::value_type> &&
        std::is_same<typename decltype(a.out)::value_type, float>::value &&
        std::is_same<typename decltype(a.lse)::value_type, float>::value &&
        std::is_same<typename decltype(a.d_out)::value_type, float>::value && std::is_same<TG, float>::value;
    static_assert(kStorage,
                  "attnkit::distributed::ring_attention_backward: k and v must be float, Eigen::bfloat16 or "
                  "Eigen::half tensors of one type, q float or that type; out, lse, d_out and every gradient float");
    if constexpr (kStorage)
        detail::ring_backward<simd::default_arch, TQ, TK>(a.q, a.k, a.v, a.out, a.lse, a.d_out, a.d_q, a.d_k, a.d_v,
                                                           opts, comm);
}

namespace detail {

// sharded_decode's two forms: lse null, or a float view.
template <class Q, class K, class V, class O, class TL>
void sharded_decode_entry(const Q& q, const K& k_shard, const V& v_shard, O&& out, const view<TL, 3>* lse,
                          const softmax_options& opts, MPI_Comm comm) {
    const auto qv = attnkit::detail::q_view(q);
    const auto kv = attnkit::detail::k_view(k_shard);
    const auto vv = attnkit::detail::v_view(v_shard);
    const auto ov = attnkit::detail::out_view(std::forward<O>(out));
    using TQ = typename decltype(qv)::value_type;
    using TK = typename decltype(kv)::value_type;
    constexpr bool kStorage = attnkit::detail::kIsAttentionStorage<TQ, TK, typename decltype(vv)::value_type,
                                                                   typename decltype(ov)::value_type, TL>;
    static_assert(kStorage,
                  "attnkit::distributed::sharded_decode: k and v must be float, Eigen::bfloat16 or Eigen::half tensors "
                  "of one type, q float or that type, out and lse float");
    if constexpr (kStorage) detail::sharded_decode<simd::default_arch, TQ, TK>(qv, kv, vv, ov, lse, opts, comm);
}

}  // namespace detail

// k_shard, v_shard: this rank's key positions [floor(r Lk / P), floor((r + 1) Lk / P)) of a cache
// of Lk keys (shard_rows); q's Lq queries sit at the cache's end (Lk - Lq + i), as in
// softmax_attention. Every rank receives the whole out [B, Lq, H, Dv] (and lse).
template <class Q, class K, class V, class O>
void sharded_decode(const Q& q, const K& k_shard, const V& v_shard, O&& out, const softmax_options& opts,
                    MPI_Comm comm) {
    detail::sharded_decode_entry(q, k_shard, v_shard, std::forward<O>(out), static_cast<const view<float, 3>*>(nullptr),
                                 opts, comm);
}

template <class Q, class K, class V, class O, class L>
void sharded_decode(const Q& q, const K& k_shard, const V& v_shard, O&& out, L&& lse, const softmax_options& opts,
                    MPI_Comm comm) {
    const auto lv = attnkit::detail::lse_view(std::forward<L>(lse));
    detail::sharded_decode_entry(q, k_shard, v_shard, std::forward<O>(out), &lv, opts, comm);
}

}  // namespace distributed
}  // namespace attnkit
