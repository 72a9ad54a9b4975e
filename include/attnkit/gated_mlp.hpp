// Gated MLP, the "MLP" variant of Xue et al.: the attention sublayer replaced by a per-token
// gated MLP, no token mixing (docs/variants.md section 6).
//
//   attnkit::gated_mlp(x, w_gate, w_up, w_down, out, opts);
//       x, out   [N, d_model] or [B, L, d_model]     (same shape; out must not overlap x)
//       w_gate   [d_model, m],  w_up [d_model, m],  w_down [m, d_model]
//       out = (SiLU(x W_gate) * (x W_up)) W_down,   SiLU(g) = g / (1 + e^-g)
//   attnkit::gated_mlp_width(d_model) = round(4 d_model / 3), the m whose 3 d_model m
//       parameters match a 4 d_model^2 attention sublayer.
//
// How: the rows of x are cut into fixed blocks. Per block (one thread): G = X_b W_gate and
// U = X_b W_up (the engine's packed GEMM, detail/gemm.hpp), G = SiLU(G) * U fused in one SIMD pass
// over the block, then out_b = G W_down. The [N, m] intermediate never exists: each running
// block holds its own [rows, m] pair in a reused scratch buffer, and the down product reads it
// while it is still in the last-level cache. Blocks are a fixed function of the shape, so the
// result is bitwise identical for any thread count. Weights are borrowed, never copied.
//
// Arguments are attnkit::view, row-major Eigen::Tensor or Eigen::TensorMap of float; the last
// dimension of each must be contiguous, other strides are free. Everything is validated before
// anything is written (std::invalid_argument naming the argument and the shapes).
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/gated_mlp/check.hpp"
#include "attnkit/detail/gated_mlp/silu.hpp"
#include "attnkit/detail/gemm.hpp"
#include "attnkit/detail/row_segments.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/options.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {

// round(4 d_model / 3): 4 d_model / 3 is never half-way, so (4 d_model + 1) / 3 rounds.
constexpr index_t gated_mlp_width(index_t d_model) { return (4 * d_model + 1) / 3; }

namespace detail {

// Rows of x and out with one row stride each: a whole [N, d] matrix, or one batch item.
struct mlp_segment {
    matrix_ref<const float> x;
    matrix_ref<float> out;
};

// Rows per block, a function of the segment's rows only (never of the thread count). Each block
// re-packs the three weights (3 d_model m floats, read from L3 or DRAM) for its 6 rows d_model m
// FLOPs: at 256 rows that is one float per 512 FLOPs, a few percent of the block's time; 128 and
// 512 rows measured slower (more re-packing; intermediates falling out of cache). A short
// input is cut into up to 8 blocks of >= 32 rows so that two or three threads still share it.
constexpr index_t kMlpMaxBlockRows = 256;
inline index_t gated_mlp_block_rows(index_t rows) {
    index_t r = (rows + 7) / 8;
    r = (r + 7) / 8 * 8;
    return r < 32 ? 32 : (r > kMlpMaxBlockRows ? kMlpMaxBlockRows : r);
}

// One block: out_b = (SiLU(x_b W_gate) * (x_b W_up)) W_down, with scratch >= 2 rows m floats.
template <class A>
void gated_mlp_block(const matrix_ref<const float>& x, const matrix_ref<const float>& w_gate,
                     const matrix_ref<const float>& w_up, const matrix_ref<const float>& w_down,
                     const matrix_ref<float>& out, float* scratch) {
    const index_t rows = x.rows, m = w_gate.cols;
    const matrix_ref<float> g{scratch, rows, m, m};
    const matrix_ref<float> u{scratch + rows * m, rows, m, m};
    gemm(x, w_gate, g);
    gemm(x, w_up, u);
    silu_mul<A>(g.data, u.data, rows * m);  // g and u are dense: one flat pass
    gemm({g.data, rows, m, m}, w_down, out);
}

template <class V>
matrix_ref<typename V::element_type> weight_matrix(const V& w) {
    return {w.data, w.dims[0], w.dims[1], w.strides[0]};
}

template <class A, int R>
void gated_mlp_impl(const view<const float, R>& x, const view<const float, 2>& w_gate,
                    const view<const float, 2>& w_up, const view<const float, 2>& w_down, const view<float, R>& out,
                    const gated_mlp_options& opts) {
    const gated_mlp_shape s = check_gated_mlp<float, R>(x, w_gate, w_up, w_down, out);
    if (s.rows == 0 || s.d_model == 0) return;

    // The rows as segments of uniform stride (detail/row_segments.hpp).
    std::vector<mlp_segment> segs;
    const index_t d = s.d_model;
    for_row_segments(x, out, [&](const float* xr, float* yr, index_t rows, index_t xs, index_t ys) {
        segs.push_back({{xr, rows, d, xs}, {yr, rows, d, ys}});
    });

    if (s.width == 0) {  // an empty hidden layer: the product is exactly zero
        for (const mlp_segment& g : segs)
            for (index_t i = 0; i < g.out.rows; ++i)
                for (index_t j = 0; j < d; ++j) g.out.data[i * g.out.stride + j] = 0.0f;
        return;
    }

    struct block {
        index_t seg, r0, r1;
    };
    std::vector<block> blocks;
    index_t max_rows = 0;
    for (index_t k = 0; k < static_cast<index_t>(segs.size()); ++k) {
        const index_t n = segs[static_cast<std::size_t>(k)].x.rows, br = gated_mlp_block_rows(n);
        for (index_t r0 = 0; r0 < n; r0 += br) blocks.push_back({k, r0, r0 + br < n ? r0 + br : n});
        max_rows = br > max_rows ? br : max_rows;
    }

    const auto wg = weight_matrix(w_gate), wu = weight_matrix(w_up), wd = weight_matrix(w_down);
    const std::size_t need = static_cast<std::size_t>(2 * max_rows * s.width);
    parallel_for(opts.pool, static_cast<std::int64_t>(blocks.size()), [&](std::int64_t i) {
        const block& b = blocks[static_cast<std::size_t>(i)];
        const mlp_segment& g = segs[static_cast<std::size_t>(b.seg)];
        scratch_lease<> lease;
        std::vector<float>& buf = lease.get();
        if (buf.size() < need) buf.resize(need);
        gated_mlp_block<A>(g.x.row_block(b.r0, b.r1), wg, wu, wd, g.out.row_block(b.r0, b.r1), buf.data());
    });
}


}  // namespace detail

template <class X, class WG, class WU, class WD, class O>
void gated_mlp(const X& x, const WG& w_gate, const WU& w_up, const WD& w_down, O&& out,
               const gated_mlp_options& opts = {}) {
    const auto a = detail::gated_mlp_arguments(x, w_gate, w_up, w_down, std::forward<O>(out));
    detail::gated_mlp_impl<simd::default_arch, decltype(a.x)::kRank>(a.x, a.w_gate, a.w_up, a.w_down, a.out, opts);
}

}  // namespace attnkit
