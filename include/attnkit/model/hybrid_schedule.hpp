// Hybrid layer schedules of Xue et al. (Deconstructing Attention), docs/variants.md section 8:
// which layers of a decoder keep standard attention and which get the variant under study.
//
//   std::vector<bool> std_layers = attnkit::model::hybrid_schedule("middle", 24);
//   // std_layers[l] (0-based l) is true where layer l keeps standard attention.
//
// The paper states every schedule for its 24-layer model (1-indexed layers keeping standard):
//
//   uniform     none                    hybrid/even  2, 4, ..., 24     odd    1, 3, ..., 23
//   top         1-12                    middle       1-6, 19-24        bottom 13-24
//   25%         4, 8, 12, 16, 20, 24    first        1                 last   24
//   bilateral   1, 24
//
// At other depths n the pattern is scaled by its rule, so that 24 gives the table exactly:
//   even / odd: every 2nd layer (1-indexed even / odd); 25%: every 4th (1-indexed multiples of
//   4); top: the first floor(n/2) layers standard (the variant in the top half); bottom: the
//   last floor(n/2); middle: the first and last round(n/4) layers standard (halves round up,
//   so that 6 layers keep 1-2 and 5-6 rather than collapsing to bilateral; the variant in the
//   middle); first / last / bilateral: layer 1 / layer n / both.
// An unknown name throws std::invalid_argument listing the valid ones.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/config.hpp"

namespace attnkit {
namespace model {

// The names hybrid_schedule accepts ("hybrid" and "even" are the same schedule).
inline const std::vector<std::string>& hybrid_schedule_names() {
    static const std::vector<std::string> names = {"uniform", "hybrid", "even",  "odd",  "top",      "middle",
                                                   "bottom",  "25%",    "first", "last", "bilateral"};
    return names;
}

constexpr index_t kMaxScheduleLayers = index_t(1) << 24;

inline std::vector<bool> hybrid_schedule(const std::string& name, index_t n_layers) {
    // The schedule is one flag per layer: a count beyond 2^24 is no model's depth and would only
    // allocate (or overflow the vector's size) for nothing.
    if (n_layers < 1 || n_layers > kMaxScheduleLayers)
        throw std::invalid_argument("attnkit::model::hybrid_schedule: n_layers must be in [1, 2^24], got " +
                                    std::to_string(n_layers));
    const index_t n = n_layers;
    std::vector<bool> keep(static_cast<std::size_t>(n), false);
    // Rules on 1-indexed layers, as the paper numbers them.
    auto set = [&](auto&& keeps_standard) {
        for (index_t l = 1; l <= n; ++l) keep[static_cast<std::size_t>(l - 1)] = keeps_standard(l);
    };
    if (name == "uniform") {
        set([](index_t) { return false; });
    } else if (name == "hybrid" || name == "even") {
        set([](index_t l) { return l % 2 == 0; });
    } else if (name == "odd") {
        set([](index_t l) { return l % 2 == 1; });
    } else if (name == "top") {
        set([&](index_t l) { return l <= n / 2; });
    } else if (name == "bottom") {
        set([&](index_t l) { return l > n - n / 2; });
    } else if (name == "middle") {
        const index_t q = (n + 2) / 4;  // round(n / 4), halves up
        set([&](index_t l) { return l <= q || l > n - q; });
    } else if (name == "25%") {
        set([](index_t l) { return l % 4 == 0; });
    } else if (name == "first") {
        set([](index_t l) { return l == 1; });
    } else if (name == "last") {
        set([&](index_t l) { return l == n; });
    } else if (name == "bilateral") {
        set([&](index_t l) { return l == 1 || l == n; });
    } else {
        std::string valid;
        for (const std::string& s : hybrid_schedule_names()) valid += (valid.empty() ? "" : ", ") + s;
        throw std::invalid_argument("attnkit::model::hybrid_schedule: unknown schedule \"" + name +
                                    "\"; valid names: " + valid);
    }
    return keep;
}

}  // namespace model
}  // namespace attnkit
