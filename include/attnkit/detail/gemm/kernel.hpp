// The packed GEMM on one thread: the five blocking loops of gemm/blocking.hpp around the
// engine's register tile.
//
// The tile is micro_kernels.hpp's scores_tile (S^T = K Q^T of the attention kernels is a GEMM of
// a packed kMR x kc A panel and a packed kc x kNR B panel): it leaves a kMR x kNR result in a
// small L1 buffer, which the epilogue here stores into C or adds to it. That extra pass is kMR
// x kNR / W vector loads and stores against kc x kMR x kNR / W FMAs (1/128 of them at kc = 256)
// and it makes every edge tile the same full-size kernel with a partial store.
#pragma once

#include "attnkit/detail/gemm/blocking.hpp"
#include "attnkit/detail/gemm/pack.hpp"
#include "attnkit/detail/micro_kernels.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {

// C[0 .. mr, 0 .. nr) (= or +=) one register tile of packed A and B over kc.
template <class A>
ATTNKIT_ALWAYS_INLINE void gemm_tile(const float* ap, const float* bp, index_t kc, float* c, index_t ldc,
                                     index_t mr, index_t nr, bool overwrite) {
    using V = simd::vfloat<A>;
    constexpr index_t MR = gemm_traits<A>::kMR, NR = gemm_traits<A>::kNR, W = simd::kLanes<A>;
    constexpr int kVecs = static_cast<int>(NR / W);
    alignas(64) float acc[MR * NR];
    V unused_max[kVecs];  // scores_tile's per-row max, skipped with valid = 0
    // The tile's rows of C are read (or written) last; their lines arrive while the FMAs run.
    for (index_t m = 0; m < mr; ++m) ATTNKIT_PREFETCH(c + m * ldc);
    scores_tile<A>(ap, bp, kc, acc, 0, unused_max);
    if (mr == MR && nr == NR) {
        for (index_t m = 0; m < MR; ++m)
            for (int n = 0; n < kVecs; ++n) {
                float* p = c + m * ldc + n * W;
                const V r = simd::loadu<A>(acc + m * NR + n * W);
                simd::storeu(p, overwrite ? r : simd::loadu<A>(p) + r);
            }
        return;
    }
    for (index_t m = 0; m < mr; ++m)
        for (index_t j = 0; j < nr; ++j) {
            float& x = c[m * ldc + j];
            x = overwrite ? acc[m * NR + j] : x + acc[m * NR + j];
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

// C (= or +=) A B for row-major A [M, K] (row stride lda), B [K, N] (ldb), C [M, N] (ldc),
// M, N, K > 0, on the calling thread.
template <class A>
void gemm_packed(const float* a, index_t lda, const float* b, index_t ldb, float* c, index_t ldc, index_t M,
                 index_t N, index_t K, bool add) {
    using T = gemm_traits<A>;
    const index_t kc_max = gemm_piece(K, T::kMaxKc, 1);
    const index_t mc_max = gemm_piece(M, T::kMaxMc, T::kMR);
    const index_t nc_max = gemm_piece(N, T::kMaxNc, T::kNR);
    gemm_scratch& s = thread_gemm_scratch();
    float* ap = gemm_scratch::aligned(s.a, mc_max * kc_max);
    float* bp = gemm_scratch::aligned(s.b, kc_max * nc_max);
    for (index_t jc = 0; jc < N; jc += nc_max) {
        const index_t nc = N - jc < nc_max ? N - jc : nc_max;
        for (index_t pc = 0; pc < K; pc += kc_max) {
            const index_t kc = K - pc < kc_max ? K - pc : kc_max;
            gemm_pack_b<T::kNR>(b + pc * ldb + jc, ldb, kc, nc, bp);
            for (index_t ic = 0; ic < M; ic += mc_max) {
                const index_t mc = M - ic < mc_max ? M - ic : mc_max;
                gemm_pack_a<T::kMR>(a + ic * lda + pc, lda, mc, kc, ap);
                gemm_macro<A>(ap, bp, mc, nc, kc, c + ic * ldc + jc, ldc, pc == 0 && !add);
            }
        }
    }
}

}  // namespace detail
}  // namespace attnkit
