// Self-gating ("Non-approximate", Xue et al.) attention, the fast kernel (docs/variants.md section 3).
//
//   attnkit::self_gating_attention(q, k, v, out, opts);   q [B,L,H,D], k [B,L,Hk,D], v [B,L,Hk,Dv]
//   attnkit::self_gating_state st(B, H, Hk, D, Dv, opts); st.step(q, k, v, out);  (decode, chunked
//                                                          prefill: T >= 1 tokens per step)
//
// Each token scores only itself: g_j = scale <q_j, k_j>, and row i is the exp(g)-weighted mean of
// the values it sees: j <= i when causal, every visible j otherwise (then every row is the same
// mean); key_lengths masks j >= key_lengths[b] (no visible token: zero rows). Lq must equal Lk.
// Query head h uses key/value head h / (H / Hk).
//
// One pass over q, k, v and out, O(L (D + Dv)) per head, memory-bound: all heads of a position
// at once (the tensors stream front to back), a running (max, sum, weighted sum) per head that
// is rescaled only when the max grows (detail/self_gating/scan.hpp), output rows stored once
// with non-temporal stores when the output is larger than the caches. Threads share the
// sequence, cut into chunks fixed by the shapes and combined in chunk order in one pass
// (detail/self_gating/driver.hpp): a single head still uses every thread, and results are
// bitwise identical for any thread count.
//
// Arguments are attnkit::view, row-major Eigen::Tensor or Eigen::TensorMap of float, validated
// before anything is written. out must not overlap k, v or itself; out = q (the same view,
// D == Dv) runs in place.
#pragma once

#include <type_traits>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/self_gating/check.hpp"
#include "attnkit/detail/self_gating/driver.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {
namespace self_gating {

// Outputs larger than this go to memory with non-temporal stores (they would only evict the
// inputs from the last-level cache); smaller ones stay cached for the caller.
constexpr index_t kStreamBytes = index_t(4) << 20;

// The inputs' part of a call's problem on checked views (the backward's too); visible[b] =
// visible tokens of item b in this call when its first token sits at absolute position `pos0`
// (a state's length so far), written to `visible` (the caller's: a lease, which outlives p).
template <class A>
problem make_input_problem(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
                           const attention_shape& s, float scale, bool causal,
                           const std::vector<std::int64_t>& key_lengths, index_t pos0, std::vector<index_t>& visible) {
    problem p;
    p.batch = s.batch;
    p.len = s.len_q;
    p.heads = s.heads;
    p.heads_kv = s.heads_k;
    p.group = s.group();
    p.dim = s.dim;
    p.dim_v = s.dim_v;
    p.dim_vp = (s.dim_v + simd::kLanes<A> - 1) / simd::kLanes<A> * simd::kLanes<A>;
    p.q = rows_of(q);
    p.k = rows_of(k);
    p.v = rows_of(v);
    p.scale = resolve_scale(scale, s.dim);
    p.causal = causal;
    visible.assign(static_cast<std::size_t>(s.batch), s.len_q);
    for (std::size_t b = 0; b < key_lengths.size(); ++b)
        visible[b] = std::max<index_t>(0, std::min<index_t>(s.len_q, key_lengths[b] - pos0));
    p.visible = visible.data();
    return p;
}

// The problem of one forward call: the inputs' part and the output.
template <class A>
problem make_problem(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
                     const view<float, 4>& out, const attention_shape& s, float scale, bool causal,
                     const std::vector<std::int64_t>& key_lengths, index_t pos0, std::vector<index_t>& visible) {
    problem p = make_input_problem<A>(q, k, v, s, scale, causal, key_lengths, pos0, visible);
    p.out = out.data;
    p.ob = out.strides[0];
    p.ol = out.strides[1];
    p.oh = out.strides[2];
    // Streamed rows, unless the next position's loads would wait for them (4 KiB aliasing, scan.hpp).
    p.stream = out.size() * static_cast<index_t>(sizeof(float)) >= kStreamBytes && !last_row_meets_next_gates(p);
    return p;
}

// A wrong element type (or a mix) stops at the static_assert alone: nothing else is instantiated.
template <class A, class TQ, class TK, class TV, class TO, class TL>
void attention_impl(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
                    const view<TO, 4>& out, const view<TL, 3>* lse, const self_gating_options& opts) {
    ATTNKIT_IF_FLOAT("attnkit::self_gating_attention: float storage (q, k, v, out and lse float tensors)", q, k, v,
                     out, *lse) {
        const attention_shape s = check_call(q, k, v, out, opts, lse);
        scratch_lease<index_t> visible;
        problem p = make_problem<A>(q, k, v, out, s, opts.scale, opts.causal, opts.key_lengths, 0, visible.get());
        if (lse) {
            p.lse = lse->data;
            p.lb = lse->strides[0];
            p.ll = lse->strides[1];
            p.lh = lse->strides[2];
        }
        run<A>(p, opts.pool, nullptr, nullptr);
    }
}

}  // namespace self_gating
}  // namespace detail

// out[b, i, h] = sum_j exp(g_j) v_j / sum_j exp(g_j) over the tokens j row i sees, with
// g_j = scale <q[b, j, h], k[b, j, h / (H / Hk)]>. q [B,L,H,D], k [B,L,Hk,D], v [B,L,Hk,Dv],
// out [B,L,H,Dv].
template <class Q, class K, class V, class O>
void self_gating_attention(const Q& q, const K& k, const V& v, O&& out, const self_gating_options& opts = {}) {
    detail::self_gating::attention_impl<simd::default_arch>(detail::q_view(q), detail::k_view(k), detail::v_view(v),
                                                            detail::out_view(out),
                                                            static_cast<const view<float, 3>*>(nullptr), opts);
}

// Also writes lse [B, L, H] (any strides): the natural log of sum_j exp(g_j) over the tokens row i
// sees, -inf for a row that sees none. self_gating_attention_backward takes it back and then
// skips its own pass over q and k for the rows' statistics.
template <class Q, class K, class V, class O, class L,
          std::enable_if_t<detail::kIsLseArg<L, self_gating_options>, int> = 0>
void self_gating_attention(const Q& q, const K& k, const V& v, O&& out, L&& lse, const self_gating_options& opts = {}) {
    const auto lse_v = detail::lse_view(lse);
    detail::self_gating::attention_impl<simd::default_arch>(detail::q_view(q), detail::k_view(k), detail::v_view(v),
                                                            detail::out_view(out), &lse_v, opts);
}

//   attnkit::self_gating_state st(B, H, Hk, D, Dv, opts);
//   st.step(q_prompt, k_prompt, v_prompt, out_prompt);    // a prompt of T tokens
//   st.step(q_tok, k_tok, v_tok, out_tok);                // then one token at a time
//   st.length(); st.reset();
//
// Decode and chunked prefill: per batch item and query head the state (m, z, n[Dv]) of every
// token appended so far. step(q, k, v, out) appends T >= 1 tokens (q [B,T,H,D], k [B,T,Hk,D],
// v [B,T,Hk,Dv], out [B,T,H,Dv]); each new row sees every token before it and itself, so one
// step over a whole prompt equals the causal call (bitwise: it runs the same schedule), and
// steps of any sizes agree with it to rounding. opts.key_lengths must be empty (as for
// taylor_state: a state holds exactly the tokens appended, each new query sees all of them);
// opts.causal is ignored (a state is causal).
// A step whose shapes differ from the constructor's throws std::invalid_argument and changes
// neither out nor the state.
class self_gating_state {
   public:
    self_gating_state(index_t batch, index_t heads, index_t heads_kv, index_t dim, index_t dim_v,
                      const self_gating_options& opts = {})
        : batch_(batch), heads_(heads), heads_kv_(heads_kv), dim_(dim), dim_v_(dim_v), opts_(opts) {
        detail::self_gating::check_state_sizes(batch, heads, heads_kv, dim, dim_v, opts);
        constexpr index_t W = simd::kLanes<simd::default_arch>;
        dim_vp_ = (dim_v + W - 1) / W * W;
        reset();
    }

    template <class Q, class K, class V, class O>
    void step(const Q& q, const K& k, const V& v, O&& out) {
        using A = simd::default_arch;
        const auto qv = detail::q_view(q);
        const auto kv = detail::k_view(k);
        const auto vv = detail::v_view(v);
        const auto ov = detail::out_view(out);
        ATTNKIT_IF_FLOAT("attnkit::self_gating_state: float storage (q, k, v and out float tensors)", qv, kv, vv, ov) {
            const detail::attention_shape s = detail::check_state_step(
                "self_gating_state", qv, kv, vv, ov, {batch_, 0, 0, heads_, heads_kv_, dim_, dim_v_}, 1);
            detail::scratch_lease<index_t> visible;
            const detail::self_gating::problem p = detail::self_gating::make_problem<A>(
                qv, kv, vv, ov, s, opts_.scale, true, opts_.key_lengths, length_, visible.get());
            const detail::self_gating::state_arrays st{m_.data(), z_.data(), n_.data()};
            detail::self_gating::run<A>(p, opts_.pool, &st, &st);
            length_ += s.len_q;
        }
    }

    // Tokens appended since construction or the last reset (masked ones included).
    index_t length() const noexcept { return length_; }

    void reset() {
        const std::size_t bh = static_cast<std::size_t>(batch_ * heads_);
        m_.assign(bh, -HUGE_VALF);
        z_.assign(bh, 0.0f);
        n_.assign(bh * static_cast<std::size_t>(dim_vp_), 0.0f);
        length_ = 0;
    }

   private:
    index_t batch_, heads_, heads_kv_, dim_, dim_v_, dim_vp_ = 0;
    self_gating_options opts_;
    index_t length_ = 0;
    std::vector<float> m_, z_, n_;  // [B*H], [B*H], [B*H][dim_vp]
};

}  // namespace attnkit
