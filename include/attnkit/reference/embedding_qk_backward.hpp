// attnkit::reference::embedding_qk_projection_backward: the double oracle of the StaticEmbQK
// projection's gradients (qk = e w, so d_e = d_qk w^T and d_w = e^T d_qk, summed over tokens).
//
//   reference::embedding_qk_projection_backward(e, w, d_qk, d_e, d_w, layout);
//
// Plain loops, double accumulation; float or double tensors (one type for all), so that it can
// be checked against finite differences of reference::embedding_qk_projection in double.
#pragma once

#include <type_traits>
#include <utility>

#include "attnkit/reference/embedding_qk.hpp"

namespace attnkit {
namespace reference {

// The oracle of embedding_qk_projection_backward: d_e[b, t, k] = sum_c d_qk[b, t, c] w[k, c],
// d_w[k, c] = sum_{b, t} e[b, t, k] d_qk[b, t, c]; double accumulation, float or double tensors.
template <class E, class W, class DQK, class DE, class DW>
void embedding_qk_projection_backward(const E& e, const W& w, const DQK& d_qk, DE&& d_e, DW&& d_w,
                                      const embedding_qk_layout& layout, thread_pool* = nullptr) {
    using T = detail::scalar_of<E>;
    static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                  "reference::embedding_qk_projection_backward: float or double e");
    const auto ev = detail::input_view<3>("e", e, "[B, L, d_model]");
    const auto wv = detail::input_view<2>("w", w, "[d_model, layers * (heads + heads_kv) * dim]");
    const auto gv = detail::input_view<3>("d_qk", d_qk, "[B, L, layers * (heads + heads_kv) * dim]");
    const auto dev = detail::output_view<3>("d_e", std::forward<DE>(d_e), "[B, L, d_model]");
    const auto dwv = detail::output_view<2>("d_w", std::forward<DW>(d_w), "[d_model, layers * (heads + heads_kv) * dim]");
    const detail::embedding_qk_shape s = detail::check_embedding_backward<T>(ev, wv, gv, dev, dwv, layout);
    for (index_t b = 0; b < s.batch; ++b)
        for (index_t t = 0; t < s.len; ++t)
            for (index_t k = 0; k < s.d_model; ++k) {
                double acc = 0.0;
                for (index_t c = 0; c < s.width; ++c) acc += static_cast<double>(gv(b, t, c)) * static_cast<double>(wv(k, c));
                dev(b, t, k) = static_cast<T>(acc);
            }
    for (index_t k = 0; k < s.d_model; ++k)
        for (index_t c = 0; c < s.width; ++c) {
            double acc = 0.0;
            for (index_t b = 0; b < s.batch; ++b)
                for (index_t t = 0; t < s.len; ++t) acc += static_cast<double>(ev(b, t, k)) * static_cast<double>(gv(b, t, c));
            dwv(k, c) = static_cast<T>(acc);
        }
}

}  // namespace reference
}  // namespace attnkit
