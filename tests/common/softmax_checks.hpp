// Helpers of the softmax_attention tests (softmax_attention_test.cpp, its _extremes_ part and
// merge_partials_test.cpp): the kernel and the oracle run with NaN-sentinel outputs, the
// tolerances of softmax_attention_test.cpp's header comment, bitwise comparisons, and an
// independent restatement of the visibility rule.
//
//   run_fast(q, k, v, o) / run_reference(q, k, v, o)    out and lse of the kernel / the oracle
//   out_tolerance(q, k, v, o) / lse_tolerance(q, k, o)  kOutEps / kLseEps times the magnitude
//   score_bound(q, k, o)                                Cauchy-Schwarz bound on |score|
//   bitwise_equal(a, e), same_bytes(a, b)               bit-for-bit comparisons
//   copy_into(dst, src)                                 element copy between any layouts
//   sees(o, Lq, Lk, i, j, len)                          does row i see key j
//   random_sinks(H, seed)                               seeded sink logits, head 0 at -inf
#pragma once

#include "attnkit/softmax_attention.hpp"
#include "attnkit/reference/softmax_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace attnkit_test {

using attnkit::softmax_options;

using map4 = Eigen::TensorMap<tensor4<float>>;
using map3 = Eigen::TensorMap<tensor3<float>>;
using cmap4 = Eigen::TensorMap<Eigen::Tensor<const float, 4, Eigen::RowMajor>>;

constexpr double kOutEps = 16;  // eps multiple for outputs (softmax_attention_test.cpp's header)
constexpr double kLseEps = 16;  // eps multiple for lse
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInfF = -std::numeric_limits<float>::infinity();

using fast_result = attention_outputs<float>;
using ref_result = attention_outputs<double>;

template <class Q, class K, class V>
fast_result run_fast(const Q& q, const K& k, const V& v, const softmax_options& o) {
    // NaN sentinels: an element the kernel forgets to write fails every comparison.
    fast_result r = outputs_for<float>(q, v, kNaN);
    attnkit::softmax_attention(q, k, v, r.out, r.lse, o);
    return r;
}

template <class Q, class K, class V>
ref_result run_reference(const Q& q, const K& k, const V& v, const softmax_options& o) {
    ref_result r = outputs_for<double>(q, v, 0.0);
    attnkit::reference::softmax_attention(q, k, v, r.out, r.lse, o);
    return r;
}

inline float resolved_scale(const softmax_options& o, index_t D) {
    return attnkit::detail::resolve_scale(o.scale, D);
}

// Bound on |score| (Cauchy-Schwarz), capped by the softcap when it is on.
template <class Q, class K>
double score_bound(const Q& q, const K& k, const softmax_options& o) {
    double s = static_cast<double>(resolved_scale(o, as_view(q).dims[3])) * max_row_norm(q) *
               max_row_norm(k);
    if (o.softcap > 0.0f) s = std::min(s, static_cast<double>(o.softcap));
    return s;
}

template <class Q, class K, class V>
tolerance out_tolerance(const Q& q, const K& k, const V& v, const softmax_options& o,
                        double eps_multiple = kOutEps) {
    return tolerance_for(eps_multiple, max_abs(v) * (1.0 + score_bound(q, k, o)));
}

template <class Q, class K>
tolerance lse_tolerance(const Q& q, const K& k, const softmax_options& o,
                        double eps_multiple = kLseEps) {
    double sink = 0.0;
    for (float s : o.sinks)
        if (std::isfinite(s)) sink = std::max(sink, std::fabs(static_cast<double>(s)));
    return tolerance_for(eps_multiple, 1.0 + std::max(score_bound(q, k, o), sink));
}

// Bitwise equality of two float tensors of the same shape (strided views allowed).
template <class A, class E>
::testing::AssertionResult bitwise_equal(const A& actual, const E& expected) {
    constexpr int N = rank_of<A>;
    const auto av = as_view(actual);
    const auto ev = as_view(expected);
    if (av.dims != ev.dims) return ::testing::AssertionFailure() << "shape mismatch";
    index_t bad = 0;
    std::ostringstream details;
    for_each_index<N>(av.dims, [&](const std::array<index_t, N>& idx) {
        const float a = at(av, idx), e = at(ev, idx);
        if (std::memcmp(&a, &e, sizeof(float)) != 0) {
            if (bad < 4) details << "\n  at " << index_string(idx) << ": " << a << " vs " << e;
            ++bad;
        }
    });
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << bad << " of " << av.size() << " elements differ bitwise:" << details.str();
}

// memcmp of whole dense tensors.
template <class T, int N>
bool same_bytes(const Eigen::Tensor<T, N, Eigen::RowMajor>& a,
                const Eigen::Tensor<T, N, Eigen::RowMajor>& b) {
    return a.size() == b.size() &&
           std::memcmp(a.data(), b.data(), sizeof(T) * static_cast<std::size_t>(a.size())) == 0;
}

// Copies the elements of src into dst (same dims; any strides).
template <class D, class S>
void copy_into(D&& dst, const S& src) {
    auto dv = as_mutable_view(std::forward<D>(dst));
    const auto sv = as_view(src);
    using T = typename decltype(dv)::value_type;
    for_each_index<rank_of<S>>(sv.dims,
                               [&](const auto& idx) { at(dv, idx) = static_cast<T>(at(sv, idx)); });
}

// Independent restatement of the visibility rule (docs/design.md "Conventions"), for tests that
// need to know which rows see a given key.
inline bool sees(const softmax_options& o, index_t Lq, index_t Lk, index_t i, index_t j, index_t len) {
    const index_t p = i + (Lk - Lq);
    if (j >= len) return false;
    if ((o.causal || o.chunk > 0) && j > p) return false;
    if (o.window_left >= 0 && j < p - o.window_left) return false;
    if (o.chunk > 0) {
        const index_t c = o.chunk;
        const index_t start = (p >= 0 ? p / c : -((-p + c - 1) / c)) * c;
        if (j < start || j >= start + c) return false;
    }
    return true;
}

inline std::vector<float> random_sinks(index_t H, std::uint64_t seed) {
    random_source rs(seed);
    std::vector<float> s(static_cast<std::size_t>(H));
    for (auto& x : s) x = static_cast<float>(rs.uniform(-2.0, 4.0));
    if (H > 1) s[0] = kNegInfF;  // -inf: no sink for head 0
    return s;
}

}  // namespace attnkit_test
