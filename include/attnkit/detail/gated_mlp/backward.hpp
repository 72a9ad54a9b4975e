// The gated MLP's backward pass on the engine's GEMM (the mathematics: reference/
// gated_mlp_backward.hpp). Rows in blocks of up to kMlpBackwardRows, the hidden width m in slices
// of kMlpBackwardSlice columns; per (row block, slice), with x_b, d_out_b the block's rows and
// W[:, s] the slice's columns:
//   G_s = x_b W_gate[:, s],  U_s = x_b W_up[:, s],  dZ_s = d_out_b W_down[s, :]^T
//   Z_s, dG_s, dU_s                     one elementwise pass (silu.hpp silu_backward)
//   d_w_down[s, :] (+)= Z_s^T d_out_b,  d_w_gate[:, s] (+)= x_b^T dG_s,  d_w_up[:, s] (+)= x_b^T dU_s
//   d_x_b (+)= dG_s W_gate[:, s]^T + dU_s W_up[:, s]^T
// The [rows, m] intermediates exist only slice by slice ([rows, slice] x 4, last-level cache
// sized), never for the whole width: the forward's G and U are recomputed (two of the eight
// products) rather than stored, as the API takes no saved activations. Transposed operands are
// read in place (gemm_op). Each product is cut into a fixed grid of C's blocks (gemm_call), the
// independent products of a slice share one task list over the pool, and the slices follow in
// a fixed order, so the gradients are bitwise identical for any thread count.
#pragma once

#include <vector>

#include "attnkit/detail/gated_mlp/check.hpp"
#include "attnkit/detail/gated_mlp/silu.hpp"
#include "attnkit/detail/gemm.hpp"
#include "attnkit/detail/row_segments.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {

// Rows per block: the slice intermediates (4 x rows x slice floats, 20 MiB at 2048 x 640) stay
// in the last-level cache while the weight gradients' products read them.
constexpr index_t kMlpBackwardRows = 2048;
// Columns of m per slice: a multiple of every register tile's width (8, 16, 32). The weight
// gradients' products have only d_model x slice outputs for a K of the block's rows, and each
// output block packs its own operands, so a wide slice keeps that packing small against the
// FMAs (256, 384, 512, 608, 640 and the whole 1216 measured: docs/benchmarks.md, "Gated MLP and
// StaticEmbQK backward").
constexpr index_t kMlpBackwardSlice = 640;
// Output rows per block of the products over the rows (G, U, dZ, d_x): each block packs its
// weight slice once, and a packed element of B then feeds rows / lanes vector FMAs, so a
// transposing pack at about a cycle per float costs 1/8 of the FMAs' time at 256 rows and 1/32
// at 1024; two blocks of a 2048-row block still give two threads one each.
constexpr index_t kMlpBackwardBlockRows = 1024;
// The weight gradients' blocks: d_model in two near-equal parts (rounded to 8 rows), one per
// thread of two, each packing the block's slice intermediates once (four parts packed them
// four times, against 224 rows of FMAs each).
inline index_t mlp_weight_block_rows(index_t d_model) { return ((d_model + 1) / 2 + 7) / 8 * 8; }

template <class A, int R>
void gated_mlp_backward_run(const view<const float, R>& x, const view<const float, 2>& w_gate,
                            const view<const float, 2>& w_up, const view<const float, 2>& w_down,
                            const view<const float, R>& d_out, const view<float, R>& d_x,
                            const view<float, 2>& d_w_gate, const view<float, 2>& d_w_up,
                            const view<float, 2>& d_w_down, thread_pool* pool) {
    const gated_mlp_shape s =
        check_gated_mlp_backward<float, R>(x, w_gate, w_up, w_down, d_out, d_x, d_w_gate, d_w_up, d_w_down);
    const index_t d = s.d_model, m = s.width;
    auto mref = [](const auto& v) { return matrix_ref<typename std::decay_t<decltype(v)>::element_type>{v.data, v.dims[0], v.dims[1], v.strides[0]}; };
    const matrix_ref<const float> wg = mref(w_gate), wu = mref(w_up), wd = mref(w_down);
    const matrix_ref<float> dwg = mref(d_w_gate), dwu = mref(d_w_up), dwd = mref(d_w_down);
    auto zero = [](const matrix_ref<float>& c) {
        for (index_t i = 0; i < c.rows; ++i)
            for (index_t j = 0; j < c.cols; ++j) c.data[i * c.stride + j] = 0.0f;
    };
    if (s.rows == 0 || m == 0) {  // no tokens, or an empty hidden layer: every gradient is zero
        zero(dwg), zero(dwu), zero(dwd);
        for_row_segments(d_out, d_x, [&](const float*, float* dxr, index_t rows, index_t, index_t dxs) {
            zero({dxr, rows, d, dxs});
        });
        return;
    }

    // Row segments of one stride each (detail/row_segments.hpp), cut into blocks.
    struct block {
        matrix_ref<const float> x, dout;
        matrix_ref<float> dx;
    };
    std::vector<block> blocks;
    std::vector<matrix_ref<const float>> xsegs;
    for_row_segments(x, d_out, [&](const float* xr, const float* dor, index_t rows, index_t xs, index_t ds) {
        (void)dor, (void)ds;
        xsegs.push_back({xr, rows, d, xs});
    });
    std::size_t seg = 0;
    for_row_segments(d_out, d_x, [&](const float* dor, float* dxr, index_t rows, index_t ds, index_t dxs) {
        const matrix_ref<const float> xm = xsegs[seg++];
        for (index_t r0 = 0; r0 < rows; r0 += kMlpBackwardRows) {
            const index_t r1 = r0 + kMlpBackwardRows < rows ? r0 + kMlpBackwardRows : rows;
            blocks.push_back({xm.row_block(r0, r1), matrix_ref<const float>{dor, rows, d, ds}.row_block(r0, r1),
                              matrix_ref<float>{dxr, rows, d, dxs}.row_block(r0, r1)});
        }
    });

    const index_t max_rows = kMlpBackwardRows < s.rows ? kMlpBackwardRows : s.rows;
    const index_t sw = kMlpBackwardSlice < m ? kMlpBackwardSlice : m;
    // The slice intermediates, this thread's across calls (detail/scratch.hpp): 21 MiB at 2048
    // rows, which a vector per call would take from fresh pages and zero on the calling thread
    // while the others wait. Every element is written before it is read.
    scratch_lease<> lease;
    std::vector<float>& scratch = lease.get();
    scratch.resize(static_cast<std::size_t>(4 * max_rows * sw));
    const auto none = gemm_op::none, tr = gemm_op::transpose;
    const index_t BR = kMlpBackwardBlockRows, WR = mlp_weight_block_rows(d);
    for (std::size_t bi = 0; bi < blocks.size(); ++bi) {
        const block& b = blocks[bi];
        const index_t rows = b.x.rows;
        const gemm_mode first_block = bi == 0 ? gemm_mode::assign : gemm_mode::add;
        for (index_t c0 = 0; c0 < m; c0 += sw) {
            const index_t c1 = c0 + sw < m ? c0 + sw : m, w = c1 - c0;
            const matrix_ref<float> g{scratch.data(), rows, w, w}, u{g.data + rows * w, rows, w, w},
                dz{u.data + rows * w, rows, w, w}, z{dz.data + rows * w, rows, w, w};
            // The products over the rows and the elementwise pass, a block of rows per task.
            parallel_for(pool, (rows + BR - 1) / BR, [&](std::int64_t t) {
                const index_t r0 = t * BR, r1 = r0 + BR < rows ? r0 + BR : rows;
                gemm(b.x.row_block(r0, r1), none, wg.col_block(c0, c1), none, g.row_block(r0, r1));
                gemm(b.x.row_block(r0, r1), none, wu.col_block(c0, c1), none, u.row_block(r0, r1));
                gemm(b.dout.row_block(r0, r1), none, wd.row_block(c0, c1), tr, dz.row_block(r0, r1));
                silu_backward<A>(g.data + r0 * w, u.data + r0 * w, dz.data + r0 * w, z.data + r0 * w, (r1 - r0) * w);
            });
            // Then the weight gradients and d_x, which read only Z, dG and dU: all their blocks
            // in one task list, d_x's row blocks (its two products in order) first, the larger
            // tasks, so that the weight gradients' blocks even out the threads' ends. Two
            // barriers per slice where one per product made eight, each a point where one thread
            // waits for the other; each block is computed as gemm_blocks computes it, so the bits
            // are the same (docs/benchmarks.md, "Gated MLP and StaticEmbQK backward").
            const matrix_ref<const float> gc{g.data, rows, w, w}, uc{u.data, rows, w, w}, zc{z.data, rows, w, w};
            const gemm_call dx_g{gc, none, wg.col_block(c0, c1), tr, b.dx, c0 == 0 ? gemm_mode::assign : gemm_mode::add};
            const gemm_call dx_u{uc, none, wu.col_block(c0, c1), tr, b.dx, gemm_mode::add};
            const gemm_call dw[3] = {{zc, tr, b.dout, none, dwd.row_block(c0, c1), first_block},
                                     {b.x, tr, gc, none, dwg.col_block(c0, c1), first_block},
                                     {b.x, tr, uc, none, dwu.col_block(c0, c1), first_block}};
            const index_t dw_rows[3] = {w, WR, WR}, dw_cols[3] = {WR, w, w};
            const std::int64_t n_dx = dx_g.blocks(BR, d);
            std::int64_t n_dw[3];
            for (int i = 0; i < 3; ++i) n_dw[i] = dw[i].blocks(dw_rows[i], dw_cols[i]);
            parallel_for(pool, n_dx + n_dw[0] + n_dw[1] + n_dw[2], [&](std::int64_t t) {
                if (t < n_dx) {
                    dx_g.block(BR, d, t).call();
                    dx_u.block(BR, d, t).call();
                    return;
                }
                t -= n_dx;
                int i = 0;
                while (t >= n_dw[i]) t -= n_dw[i++];
                dw[i].block(dw_rows[i], dw_cols[i], t).call();
            });
        }
    }
}

}  // namespace detail
}  // namespace attnkit
