// The public arguments of softmax_attention_backward as views, named for messages; shared by the
// kernel and the oracle (the views and their names are the only code they share); and the
// gradient checks every q/k/v backward shares.
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

// The gradients of q, k and v of a call of shapes s: d_q [B, Lq, H, D], d_k [B, Lk, Hk, D] and
// d_v [B, Lk, Hk, Dv], each with a contiguous last dimension (every backward entry point whose
// inputs are q, k and v; the overlap checks stay with each, as the inputs differ).
template <class TG>
void check_qkv_gradients(const view<TG, 4>& d_q, const view<TG, 4>& d_k, const view<TG, 4>& d_v,
                         const attention_shape& s) {
    check_layout("d_q", d_q);
    check_shape("d_q", d_q, {s.batch, s.len_q, s.heads, s.dim}, "[B, Lq, H, D]");
    check_layout("d_k", d_k);
    check_shape("d_k", d_k, {s.batch, s.len_k, s.heads_k, s.dim}, "[B, Lk, Hk, D]");
    check_layout("d_v", d_v);
    check_shape("d_v", d_v, {s.batch, s.len_k, s.heads_k, s.dim_v}, "[B, Lk, Hk, Dv]");
}

}  // namespace detail
}  // namespace attnkit
