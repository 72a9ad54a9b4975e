// attnkit::view<T, N>: a non-owning strided view (pointer, dims, strides in elements).
//
// Kernels take .data() and strides once from a view and never touch Eigen expressions, which
// keeps compile times low and lets [B,H,L,D] buffers or fused QKV buffers be used without copies.
//
//   std::vector<float> buf(2 * 16 * 4 * 64);
//   attnkit::view<float, 4> q(buf.data(), {2, 16, 4, 64});   // dense row-major [B, L, H, D]
//   attnkit::softmax_attention(q, k, v, out);                // as would an Eigen::Tensor
//
// This header declares Eigen::Tensor and Eigen::TensorMap without including Eigen's Tensor
// module: a program that passes Eigen tensors has included it already, and one that passes views
// does not pay for it.
#pragma once

#include <array>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attnkit/config.hpp"

// The declarations of unsupported/Eigen/CXX11/src/Tensor/TensorForwardDeclarations.h, without
// their default arguments (which only Eigen's own declaration may give).
namespace Eigen {
template <typename Scalar_, int NumIndices_, int Options_, typename IndexType_>
class Tensor;
template <typename PlainObjectType, int Options_, template <class> class MakePointer_>
class TensorMap;
}  // namespace Eigen

namespace attnkit {
namespace detail {
// Eigen::RowMajor (Eigen/src/Core/util/Constants.h), spelled out so that this header needs no
// Eigen include; attnkit/eigen.hpp checks that the two agree.
constexpr int kEigenRowMajor = 0x1;
}  // namespace detail

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

    // Dense row-major view over raw memory. Strides whose product would overflow int64 saturate
    // at INT64_MAX (the product of the dimensions overflows then too, and validation rejects it).
    view(T* ptr, const std::array<index_t, N>& d) : data(ptr), dims(d) {
        constexpr index_t kMax = std::numeric_limits<index_t>::max();
        index_t s = 1;
        for (int i = N - 1; i >= 0; --i) {
            strides[i] = s;
            s = d[i] <= 0 ? (d[i] == 0 ? 0 : s) : (s > kMax / d[i] ? kMax : s * d[i]);  // d < 0: rejected later
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
        static_assert(Options & detail::kEigenRowMajor, "attnkit needs Eigen::RowMajor tensors");
    }
    template <class Scalar, int Options, class Index,
              std::enable_if_t<std::is_same<T, const Scalar>::value, int> = 0>
    view(const Eigen::Tensor<Scalar, N, Options, Index>& t) : view(t.data(), dims_of(t)) {
        static_assert(Options & detail::kEigenRowMajor, "attnkit needs Eigen::RowMajor tensors");
    }
    template <class Scalar, int Options, class Index, int MapOptions, template <class> class MakePointer,
              std::enable_if_t<std::is_same<std::remove_const_t<T>, std::remove_const_t<Scalar>>::value &&
                                   (std::is_const<T>::value || !std::is_const<Scalar>::value),
                               int> = 0>
    view(const Eigen::TensorMap<Eigen::Tensor<Scalar, N, Options, Index>, MapOptions, MakePointer>& t)
        : view(const_cast<T*>(t.data()), dims_of(t)) {
        static_assert(Options & detail::kEigenRowMajor, "attnkit needs Eigen::RowMajor tensors");
    }

    index_t dim(int i) const { return dims[i]; }
    index_t dimension(int i) const { return dims[i]; }  // Eigen's spelling, for generic code
    index_t stride(int i) const { return strides[i]; }
    // Number of elements; saturates at INT64_MAX instead of overflowing (detail::check_extent
    // rejects such shapes with an error; negative dimensions count as 0 here).
    index_t size() const {
        constexpr index_t kMax = std::numeric_limits<index_t>::max();
        index_t s = 1;
        for (int i = 0; i < N; ++i) {
            if (dims[i] <= 0) return 0;
            s = s > kMax / dims[i] ? kMax : s * dims[i];
        }
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

// Where the e-th element in row-major order sits, in elements from v.data: lets code that keeps
// a flat, dense copy of a tensor (a gradient accumulated in double, say) read or write any view.
template <class T, int N>
index_t element_offset(const view<T, N>& v, index_t e) {
    index_t off = 0;
    for (int a = N - 1; a >= 0; --a) {
        off += (e % v.dims[a]) * v.strides[a];
        e /= v.dims[a];
    }
    return off;
}

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
template <class T, int N>
std::string strides_string(const view<T, N>& v) {
    std::string s = "[";
    for (int i = 0; i < N; ++i) {
        if (i) s += ", ";
        s += std::to_string(v.strides[i]);
    }
    return s + "]";
}

namespace detail {

// What the entry points accept: attnkit::view, and row-major Eigen::Tensor and Eigen::TensorMap
// (also of const and of const Tensor). Anything else (Eigen expressions such as q * 2 or
// .chip(), TensorRef, TensorFixedSize, ...) stops at one static_assert in input_view or
// output_view; the defaults here only keep the compiler from piling further errors on top.
template <class X>
struct tensor_traits {
    static constexpr bool kIsTensorish = false;
    static constexpr bool kRowMajor = true;
    static constexpr bool kOwning = false;
    static constexpr int kRank = -1;
    using element = float;
};
template <class T, int N>
struct tensor_traits<view<T, N>> {
    static constexpr bool kIsTensorish = true;
    static constexpr bool kRowMajor = true;
    static constexpr bool kOwning = false;
    static constexpr int kRank = N;
    using element = T;
};
template <class S, int N, int O, class I>
struct tensor_traits<Eigen::Tensor<S, N, O, I>> {
    static constexpr bool kIsTensorish = true;
    static constexpr bool kRowMajor = (O & kEigenRowMajor) != 0;
    static constexpr bool kOwning = true;  // a const Tensor is const data
    static constexpr int kRank = N;
    using element = S;
};
template <class S, int N, int O, class I, int MO, template <class> class MP>
struct tensor_traits<Eigen::TensorMap<Eigen::Tensor<S, N, O, I>, MO, MP>> {
    static constexpr bool kIsTensorish = true;
    static constexpr bool kRowMajor = (O & kEigenRowMajor) != 0;
    static constexpr bool kOwning = false;  // a const map still maps mutable data
    static constexpr int kRank = N;
    using element = S;
};

template <class S, int N, int O, class I, int MO, template <class> class MP>
struct tensor_traits<Eigen::TensorMap<const Eigen::Tensor<S, N, O, I>, MO, MP>> {
    static constexpr bool kIsTensorish = true;
    static constexpr bool kRowMajor = (O & kEigenRowMajor) != 0;
    static constexpr bool kOwning = false;
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

// A packed [T, ...] view as the [1, T, ...] view the engine and its checks take (the varlen
// entry points, packed int8 K/V): the batch stride spans the whole view.
template <class T, int N>
view<T, N + 1> as_batch_of_one(const view<T, N>& x) {
    std::array<index_t, N + 1> dims{}, strides{};
    dims[0] = 1;
    strides[0] = x.dims[0] * x.strides[0];
    for (int i = 0; i < N; ++i) dims[i + 1] = x.dims[i], strides[i + 1] = x.strides[i];
    return view<T, N + 1>(x.data, dims, strides);
}

// For entry points that accept several ranks (gated_mlp: [N, d] or [B, L, d]) and so check the
// rank at run time; fixed-rank arguments go through input_view / output_view below instead.
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

// The messages of the compile-time argument checks (one per kind of mistake).
#define ATTNKIT_NOT_A_TENSOR_MESSAGE                                                                   \
    "attnkit takes attnkit::view, a row-major Eigen::Tensor or an Eigen::TensorMap as each tensor "    \
    "argument; an Eigen expression (operators, .chip(), .slice(), ...), TensorRef or TensorFixedSize " \
    "must be evaluated into an Eigen::Tensor first, or its memory wrapped in an attnkit::view"

// Public entry points are templates over views, Tensors and TensorMaps alike; these convert an
// argument once, and every mistake a type shows stops here at compile time with one message:
// not a tensor, column-major, wrong rank, or (outputs) read-only. The rank mistake names the
// expected layout through N; the compiler's instantiation trace names the argument.
template <int N, class X>
view<const scalar_of<X>, N> input_view(const char* name, const X& x, const char* layout) {
    using traits = tensor_traits<std::decay_t<X>>;
    using S = scalar_of<X>;
    static_assert(traits::kIsTensorish, ATTNKIT_NOT_A_TENSOR_MESSAGE);
    static_assert(!traits::kIsTensorish || traits::kRowMajor,
                  "attnkit needs Eigen::RowMajor tensors (or an explicit attnkit::view with strides)");
    static_assert(!traits::kIsTensorish || traits::kRank == N,
                  "attnkit: a tensor argument has the wrong rank (q, k, v, out: rank 4 [B, L, H, D]; "
                  "lse: rank 3 [B, Lq, H]; see the instantiation trace for the argument)");
    (void)name, (void)layout;
    if constexpr (!traits::kIsTensorish || traits::kRank != N) {
        return {};
    } else if constexpr (std::is_same<std::decay_t<X>, view<const S, N>>::value ||
                         std::is_same<std::decay_t<X>, view<S, N>>::value) {
        return view<const S, N>(x);
    } else {
        return view<const S, N>(x.data(), dims_of(x));
    }
}

template <int N, class X>
view<scalar_of<X>, N> output_view(const char* name, X&& x, const char* layout) {
    using traits = tensor_traits<std::decay_t<X>>;
    using S = scalar_of<X>;
    static_assert(traits::kIsTensorish, ATTNKIT_NOT_A_TENSOR_MESSAGE);
    static_assert(!traits::kIsTensorish || traits::kRowMajor,
                  "attnkit needs Eigen::RowMajor tensors (or an explicit attnkit::view with strides)");
    static_assert(!traits::kIsTensorish || traits::kRank == N,
                  "attnkit: a tensor argument has the wrong rank (q, k, v, out: rank 4 [B, L, H, D]; "
                  "lse: rank 3 [B, Lq, H]; see the instantiation trace for the argument)");
    static_assert(!std::is_const<typename traits::element>::value,
                  "attnkit: an output (out, lse) must have a mutable element type, not a view or map of const");
    static_assert(!(traits::kOwning && std::is_const<std::remove_reference_t<X>>::value),
                  "attnkit: an output (out, lse) cannot be a const Eigen::Tensor: it would be written through "
                  "const; pass it non-const");
    (void)name, (void)layout;
    if constexpr (!traits::kIsTensorish || traits::kRank != N) {
        return {};
    } else if constexpr (std::is_same<std::decay_t<X>, view<S, N>>::value) {
        return x;
    } else {
        return view<S, N>(const_cast<S*>(x.data()), dims_of(x));  // TensorMap::data() is const-qualified
    }
}

}  // namespace detail
}  // namespace attnkit
