// attnkit::reference::embedding_qk_projection: the naive oracle of the StaticEmbQK projection
// (docs/variants.md section 5).
//
//   qk[b, t, c] = sum_k e[b, t, k] * w[k, c]      for every column c of every layer
//
// Plain loops, double accumulation, one output element at a time. Shares only the views and the
// argument validation with the fast projection.
#pragma once

#include <type_traits>

#include "attnkit/detail/embedding_qk/check.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {

// float tensors, or double ones (one type for all: the backward's finite differences).
template <class E, class W, class QK>
void embedding_qk_projection(const E& e, const W& w, QK&& qk, const embedding_qk_layout& layout,
                             thread_pool* = nullptr) {
    using T = detail::scalar_of<E>;
    static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                  "reference::embedding_qk_projection: float or double e");
    const auto ev = detail::input_view<3>("e", e, "[B, L, d_model]");
    const auto wv = detail::input_view<2>("w", w, "[d_model, layers * (heads + heads_kv) * dim]");
    const auto qv = detail::output_view<3>("qk", qk, "[B, L, layers * (heads + heads_kv) * dim]");
    const detail::embedding_qk_shape s = detail::check_embedding_projection<T>(ev, wv, qv, layout);
    for (index_t b = 0; b < s.batch; ++b)
        for (index_t t = 0; t < s.len; ++t)
            for (index_t c = 0; c < s.width; ++c) {
                double acc = 0.0;
                for (index_t k = 0; k < s.d_model; ++k)
                    acc += static_cast<double>(ev(b, t, k)) * static_cast<double>(wv(k, c));
                qv(b, t, c) = static_cast<T>(acc);
            }
}

}  // namespace reference
}  // namespace attnkit
