// attnkit::mta_state: multi-token attention for generation, one token at a time.
//
// Causality makes every stage of row i final once token i is known: its probabilities P_i (after
// the pre-softmax convolution, head mixing and softmax) depend only on tokens <= i. A new token
// t therefore needs
//   - the scores of the last c_q,pre rows against all keys (from the c_q,pre most recent queries
//     and the K cache), convolved and mixed into row t's pre-softmax scores, then softmaxed;
//   - the probability rows t - c_q,post + 1 .. t (kept in a ring), for the post convolution;
//   - the V cache for P V.
// Cost per token and head: O(c_q L (D + G c_k)), against O(L^2) for recomputing the layer.
// Outputs equal the matching rows of one mta_attention call over the whole sequence (up to
// float rounding: the summation order differs).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attnkit/detail/mta/check.hpp"
#include "attnkit/detail/mta/plan.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {

class mta_state {
   public:
    // Validates the options against these shapes; the weights in opts are borrowed and must
    // outlive the state.
    mta_state(index_t batch, index_t heads, index_t heads_kv, index_t dim, index_t dim_v, const mta_options& opts)
        : o_(opts) {
        detail::check_state_sizes("mta_state", batch, heads, heads_kv, dim, dim_v);
        s_ = {batch, 0, 0, heads, heads_kv, dim, dim_v};
        ms_ = detail::mta::check_options(opts, s_);
        scale_ = detail::resolve_scale(opts.scale, dim);
        if (ms_.pre.on()) th_pre_ = detail::mta::dense(opts.kq_pre);
        if (ms_.post.on()) th_post_ = detail::mta::dense(opts.kq_post);
        if (opts.head_pre.data) w_pre_ = detail::mta::dense(opts.head_pre);
        if (opts.head_post.data) w_post_ = detail::mta::dense(opts.head_post);
        if (opts.norm_weight.data) norm_w_ = detail::mta::dense(opts.norm_weight);
        if (opts.gate_weight.data) gate_w_ = detail::mta::dense(opts.gate_weight);
        cq1_ = ms_.pre.on() ? ms_.pre.c_q : 1;
        cq2_ = ms_.post.on() ? ms_.post.c_q : 1;
        reset();
    }

    index_t length() const { return len_; }

    void reset() {
        len_ = 0;
        const std::size_t B = static_cast<std::size_t>(s_.batch);
        kc_.assign(B, {});
        vc_.assign(B, {});
        qring_.assign(B * static_cast<std::size_t>(cq1_ * s_.heads * s_.dim), 0.0f);
        pring_.assign(B * static_cast<std::size_t>(cq2_), {});
    }

    // Appends T >= 0 tokens: q [B, T, H, D], k [B, T, Hk, D], v [B, T, Hk, Dv], out [B, T, H, Dv].
    // Each new query sees every token appended before it and itself.
    template <class Q, class K, class V, class O>
    void step(const Q& q, const K& k, const V& v, O&& out) {
        const auto qv = detail::q_view(q);
        const auto kv = detail::k_view(k);
        const auto vv = detail::v_view(v);
        const auto ov = detail::out_view(std::forward<O>(out));
        static_assert(detail::kFloatViews<decltype(qv), decltype(kv), decltype(vv), decltype(ov)>,
                      "attnkit::mta_state::step: float storage, as mta_attention");
        const detail::attention_shape a = detail::check_qkv(qv, kv, vv);
        detail::check_out("out", ov, a);
        // out = q (the same view) is safe here: a token's query is copied before its output is written.
        detail::check_attention_memory(qv, kv, vv, ov, static_cast<const view<float, 3>*>(nullptr));
        const index_t T = a.len_q;
        if (a.len_k != T)
            detail::fail("mta_state::step: q and k must hold the same T new tokens, got q " + shape_string(qv) +
                         ", k " + shape_string(kv));
        if (a.batch != s_.batch || a.heads != s_.heads || a.heads_k != s_.heads_k || a.dim != s_.dim ||
            a.dim_v != s_.dim_v)
            detail::fail("mta_state::step: expected q [" + std::to_string(s_.batch) + ", T, " +
                         std::to_string(s_.heads) + ", " + std::to_string(s_.dim) + "], k [B, T, " +
                         std::to_string(s_.heads_k) + ", " + std::to_string(s_.dim) + "], v [B, T, " +
                         std::to_string(s_.heads_k) + ", " + std::to_string(s_.dim_v) + "] as constructed, got q " +
                         shape_string(qv) + ", k " + shape_string(kv) + ", v " + shape_string(vv));
        for (index_t t = 0; t < T; ++t) {
            for (index_t b = 0; b < s_.batch; ++b) token(b, len_, qv, kv, vv, ov, t);
            ++len_;
        }
    }

   private:
    attnkit::detail::attention_shape s_{};
    detail::mta::shape ms_{};
    mta_options o_;
    float scale_ = 1.0f;
    std::vector<float> th_pre_, th_post_, w_pre_, w_post_, norm_w_, gate_w_;
    index_t cq1_ = 1, cq2_ = 1, len_ = 0;
    std::vector<std::vector<float>> kc_, vc_;  // per batch item: [L][Hk][D], [L][Hk][Dv]
    std::vector<float> qring_;                 // per batch item: the last c_q,pre queries [slot][H][D]
    std::vector<std::vector<float>> pring_;    // per batch item and slot: probability row i, [H][i + 1]
    std::vector<float> x_, y_, y2_, z_, o_rows_;

    template <class QV, class KV, class VV, class OV>
    void token(index_t b, index_t t, const QV& q, const KV& k, const VV& v, const OV& out, index_t tt) {
        const index_t H = s_.heads, Hk = s_.heads_k, D = s_.dim, Dv = s_.dim_v, grp = s_.group(), n = t + 1;
        auto& kc = kc_[static_cast<std::size_t>(b)];
        auto& vc = vc_[static_cast<std::size_t>(b)];
        for (index_t h = 0; h < Hk; ++h) {
            for (index_t d = 0; d < D; ++d) kc.push_back(static_cast<float>(k(b, tt, h, d)));
        }
        for (index_t h = 0; h < Hk; ++h)
            for (index_t d = 0; d < Dv; ++d) vc.push_back(static_cast<float>(v(b, tt, h, d)));
        float* qr = qring_.data() + b * cq1_ * H * D;
        for (index_t h = 0; h < H; ++h)
            for (index_t d = 0; d < D; ++d) qr[((t % cq1_) * H + h) * D + d] = static_cast<float>(q(b, tt, h, d)) * scale_;

        // X rows t - c_q + 1 .. t of every head (0 above the diagonal and before the sequence).
        x_.assign(static_cast<std::size_t>(cq1_ * H * n), 0.0f);
        for (index_t a = 0; a < cq1_; ++a) {
            const index_t i = t + a - (cq1_ - 1);
            if (i < 0) continue;
            for (index_t h = 0; h < H; ++h) {
                const float* qi = qr + ((i % cq1_) * H + h) * D;
                float* xr = x_.data() + (a * H + h) * n;
                for (index_t j = 0; j <= i; ++j) {
                    const float* kj = kc.data() + (j * Hk + h / grp) * D;
                    float s = 0.0f;
                    for (index_t d = 0; d < D; ++d) s += qi[d] * kj[d];
                    xr[j] = s;
                }
            }
        }
        // Pre-softmax convolution and head mixing of row t.
        y_.assign(static_cast<std::size_t>(H * n), 0.0f);
        if (ms_.pre.on())
            conv_row(x_.data(), n, th_pre_.data(), ms_.pre, y_.data(), n);
        else
            std::copy(x_.begin(), x_.begin() + H * n, y_.begin());
        if (!w_pre_.empty()) mix_row(y_, n, w_pre_);
        // Causal softmax of row t: every key j <= t is visible.
        auto& slot = pring_[static_cast<std::size_t>(b * cq2_ + t % cq2_)];
        slot.assign(static_cast<std::size_t>(H * n), 0.0f);
        for (index_t h = 0; h < H; ++h) {
            const float* y = y_.data() + h * n;
            const float m = *std::max_element(y, y + n);
            double z = 0.0;
            for (index_t j = 0; j < n; ++j) z += std::exp(static_cast<double>(y[j] - m));
            for (index_t j = 0; j < n; ++j) slot[h * n + j] = static_cast<float>(std::exp(static_cast<double>(y[j] - m)) / z);
        }
        // Post-softmax convolution over the kept probability rows, Mask0, head mixing.
        z_.assign(static_cast<std::size_t>(H * n), 0.0f);
        if (ms_.post.on()) {
            x_.assign(static_cast<std::size_t>(cq2_ * H * n), 0.0f);
            for (index_t a = 0; a < cq2_; ++a) {
                const index_t i = t + a - (cq2_ - 1);
                if (i < 0) continue;
                const auto& pr = pring_[static_cast<std::size_t>(b * cq2_ + i % cq2_)];
                for (index_t h = 0; h < H; ++h)
                    std::copy(pr.begin() + h * (i + 1), pr.begin() + (h + 1) * (i + 1), x_.begin() + (a * H + h) * n);
            }
            conv_row(x_.data(), n, th_post_.data(), ms_.post, z_.data(), n);
        } else {
            std::copy(slot.begin(), slot.end(), z_.begin());
        }
        if (!w_post_.empty()) mix_row(z_, n, w_post_);
        // P V and the per-row stages.
        o_rows_.assign(static_cast<std::size_t>(Dv), 0.0f);
        const float depth = o_.norm_layer >= 0 ? static_cast<float>(0.2 + 0.6 * std::exp(-0.3 * static_cast<double>(o_.norm_layer))) : 1.0f;
        for (index_t h = 0; h < H; ++h) {
            std::fill(o_rows_.begin(), o_rows_.end(), 0.0f);
            const float* p = z_.data() + h * n;
            for (index_t j = 0; j < n; ++j) {
                const float* vj = vc.data() + (j * Hk + h / grp) * Dv;
                for (index_t d = 0; d < Dv; ++d) o_rows_[d] += p[j] * vj[d];
            }
            float sc = depth;
            if (!norm_w_.empty()) {
                float ss = 0.0f;
                for (float e : o_rows_) ss += e * e;
                const float r = 1.0f / std::sqrt(ss / static_cast<float>(Dv) + o_.norm_eps);
                for (index_t d = 0; d < Dv; ++d) o_rows_[d] *= r * norm_w_[d];
            }
            if (!gate_w_.empty()) {
                float g = o_.gate_bias;
                for (index_t d = 0; d < Dv; ++d) g += o_rows_[d] * sc * gate_w_[d];
                sc *= 1.0f / (1.0f + std::exp(-g));
            }
            for (index_t d = 0; d < Dv; ++d) out(b, tt, h, d) = o_rows_[d] * sc;
        }
    }

    // y[h][j] (j < n, row t) = sum_{m, a, c} th[h, m, a, c] x[a][(h / G) G + m][j + c - hk], with x
    // rows [c_q][H][ld] (0 outside [0, n)), then Mask0 is implicit: only j <= t is computed.
    void conv_row(const float* x, index_t ld, const float* th, const detail::mta::conv_shape& cs, float* y, index_t n) const {
        const index_t H = s_.heads, G = cs.groups, cq = cs.c_q, ck = cs.c_k, hk = cs.key_halo();
        for (index_t h = 0; h < H; ++h)
            for (index_t m = 0; m < G; ++m)
                for (index_t a = 0; a < cq; ++a) {
                    const float* xr = x + (a * H + (h / G) * G + m) * ld;
                    for (index_t c = 0; c < ck; ++c) {
                        const float w = th[((h * G + m) * cq + a) * ck + c];
                        const index_t sh = c - hk, j0 = std::max<index_t>(0, -sh), j1 = std::min(n, ld - sh);
                        float* yr = y + h * n;
                        for (index_t j = j0; j < j1; ++j) yr[j] += w * xr[j + sh];
                    }
                }
    }

    void mix_row(std::vector<float>& y, index_t n, const std::vector<float>& w) {
        const index_t H = s_.heads;
        y2_.assign(static_cast<std::size_t>(H * n), 0.0f);
        for (index_t h = 0; h < H; ++h)
            for (index_t g = 0; g < H; ++g) {
                const float wg = w[static_cast<std::size_t>(h * H + g)];
                for (index_t j = 0; j < n; ++j) y2_[h * n + j] += wg * y[g * n + j];
            }
        y.swap(y2_);
    }
};

}  // namespace attnkit
