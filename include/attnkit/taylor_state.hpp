// attnkit::taylor_state: decode and chunked prefill of Taylor attention (docs/variants.md
// section 2, docs/design.md "Variant entry points"), in the form the cost model picks.
//
//   attnkit::taylor_state st(batch, heads, heads_kv, dim, dim_v, opts);
//   st.step(q, k, v, out);   q [B,T,H,D], k [B,T,Hk,D], v [B,T,Hk,Dv], out [B,T,H,Dv], T >= 1
//   st.length(); st.reset(); st.state_bytes(); st.form(); st.crossover(); st.fold_length();
//   st.reserve(max_tokens);
//
// A step allocates only to grow what the state holds: the quadratic cache (capacity doubling;
// reserve(n) makes room ahead) and S, once, when the state turns linear. Its scratch is the
// calling thread's (detail/scratch.hpp), so a linear step (decode past the fold) allocates
// nothing (tests/scratch_test.cpp).
//
// Two forms, as taylor_attention (opts.form; automatic is the default):
//   quadratic  a K/V cache (row-major per batch item and key/value head, capacity doubling);
//              a step is one causal call of its T queries against the cache, O(T L (D + Dv)),
//              through taylor_attention's driver with quadratic_rows: the tile kernel, or, for
//              a step of T G <= kRowKernelMaxRows rows (decode), the row kernel (head dim in
//              lanes, K and V read once).
//   linear     per batch item and key/value head S = sum phi(k) v^T, z = sum phi(k) over the
//              completed chunks of 64 tokens (F = 1 + D + D(D+1)/2 rows of Dv + 1 floats,
//              features.hpp) and the current chunk's K and V: O(T F Dv) per step at any length.
//              The chunks are the linear kernel's (linear.hpp): a query reads S, sees its own
//              chunk up to itself through the quadratic form, and a full chunk enters S (summed
//              on its own, then added). A decode read of S with few rows uses a row kernel.
// automatic: a step with length() + T < crossover() runs quadratic, crossover() being the
// smallest L for which the cost model (cost_model.hpp) picks the linear form for a causal call
// with Lq = Lk = L (B cancels; D = Dv = 64, H = Hk = 8: 5061), so a prefill gets the cheaper
// form; a step that reaches it runs linear. The state folds the cache into S (chunk by chunk in
// the linear form's order; the last length() % 64 tokens become the current chunk; the cache is
// freed) before a step that reaches crossover(), or after a step once length() >= fold_length()
// = min(crossover(), decode_fold_length): from there the cache would hold more than S, and a
// decode step, bound by reading one or the other, would cost more (D = Dv = 64: 1090 tokens).
// form = linear: linear from the first token; form = quadratic: never folds (at most 2^24 - 1
// tokens, as the quadratic form) and never builds the feature table of the linear form.
//
// Memory per batch item and key/value head (state_bytes(): what is allocated now): quadratic
// 4 (D + Dv) bytes per token, capacity at most crossover() - 1 tokens (D = Dv = 64: 512 B per
// token; automatic holds at most fold_length() + T - 1 of them, < 0.6 MB after the step); linear
// 4 (F' Dv' + 64 (D + Dv)) bytes whatever the length, F' and Dv' = Dv + 1 rounded up to the
// micro tile (D = Dv = 64: 0.59 MB).
//
// Bitwise (tests/taylor_state_test.cpp): a one-step prefill from an empty state is
// taylor_attention(causal = true, form = automatic) (the same driver and kernels); after the
// fold every step of >= 2 tokens gives the linear form's rows; other steps (later quadratic
// steps: the driver splits keys by the shapes; one-token linear reads) agree with one causal
// call to float rounding (16 eps times the row's magnitude). Any thread count gives the same bits.
//
// opts: scale, eps, form and pool (causal is implied; key_lengths must be empty). A pool passed
// in opts must outlive the state. A bad step throws std::invalid_argument naming the argument
// and both shapes; nothing is written and the state is unchanged.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/detail/attention_driver.hpp"
#include "attnkit/detail/check.hpp"
#include "attnkit/detail/taylor/check.hpp"
#include "attnkit/detail/taylor/cost_model.hpp"
#include "attnkit/detail/taylor/linear.hpp"
#include "attnkit/detail/taylor/quadratic.hpp"
#include "attnkit/detail/taylor/token_cache.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {

// Steps of any length; the outputs are those of one causal taylor_attention call over every
// token so far:
//
//   attnkit::taylor_state st(1, 8, 8, 64, 64);   // batch, heads, heads_kv, dim, dim_v
//   st.step(q_prompt, k_prompt, v_prompt, out_prompt);   // T = prompt length
//   st.step(q_tok, k_tok, v_tok, out_tok);               // T = 1 per generated token
class taylor_state {
    using A = simd::default_arch;
    static constexpr index_t kChunk = detail::taylor::kChunk;
    static constexpr index_t kLanes = simd::kLanes<A>;

   public:
    taylor_state(index_t batch, index_t heads, index_t heads_kv, index_t dim, index_t dim_v,
                 const taylor_options& opts = {})
        : batch_(batch), heads_(heads), heads_kv_(heads_kv), dim_(dim), dim_v_(dim_v),
          scale_((check(batch, heads, heads_kv, dim, dim_v, opts), detail::resolve_scale(opts.scale, dim))),
          eps_(opts.eps), pool_(opts.pool), form_(opts.form),
          crossover_(opts.form == taylor_form::linear      ? 0
                     : opts.form == taylor_form::quadratic ? detail::taylor::kMaxQuadraticKeys + 1
                                                           : detail::taylor::causal_crossover(heads, heads_kv, dim, dim_v)),
          fold_length_(opts.form == taylor_form::automatic
                           ? std::min(crossover_, detail::taylor::decode_fold_length(dim, dim_v))
                           : crossover_),
          features_(linear_features(batch, heads_kv, dim, dim_v, opts.form)),
          dvp_(detail::taylor::chunk_buffers<A>::padded_dim_v(dim_v)),
          per_item_(features_.padded * dvp_ + kChunk * (dim + dim_v)), cache_(batch, heads_kv, dim, dim_v) {
        if (form_ == taylor_form::linear) start_linear();
    }

    index_t length() const { return length_; }
    // The form of the next step (automatic: quadratic until the fold).
    taylor_form form() const { return linear_ ? taylor_form::linear : taylor_form::quadratic; }
    // The length from which the state is linear: a step with length() + T >= crossover() runs
    // the linear form (0 for form = linear; 2^24 for form = quadratic: never).
    index_t crossover() const { return crossover_; }
    // The length from which the state is linear: a step that ends at or past it folds the cache
    // into S after computing its outputs (automatic: min(crossover(), decode_fold_length), the
    // cache never outgrowing S; D = Dv = 64: 1090; the forced forms: crossover()).
    index_t fold_length() const { return fold_length_; }
    // Room in the quadratic cache for `tokens` tokens in all (length() included), up to what the
    // form keeps there (automatic: until the fold; linear: nothing): quadratic steps up to that
    // length do not grow it. reset() keeps it.
    void reserve(index_t tokens) {
        if (tokens < 0) detail::fail("taylor_state::reserve: tokens must be >= 0, got " + std::to_string(tokens));
        if (linear_ || form_ == taylor_form::linear) return;
        const index_t limit = form_ == taylor_form::quadratic ? detail::taylor::kMaxQuadraticKeys : crossover_ - 1;
        cache_.reserve(std::min(tokens, limit), length_, kChunk, limit);
    }
    // Back to an empty state in the options' form (the cache keeps its allocation).
    void reset() {
        length_ = 0;
        k_shift_ = 0;
        if (form_ == taylor_form::linear) {
            std::fill(state_.begin(), state_.end(), 0.0f);
        } else {
            std::vector<float>().swap(state_);
            linear_ = false;
        }
    }
    // Bytes held now: the cache (quadratic) or S, z and the current chunk (linear); see above.
    std::size_t state_bytes() const { return state_.size() * sizeof(float) + cache_.bytes(); }

    template <class Q, class K, class V, class O>
    void step(const Q& q, const K& k, const V& v, O&& out) {
        const auto qv = detail::q_view(q);
        const auto kv = detail::k_view(k);
        const auto vv = detail::v_view(v);
        const auto ov = detail::out_view(out);
        ATTNKIT_IF_FLOAT("attnkit::taylor_state::step: float tensors", qv, kv, vv, ov) run(qv, kv, vv, ov);
    }

   private:
    static void check(index_t batch, index_t heads, index_t heads_kv, index_t dim, index_t dim_v,
                      const taylor_options& opts) {
        detail::taylor::check_state_sizes(batch, heads, heads_kv, dim, dim_v, opts);
        detail::taylor::check_options(opts, detail::attention_shape{batch, 1, 1, heads, heads_kv, dim, dim_v});
    }

    index_t items() const { return batch_ * heads_kv_; }

    // The linear form's feature table, built only when the form may run (form = quadratic never
    // needs its F = 1 + D + D(D+1)/2 rows). Its sizes, and S with the current chunk per item
    // (F' (Dv + 1) + 64 (D + Dv) floats), must be countable: else dim is out of reach of the
    // linear form, and the state says so (form = quadratic has no such limit).
    static detail::taylor::feature_table linear_features(index_t batch, index_t heads_kv, index_t dim, index_t dim_v,
                                                         taylor_form form) {
        if (form == taylor_form::quadratic) return {};
        constexpr index_t kMaxFloats = index_t(1) << 60;  // bytes of the state still fit in index_t
        constexpr int kMR = detail::tile_traits<A>::kMR;
        const index_t dvp = detail::taylor::chunk_buffers<A>::padded_dim_v(dim_v);
        // dim < 2^30: the table's int32 indices, and F < 2^60 without overflow on the way.
        bool fits = dim < (index_t(1) << 30) && dim_v < kMaxFloats / kChunk;
        if (fits) {
            const index_t f = 1 + dim + dim * (dim + 1) / 2, fp = (f + kMR - 1) / kMR * kMR;
            fits = fp <= kMaxFloats / dvp;
            if (fits) {
                const index_t per_item = fp * dvp + kChunk * (dim + dim_v);
                fits = per_item <= kMaxFloats / std::max<index_t>(1, batch) / heads_kv;
            }
        }
        if (!fits)
            detail::fail("dim: the linear form of taylor_state holds 1 + D + D(D+1)/2 feature rows of Dv + 1 floats "
                         "per batch item and key/value head, too many to count for batch " + std::to_string(batch) +
                         ", heads_kv " + std::to_string(heads_kv) + ", dim " + std::to_string(dim) + ", dim_v " +
                         std::to_string(dim_v) + " (form = quadratic needs no such state)");
        return detail::taylor::feature_table(dim, kMR);
    }

    void start_linear() {
        // + kLanes: read_row reads whole vectors past the last state row.
        state_.assign(static_cast<std::size_t>(items() * per_item_ + kLanes), 0.0f);
        linear_ = true;
    }

    void run(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
             const view<float, 4>& out) {
        // out may be q itself (every row is read before it is written), nothing else.
        const detail::attention_shape s = detail::check_state_step(
            "taylor_state", q, k, v, out, {batch_, 0, 0, heads_, heads_kv_, dim_, dim_v_}, 1);
        const index_t T = s.len_q;
        if (form_ == taylor_form::quadratic)
            detail::check_max_keys("k", length_ + T, "tokens in a taylor_state of form quadratic", "length() + T", k);
        if (!linear_ && length_ + T < crossover_) {
            quadratic_step(q, k, v, out, T);
            length_ += T;
            if (length_ >= fold_length_) fold();  // decode steps would read more than S from now on
            return;
        } else {
            if (!linear_) fold();
            const int q_shift = detail::taylor::large_shift(q, scale_);
            raise_key_shift(detail::taylor::large_shift(k, 1.0f));
            parallel_for(pool_, items(), [&](std::int64_t item) { linear_item(q, k, v, out, s, item, q_shift); });
        }
        length_ += T;
    }

    // The step's tokens join the cache, then its queries attend to the whole cache as one causal
    // call (Lq = T, Lk = length + T): the driver and plan of taylor_attention's quadratic form.
    // The cache's limit: the most a quadratic state holds (automatic: crossover - 1, the fold
    // comes first).
    void quadratic_step(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
                        const view<float, 4>& out, index_t T) {
        const index_t D = dim_, Dv = dim_v_, N = length_ + T;
        cache_.reserve(N, length_, kChunk,
                       form_ == taylor_form::quadratic ? detail::taylor::kMaxQuadraticKeys : crossover_ - 1);
        cache_.append(k, v, length_);
        detail::basic_attention_problem<float, float> p;
        p.s = detail::attention_shape{batch_, T, N, heads_, heads_kv_, D, Dv};
        p.q = detail::rows_of(q);
        p.k = cache_.k_rows();
        p.v = cache_.v_rows();
        p.q_scale = scale_;
        p.causal = true;
        detail::forward_outputs fo;
        fo.out = out;
        detail::attention_forward<A>(p, detail::taylor::quadratic_rows{eps_}, fo, pool_);
    }

    // Quadratic -> linear: every full chunk of the cache enters S in position order, each summed
    // on its own and then added (the linear form's update, chunk_step), the rest becomes the
    // current chunk; the cache is freed.
    void fold() {
        std::vector<float> st(static_cast<std::size_t>(items() * per_item_ + kLanes), 0.0f);
        const index_t D = dim_, Dv = dim_v_, full = length_ / kChunk, rest = length_ - full * kChunk;
        float k_max = 0.0f;
        for (index_t item = 0; item < items(); ++item) {
            const float* ck = cache_.k(item);
            for (index_t x = 0; x < length_ * D; ++x) k_max = std::max(k_max, std::fabs(ck[x]));
        }
        k_shift_ = detail::taylor::shift_for_max(k_max);
        const float k_factor = std::ldexp(1.0f, -k_shift_);
        parallel_for(pool_, items(), [&](std::int64_t item) {
            float* S = st.data() + per_item_ * item;
            float* pend_k = S + features_.padded * dvp_;
            float* pend_v = pend_k + kChunk * D;
            const float* ck = cache_.k(item);
            const float* cv = cache_.v(item);
            detail::scratch_object<detail::taylor::chunk_buffers<A>> cb_lease;
            detail::taylor::chunk_buffers<A>& cb = cb_lease.get();
            cb.init(D, Dv, kChunk, 0);
            for (index_t c = 0; c < full; ++c) {
                const index_t ld =
                    detail::taylor::pack_keys(cb, ck + c * kChunk * D, D, cv + c * kChunk * Dv, Dv, kChunk, k_factor);
                detail::taylor::chunk_step<A>(cb, features_, S, 0, ld);
            }
            std::copy_n(ck + full * kChunk * D, rest * D, pend_k);
            std::copy_n(cv + full * kChunk * Dv, rest * Dv, pend_v);
        });
        state_.swap(st);
        cache_.release();
        linear_ = true;
    }

    // Keys of 2^20 and more enter S scaled by 2^-k_shift_ (as in the linear kernel, linear.hpp:
    // features of the augmented rows [k, 1] are homogeneous of degree 2, so S and z come out
    // times 2^-2 k_shift_). The shift only grows: a step with larger keys scales what S holds
    // by the exact power of two that brings it to the new shift; ordinary keys never shift.
    void raise_key_shift(int shift) {
        if (shift <= k_shift_) return;
        const float f = std::ldexp(1.0f, -2 * (shift - k_shift_));
        const index_t n = features_.padded * dvp_;
        parallel_for(pool_, items(), [&](std::int64_t item) {
            float* S = state_.data() + per_item_ * item;
            for (index_t x = 0; x < n; ++x) S[x] *= f;
        });
        k_shift_ = shift;
    }

    // Linear form. Tokens are taken in segments that end at chunk boundaries (positions multiple
    // of kChunk, counted from the first token, so the chunks are those of taylor_attention's
    // linear form). A segment's keys join the current chunk; its queries read S (the chunks
    // before) and see the current chunk up to themselves through the quadratic form; a full
    // chunk enters S, summed on its own first (per chunk, then added, as the linear kernel does).
    void linear_item(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
                     const view<float, 4>& out, const detail::attention_shape& s, index_t item, int q_shift) {
        constexpr index_t RT = detail::tile_traits<A>::kTileRows;
        const index_t b = item / heads_kv_, hk = item % heads_kv_, G = s.group(), D = dim_, Dv = dim_v_;
        float* S = state_.data() + per_item_ * item;
        float* pend_k = S + features_.padded * dvp_;
        float* pend_v = pend_k + kChunk * D;
        // Scratch of this thread's (scratch.hpp): a decode step allocates nothing.
        detail::scratch_object<detail::taylor::chunk_buffers<A>> cb_lease;
        detail::taylor::chunk_buffers<A>& cb = cb_lease.get();
        cb.init(D, Dv, kChunk, (kChunk * G + RT - 1) / RT);
        detail::scratch_lease<> buf_lease, qa_lease, phi_lease, rows_lease;
        std::vector<float>& buf = buf_lease.get();
        std::vector<float>& qa = qa_lease.get();
        std::vector<float>& phi = phi_lease.get();
        std::vector<float>& rows = rows_lease.get();  // row path: num (dvp rounded to lanes) per row
        qa.assign(static_cast<std::size_t>(D + 2), 0.0f);
        phi.assign(static_cast<std::size_t>(features_.padded), 0.0f);
        const index_t acc_ld = (dvp_ + kLanes - 1) / kLanes * kLanes;
        // Large queries and keys: the weights come out times 2^-2 (q_shift + k_shift_), the
        // chunk's quadratic part (score_shift) and eps alike.
        const float q_factor = std::ldexp(1.0f, -q_shift), k_factor = std::ldexp(1.0f, -k_shift_);
        detail::taylor::quadratic_rows pol{eps_};
        pol.score_shift = q_shift + k_shift_;
        const float eps_w = std::ldexp(eps_, -2 * pol.score_shift);
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
                    detail::taylor::pack_query(cb, r, q.ptr(b, t + r / G, hk * G + r % G), scale_, q_factor);
                detail::taylor::chunk_step<A>(cb, features_, S, n_panels, 0);
                num = cb.ot.data(), stride_c = RT, stride_r = 0;
            } else {
                rows.resize(static_cast<std::size_t>(n_rows * acc_ld));
                for (index_t r = 0; r < n_rows; ++r) {
                    const float* qr = q.ptr(b, t + r / G, hk * G + r % G);
                    const float qs = scale_ * q_factor;
                    for (index_t d = 0; d < D; ++d) qa[static_cast<std::size_t>(d)] = qr[d] * qs;
                    qa[static_cast<std::size_t>(D)] = q_factor, qa[static_cast<std::size_t>(D + 1)] = 0.0f;
                    detail::taylor::read_row<A>(features_, S, dvp_, qa.data(), phi.data(), rows.data() + r * acc_ld);
                }
                num = rows.data(), stride_c = 1, stride_r = acc_ld;
            }
            auto state_part = [&](index_t r) {
                return panels ? num + (r / RT) * dvp_ * RT + r % RT : num + r * stride_r;
            };
            // The current chunk through the quadratic form: its keys [0, n_pend + seg) against
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
            detail::tile_kernel<A>(p, pol, rb, 0, n_pend + seg, buf,
                                   [&](index_t, index_t r, const float* o_row, float sum) {
                                       const float* sp = state_part(r);
                                       float* o = out.ptr(b, t + r / G, hk * G + r % G);
                                       const float inv = 1.0f / (sp[Dv * stride_c] + sum + eps_w);
                                       for (index_t d = 0; d < Dv; ++d) o[d] = (sp[d * stride_c] + o_row[d]) * inv;
                                   });
            if (n_pend + seg == kChunk) {  // a full chunk enters S
                const index_t ld = detail::taylor::pack_keys(cb, pend_k, D, pend_v, Dv, kChunk, k_factor);
                detail::taylor::chunk_step<A>(cb, features_, S, 0, ld);
            }
            t += seg, pos += seg;
        }
    }

    index_t batch_, heads_, heads_kv_, dim_, dim_v_;
    float scale_, eps_;
    thread_pool* pool_;
    taylor_form form_;
    index_t crossover_, fold_length_;
    detail::taylor::feature_table features_;
    index_t dvp_, per_item_;
    bool linear_ = false;
    int k_shift_ = 0;                      // linear: S holds keys times 2^-k_shift_
    std::vector<float> state_;             // linear: per item S [padded][dvp], current chunk's K, V
    detail::taylor::token_cache cache_;    // quadratic: the tokens' K and V
    index_t length_ = 0;
};

}  // namespace attnkit
