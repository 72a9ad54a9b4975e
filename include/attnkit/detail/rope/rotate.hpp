// The two pieces of model::rope: the cos / sin table of a set of positions, and the rotation of
// one head's rotary part by one table row, vectorised over the pairs.
//
// Table rows are float, laid out for the form's vector loop so that neither form shuffles a
// table: rotate-half reads cos[c], sin[c] next to x[c] and x[c + R/2] (row = cos[R/2], sin[R/2]);
// interleaved reads them next to x[i] (row = C[R], S[R] with C[2c] = C[2c+1] = cos_c,
// S[2c] = -sin_c, S[2c+1] = sin_c) and needs only the pair swap of x:
//
//   rotate-half   y[c]         = fma(x[c], cos_c, -(x[c + R/2] sin_c))
//                 y[c + R/2]   = fma(x[c + R/2], cos_c, x[c] sin_c)
//   interleaved   y[i]         = fma(x[i], C[i], x[i ^ 1] S[i])
//
// so that both forms compute each output with the same two roundings (one product, one fma):
// the interleaved result of x is exactly the rotate-half result of x with its pairs regrouped.
// With kInverse (model::rope_backward) the sine term changes sign, which rotates by -angle: the
// transpose of the rotation, from the same table and with the same roundings (a negation is
// exact), i.e. the forward with every sine of the table negated, bit for bit.
// An entry is a function of (position, c) and the options alone: the angle p f_c in double,
// its cos and sin by simd::sincos over the row's R/2 angles (phase reduced in double, float
// result), times the attention factor, so any grouping of positions into calls, threads or
// tables gives the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnkit/config.hpp"
#include "attnkit/simd/convert.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {
namespace rope {

// Floats per table row: R (rotate-half) or 2R (interleaved).
inline index_t table_row_floats(bool interleaved, index_t R) { return interleaved ? 2 * R : R; }

// One row for position p (freq: R/2 frequencies, in double; a: R/2 doubles, sn, cs: R/2 floats
// of scratch). The angles of one row go to simd::sincos together, in blocks from c = 0 whatever
// the call.
template <class A>
inline void table_row(std::int64_t p, const std::vector<double>& freq, float attention, bool interleaved, float* row,
                      double* a, float* sn, float* cs) {
    const index_t half = static_cast<index_t>(freq.size());
    const double pd = static_cast<double>(p);
    for (index_t c = 0; c < half; ++c) a[c] = pd * freq[static_cast<std::size_t>(c)];
    if (!interleaved) {  // the row is [cos | sin]: straight from sincos
        simd::sincos<A>(a, row + half, row, half);
        if (attention != 1.0f)
            for (index_t c = 0; c < 2 * half; ++c) row[c] *= attention;
        return;
    }
    simd::sincos<A>(a, sn, cs, half);
    for (index_t c = 0; c < half; ++c) {
        const float co = cs[c] * attention, si = sn[c] * attention;
        row[2 * c] = row[2 * c + 1] = co;
        row[2 * half + 2 * c] = -si;
        row[2 * half + 2 * c + 1] = si;
    }
}

// Rows for positions[0, n), row k at table + k * table_row_floats, on the pool (rows are
// independent: any split gives the same table).
template <class A>
inline void build_table(const std::int64_t* positions, index_t n, const std::vector<double>& freq, double attention,
                        bool interleaved, float* table, thread_pool* pool) {
    const index_t half = static_cast<index_t>(freq.size());
    const index_t stride = table_row_floats(interleaved, 2 * half);
    // About 4K angles per chunk: enough to amortise a task, small enough to share.
    const index_t grain = std::max<index_t>(1, 4096 / std::max<index_t>(1, half));
    parallel_for(pool, 0, n, grain, [&](std::int64_t k0, std::int64_t k1) {
        std::vector<double> a(static_cast<std::size_t>(half));
        std::vector<float> sc(static_cast<std::size_t>(2 * half));
        for (std::int64_t k = k0; k < k1; ++k)
            table_row<A>(positions[k], freq, static_cast<float>(attention), interleaved, table + k * stride, a.data(),
                         sc.data(), sc.data() + half);
    });
}

// -p when kNegate, else p: the sign of a rotation's sine term (0 - p, as the forward has always
// computed it).
template <bool kNegate, class V>
ATTNKIT_ALWAYS_INLINE V negate_if(const V& p) noexcept {
    if constexpr (kNegate) {
        return V(0.0f) - p;
    } else {
        return p;
    }
}

// Rotate-half of x[0, R) of one head into y[0, R) (x == y: in place; x may be float or y's
// type, y float or 16-bit): W pairs per step; the last R/2 mod W pairs through the same vector
// code on padded copies, so that every element gets the same arithmetic wherever it falls (the
// vector fma is two roundings on targets without FMA, std::fma would be one). A 16-bit y is
// rounded once, after the rotation in float, whether x is float or y's own type.
template <class A, bool kInverse = false, class S, class T>
ATTNKIT_ALWAYS_INLINE void rotate_half_step(const S* x1p, const S* x2p, T* y1p, T* y2p, const float* cs,
                                            const float* sn) noexcept {
    using V = simd::vfloat<A>;
    const V x1 = simd::load_float<A>(x1p), x2 = simd::load_float<A>(x2p);
    const V c = simd::loadu<A>(cs), s = simd::loadu<A>(sn);
    const V y1 = simd::fma(x1, c, negate_if<!kInverse>(x2 * s));
    const V y2 = simd::fma(x2, c, negate_if<kInverse>(x1 * s));
    simd::store_float<A>(y1p, y1);
    simd::store_float<A>(y2p, y2);
}

template <class A, bool kInverse = false, class S, class T>
ATTNKIT_ALWAYS_INLINE void rotate_half_head(const S* x, T* y, const float* row, index_t R) noexcept {
    constexpr index_t W = simd::kLanes<A>;
    const index_t half = R / 2;
    const float* cs = row;
    const float* sn = row + half;
    index_t c = 0;
    for (; c + W <= half; c += W) rotate_half_step<A, kInverse>(x + c, x + half + c, y + c, y + half + c, cs + c, sn + c);
    if (c < half) {
        const index_t n = half - c;
        S a1[W], a2[W];
        T b1[W], b2[W];
        float bc[W] = {}, bs[W] = {};
        for (index_t i = 0; i < W; ++i) a1[i] = a2[i] = S(0.0f);
        for (index_t i = 0; i < n; ++i) a1[i] = x[c + i], a2[i] = x[half + c + i], bc[i] = cs[c + i], bs[i] = sn[c + i];
        rotate_half_step<A, kInverse>(a1, a2, b1, b2, bc, bs);
        for (index_t i = 0; i < n; ++i) y[c + i] = b1[i], y[half + c + i] = b2[i];
    }
}

template <class A, bool kInverse = false, class S, class T>
ATTNKIT_ALWAYS_INLINE void interleaved_step(const S* x, T* y, const float* co, const float* si) noexcept {
    using V = simd::vfloat<A>;
    const V v = simd::load_float<A>(x);
    const V p = simd::swap_pairs(v) * simd::loadu<A>(si);
    simd::store_float<A>(y, simd::fma(v, simd::loadu<A>(co), negate_if<kInverse>(p)));
}

// Interleaved of x[0, R) into y[0, R): W elements (W/2 pairs) per step, the last R mod W (even:
// pairs never split) on padded copies as above. One lane (simd::scalar_arch) has no pair to
// swap: pairs of scalars, with the same fma.
template <class A, bool kInverse = false, class S, class T>
ATTNKIT_ALWAYS_INLINE void interleaved_head(const S* x, T* y, const float* row, index_t R) noexcept {
    constexpr index_t W = simd::kLanes<A>;
    const float* C = row;
    const float* Sn = row + R;
    if constexpr (W >= 2) {
        index_t i = 0;
        for (; i + W <= R; i += W) interleaved_step<A, kInverse>(x + i, y + i, C + i, Sn + i);
        if (i < R) {
            const index_t n = R - i;
            S a[W];
            T b[W];
            float bc[W] = {}, bs[W] = {};
            for (index_t k = 0; k < W; ++k) a[k] = S(0.0f);
            for (index_t k = 0; k < n; ++k) a[k] = x[i + k], bc[k] = C[i + k], bs[k] = Sn[i + k];
            interleaved_step<A, kInverse>(a, b, bc, bs);
            for (index_t k = 0; k < n; ++k) y[i + k] = b[k];
        }
    } else {
        using V = simd::scalar_float;
        for (index_t i = 0; i < R; i += 2) {
            const V x0 = simd::to_float(x[i]), x1 = simd::to_float(x[i + 1]);
            simd::store_float<A>(y + i, simd::fma(x0, V(C[i]), negate_if<kInverse>(x1 * V(Sn[i]))));
            simd::store_float<A>(y + i + 1, simd::fma(x1, V(C[i + 1]), negate_if<kInverse>(x0 * V(Sn[i + 1]))));
        }
    }
}

// One head: the form's rotation of x[0, R) into y[0, R) by a table row, and x[R, D) (the part
// past a partial rotary dim) copied through, converted to y's type.
template <class A, bool kInverse = false, class S, class T>
ATTNKIT_ALWAYS_INLINE void rope_head(const S* x, T* y, const float* row, index_t R, index_t D, bool interleaved) noexcept {
    if (interleaved)
        interleaved_head<A, kInverse>(x, y, row, R);
    else
        rotate_half_head<A, kInverse>(x, y, row, R);
    if (static_cast<const void*>(x) == static_cast<const void*>(y)) return;
    for (index_t c = R; c < D; ++c) y[c] = T(simd::to_float(x[c]));
}

}  // namespace rope
}  // namespace detail
}  // namespace attnkit
