// Test helpers: tensors, views over other layouts, index iteration. Header-only, test code only.
//
//   tensor4<T>, tensor3<T>                 row-major Eigen tensors (T defaults to float)
//   make_bshd(B, L, H, D[, fill])          a [B, L, H, D] tensor filled with `fill` (0)
//   make_lse(B, L, H[, fill])              a [B, L, H] tensor
//   as_view(x) / as_mutable_view(x)        attnkit::view<const S, N> / view<S, N> of any view,
//                                          row-major Tensor or TensorMap
//   at(view, idx)                          element at a std::array multi-index
//   for_each_index<N>(dims, f)             calls f(const std::array<index_t, N>&) in row-major
//   order bhld_as_bshd(ptr, B, H, L, D)          a [B, H, L, D] buffer seen as BSHD (permuted
//   strides) fused_qkv_views(ptr, B, L, H, D)       a [B, L, 3, H, D] buffer as three BSHD views
//   fused_qkv_views(ptr, B, L, H, Hk, D)   a [B, L, H + 2*Hk, D] buffer (GQA packing) as q, k, v
//   fill(x, value)                         sets every element (strided views too)
//   to_double(x)                           a double copy (Tensor<double, N, RowMajor>) of x
//   max_abs(x)                             max |element| (NaN ignored; 0 for an empty tensor)
//   outputs_for<T>(q, v, fill)             out [B, Lq, H, Dv] and lse [B, Lq, H] for q and v
//   sequence_view(x, t0, n)                positions [t0, t0 + n) of a [B, L, H, D] tensor as a
//                                          view into it (no copy: x's strides)
//   sequence_rows(x, t0, n)                the same positions as a dense tensor of their own
//   stored_as<T>(x) / widened(x)           x rounded to a 16-bit type T / back to float (exact)
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced

#include "attnkit/view.hpp"

namespace attnkit_test {

using attnkit::index_t;

template <class T = float>
using tensor4 = Eigen::Tensor<T, 4, Eigen::RowMajor>;
template <class T = float>
using tensor3 = Eigen::Tensor<T, 3, Eigen::RowMajor>;

template <class X>
constexpr int rank_of = attnkit::detail::tensor_traits<std::decay_t<X>>::kRank;

template <class T = float>
tensor4<T> make_bshd(index_t B, index_t L, index_t H, index_t D, T fill_value = T(0)) {
    tensor4<T> t(B, L, H, D);
    t.setConstant(fill_value);
    return t;
}

template <class T = float>
tensor3<T> make_lse(index_t B, index_t L, index_t H, T fill_value = T(0)) {
    tensor3<T> t(B, L, H);
    t.setConstant(fill_value);
    return t;
}

template <class X>
auto as_view(const X& x) {
    return attnkit::detail::input_view<rank_of<X>>("x", x, "");
}

template <class X>
auto as_mutable_view(X&& x) {
    return attnkit::detail::output_view<rank_of<X>>("x", std::forward<X>(x), "");
}

// The outputs of an attention call on q [B, Lq, H, D] and v [B, Lk, Hk, Dv], pre-filled (a
// sentinel or NaN shows an element the call forgot to write).
template <class T>
struct attention_outputs {
    tensor4<T> out;
    tensor3<T> lse;
};

template <class T, class Q, class V>
attention_outputs<T> outputs_for(const Q& q, const V& v, T fill) {
    const auto qv = as_view(q);
    const auto vv = as_view(v);
    return {make_bshd<T>(qv.dims[0], qv.dims[1], qv.dims[2], vv.dims[3], fill),
            make_lse<T>(qv.dims[0], qv.dims[1], qv.dims[2], fill)};
}

template <class T, int N, std::size_t M>
T& at(const attnkit::view<T, N>& v, const std::array<index_t, M>& idx) {
    static_assert(static_cast<std::size_t>(N) == M, "at: one index per dimension");
    index_t off = 0;
    for (int i = 0; i < N; ++i) off += idx[i] * v.strides[i];
    return v.data[off];
}

template <int N, class F>
void for_each_index(const std::array<index_t, N>& dims, F&& f) {
    for (int i = 0; i < N; ++i)
        if (dims[i] <= 0) return;
    std::array<index_t, N> idx{};
    for (;;) {
        f(static_cast<const std::array<index_t, N>&>(idx));
        int d = N - 1;
        while (d >= 0 && ++idx[d] == dims[d]) idx[d--] = 0;
        if (d < 0) return;
    }
}

// Positions [t0, t0 + n) of a [B, L, H, D] tensor: a key range to merge, the tokens of one
// decode step. sequence_view aliases x; sequence_rows copies into a dense tensor (an output, or
// an argument a step may overwrite in place).
template <class T>
attnkit::view<const T, 4> sequence_view(const Eigen::Tensor<T, 4, Eigen::RowMajor>& x, index_t t0, index_t n) {
    const index_t L = x.dimension(1), H = x.dimension(2), D = x.dimension(3);
    return attnkit::view<const T, 4>(x.data() + t0 * H * D, {x.dimension(0), n, H, D}, {L * H * D, H * D, D, 1});
}

template <class T>
Eigen::Tensor<T, 4, Eigen::RowMajor> sequence_rows(const Eigen::Tensor<T, 4, Eigen::RowMajor>& x, index_t t0,
                                                   index_t n) {
    const attnkit::view<const T, 4> s = sequence_view(x, t0, n);
    Eigen::Tensor<T, 4, Eigen::RowMajor> y(s.dims[0], n, s.dims[2], s.dims[3]);
    for (index_t b = 0; b < s.dims[0]; ++b)
        for (index_t t = 0; t < n; ++t)
            for (index_t h = 0; h < s.dims[2]; ++h)
                for (index_t d = 0; d < s.dims[3]; ++d) y(b, t, h, d) = *s.ptr(b, t, h, d);
    return y;
}

// x rounded to a 16-bit storage type T, and such a tensor widened back to float (exact). Element
// by element: Eigen's vectorised cast would pull its own AVX-512 conversion code into the test,
// with GCC 12's false -Wmaybe-uninitialized in it.
template <class T>
tensor4<T> stored_as(const tensor4<float>& x) {
    tensor4<T> y(x.dimensions());
    for (index_t i = 0; i < x.size(); ++i) y.data()[i] = T(x.data()[i]);
    return y;
}
template <class T>
tensor4<float> widened(const tensor4<T>& x) {
    tensor4<float> y(x.dimensions());
    for (index_t i = 0; i < x.size(); ++i) y.data()[i] = static_cast<float>(x.data()[i]);
    return y;
}

// A [B, H, L, D] row-major buffer seen as BSHD: dims [B, L, H, D], strides permuted.
template <class T>
attnkit::view<T, 4> bhld_as_bshd(T* data, index_t B, index_t H, index_t L, index_t D) {
    return attnkit::view<T, 4>(data, {B, L, H, D}, {H * L * D, D, L * D, 1});
}

template <class T>
struct qkv_views {
    attnkit::view<T, 4> q, k, v;
};

// A fused projection buffer [B, L, H + 2*Hk, D] (q heads, then k heads, then v heads) as three
// BSHD views without copies.
template <class T>
qkv_views<T> fused_qkv_views(T* data, index_t B, index_t L, index_t H, index_t Hk, index_t D) {
    const index_t row = (H + 2 * Hk) * D;
    const std::array<index_t, 4> sq{L * row, row, D, 1};
    return {attnkit::view<T, 4>(data, {B, L, H, D}, sq),
            attnkit::view<T, 4>(data + H * D, {B, L, Hk, D}, sq),
            attnkit::view<T, 4>(data + (H + Hk) * D, {B, L, Hk, D}, sq)};
}

// A fused QKV buffer [B, L, 3, H, D] as three BSHD views.
template <class T>
qkv_views<T> fused_qkv_views(T* data, index_t B, index_t L, index_t H, index_t D) {
    return fused_qkv_views(data, B, L, H, H, D);
}

template <class X, class V>
void fill(X&& x, V value) {
    auto v = as_mutable_view(std::forward<X>(x));
    using S = typename decltype(v)::value_type;
    for_each_index<rank_of<X>>(v.dims,
                               [&](const auto& idx) { at(v, idx) = static_cast<S>(value); });
}

template <class X>
Eigen::Tensor<double, rank_of<X>, Eigen::RowMajor> to_double(const X& x) {
    constexpr int N = rank_of<X>;
    const auto v = as_view(x);
    Eigen::Tensor<double, N, Eigen::RowMajor> t;
    std::array<Eigen::Index, N> d{};
    for (int i = 0; i < N; ++i) d[i] = static_cast<Eigen::Index>(v.dims[i]);
    t.resize(d);
    auto tv = as_mutable_view(t);
    for_each_index<N>(v.dims,
                      [&](const auto& idx) { at(tv, idx) = static_cast<double>(at(v, idx)); });
    return t;
}

template <class X>
double max_abs(const X& x) {
    const auto v = as_view(x);
    double m = 0.0;
    for_each_index<rank_of<X>>(v.dims, [&](const auto& idx) {
        const double a = std::fabs(static_cast<double>(at(v, idx)));
        if (a > m) m = a;
    });
    return m;
}

}  // namespace attnkit_test
