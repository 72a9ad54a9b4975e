// The backward pass of standard softmax attention (FlashAttention-2's algorithm, fused).
//
//   attnkit::softmax_attention(q, k, v, out, lse, opts);              // forward, keep out and lse
//   // ... loss, and d_out = dloss / dout [B, Lq, H, Dv] ...
//   attnkit::softmax_attention_backward(q, k, v, out, lse, d_out, d_q, d_k, d_v, opts);
//   attnkit::softmax_attention_backward(q, k, v, out, lse, d_out, d_q, d_k, d_v, d_sinks, opts);
//
// The options are the forward's, unchanged (every mask, key_lengths, scale, softcap, sinks, GQA,
// pool). d_q [B, Lq, H, D], d_k [B, Lk, Hk, D], d_v [B, Lk, Hk, Dv] (and d_sinks [H], only with
// opts.sinks) are float and overwritten; d_k and d_v sum over the query heads that share a
// key/value head. q, k, v as the forward takes them (float; k and v bfloat16 or half with q
// float or that type); out, lse and d_out float. No L x L matrix is formed: P is recomputed
// tile by tile from lse (detail/backward/tile_kernel.hpp), extra memory is O(L D) per thread,
// and the results are bitwise identical for any thread count.
//
// A row with no visible key (lse = -inf) contributes nothing. A NaN or Inf in one row's inputs
// stays in the gradients that depend on that row. Bad input (shapes that do not match the
// forward's, gradients that overlap each other or an input, d_sinks without sinks) throws
// std::invalid_argument naming the argument, before anything is written.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnkit/detail/backward/arguments.hpp"
#include "attnkit/detail/backward/tile_kernel.hpp"
#include "attnkit/softmax_attention.hpp"

namespace attnkit {
namespace detail {

template <class A, class TQ, class TK, class TV>
void softmax_attention_backward_run(const view<const TQ, 4>& q, const view<const TK, 4>& k,
                                    const view<const TV, 4>& v, const view<const float, 4>& out,
                                    const view<const float, 3>& lse, const view<const float, 4>& d_out,
                                    const view<float, 4>& d_q, const view<float, 4>& d_k, const view<float, 4>& d_v,
                                    const view<float, 1>* d_sinks, const softmax_options& opts,
                                    const sequence_frame* frame = nullptr) {
    const attention_shape s = check_qkv(q, k, v);
    check_max_keys("k", s.len_k, "keys per call (split longer caches and merge_partials)", "Lk", k);
    check_out("out", out, s);
    check_lse("lse", lse, s);
    check_out("d_out", d_out, s);
    check_qkv_gradients(d_q, d_k, d_v, s);
    check_options(opts, s);
    if (d_sinks) {
        if (opts.sinks.empty())
            fail("d_sinks: given, but opts.sinks is empty (no sinks, no gradient for them); d_sinks " +
                 shape_string(*d_sinks));
        check_extent("d_sinks", *d_sinks);
        check_shape("d_sinks", *d_sinks, {s.heads}, "[H]");
    }
    check_outputs_apart({region_of("d_q", d_q), region_of("d_k", d_k), region_of("d_v", d_v),
                         d_sinks ? region_of("d_sinks", *d_sinks) : memory_region{}},
                        {region_of("q", q), region_of("k", k), region_of("v", v), region_of("out", out),
                         region_of("lse", lse), region_of("d_out", d_out)});

    auto p = make_problem(q, k, v, s, opts);
    if (frame) in_sequence(p, *frame, opts);
    backward::softmax_grad_rows pol;
    pol.softcap = p.tf.softcap;
    backward::gradient_outputs go{d_q, d_k, d_v};
    const float scale = resolve_scale(opts.scale, s.dim);
    go.dq_scale = scale;
    go.dk_scale = scale / p.q_scale;

    // Row statistics: lse in log2 units (+inf where no key is visible: P = 0 there) and
    // D_r = <dO_r, O_r>; the sinks' gradient from the same D_r, per (b, h), summed over b below.
    const index_t G = s.group(), H = s.heads;
    const bool sinks = !opts.sinks.empty();
    std::vector<double> sink_part(sinks ? static_cast<std::size_t>(s.batch * H) : 0, 0.0);
    const strided_rows_t<float> dout = rows_of(d_out);
    auto stats = [&](index_t b, index_t hk, float* a, float* dr) {
        for (index_t i = 0; i < s.len_q; ++i)
            for (index_t g = 0; g < G; ++g) {
                const index_t r = i * G + g, h = hk * G + g;
                const float l = lse(b, i, h);
                a[r] = l == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::infinity()
                                                                     : l * simd::kLog2e;
                const float* o = out.ptr(b, i, h);
                const float* dO = d_out.ptr(b, i, h);
                float acc = 0.0f;
                for (index_t c = 0; c < s.dim_v; ++c) acc += dO[c] * o[c];
                dr[r] = acc;
                if (sinks && l != -std::numeric_limits<float>::infinity()) {
                    const double ps = std::exp(static_cast<double>(opts.sinks[static_cast<std::size_t>(h)]) -
                                               static_cast<double>(l));
                    sink_part[static_cast<std::size_t>(b * H + h)] -= ps * static_cast<double>(acc);
                }
            }
    };
    backward::attention_backward<A>(p, pol, dout, stats, go, opts.pool);
    if (d_sinks)
        for (index_t h = 0; h < H; ++h) {
            double acc = 0.0;
            for (index_t b = 0; b < s.batch; ++b) acc += sink_part[static_cast<std::size_t>(b * H + h)];
            (*d_sinks)(h) = static_cast<float>(acc);
        }
}

template <class A, class TQ, class TK, class TV, class TO, class TL, class TD, class TG, class TS>
void softmax_attention_backward_impl(const view<const TQ, 4>& q, const view<const TK, 4>& k,
                                     const view<const TV, 4>& v, const view<const TO, 4>& out,
                                     const view<const TL, 3>& lse, const view<const TD, 4>& d_out,
                                     const view<TG, 4>& d_q, const view<TG, 4>& d_k, const view<TG, 4>& d_v,
                                     const view<TS, 1>* d_sinks, const softmax_options& opts) {
    constexpr bool kStorage = kIsKernelStorage<TQ, TK, TV> && std::is_same<TO, float>::value &&
                              std::is_same<TL, float>::value && std::is_same<TD, float>::value &&
                              std::is_same<TG, float>::value && std::is_same<TS, float>::value;
    static_assert(kStorage,
                  "attnkit::softmax_attention_backward: k and v must be float, Eigen::bfloat16 or Eigen::half "
                  "tensors of one type, q float or that type; out, lse, d_out and every gradient float (double "
                  "is for attnkit::reference)");
    if constexpr (kStorage) softmax_attention_backward_run<A>(q, k, v, out, lse, d_out, d_q, d_k, d_v, d_sinks, opts);
}

}  // namespace detail

template <class Q, class K, class V, class O, class L, class DO, class GQ, class GK, class GV>
void softmax_attention_backward(const Q& q, const K& k, const V& v, const O& out, const L& lse, const DO& d_out,
                                GQ&& d_q, GK&& d_k, GV&& d_v, const softmax_options& opts = {}) {
    const auto a = detail::softmax_backward_arguments(q, k, v, out, lse, d_out, std::forward<GQ>(d_q),
                                                      std::forward<GK>(d_k), std::forward<GV>(d_v));
    using TG = typename decltype(a.d_q)::value_type;
    detail::softmax_attention_backward_impl<simd::default_arch>(a.q, a.k, a.v, a.out, a.lse, a.d_out, a.d_q, a.d_k,
                                                                a.d_v, static_cast<const view<TG, 1>*>(nullptr), opts);
}

// The same, also writing the sinks' gradient d_sinks [H] (opts.sinks must be set).
template <class Q, class K, class V, class O, class L, class DO, class GQ, class GK, class GV, class GS,
          std::enable_if_t<detail::kIsLseArg<GS, softmax_options>, int> = 0>
void softmax_attention_backward(const Q& q, const K& k, const V& v, const O& out, const L& lse, const DO& d_out,
                                GQ&& d_q, GK&& d_k, GV&& d_v, GS&& d_sinks, const softmax_options& opts = {}) {
    const auto a = detail::softmax_backward_arguments(q, k, v, out, lse, d_out, std::forward<GQ>(d_q),
                                                      std::forward<GK>(d_k), std::forward<GV>(d_v));
    const auto gs = detail::output_view<1>("d_sinks", std::forward<GS>(d_sinks), "[H]");
    detail::softmax_attention_backward_impl<simd::default_arch>(a.q, a.k, a.v, a.out, a.lse, a.d_out, a.d_q, a.d_k,
                                                                a.d_v, &gs, opts);
}

}  // namespace attnkit
