// Static QK attention (RndEmbQK / FixedSeqQK, docs/variants.md section 4): Q and K come from a fixed
// stream, so each head has one causal attention map for every input.
//
//   attnkit::static_qk_attention(q_fixed, k_fixed, v, out, opts);  // out [B, L, H, Dv]
//   attnkit::static_attention_map map(q_fixed, k_fixed, opts);      // probabilities stored once
//   map.apply(v, out, pool);                                         // out [B, T, H, Dv]: last T rows
//
// q_fixed [1, Lmax, H, D], k_fixed [1, Lmax, Hk, D], v [B, L, Hk, Dv] with L <= Lmax. Always
// causal; query i of every batch item uses row i of the top-left L x L block (which, under the
// causal mask, is row i of the whole stream's map).
//
// static_qk_attention runs the softmax tile engine once over the stream's first L rows with the
// B batch items as value sets (attention_problem::n_sets): each score tile and its online-softmax
// update are computed once and applied to every item's V, each item with its own O^T
// accumulators. Scores cost 2 L^2 D per head once (causal: half of it) instead of once per batch
// item; values cost what they always do. Batches above kMaxValueSets items run in groups of that
// many (scores once per group), which bounds a work item's scratch (its sets' O^T panels).
// Threads: the engine's partition, (key/value head, query block) with every value set inside;
// bitwise identical for any pool.
//
// The map (static_attention_map.hpp) stores H * Lmax (Lmax + 1) / 2 floats = 2 H Lmax (Lmax + 1)
// bytes and skips the scores on every call: the choice for decode and repeated calls.
#pragma once

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/attention_driver.hpp"
#include "attnkit/detail/static_qk/check.hpp"
#include "attnkit/static_attention_map.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {
namespace static_qk {

// Batch items per pass of the tile engine (value sets sharing one score tile). The engine sizes
// a block as for one set (up to 256 rows), so its O^T panels take 256 x 16 x Dv floats here
// (1 MiB at Dv = 64), streamed one panel at a time, while each score tile serves 16 items.
constexpr index_t kMaxValueSets = 16;

template <class A>
ATTNKIT_NOINLINE void forward(const view<const float, 4>& qf, const view<const float, 4>& kf,
                              const view<const float, 4>& v, const view<float, 4>& out,
                              const static_qk_options& opts) {
    const stream_shape st = check_stream(qf, kf);
    const values_shape s = check_values(v, out, st.max_len, st.heads, st.heads_k, false);
    check_options(opts);
    check_apart(qf, kf, v, out);
    check_max_keys("v", s.len, "positions per call", "L", v);
    if (s.batch == 0 || s.len == 0) return;

    const index_t L = s.len, Dv = s.dim_v;
    // The stream's first L rows: under the causal mask, exactly the top-left L x L block.
    const view<const float, 4> q(qf.data, {1, L, st.heads, st.dim}, qf.strides);
    const view<const float, 4> k(kf.data, {1, L, st.heads_k, st.dim}, kf.strides);
    const attention_shape as{1, L, L, st.heads, st.heads_k, st.dim, Dv};
    static const std::vector<std::int64_t> kNoKeyLengths;
    const float q_scale = resolve_scale(opts.scale, st.dim) * simd::kLog2e;

    for (index_t b0 = 0; b0 < s.batch; b0 += kMaxValueSets) {
        const index_t nb = std::min(kMaxValueSets, s.batch - b0);
        const view<const float, 4> vb(v.ptr(b0), {1, L, st.heads_k, Dv}, v.strides);
        attention_problem p = make_base_problem(q, k, vb, as, true, kNoKeyLengths);
        p.q_scale = q_scale;
        p.n_sets = nb;                    // batch item b0 + t is value set t ...
        p.v_set_stride = v.strides[0];    // ... read at v + t * (v's batch stride)
        forward_outputs fo;
        fo.out = view<float, 4>(out.ptr(b0), {1, L, st.heads, Dv}, out.strides);
        fo.out_set_stride = out.strides[0];
        attention_forward<A>(p, fo, opts.pool);
    }
}

#ifdef ATTNKIT_KERNEL_INSTANCE  // compiled kernels (config.hpp)
ATTNKIT_KERNEL_INSTANCE void forward<simd::default_arch>(const view<const float, 4>&, const view<const float, 4>&,
                                                         const view<const float, 4>&, const view<float, 4>&,
                                                         const static_qk_options&);
#endif

}  // namespace static_qk
}  // namespace detail

// out [B, L, H, Dv] = the fixed causal attention of the stream (q_fixed, k_fixed) applied to each
// batch item's v. Arguments: attnkit::view, row-major Eigen::Tensor or TensorMap of float. All
// arguments are validated before anything is written.
template <class QF, class KF, class V, class O>
void static_qk_attention(const QF& q_fixed, const KF& k_fixed, const V& v, O&& out, const static_qk_options& opts = {}) {
    namespace sq = detail::static_qk;
    const auto qv = sq::q_fixed_view(q_fixed);
    const auto kv = sq::k_fixed_view(k_fixed);
    const auto vv = sq::v_view(v);
    const auto ov = sq::out_view(std::forward<O>(out));
    ATTNKIT_IF_FLOAT("attnkit::static_qk_attention: float storage", qv, kv, vv, ov)
        sq::forward<simd::default_arch>(qv, kv, vv, ov, opts);
}

}  // namespace attnkit
