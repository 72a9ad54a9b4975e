// Row operations of multi-token attention's backward pass (detail/mta/backward.hpp), on dense
// score rows: each array of a work item is [H][rows][row stride] floats, a row holding the keys
// 0 .. of one (head, query) with zero padding on both sides, and "clean": 0 at every key after
// the query's own position up to the work item's clean end. The padding and the clean tail are
// what lets every convolution tap be a plain unaligned load without edge cases.
//
//   conv_rows_range out[j] = sum_{m, a, c} k[m][a][c] in[m][row i + a + row_off][j + c - (c_k - 1) / 2],
//                  for j <= i (0 after): the forward cross-correlation (row_off = -(c_q - 1)) and,
//                  with the kernel flipped, its transpose (row_off = 0: the rows that read row i
//                  are i .. i + c_q - 1, the keys j - hk .. j + hk)
//   conv_grad_rows dk[m][a][c] += sum over dy rows i .. i + 3 of <dy row, in[m][row + a + row_off]
//                  shifted by c - hk>
//   softmax_row, softmax_grad_row
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "attnkit/detail/online_softmax.hpp"
#include "attnkit/detail/tile_traits.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {
namespace mta {

// The source rows of one convolution: in[m] points at key 0 of absolute row `row0` of input
// head m (row stride ls); rows outside [lo, hi) are 0 (before the sequence, or not computed
// because no output needs them).
struct conv_source {
    const float* const* in;
    index_t row0, lo, hi, ls;
    const float* row(index_t m, index_t r) const { return (r < lo || r >= hi) ? nullptr : in[m] + (r - row0) * ls; }
    // The rows of a window of query taps: s[t] = key `key` of absolute row first + t of head m
    // for t < count, null for a row outside the source and for t >= count (up to N).
    template <std::size_t N>
    void window(const float* (&s)[N], index_t m, index_t first, index_t count, index_t key) const {
        for (index_t t = 0; t < index_t(N); ++t) {
            const float* p = t < count ? row(m, first + t) : nullptr;
            s[t] = p ? p + key : nullptr;
        }
    }
};

// Query taps whose weights one pass of conv_rows_block keeps in registers: with the block's
// 2 R accumulators and two source vectors, 8 taps fill 26 of AVX-512's 32 registers and 4 taps
// 14 of AVX2's 16.
template <class A>
constexpr index_t kConvTapWindow = simd::kLanes<A> >= 16 ? 8 : 4;

// Output rows i .. i + R - 1 (out[r]: key 0 of row i + r) of a key-query convolution over the G
// heads of src with kernel k [G][c_q][c_k]; keys past each row and up to clean_end are written
// 0. Register block: R rows x two vectors of keys. A source row s feeds output row i + r through
// query tap a = s - (i + r) - row_off, so each source vector loaded for a key tap c serves every
// output row of the block that reads it. Key taps run outermost: the weights of tap c for a
// window of query taps are broadcast once into registers and serve every source row of the
// block, so a pair of FMAs costs one source load instead of a source load and a broadcast (6
// loads per 8 FMAs in the source-row-major order). The loops over source rows and output rows
// are unrolled, so that the accumulators and the weight of tap a = t - r are registers, not
// arrays indexed at run time, which GCC keeps on the stack (a store and a load around every FMA;
// docs/benchmarks.md, "The convolution's accumulators in registers").
// Each output's sum runs over (m, query-tap window, c, a) in a fixed order: the same bits for
// any thread count.
template <class A, int R>
void conv_rows_block(float* const* out, const conv_source& src, index_t G, const float* k, index_t cq, index_t ck,
                     index_t row_off, index_t i, index_t clean_end) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>, NB = 2 * W, NW = kConvTapWindow<A>;
    const index_t hk = (ck - 1) / 2, last = i + R - 1, n = (last + NB) / NB * NB;
    for (index_t j0 = 0; j0 < n; j0 += NB) {
        V acc[R][2];
        ATTNKIT_UNROLL for (int r = 0; r < R; ++r) acc[r][0] = V(0.0f), acc[r][1] = V(0.0f);
        for (index_t m = 0; m < G; ++m)
            for (index_t a0 = 0; a0 < cq; a0 += NW) {
                const index_t nw = std::min(NW, cq - a0);
                // Source row t of the window (t = 0 .. nw + R - 2) is absolute row i + row_off +
                // a0 + t and feeds output row r through tap a0 + t - r.
                const float* s[NW + R - 1];
                src.window(s, m, i + row_off + a0, nw + R - 1, j0 - hk);
                const float* kw = k + (m * cq + a0) * ck;
                for (index_t c = 0; c < ck; ++c) {
                    V w[NW];
                    ATTNKIT_UNROLL for (index_t a = 0; a < NW; ++a) w[a] = V(a < nw ? kw[a * ck + c] : 0.0f);
                    ATTNKIT_UNROLL for (index_t t = 0; t < NW + R - 1; ++t) {
                        if (!s[t]) continue;
                        V x0 = simd::loadu<A>(s[t] + c), x1 = simd::loadu<A>(s[t] + c + W);
                        // Loaded once for the R rows: left alone GCC 12 folds the load into each of
                        // the FMAs that use it (simd::keep_in_register).
                        simd::keep_in_register(x0);
                        simd::keep_in_register(x1);
                        ATTNKIT_UNROLL for (int r = 0; r < R; ++r) {
                            const index_t a = t - r;
                            if (a < 0 || a >= NW || a >= nw) continue;
                            acc[r][0] = simd::fma(w[a], x0, acc[r][0]);
                            acc[r][1] = simd::fma(w[a], x1, acc[r][1]);
                        }
                    }
                }
            }
        ATTNKIT_UNROLL for (int r = 0; r < R; ++r) {
            const index_t row = i + r;
            if (j0 > row) {
                std::fill(out[r] + j0, out[r] + j0 + NB, 0.0f);
            } else if (j0 + NB <= row + 1) {
                simd::storeu(out[r] + j0, acc[r][0]);
                simd::storeu(out[r] + j0 + W, acc[r][1]);
            } else {
                alignas(64) float t[2 * 64];
                simd::storeu(t, acc[r][0]);
                simd::storeu(t + W, acc[r][1]);
                for (index_t j = j0; j < j0 + NB; ++j) out[r][j] = j <= row ? t[j - j0] : 0.0f;
            }
        }
    }
    for (int r = 0; r < R; ++r) std::fill(out[r] + n, out[r] + clean_end, 0.0f);
}

// Output rows [r0, r1): blocks of four rows, the tail by a smaller block.
template <class A>
void conv_rows_range(float* const* out_of_row, const conv_source& src, index_t G, const float* k, index_t cq,
                     index_t ck, index_t row_off, index_t r0, index_t r1, index_t clean_end) {
    index_t i = r0;
    for (; i + 4 <= r1; i += 4) conv_rows_block<A, 4>(out_of_row + (i - r0), src, G, k, cq, ck, row_off, i, clean_end);
    switch (r1 - i) {
        case 3: conv_rows_block<A, 3>(out_of_row + (i - r0), src, G, k, cq, ck, row_off, i, clean_end); break;
        case 2: conv_rows_block<A, 2>(out_of_row + (i - r0), src, G, k, cq, ck, row_off, i, clean_end); break;
        case 1: conv_rows_block<A, 1>(out_of_row + (i - r0), src, G, k, cq, ck, row_off, i, clean_end); break;
        default: break;
    }
}

// out[a][b] = <ya[a], xb[b]> over n floats, for a block of BH x BG row pairs (the head mixing's
// weight gradient: every dy head against every input head). One accumulator per pair, each
// vector loaded once for the block: BH + BG loads per BH BG FMAs, where a dot per pair loads
// both of its rows (two loads per FMA) and ran load-bound. Both operands go through
// simd::keep_in_register: GCC 12 otherwise folds each load into every FMA that uses it. The
// fixed-count loops are unrolled by pragma: at -O2 GCC 12 left them rolled, with the
// accumulators in memory (three FMA instructions in the function, against sixteen at -O3). The
// order of each pair's sum depends only on n and the arch.
template <class A, int BH, int BG>
ATTNKIT_ALWAYS_INLINE void dots_block(const float* const* ya, const float* const* xb, index_t n, float (&out)[BH][BG]) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    V acc[BH][BG];
    ATTNKIT_UNROLL for (int a = 0; a < BH; ++a)
        ATTNKIT_UNROLL for (int b = 0; b < BG; ++b) acc[a][b] = V(0.0f);
    index_t j = 0;
    for (; j + W <= n; j += W) {
        V x[BG];
        ATTNKIT_UNROLL for (int b = 0; b < BG; ++b) {
            x[b] = simd::loadu<A>(xb[b] + j);
            simd::keep_in_register(x[b]);
        }
        ATTNKIT_UNROLL for (int a = 0; a < BH; ++a) {
            V y = simd::loadu<A>(ya[a] + j);
            simd::keep_in_register(y);
            ATTNKIT_UNROLL for (int b = 0; b < BG; ++b) acc[a][b] = simd::fma(y, x[b], acc[a][b]);
        }
    }
    if (j < n) {
        V x[BG];
        for (int b = 0; b < BG; ++b) x[b] = simd::load_partial<A>(xb[b] + j, n - j);
        for (int a = 0; a < BH; ++a) {
            const V y = simd::load_partial<A>(ya[a] + j, n - j);
            for (int b = 0; b < BG; ++b) acc[a][b] = simd::fma(y, x[b], acc[a][b]);
        }
    }
    for (int a = 0; a < BH; ++a)
        for (int b = 0; b < BG; ++b) out[a][b] = simd::hsum(acc[a][b]);
}

// Rows a block of the kernel gradient takes together (conv_grad_rows): dy rows i .. i + 3.
constexpr index_t kConvGradRows = 4;

// dk[m][a][c] += sum_{r < 4} sum_j dy[r][j] in[m][row i + r + a + row_off][j + c - hk], for the
// four dy rows i .. i + 3 (dy[r]: key 0 of row i + r, 0 after key i + r up to n, a multiple of the
// lane count past the last key of the rows that are not all 0). Source row t (absolute row i +
// row_off + t) pairs with dy row r through query tap a = t - r, so each source vector, loaded once
// per key tap c, serves every dy row of the block that reads it: per vector of keys, 4 dy loads and
// c_q + 3 source loads for 4 c_q FMAs, where a row at a time took a dy load and c_k source loads
// for c_k FMAs (load-bound: the source loads are unaligned, most of them split across cache lines).
// The accumulators are the query taps' (kCq of them; kCq = 0: any c_q, in windows of 8 with
// run-time checks), so that loops over them unroll into registers. Each (a, c) is one float sum
// over the block's rows and keys, added to the double accumulator: its order depends only on the
// block's rows, which do not depend on the thread count.
template <class A, int kCq>
void conv_grad_rows_impl(double* dk, const float* const* dy, const conv_source& src, index_t G, index_t cq,
                         index_t ck, index_t row_off, index_t i, index_t n) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>, R = kConvGradRows, NW = kCq > 0 ? kCq : 8;
    const index_t hk = (ck - 1) / 2;
    for (index_t m = 0; m < G; ++m)
        for (index_t a0 = 0; a0 < cq; a0 += NW) {
            const index_t nw = kCq > 0 ? kCq : std::min(NW, cq - a0);
            const float* s[NW + R - 1];
            src.window(s, m, i + row_off + a0, nw + R - 1, -hk);
            double* d = dk + (m * cq + a0) * ck;
            for (index_t c = 0; c < ck; ++c) {
                V acc[NW];
                ATTNKIT_UNROLL for (index_t a = 0; a < NW; ++a) acc[a] = V(0.0f);
                for (index_t j = 0; j < n; j += W) {
                    V y[R];
                    ATTNKIT_UNROLL for (index_t r = 0; r < R; ++r) {
                        y[r] = simd::loadu<A>(dy[r] + j);
                        simd::keep_in_register(y[r]);
                    }
                    ATTNKIT_UNROLL for (index_t t = 0; t < NW + R - 1; ++t) {
                        if (!s[t]) continue;
                        V x = simd::loadu<A>(s[t] + j + c);
                        simd::keep_in_register(x);
                        ATTNKIT_UNROLL for (index_t r = 0; r < R; ++r) {
                            const index_t a = t - r;
                            if (a < 0 || a >= NW || (kCq == 0 && a >= nw)) continue;
                            acc[a] = simd::fma(y[r], x, acc[a]);
                        }
                    }
                }
                for (index_t a = 0; a < nw; ++a) d[a * ck + c] += static_cast<double>(simd::hsum(acc[a]));
            }
        }
}

template <class A>
void conv_grad_rows(double* dk, const float* const* dy, const conv_source& src, index_t G, index_t cq, index_t ck,
                    index_t row_off, index_t i, index_t n) {
    switch (cq) {  // the paper's 6 and the other small sizes keep their accumulators in registers
        case 1: return conv_grad_rows_impl<A, 1>(dk, dy, src, G, cq, ck, row_off, i, n);
        case 2: return conv_grad_rows_impl<A, 2>(dk, dy, src, G, cq, ck, row_off, i, n);
        case 3: return conv_grad_rows_impl<A, 3>(dk, dy, src, G, cq, ck, row_off, i, n);
        case 4: return conv_grad_rows_impl<A, 4>(dk, dy, src, G, cq, ck, row_off, i, n);
        case 5: return conv_grad_rows_impl<A, 5>(dk, dy, src, G, cq, ck, row_off, i, n);
        case 6: return conv_grad_rows_impl<A, 6>(dk, dy, src, G, cq, ck, row_off, i, n);
        case 7: return conv_grad_rows_impl<A, 7>(dk, dy, src, G, cq, ck, row_off, i, n);
        case 8: return conv_grad_rows_impl<A, 8>(dk, dy, src, G, cq, ck, row_off, i, n);
        default: return conv_grad_rows_impl<A, 0>(dk, dy, src, G, cq, ck, row_off, i, n);
    }
}

// p = softmax of y over keys 0 .. i, 0 after (up to clean_end). y may be p.
template <class A>
void softmax_row(const float* y, float* p, index_t i, index_t clean_end) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const index_t n = i + 1, nv = n / W * W;
    V mv(kNegInf);
    for (index_t j = 0; j < nv; j += W) mv = simd::max(mv, simd::loadu<A>(y + j));
    float mx = nv > 0 ? simd::hmax(mv) : kNegInf;
    for (index_t j = nv; j < n; ++j) mx = std::max(mx, y[j]);
    V sv(0.0f);
    const V m(mx);
    for (index_t j = 0; j < nv; j += W) {
        const V e = simd::exp(simd::loadu<A>(y + j) - m);
        simd::storeu(p + j, e);
        sv = sv + e;
    }
    float sum = simd::hsum(sv);
    for (index_t j = nv; j < n; ++j) {
        p[j] = std::exp(y[j] - mx);
        sum += p[j];
    }
    const V inv(1.0f / sum);
    for (index_t j = 0; j < nv; j += W) simd::storeu(p + j, simd::loadu<A>(p + j) * inv);
    for (index_t j = nv; j < n; ++j) p[j] *= 1.0f / sum;
    std::fill(p + n, p + clean_end, 0.0f);
}

// dy = p (dp - <p, dp>) over keys 0 .. i, 0 after; in place in dp.
template <class A>
void softmax_grad_row(const float* p, float* dp, index_t i, index_t clean_end) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const index_t n = i + 1, nv = n / W * W;
    const float s = simd::dot<A>(p, dp, n);
    const V sv(s);
    for (index_t j = 0; j < nv; j += W) {
        const V pv = simd::loadu<A>(p + j);
        simd::storeu(dp + j, pv * (simd::loadu<A>(dp + j) - sv));
    }
    for (index_t j = nv; j < n; ++j) dp[j] = p[j] * (dp[j] - s);
    std::fill(dp + n, dp + clean_end, 0.0f);
}

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
