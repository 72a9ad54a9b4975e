// The one GEMM wrapper of attnkit: C = A B and C += A B on row-major float matrices in user
// memory (pointer, rows, cols, row stride), computed by Eigen's matrix product on Eigen::Map, and
// a fixed block partition of C over an attnkit::thread_pool.
//
//   gemm(a, b, c)                    C  = A B   on the calling thread
//   gemm(a, b, c, gemm_mode::add)    C += A B
//   gemm_blocks(a, b, c, pool, block_rows, block_cols)   C = A B, a fixed grid of C's blocks
//                                                         over the pool, one thread per block
//   gemm_rows(a, b, c, pool[, block_rows])                the same with whole rows
//
// Why a wrapper at all: Eigen's product is fast (packing + a register-blocked micro-kernel per
// ISA), but only through Matrix expressions. Kernels here hold raw pointers and strides, so this
// header is the single place that turns them into Maps: Unaligned (attnkit never claims
// alignment it does not own) with an OuterStride (a matrix may be a column slice of a wider
// buffer, e.g. one layer's W_Q inside the stacked StaticEmbQK weights).
//
// Determinism: every element of C is computed by exactly one block, and the blocks are a fixed
// function of the shape and the block sizes, never of the thread count. A block's result depends only on
// its own sizes, so the output is bitwise identical for any pool. Eigen's own GEMM threading
// exists only in OpenMP builds; there the product is called through Eigen's sequential entry
// point so that no hidden threads run (docs/design.md "Threads").
#pragma once

#include <Eigen/Core>

#include "attnkit/config.hpp"
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

using gemm_row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using gemm_const_map = Eigen::Map<const gemm_row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using gemm_map = Eigen::Map<gemm_row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

// C = A B (assign) or C += A B (add) on the calling thread. Shapes are the caller's contract:
// A [M, K], B [K, N], C [M, N]; C must not overlap A or B.
inline void gemm(const matrix_ref<const float>& a, const matrix_ref<const float>& b, const matrix_ref<float>& c,
                 gemm_mode mode = gemm_mode::assign) {
    if (c.rows == 0 || c.cols == 0) return;
    if (a.cols == 0) {  // empty inner dimension: the product is zero
        if (mode == gemm_mode::assign)
            for (index_t i = 0; i < c.rows; ++i)
                for (index_t j = 0; j < c.cols; ++j) c.data[i * c.stride + j] = 0.0f;
        return;
    }
#if defined(EIGEN_HAS_OPENMP) && !defined(EIGEN_DONT_PARALLELIZE)
    // Eigen's parallelizer would start OpenMP threads inside our pool's tasks: call the
    // sequential product directly (info = nullptr), with the blocking Eigen itself would use.
    namespace ei = Eigen::internal;
    if (mode == gemm_mode::assign)
        for (index_t i = 0; i < c.rows; ++i)
            for (index_t j = 0; j < c.cols; ++j) c.data[i * c.stride + j] = 0.0f;
    ei::gemm_blocking_space<Eigen::RowMajor, float, float, Eigen::Dynamic, Eigen::Dynamic, Eigen::Dynamic, 1, false>
        blocking(c.rows, c.cols, a.cols, 1, true);
    ei::general_matrix_matrix_product<index_t, float, Eigen::RowMajor, false, float, Eigen::RowMajor, false,
                                      Eigen::RowMajor, 1>::run(c.rows, c.cols, a.cols, a.data, a.stride, b.data,
                                                               b.stride, c.data, 1, c.stride, 1.0f, blocking,
                                                               nullptr);
#else
    const gemm_const_map A(a.data, a.rows, a.cols, Eigen::OuterStride<>(a.stride));
    const gemm_const_map B(b.data, b.rows, b.cols, Eigen::OuterStride<>(b.stride));
    gemm_map C(c.data, c.rows, c.cols, Eigen::OuterStride<>(c.stride));
    if (mode == gemm_mode::assign)
        C.noalias() = A * B;
    else
        C.noalias() += A * B;
#endif
}
// Rows per block of gemm_rows. Large enough that re-packing B per block costs a few percent of
// the block's FLOPs (B is packed once per block: K*N loads against 2*rows*K*N FLOPs), small
// enough that two threads share N = 512 rows evenly.
constexpr index_t kGemmBlockRows = 256;

// C = A B with C cut into a fixed grid of blocks (block_rows x block_cols, the last row and
// column of blocks shorter), each block computed by one thread of the pool. Wide products want
// column blocks too: a block re-packs only its own slice of B, and a slice of a few thousand
// columns stays in the last-level cache while the block's rows stream past it.
inline void gemm_blocks(const matrix_ref<const float>& a, const matrix_ref<const float>& b,
                        const matrix_ref<float>& c, thread_pool* pool, index_t block_rows, index_t block_cols) {
    if (c.rows <= 0 || c.cols <= 0) return;
    const index_t row_blocks = (c.rows + block_rows - 1) / block_rows;
    const index_t col_blocks = (c.cols + block_cols - 1) / block_cols;
    // Column-major over the grid: consecutive tasks share a slice of B.
    parallel_for(pool, row_blocks * col_blocks, [&](std::int64_t t) {
        const index_t r0 = (t % row_blocks) * block_rows, c0 = (t / row_blocks) * block_cols;
        const index_t r1 = r0 + block_rows < c.rows ? r0 + block_rows : c.rows;
        const index_t c1 = c0 + block_cols < c.cols ? c0 + block_cols : c.cols;
        gemm(a.row_block(r0, r1), b.col_block(c0, c1), c.row_block(r0, r1).col_block(c0, c1));
    });
}

// C = A B with C's rows split into fixed blocks over the pool.
inline void gemm_rows(const matrix_ref<const float>& a, const matrix_ref<const float>& b, const matrix_ref<float>& c,
                      thread_pool* pool, index_t block_rows = kGemmBlockRows) {
    gemm_blocks(a, b, c, pool, block_rows, c.cols > 0 ? c.cols : 1);
}

}  // namespace detail
}  // namespace attnkit
