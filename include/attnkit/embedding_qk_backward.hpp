// The backward pass of the StaticEmbQK projection (embedding_qk.hpp): qk = e w, so
//
//   attnkit::embedding_qk_projection(e, w, qk, layout, pool);                  // forward
//   // ... the layers' attention backward passes write d_qk (their d_q and d_k, through
//   //     embedding_q / embedding_k views of the same layout) ...
//   attnkit::embedding_qk_projection_backward(e, w, d_qk, d_e, d_w, layout, pool);
//       d_e [B, L, d_model] = d_qk w^T,  d_w [d_model, width] = e^T d_qk  (summed over B and L)
//
// Two products on the engine's GEMM (detail/gemm.hpp), w and e read transposed in place, each
// on a fixed grid of output blocks over the pool: bitwise identical results for any thread
// count. float tensors, views or TensorMaps; everything validated before anything is written
// (std::invalid_argument naming the argument, the layout and the shapes). The oracle:
// attnkit::reference::embedding_qk_projection_backward.
#pragma once

#include <type_traits>
#include <utility>

#include "attnkit/embedding_qk.hpp"

namespace attnkit {
namespace detail {

// The grids. Each block of a product packs its own slices of both operands, so a block must be
// large against what it packs: d_e = d_qk w^T ([rows, d_model], K = the width, tens of
// thousands) in blocks of 512 rows, each packing all of w once; d_w = e^T d_qk ([d_model, width],
// K = the tokens) in blocks of every d_model row by the projection's column slices, each packing
// its slice of d_qk once (64-row blocks packed that slice once per 64 rows: a quarter of the
// time went to packing).
constexpr index_t kEmbeddingGradRows = 512;

inline void embedding_qk_backward_impl(const view<const float, 3>& e, const view<const float, 2>& w,
                                       const view<const float, 3>& d_qk, const view<float, 3>& d_e,
                                       const view<float, 2>& d_w, const embedding_qk_layout& layout,
                                       thread_pool* pool) {
    const embedding_qk_shape s = check_embedding_backward<float>(e, w, d_qk, d_e, d_w, layout);
    const matrix_ref<const float> wm{w.data, s.d_model, s.width, w.strides[0]};
    const matrix_ref<float> dwm{d_w.data, s.d_model, s.width, d_w.strides[0]};
    // d_e = d_qk w^T, per segment of uniform row stride (detail/row_segments.hpp).
    for_row_segments(d_qk, d_e, [&](const float* grows, float* derows, index_t rows, index_t gs, index_t ds) {
        gemm_blocks({grows, rows, s.width, gs}, gemm_op::none, wm, gemm_op::transpose, {derows, rows, s.d_model, ds},
                    pool, kEmbeddingGradRows, s.d_model);
    });
    // d_w = sum over segments of e_seg^T d_qk_seg, the segments in order.
    bool first = true;
    for_row_segments(e, d_qk, [&](const float* erows, const float* grows, index_t rows, index_t es, index_t gs) {
        gemm_blocks({erows, rows, s.d_model, es}, gemm_op::transpose, {grows, rows, s.width, gs}, gemm_op::none, dwm,
                    pool, s.d_model, kEmbeddingBlockCols, first ? gemm_mode::assign : gemm_mode::add);
        first = false;
    });
    if (first)  // no tokens
        for (index_t k = 0; k < s.d_model; ++k)
            for (index_t c = 0; c < s.width; ++c) dwm.data[k * dwm.stride + c] = 0.0f;
}

}  // namespace detail

template <class E, class W, class DQK, class DE, class DW>
void embedding_qk_projection_backward(const E& e, const W& w, const DQK& d_qk, DE&& d_e, DW&& d_w,
                                      const embedding_qk_layout& layout, thread_pool* pool = nullptr) {
    const auto ev = detail::input_view<3>("e", e, "[B, L, d_model]");
    const auto wv = detail::input_view<2>("w", w, "[d_model, layers * (heads + heads_kv) * dim]");
    const auto gv = detail::input_view<3>("d_qk", d_qk, "[B, L, layers * (heads + heads_kv) * dim]");
    const auto dev = detail::output_view<3>("d_e", std::forward<DE>(d_e), "[B, L, d_model]");
    const auto dwv = detail::output_view<2>("d_w", std::forward<DW>(d_w), "[d_model, layers * (heads + heads_kv) * dim]");
    ATTNKIT_IF_FLOAT("attnkit::embedding_qk_projection_backward: float tensors (double is for attnkit::reference)",
                     ev, wv, gv, dev, dwv) {
        detail::embedding_qk_backward_impl(ev, wv, gv, dev, dwv, layout, pool);
    }
}

}  // namespace attnkit
