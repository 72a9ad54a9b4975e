// attnkit::view<T, N>: a non-owning strided view (pointer, dims, strides in elements).
//
// Kernels take .data() and strides once from a view and never touch Eigen expressions, which
// keeps compile times low and lets [B,H,L,D] buffers or fused QKV buffers be used without copies.
#pragma once

#include <array>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <unsupported/Eigen/CXX11/Tensor>

#include "attnkit/config.hpp"

namespace attnkit {

template <class T, int N>
struct view {
    static_assert(N >= 1, "attnkit::view needs rank >= 1");
    using element_type = T;
    using value_type = std::remove_const_t<T>;
    static constexpr int kRank = N;

    T* data = nullptr;
    std::array<index_t, N> dims{};
    std::array<index_t, N> strides{};

    view() = default;

    // Explicit construction from raw memory; strides are in elements, not bytes.
    view(T* ptr, const std::array<index_t, N>& d, const std::array<index_t, N>& s)
        : data(ptr), dims(d), strides(s) {}

    // Dense row-major view over raw memory.
    view(T* ptr, const std::array<index_t, N>& d) : data(ptr), dims(d) {
        index_t s = 1;
        for (int i = N - 1; i >= 0; --i) {
            strides[i] = s;
            s *= d[i];
        }
    }

    // A mutable view converts to a const view.
    template <class U, std::enable_if_t<std::is_same<const U, T>::value && !std::is_same<U, T>::value, int> = 0>
    view(const view<U, N>& o) : data(o.data), dims(o.dims), strides(o.strides) {}

    // Implicit from row-major Eigen tensors and maps. Column-major tensors are rejected at
    // compile time: silently transposing a layout is the bug this library refuses to have.
    template <class Scalar, int Options, class Index,
              std::enable_if_t<std::is_same<std::remove_const_t<T>, Scalar>::value, int> = 0>
    view(Eigen::Tensor<Scalar, N, Options, Index>& t) : view(t.data(), dims_of(t)) {
        static_assert(Options & Eigen::RowMajor, "attnkit needs Eigen::RowMajor tensors");
    }
    template <class Scalar, int Options, class Index,
              std::enable_if_t<std::is_same<T, const Scalar>::value, int> = 0>
    view(const Eigen::Tensor<Scalar, N, Options, Index>& t) : view(t.data(), dims_of(t)) {
        static_assert(Options & Eigen::RowMajor, "attnkit needs Eigen::RowMajor tensors");
    }
    template <class Scalar, int Options, class Index, int MapOptions, template <class> class MakePointer,
              std::enable_if_t<std::is_same<std::remove_const_t<T>, std::remove_const_t<Scalar>>::value &&
                                   (std::is_const<T>::value || !std::is_const<Scalar>::value),
                               int> = 0>
    view(const Eigen::TensorMap<Eigen::Tensor<Scalar, N, Options, Index>, MapOptions, MakePointer>& t)
        : view(const_cast<T*>(t.data()), dims_of(t)) {
        static_assert(Options & Eigen::RowMajor, "attnkit needs Eigen::RowMajor tensors");
    }

    index_t dim(int i) const { return dims[i]; }
    index_t dimension(int i) const { return dims[i]; }  // Eigen's spelling, for generic code
    index_t stride(int i) const { return strides[i]; }
    index_t size() const {
        index_t s = 1;
        for (int i = 0; i < N; ++i) s *= dims[i];
        return s;
    }

    template <class... I>
    T* ptr(I... idx) const {
        static_assert(sizeof...(I) <= N, "too many indices");
        const index_t ix[] = {static_cast<index_t>(idx)..., 0};
        index_t off = 0;
        for (std::size_t i = 0; i < sizeof...(I); ++i) off += ix[i] * strides[i];
        return data + off;
    }
    template <class... I>
    T& operator()(I... idx) const {
        static_assert(sizeof...(I) == N, "operator() needs one index per dimension");
        return *ptr(idx...);
    }

   private:
    template <class Tensorish>
    static std::array<index_t, N> dims_of(const Tensorish& t) {
        std::array<index_t, N> d{};
        for (int i = 0; i < N; ++i) d[i] = static_cast<index_t>(t.dimension(i));
        return d;
    }
};

// "[2, 7, 4, 64]" for error messages.
template <class T, int N>
std::string shape_string(const view<T, N>& v) {
    std::string s = "[";
    for (int i = 0; i < N; ++i) {
        if (i) s += ", ";
        s += std::to_string(v.dims[i]);
    }
    return s + "]";
}

namespace detail {

template <class X>
struct tensor_traits {
    static constexpr bool kIsTensorish = false;
};
template <class T, int N>
struct tensor_traits<view<T, N>> {
    static constexpr bool kIsTensorish = true;
    static constexpr bool kRowMajor = true;
    static constexpr int kRank = N;
    using element = T;
};
template <class S, int N, int O, class I>
struct tensor_traits<Eigen::Tensor<S, N, O, I>> {
    static constexpr bool kIsTensorish = true;
    static constexpr bool kRowMajor = (O & Eigen::RowMajor) != 0;
    static constexpr int kRank = N;
    using element = S;
};
template <class S, int N, int O, class I, int MO, template <class> class MP>
struct tensor_traits<Eigen::TensorMap<Eigen::Tensor<S, N, O, I>, MO, MP>> {
    static constexpr bool kIsTensorish = true;
    static constexpr bool kRowMajor = (O & Eigen::RowMajor) != 0;
    static constexpr int kRank = N;
    using element = S;
};

template <class S, int N, int O, class I, int MO, template <class> class MP>
struct tensor_traits<Eigen::TensorMap<const Eigen::Tensor<S, N, O, I>, MO, MP>> {
    static constexpr bool kIsTensorish = true;
    static constexpr bool kRowMajor = (O & Eigen::RowMajor) != 0;
    static constexpr int kRank = N;
    using element = const S;
};

template <class X>
auto dims_of(const X& x) {
    constexpr int N = tensor_traits<std::decay_t<X>>::kRank;
    std::array<index_t, N> d{};
    for (int i = 0; i < N; ++i) d[i] = static_cast<index_t>(x.dimension(i));
    return d;
}

template <class X>
using scalar_of = std::remove_const_t<typename tensor_traits<std::decay_t<X>>::element>;

template <class X>
[[noreturn]] void throw_rank(const char* name, int expected, const X& x, const char* layout) {
    constexpr int actual = tensor_traits<std::decay_t<X>>::kRank;
    std::string shape = "[";
    for (int i = 0; i < actual; ++i) {
        if (i) shape += ", ";
        shape += std::to_string(static_cast<index_t>(x.dimension(i)));
    }
    throw std::invalid_argument(std::string("attnkit: ") + name + ": expected rank " + std::to_string(expected) +
                                " " + layout + ", got rank " + std::to_string(actual) + " " + shape + "]");
}

// Public entry points are templates over views, Tensors and TensorMaps alike. The rank is
// checked here at run time (not by overload resolution) so that a rank mistake gives a message
// naming the argument instead of a page of template errors.
template <int N, class X>
view<const scalar_of<X>, N> input_view(const char* name, const X& x, const char* layout) {
    using traits = tensor_traits<std::decay_t<X>>;
    static_assert(traits::kIsTensorish, "attnkit takes attnkit::view, Eigen::Tensor or Eigen::TensorMap");
    static_assert(traits::kRowMajor, "attnkit needs Eigen::RowMajor tensors (or an explicit attnkit::view)");
    if constexpr (traits::kRank != N) {
        throw_rank(name, N, x, layout);
    } else {
        using S = scalar_of<X>;
        if constexpr (std::is_same<std::decay_t<X>, view<const S, N>>::value ||
                      std::is_same<std::decay_t<X>, view<S, N>>::value) {
            return view<const S, N>(x);
        } else {
            return view<const S, N>(x.data(), dims_of(x));
        }
    }
}

template <int N, class X>
view<scalar_of<X>, N> output_view(const char* name, X&& x, const char* layout) {
    using traits = tensor_traits<std::decay_t<X>>;
    static_assert(traits::kIsTensorish, "attnkit takes attnkit::view, Eigen::Tensor or Eigen::TensorMap");
    static_assert(traits::kRowMajor, "attnkit needs Eigen::RowMajor tensors (or an explicit attnkit::view)");
    static_assert(!std::is_const<typename traits::element>::value, "an output must have a mutable element type");
    if constexpr (traits::kRank != N) {
        throw_rank(name, N, x, layout);
    } else {
        using S = scalar_of<X>;
        if constexpr (std::is_same<std::decay_t<X>, view<S, N>>::value) {
            return x;
        } else {
            return view<S, N>(const_cast<S*>(x.data()), dims_of(x));
        }
    }
}

}  // namespace detail
}  // namespace attnkit
