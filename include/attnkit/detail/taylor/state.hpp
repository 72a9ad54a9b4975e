// attnkit::taylor_state: decode and chunked prefill of Taylor attention with the linear form's
// running state (docs/variants.md section 2, docs/design.md "Variant entry points").
//
//   attnkit::taylor_state st(batch, heads, heads_kv, dim, dim_v, opts);
//   st.step(q, k, v, out);   q [B,T,H,D], k [B,T,Hk,D], v [B,T,Hk,Dv], out [B,T,H,Dv], T >= 1
//   st.length(); st.reset(); st.state_bytes();
//
// Per batch item and key/value head the state is S = sum phi(k) v^T and z = sum phi(k) over the
// completed chunks of 64 tokens (F = 1 + D + D(D+1)/2 rows of Dv + 1 floats, features.hpp),
// plus the keys and values of the current chunk, so a step costs O(T F Dv) whatever the length
// so far. The chunks are those of the linear kernel (linear.hpp): each query reads S, sees the
// tokens of its own chunk up to itself through the quadratic form, and a chunk enters S when
// it is complete (summed on its own, then added). So one step of L tokens computes exactly what
// taylor_attention(causal = true, form = linear) does, and a one-token decode step is a read of
// S by a row kernel (value columns in lanes), a small quadratic part, and every 64th step a
// chunk update.
//
// opts: scale, eps and pool are used (causal is implied, form is ignored: a state is the linear
// form); key_lengths must be empty. A pool passed in opts must outlive the state.
// A step whose shapes differ from the state's throws std::invalid_argument naming the argument
// and both shapes; nothing is written and the state is unchanged.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/taylor/check.hpp"
#include "attnkit/detail/taylor/linear.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {

class taylor_state {
    using A = simd::default_arch;
    static constexpr index_t kChunk = detail::taylor::kChunk;
    static constexpr index_t kLanes = simd::kLanes<A>;

   public:
    taylor_state(index_t batch, index_t heads, index_t heads_kv, index_t dim, index_t dim_v,
                 const taylor_options& opts = {})
        : batch_(batch), heads_(heads), heads_kv_(heads_kv), dim_(dim), dim_v_(dim_v),
          scale_((detail::taylor::check_state_sizes(batch, heads, heads_kv, dim, dim_v, opts),
                  detail::resolve_scale(opts.scale, dim))),
          eps_(opts.eps), pool_(opts.pool), features_(dim, detail::tile_traits<A>::kMR),
          dvp_(detail::taylor::chunk_buffers<A>(dim, dim_v, 0, 0).dvp),
          per_item_(features_.padded * dvp_ + kChunk * (dim + dim_v)),
          // + kLanes: read_row reads whole vectors past the last state row.
          state_(static_cast<std::size_t>(batch * heads_kv * per_item_ + kLanes), 0.0f) {}

    index_t length() const { return length_; }
    void reset() {
        std::fill(state_.begin(), state_.end(), 0.0f);
        length_ = 0;
    }
    // Bytes of the running state: S and z of every batch item and key/value head, plus the
    // tokens of the current chunk (fewer than 64) that are not in S yet.
    std::size_t state_bytes() const { return state_.size() * sizeof(float); }

    template <class Q, class K, class V, class O>
    void step(const Q& q, const K& k, const V& v, O&& out) {
        const auto qv = detail::q_view(q);
        const auto kv = detail::k_view(k);
        const auto vv = detail::v_view(v);
        const auto ov = detail::out_view(out);
        constexpr bool kFloat = detail::kFloatViews<decltype(qv), decltype(kv), decltype(vv), decltype(ov)>;
        static_assert(kFloat, "attnkit::taylor_state::step: float tensors");
        if constexpr (kFloat) run(qv, kv, vv, ov);  // a wrong type stops at the static_assert alone
    }

   private:
    // Tokens are taken in segments that end at chunk boundaries (positions multiple of kChunk,
    // counted from the first token, so the chunks are those of taylor_attention's linear form).
    // A segment's keys join the pending chunk; its queries read S (the chunks before) and see
    // the pending chunk up to themselves through the quadratic form; a full chunk enters S,
    // summed on its own first (per chunk, then added, as the linear kernel does).
    void run(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
             const view<float, 4>& out) {
        const detail::attention_shape s =
            detail::taylor::check_step(q, k, v, out, batch_, heads_, heads_kv_, dim_, dim_v_);
        // out may be q itself (every row is read before it is written), nothing else.
        detail::check_attention_memory(q, k, v, out, static_cast<const view<float, 3>*>(nullptr));
        const index_t T = s.len_q;
        parallel_for(pool_, batch_ * heads_kv_, [&](std::int64_t item) { run_item(q, k, v, out, s, item); });
        length_ += T;
    }

    void run_item(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
                  const view<float, 4>& out, const detail::attention_shape& s, index_t item) {
        constexpr index_t RT = detail::tile_traits<A>::kTileRows;
        const index_t b = item / heads_kv_, hk = item % heads_kv_, G = s.group(), D = dim_, Dv = dim_v_;
        float* S = state_.data() + per_item_ * item;
        float* pend_k = S + features_.padded * dvp_;
        float* pend_v = pend_k + kChunk * D;
        detail::taylor::chunk_buffers<A> cb(D, Dv, kChunk, (kChunk * G + RT - 1) / RT);
        std::vector<float> buf, qa(static_cast<std::size_t>(D + 2)), phi(static_cast<std::size_t>(features_.padded));
        std::vector<float> rows;  // row path: num (dvp rounded to lanes) per row
        const index_t acc_ld = (dvp_ + kLanes - 1) / kLanes * kLanes;
        index_t pos = length_;
        for (index_t t = 0; t < s.len_q;) {
            const index_t n_pend = pos % kChunk, seg = std::min(s.len_q - t, kChunk - n_pend);
            for (index_t x = 0; x < seg; ++x) {
                std::copy_n(k.ptr(b, t + x, hk), D, pend_k + (n_pend + x) * D);
                std::copy_n(v.ptr(b, t + x, hk), Dv, pend_v + (n_pend + x) * Dv);
            }
            // The state part of each query row (num in columns < Dv, den in column Dv).
            const index_t n_rows = seg * G;
            const bool panels = n_rows * 2 >= RT;
            const float* num;
            index_t stride_c, stride_r;
            if (panels) {
                const index_t n_panels = (n_rows + RT - 1) / RT;
                std::fill(cb.qt.begin(), cb.qt.begin() + n_panels * (D + 2) * RT, 0.0f);
                std::fill(cb.ot.begin(), cb.ot.begin() + n_panels * dvp_ * RT, 0.0f);
                for (index_t r = 0; r < n_rows; ++r)
                    detail::taylor::pack_query(cb, r, q.ptr(b, t + r / G, hk * G + r % G), scale_);
                detail::taylor::chunk_step<A>(cb, features_, S, n_panels, 0);
                num = cb.ot.data(), stride_c = RT, stride_r = 0;
            } else {
                rows.resize(static_cast<std::size_t>(n_rows * acc_ld));
                for (index_t r = 0; r < n_rows; ++r) {
                    const float* qr = q.ptr(b, t + r / G, hk * G + r % G);
                    for (index_t d = 0; d < D; ++d) qa[static_cast<std::size_t>(d)] = qr[d] * scale_;
                    qa[static_cast<std::size_t>(D)] = 1.0f, qa[static_cast<std::size_t>(D + 1)] = 0.0f;
                    detail::taylor::read_row<A>(features_, S, dvp_, qa.data(), phi.data(), rows.data() + r * acc_ld);
                }
                num = rows.data(), stride_c = 1, stride_r = acc_ld;
            }
            auto state_part = [&](index_t r) {
                return panels ? num + (r / RT) * dvp_ * RT + r % RT : num + r * stride_r;
            };
            // The pending chunk through the quadratic form: its keys [0, n_pend + seg) against
            // the segment's queries, bottom-right causal.
            detail::basic_attention_problem<float, float> p;
            p.s = detail::attention_shape{batch_, seg, n_pend + seg, heads_, heads_kv_, D, Dv};
            p.q = detail::rows_of(q);
            p.q.data = q.data + t * q.strides[1];
            p.k = {pend_k, 0, D, 0};
            p.v = {pend_v, 0, Dv, 0};
            p.q_scale = scale_;
            p.causal = true;
            detail::row_block rb;
            rb.b = b, rb.hk = hk, rb.n_hk = 1, rb.i0 = 0, rb.n_pos = seg, rb.group = G;
            detail::tile_kernel<A>(p, detail::taylor::quadratic_rows{eps_}, rb, 0, n_pend + seg, buf,
                                   [&](index_t, index_t r, const float* o_row, float sum) {
                                       const float* sp = state_part(r);
                                       float* o = out.ptr(b, t + r / G, hk * G + r % G);
                                       const float inv = 1.0f / (sp[Dv * stride_c] + sum + eps_);
                                       for (index_t d = 0; d < Dv; ++d) o[d] = (sp[d * stride_c] + o_row[d]) * inv;
                                   });
            if (n_pend + seg == kChunk) {  // a full chunk enters S
                const index_t ld = detail::taylor::pack_keys(cb, pend_k, D, pend_v, Dv, kChunk);
                detail::taylor::chunk_step<A>(cb, features_, S, 0, ld);
            }
            t += seg, pos += seg;
        }
    }

    index_t batch_, heads_, heads_kv_, dim_, dim_v_;
    float scale_, eps_;
    thread_pool* pool_;
    detail::taylor::feature_table features_;
    index_t dvp_, per_item_;
    std::vector<float> state_;
    index_t length_ = 0;
};

}  // namespace attnkit
