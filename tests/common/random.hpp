// Deterministic random test data.
//
//   enum class distribution { uniform, gaussian, outliers }
//     uniform   U[-1, 1]
//     gaussian  N(0, 1)
//     outliers  N(0, 1) with 1% of the values (at least one, at distinct positions) times 20
//   name(d)                                 "uniform" / "gaussian" / "outliers" (for test names)
//   kAllDistributions                       the three, for INSTANTIATE_TEST_SUITE_P
//   random_values(n, d, seed)               std::vector<double> of n values
//   fill_random(ptr, n, d, seed)            a raw buffer of float/double
//   fill_random(x, d, seed)                 a view / row-major Tensor / TensorMap, in row-major
//                                           index order (strided views get the same values as a
//                                           dense tensor of the same shape)
//   random_bshd(B, L, H, D, d, seed)        a new tensor4<float> (random_bshd<double> for double)
//
// Everything is a function of (n, d, seed) only: std::mt19937_64 bits turned into numbers by
// hand (53-bit uniforms, Box-Muller), not by std::*_distribution, whose output differs between
// standard libraries.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <random>
#include <vector>

#include "common/tensor.hpp"

namespace attnkit_test {

enum class distribution { uniform, gaussian, outliers };

inline constexpr distribution kAllDistributions[] = {distribution::uniform, distribution::gaussian,
                                                     distribution::outliers};

inline const char* name(distribution d) {
    switch (d) {
        case distribution::uniform:
            return "uniform";
        case distribution::gaussian:
            return "gaussian";
        case distribution::outliers:
            return "outliers";
    }
    return "unknown";
}

inline std::ostream& operator<<(std::ostream& os, distribution d) { return os << name(d); }

constexpr double kOutlierFactor = 20.0;
constexpr double kOutlierFraction = 0.01;

class random_source {
public:
    explicit random_source(std::uint64_t seed) : gen_(seed) {}

    // [0, 1), 53 random bits.
    double uniform01() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
    double uniform(double lo, double hi) { return lo + (hi - lo) * uniform01(); }
    // N(0, 1) by Box-Muller (both values of a pair are used).
    double gaussian() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        const double u1 = 1.0 - uniform01();  // (0, 1]
        const double u2 = uniform01();
        const double r = std::sqrt(-2.0 * std::log(u1));
        const double t = 6.283185307179586476925286766559 * u2;
        spare_ = r * std::sin(t);
        has_spare_ = true;
        return r * std::cos(t);
    }
    // Integer in [0, n), n > 0 (modulo bias is irrelevant for tests).
    std::uint64_t below(std::uint64_t n) { return gen_() % n; }

private:
    std::mt19937_64 gen_;
    double spare_ = 0.0;
    bool has_spare_ = false;
};

inline std::vector<double> random_values(std::size_t n, distribution d, std::uint64_t seed) {
    random_source rs(seed);
    std::vector<double> out(n);
    if (d == distribution::uniform) {
        for (auto& x : out) x = rs.uniform(-1.0, 1.0);
        return out;
    }
    for (auto& x : out) x = rs.gaussian();
    if (d == distribution::outliers && n > 0) {
        std::size_t count =
            static_cast<std::size_t>(std::llround(kOutlierFraction * static_cast<double>(n)));
        if (count < 1) count = 1;
        // Floyd's algorithm: `count` distinct positions.
        std::vector<char> chosen(n, 0);
        for (std::size_t j = n - count; j < n; ++j) {
            const std::size_t t = static_cast<std::size_t>(rs.below(j + 1));
            if (chosen[t])
                chosen[j] = 1;
            else
                chosen[t] = 1;
        }
        for (std::size_t i = 0; i < n; ++i)
            if (chosen[i]) out[i] *= kOutlierFactor;
    }
    return out;
}

template <class T>
void fill_random(T* data, std::size_t n, distribution d, std::uint64_t seed) {
    const std::vector<double> vals = random_values(n, d, seed);
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<T>(vals[i]);
}

template <class X>
void fill_random(X&& x, distribution d, std::uint64_t seed) {
    auto v = as_mutable_view(std::forward<X>(x));
    using S = typename decltype(v)::value_type;
    const std::vector<double> vals = random_values(static_cast<std::size_t>(v.size()), d, seed);
    std::size_t i = 0;
    for_each_index<rank_of<X>>(v.dims,
                               [&](const auto& idx) { at(v, idx) = static_cast<S>(vals[i++]); });
}

template <class T = float>
tensor4<T> random_bshd(index_t B, index_t L, index_t H, index_t D, distribution d,
                       std::uint64_t seed) {
    tensor4<T> t(B, L, H, D);
    fill_random(t.data(), static_cast<std::size_t>(t.size()), d, seed);
    return t;
}

}  // namespace attnkit_test
