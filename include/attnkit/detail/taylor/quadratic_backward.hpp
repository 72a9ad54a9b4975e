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
// ~Lk (3 D + 2 Dv) per row: a few percent at the lengths where the quadratic form is used, as
// long as they run as products (prefix_row_sums below).
// A NaN in key j reaches K1 and K2 only for rows whose prefix holds j, the rows that see it.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/detail/backward/tile_kernel.hpp"
#include "attnkit/detail/gemm.hpp"
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

// Rows of one read of the prefix sums (the queries that share a chunk boundary, at most this
// many): bounds the scratch of a non-causal item, where every row shares one boundary.
constexpr index_t kRowSumRows = 512;

// Keys [j0, j0 + n) of a key/value head as dense float rows [n, D].
template <class KVT>
inline void dense_keys(const KVT* k, index_t sl, index_t n, index_t D, std::vector<float>& out) {
    out.resize(static_cast<std::size_t>(n * D));
    for (index_t j = 0; j < n; ++j) simd::convert_row<simd::default_arch>(k + j * sl, out.data() + j * D, D);
}

// The running sums K1 = sum k and K2 = sum k k^T of a key prefix, and Z of query rows against it.
// Both sides are products on the engine's GEMM: a chunk's K2 is Kc^T Kc (D x kChunk x D), a read
// of n rows is Q K2 (n x D x D) and one dot per row. (Row by row, as D dot products of length D,
// the reads were a large share of the backward on AVX-512, docs/benchmarks.md: each dot is a
// chain of a few FMAs and a horizontal sum.)
template <class A>
class prefix_row_sums {
   public:
    explicit prefix_row_sums(index_t dim)
        : D_(dim), k1_(static_cast<std::size_t>(dim)), k2_(static_cast<std::size_t>(dim * dim)),
          c1_(k1_.size()), c2_(k2_.size()) {}

    index_t length() const { return n_; }

    // Adds keys [n_, n_ + count) (rows of k, stride sl) to the sums, as one chunk summed from zero
    // and then added (float error grows with the number of chunks, not of keys).
    template <class KVT>
    void add_chunk(const KVT* k, index_t sl, index_t count) {
        dense_keys(k, sl, count, D_, kc_);
        const matrix_ref<const float> kc{kc_.data(), count, D_, D_};
        gemm_on<A>(kc, gemm_op::transpose, kc, gemm_op::none, matrix_ref<float>{c2_.data(), D_, D_, D_});
        std::fill(c1_.begin(), c1_.end(), 0.0f);
        for (index_t j = 0; j < count; ++j) axpy<A>(c1_.data(), 1.0f, kc_.data() + j * D_, D_);
        for (std::size_t x = 0; x < k1_.size(); ++x) k1_[x] += c1_[x];
        for (std::size_t x = 0; x < k2_.size(); ++x) k2_[x] += c2_[x];
        n_ += count;
    }

    // z[r] = n_ + q'_r.K1 + 1/2 q'_r^T K2 q'_r for n scaled queries q'_r (rows of qs, stride D).
    void read(const float* qs, index_t n, float* z) {
        t_.resize(static_cast<std::size_t>(n * D_));
        gemm_on<A>(matrix_ref<const float>{qs, n, D_, D_}, matrix_ref<const float>{k2_.data(), D_, D_, D_},
                   matrix_ref<float>{t_.data(), n, D_, D_});
        for (index_t r = 0; r < n; ++r) {
            const float* q = qs + r * D_;
            z[r] = static_cast<float>(n_) + simd::dot<A>(k1_.data(), q, D_) + 0.5f * simd::dot<A>(t_.data() + r * D_, q, D_);
        }
    }

   private:
    index_t D_, n_ = 0;
    std::vector<float> k1_, k2_, c1_, c2_, kc_, t_;
};

// The row sums Z of one work item (batch b, key/value head hk; rows position-major, G query heads
// per position) into z[Lq G]. Positions whose visible keys end in the same chunk share the
// prefix sums up to that chunk's start c; the keys [c, hi_i) after it come from one product of
// those rows' queries with the chunk's keys, each row summing the weights of the keys it sees.
template <class A, class KVT, class QT>
void item_row_sums(const basic_attention_problem<KVT, QT>& p, index_t b, index_t hk, float* z) {
    const attention_shape& s = p.s;
    const index_t G = s.group(), D = s.dim, Lq = s.len_q;
    const index_t max_pos = std::max<index_t>(1, kRowSumRows / G);
    prefix_row_sums<A> sums(D);
    std::vector<float> qs, kt, sc;
    const KVT* k0 = p.k.row(b, 0, hk);
    for (index_t i0 = 0, i1; i0 < Lq; i0 = i1) {
        const index_t c = visible_keys(p, b, i0) / kChunk * kChunk;
        i1 = i0 + 1;
        while (i1 < Lq && i1 - i0 < max_pos && visible_keys(p, b, i1) / kChunk * kChunk == c) ++i1;
        const index_t n = (i1 - i0) * G;
        while (sums.length() < c) sums.add_chunk(k0 + sums.length() * p.k.sl, p.k.sl, kChunk);
        qs.resize(static_cast<std::size_t>(n * D));
        for (index_t i = i0; i < i1; ++i)
            for (index_t g = 0; g < G; ++g) {
                const QT* qr = p.q.row(b, i, hk * G + g);
                float* dst = qs.data() + ((i - i0) * G + g) * D;
                for (index_t d = 0; d < D; ++d) dst[d] = simd::to_float(qr[d]) * p.q_scale;
            }
        float* zg = z + i0 * G;
        if (c > 0)
            sums.read(qs.data(), n, zg);
        else
            std::fill_n(zg, n, 0.0f);
        // Visible ends are non-decreasing in the position: the group's last row sees the most.
        const index_t tail = visible_keys(p, b, i1 - 1) - c;
        if (tail <= 0) continue;
        dense_keys(k0 + c * p.k.sl, p.k.sl, tail, D, kt);
        sc.resize(static_cast<std::size_t>(n * tail));
        gemm_on<A>(matrix_ref<const float>{qs.data(), n, D, D}, gemm_op::none,
                   matrix_ref<const float>{kt.data(), tail, D, D}, gemm_op::transpose,
                   matrix_ref<float>{sc.data(), n, tail, tail});
        for (index_t i = i0; i < i1; ++i) {
            const index_t seen = visible_keys(p, b, i) - c;  // a row adds only the keys it sees
            for (index_t g = 0; g < G; ++g) {
                const index_t r = (i - i0) * G + g;
                float acc = 0.0f;
                for (index_t j = 0; j < seen; ++j) {
                    const float x = sc[static_cast<std::size_t>(r * tail + j)];
                    acc += 1.0f + x * (1.0f + 0.5f * x);
                }
                zg[r] += acc;
            }
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
