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

// o = alpha * o + sum_j p[j] v_j, with a chunk of o held in registers across the keys.
template <class A>
inline void accumulate_values(float* o, float alpha, const float* p, const float* v, index_t v_stride, index_t n_keys,
                              index_t dim_v) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t kChunk = 4;
    index_t c = 0;
    for (; c + kChunk * W <= dim_v; c += kChunk * W) {
        V acc[kChunk];
        for (index_t u = 0; u < kChunk; ++u) acc[u] = simd::loadu<A>(o + c + u * W) * V(alpha);
        for (index_t j = 0; j < n_keys; ++j) {
            const V pj(p[j]);
            const float* vr = v + j * v_stride + c;
            for (index_t u = 0; u < kChunk; ++u) acc[u] = simd::fma(pj, simd::loadu<A>(vr + u * W), acc[u]);
        }
        for (index_t u = 0; u < kChunk; ++u) simd::storeu(o + c + u * W, acc[u]);
    }
    for (; c + W <= dim_v; c += W) {
        V acc = simd::loadu<A>(o + c) * V(alpha);
        for (index_t j = 0; j < n_keys; ++j) acc = simd::fma(V(p[j]), simd::loadu<A>(v + j * v_stride + c), acc);
        simd::storeu(o + c, acc);
    }
    for (; c < dim_v; ++c) {
        float acc = o[c] * alpha;
        for (index_t j = 0; j < n_keys; ++j) acc += p[j] * v[j * v_stride + c];
        o[c] = acc;
    }
}

// emit(r, o_row, lse) receives each row's output normalised over keys [ks0, ks1) and its lse.
template <class A, class Emit>
void row_kernel(const attention_problem& p, const row_block& rb, index_t ks0, index_t ks1, Emit&& emit) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t BK = kRowBlockKeys;
    static_assert(BK % 4 == 0 && BK % W == 0, "row block must hold whole vectors");
    const index_t D = p.s.dim, Dv = p.s.dim_v, R = rb.rows();

    std::vector<float> buf(static_cast<std::size_t>(R * (D + Dv)), 0.0f);
    std::vector<index_t> lo(static_cast<std::size_t>(R)), hi(static_cast<std::size_t>(R));
    std::vector<float> m(static_cast<std::size_t>(R), kNegInf), l(static_cast<std::size_t>(R), 0.0f);
    float* qs = buf.data();
    float* o = qs + R * D;

    const mask_params mp = p.mask(rb.b);
    index_t min_lo = ks1, max_hi = ks0;
    for (index_t r = 0; r < R; ++r) {
        const float* qr = p.q.row(rb.b, rb.pos(r), rb.head(r));
        for (index_t d = 0; d < D; ++d) qs[r * D + d] = qr[d] * p.q_scale;
        mp.interval(rb.pos(r) + mp.offset, lo[r], hi[r]);
        lo[r] = std::max(lo[r], ks0);
        hi[r] = std::max(lo[r], std::min(hi[r], ks1));
        if (lo[r] < hi[r]) {
            min_lo = std::min(min_lo, lo[r]);
            max_hi = std::max(max_hi, hi[r]);
        }
    }

    alignas(64) float s[BK];
    const float* k0 = p.k.row(rb.b, 0, rb.hk);
    const float* v0 = p.v.row(rb.b, 0, rb.hk);
    for (index_t j0 = min_lo; j0 < max_hi; j0 += BK) {
        const index_t nk = std::min(BK, max_hi - j0);
        const float* kb = k0 + j0 * p.k.sl;
        for (index_t r = 0; r < R; ++r) {
            if (j0 >= hi[r] || j0 + nk <= lo[r]) continue;
            const float* q = qs + r * D;
            index_t j = 0;
            for (; j + 4 <= nk; j += 4) dot4<A>(q, kb + j * p.k.sl, p.k.sl, D, s + j);
            for (; j < nk; ++j) s[j] = dot1<A>(q, kb + j * p.k.sl, D);
            if (p.tf.softcap > 0.0f) {
                const float inv = 1.0f / p.tf.softcap, cap = p.tf.softcap * simd::kLog2e;
                for (j = 0; j < nk; ++j) s[j] = cap * std::tanh(s[j] * inv);
            }
            for (j = 0; j < nk; ++j)
                if (j0 + j < lo[r] || j0 + j >= hi[r]) s[j] = kNegInf;
            for (j = nk; j < BK; ++j) s[j] = kNegInf;

            V mv(m[r]);
            for (j = 0; j < BK; j += W) mv = simd::max(simd::loadu<A>(s + j), mv);
            const float mx = simd::hmax(mv);
            const float mu = mx == kNegInf ? 0.0f : mx;  // -inf guard, as in online_softmax.hpp
            const float alpha = simd::exp2(simd::scalar_float(m[r] - mu)).v;
            V sum(0.0f);
            for (j = 0; j < BK; j += W) {
                const V e = simd::exp2_nonpositive(simd::loadu<A>(s + j) - V(mu));
                simd::storeu(s + j, e);
                sum += e;
            }
            l[r] = l[r] * alpha + simd::hsum(sum);
            m[r] = mx;
            accumulate_values<A>(o + r * Dv, alpha, s, v0 + j0 * p.v.sl, p.v.sl, nk, Dv);
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
