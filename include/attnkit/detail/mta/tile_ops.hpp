// SIMD operations on the score tiles of multi-token attention, in the tile engine's layout:
// query rows in lanes, keys in rows.
//
//   panel layout  [panel][key][kTileRows]: what scores_panel writes and values_panel reads
//   wide layout   [key][rs]: all rows of the block contiguous in a key row, so that a query tap of
//                 the convolution is a lane offset (an unaligned load) and a key tap a row offset
//
// The convolution therefore runs its taps in SIMD across queries, with kConvKeys keys x kNR row
// vectors per register block; both shifts are plain unaligned loads and no data is ever
// transposed.
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "attnkit/detail/online_softmax.hpp"
#include "attnkit/detail/tile_traits.hpp"

namespace attnkit {
namespace detail {
namespace mta {

// Key rows of every tile are padded to a multiple of this: kMR (the micro-kernels' key groups and
// the convolution's key block, 6 or 12) divides it.
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

// Output keys per register block of the convolution: the micro-kernels' kMR (6 with 16
// registers, 12 with 32), so that kMR x kNR accumulators hide the FMA latency exactly as in the
// score and value products.
template <class A>
constexpr index_t kConvKeys = tile_traits<A>::kMR;

// The weights of one (output head, input head m, query tap a) in the order conv_panels_impl
// consumes them: [u][t] for input key row u < kConvKeys + c_k - 1 and output key t < kConvKeys,
// theta[a][u - t] inside the band and 0 outside (never read). Every broadcast then has its own
// address, like the elements of a packed GEMM panel: the compiler cannot keep all c_k taps live
// across the unrolled block (16 registers hold the accumulators) and reloads each from L1, where
// a shared address would be hoisted into registers and spilled.
template <class A>
std::vector<float> pack_conv_weights(const std::vector<float>& theta, index_t n_taps, index_t ck) {
    constexpr index_t NJ = kConvKeys<A>;
    const index_t nu = NJ + ck - 1;
    std::vector<float> pk(static_cast<std::size_t>(n_taps * nu * NJ), 0.0f);
    for (index_t s = 0; s < n_taps; ++s)
        for (index_t u = 0; u < nu; ++u)
            for (index_t t = 0; t < NJ; ++t)
                if (u - t >= 0 && u - t < ck)
                    pk[static_cast<std::size_t>((s * nu + u) * NJ + t)] = theta[static_cast<std::size_t>(s * ck + u - t)];
    return pk;
}

// Key-query convolution (cross-correlation) of G wide input tiles into panel tiles:
//   out[r][jj] = sum_{m, a, c} theta[m][a][c] * in[m][jj + c][r + a]
// where output row r, key jj sit at absolute (row0 + r, key0 + jj) and input row r + a, key
// row jj + c at (row0 + r + a - (c_q - 1), key0 + jj + c - (c_k - 1) / 2). Register blocks
// (panel x kConvKeys keys) wholly above the causal diagonal are skipped (their entries are
// masked by every consumer). mask0: 0 where key > row. Inputs need
// round_up(n_keys, kConvKeys) + c_k - 1 key rows and rs >= n_panels * RT + c_q - 1; the input
// tiles are padded with zeros (the Mask0 value) outside the valid keys and rows, so the loop
// has no edge cases.
//
// Register block: kConvKeys output keys x the panel's kNR row vectors, i.e. the micro-kernels'
// tile: the convolution along keys is a banded (Toeplitz) matrix product, out = X T_a summed
// over taps a, with input key rows as the GEMM's inner dimension. For each query tap a, each
// input row u (loaded once, kNR vectors) feeds every output key t it reaches through tap
// c = u - t, with the weight broadcast from the packed panel: per (kConvKeys + c_k - 1) kNR
// loads, kConvKeys c_k broadcasts and kConvKeys c_k kNR FMAs on kConvKeys kNR independent
// accumulators. kCk > 0 is that form for a compile-time c_k (packed = pack_conv_weights);
// kCk = 0 the generic tap-by-tap loop on theta.
template <class A, int kCk>
void conv_panels_impl(const float* const* in, index_t rs, const float* theta, const float* packed, index_t G,
                      index_t cq, index_t ck, index_t n_keys, index_t n_panels, index_t key0, index_t row0, bool mask0,
                      float* out, index_t nkp) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>, RT = tile_traits<A>::kTileRows;
    constexpr int NV = tile_traits<A>::kNR, NJ = static_cast<int>(kConvKeys<A>);
    constexpr int NU = NJ + kCk - 1;
    for (index_t jj = 0; jj < n_keys; jj += NJ) {
        // First panel whose last row sees key key0 + jj.
        const index_t need = key0 + jj - row0 - (RT - 1);
        const index_t p0 = need <= 0 ? 0 : (need + RT - 1) / RT;
        for (index_t pnl = p0; pnl < n_panels; ++pnl) {
            V acc[NJ][NV];
            for (auto& row : acc)
                for (auto& x : row) x = V(0.0f);
            for (index_t m = 0; m < G; ++m)
                for (index_t a = 0; a < cq; ++a) {
                    const float* x = in[m] + jj * rs + pnl * RT + a;
                    if constexpr (kCk > 0) {
                        const float* w = packed + (m * cq + a) * NU * NJ;
#pragma GCC unroll 32
                        for (int u = 0; u < NU; ++u) {
                            V xv[NV];
                            for (int v = 0; v < NV; ++v) xv[v] = simd::loadu<A>(x + u * rs + v * W);
#pragma GCC unroll 16
                            for (int t = 0; t < NJ; ++t) {
                                const int c = u - t;
                                if (c < 0 || c >= kCk) continue;
                                const V wb(w[u * NJ + t]);
                                for (int v = 0; v < NV; ++v) acc[t][v] = simd::fma(wb, xv[v], acc[t][v]);
                            }
                        }
                    } else {
                        const float* th = theta + (m * cq + a) * ck;
                        for (index_t c = 0; c < ck; ++c) {
                            const V wb(th[c]);
                            for (int t = 0; t < NJ; ++t)
                                for (int v = 0; v < NV; ++v)
                                    acc[t][v] = simd::fma(wb, simd::loadu<A>(x + (t + c) * rs + v * W), acc[t][v]);
                        }
                    }
                }
            float* o = out + pnl * nkp * RT + jj * RT;
            for (int v = 0; v < NV; ++v) {
                const V rows = iota<A>(static_cast<float>(row0 + pnl * RT + v * W));
                for (int t = 0; t < NJ; ++t) {
                    V y = acc[t][v];
                    if (mask0) y = simd::select(V(static_cast<float>(key0 + jj + t)) > rows, V(0.0f), y);
                    simd::storeu(o + t * RT + v * W, y);
                }
            }
        }
    }
}

template <class A>
ATTNKIT_NOINLINE void conv_panels(const float* const* in, index_t rs, const float* theta, const float* packed,
                                  index_t G, index_t cq, index_t ck, index_t n_keys, index_t n_panels, index_t key0,
                                  index_t row0, bool mask0, float* out, index_t nkp) {
#define ATTNKIT_MTA_CONV_CASE(n) \
    case n: return conv_panels_impl<A, n>(in, rs, theta, packed, G, cq, ck, n_keys, n_panels, key0, row0, mask0, out, nkp)
    switch (ck) {  // the paper's 11 and the small odd sizes get the register-blocked form
        ATTNKIT_MTA_CONV_CASE(1);
        ATTNKIT_MTA_CONV_CASE(3);
        ATTNKIT_MTA_CONV_CASE(5);
        ATTNKIT_MTA_CONV_CASE(7);
        ATTNKIT_MTA_CONV_CASE(9);
        ATTNKIT_MTA_CONV_CASE(11);
        default: return conv_panels_impl<A, 0>(in, rs, theta, packed, G, cq, ck, n_keys, n_panels, key0, row0, mask0, out, nkp);
    }
#undef ATTNKIT_MTA_CONV_CASE
}

// Head mixing, out[h] = sum_g w[h][g] in[g] elementwise; w dense [H][H]. Register block: NH
// output heads x kNR vectors (the micro-kernels' kMR x kNR tile: per input head kNR loads, NH
// broadcasts, NH kNR FMAs), the positions outermost, so that the H input vectors of a position
// block (H kTileRows floats) stay in L1 while every block of output heads reads them.
template <class A, int NH>
ATTNKIT_ALWAYS_INLINE void head_mix_block(const float* const* in, float* const* out, const float* w, index_t H,
                                          index_t h0, index_t pos) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr int NV = tile_traits<A>::kNR;
    V acc[NH][NV];
    for (auto& row : acc)
        for (auto& x : row) x = V(0.0f);
    for (index_t g = 0; g < H; ++g) {
        V x[NV];
        for (int v = 0; v < NV; ++v) x[v] = simd::loadu<A>(in[g] + pos + v * W);
        for (int i = 0; i < NH; ++i) {
            const V wb(w[(h0 + i) * H + g]);
            for (int v = 0; v < NV; ++v) acc[i][v] = simd::fma(wb, x[v], acc[i][v]);
        }
    }
    for (int i = 0; i < NH; ++i)
        for (int v = 0; v < NV; ++v) simd::storeu(out[h0 + i] + pos + v * W, acc[i][v]);
}

template <class A, int NH>
ATTNKIT_ALWAYS_INLINE void head_mix_tail(const float* const* in, float* const* out, const float* w, index_t H,
                                         index_t h0, index_t nh, index_t pos) {
    if constexpr (NH > 0) {
        if (nh == NH) return head_mix_block<A, NH>(in, out, w, H, h0, pos);
        head_mix_tail<A, NH - 1>(in, out, w, H, h0, nh, pos);
    }
}

// n: floats per head, a multiple of kTileRows.
template <class A>
ATTNKIT_NOINLINE void head_mix(const float* const* in, float* const* out, const float* w, index_t H, index_t n) {
    constexpr int NH = tile_traits<A>::kMR;
    constexpr index_t RT = tile_traits<A>::kTileRows;
    for (index_t pos = 0; pos < n; pos += RT) {
        index_t h0 = 0;
        for (; h0 + NH <= H; h0 += NH) head_mix_block<A, NH>(in, out, w, H, h0, pos);
        if (h0 < H) head_mix_tail<A, NH - 1>(in, out, w, H, h0, H - h0, pos);
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
