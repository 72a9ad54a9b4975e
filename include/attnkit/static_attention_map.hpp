// attnkit::static_attention_map: the fixed causal attention of RndEmbQK / FixedSeqQK, stored once
// (docs/variants.md section 4; static_qk_attention.hpp computes it without storing it).
//
//   attnkit::static_attention_map map(q_fixed, k_fixed, opts);   // q_fixed [1, Lmax, H, D], k_fixed [1, Lmax, Hk, D]
//   map.apply(v, out, pool);        // v [B, L, Hk, Dv], L <= Lmax; out [B, T, H, Dv]: rows L - T .. L - 1
//   auto mix = attnkit::static_attention_map::from_weights(w);   // w [H, Lmax, Lmax], used as it is
//   mix.apply(v, out);              // v [B, L, Hk, Dv] with any Hk dividing H
//
// Storage: each head's lower-triangular probabilities, packed row by row (row i holds keys
// 0..i): H * Lmax (Lmax + 1) / 2 floats, i.e. 2 H Lmax (Lmax + 1) bytes (bytes()). Row i
// depends only on the stream, never on L, so one map serves every length up to Lmax, and a
// decode step (T = 1) is one row of each head against the cache v.
//
// Key/value heads, GQA by index as everywhere (query head h reads value head h / (H / Hk)): a
// map of a stream pairs its probabilities with k_fixed's Hk heads, so v must have those; a
// from_weights map has no keys, so it reads Hk from v (any divisor of H), unless heads_kv is
// given, which v must then match.
//
// from_weights takes any causal mixing matrix (a learned token-mixing layer, MLP-Mixer style):
// the lower triangle is used as given (no normalisation), the upper triangle is ignored.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/static_qk/check.hpp"
#include "attnkit/detail/static_qk/map_apply.hpp"
#include "attnkit/detail/static_qk/map_build.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {

// Build once, apply to every batch and step:
//
//   attnkit::static_attention_map map(q_fixed, k_fixed);   // or static_attention_map::from_weights(w)
//   map.apply(v, out);                                     // all L rows (out [B, L, H, Dv])
//   map.apply(v_cache, out_step, &pool);                   // decode: the last row (out [B, 1, H, Dv])
class static_attention_map {
   public:
    // Softmax probabilities of the stream (scale: opts.scale, 1/sqrt(D) when 0), built on opts.pool.
    template <class QF, class KF>
    static_attention_map(const QF& q_fixed, const KF& k_fixed, const static_qk_options& opts = {}) {
        namespace sq = detail::static_qk;
        const auto qf = sq::q_fixed_view(q_fixed);
        const auto kf = sq::k_fixed_view(k_fixed);
        ATTNKIT_IF_FLOAT("attnkit::static_attention_map: float q_fixed and k_fixed", qf, kf) {
            const sq::stream_shape s = sq::check_map_stream(qf, kf);
            sq::check_options(opts);
            init(s.max_len, s.heads, s.heads_k);
            sq::build_map<simd::default_arch>(qf, kf, s, detail::resolve_scale(opts.scale, s.dim), p_.data(),
                                              opts.pool);
        }
    }

    // A given mixing matrix w [H, Lmax, Lmax] (float or double), lower triangle as it is.
    // heads_kv: 0 reads the key/value heads from each apply's v; else a divisor of H that v must have.
    template <class W>
    static static_attention_map from_weights(const W& w, index_t heads_kv = 0) {
        namespace sq = detail::static_qk;
        static_assert(detail::tensor_traits<std::decay_t<W>>::kRank == 3,
                      "attnkit::static_attention_map::from_weights: w must have rank 3, [H, Lmax, Lmax]");
        const auto wv = sq::weights_view(w);
        const sq::stream_shape s = sq::check_weights(wv, heads_kv);
        static_attention_map m;
        m.init(s.max_len, s.heads, s.heads_k);
        for (index_t h = 0; h < s.heads; ++h)
            for (index_t i = 0; i < s.max_len; ++i) {
                float* dst = m.p_.data() + h * sq::packed_size(s.max_len) + sq::packed_row(i);
                const auto* src = wv.ptr(h, i);
                for (index_t j = 0; j <= i; ++j) dst[j] = static_cast<float>(src[j]);
            }
        return m;
    }

    // out [B, T, H, Dv] = rows L - T .. L - 1 of the map applied to v [B, L, Hk, Dv], every batch
    // item against the same probabilities; on `pool` when given. Deterministic for any pool.
    template <class V, class O>
    void apply(const V& v, O&& out, thread_pool* pool = nullptr) const {
        namespace sq = detail::static_qk;
        const auto vv = sq::v_view(v);
        const auto ov = detail::output_view<4>("out", std::forward<O>(out), "[B, T, H, Dv]");
        ATTNKIT_IF_FLOAT("attnkit::static_attention_map::apply: float v and out", vv, ov) {
            const index_t hk = sq::map_kv_heads(vv, heads_, heads_kv_);
            const sq::values_shape s = sq::check_values(vv, ov, lmax_, heads_, hk, true, "map");
            // out shares no memory with v: an output row reads every value row up to its own.
            detail::check_outputs_apart({detail::region_of("out", ov)}, {detail::region_of("v", vv)});
            sq::apply_map<simd::default_arch>(p_.data(), lmax_, s, vv, ov, pool);
        }
    }

    index_t max_length() const { return lmax_; }
    index_t heads() const { return heads_; }
    // The key/value heads apply expects; 0 for a from_weights map that takes them from v.
    index_t heads_kv() const { return heads_kv_; }
    std::size_t bytes() const { return p_.size() * sizeof(float); }
    // Packed row i (< max_length()) of head h: the i + 1 weights of keys 0..i.
    const float* row(index_t h, index_t i) const {
        return p_.data() + h * detail::static_qk::packed_size(lmax_) + detail::static_qk::packed_row(i);
    }

   private:
    static_attention_map() = default;
    void init(index_t max_len, index_t heads, index_t heads_kv) {
        lmax_ = max_len;
        heads_ = heads;
        heads_kv_ = heads_kv;
        p_.assign(static_cast<std::size_t>(heads * detail::static_qk::packed_size(max_len)), 0.0f);
    }

    index_t lmax_ = 0, heads_ = 0, heads_kv_ = 0;
    std::vector<float> p_;
};

}  // namespace attnkit
