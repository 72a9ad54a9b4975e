// The quadratic form of Taylor attention for a few query rows against many keys (taylor_state's
// decode steps below its crossover): the softmax row kernel's layout (row_kernel.hpp: head dim
// in lanes, one dot product and one axpy per key, K and V read once front to back, a block of
// 64 keys at a time) with the Taylor weights w = 1 + s + s^2/2 and a running sum in place of the
// online softmax. A tile of the engine would hold one row in kTileRows lanes at decode
// (G = 1): a one-token step at 512 tokens, D = 64, H = 8, 1 thread took 0.455 ms through the
// tile engine, 0.12 ms here (the linear state's read: 0.24 ms).
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/detail/tile_traits.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

// <q, k> over dim floats, head dim in lanes.
template <class A>
inline float row_dot(const float* q, const float* k, index_t dim) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    V a(0.0f);
    index_t d = 0;
    for (; d + W <= dim; d += W) a = simd::fma(simd::loadu<A>(q + d), simd::loadu<A>(k + d), a);
    float tail = 0.0f;
    for (; d < dim; ++d) tail += q[d] * k[d];
    return simd::hsum(a) + tail;
}

// o += w v over dim_v floats.
template <class A>
inline void row_axpy(float* o, float w, const float* v, index_t dim_v) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const V wv(w);
    index_t c = 0;
    for (; c + W <= dim_v; c += W) simd::storeu(o + c, simd::fma(wv, simd::loadu<A>(v + c), simd::loadu<A>(o + c)));
    for (; c < dim_v; ++c) o[c] += w * v[c];
}

// emit(r, o_row) receives each row's normalised output over keys [0, p.s.len_k) (the mask of
// p; a row that sees no key gets zeros). buf is reused scratch. Float K and V.
template <class A, class Emit>
void quadratic_row_kernel(const basic_attention_problem<float, float>& p, const row_block& rb, float eps,
                          std::vector<float>& buf, Emit&& emit) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t BK = kRowBlockKeys;
    const index_t D = p.s.dim, Dv = p.s.dim_v, R = rb.rows(), RH = rb.rows_per_kv_head();
    const index_t Dp = (D + W - 1) / W * W;  // padded query rows: whole-vector loads

    buf.assign(static_cast<std::size_t>(R * (Dp + Dv + BK)), 0.0f);
    std::vector<index_t> lo(static_cast<std::size_t>(R)), hi(static_cast<std::size_t>(R));
    std::vector<float> l(static_cast<std::size_t>(R), 0.0f);
    float* qs = buf.data();
    float* o = qs + R * Dp;
    float* sc = o + R * Dv;  // scores, then weights, of the current block: [R][BK]

    const mask_params mp = p.mask(rb.b);
    index_t min_lo = p.s.len_k, max_hi = 0;
    for (index_t r = 0; r < R; ++r) {
        const float* qr = p.q.row(rb.b, rb.pos(r), rb.head(r));
        for (index_t d = 0; d < D; ++d) qs[r * Dp + d] = qr[d] * p.q_scale;
        row_interval(mp, rb.pos(r), 0, p.s.len_k, lo[r], hi[r]);
        if (lo[r] < hi[r]) {
            min_lo = std::min(min_lo, lo[r]);
            max_hi = std::max(max_hi, hi[r]);
        }
    }

    const float* k0 = p.k.row(rb.b, 0, rb.hk);
    const float* v0 = p.v.row(rb.b, 0, rb.hk);
    const index_t ksl = p.k.sl, ksh = p.k.sh, vsl = p.v.sl, vsh = p.v.sh;
    const V one(1.0f), half(0.5f);
    for (index_t j0 = min_lo; j0 < max_hi; j0 += BK) {
        const index_t nk = std::min(BK, max_hi - j0);
        auto active = [&](index_t r) { return j0 < hi[r] && j0 + nk > lo[r]; };
        for (index_t j = 0; j < nk; ++j)
            for (index_t h = 0; h < rb.n_hk; ++h) {
                const float* kr = k0 + (j0 + j) * ksl + h * ksh;
                for (index_t r = h * RH; r < (h + 1) * RH; ++r)
                    if (active(r)) sc[r * BK + j] = row_dot<A>(qs + r * Dp, kr, D);
            }
        // Weights of the visible keys and their sum (w >= 1/2: nothing to track or rescale).
        for (index_t r = 0; r < R; ++r) {
            if (!active(r)) continue;
            float* s = sc + r * BK;
            const index_t a = std::max(lo[r], j0) - j0, z = std::min(hi[r], j0 + nk) - j0;
            index_t j = a;
            V sum(0.0f);
            for (; j + W <= z; j += W) {
                const V x = simd::loadu<A>(s + j);
                const V w = simd::fma(x, simd::fma(x, half, one), one);
                simd::storeu(s + j, w);
                sum += w;
            }
            float total = simd::hsum(sum);
            for (; j < z; ++j) {
                const float x = s[j];
                s[j] = x * (x * 0.5f + 1.0f) + 1.0f;
                total += s[j];
            }
            l[static_cast<std::size_t>(r)] += total;
        }
        // Values; keys a row does not see are skipped (not weighted by 0: 0 * Inf = NaN).
        for (index_t j = 0; j < nk; ++j) {
            const index_t key = j0 + j;
            for (index_t h = 0; h < rb.n_hk; ++h) {
                const float* vr = v0 + key * vsl + h * vsh;
                for (index_t r = h * RH; r < (h + 1) * RH; ++r)
                    if (key >= lo[r] && key < hi[r]) row_axpy<A>(o + r * Dv, sc[r * BK + j], vr, Dv);
            }
        }
    }
    for (index_t r = 0; r < R; ++r) {
        const float sum = l[static_cast<std::size_t>(r)], inv = sum == 0.0f ? 0.0f : 1.0f / (sum + eps);
        float* orow = o + r * Dv;
        for (index_t c = 0; c < Dv; ++c) orow[c] *= inv;
        emit(r, orow);
    }
}

}  // namespace taylor
}  // namespace detail
}  // namespace attnkit
