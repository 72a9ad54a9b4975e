// The public arguments of taylor_attention_backward as named views, and their validation; shared
// by the fast kernel (taylor_attention_backward.hpp) and the oracle
// (reference/taylor_attention_backward.hpp): the views, their names and the checks are the only
// code the two share.
//
// Everything the forward rejects (shapes, layouts, options), plus: out and d_out [B, Lq, H, Dv],
// d_q [B, Lq, H, D], d_k [B, Lk, Hk, D], d_v [B, Lk, Hk, Dv], and no gradient overlapping another
// gradient or any input. Each failure throws std::invalid_argument naming the argument and the
// shapes, before anything is written.
#pragma once

#include <array>
#include <tuple>
#include <utility>

#include "attnkit/detail/backward/arguments.hpp"
#include "attnkit/detail/check.hpp"
#include "attnkit/detail/memory_overlap.hpp"
#include "attnkit/detail/taylor/check.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

template <class QV, class KV, class VV, class OV, class DV, class GQ, class GK, class GV>
struct backward_views {
    QV q;
    KV k;
    VV v;
    OV out;
    DV d_out;
    GQ d_q;
    GK d_k;
    GV d_v;
};

template <class Q, class K, class V, class O, class DO, class GQ, class GK, class GV>
auto backward_arguments(const Q& q, const K& k, const V& v, const O& out, const DO& d_out, GQ&& d_q, GK&& d_k,
                        GV&& d_v) {
    auto a = std::make_tuple(q_view(q), k_view(k), v_view(v), input_view<4>("out", out, "[B, Lq, H, Dv]"),
                             input_view<4>("d_out", d_out, "[B, Lq, H, Dv]"),
                             output_view<4>("d_q", std::forward<GQ>(d_q), "[B, Lq, H, D]"),
                             output_view<4>("d_k", std::forward<GK>(d_k), "[B, Lk, Hk, D]"),
                             output_view<4>("d_v", std::forward<GV>(d_v), "[B, Lk, Hk, Dv]"));
    return std::apply([](auto... x) { return backward_views<decltype(x)...>{x...}; }, a);
}

// The whole call: returns the shapes.
template <class TQ, class TK, class TV, class TO, class TD, class TG>
attention_shape check_backward_call(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v,
                                    const view<TO, 4>& out, const view<TD, 4>& d_out, const view<TG, 4>& d_q,
                                    const view<TG, 4>& d_k, const view<TG, 4>& d_v, const taylor_options& opts) {
    const attention_shape s = check_qkv(q, k, v);
    check_out("out", out, s);
    check_out("d_out", d_out, s);
    check_qkv_gradients(d_q, d_k, d_v, s);
    check_options(opts, s);
    check_outputs_apart({region_of("d_q", d_q), region_of("d_k", d_k), region_of("d_v", d_v)},
                        {region_of("q", q), region_of("k", k), region_of("v", v), region_of("out", out),
                         region_of("d_out", d_out)});
    return s;
}

}  // namespace taylor
}  // namespace detail
}  // namespace attnkit
