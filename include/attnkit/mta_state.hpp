// attnkit::mta_state: multi-token attention for generation, token by token after an optional
// prompt, with the outputs of one mta_attention call over the whole sequence.
//
//   attnkit::mta_options o;                  // the same options as mta_attention; the state
//   o.kq_pre = theta; o.head_pre = w;        // copies every weight when it is built
//   attnkit::mta_state st(B, H, Hk, D, Dv, o);
//   st.step(q_prompt, k_prompt, v_prompt, out_prompt);   // [B, T, ...]: T tokens at once
//   st.step(q_t, k_t, v_t, out_t);                       // [B, 1, ...]: the next token
//   st.length();  st.reset();  st.reserve(max_tokens);
//
// A step allocates only to grow what the state holds (the K/V cache, the convolutions' rings
// and the row buffers, each by doubling); reserve(n) makes room for n tokens ahead, so a server
// that reserves its context limit allocates nothing per step (tests/scratch_test.cpp).
//
// Causality makes every stage of row i final once token i is known: its raw scores X_i, and its
// probabilities P_i (after the pre-softmax convolution, head mixing and softmax) depend only on
// tokens <= i. A new token t therefore needs
//   - its own score row X_t against all keys (row kernel dot products, detail/row_kernel.hpp),
//     and the rows t - c_q,pre + 1 .. t - 1 kept from earlier steps (a ring), which the
//     pre-softmax convolution and head mixing turn into row t's scores, then softmaxed;
//   - the probability rows t - c_q,post + 1 .. t (a ring), for the post convolution;
//   - the V cache for P V.
// Cost per token and head: O(L (D + Dv + G (c_q,pre c_k,pre + c_q,post c_k,post))), against
// O(L^2) for recomputing the layer. A first step of several tokens (a prompt) runs the fused
// kernel (detail/mta/forward.hpp) for its outputs and then builds only the rows the rings keep.
// Outputs equal the matching rows of one mta_attention call over the whole sequence (up to
// float rounding: the summation order differs).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attnkit/detail/memory_overlap.hpp"
#include "attnkit/detail/mta/check.hpp"
#include "attnkit/detail/mta/decode_rows.hpp"
#include "attnkit/detail/mta/epilogue.hpp"
#include "attnkit/detail/mta/forward.hpp"
#include "attnkit/detail/mta/params.hpp"
#include "attnkit/detail/row_kernel.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {

// The decode state of one mta_attention layer: K, V, and the last c_q - 1 rows of each
// convolution's input, per batch item.
//
//   attnkit::mta_state st(batch, heads, heads_kv, dim, dim_v, opts);
//   st.step(q, k, v, out);   // q [B, T, H, D], k [B, T, Hk, D], v [B, T, Hk, Dv], out [B, T, H, Dv]
class mta_state {
   public:
    // Validates the options against these shapes and copies their weights: the caller's
    // tensors may change or be freed afterwards (every step, the prompt's fused call included,
    // reads the copies). opts.pool, if set, must outlive the state.
    mta_state(index_t batch, index_t heads, index_t heads_kv, index_t dim, index_t dim_v, const mta_options& opts) {
        detail::check_state_sizes("mta_state", batch, heads, heads_kv, dim, dim_v);
        s_ = {batch, 0, 0, heads, heads_kv, dim, dim_v};
        ms_ = detail::mta::check_options(opts, s_);
        w_ = detail::mta::make_params(opts, ms_);
        pool_ = opts.pool;
        scale_ = detail::resolve_scale(opts.scale, dim);
        cq1_ = ms_.pre.on() ? ms_.pre.c_q : 1;
        cq2_ = ms_.post.on() ? ms_.post.c_q : 1;
        reset();
    }

    index_t length() const { return len_; }

    // Room for `tokens` tokens in all (length() included): steps up to that length allocate
    // nothing. reset() keeps it.
    void reserve(index_t tokens) {
        if (tokens < 0) detail::fail("mta_state::reserve: tokens must be >= 0, got " + std::to_string(tokens));
        const std::size_t n = static_cast<std::size_t>(tokens), H = static_cast<std::size_t>(s_.heads),
                          Hk = static_cast<std::size_t>(s_.heads_k);
        for (auto& kc : kc_) kc.reserve(n * Hk * static_cast<std::size_t>(s_.dim));
        for (auto& vc : vc_) vc.reserve(n * Hk * static_cast<std::size_t>(s_.dim_v));
        for (auto& slot : xring_) slot.reserve(H * n);
        for (auto& slot : pring_) slot.reserve(H * n);
        for (std::vector<float>* row : {&y_, &y2_, &z_}) row->reserve(H * n);
        o_rows_.reserve(static_cast<std::size_t>(chunks(tokens)) * H * static_cast<std::size_t>(s_.dim_v));
        constexpr index_t W = simd::kLanes<arch>;
        qs_.reserve(H * static_cast<std::size_t>((s_.dim + W - 1) / W * W));
    }

    // Back to an empty state; the buffers keep their capacity.
    void reset() {
        len_ = 0;
        const std::size_t B = static_cast<std::size_t>(s_.batch);
        kc_.resize(B);
        vc_.resize(B);
        xring_.resize(B * static_cast<std::size_t>(cq1_));
        pring_.resize(B * static_cast<std::size_t>(cq2_));
        for (auto* set : {&kc_, &vc_, &xring_, &pring_})
            for (auto& x : *set) x.clear();
    }

    // Appends T >= 0 tokens: q [B, T, H, D], k [B, T, Hk, D], v [B, T, Hk, Dv], out [B, T, H, Dv].
    // Each new query sees every token appended before it and itself.
    template <class Q, class K, class V, class O>
    void step(const Q& q, const K& k, const V& v, O&& out) {
        const auto qv = detail::q_view(q);
        const auto kv = detail::k_view(k);
        const auto vv = detail::v_view(v);
        const auto ov = detail::out_view(std::forward<O>(out));
        ATTNKIT_IF_FLOAT("attnkit::mta_state::step: float storage, as mta_attention", qv, kv, vv, ov)
            run(qv, kv, vv, ov);
    }

   private:
    template <class QV, class KV, class VV, class OV>
    void run(const QV& qv, const KV& kv, const VV& vv, const OV& ov) {
        // out = q (the same view) is safe here: a token's query is copied before its output is written.
        const index_t T = detail::check_state_step("mta_state", qv, kv, vv, ov, s_, 0).len_q;
        // A prompt on an empty state: the fused kernel computes its outputs (it needs out apart
        // from q), and only the rows the rings keep are built here, the last c_q,pre + c_q,post - 2.
        if (len_ == 0 && T > 1 && !detail::regions_overlap(detail::region_of("out", ov), detail::region_of("q", qv))) {
            // The call's own checks (the weights were checked when the state was built, and
            // options without weights check nothing more), then the kernel on the state's copies.
            detail::mta::shape ms = ms_;
            ms.s = detail::mta::check_call(qv, kv, vv, ov, mta_options{}).s;
            detail::mta::run_fused<arch>(qv, kv, vv, ov, ms, w_, pool_);
            const index_t first = std::max<index_t>(0, T - (cq1_ + cq2_ - 2));
            for (index_t b = 0; b < s_.batch; ++b)
                for (index_t t = 0; t < T; ++t) {
                    append_kv(b, kv, vv, t);
                    if (t < first) continue;
                    x_row(b, t, qv, t);
                    if (t >= T - cq2_ + 1) p_row(b, t);
                }
            len_ = T;
            return;
        }
        for (index_t t = 0; t < T; ++t) {
            for (index_t b = 0; b < s_.batch; ++b) {
                append_kv(b, kv, vv, t);
                x_row(b, len_, qv, t);
                p_row(b, len_);
                emit_row(b, len_, ov, t);
            }
            ++len_;
        }
    }

    using arch = simd::default_arch;
    attnkit::detail::attention_shape s_{};
    detail::mta::shape ms_{};
    detail::mta::params w_;  // the options' weights, copied
    thread_pool* pool_ = nullptr;
    float scale_ = 1.0f;
    index_t cq1_ = 1, cq2_ = 1, len_ = 0;
    std::vector<std::vector<float>> kc_, vc_;  // per batch item: [L][Hk][D], [L][Hk][Dv]
    std::vector<std::vector<float>> xring_;    // per batch item and slot: score row i, [H][i + 1]
    std::vector<std::vector<float>> pring_;    // per batch item and slot: probability row i, [H][i + 1]
    std::vector<float> qs_, y_, y2_, z_, o_rows_;  // qs_ [H][Dp], o_rows_ [chunk][H][Dv]

    // The convolutions, mixing and softmax work head by head on rows of their own, so heads
    // split over the pool once a row is long enough (n keys) to pay for the hand-off.
    static constexpr index_t kParallelKeys = 2048;
    template <class F>
    void for_heads(index_t n, F&& fn) const {
        if (pool_ && n >= kParallelKeys)
            parallel_for(pool_, s_.heads, [&](std::int64_t h) { fn(static_cast<index_t>(h)); });
        else
            for (index_t h = 0; h < s_.heads; ++h) fn(h);
    }
    // The K and V walks go key-major (all heads of a key row, then the next row: one sequential
    // stream, where a head-major pass would jump between Hk short runs of every row and stream
    // far worse), in fixed chunks of keys over the pool. The chunks do not depend on the thread
    // count, nor does the order P V sums them in, so outputs are the same for any pool.
    static constexpr index_t kChunkKeys = 2048;  // a multiple of the 8 keys of a row kernel step
    static index_t chunks(index_t n) { return (n + kChunkKeys - 1) / kChunkKeys; }
    template <class F>
    void for_chunks(index_t n, F&& fn) const {
        const index_t nc = chunks(n);
        auto one = [&](index_t c) { fn(c, c * kChunkKeys, std::min(n, (c + 1) * kChunkKeys)); };
        if (pool_ && nc > 1)
            parallel_for(pool_, nc, [&](std::int64_t c) { one(static_cast<index_t>(c)); });
        else
            for (index_t c = 0; c < nc; ++c) one(c);
    }

    template <class KV, class VV>
    void append_kv(index_t b, const KV& k, const VV& v, index_t tt) {
        auto& kc = kc_[static_cast<std::size_t>(b)];
        auto& vc = vc_[static_cast<std::size_t>(b)];
        for (index_t h = 0; h < s_.heads_k; ++h)
            for (index_t d = 0; d < s_.dim; ++d) kc.push_back(static_cast<float>(k(b, tt, h, d)));
        for (index_t h = 0; h < s_.heads_k; ++h)
            for (index_t d = 0; d < s_.dim_v; ++d) vc.push_back(static_cast<float>(v(b, tt, h, d)));
    }

    // X row i (every head, keys 0..i) of query tt of q, into its ring slot; the K cache holds
    // keys 0..i. Eight keys at a time with one transposing reduction, as decode's row kernel.
    template <class QV>
    void x_row(index_t b, index_t i, const QV& q, index_t tt) {
        const index_t H = s_.heads, Hk = s_.heads_k, D = s_.dim, grp = s_.group(), n = i + 1;
        constexpr index_t KG = detail::kRowScoreKeys;
        const float* kc = kc_[static_cast<std::size_t>(b)].data();
        auto& xr = xring_[static_cast<std::size_t>(b * cq1_ + i % cq1_)];
        xr.assign(static_cast<std::size_t>(H * n), 0.0f);
        // Rows padded to whole vectors: the row kernel reads q a full vector at a time, also for
        // the last D % W elements (the keys' partial loads zero the lanes past D).
        constexpr index_t W = simd::kLanes<arch>;
        const index_t Dp = (D + W - 1) / W * W;
        qs_.assign(static_cast<std::size_t>(H * Dp), 0.0f);
        for (index_t h = 0; h < H; ++h)
            for (index_t d = 0; d < D; ++d) qs_[h * Dp + d] = static_cast<float>(q(b, tt, h, d)) * scale_;
        for_chunks(n, [&](index_t, index_t j0, index_t j1) {
            index_t j = j0;
            for (; j + KG <= j1; j += KG)
                for (index_t h = 0; h < H; ++h)
                    detail::score_keys<arch, float>(qs_.data() + h * Dp, kc + (j * Hk + h / grp) * D, Hk * D, D,
                                                    xr.data() + h * n + j, 1);
            for (; j < j1; ++j)
                for (index_t h = 0; h < H; ++h)
                    xr[h * n + j] = detail::score_key<arch, float>(qs_.data() + h * Dp, kc + (j * Hk + h / grp) * D, D);
        });
    }

    // P row i from the X rows i - c_q,pre + 1 .. i: pre-softmax convolution, head mixing, causal
    // softmax (every key j <= i is visible), into its ring slot.
    void p_row(index_t b, index_t i) {
        const index_t H = s_.heads, n = i + 1;
        y_.assign(static_cast<std::size_t>(H * n), 0.0f);
        if (ms_.pre.on()) {
            for_heads(n, [&](index_t h) {
                detail::mta::conv_row(xring_, b * cq1_, cq1_, i, w_.kq_pre.data(), ms_.pre, h, y_.data() + h * n, n);
            });
        } else {
            const auto& xr = xring_[static_cast<std::size_t>(b * cq1_ + i % cq1_)];
            std::copy(xr.begin(), xr.end(), y_.begin());
        }
        if (w_.head_pre_on()) mix(y_, n, w_.head_pre);
        auto& slot = pring_[static_cast<std::size_t>(b * cq2_ + i % cq2_)];
        slot.resize(static_cast<std::size_t>(H * n));
        for_heads(n, [&](index_t h) { detail::mta::softmax_row<arch>(y_.data() + h * n, n, slot.data() + h * n); });
    }

    // Output row i (query tt of out): post-softmax convolution over the P rows i - c_q,post + 1
    // .. i, Mask0, head mixing, P V, then the per-row stages.
    template <class OV>
    void emit_row(index_t b, index_t i, const OV& out, index_t tt) {
        const index_t H = s_.heads, Hk = s_.heads_k, Dv = s_.dim_v, grp = s_.group(), n = i + 1;
        constexpr index_t KU = detail::kRowValueKeys;
        const float* vc = vc_[static_cast<std::size_t>(b)].data();
        z_.assign(static_cast<std::size_t>(H * n), 0.0f);
        if (ms_.post.on()) {
            for_heads(n, [&](index_t h) {
                detail::mta::conv_row(pring_, b * cq2_, cq2_, i, w_.kq_post.data(), ms_.post, h, z_.data() + h * n, n);
            });
        } else {
            const auto& pr = pring_[static_cast<std::size_t>(b * cq2_ + i % cq2_)];
            std::copy(pr.begin(), pr.end(), z_.begin());
        }
        if (w_.head_post_on()) mix(z_, n, w_.head_post);
        const index_t nc = chunks(n);
        o_rows_.assign(static_cast<std::size_t>(nc * H * Dv), 0.0f);
        for_chunks(n, [&](index_t c, index_t j0, index_t j1) {
            float* oc = o_rows_.data() + c * H * Dv;
            index_t j = j0;
            for (; j + KU <= j1; j += KU)
                for (index_t h = 0; h < H; ++h)
                    detail::accumulate_keys<arch, float>(oc + h * Dv, z_.data() + h * n + j, 1, vc + (j * Hk + h / grp) * Dv,
                                                         Hk * Dv, Dv);
            for (; j < j1; ++j)
                for (index_t h = 0; h < H; ++h)
                    detail::axpy<arch, float>(oc + h * Dv, z_[h * n + j], vc + (j * Hk + h / grp) * Dv, Dv);
        });
        for (index_t c = 1; c < nc; ++c)
            for (index_t e = 0; e < H * Dv; ++e) o_rows_[e] += o_rows_[c * H * Dv + e];
        // The per-row stages (cheap: Dv per head) and the stores, in the caller's thread: out is
        // the user's view, written once per element.
        for (index_t h = 0; h < H; ++h) detail::mta::row_stages(w_, o_rows_.data() + h * Dv, Dv, &out(b, tt, h, 0));
    }

    // y = HeadMix(y) over the n keys of a row, y [H][n], w [H][H] as [out][in].
    void mix(std::vector<float>& y, index_t n, const std::vector<float>& w) {
        y2_.assign(static_cast<std::size_t>(s_.heads * n), 0.0f);
        for_heads(n, [&](index_t h) { detail::mta::mix_row(y.data(), n, w.data(), s_.heads, h, y2_.data() + h * n); });
        y.swap(y2_);
    }
};

}  // namespace attnkit
