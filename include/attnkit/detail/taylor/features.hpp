// The feature map of the linear Taylor form and the chunk step that both the linear kernel
// (linear.hpp) and taylor_state (taylor_state.hpp) run.
//
// Features are products of two entries of the augmented vector x~ = [x, 1] (index D is the
// constant 1): with q~ = [scale q, 1] and k~ = [k, 1], q~·k~ = 1 + s and
//   1 + s + s^2/2 = 1/2 + (q~·k~)^2 / 2 = sum_f phi_q(f) phi_k(f)
// over the pairs f = (a, b), a <= b <= D, with phi_k(f) = k~_a k~_b (no coefficient, so the key
// side, which is summed into the state, needs no multiply) and phi_q(f) = c_f q~_a q~_b:
// c = 1 for a < b (the two symmetric terms of the square, halved) and for the constant pair
// (D, D) (1/2 + 1/2), c = 1/2 for a = b < D. That is (D+1)(D+2)/2 = 1 + D + D(D+1)/2 features,
// the count of docs/variants.md's map, with the linear (a, D) and constant terms in the same table
// as the quadratic ones, so one loop builds them all. The full split (every (a, b) with
// a, b < D, c = 1/2) is kept for the benchmark's comparison.
//
// The chunk step, for one batch item and key/value head, on a state S [F_pad][dvp] (row f holds
// sum_j phi_k(f) v_j^T in columns [0, Dv) and z_f = sum_j phi_k(f) in column Dv):
//   read:   O^T += S^T Phi_Q^T per row panel (values_panel: features are the "keys")
//   update: S += Phi_K^T V, computed per chunk from zero (scores_panel: features are the
//           "keys", tokens the reduction) and then added, so float error grows with the number
//           of chunks, not of tokens.
// F is walked in blocks of kFeatureBlock rows so that a block of S, Phi_K^T and Phi_Q^T stays
// in L2 while every panel and value column tile uses it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnkit/detail/micro_kernels.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/detail/tile_traits.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

enum class feature_split { symmetric, full };

struct feature_table {
    index_t dim = 0;     // D
    index_t count = 0;   // F
    index_t padded = 0;  // F rounded up to whole micro tiles; extra features read the zero row D + 1
    std::vector<std::int32_t> a, b;
    std::vector<float> coef;  // query side

    feature_table() = default;  // no features: a state that never runs the linear form
    feature_table(index_t d, index_t multiple, feature_split split = feature_split::symmetric) : dim(d) {
        auto add = [&](index_t x, index_t y, float c) {
            a.push_back(static_cast<std::int32_t>(x));
            b.push_back(static_cast<std::int32_t>(y));
            coef.push_back(c);
        };
        for (index_t x = 0; x < d; ++x) {
            if (split == feature_split::symmetric) {
                for (index_t y = x; y < d; ++y) add(x, y, x == y ? 0.5f : 1.0f);
            } else {
                for (index_t y = 0; y < d; ++y) add(x, y, 0.5f);
            }
            add(x, d, 1.0f);  // linear term
        }
        add(d, d, 1.0f);  // constant term
        count = static_cast<index_t>(a.size());
        padded = (count + multiple - 1) / multiple * multiple;
        while (static_cast<index_t>(a.size()) < padded) add(d + 1, d + 1, 0.0f);
    }
};

// dst[(f - f0) * n + x] = (coef_f) src[a_f * n + x] * src[b_f * n + x], x < n (a multiple of the
// lane count), from a transposed augmented tile src [D + 2][n]. With w (n floats), also
// dots[f - f0] = sum_x dst[(f - f0) * n + x] w[x], taken while the features are in registers
// (the backward's extra state column, linear_backward.hpp: a second pass would read the block
// back from the L2).
template <class A>
inline void build_features(const float* src, index_t n, const feature_table& ft, index_t f0, index_t f1,
                           bool with_coef, float* dst, const float* w = nullptr, float* dots = nullptr) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    for (index_t f = f0; f < f1; ++f) {
        const float* xa = src + ft.a[static_cast<std::size_t>(f)] * n;
        const float* xb = src + ft.b[static_cast<std::size_t>(f)] * n;
        float* d = dst + (f - f0) * n;
        const V c(with_coef ? ft.coef[static_cast<std::size_t>(f)] : 1.0f);
        if (w) {
            V acc(0.0f);
            for (index_t x = 0; x < n; x += W) {
                const V y = with_coef ? simd::loadu<A>(xa + x) * simd::loadu<A>(xb + x) * c
                                      : simd::loadu<A>(xa + x) * simd::loadu<A>(xb + x);
                simd::storeu(d + x, y);
                acc = simd::fma(y, simd::loadu<A>(w + x), acc);
            }
            dots[f - f0] = simd::hsum(acc);
        } else if (with_coef) {
            for (index_t x = 0; x < n; x += W)
                simd::storeu(d + x, simd::loadu<A>(xa + x) * simd::loadu<A>(xb + x) * c);
        } else {
            for (index_t x = 0; x < n; x += W) simd::storeu(d + x, simd::loadu<A>(xa + x) * simd::loadu<A>(xb + x));
        }
    }
}

// One query row against the state (decode: too few rows to fill a panel's lanes): acc[c] =
// sum_f phi_q(f) S[f][c] for c < dvp, value columns in lanes, S streamed once in groups of
// kRowVectors columns held in registers. qa is the augmented scaled query [D + 2] (q~, 1, 0),
// phi scratch of ft.padded floats. Reads up to W - 1 floats past the end of each S row (the
// state is allocated with that padding); those lanes of acc are never used.
template <class A>
void read_row(const feature_table& ft, const float* S, index_t dvp, const float* qa, float* phi, float* acc) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr int kRowVectors = 4;
    for (index_t f = 0; f < ft.padded; ++f)
        phi[f] = ft.coef[static_cast<std::size_t>(f)] * qa[ft.a[static_cast<std::size_t>(f)]] *
                 qa[ft.b[static_cast<std::size_t>(f)]];
    for (index_t c0 = 0; c0 < dvp; c0 += kRowVectors * W) {
        const int nv = static_cast<int>(std::min<index_t>(kRowVectors, (dvp - c0 + W - 1) / W));
        V a[kRowVectors];
        ATTNKIT_UNROLL for (int x = 0; x < kRowVectors; ++x) a[x] = V(0.0f);
        const float* s = S + c0;
        if (nv == kRowVectors) {
            for (index_t f = 0; f < ft.padded; ++f, s += dvp) {
                const V pf(phi[f]);
                ATTNKIT_UNROLL for (int x = 0; x < kRowVectors; ++x) a[x] = simd::fma(pf, simd::loadu<A>(s + x * W), a[x]);
            }
        } else {
            for (index_t f = 0; f < ft.padded; ++f, s += dvp) {
                const V pf(phi[f]);
                for (int x = 0; x < nv; ++x) a[x] = simd::fma(pf, simd::loadu<A>(s + x * W), a[x]);
            }
        }
        for (int x = 0; x < nv; ++x) simd::storeu(acc + c0 + x * W, a[x]);
    }
}

// Sizes of one chunk step, and its scratch. Kept per thread across calls (scratch_object,
// scratch.hpp): init sizes and zeroes the buffers, allocating only when they grow.
template <class A>
struct chunk_buffers {
    using TT = tile_traits<A>;
    static constexpr index_t RT = TT::kTileRows;
    static constexpr int MR = TT::kMR;
    // A multiple of MR near 256 features: a block of S (256 x 66 floats at Dv = 64) and of
    // Phi_K^T (256 x 64) is ~130 KiB, a quarter of L2.
    static constexpr index_t kFeatureBlock = MR * (256 / MR);

    // Columns of S and of a query's output panel: Dv + 1 (the denominator) rounded up to MR.
    static constexpr index_t padded_dim_v(index_t dv) { return (dv + 1 + MR - 1) / MR * MR; }

    index_t dim = 0, dim_v = 0, dvp = 0, n_vpanels = 0, max_tokens = 0, max_panels = 0;
    std::vector<float> kt, vt, qt, ot, phik, phiq, tmp;

    chunk_buffers() = default;
    chunk_buffers(index_t d, index_t dv, index_t tokens, index_t panels) { init(d, dv, tokens, panels); }
    void init(index_t d, index_t dv, index_t tokens, index_t panels) {
        dim = d, dim_v = dv, dvp = padded_dim_v(dv), n_vpanels = (dv + RT - 1) / RT;
        max_tokens = tokens, max_panels = panels;
        const auto sz = [](index_t n) { return static_cast<std::size_t>(n); };
        kt.assign(sz((d + 2) * tokens), 0.0f);
        vt.assign(sz(n_vpanels * tokens * RT), 0.0f);
        qt.assign(sz(panels * (d + 2) * RT), 0.0f);
        ot.assign(sz(panels * dvp * RT), 0.0f);
        phik.assign(sz(kFeatureBlock * tokens), 0.0f);
        phiq.assign(sz(kFeatureBlock * RT), 0.0f);
        tmp.assign(sz(kFeatureBlock * RT), 0.0f);
    }
    float* q_panel(index_t t) { return qt.data() + t * (dim + 2) * RT; }
    float* o_panel(index_t t) { return ot.data() + t * dvp * RT; }
};

// Packs n valid key/value tokens (rows of the given strides) of a chunk into K~^T [D + 2][ld]
// (row D = 1 and row D + 1 = 0 for real tokens; all zero for padding) and V panels
// [n_vpanels][ld][RT] (zero past Dv and past n), ld = n rounded up to the lane count.
template <class A, class KT, class VT>
inline index_t pack_keys(chunk_buffers<A>& cb, const KT* k, index_t k_stride, const VT* v, index_t v_stride,
                         index_t n, float k_factor = 1.0f) {
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t RT = chunk_buffers<A>::RT;
    const index_t ld = (n + W - 1) / W * W, D = cb.dim, Dv = cb.dim_v;
    std::fill(cb.kt.begin(), cb.kt.begin() + (D + 2) * ld, 0.0f);
    std::fill(cb.vt.begin(), cb.vt.begin() + cb.n_vpanels * ld * RT, 0.0f);
    for (index_t t = 0; t < n; ++t) {
        for (index_t d = 0; d < D; ++d)
            cb.kt[static_cast<std::size_t>(d * ld + t)] = static_cast<float>(k[t * k_stride + d]) * k_factor;
        cb.kt[static_cast<std::size_t>(D * ld + t)] = k_factor;
        for (index_t c = 0; c < Dv; ++c)
            cb.vt[static_cast<std::size_t>((c / RT) * ld * RT + t * RT + c % RT)] = static_cast<float>(v[t * v_stride + c]);
    }
    return ld;
}

// One query row (scaled) as lane r of Q~^T panel t; the caller zeroes the panels first.
//
// q_factor (here) and k_factor (pack_keys), powers of two, scale the augmented rows [q, 1] and
// [k, 1]: every feature is of degree 2 in each, so a query's weights and the state come out
// multiplied by q_factor^2 and k_factor^2 exactly, which keeps them in float for queries and
// keys of magnitudes whose features (q_a q_b, k_a k_b, their products) would not be.
template <class A, class QT>
inline void pack_query(chunk_buffers<A>& cb, index_t r, const QT* q, float scale, float q_factor = 1.0f) {
    constexpr index_t RT = chunk_buffers<A>::RT;
    float* p = cb.q_panel(r / RT) + r % RT;
    pack_q_row(q, cb.dim, scale * q_factor, p, RT);
    p[cb.dim * RT] = q_factor;
}

// The chunk step on state S [padded][dvp]: first O^T += S^T Phi_Q^T for the first n_panels
// query panels (read), then S += Phi_K^T V for the packed keys (update, when ld > 0), feature
// block by feature block (each block is read before it is updated).
template <class A>
void chunk_step(chunk_buffers<A>& cb, const feature_table& ft, float* S, index_t n_panels, index_t ld) {
    using V = simd::vfloat<A>;
    using TT = tile_traits<A>;
    constexpr index_t RT = TT::kTileRows;
    constexpr index_t W = TT::kLanes;
    constexpr index_t FB = chunk_buffers<A>::kFeatureBlock;
    const index_t dvp = cb.dvp, Dv = cb.dim_v;
    V ones[TT::kNR], mx[TT::kNR];
    for (int n = 0; n < TT::kNR; ++n) ones[n] = V(1.0f), mx[n] = V(0.0f);
    for (index_t f0 = 0; f0 < ft.padded; f0 += FB) {
        const index_t f1 = std::min(f0 + FB, ft.padded), nf = f1 - f0;
        float* Sb = S + f0 * dvp;
        for (index_t t = 0; t < n_panels; ++t) {
            build_features<A>(cb.q_panel(t), RT, ft, f0, f1, true, cb.phiq.data());
            values_panel<A>(Sb, dvp, nf, cb.phiq.data(), ones, cb.o_panel(t));
        }
        if (ld == 0) continue;
        build_features<A>(cb.kt.data(), ld, ft, f0, f1, false, cb.phik.data());
        for (index_t p = 0; p < cb.n_vpanels; ++p) {
            scores_panel<A>(cb.phik.data(), nf, cb.vt.data() + p * ld * RT, ld, cb.tmp.data(), mx);
            const index_t c0 = p * RT, nc = std::min(RT, Dv - c0);
            for (index_t f = 0; f < nf; ++f) {
                float* srow = Sb + f * dvp + c0;
                const float* trow = cb.tmp.data() + f * RT;
                for (index_t c = 0; c < nc; ++c) srow[c] += trow[c];
            }
        }
        for (index_t f = 0; f < nf; ++f) {  // z: the feature sums of the chunk, then added
            V acc(0.0f);
            for (index_t x = 0; x < ld; x += W) acc += simd::loadu<A>(cb.phik.data() + f * ld + x);
            Sb[f * dvp + Dv] += simd::hsum(acc);
        }
    }
}

}  // namespace taylor
}  // namespace detail
}  // namespace attnkit
