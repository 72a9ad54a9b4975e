// SIMD operations on the score tiles of multi-token attention, in the tile engine's layout:
// query rows in lanes, keys in rows.
//
//   panel layout  [panel][key][kTileRows]: what scores_panel writes and values_panel reads
//   wide layout   [key][rs]: all rows of the block contiguous in a key row, so that a query tap of
//                 the convolution is a lane offset (an unaligned load) and a key tap a row offset
//
// The convolution therefore runs its taps in SIMD across queries, with 4 keys per register
// block; both shifts are plain unaligned loads and no data is ever transposed.
#pragma once

#include <algorithm>
#include <limits>

#include "attnkit/detail/online_softmax.hpp"
#include "attnkit/detail/tile_traits.hpp"

namespace attnkit {
namespace detail {
namespace mta {

// Key rows of every tile are padded to a multiple of this: 4 (the convolution's key block) and
// kMR (the micro-kernels' key groups, 6 or 12) both divide it.
constexpr index_t kKeyPad = 12;
inline index_t round_up(index_t n, index_t m) { return (n + m - 1) / m * m; }

// Lane indices 0, 1, 2, ... as floats, to compare row and key indices in lanes (exact < 2^24).
template <class A>
ATTNKIT_ALWAYS_INLINE simd::vfloat<A> iota(float base) {
    alignas(64) static const float k[64] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                            16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                                            32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
                                            48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};
    return simd::loadu<A>(k) + simd::vfloat<A>(base);
}

// One panel of scores st [n][RT] (keys key0.., rows row0..) into a wide tile at column col:
// Mask0, i.e. 0 where key > row.
template <class A>
void scatter_mask0(const float* st, index_t n, index_t key0, index_t row0, float* wide, index_t rs, index_t col) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>, RT = tile_traits<A>::kTileRows;
    for (index_t j = 0; j < n; ++j) {
        const V kf(static_cast<float>(key0 + j));
        for (index_t c = 0; c < RT; c += W) {
            const V rows = iota<A>(static_cast<float>(row0 + c));
            simd::storeu(wide + j * rs + col + c, simd::select(kf > rows, V(0.0f), simd::loadu<A>(st + j * RT + c)));
        }
    }
}

// Key-query convolution (cross-correlation) of G wide input tiles into panel tiles:
//   out[r][jj] = sum_{m, a, c} theta[m][a][c] * in[m][jj + c][r + a]
// where output row r, key jj sit at absolute (row0 + r, key0 + jj) and input row r + a, key
// row jj + c at (row0 + r + a - (c_q - 1), key0 + jj + c - (c_k - 1) / 2). Panels wholly above
// the causal diagonal of a key block are skipped (their entries are masked by every consumer).
// mask0: 0 where key > row. Inputs need round_up(n_keys, 4) + c_k - 1 key rows and
// rs >= n_panels * RT + c_q - 1.
//
// Register block: 4 output keys x one vector of rows. For each query tap a the c_k weights sit
// in registers and each input row vector, loaded once, feeds every output key it reaches
// (input row u serves output t through tap c = u - t): (4 + c_k - 1) loads per 4 c_k FMAs,
// where a tap-by-tap loop would load once per FMA. kCk > 0 is that form for a compile-time
// c_k; kCk = 0 the generic tap-by-tap loop.
template <class A, int kCk>
void conv_panels_impl(const float* const* in, index_t rs, const float* theta, index_t G, index_t cq, index_t ck,
                      index_t n_keys, index_t n_panels, index_t key0, index_t row0, bool mask0, float* out,
                      index_t nkp) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>, RT = tile_traits<A>::kTileRows;
    constexpr int NJ = 4;
    for (index_t jj = 0; jj < n_keys; jj += NJ) {
        // First panel whose last row sees key key0 + jj.
        const index_t need = key0 + jj - row0 - (RT - 1);
        const index_t p0 = need <= 0 ? 0 : (need + RT - 1) / RT;
        for (index_t r = p0 * RT; r < n_panels * RT; r += W) {
            V acc[NJ];
            for (auto& x : acc) x = V(0.0f);
            for (index_t m = 0; m < G; ++m) {
                const float* x = in[m] + jj * rs + r;
                const float* th = theta + m * cq * ck;
                for (index_t a = 0; a < cq; ++a) {
                    if constexpr (kCk > 0) {
                        V w[kCk];
                        for (int c = 0; c < kCk; ++c) w[c] = V(th[a * kCk + c]);
                        const float* xa = x + a;
                        for (int u = 0; u < NJ + kCk - 1; ++u) {
                            const V xv = simd::loadu<A>(xa + u * rs);
                            for (int t = 0; t < NJ; ++t) {
                                const int c = u - t;
                                if (c >= 0 && c < kCk) acc[t] = simd::fma(w[c], xv, acc[t]);
                            }
                        }
                    } else {
                        for (index_t c = 0; c < ck; ++c) {
                            const V w(th[a * ck + c]);
                            const float* xa = x + c * rs + a;
                            for (int t = 0; t < NJ; ++t) acc[t] = simd::fma(w, simd::loadu<A>(xa + t * rs), acc[t]);
                        }
                    }
                }
            }
            float* o = out + (r / RT) * nkp * RT + jj * RT + r % RT;
            const V rows = iota<A>(static_cast<float>(row0 + r));
            for (int t = 0; t < NJ; ++t) {
                if (mask0) acc[t] = simd::select(V(static_cast<float>(key0 + jj + t)) > rows, V(0.0f), acc[t]);
                simd::storeu(o + t * RT, acc[t]);
            }
        }
    }
}

template <class A>
ATTNKIT_NOINLINE void conv_panels(const float* const* in, index_t rs, const float* theta, index_t G, index_t cq,
                                  index_t ck, index_t n_keys, index_t n_panels, index_t key0, index_t row0,
                                  bool mask0, float* out, index_t nkp) {
    switch (ck) {  // the paper's 11 and the small odd sizes get the register-blocked form
        case 1: return conv_panels_impl<A, 1>(in, rs, theta, G, cq, ck, n_keys, n_panels, key0, row0, mask0, out, nkp);
        case 3: return conv_panels_impl<A, 3>(in, rs, theta, G, cq, ck, n_keys, n_panels, key0, row0, mask0, out, nkp);
        case 5: return conv_panels_impl<A, 5>(in, rs, theta, G, cq, ck, n_keys, n_panels, key0, row0, mask0, out, nkp);
        case 7: return conv_panels_impl<A, 7>(in, rs, theta, G, cq, ck, n_keys, n_panels, key0, row0, mask0, out, nkp);
        case 9: return conv_panels_impl<A, 9>(in, rs, theta, G, cq, ck, n_keys, n_panels, key0, row0, mask0, out, nkp);
        case 11: return conv_panels_impl<A, 11>(in, rs, theta, G, cq, ck, n_keys, n_panels, key0, row0, mask0, out, nkp);
        default: return conv_panels_impl<A, 0>(in, rs, theta, G, cq, ck, n_keys, n_panels, key0, row0, mask0, out, nkp);
    }
}

// out[h] = sum_g w[h][g] in[g] elementwise over n floats (n a multiple of 4 W); w dense [H][H].
template <class A>
ATTNKIT_NOINLINE void head_mix(const float* const* in, float* const* out, const float* w, index_t H, index_t n) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr int NP = 4;
    for (index_t h = 0; h < H; h += 2) {
        const bool two = h + 1 < H;
        for (index_t pos = 0; pos < n; pos += NP * W) {
            V a0[NP], a1[NP];
            for (int t = 0; t < NP; ++t) a0[t] = a1[t] = V(0.0f);
            for (index_t g = 0; g < H; ++g) {
                const V w0(w[h * H + g]), w1(two ? w[(h + 1) * H + g] : 0.0f);
                for (int t = 0; t < NP; ++t) {
                    const V x = simd::loadu<A>(in[g] + pos + t * W);
                    a0[t] = simd::fma(w0, x, a0[t]);
                    a1[t] = simd::fma(w1, x, a1[t]);
                }
            }
            for (int t = 0; t < NP; ++t) {
                simd::storeu(out[h] + pos + t * W, a0[t]);
                if (two) simd::storeu(out[h + 1] + pos + t * W, a1[t]);
            }
        }
    }
}

// Online softmax over one panel y [n][RT] of the pre-softmax result (log2 units), keys key0..,
// rows row0..; row r sees keys <= its row. Leaves p = 2^(y - m_new) in y (0 for masked keys),
// updates m, l and sets alpha, the factor for the output accumulated so far.
template <class A>
void online_softmax(float* y, index_t n, index_t key0, index_t row0, float* m, float* l, simd::vfloat<A>* alpha) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>, RT = tile_traits<A>::kTileRows;
    const bool masked = key0 + n - 1 > row0;
    const V neg_inf(kNegInf);
    for (index_t c = 0, v = 0; c < RT; c += W, ++v) {
        float* s = y + c;
        const V m_old = simd::loadu<A>(m + c);
        V mx = m_old;
        if (masked) {
            const V rows = iota<A>(static_cast<float>(row0 + c));
            for (index_t j = 0; j < n; ++j) {
                const V x = simd::select(V(static_cast<float>(key0 + j)) > rows, neg_inf, simd::loadu<A>(s + j * RT));
                simd::storeu(s + j * RT, x);
                mx = simd::max(x, mx);
            }
        } else {
            for (index_t j = 0; j < n; ++j) mx = simd::max(simd::loadu<A>(s + j * RT), mx);
        }
        alpha[v] = online_softmax_update<A>(s, n, m_old, mx, m + c, l + c);
    }
}

// Probabilities of one panel y [n][RT] against final row statistics lse (log2 units, per row of
// the panel): p = 2^(y - lse), 0 where key > row or key < 0. Written to dst with key stride
// ld (in place into the panel: ld = RT; into a wide tile: ld = rs).
template <class A>
void probabilities(const float* y, index_t n, index_t key0, index_t row0, const float* lse, float* dst, index_t ld) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>, RT = tile_traits<A>::kTileRows;
    for (index_t c = 0; c < RT; c += W) {
        const V rows = iota<A>(static_cast<float>(row0 + c)), lv = simd::loadu<A>(lse + c);
        for (index_t j = 0; j < n; ++j) {
            const float kj = static_cast<float>(key0 + j);
            const V x = simd::min(V(0.0f), simd::loadu<A>(y + j * RT + c) - lv);  // <= 0 up to rounding
            const V p = simd::exp2_nonpositive(x);
            const bool any_key = key0 + j >= 0;
            simd::storeu(dst + j * ld + c, any_key ? simd::select(V(kj) > rows, V(0.0f), p) : V(0.0f));
        }
    }
}

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
