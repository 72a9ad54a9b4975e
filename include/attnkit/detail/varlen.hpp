// Ragged batches on the one engine: packed query rows (FlashAttention's cu_seqlens) and packed or
// paged K/V (attention_problem.hpp's row layouts), each item aligned bottom-right on its own
// lengths. varlen_attention.hpp and paged_attention.hpp check their arguments and call
// packed_forward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/detail/attention_driver.hpp"
#include "attnkit/detail/check.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {

// The query-side views of a packed call ([Tq, H, D] q, [Tq, H, Dv] out, [Tq, H] lse or none) as
// the engine's batch-of-one views.
template <class TQ>
struct packed_rows {
    view<const TQ, 4> q;
    view<float, 4> out;
    view<float, 3> lse;
    bool has_lse = false;

    packed_rows(const view<const TQ, 3>& q3, const view<float, 3>& out3, const view<float, 2>* lse2)
        : q(as_batch_of_one(q3)), out(as_batch_of_one(out3)), has_lse(lse2 != nullptr) {
        if (lse2) lse = as_batch_of_one(*lse2);
    }
    const view<float, 3>* lse_ptr() const { return has_lse ? &lse : nullptr; }
};

// cu [B + 1]: 0 = cu[0] <= cu[1] <= ... <= cu[B] = total (the rows of `tensor`); len gets the
// lengths cu[b + 1] - cu[b]. shape: the tensor's shape for the message, or a callable returning
// it, which is called only to throw (a valid call allocates nothing but len's growth).
template <class Shape>
void check_cu_seqlens(const char* name, const std::vector<std::int64_t>& cu, index_t total, const char* tensor,
                      const Shape& shape, std::vector<std::int64_t>& len) {
    if (cu.empty()) fail(std::string(name) + ": expected B + 1 offsets starting at 0, got none");
    if (cu.front() != 0) fail(std::string(name) + "[0]: expected 0, got " + number(cu.front()));
    len.resize(cu.size() - 1);
    for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
        if (cu[b + 1] < cu[b])
            fail(std::string(name) + ": expected non-decreasing offsets, got " + name + "[" +
                 number(b) + "] = " + number(cu[b]) + " > " + name + "[" + number(b + 1) +
                 "] = " + number(cu[b + 1]));
        len[b] = cu[b + 1] - cu[b];
    }
    if (cu.back() != total) {
        std::string described;
        if constexpr (std::is_invocable<const Shape&>::value)
            described = shape();
        else
            described = shape;
        fail(std::string(name) + ": the last offset must be the row count of " + tensor + " " +
             described + ", " + number(total) + ", got " + number(cu.back()));
    }
}
template <class Shape>
std::vector<std::int64_t> check_cu_seqlens(const char* name, const std::vector<std::int64_t>& cu, index_t total,
                                           const char* tensor, const Shape& shape) {
    std::vector<std::int64_t> len;
    check_cu_seqlens(name, cu, total, tensor, shape, len);
    return len;
}

// What a packed call adds to softmax_options' checks: per-sequence lengths replace key_lengths.
inline void check_packed_options(const softmax_options& o, const attention_shape& s) {
    if (!o.key_lengths.empty())
        fail(
            "opts.key_lengths: expected empty (a packed batch's key counts are its sequence "
            "lengths), got " +
            number(o.key_lengths.size()) + " values");
    check_options(o, s);
}

// One forward call over B items of a ragged batch: item b's query rows start at row q_start[b]
// of q (and of out, lse), it has q_len[b] of them and k_len[b] keys. k and v arrive with their
// row layout set (packed or paged); s holds the largest lengths. int8 K/V: their row scales
// in the same layout (attention_problem.hpp).
template <class A, class KVT, class QT>
void packed_forward(const view<const QT, 4>& q, const strided_rows_t<KVT>& k,
                    const strided_rows_t<KVT>& v, const attention_shape& s,
                    const std::vector<std::int64_t>& q_start,
                    const std::vector<std::int64_t>& q_len, const std::vector<std::int64_t>& k_len,
                    const view<float, 4>& out, const view<float, 3>* lse,
                    const softmax_options& opts, const strided_rows_t<float>& k_scale = {},
                    const strided_rows_t<float>& v_scale = {}) {
    // opts.key_lengths is empty (check_packed_options): the lengths are k_len's.
    const view<const KVT, 4> none;
    basic_attention_problem<KVT, QT> p = make_problem(q, none, none, s, opts);
    p.q.start = q_start.data();
    p.k = k;
    p.v = v;
    p.k_scale = k_scale;
    p.v_scale = v_scale;
    p.key_lengths = k_len.data();
    p.query_lengths = q_len.data();
    forward_outputs fo;
    fo.out = out;
    if (lse) fo.lse = *lse;
    fo.out_start = q_start.data();
    fo.sinks = opts.sinks.empty() ? nullptr : opts.sinks.data();
    attention_forward<A>(p, fo, opts.pool);
}

}  // namespace detail
}  // namespace attnkit
