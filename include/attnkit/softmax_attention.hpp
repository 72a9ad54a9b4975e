// Standard softmax attention, the fast kernel (docs/variants.md section 1).
//
//   attnkit::softmax_attention(q, k, v, out, opts);        q [B,Lq,H,D], k [B,Lk,Hk,D], v [B,Lk,Hk,Dv]
//   attnkit::softmax_attention(q, k, v, out, lse, opts);   out [B,Lq,H,Dv], lse [B,Lq,H] (natural log)
//   attnkit::softmax_attention(q, k8, v8, out[, lse], opts); k8, v8: attnkit::int8_kv (int8_kv.hpp)
//   attnkit::merge_partials(out_a, lse_a, out_b, lse_b, out, lse);
//
// Arguments are attnkit::view, row-major Eigen::Tensor or Eigen::TensorMap. All arguments are
// validated before anything is written.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "attnkit/detail/attention_driver.hpp"
#include "attnkit/detail/check.hpp"
#include "attnkit/int8_kv.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {

template <class X>
constexpr bool kIsTensorArg = tensor_traits<std::decay_t<X>>::kIsTensorish;

// Storage types the kernels take: k and v float, bfloat16 or half of one type; q float or that type.
template <class TQ, class TK, class TV>
constexpr bool kIsKernelStorage = simd::kIsStorageType<TK> && std::is_same<TK, TV>::value &&
                                  (std::is_same<TQ, float>::value || std::is_same<TQ, TK>::value);
// ... and float outputs (out, lse).
template <class TQ, class TK, class TV, class TO, class TL>
constexpr bool kIsAttentionStorage =
    kIsKernelStorage<TQ, TK, TV> && std::is_same<TO, float>::value && std::is_same<TL, float>::value;

template <class A, class TQ, class TK, class TV>
void softmax_attention_run(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
                           const view<float, 4>& out, const view<float, 3>* lse, const softmax_options& opts,
                           const sequence_frame* frame = nullptr) {
    const attention_shape s = check_qkv(q, k, v);
    check_max_keys("k", s.len_k, "keys per call (split longer caches and merge_partials)", "Lk", k);
    check_out("out", out, s);
    if (lse) check_lse("lse", *lse, s);
    check_options(opts, s);
    check_attention_memory(q, k, v, out, lse);

    forward_outputs fo;
    fo.out = out;
    if (lse) fo.lse = *lse;
    fo.sinks = opts.sinks.empty() ? nullptr : opts.sinks.data();
    auto p = make_problem(q, k, v, s, opts);
    if (frame) in_sequence(p, *frame, opts);
    attention_forward<A>(p, fo, opts.pool);
}

// The static_assert is the only diagnostic of a wrong element type (double q with float k, a
// double out, ...): the kernel is not instantiated for it, so no second error follows from
// inside the engine.
template <class A, class TQ, class TK, class TV, class TO, class TL>
void softmax_attention_impl(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TV, 4>& v,
                            const view<TO, 4>& out, const view<TL, 3>* lse, const softmax_options& opts) {
    constexpr bool kStorage = kIsAttentionStorage<TQ, TK, TV, TO, TL>;
    static_assert(kStorage,
                  "attnkit::softmax_attention: k and v must be float, Eigen::bfloat16 or Eigen::half tensors of one "
                  "type, q float or that type, out and lse float (double is for attnkit::reference)");
    if constexpr (kStorage) softmax_attention_run<A>(q, k, v, out, lse, opts);
}

// int8 K/V: the forward of every other storage type, with the scales' rows in the problem.
template <class A>
void softmax_attention_int8_run(const view<const float, 4>& q, const int8_kv& k, const int8_kv& v,
                                const view<float, 4>& out, const view<float, 3>* lse, const softmax_options& opts) {
    const attention_shape s = check_qkv(q, k.values(), v.values());
    check_max_keys("k", s.len_k, "keys per call (split longer caches and merge_partials)", "Lk", k.values());
    check_out("out", out, s);
    if (lse) check_lse("lse", *lse, s);
    check_options(opts, s);
    check_attention_memory(q, k.values(), v.values(), out, lse);
    check_outputs_apart({region_of("out", out), lse ? region_of("lse", *lse) : memory_region{}},
                        {region_of("k.scales", k.scales()), region_of("v.scales", v.scales())});
    check_kv_scales("k.scales", k.scales(), s.batch, s.len_k, s.heads_k);
    check_kv_scales("v.scales", v.scales(), s.batch, s.len_k, s.heads_k);

    forward_outputs fo;
    fo.out = out;
    if (lse) fo.lse = *lse;
    fo.sinks = opts.sinks.empty() ? nullptr : opts.sinks.data();
    auto p = make_problem(q, k.values(), v.values(), s, opts);
    p.k_scale = scale_rows_of(k.scales());
    p.v_scale = scale_rows_of(v.scales());
    attention_forward<A>(p, fo, opts.pool);
}

template <class A, class TQ, class TO, class TL>
void softmax_attention_int8_impl(const view<const TQ, 4>& q, const int8_kv& k, const int8_kv& v,
                                 const view<TO, 4>& out, const view<TL, 3>* lse, const softmax_options& opts) {
    constexpr bool kStorage =
        std::is_same<TQ, float>::value && std::is_same<TO, float>::value && std::is_same<TL, float>::value;
    static_assert(kStorage, "attnkit::softmax_attention with int8 K/V: q, out and lse must be float tensors");
    if constexpr (kStorage) softmax_attention_int8_run<A>(q, k, v, out, lse, opts);
}

}  // namespace detail

template <class Q, class K, class V, class O>
void softmax_attention(const Q& q, const K& k, const V& v, O&& out, const softmax_options& opts = {}) {
    detail::softmax_attention_impl<simd::default_arch>(detail::q_view(q), detail::k_view(k), detail::v_view(v),
                                                       detail::out_view(out),
                                                       static_cast<const view<float, 3>*>(nullptr), opts);
}

template <class Q, class K, class V, class O, class L,
          std::enable_if_t<detail::kIsLseArg<L, softmax_options>, int> = 0>
void softmax_attention(const Q& q, const K& k, const V& v, O&& out, L&& lse, const softmax_options& opts = {}) {
    const auto lse_v = detail::lse_view(lse);
    detail::softmax_attention_impl<simd::default_arch>(detail::q_view(q), detail::k_view(k), detail::v_view(v),
                                                       detail::out_view(out), &lse_v, opts);
}

// int8 K/V (int8_kv.hpp): values and row scales, dequantised in the kernels' loads.
template <class Q, class O>
void softmax_attention(const Q& q, const int8_kv& k, const int8_kv& v, O&& out, const softmax_options& opts = {}) {
    detail::softmax_attention_int8_impl<simd::default_arch>(detail::q_view(q), k, v, detail::out_view(out),
                                                            static_cast<const view<float, 3>*>(nullptr), opts);
}

template <class Q, class O, class L, std::enable_if_t<detail::kIsLseArg<L, softmax_options>, int> = 0>
void softmax_attention(const Q& q, const int8_kv& k, const int8_kv& v, O&& out, L&& lse,
                       const softmax_options& opts = {}) {
    const auto lse_v = detail::lse_view(lse);
    detail::softmax_attention_int8_impl<simd::default_arch>(detail::q_view(q), k, v, detail::out_view(out), &lse_v,
                                                            opts);
}

namespace detail {

// merge_partials on float views (below).
inline void merge_partials_run(const view<const float, 4>& oa, const view<const float, 3>& la,
                               const view<const float, 4>& ob, const view<const float, 3>& lb, const view<float, 4>& o,
                               const view<float, 3>& l) {
    attention_shape s{oa.dims[0], oa.dims[1], 0, oa.dims[2], oa.dims[2], 1, oa.dims[3]};
    check_out("out_a", oa, s);
    check_out("out_b", ob, s);
    check_out("out", o, s);
    check_lse("lse_a", la, s);
    check_lse("lse_b", lb, s);
    check_lse("lse", l, s);
    constexpr unsigned kOut = 1, kLse = 2;  // row by row: each row is read before it is written
    check_outputs_apart({in_place(region_of("out", o), kOut), in_place(region_of("lse", l), kLse)},
                        {in_place(region_of("out_a", oa), kOut), in_place(region_of("out_b", ob), kOut),
                         in_place(region_of("lse_a", la), kLse), in_place(region_of("lse_b", lb), kLse)});
    std::vector<float> row(static_cast<std::size_t>(s.dim_v));
    for (index_t b = 0; b < s.batch; ++b)
        for (index_t i = 0; i < s.len_q; ++i)
            for (index_t h = 0; h < s.heads; ++h) {
                const float* pa = oa.ptr(b, i, h);
                std::copy(pa, pa + s.dim_v, row.begin());
                float lse_v = la(b, i, h);
                merge_row(row.data(), lse_v, ob.ptr(b, i, h), lb(b, i, h), s.dim_v);
                if (lse_v == kNegInf) std::fill(row.begin(), row.end(), 0.0f);  // nothing visible
                std::copy(row.begin(), row.end(), o.ptr(b, i, h));
                l(b, i, h) = lse_v;
            }
}

}  // namespace detail

// Exact merge of two attention results over disjoint key sets (split-KV decode, ring attention):
// lse = log(exp(lse_a) + exp(lse_b)), out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b, with
// weights that sum to 1 at any lse (detail/lse_merge.hpp). A side with lse = -inf (no visible
// key) contributes nothing, both at -inf give out = 0 and lse = -inf; a side at +inf outweighs a
// finite one, and both at +inf give the mean of out_a and out_b with lse = +inf; NaN in an lse
// gives NaN. All float; lse views take any strides.
// out may be the very same view as out_a or out_b, and lse as lse_a or lse_b (in place); any
// other sharing of memory between an output and an argument is rejected.
template <class OA, class LA, class OB, class LB, class O, class L>
void merge_partials(const OA& out_a, const LA& lse_a, const OB& out_b, const LB& lse_b, O&& out, L&& lse) {
    const auto oa = detail::input_view<4>("out_a", out_a, "[B, Lq, H, Dv]");
    const auto la = detail::input_view<3>("lse_a", lse_a, "[B, Lq, H]");
    const auto ob = detail::input_view<4>("out_b", out_b, "[B, Lq, H, Dv]");
    const auto lb = detail::input_view<3>("lse_b", lse_b, "[B, Lq, H]");
    const auto o = detail::out_view(out);
    const auto l = detail::lse_view(lse);
    ATTNKIT_IF_FLOAT("attnkit::merge_partials: every argument must be a float tensor", oa, la, ob, lb, o, l)
        detail::merge_partials_run(oa, la, ob, lb, o, l);
}

}  // namespace attnkit
