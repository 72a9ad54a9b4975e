// Argument validation of StaticEmbQK, shared by the projection, its oracle and the per-layer
// views: the layout, the widths of w and qk, overlap, and the layer index.
#pragma once

#include <string>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/memory_overlap.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {

inline std::string layout_string(const embedding_qk_layout& l) {
    return "{layers " + std::to_string(l.layers) + ", heads " + std::to_string(l.heads) + ", heads_kv " +
           std::to_string(l.heads_kv) + ", dim " + std::to_string(l.dim) + "}";
}

// The stacked width layers * (H + Hk) * D, after checking every field (and that the product
// cannot overflow).
inline index_t check_embedding_layout(const embedding_qk_layout& l) {
    if (l.layers < 1 || l.heads < 1 || l.heads_kv < 1 || l.dim < 1)
        fail("layout: layers, heads, heads_kv and dim must all be >= 1, got " + layout_string(l));
    if (l.heads % l.heads_kv != 0)
        fail("layout: heads must be a multiple of heads_kv (GQA), got " + layout_string(l));
    const index_t limit = index_t(1) << 40;  // keeps every product of the width below 2^62
    index_t per_layer = 0, width = 0;
    if (l.heads > limit || l.heads_kv > limit || !mul_fits(l.heads + l.heads_kv, l.dim, per_layer) ||
        !mul_fits(per_layer, l.layers, width) || width > limit)
        fail("layout: layers * (heads + heads_kv) * dim is too large, got " + layout_string(l));
    return width;
}

struct embedding_qk_shape {
    index_t batch, len, d_model, width;
};

// e [B, L, d_model] and w [d_model, width] with width from the layout. T: float (the kernel) or
// double (the oracle).
template <class T>
embedding_qk_shape check_embedding_inputs(const view<const T, 3>& e, const view<const T, 2>& w,
                                          const embedding_qk_layout& layout) {
    const index_t width = check_embedding_layout(layout);
    check_layout("e", e);
    check_layout("w", w);
    const embedding_qk_shape s{e.dims[0], e.dims[1], e.dims[2], width};
    if (w.dims[0] != s.d_model || w.dims[1] != width)
        fail("w: expected [d_model, layers * (heads + heads_kv) * dim] = [" + std::to_string(s.d_model) + ", " +
             std::to_string(width) + "] for e " + shape_string(e) + " and layout " + layout_string(layout) +
             ", got " + shape_string(w));
    return s;
}

// qk (or d_qk) [B, L, width] for e and the layout.
template <class T>
void check_embedding_output(const char* name, const view<T, 3>& qk, const embedding_qk_shape& s,
                            const embedding_qk_layout& layout) {
    check_layout(name, qk);
    if (qk.dims[0] != s.batch || qk.dims[1] != s.len || qk.dims[2] != s.width)
        fail(std::string(name) + ": expected [B, L, layers * (heads + heads_kv) * dim] = [" + std::to_string(s.batch) +
             ", " + std::to_string(s.len) + ", " + std::to_string(s.width) + "] for e [" + std::to_string(s.batch) +
             ", " + std::to_string(s.len) + ", " + std::to_string(s.d_model) + "] and layout " + layout_string(layout) +
             ", got " + shape_string(qk));
}

// e [B, L, d_model], w [d_model, width], qk [B, L, width] with width from the layout.
template <class T>
embedding_qk_shape check_embedding_projection(const view<const T, 3>& e, const view<const T, 2>& w,
                                              const view<T, 3>& qk, const embedding_qk_layout& layout) {
    const embedding_qk_shape s = check_embedding_inputs<T>(e, w, layout);
    check_embedding_output("qk", qk, s, layout);
    check_outputs_apart({region_of("qk", qk)}, {region_of("e", e), region_of("w", w)});
    return s;
}

// The backward's arguments: d_qk of qk's shape, d_e of e's, d_w of w's; the gradients apart
// from each other and from every input.
template <class T>
embedding_qk_shape check_embedding_backward(const view<const T, 3>& e, const view<const T, 2>& w,
                                            const view<const T, 3>& d_qk, const view<T, 3>& d_e,
                                            const view<T, 2>& d_w, const embedding_qk_layout& layout) {
    const embedding_qk_shape s = check_embedding_inputs<T>(e, w, layout);
    check_embedding_output("d_qk", d_qk, s, layout);
    check_layout("d_e", d_e);
    check_shape<T, 3>("d_e", d_e, e.dims, "[B, L, d_model] (the shape of e)");
    check_layout("d_w", d_w);
    check_shape<T, 2>("d_w", d_w, w.dims, "[d_model, layers * (heads + heads_kv) * dim] (the shape of w)");
    check_outputs_apart({region_of("d_e", d_e), region_of("d_w", d_w)},
                        {region_of("e", e), region_of("w", w), region_of("d_qk", d_qk)});
    return s;
}

// qk [B, L, width] must match the layout; 0 <= layer < layers.
template <class T>
void check_embedding_view(const view<T, 3>& qk, const embedding_qk_layout& layout, index_t layer) {
    const index_t width = check_embedding_layout(layout);
    check_layout("qk", qk);
    if (qk.dims[2] != width)
        fail("qk: expected last dimension layers * (heads + heads_kv) * dim = " + std::to_string(width) +
             " for layout " + layout_string(layout) + ", got " + shape_string(qk));
    if (layer < 0 || layer >= layout.layers)
        fail("layer: expected 0 <= layer < layers = " + std::to_string(layout.layers) + ", got " +
             std::to_string(layer));
}

}  // namespace detail
}  // namespace attnkit
