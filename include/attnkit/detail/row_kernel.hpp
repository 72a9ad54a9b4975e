// The row kernel for decode and short queries (a few rows per key/value head, long keys): the
// head dim is in lanes, each score is one dot product, and the online softmax runs over the
// keys of a block. Its cost is streaming K and V once, which is what decode is bound by.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/attention_problem.hpp"

namespace attnkit {
namespace detail {

// out[u] = <q, k_u> for four keys at once: four independent accumulators hide FMA latency.
template <class A>
ATTNKIT_ALWAYS_INLINE void dot4(const float* q, const float* k, index_t k_stride, index_t dim, float* out) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    V a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
    index_t d = 0;
    for (; d + W <= dim; d += W) {
        const V qv = simd::loadu<A>(q + d);
        a0 = simd::fma(qv, simd::loadu<A>(k + d), a0);
        a1 = simd::fma(qv, simd::loadu<A>(k + k_stride + d), a1);
        a2 = simd::fma(qv, simd::loadu<A>(k + 2 * k_stride + d), a2);
        a3 = simd::fma(qv, simd::loadu<A>(k + 3 * k_stride + d), a3);
    }
    float s0 = simd::hsum(a0), s1 = simd::hsum(a1), s2 = simd::hsum(a2), s3 = simd::hsum(a3);
    for (; d < dim; ++d) {
        s0 += q[d] * k[d];
        s1 += q[d] * k[k_stride + d];
        s2 += q[d] * k[2 * k_stride + d];
        s3 += q[d] * k[3 * k_stride + d];
    }
    out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

template <class A>
ATTNKIT_ALWAYS_INLINE float dot1(const float* q, const float* k, index_t dim) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    V a(0.0f);
    index_t d = 0;
    for (; d + W <= dim; d += W) a = simd::fma(simd::loadu<A>(q + d), simd::loadu<A>(k + d), a);
    float s = simd::hsum(a);
    for (; d < dim; ++d) s += q[d] * k[d];
    return s;
}

// o += p v for one value row.
template <class A>
ATTNKIT_ALWAYS_INLINE void axpy(float* o, float p, const float* v, index_t dim_v) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const V pv(p);
    index_t c = 0;
    for (; c + W <= dim_v; c += W) simd::storeu(o + c, simd::fma(pv, simd::loadu<A>(v + c), simd::loadu<A>(o + c)));
    for (; c < dim_v; ++c) o[c] += p * v[c];
}

// emit(r, o_row, lse) receives each row's output normalised over keys [ks0, ks1) and its lse.
//
// Decode reads every K and V element once, so its speed is the speed of that read. Keys are
// visited in order and, for each key, all key/value heads of the block: K[b, j, :, :] and
// V[b, j, :, :] are contiguous in BSHD, so memory is read front to back, which is what DRAM
// and the hardware prefetchers stream fastest.
// buf is reused scratch (any contents; resized and cleared here).
template <class A, class Emit>
void row_kernel(const attention_problem& p, const row_block& rb, index_t ks0, index_t ks1, std::vector<float>& buf,
                Emit&& emit) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t BK = kRowBlockKeys;
    static_assert(BK % 4 == 0 && BK % W == 0, "row block must hold whole vectors");
    const index_t D = p.s.dim, Dv = p.s.dim_v, R = rb.rows(), RH = rb.rows_per_kv_head();

    buf.assign(static_cast<std::size_t>(R * (D + Dv + BK)), 0.0f);
    std::vector<index_t> lo(static_cast<std::size_t>(R)), hi(static_cast<std::size_t>(R));
    std::vector<float> m(static_cast<std::size_t>(R), kNegInf), l(static_cast<std::size_t>(R), 0.0f);
    float* qs = buf.data();
    float* o = qs + R * D;
    float* sc = o + R * Dv;  // scores, then probabilities, of the current block: [R][BK]

    const mask_params mp = p.mask(rb.b);
    index_t min_lo = ks1, max_hi = ks0;
    for (index_t r = 0; r < R; ++r) {
        const float* qr = p.q.row(rb.b, rb.pos(r), rb.head(r));
        for (index_t d = 0; d < D; ++d) qs[r * D + d] = qr[d] * p.q_scale;
        row_interval(mp, rb.pos(r), ks0, ks1, lo[r], hi[r]);
        if (lo[r] < hi[r]) {
            min_lo = std::min(min_lo, lo[r]);
            max_hi = std::max(max_hi, hi[r]);
        }
    }

    const float* k0 = p.k.row(rb.b, 0, rb.hk);
    const float* v0 = p.v.row(rb.b, 0, rb.hk);
    for (index_t j0 = min_lo; j0 < max_hi; j0 += BK) {
        const index_t nk = std::min(BK, max_hi - j0);
        auto active = [&](index_t r) { return j0 < hi[r] && j0 + nk > lo[r]; };

        // Scores, four keys at a time per row: one hsum per key, K rows shared by a head's rows.
        for (index_t j = 0; j < nk; j += 4) {
            const index_t nj = std::min<index_t>(4, nk - j);
            for (index_t h = 0; h < rb.n_hk; ++h) {
                const float* kr = k0 + (j0 + j) * p.k.sl + h * p.k.sh;
                for (index_t r = h * RH; r < (h + 1) * RH; ++r) {
                    if (!active(r)) continue;
                    float* s = sc + r * BK + j;
                    if (nj == 4)
                        dot4<A>(qs + r * D, kr, p.k.sl, D, s);
                    else
                        for (index_t u = 0; u < nj; ++u) s[u] = dot1<A>(qs + r * D, kr + u * p.k.sl, D);
                }
            }
        }

        // Online softmax per row over the block.
        for (index_t r = 0; r < R; ++r) {
            if (!active(r)) continue;
            float* s = sc + r * BK;
            if (p.tf.softcap > 0.0f) {
                const float inv = 1.0f / p.tf.softcap, cap = p.tf.softcap * simd::kLog2e;
                for (index_t j = 0; j < nk; ++j) s[j] = cap * std::tanh(s[j] * inv);
            }
            for (index_t j = 0; j < nk; ++j)
                if (j0 + j < lo[r] || j0 + j >= hi[r]) s[j] = kNegInf;
            for (index_t j = nk; j < BK; ++j) s[j] = kNegInf;
            V mv(m[r]);
            for (index_t j = 0; j < BK; j += W) mv = simd::max(simd::loadu<A>(s + j), mv);
            const float mx = simd::hmax(mv);
            const float mu = mx == kNegInf ? 0.0f : mx;  // -inf guard, as in online_softmax.hpp
            const float alpha = simd::exp2(simd::scalar_float(m[r] - mu)).v;
            V sum(0.0f);
            for (index_t j = 0; j < BK; j += W) {
                const V e = simd::exp2_nonpositive(simd::loadu<A>(s + j) - V(mu));
                simd::storeu(s + j, e);
                sum += e;
            }
            l[r] = l[r] * alpha + simd::hsum(sum);
            m[r] = mx;
            if (alpha != 1.0f)
                for (index_t c = 0; c < Dv; ++c) o[r * Dv + c] *= alpha;
        }

        // Values, key by key across heads: V is read front to back like K. Keys a row does not
        // see are skipped rather than weighted by 0, so that a NaN or Inf in their value rows
        // (0 * Inf = NaN) stays out of it; a visible key always contributes, even at weight 0.
        for (index_t j = 0; j < nk; ++j)
            for (index_t h = 0; h < rb.n_hk; ++h) {
                const float* vr = v0 + (j0 + j) * p.v.sl + h * p.v.sh;
                for (index_t r = h * RH; r < (h + 1) * RH; ++r)
                    if (j0 + j >= lo[r] && j0 + j < hi[r]) axpy<A>(o + r * Dv, sc[r * BK + j], vr, Dv);
            }
    }

    for (index_t r = 0; r < R; ++r) {
        const float inv = row_inv_sum(l[r]);
        for (index_t c = 0; c < Dv; ++c) o[r * Dv + c] *= inv;
        emit(r, o + r * Dv, row_lse(m[r], l[r]));
    }
}

}  // namespace detail
}  // namespace attnkit
