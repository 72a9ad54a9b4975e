// attnkit::reference::self_gating_attention_backward against central finite differences of the
// reference forward, all in double, with a random projection loss <out, R> (sum(out) would hide
// a gradient landing on the wrong element, head or row).
#include "attnkit/reference/self_gating_attention_backward.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/finite_differences.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::self_gating_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;

struct shape {
    index_t B, L, H, Hk, D, Dv;
};

struct problem {
    tensor4<double> q, k, v, r;  // r: the loss's projection, also d_out
};

problem make_problem(const shape& s, std::uint64_t seed, double gain = 1.0) {
    problem p{random_bshd<double>(s.B, s.L, s.H, s.D, distribution::gaussian, seed),
              random_bshd<double>(s.B, s.L, s.Hk, s.D, distribution::gaussian, seed + 1),
              random_bshd<double>(s.B, s.L, s.Hk, s.Dv, distribution::gaussian, seed + 2),
              random_bshd<double>(s.B, s.L, s.H, s.Dv, distribution::gaussian, seed + 3)};
    p.q = p.q * gain;
    return p;
}

double loss(const problem& p, const self_gating_options& o) {
    tensor4<double> out(p.q.dimension(0), p.q.dimension(1), p.q.dimension(2), p.v.dimension(3));
    ref::self_gating_attention(p.q, p.k, p.v, out, o);
    return projection_loss(out, p.r);
}

void expect_matches_fd(problem& p, tensor4<double>& x, const tensor4<double>& analytic, const self_gating_options& o,
                       const char* name) {
    expect_gradient_matches_fd(x, analytic, [&] { return loss(p, o); }, name);
}

struct fd_case {
    std::string name;
    shape s;
    self_gating_options o;
    double gain = 1.0;
};

TEST(reference_self_gating_attention_backward, matches_central_finite_differences) {
    std::vector<fd_case> cs;
    auto add = [&](std::string n, shape s, bool causal, std::vector<std::int64_t> kl, float scale, double gain) {
        self_gating_options o;
        o.causal = causal;
        o.key_lengths = std::move(kl);
        o.scale = scale;
        cs.push_back({std::move(n), s, o, gain});
    };
    add("plain", {1, 5, 2, 2, 3, 2}, false, {}, 0.0f, 1.0);
    add("causal", {1, 6, 2, 2, 4, 3}, true, {}, 0.0f, 1.0);
    add("causal_gqa", {2, 5, 4, 2, 3, 2}, true, {}, 0.0f, 1.0);
    add("key_lengths_causal", {3, 6, 2, 1, 3, 2}, true, {4, 0, 6}, 0.0f, 1.0);
    add("key_lengths_noncausal_mqa", {2, 5, 3, 1, 2, 3}, false, {3, 5}, 0.0f, 1.0);
    add("scale_large_gates", {1, 7, 2, 2, 3, 2}, true, {}, 1.7f, 3.0);
    std::uint64_t seed = 500;
    for (const fd_case& c : cs) {
        SCOPED_TRACE(c.name);
        const shape& s = c.s;
        problem p = make_problem(s, seed += 10, c.gain);
        tensor4<double> out(s.B, s.L, s.H, s.Dv), dq(s.B, s.L, s.H, s.D), dk(s.B, s.L, s.Hk, s.D),
            dv(s.B, s.L, s.Hk, s.Dv);
        ref::self_gating_attention(p.q, p.k, p.v, out, c.o);
        ref::self_gating_attention_backward(p.q, p.k, p.v, out, p.r, dq, dk, dv, c.o);
        expect_matches_fd(p, p.q, dq, c.o, "d_q");
        expect_matches_fd(p, p.k, dk, c.o, "d_k");
        expect_matches_fd(p, p.v, dv, c.o, "d_v");
    }
}

// Tokens nobody sees, and items with no visible token, get zero gradients.
TEST(reference_self_gating_attention_backward, masked_tokens_get_zero) {
    const shape s{2, 4, 2, 1, 3, 2};
    problem p = make_problem(s, 7);
    self_gating_options o;
    o.causal = true;
    o.key_lengths = {2, 0};
    tensor4<double> out(s.B, s.L, s.H, s.Dv), dq(s.B, s.L, s.H, s.D), dk(s.B, s.L, s.Hk, s.D), dv(s.B, s.L, s.Hk, s.Dv);
    ref::self_gating_attention(p.q, p.k, p.v, out, o);
    dq.setConstant(7.0);
    dk.setConstant(7.0);
    dv.setConstant(7.0);
    ref::self_gating_attention_backward(p.q, p.k, p.v, out, p.r, dq, dk, dv, o);
    for (index_t l = 0; l < s.L; ++l)
        for (index_t d = 0; d < s.D; ++d) {
            EXPECT_EQ(0.0, dq(1, l, 0, d));
            EXPECT_EQ(0.0, dk(1, l, 0, d));
            if (l >= 2) {
                EXPECT_EQ(0.0, dq(0, l, 1, d));
                EXPECT_EQ(0.0, dk(0, l, 0, d));
            }
        }
    EXPECT_NE(0.0, dv(0, 1, 0, 0));
    EXPECT_NE(0.0, dq(0, 1, 0, 0));
}

// Causal: a NaN in row i's d_out reaches the tokens j <= i only.
TEST(reference_self_gating_attention_backward, nan_stays_in_the_tokens_it_depends_on) {
    const shape s{1, 5, 1, 1, 2, 2};
    problem p = make_problem(s, 9);
    p.r(0, 2, 0, 1) = std::numeric_limits<double>::quiet_NaN();
    self_gating_options o;
    o.causal = true;
    tensor4<double> out(s.B, s.L, s.H, s.Dv), dq(s.B, s.L, s.H, s.D), dk(s.B, s.L, s.Hk, s.D), dv(s.B, s.L, s.Hk, s.Dv);
    ref::self_gating_attention(p.q, p.k, p.v, out, o);
    ref::self_gating_attention_backward(p.q, p.k, p.v, out, p.r, dq, dk, dv, o);
    for (index_t j = 3; j < s.L; ++j) EXPECT_TRUE(std::isfinite(dq(0, j, 0, 0)) && std::isfinite(dv(0, j, 0, 0))) << j;
    EXPECT_TRUE(std::isnan(dv(0, 2, 0, 1)));
}

TEST(reference_self_gating_attention_backward, rejects_bad_gradients_before_writing) {
    const shape s{1, 4, 2, 1, 3, 2};
    problem p = make_problem(s, 3);
    tensor4<double> out(s.B, s.L, s.H, s.Dv), dq(s.B, s.L, s.H, s.D), dk(s.B, s.L, s.Hk, s.D), dv(s.B, s.L, s.Hk, s.Dv + 1);
    ref::self_gating_attention(p.q, p.k, p.v, out);
    dq.setConstant(3.0);
    dk.setConstant(3.0);
    EXPECT_THROW(ref::self_gating_attention_backward(p.q, p.k, p.v, out, p.r, dq, dk, dv), std::invalid_argument);
    EXPECT_EQ(3.0, dq(0, 0, 0, 0));
    EXPECT_EQ(3.0, dk(0, 0, 0, 0));
}

}  // namespace
