// The rows of a per-token map (x [N, d] -> y [N, e], or [B, L, d] -> [B, L, e]) as few matrices
// of one row stride each, for kernels that treat every token alike (gated_mlp, the embedding
// projection): a rank-3 pair folds into one [B * L, .] matrix when both are dense over (B, L)
// (or L == 1, or B == 1), else it gives one [L, .] matrix per batch item. Fewer, taller
// matrices let a GEMM block its rows freely.
#pragma once

#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {

// Calls fn(x_rows, y_rows, rows, x_stride, y_stride) for each segment: rows tokens starting at
// x_rows / y_rows, x_stride / y_stride floats apart. x and y have the same leading dimensions.
template <class TX, class TY, int R, class F>
void for_row_segments(const view<TX, R>& x, const view<TY, R>& y, F&& fn) {
    static_assert(R == 2 || R == 3, "for_row_segments: [N, d] or [B, L, d]");
    if constexpr (R == 2) {
        fn(x.data, y.data, x.dims[0], x.strides[0], y.strides[0]);
    } else {
        const index_t B = x.dims[0], L = x.dims[1];
        if (L == 1)
            fn(x.data, y.data, B, x.strides[0], y.strides[0]);
        else if (B == 1 || (x.strides[0] == L * x.strides[1] && y.strides[0] == L * y.strides[1]))
            fn(x.data, y.data, B * L, x.strides[1], y.strides[1]);
        else
            for (index_t b = 0; b < B; ++b)
                fn(x.data + b * x.strides[0], y.data + b * y.strides[0], L, x.strides[1], y.strides[1]);
    }
}

}  // namespace detail
}  // namespace attnkit
