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

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attnkit/config.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

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

// The oracles' tests: a random attention problem and the random projection loss <out, r>, which
// weighs every output element differently, so that a gradient landing on the wrong element,
// head or row shows (sum(out) would hide it: it is invariant under permuting the outputs, and
// its d_out = 1 misses layout errors of d_out entirely).
struct fd_shape {
    attnkit::index_t B, Lq, Lk, H, Hk, D, Dv;
};
struct fd_problem {
    tensor4<double> q, k, v, r;  // r: the loss's projection, also d_out
};
inline fd_problem make_fd_problem(const fd_shape& s, std::uint64_t seed) {
    return {random_bshd<double>(s.B, s.Lq, s.H, s.D, distribution::gaussian, seed),
            random_bshd<double>(s.B, s.Lk, s.Hk, s.D, distribution::gaussian, seed + 1),
            random_bshd<double>(s.B, s.Lk, s.Hk, s.Dv, distribution::gaussian, seed + 2),
            random_bshd<double>(s.B, s.Lq, s.H, s.Dv, distribution::gaussian, seed + 3)};
}
inline double projection_loss(const tensor4<double>& out, const tensor4<double>& r) {
    double l = 0.0;
    for (attnkit::index_t i = 0; i < out.size(); ++i) l += out.data()[i] * r.data()[i];
    return l;
}

// Central differences of loss() in every element of x against the oracle's gradient, with a
// tolerance relative to the largest element of that gradient.
template <class X, class G, class Loss>
void expect_gradient_matches_fd(X& x, const G& analytic, Loss&& loss, const char* name) {
    double scale = 1.0;
    for (attnkit::index_t i = 0; i < analytic.size(); ++i) scale = std::max(scale, std::abs(analytic.data()[i]));
    expect_matches_finite_differences(x, analytic, loss, name, 1e-7 * scale);
}

// Gradients of a problem of 2 items and one key/value head run with key_lengths = {2, 0}: item
// 1 sees nothing and item 0 no key past the second, so those gradients are exactly 0 (written
// over 7, which the caller put there), while others are not.
inline void expect_unseen_keys_get_zero(const tensor4<double>& dq, const tensor4<double>& dk,
                                        const tensor4<double>& dv) {
    using attnkit::index_t;
    for (index_t i = 0; i < dq.dimension(1); ++i)
        for (index_t h = 0; h < dq.dimension(2); ++h)
            for (index_t d = 0; d < dq.dimension(3); ++d) EXPECT_EQ(0.0, dq(1, i, h, d));
    for (index_t j = 0; j < dk.dimension(1); ++j)
        for (index_t d = 0; d < dk.dimension(3); ++d) {
            EXPECT_EQ(0.0, dk(1, j, 0, d));
            if (j >= 2) {
                EXPECT_EQ(0.0, dk(0, j, 0, d));
            }
        }
    for (index_t j = 2; j < dv.dimension(1); ++j)
        for (index_t c = 0; c < dv.dimension(3); ++c) EXPECT_EQ(0.0, dv(0, j, 0, c));
    EXPECT_NE(0.0, dq(0, 0, 0, 0));
    EXPECT_NE(0.0, dv(0, 1, 0, 0));
}

}  // namespace attnkit_test
