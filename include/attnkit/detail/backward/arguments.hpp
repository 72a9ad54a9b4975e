// The public arguments of softmax_attention_backward as views, named for messages; shared by the
// kernel and the oracle (the views and their names are the only code they share).
#pragma once

#include <tuple>
#include <utility>

#include "attnkit/detail/check.hpp"

namespace attnkit {
namespace detail {

template <class QV, class KV, class VV, class OV, class LV, class DV, class GQ, class GK, class GV>
struct softmax_backward_views {
    QV q;
    KV k;
    VV v;
    OV out;
    LV lse;
    DV d_out;
    GQ d_q;
    GK d_k;
    GV d_v;
};

template <class Q, class K, class V, class O, class L, class DO, class GQ, class GK, class GV>
auto softmax_backward_arguments(const Q& q, const K& k, const V& v, const O& out, const L& lse, const DO& d_out,
                                GQ&& d_q, GK&& d_k, GV&& d_v) {
    auto a = std::make_tuple(q_view(q), k_view(k), v_view(v), input_view<4>("out", out, "[B, Lq, H, Dv]"),
                             input_view<3>("lse", lse, "[B, Lq, H]"), input_view<4>("d_out", d_out, "[B, Lq, H, Dv]"),
                             output_view<4>("d_q", std::forward<GQ>(d_q), "[B, Lq, H, D]"),
                             output_view<4>("d_k", std::forward<GK>(d_k), "[B, Lk, Hk, D]"),
                             output_view<4>("d_v", std::forward<GV>(d_v), "[B, Lk, Hk, Dv]"));
    return std::apply([](auto... x) { return softmax_backward_views<decltype(x)...>{x...}; }, a);
}

}  // namespace detail
}  // namespace attnkit
