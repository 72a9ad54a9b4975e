// Central finite differences for the backward oracles' tests, in double.
//
//   expect_matches_finite_differences(param, grad, loss, "d_x")
//       param: a double tensor the loss reads (perturbed in place, restored after each element);
//       grad:  the oracle's gradient of loss with respect to param (same shape);
//       loss:  a callable returning the loss in double, typically <out, R> with a random R.
//   Each element: (loss(p + h) - loss(p - h)) / 2h against grad within rtol (1 + |grad|).
//
// h = 1e-5: the truncation error is ~h^2 |f'''| ~1e-10 and the rounding error ~1e-16 |loss| / h
// ~1e-11, so 1e-7 separates a right gradient from a wrong one with a wide margin either way.
#pragma once

#include <gtest/gtest.h>

#include <cmath>

#include "attnkit/config.hpp"

namespace attnkit_test {

template <class P, class G, class Loss>
void expect_matches_finite_differences(P& param, const G& grad, Loss&& loss, const char* name, double rtol = 1e-7,
                                       double h = 1e-5) {
    int bad = 0;
    for (attnkit::index_t i = 0; i < param.size(); ++i) {
        const double p0 = param.data()[i];
        param.data()[i] = p0 + h;
        const double lp = loss();
        param.data()[i] = p0 - h;
        const double lm = loss();
        param.data()[i] = p0;
        const double fd = (lp - lm) / (2 * h), g = grad.data()[i];
        if (!(std::abs(fd - g) <= rtol * (1.0 + std::abs(g))) && bad++ < 5)
            ADD_FAILURE() << name << " element " << i << ": finite differences " << fd << ", oracle " << g;
    }
}

}  // namespace attnkit_test
