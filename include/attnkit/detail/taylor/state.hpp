// attnkit::taylor_state: decode and chunked prefill of Taylor attention with the linear form's
// running state (variants.md section 2, DESIGN.md "Variant entry points").
//
//   attnkit::taylor_state st(batch, heads, heads_kv, dim, dim_v, opts);
//   st.step(q, k, v, out);   q [B,T,H,D], k [B,T,Hk,D], v [B,T,Hk,Dv], out [B,T,H,Dv], T >= 1
//   st.length(); st.reset(); st.state_bytes();
//
// Per batch item and key/value head the state is S = sum phi(k) v^T and z = sum phi(k) over
// every token appended so far (F = 1 + D + D(D+1)/2 rows of Dv + 1 floats, features.hpp), so a
// step costs O(T F Dv) whatever the length so far. A step runs the linear kernel's chunk loop
// (linear.hpp) on the new tokens: each query reads the state of the earlier steps, sees the
// tokens of its own chunk up to itself through the quadratic form, and each chunk then enters
// the state. Hence one step of L tokens computes what taylor_attention(causal = true) does.
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

   public:
    taylor_state(index_t batch, index_t heads, index_t heads_kv, index_t dim, index_t dim_v,
                 const taylor_options& opts = {})
        : batch_(batch), heads_(heads), heads_kv_(heads_kv), dim_(dim), dim_v_(dim_v),
          scale_((detail::taylor::check_state_sizes(batch, heads, heads_kv, dim, dim_v, opts),
                  detail::resolve_scale(opts.scale, dim))),
          eps_(opts.eps), pool_(opts.pool), features_(dim, detail::tile_traits<A>::kMR),
          dvp_(detail::taylor::chunk_buffers<A>(dim, dim_v, 0, 0).dvp),
          state_(static_cast<std::size_t>(batch * heads_kv * features_.padded * dvp_), 0.0f) {}

    index_t length() const { return length_; }
    void reset() {
        std::fill(state_.begin(), state_.end(), 0.0f);
        length_ = 0;
    }
    // Bytes of the running state (S and z of every batch item and key/value head).
    std::size_t state_bytes() const { return state_.size() * sizeof(float); }

    template <class Q, class K, class V, class O>
    void step(const Q& q, const K& k, const V& v, O&& out) {
        const auto qv = detail::q_view(q);
        const auto kv = detail::k_view(k);
        const auto vv = detail::v_view(v);
        const auto ov = detail::out_view(out);
        static_assert(std::is_same<typename decltype(qv)::value_type, float>::value &&
                          std::is_same<typename decltype(kv)::value_type, float>::value &&
                          std::is_same<typename decltype(vv)::value_type, float>::value &&
                          std::is_same<typename decltype(ov)::value_type, float>::value,
                      "attnkit::taylor_state::step: float tensors");
        run(qv, kv, vv, ov);
    }

   private:
    void run(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
             const view<float, 4>& out) {
        const detail::attention_shape s =
            detail::taylor::check_step(q, k, v, out, batch_, heads_, heads_kv_, dim_, dim_v_);
        const index_t T = s.len_q;
        // The new tokens against themselves (causal, Lq = Lk = T); the state holds the rest.
        detail::basic_attention_problem<float, float> p =
            detail::make_base_problem(q, k, v, s, true, std::vector<std::int64_t>{});
        p.q_scale = scale_;
        const std::size_t per_item = static_cast<std::size_t>(features_.padded * dvp_);
        const index_t n_chunks = (T + detail::taylor::kChunk - 1) / detail::taylor::kChunk;
        parallel_for(pool_, batch_ * heads_kv_, [&](std::int64_t item) {
            const detail::taylor::linear_sequence<A, float> sq{&p,    out, &features_, eps_, item / heads_kv_,
                                                               item % heads_kv_};
            detail::taylor::chunk_buffers<A> cb =
                detail::taylor::make_chunk_buffers<A>(s, detail::taylor::kChunk * s.group());
            std::vector<float> buf;
            float* S = state_.data() + per_item * static_cast<std::size_t>(item);
            for (index_t c = 0; c < n_chunks; ++c) {
                const index_t i0 = c * detail::taylor::kChunk, i1 = std::min(T, i0 + detail::taylor::kChunk);
                sq.run_queries(cb, buf, S, i0, i1, c, true);
            }
        });
        length_ += T;
    }

    index_t batch_, heads_, heads_kv_, dim_, dim_v_;
    float scale_, eps_;
    thread_pool* pool_;
    detail::taylor::feature_table features_;
    index_t dvp_;
    std::vector<float> state_;
    index_t length_ = 0;
};

}  // namespace attnkit
