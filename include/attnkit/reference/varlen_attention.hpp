// attnkit::reference::softmax_attention_varlen and reference::paged_attention: the oracles of the
// packed and paged entry points, written as what they mean: one reference::softmax_attention
// call per sequence (B = 1, that sequence's Lq and Lk, so masks align bottom-right on its own
// lengths), on views of its rows; a paged sequence's keys first copied page by page into a dense
// tensor. Nothing shared with the fast kernels beyond views and the validation of cu_seqlens.
//
//   reference::softmax_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, out[, lse], opts);
//     (k, v also int8_kv of packed values [Tk, Hk, D] and scales [Tk, Hk], dequantised first)
//   reference::paged_attention(q, k_pages, v_pages, kv, out[, lse], opts);
//     q [Tq, H, D], k [Tk, Hk, D], pages [P, page_rows, Hk, D], out [Tq, H, Dv], lse [Tq, H];
//     out and lse float or double.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/paged_attention.hpp"
#include "attnkit/reference/softmax_attention.hpp"

namespace attnkit {
namespace reference {
namespace varlen_impl {

// Rows [r0, r0 + n) of a [T, H, D] view as a [1, n, H, D] view.
template <class T>
view<T, 4> rows(const view<T, 3>& x, index_t r0, index_t n) {
    return view<T, 4>(x.data + r0 * x.strides[0], {1, n, x.dims[1], x.dims[2]},
                      {n * x.strides[0], x.strides[0], x.strides[1], x.strides[2]});
}
template <class T>
view<T, 3> rows(const view<T, 2>& x, index_t r0, index_t n) {
    return view<T, 3>(x.data + r0 * x.strides[0], {1, n, x.dims[1]},
                      {n * x.strides[0], x.strides[0], x.strides[1]});
}

template <class TQ, class TK, class TV, class TO, class TL>
void run(const view<const TQ, 3>& q, const view<const TK, 3>& k, const view<const TV, 3>& v,
         const std::vector<std::int64_t>& cu_q, const std::vector<std::int64_t>& cu_k,
         const view<TO, 3>& out, const view<TL, 2>* lse, const softmax_options& opts) {
    detail::check_cu_seqlens("cu_seqlens_q", cu_q, q.dims[0], "q", shape_string(q));
    detail::check_cu_seqlens("cu_seqlens_k", cu_k, k.dims[0], "k", shape_string(k));
    if (cu_q.size() != cu_k.size())
        detail::fail("cu_seqlens_k: expected as many offsets as cu_seqlens_q");
    for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) {
        const index_t q0 = cu_q[b], nq = cu_q[b + 1] - q0, k0 = cu_k[b], nk = cu_k[b + 1] - k0;
        if (lse) {
            const view<TL, 3> l = rows(*lse, q0, nq);
            reference::softmax_attention(rows(q, q0, nq), rows(k, k0, nk), rows(v, k0, nk),
                                         rows(out, q0, nq), l, opts);
        } else {
            reference::softmax_attention(rows(q, q0, nq), rows(k, k0, nk), rows(v, k0, nk),
                                         rows(out, q0, nq), opts);
        }
    }
}

// Sequence b's keys of a paged cache, copied into a dense [n, Hk, D] tensor of double.
template <class T>
Eigen::Tensor<double, 3, Eigen::RowMajor> gather(const view<const T, 4>& pages, const paged_kv& kv,
                                                 std::size_t b) {
    const index_t n = kv.seq_lengths[b], rows_per_page = pages.dims[1], H = pages.dims[2],
                  D = pages.dims[3];
    Eigen::Tensor<double, 3, Eigen::RowMajor> x(n, H, D);
    for (index_t j = 0; j < n; ++j) {
        const index_t page = kv.block_table[b * static_cast<std::size_t>(kv.pages_per_seq) +
                                            static_cast<std::size_t>(j / rows_per_page)];
        for (index_t h = 0; h < H; ++h)
            for (index_t d = 0; d < D; ++d)
                x(j, h, d) = static_cast<double>(*pages.ptr(page, j % rows_per_page, h, d));
    }
    return x;
}

}  // namespace varlen_impl

template <class Q, class K, class V, class O>
void softmax_attention_varlen(const Q& q, const K& k, const V& v,
                              const std::vector<std::int64_t>& cu_seqlens_q,
                              const std::vector<std::int64_t>& cu_seqlens_k, O&& out,
                              const softmax_options& opts = {}) {
    const auto ov = detail::output_view<3>("out", std::forward<O>(out), "[Tq, H, Dv]");
    using TL = float;
    varlen_impl::run(detail::input_view<3>("q", q, "[Tq, H, D]"),
                     detail::input_view<3>("k", k, "[Tk, Hk, D]"),
                     detail::input_view<3>("v", v, "[Tk, Hk, Dv]"), cu_seqlens_q, cu_seqlens_k, ov,
                     static_cast<const view<TL, 2>*>(nullptr), opts);
}

template <class Q, class K, class V, class O, class L, softmax_impl::enable_if_lse<L> = 0>
void softmax_attention_varlen(const Q& q, const K& k, const V& v,
                              const std::vector<std::int64_t>& cu_seqlens_q,
                              const std::vector<std::int64_t>& cu_seqlens_k, O&& out, L&& lse,
                              const softmax_options& opts = {}) {
    const auto ov = detail::output_view<3>("out", std::forward<O>(out), "[Tq, H, Dv]");
    const auto lv = detail::output_view<2>("lse", std::forward<L>(lse), "[Tq, H]");
    varlen_impl::run(
        detail::input_view<3>("q", q, "[Tq, H, D]"), detail::input_view<3>("k", k, "[Tk, Hk, D]"),
        detail::input_view<3>("v", v, "[Tk, Hk, Dv]"), cu_seqlens_q, cu_seqlens_k, ov, &lv, opts);
}

// int8 K/V, packed (int8_kv of values [Tk, Hk, D] and scales [Tk, Hk]): the values dequantised
// to double, then the oracle above.
namespace varlen_impl {
inline Eigen::Tensor<double, 3, Eigen::RowMajor> dequantised_packed(const char* name, const char* scales_name,
                                                                    const int8_kv& x) {
    const auto d = softmax_impl::dequantised(name, scales_name, x);
    if (d.dimension(0) != 1)
        detail::fail(std::string(name) + ": packed int8 K/V (values [Tk, Hk, D]) expected, got a batch of " +
                     std::to_string(d.dimension(0)));
    Eigen::Tensor<double, 3, Eigen::RowMajor> p(d.dimension(1), d.dimension(2), d.dimension(3));
    std::copy_n(d.data(), p.size(), p.data());
    return p;
}
}  // namespace varlen_impl

template <class Q, class O>
void softmax_attention_varlen(const Q& q, const int8_kv& k, const int8_kv& v,
                              const std::vector<std::int64_t>& cu_seqlens_q,
                              const std::vector<std::int64_t>& cu_seqlens_k, O&& out,
                              const softmax_options& opts = {}) {
    reference::softmax_attention_varlen(q, varlen_impl::dequantised_packed("k", "k.scales", k),
                                        varlen_impl::dequantised_packed("v", "v.scales", v), cu_seqlens_q,
                                        cu_seqlens_k, std::forward<O>(out), opts);
}

template <class Q, class O, class L, softmax_impl::enable_if_lse<L> = 0>
void softmax_attention_varlen(const Q& q, const int8_kv& k, const int8_kv& v,
                              const std::vector<std::int64_t>& cu_seqlens_q,
                              const std::vector<std::int64_t>& cu_seqlens_k, O&& out, L&& lse,
                              const softmax_options& opts = {}) {
    reference::softmax_attention_varlen(q, varlen_impl::dequantised_packed("k", "k.scales", k),
                                        varlen_impl::dequantised_packed("v", "v.scales", v), cu_seqlens_q,
                                        cu_seqlens_k, std::forward<O>(out), std::forward<L>(lse), opts);
}

// Every sequence's keys gathered from the pages, packed, then softmax_attention_varlen above.
template <class Q, class K, class V, class O, class... Rest>
void paged_attention(const Q& q, const K& k_pages, const V& v_pages, const paged_kv& kv, O&& out,
                     Rest&&... rest) {
    const auto kp = detail::input_view<4>("k_pages", k_pages, "[P, page_rows, Hk, D]");
    const auto vp = detail::input_view<4>("v_pages", v_pages, "[P, page_rows, Hk, Dv]");
    const auto q_len =
        detail::check_cu_seqlens("kv.cu_seqlens_q", kv.cu_seqlens_q,
                                 detail::input_view<3>("q", q, "[Tq, H, D]").dims[0], "q", "");
    detail::check_paged_kv(kv, kp, vp, q_len);
    std::vector<std::int64_t> cu_k(1, 0);
    for (const std::int64_t n : kv.seq_lengths) cu_k.push_back(cu_k.back() + n);
    Eigen::Tensor<double, 3, Eigen::RowMajor> k(cu_k.back(), kp.dims[2], kp.dims[3]),
        v(cu_k.back(), vp.dims[2], vp.dims[3]);
    for (std::size_t b = 0; b < q_len.size(); ++b) {
        const auto kb = varlen_impl::gather(kp, kv, b), vb = varlen_impl::gather(vp, kv, b);
        for (index_t j = 0; j < kb.dimension(0); ++j) {
            for (index_t h = 0; h < kb.dimension(1); ++h) {
                for (index_t d = 0; d < kb.dimension(2); ++d) k(cu_k[b] + j, h, d) = kb(j, h, d);
                for (index_t d = 0; d < vb.dimension(2); ++d) v(cu_k[b] + j, h, d) = vb(j, h, d);
            }
        }
    }
    reference::softmax_attention_varlen(q, k, v, kv.cu_seqlens_q, cu_k, std::forward<O>(out),
                                        std::forward<Rest>(rest)...);
}

}  // namespace reference
}  // namespace attnkit
