// The packed GEMM on one thread: the five blocking loops of gemm/blocking.hpp around the
// engine's register tile.
//
// The tile is micro_kernels.hpp's tile_product, the register loop of the attention kernels'
// scores_tile (S^T = K Q^T is a GEMM of a packed kMR x kc A panel and a packed kc x kNR B
// panel). A full tile is added to C from the registers; only edge tiles pass through a small L1
// buffer, which lets every edge tile run the same full-size kernel with a partial store. (Every
// tile through the buffer cost 2 x kMR x kNR / W extra loads and stores against kc x kMR x
// kNR / W FMAs, within the noise of docs/benchmarks.md's measurements.)
//
// Products of at most kMR rows (decode steps) skip the packing: gemm_one_row and gemm_few_rows
// read B in place, with the same FMA chains, so a row's bits do not depend on the path.
#pragma once

#include <algorithm>
#include <type_traits>

#include "attnkit/detail/gemm/blocking.hpp"
#include "attnkit/detail/gemm/pack.hpp"
#include "attnkit/detail/micro_kernels.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {

// C[0 .. mr, 0 .. nr) (= or +=) one register tile of packed A and B over kc. A full tile goes
// from the registers into C; an edge tile goes through a small L1 buffer and a partial store, so
// every tile runs the same full-size kernel.
template <class A>
ATTNKIT_ALWAYS_INLINE void gemm_tile(const float* ap, const float* bp, index_t kc, float* c, index_t ldc,
                                     index_t mr, index_t nr, bool overwrite) {
    using V = simd::vfloat<A>;
    constexpr index_t MR = gemm_traits<A>::kMR, NR = gemm_traits<A>::kNR, W = simd::kLanes<A>;
    constexpr int kVecs = static_cast<int>(NR / W);
    // The tile's rows of C are read (or written) last; their lines arrive while the FMAs run.
    for (index_t m = 0; m < mr; ++m)
        for (index_t j = 0; j < nr; j += 64 / static_cast<index_t>(sizeof(float))) ATTNKIT_PREFETCH(c + m * ldc + j);
    V acc[MR][kVecs];
    tile_product<A>(ap, kc, bp, kc, acc);
    if (mr == MR && nr == NR) {
        ATTNKIT_UNROLL for (index_t m = 0; m < MR; ++m)
            ATTNKIT_UNROLL for (int n = 0; n < kVecs; ++n) {
                float* p = c + m * ldc + n * W;
                simd::storeu(p, overwrite ? acc[m][n] : simd::loadu<A>(p) + acc[m][n]);
            }
        return;
    }
    alignas(64) float buf[MR * NR];
    ATTNKIT_UNROLL for (index_t m = 0; m < MR; ++m)
        ATTNKIT_UNROLL for (int n = 0; n < kVecs; ++n) simd::storeu(buf + m * NR + n * W, acc[m][n]);
    for (index_t m = 0; m < mr; ++m)
        for (index_t j = 0; j < nr; ++j) {
            float& x = c[m * ldc + j];
            x = overwrite ? buf[m * NR + j] : x + buf[m * NR + j];
        }
}

// All tiles of a packed mc x kc A block against a packed kc x nc B block: B micro-panels outer
// (one stays in the L1 while every A micro-panel of the block streams past it from the L2).
template <class A>
ATTNKIT_NOINLINE void gemm_macro(const float* ap, const float* bp, index_t mc, index_t nc, index_t kc, float* c,
                                 index_t ldc, bool overwrite) {
    constexpr index_t MR = gemm_traits<A>::kMR, NR = gemm_traits<A>::kNR;
    for (index_t j = 0; j < nc; j += NR) {
        const index_t nr = nc - j < NR ? nc - j : NR;
        const float* b_panel = bp + j * kc;
        for (index_t i = 0; i < mc; i += MR)
            gemm_tile<A>(ap + i * kc, b_panel, kc, c + i * ldc + j, ldc, mc - i < MR ? mc - i : MR, nr, overwrite);
    }
}

// Few rows (a decode step: M <= kMR): packing B would copy every weight to use it once, and a
// full-height tile would spend kMR - M of every kMR FMAs on padding. R rows of accumulators read
// B where it lies instead, kV vectors of columns at a time, each element of B loaded once. kV
// grows as R shrinks so that about a tile's worth of independent FMA chains hide the FMA latency
// (one row against two vectors would wait on it every step). The FMA chain of an element is the
// packed tile's (k ascending in the same K pieces, pieces added to C in order), so a row gives
// the same bits on either path.
constexpr index_t kFewRowsAhead = 16;

template <class A, int R, int kV>
ATTNKIT_ALWAYS_INLINE void gemm_few_rows_panel(const float* a, index_t lda, const float* b, index_t ldb, float* c,
                                               index_t ldc, index_t nr, index_t kc, bool overwrite) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    V acc[R][kV];
    ATTNKIT_UNROLL for (int m = 0; m < R; ++m)
        ATTNKIT_UNROLL for (int n = 0; n < kV; ++n) acc[m][n] = V(0.0f);
    if (nr == kV * W) {
        for (index_t d = 0; d < kc; ++d) {
            // Rows of B are ldb apart: fetch the lines a few rows ahead (inside the piece), one
            // prefetch per 64 bytes.
            const float* ahead = b + (d + kFewRowsAhead < kc ? d + kFewRowsAhead : kc - 1) * ldb;
            ATTNKIT_UNROLL for (int n = 0; n < kV; ++n) {
                if ((n * W * sizeof(float)) % 64 == 0) ATTNKIT_PREFETCH(ahead + n * W);
                const V bv = simd::loadu<A>(b + d * ldb + n * W);
                ATTNKIT_UNROLL for (int m = 0; m < R; ++m) acc[m][n] = simd::fma(V(a[m * lda + d]), bv, acc[m][n]);
            }
        }
    } else {  // the last columns: never read past the end of a row of B
        for (index_t d = 0; d < kc; ++d)
            ATTNKIT_UNROLL for (int n = 0; n < kV; ++n) {
                const index_t left = nr - n * W;
                if (left <= 0) break;
                V bv;
                if (left >= W) {
                    bv = simd::loadu<A>(b + d * ldb + n * W);
                } else {
                    alignas(64) float t[W] = {};
                    for (index_t x = 0; x < left && x < W; ++x) t[x] = b[d * ldb + n * W + x];
                    bv = simd::loadu<A>(t);
                }
                ATTNKIT_UNROLL for (int m = 0; m < R; ++m) acc[m][n] = simd::fma(V(a[m * lda + d]), bv, acc[m][n]);
            }
    }
    alignas(64) float out[R * kV * W];
    ATTNKIT_UNROLL for (int m = 0; m < R; ++m)
        ATTNKIT_UNROLL for (int n = 0; n < kV; ++n) simd::storeu(out + (m * kV + n) * W, acc[m][n]);
    ATTNKIT_UNROLL for (int m = 0; m < R; ++m)
        for (index_t x = 0; x < nr; ++x) {
            float& y = c[m * ldc + x];
            y = overwrite ? out[m * kV * W + x] : y + out[m * kV * W + x];
        }
}

template <class A, int R>
ATTNKIT_NOINLINE void gemm_few_rows(const float* a, index_t lda, const float* b, index_t ldb, float* c,
                                    index_t ldc, index_t N, index_t K, index_t kc_max, bool add) {
    constexpr index_t W = simd::kLanes<A>;
    constexpr int kTile = static_cast<int>(gemm_traits<A>::kMR * gemm_traits<A>::kNR / W);  // 12 or 24
    constexpr int kNarrow = static_cast<int>(gemm_traits<A>::kNR / W);
    constexpr int kWide = kTile / R > 12 ? 12 : (kTile / R < kNarrow ? kNarrow : kTile / R);
    index_t j = 0;
    auto columns = [&](auto vecs) {
        constexpr int kV = decltype(vecs)::value;
        for (; j < N && (kV == kNarrow || N - j >= kV * W); j += kV * W) {
            const index_t nr = N - j < kV * W ? N - j : kV * W;
            for (index_t pc = 0; pc < K; pc += kc_max)
                gemm_few_rows_panel<A, R, kV>(a + pc, lda, b + pc * ldb + j, ldb, c + j, ldc, nr,
                                              K - pc < kc_max ? K - pc : kc_max, pc == 0 && !add);
        }
    };
    // Full panels as wide as possible, then narrower ones for what is left (256 columns on
    // AVX2 are 2 x 96 + 48 + 16), the last of 2 vectors, perhaps partial.
    constexpr int kHalf = kWide / 2 > kNarrow ? kWide / 2 : kNarrow;
    constexpr int kQuarter = kWide / 4 > kNarrow ? kWide / 4 : kNarrow;
    columns(std::integral_constant<int, kWide>{});
    if constexpr (kHalf < kWide) columns(std::integral_constant<int, kHalf>{});
    if constexpr (kQuarter < kHalf) columns(std::integral_constant<int, kQuarter>{});
    columns(std::integral_constant<int, kNarrow>{});
}

// One row (a decode step's GEMV): the same chains as an axpy over the rows of B into a row of
// accumulators in the L1, four rows of B per pass. Each row of B is then read front to back (the
// order hardware prefetchers follow; a column panel would jump ldb floats every 400 bytes), and
// a vector of accumulators is loaded and stored once per four FMAs.
template <class A>
ATTNKIT_NOINLINE void gemm_one_row(const float* a, const float* b, index_t ldb, float* c, index_t N, index_t K,
                                   index_t kc_max, bool add) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const index_t full = N / W * W, rest = N - full;
    float* acc = gemm_scratch::aligned(thread_gemm_scratch().a, full + W);
    // The last N % W columns of a row of B as a zero-padded vector (never read past the row).
    auto tail = [&](const float* row) {
        alignas(64) float t[W] = {};
        for (index_t x = 0; x < rest && x < W; ++x) t[x] = row[full + x];
        return simd::loadu<A>(t);
    };
    for (index_t pc = 0; pc < K; pc += kc_max) {
        const index_t kc = K - pc < kc_max ? K - pc : kc_max;
        std::fill_n(acc, full + W, 0.0f);
        index_t d = 0;
        for (; d + 4 <= kc; d += 4) {
            const float* r = b + (pc + d) * ldb;
            const V a0(a[pc + d]), a1(a[pc + d + 1]), a2(a[pc + d + 2]), a3(a[pc + d + 3]);
            for (index_t j = 0; j < full; j += W) {
                V x = simd::fma(a0, simd::loadu<A>(r + j), simd::loadu<A>(acc + j));
                x = simd::fma(a1, simd::loadu<A>(r + ldb + j), x);
                x = simd::fma(a2, simd::loadu<A>(r + 2 * ldb + j), x);
                simd::storeu(acc + j, simd::fma(a3, simd::loadu<A>(r + 3 * ldb + j), x));
            }
            if (rest) {
                V x = simd::loadu<A>(acc + full);
                for (index_t e = 0; e < 4; ++e) x = simd::fma(V(a[pc + d + e]), tail(r + e * ldb), x);
                simd::storeu(acc + full, x);
            }
        }
        for (; d < kc; ++d) {
            const float* r = b + (pc + d) * ldb;
            const V a0(a[pc + d]);
            for (index_t j = 0; j < full; j += W)
                simd::storeu(acc + j, simd::fma(a0, simd::loadu<A>(r + j), simd::loadu<A>(acc + j)));
            if (rest) simd::storeu(acc + full, simd::fma(a0, tail(r), simd::loadu<A>(acc + full)));
        }
        const bool overwrite = pc == 0 && !add;
        for (index_t j = 0; j < N; ++j) c[j] = overwrite ? acc[j] : c[j] + acc[j];
    }
}

template <class A, int R = 1>
void gemm_few_rows_dispatch(index_t rows, const float* a, index_t lda, const float* b, index_t ldb, float* c,
                            index_t ldc, index_t N, index_t K, index_t kc_max, bool add) {
    if constexpr (R < gemm_traits<A>::kMR) {
        if (rows > R)
            return gemm_few_rows_dispatch<A, R + 1>(rows, a, lda, b, ldb, c, ldc, N, K, kc_max, add);
    }
    gemm_few_rows<A, R>(a, lda, b, ldb, c, ldc, N, K, kc_max, add);
}

// C (= or +=) A B for row-major A [M, K] (row stride lda), B [K, N] (ldb), C [M, N] (ldc),
// M, N, K > 0, on the calling thread. trans_a: a holds A^T [K, M] (row stride lda); trans_b: b
// holds B^T [N, K] (ldb); packing reads them in place (pack.hpp), the rest is unchanged.
template <class A>
void gemm_packed(const float* a, index_t lda, const float* b, index_t ldb, float* c, index_t ldc, index_t M,
                 index_t N, index_t K, bool add, bool trans_a = false, bool trans_b = false) {
    using T = gemm_traits<A>;
    const index_t kc_max = gemm_piece(K, T::kMaxKc, 1);
    if (!trans_a && !trans_b) {  // the unpacked paths read row-major operands directly
        if (M == 1) return gemm_one_row<A>(a, b, ldb, c, N, K, kc_max, add);
        if (M <= T::kMR) return gemm_few_rows_dispatch<A>(M, a, lda, b, ldb, c, ldc, N, K, kc_max, add);
    }
    const index_t mc_max = gemm_piece(M, T::kMaxMc, T::kMR);
    const index_t nc_max = gemm_piece(N, T::kMaxNc, T::kNR);
    // A row-major A whose rows are one K piece long (lda == K <= kc_max) is already in the packed
    // layout (a micro-panel is kMR consecutive rows of kc floats) where every micro-panel is
    // whole: its copy is skipped. Short-K products over a wide A (the Taylor backward's feature
    // panels, K of a chunk's length) would otherwise copy each element of A to use it in a few
    // register tiles only.
    const bool a_in_place = !trans_a && lda == K && K <= kc_max && M % T::kMR == 0;
    gemm_scratch& s = thread_gemm_scratch();
    float* ap = gemm_scratch::aligned(s.a, mc_max * kc_max);
    float* bp = gemm_scratch::aligned(s.b, kc_max * nc_max);
    for (index_t jc = 0; jc < N; jc += nc_max) {
        const index_t nc = N - jc < nc_max ? N - jc : nc_max;
        for (index_t pc = 0; pc < K; pc += kc_max) {
            const index_t kc = K - pc < kc_max ? K - pc : kc_max;
            if (trans_b)
                gemm_pack_b_t<A, T::kNR>(b + jc * ldb + pc, ldb, kc, nc, bp);
            else
                gemm_pack_b<T::kNR>(b + pc * ldb + jc, ldb, kc, nc, bp);
            for (index_t ic = 0; ic < M; ic += mc_max) {
                const index_t mc = M - ic < mc_max ? M - ic : mc_max;
                if (a_in_place) {
                    gemm_macro<A>(a + ic * lda, bp, mc, nc, kc, c + ic * ldc + jc, ldc, !add);
                    continue;
                }
                if (trans_a)
                    gemm_pack_a_t<A, T::kMR>(a + pc * lda + ic, lda, mc, kc, ap);
                else
                    gemm_pack_a<T::kMR>(a + ic * lda + pc, lda, mc, kc, ap);
                gemm_macro<A>(ap, bp, mc, nc, kc, c + ic * ldc + jc, ldc, pc == 0 && !add);
            }
        }
    }
}

}  // namespace detail
}  // namespace attnkit
