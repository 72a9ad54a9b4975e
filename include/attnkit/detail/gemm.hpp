// The one GEMM of attnkit: C = A B and C += A B on row-major float matrices in user memory
// (pointer, rows, cols, row stride), and a fixed block partition of C over an
// attnkit::thread_pool.
//
//   gemm(a, b, c)                    C  = A B   on the calling thread
//   gemm(a, b, c, gemm_mode::add)    C += A B
//   gemm_blocks(a, b, c, pool, block_rows, block_cols)   C = A B, a fixed grid of C's blocks
//                                                         over the pool, one thread per block
//   gemm_rows(a, b, c, pool[, block_rows])                the same with whole rows
//
// How: the engine's own packed GEMM (detail/gemm/: BLIS-style cache blocking, A and B packed
// into per-thread scratch, the attention kernels' register tile, templated on the SIMD arch).
// It replaced Eigen's product on Maps, which reached about half of the FMA peak on these shapes
// on Zen 2 (bench/gated_mlp_bench.cpp, bench/embedding_qk_bench.cpp); the blocking here is
// sized for the caches of the cores attnkit runs on and its edge tiles are full-size kernels.
// attnkit never claims alignment it does not own: user matrices are read and written with
// unaligned accesses, only the packed scratch is aligned.
//
// Determinism: every element of C is computed by exactly one block, and its value is the same
// chain of FMAs (K cut into pieces that depend on K alone, gemm/blocking.hpp) wherever it sits,
// so the output is bitwise identical for any pool, any thread count and any block grid. No
// hidden threads: the product runs on the thread that calls it.
#pragma once

#include <cstdint>

#include "attnkit/config.hpp"
#include "attnkit/detail/gemm/kernel.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {

// A row-major matrix view: element (i, j) at data[i * stride + j].
template <class T>
struct matrix_ref {
    T* data = nullptr;
    index_t rows = 0, cols = 0, stride = 0;

    // Rows [r0, r1) of this matrix.
    matrix_ref row_block(index_t r0, index_t r1) const { return {data + r0 * stride, r1 - r0, cols, stride}; }
    // Columns [c0, c1) of this matrix.
    matrix_ref col_block(index_t c0, index_t c1) const { return {data + c0, rows, c1 - c0, stride}; }
};

enum class gemm_mode { assign, add };

// C = A B (assign) or C += A B (add) on the calling thread, with the kernels of arch A. Shapes
// are the caller's contract: A [M, K], B [K, N], C [M, N]; C must not overlap A or B.
template <class A>
ATTNKIT_NOINLINE void gemm_on(const matrix_ref<const float>& a, const matrix_ref<const float>& b,
                              const matrix_ref<float>& c, gemm_mode mode = gemm_mode::assign) {
    if (c.rows == 0 || c.cols == 0) return;
    if (a.cols == 0) {  // empty inner dimension: the product is zero
        if (mode == gemm_mode::assign)
            for (index_t i = 0; i < c.rows; ++i)
                for (index_t j = 0; j < c.cols; ++j) c.data[i * c.stride + j] = 0.0f;
        return;
    }
    gemm_packed<A>(a.data, a.stride, b.data, b.stride, c.data, c.stride, c.rows, c.cols, a.cols,
                   mode == gemm_mode::add);
}

inline void gemm(const matrix_ref<const float>& a, const matrix_ref<const float>& b, const matrix_ref<float>& c,
                 gemm_mode mode = gemm_mode::assign) {
    gemm_on<simd::default_arch>(a, b, c, mode);
}

// Which operand a matrix_ref holds: the factor itself, or its transpose (the backward passes'
// products A^T B and A B^T, read in place: a transposed copy would cost a pass over memory).
enum class gemm_op { none, transpose };

// C = op_a(A) op_b(B) (or +=): a and b are the matrices as stored, so op_a = transpose takes
// a [K, M] and op_b = transpose takes b [N, K]; C [M, N]. Same determinism as gemm_on.
template <class A>
ATTNKIT_NOINLINE void gemm_on(const matrix_ref<const float>& a, gemm_op op_a, const matrix_ref<const float>& b,
                              gemm_op op_b, const matrix_ref<float>& c, gemm_mode mode = gemm_mode::assign) {
    const bool ta = op_a == gemm_op::transpose, tb = op_b == gemm_op::transpose;
    const index_t K = ta ? a.rows : a.cols;
    if (c.rows == 0 || c.cols == 0) return;
    if (K == 0) {
        if (mode == gemm_mode::assign)
            for (index_t i = 0; i < c.rows; ++i)
                for (index_t j = 0; j < c.cols; ++j) c.data[i * c.stride + j] = 0.0f;
        return;
    }
    gemm_packed<A>(a.data, a.stride, b.data, b.stride, c.data, c.stride, c.rows, c.cols, K, mode == gemm_mode::add,
                   ta, tb);
}

inline void gemm(const matrix_ref<const float>& a, gemm_op op_a, const matrix_ref<const float>& b, gemm_op op_b,
                 const matrix_ref<float>& c, gemm_mode mode = gemm_mode::assign) {
    gemm_on<simd::default_arch>(a, op_a, b, op_b, c, mode);
}

// Rows per block of gemm_rows. Large enough that re-packing B per block costs a few percent of
// the block's FLOPs (B is packed once per block: K*N loads against 2*rows*K*N FLOPs), small
// enough that two threads share N = 512 rows evenly.
constexpr index_t kGemmBlockRows = 256;

// One product C = op_a(A) op_b(B) (or +=) as a value, run on the calling thread by call().
struct gemm_call {
    matrix_ref<const float> a;
    gemm_op op_a = gemm_op::none;
    matrix_ref<const float> b;
    gemm_op op_b = gemm_op::none;
    matrix_ref<float> c;
    gemm_mode mode = gemm_mode::assign;

    void call() const { gemm(a, op_a, b, op_b, c, mode); }
    // The number of blocks of C in a grid of block_rows x block_cols.
    std::int64_t blocks(index_t block_rows, index_t block_cols) const {
        if (c.rows <= 0 || c.cols <= 0) return 0;
        return static_cast<std::int64_t>(((c.rows + block_rows - 1) / block_rows) *
                                         ((c.cols + block_cols - 1) / block_cols));
    }
    // Block t of that grid, column-major (consecutive blocks share a slice of op(B)): the rows
    // r0.. of op(A) and columns c0.. of op(B), wherever they lie in the stored matrices.
    gemm_call block(index_t block_rows, index_t block_cols, std::int64_t t) const {
        const index_t row_blocks = (c.rows + block_rows - 1) / block_rows;
        const index_t r0 = (t % row_blocks) * block_rows, c0 = (t / row_blocks) * block_cols;
        const index_t r1 = r0 + block_rows < c.rows ? r0 + block_rows : c.rows;
        const index_t c1 = c0 + block_cols < c.cols ? c0 + block_cols : c.cols;
        const bool ta = op_a == gemm_op::transpose, tb = op_b == gemm_op::transpose;
        return {ta ? a.col_block(r0, r1) : a.row_block(r0, r1), op_a, tb ? b.row_block(c0, c1) : b.col_block(c0, c1),
                op_b, c.row_block(r0, r1).col_block(c0, c1), mode};
    }
};

// C = op_a(A) op_b(B) (or +=) cut into gemm_call's fixed grid of blocks of C, each block
// computed by one thread of the pool: block (r0, c0) reads rows r0.. of op(A) and columns c0..
// of op(B), wherever they lie in the stored matrices.
inline void gemm_blocks(const matrix_ref<const float>& a, gemm_op op_a, const matrix_ref<const float>& b,
                        gemm_op op_b, const matrix_ref<float>& c, thread_pool* pool, index_t block_rows,
                        index_t block_cols, gemm_mode mode = gemm_mode::assign) {
    const gemm_call whole{a, op_a, b, op_b, c, mode};
    const std::int64_t n = whole.blocks(block_rows, block_cols);
    if (n > 0) parallel_for(pool, n, [&](std::int64_t t) { whole.block(block_rows, block_cols, t).call(); });
}

// C = A B with C cut into a fixed grid of blocks (block_rows x block_cols, the last row and
// column of blocks shorter), each block computed by one thread of the pool. Wide products want
// column blocks too: a block re-packs only its own slice of B, and a slice of a few thousand
// columns stays in the last-level cache while the block's rows stream past it.
inline void gemm_blocks(const matrix_ref<const float>& a, const matrix_ref<const float>& b,
                        const matrix_ref<float>& c, thread_pool* pool, index_t block_rows, index_t block_cols) {
    gemm_blocks(a, gemm_op::none, b, gemm_op::none, c, pool, block_rows, block_cols);
}

// C = A B with C's rows split into fixed blocks over the pool.
inline void gemm_rows(const matrix_ref<const float>& a, const matrix_ref<const float>& b, const matrix_ref<float>& c,
                      thread_pool* pool, index_t block_rows = kGemmBlockRows) {
    gemm_blocks(a, b, c, pool, block_rows, c.cols > 0 ? c.cols : 1);
}

#ifdef ATTNKIT_KERNEL_INSTANCE  // compiled kernels (config.hpp)
ATTNKIT_KERNEL_INSTANCE void gemm_on<simd::default_arch>(const matrix_ref<const float>&, const matrix_ref<const float>&,
                                                         const matrix_ref<float>&, gemm_mode);
ATTNKIT_KERNEL_INSTANCE void gemm_on<simd::default_arch>(const matrix_ref<const float>&, gemm_op,
                                                         const matrix_ref<const float>&, gemm_op,
                                                         const matrix_ref<float>&, gemm_mode);
#endif

}  // namespace detail
}  // namespace attnkit
