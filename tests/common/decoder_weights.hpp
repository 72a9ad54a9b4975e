// Test weights for the decoder template: the seeded initialisation (N(0, 0.02)) leaves attention
// almost uniform and its gradients tiny, so tests that compare gradients or logits move every
// weight by N(0, 0.25) (norm weights to 1 + N(0, 0.2)), which makes every path of the model
// matter.
#pragma once

#include <cstdint>
#include <string>

#include "attnkit/model/decoder.hpp"

namespace attnkit_test {

inline void perturb(attnkit::model::decoder& m, std::uint64_t seed) {
    attnkit::model::weight_rng rng(seed);
    m.for_each_parameter([&](const std::string& name, auto& t) {
        const bool norm = name.size() > 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
        for (attnkit::index_t i = 0; i < static_cast<attnkit::index_t>(t.size()); ++i)
            t.data()[i] = norm ? 1.0f + rng.normal(0.2f) : t.data()[i] + rng.normal(0.25f);
    });
    m.parameters_changed();
}

}  // namespace attnkit_test
