// The quadratic form of Taylor attention's backward: the engine's backward tile kernel
// (detail/backward/tile_kernel.hpp) with the Taylor gradient row policy below, and the one row
// statistic the policy needs that the forward does not return, the row sums Z.
//
// With w = 1 + s + s^2/2 on the visible keys, Z_i = sum_j w_ij and inv_i = 1 / (Z_i + eps):
//   P_ij  = w_ij inv_i                            (the weights that multiply V, as the forward's)
//   dS_ij = inv_i (dP_ij - D_i) (1 + s_ij),       D_i = <dO_i, O_i>
// (o_i = N_i inv_i with N_i = sum_j w_ij v_j, so dL/dw_ij = inv_i <dO_i, v_j> - inv_i^2 <dO_i, N_i>
// = inv_i (dP_ij - D_i), and dw/ds = 1 + s). The statistics per row: stat_a = inv_i (0 for a row
// without visible keys: its P and dS are 0), stat_b = inv_i D_i, so that dS = (inv dP - stat_b)
// (1 + s) is one FMA and a product.
//
// Z: the API passes no row statistic (softmax passes lse), so it is recomputed. A forward run of
// the tile kernel would give it (the Taylor row policy's summary is Z), but it also forms W V:
// 2 Lq Lk (D + Dv) FLOPs, 40% on top of the backward's 2 Lq Lk (3 D + 2 Dv). The masks of Taylor
// attention make every visible set a prefix [0, hi_i) of the keys, with hi_i non-decreasing in i,
// so Z has the linear form's structure in its cheapest guise, the three-state split of
// docs/variants.md without values:
//   Z_i = c + q'.K1(c) + 1/2 q'^T K2(c) q' + sum_{c <= j < hi_i} w_ij,   c = hi_i rounded down to kChunk
// with K1(c) = sum_{j<c} k_j and K2(c) = sum_{j<c} k_j k_j^T kept as running sums over whole
// chunks (each chunk summed from zero and then added, so float error grows with the number of
// chunks, not of keys). Per row D^2 + kChunk D FLOPs and per key D^2, against the backward's
// ~Lk (3 D + 2 Dv) per row: a few percent at the lengths where the quadratic form is used.
// A NaN in key j reaches K1 and K2 only for rows whose prefix holds j, the rows that see it.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/detail/backward/tile_kernel.hpp"
#include "attnkit/detail/row_kernel.hpp"
#include "attnkit/detail/taylor/linear.hpp"
#include "attnkit/options.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

// The gradient row policy (backward/grad_rows.hpp's contract) of the Taylor weights. Scores
// arrive as the packed (scaled) queries give them: s itself.
struct grad_rows {
    // A padding row of the kernel (no visible key): stat_a = 0 makes its P and dS zero.
    static float empty_row_a() { return 0.0f; }

    template <class A>
    ATTNKIT_NOINLINE void grads(float* s, float* dp, index_t n_rows, index_t key0, bool masked, const index_t* lo,
                                const index_t* hi, const float* inv, const float* inv_d) const {
        using V = simd::vfloat<A>;
        const V one(1.0f), half(0.5f);
        backward::tile_grads<A>(s, dp, n_rows, key0, masked, lo, hi, [&](index_t r) {
            const V a(inv[r]), nb(-inv_d[r]);
            return [=](V& x, V& dpv) {
                const V w = simd::fma(x, simd::fma(x, half, one), one);
                dpv = simd::fma(a, dpv, nb) * (x + one);
                x = w * a;
            };
        });
    }
};

// Keys [0, hi) that query position i of batch item b sees (the Taylor masks: causal, key_lengths).
template <class KVT, class QT>
inline index_t visible_keys(const basic_attention_problem<KVT, QT>& p, index_t b, index_t i) {
    const index_t len = p.key_lengths ? static_cast<index_t>(p.key_lengths[b]) : p.s.len_k;
    const index_t hi = p.causal ? std::min(len, i + p.s.len_k - p.s.len_q + 1) : len;
    return std::max<index_t>(hi, 0);
}

// The running sums K1 = sum k and K2 = sum k k^T of a key prefix, and Z of a query row against it.
template <class A>
class prefix_row_sums {
   public:
    explicit prefix_row_sums(index_t dim)
        : D_(dim), k1_(static_cast<std::size_t>(dim)), k2_(static_cast<std::size_t>(dim * dim)),
          c1_(k1_.size()), c2_(k2_.size()), kf_(k1_.size()), t_(k1_.size()) {}

    index_t length() const { return n_; }

    // Adds keys [n_, n_ + count) (rows of k, stride sl) to the sums, as one chunk.
    template <class KVT>
    void add_chunk(const KVT* k, index_t sl, index_t count) {
        std::fill(c1_.begin(), c1_.end(), 0.0f);
        std::fill(c2_.begin(), c2_.end(), 0.0f);
        for (index_t j = 0; j < count; ++j) {
            const KVT* kr = k + j * sl;
            for (index_t d = 0; d < D_; ++d) kf_[static_cast<std::size_t>(d)] = simd::to_float(kr[d]);
            axpy<A>(c1_.data(), 1.0f, kf_.data(), D_);
            for (index_t a = 0; a < D_; ++a) axpy<A>(c2_.data() + a * D_, kf_[static_cast<std::size_t>(a)], kf_.data(), D_);
        }
        for (std::size_t x = 0; x < k1_.size(); ++x) k1_[x] += c1_[x];
        for (std::size_t x = 0; x < k2_.size(); ++x) k2_[x] += c2_[x];
        n_ += count;
    }

    // n_ + q'.K1 + 1/2 q'^T K2 q' for a scaled query q' (D floats).
    float read(const float* qs) {
        for (index_t a = 0; a < D_; ++a) t_[static_cast<std::size_t>(a)] = simd::dot<A>(k2_.data() + a * D_, qs, D_);
        return static_cast<float>(n_) + simd::dot<A>(k1_.data(), qs, D_) + 0.5f * simd::dot<A>(t_.data(), qs, D_);
    }

   private:
    index_t D_, n_ = 0;
    std::vector<float> k1_, k2_, c1_, c2_, kf_, t_;
};

// The row sums Z of one work item (batch b, key/value head hk; rows position-major, G query heads
// per position) into z[Lq G].
template <class A, class KVT, class QT>
void item_row_sums(const basic_attention_problem<KVT, QT>& p, index_t b, index_t hk, float* z) {
    const attention_shape& s = p.s;
    const index_t G = s.group(), D = s.dim;
    prefix_row_sums<A> sums(D);
    std::vector<float> qs(static_cast<std::size_t>(D)), kf(static_cast<std::size_t>(D));
    const KVT* k0 = p.k.row(b, 0, hk);
    for (index_t i = 0; i < s.len_q; ++i) {
        const index_t hi = visible_keys(p, b, i), c = hi / kChunk * kChunk;
        while (sums.length() < c) sums.add_chunk(k0 + sums.length() * p.k.sl, p.k.sl, kChunk);
        for (index_t g = 0; g < G; ++g) {
            const QT* qr = p.q.row(b, i, hk * G + g);
            for (index_t d = 0; d < D; ++d) qs[static_cast<std::size_t>(d)] = simd::to_float(qr[d]) * p.q_scale;
            float zi = hi == 0 ? 0.0f : sums.read(qs.data());
            for (index_t j = c; j < hi; ++j) {
                const KVT* kr = k0 + j * p.k.sl;
                for (index_t d = 0; d < D; ++d) kf[static_cast<std::size_t>(d)] = simd::to_float(kr[d]);
                const float x = simd::dot<A>(qs.data(), kf.data(), D);
                zi += 1.0f + x * (1.0f + 0.5f * x);
            }
            z[i * G + g] = zi;
        }
    }
}

// The quadratic-form backward of one call (arguments validated by the caller).
template <class A>
void quadratic_backward(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
                        const view<const float, 4>& out, const view<const float, 4>& d_out, const view<float, 4>& d_q,
                        const view<float, 4>& d_k, const view<float, 4>& d_v, const attention_shape& s,
                        const taylor_options& opts) {
    basic_attention_problem<float, float> p = make_base_problem(q, k, v, s, opts.causal, opts.key_lengths);
    const float scale = resolve_scale(opts.scale, s.dim);
    p.q_scale = scale;
    backward::gradient_outputs go{d_q, d_k, d_v};
    go.dq_scale = scale;  // dQ = scale dS K
    go.dk_scale = 1.0f;   // dK = dS (scale Q): the packed queries carry the scale
    const index_t G = s.group();
    const float eps = opts.eps;
    auto stats = [&](index_t b, index_t hk, float* inv, float* inv_d) {
        item_row_sums<A>(p, b, hk, inv);
        for (index_t i = 0; i < s.len_q; ++i)
            for (index_t g = 0; g < G; ++g) {
                const index_t r = i * G + g, h = hk * G + g;
                const float zr = inv[r];
                // A row without visible keys has Z = 0 (the forward writes zeros): P = dS = 0.
                const float a = visible_keys(p, b, i) == 0 ? 0.0f : 1.0f / (zr + eps);
                inv[r] = a;
                inv_d[r] = a == 0.0f ? 0.0f : a * simd::dot<A>(d_out.ptr(b, i, h), out.ptr(b, i, h), s.dim_v);
            }
    };
    backward::attention_backward<A>(p, grad_rows{}, rows_of(d_out), stats, go, opts.pool);
}

}  // namespace taylor
}  // namespace detail
}  // namespace attnkit
