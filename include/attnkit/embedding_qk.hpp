// StaticEmbQK (Xue et al.): every layer's Q and K come from the token embeddings e, not from the
// layer's input (docs/variants.md section 5), so the Q and K of all layers are ONE GEMM.
//
//   embedding_qk_layout lay{layers, heads, heads_kv, dim};
//   attnkit::embedding_qk_projection(e, w, qk, lay, pool);
//       e [B, L, d_model] x w [d_model, layers*(H+Hk)*D] -> qk [B, L, layers*(H+Hk)*D]
//       w's columns, per layer l in order: W_Q^l (H*D columns), then W_K^l (Hk*D columns)
//   attnkit::embedding_q(qk, lay, l)   view<const float, 4> [B, L, H, D] into qk, no copy
//   attnkit::embedding_k(qk, lay, l)   view<const float, 4> [B, L, Hk, D] into qk, no copy
//   attnkit::stack_embedding_qk_weights(wq, wk, w)
//       builds w from per-layer W_Q^l [d_model, H*D] and W_K^l [d_model, Hk*D] (std::vectors)
//
// The views have strides [L*width, width, D, 1]: BSHD with a wide row, which is exactly what
// softmax_attention (and every variant) takes, so layer l runs
//   softmax_attention(embedding_q(qk, lay, l), embedding_k(qk, lay, l), v_l, out_l, opts).
// Memory: qk holds B*L*layers*(H+Hk)*D floats, the Q and K of every layer at once.
//
// The projection is detail/gemm.hpp's product on a fixed grid of (row, column) blocks over the
// pool: bitwise identical for any thread count. Everything is validated before anything is
// written (std::invalid_argument naming the argument, the layout and the shapes).
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/embedding_qk/check.hpp"
#include "attnkit/detail/gemm.hpp"
#include "attnkit/detail/memory_overlap.hpp"
#include "attnkit/detail/row_segments.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {

// Block grid of the projection. 256 rows re-pack each column slice of w once per 256 rows of e;
// 2048 columns (8 KiB per row of a slice, a few MiB packed) keep a slice in the last-level cache
// while the rows of the block stream past it. Columns are the outer loop of the grid.
constexpr index_t kEmbeddingBlockRows = 256;
constexpr index_t kEmbeddingBlockCols = 2048;

inline void embedding_qk_projection_impl(const view<const float, 3>& e, const view<const float, 2>& w,
                                         const view<float, 3>& qk, const embedding_qk_layout& layout,
                                         thread_pool* pool) {
    const embedding_qk_shape s = check_embedding_projection<float>(e, w, qk, layout);
    const matrix_ref<const float> wm{w.data, s.d_model, s.width, w.strides[0]};
    if (s.batch == 0 || s.len == 0) return;
    // One GEMM per segment of uniform row stride (detail/row_segments.hpp).
    for_row_segments(e, qk, [&](const float* erows, float* qrows, index_t rows, index_t estride, index_t qstride) {
        gemm_blocks({erows, rows, s.d_model, estride}, wm, {qrows, rows, s.width, qstride}, pool,
                    kEmbeddingBlockRows, kEmbeddingBlockCols);
    });
}

// Layer l's Q (k_part = false) or K (k_part = true) as [B, L, heads, D] inside qk.
inline view<const float, 4> embedding_part(const view<const float, 3>& qk, const embedding_qk_layout& layout,
                                           index_t layer, bool k_part) {
    check_embedding_view(qk, layout, layer);
    const index_t D = layout.dim;
    const index_t offset = layer * (layout.heads + layout.heads_kv) * D + (k_part ? layout.heads * D : 0);
    return view<const float, 4>(qk.data + offset,
                                {qk.dims[0], qk.dims[1], k_part ? layout.heads_kv : layout.heads, D},
                                {qk.strides[0], qk.strides[1], D, 1});
}

template <class X>
view<const float, 2> weight_list_view(const char* name, std::size_t l, const X& x) {
    static_assert(std::is_same<scalar_of<X>, float>::value, "stack_embedding_qk_weights: float weights");
    const std::string n = std::string(name) + "[" + std::to_string(l) + "]";
    const auto v = input_view<2>(n.c_str(), x, "[d_model, heads * dim]");
    check_layout(n.c_str(), v);
    return v;
}

}  // namespace detail

template <class E, class W, class QK>
void embedding_qk_projection(const E& e, const W& w, QK&& qk, const embedding_qk_layout& layout,
                             thread_pool* pool = nullptr) {
    static_assert(std::is_same<detail::scalar_of<E>, float>::value, "embedding_qk_projection: float e");
    static_assert(std::is_same<detail::scalar_of<W>, float>::value, "embedding_qk_projection: float w");
    const auto ev = detail::input_view<3>("e", e, "[B, L, d_model]");
    const auto wv = detail::input_view<2>("w", w, "[d_model, layers * (heads + heads_kv) * dim]");
    const auto qv = detail::output_view<3>("qk", qk, "[B, L, layers * (heads + heads_kv) * dim]");
    static_assert(std::is_same<typename decltype(qv)::value_type, float>::value, "embedding_qk_projection: float qk");
    detail::embedding_qk_projection_impl(ev, wv, qv, layout, pool);
}

template <class QK>
view<const float, 4> embedding_q(const QK& qk, const embedding_qk_layout& layout, index_t layer) {
    static_assert(std::is_same<detail::scalar_of<QK>, float>::value, "embedding_q: float qk");
    return detail::embedding_part(detail::input_view<3>("qk", qk, "[B, L, layers * (heads + heads_kv) * dim]"),
                                  layout, layer, false);
}

template <class QK>
view<const float, 4> embedding_k(const QK& qk, const embedding_qk_layout& layout, index_t layer) {
    static_assert(std::is_same<detail::scalar_of<QK>, float>::value, "embedding_k: float qk");
    return detail::embedding_part(detail::input_view<3>("qk", qk, "[B, L, layers * (heads + heads_kv) * dim]"),
                                  layout, layer, true);
}

// w = [W_Q^0 W_K^0 W_Q^1 W_K^1 ...] (columns), from per-layer wq[l] [d_model, H*D] and
// wk[l] [d_model, Hk*D]. Every wq[l] has one shape and every wk[l] another; w must be
// [d_model, layers * (H*D + Hk*D)] and must not overlap them.
template <class WQ, class WK, class W>
void stack_embedding_qk_weights(const std::vector<WQ>& wq, const std::vector<WK>& wk, W&& w) {
    using detail::fail;
    if (wq.empty() || wq.size() != wk.size())
        fail("wk: expected one W_K per W_Q and at least one layer, got " + std::to_string(wq.size()) + " W_Q and " +
             std::to_string(wk.size()) + " W_K");
    std::vector<view<const float, 2>> q, k;
    for (std::size_t l = 0; l < wq.size(); ++l) {
        q.push_back(detail::weight_list_view("wq", l, wq[l]));
        k.push_back(detail::weight_list_view("wk", l, wk[l]));
    }
    const index_t d = q[0].dims[0], nq = q[0].dims[1], nk = k[0].dims[1];
    const index_t layers = static_cast<index_t>(q.size());
    for (std::size_t l = 0; l < q.size(); ++l) {
        detail::check_shape(("wq[" + std::to_string(l) + "]").c_str(), q[l], {d, nq}, "[d_model, H * D] (as wq[0])");
        detail::check_shape(("wk[" + std::to_string(l) + "]").c_str(), k[l], {d, nk}, "[d_model, Hk * D] (d_model of wq[0])");
    }
    const auto out = detail::output_view<2>("w", w, "[d_model, layers * (H * D + Hk * D)]");
    detail::check_layout("w", out);
    detail::check_shape("w", out, {d, layers * (nq + nk)}, "[d_model, layers * (H * D + Hk * D)]");
    for (std::size_t l = 0; l < q.size(); ++l) {
        const std::string nq = "wq[" + std::to_string(l) + "]", nk = "wk[" + std::to_string(l) + "]";
        detail::check_outputs_apart({detail::region_of("w", out)},
                                    {detail::region_of(nq.c_str(), q[l]), detail::region_of(nk.c_str(), k[l])});
    }
    for (index_t l = 0; l < layers; ++l)
        for (index_t r = 0; r < d; ++r) {
            float* dst = out.data + r * out.strides[0] + l * (nq + nk);
            const float* sq = q[static_cast<std::size_t>(l)].ptr(r);
            const float* sk = k[static_cast<std::size_t>(l)].ptr(r);
            for (index_t j = 0; j < nq; ++j) dst[j] = sq[j];
            for (index_t j = 0; j < nk; ++j) dst[nq + j] = sk[j];
        }
}

}  // namespace attnkit
