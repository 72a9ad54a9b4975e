// attnkit::reference::taylor_attention_backward against central finite differences of the
// reference forward, all in double, with a random projection loss <out, R>: a loss that weighs
// every output element differently, so a gradient landing on the wrong element, head or row
// shows (sum(out) would hide it: it is invariant under permuting the outputs).
#include "attnkit/reference/taylor_attention_backward.hpp"

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
using attnkit::taylor_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;

using shape = fd_shape;
using problem = fd_problem;
const auto make_problem = make_fd_problem;

// loss = <out, r> of a reference forward in double (the quadratic one, or the linear one).
double loss(const problem& p, const taylor_options& o, bool linear = false) {
    tensor4<double> out(p.q.dimension(0), p.q.dimension(1), p.q.dimension(2), p.v.dimension(3));
    if (linear)
        ref::taylor_attention_linear(p.q, p.k, p.v, out, o);
    else
        ref::taylor_attention(p.q, p.k, p.v, out, o);
    return projection_loss(out, p.r);
}

void expect_matches_fd(problem& p, tensor4<double>& x, const tensor4<double>& analytic, const taylor_options& o,
                       const char* name, bool linear = false) {
    expect_gradient_matches_fd(x, analytic, [&] { return loss(p, o, linear); }, name);
}

struct fd_case {
    std::string name;
    shape s;
    taylor_options o;
};

std::vector<fd_case> fd_cases() {
    std::vector<fd_case> cs;
    auto add = [&](std::string n, shape s, auto&& set) {
        taylor_options o;
        set(o);
        cs.push_back({std::move(n), s, o});
    };
    add("plain", {1, 4, 4, 2, 2, 3, 2}, [](taylor_options&) {});
    add("causal_gqa", {2, 5, 5, 4, 2, 5, 3}, [](taylor_options& o) { o.causal = true; });
    add("decode_rows", {1, 2, 7, 2, 1, 4, 3}, [](taylor_options& o) { o.causal = true; });
    add("more_queries_than_keys", {1, 6, 3, 2, 2, 3, 2}, [](taylor_options& o) { o.causal = true; });
    add("key_lengths", {2, 3, 5, 2, 2, 3, 2}, [](taylor_options& o) { o.key_lengths = {3, 0}; });
    add("scale_eps", {1, 4, 5, 2, 2, 4, 2}, [](taylor_options& o) {
        o.scale = 1.7f;   // scores of a few units: the s^2 term dominates w
        o.eps = 0.25f;    // a large eps, so that Z's eps term is checked too
    });
    add("everything_mqa", {2, 5, 6, 3, 1, 3, 4}, [](taylor_options& o) {
        o.causal = true;
        o.key_lengths = {6, 4};
        o.eps = 0.5f;
    });
    return cs;
}

TEST(reference_taylor_attention_backward, matches_central_finite_differences) {
    std::uint64_t seed = 100;
    for (const fd_case& c : fd_cases()) {
        SCOPED_TRACE(c.name);
        const shape& s = c.s;
        problem p = make_problem(s, seed += 10);
        tensor4<double> out(s.B, s.Lq, s.H, s.Dv), dq(s.B, s.Lq, s.H, s.D), dk(s.B, s.Lk, s.Hk, s.D),
            dv(s.B, s.Lk, s.Hk, s.Dv);
        ref::taylor_attention(p.q, p.k, p.v, out, c.o);
        ref::taylor_attention_backward(p.q, p.k, p.v, out, p.r, dq, dk, dv, c.o);
        expect_matches_fd(p, p.q, dq, c.o, "d_q");
        expect_matches_fd(p, p.k, dk, c.o, "d_k");
        expect_matches_fd(p, p.v, dv, c.o, "d_v");
    }
}

// The linear reference (feature map, prefix sums) is the same function: its finite differences
// match the oracle too, so the oracle is the gradient of both forms.
TEST(reference_taylor_attention_backward, matches_finite_differences_of_the_linear_form) {
    const shape s{1, 5, 5, 2, 1, 3, 2};
    problem p = make_problem(s, 21);
    taylor_options o;
    o.causal = true;
    tensor4<double> out(s.B, s.Lq, s.H, s.Dv), dq(s.B, s.Lq, s.H, s.D), dk(s.B, s.Lk, s.Hk, s.D),
        dv(s.B, s.Lk, s.Hk, s.Dv);
    ref::taylor_attention_linear(p.q, p.k, p.v, out, o);
    ref::taylor_attention_backward(p.q, p.k, p.v, out, p.r, dq, dk, dv, o);
    expect_matches_fd(p, p.q, dq, o, "d_q", true);
    expect_matches_fd(p, p.k, dk, o, "d_k", true);
    expect_matches_fd(p, p.v, dv, o, "d_v", true);
}

// The test can fail: a gradient with the (1 + s) factor of dS dropped is caught.
TEST(reference_taylor_attention_backward, finite_differences_catch_a_wrong_gradient) {
    const shape s{1, 3, 3, 1, 1, 2, 2};
    problem p = make_problem(s, 23);
    taylor_options o;
    tensor4<double> out(s.B, s.Lq, s.H, s.Dv), dq(s.B, s.Lq, s.H, s.D), dk(s.B, s.Lk, s.Hk, s.D),
        dv(s.B, s.Lk, s.Hk, s.Dv);
    ref::taylor_attention(p.q, p.k, p.v, out, o);
    ref::taylor_attention_backward(p.q, p.k, p.v, out, p.r, dq, dk, dv, o);
    dq(0, 1, 0, 1) *= 1.01;
    double worst = 0.0;
    for (index_t i = 0; i < dq.size(); ++i) {
        const double p0 = p.q.data()[i], h = 1e-5;
        p.q.data()[i] = p0 + h;
        const double lp = loss(p, o);
        p.q.data()[i] = p0 - h;
        const double lm = loss(p, o);
        p.q.data()[i] = p0;
        worst = std::max(worst, std::abs((lp - lm) / (2 * h) - dq.data()[i]));
    }
    EXPECT_GT(worst, 1e-5);
}

// A row that sees no key contributes nothing; gradients of keys nobody sees are zero.
TEST(reference_taylor_attention_backward, masked_rows_and_keys_get_zero) {
    const shape s{2, 3, 4, 2, 1, 3, 2};
    problem p = make_problem(s, 7);
    taylor_options o;
    o.key_lengths = {2, 0};
    tensor4<double> out(s.B, s.Lq, s.H, s.Dv), dq(s.B, s.Lq, s.H, s.D), dk(s.B, s.Lk, s.Hk, s.D),
        dv(s.B, s.Lk, s.Hk, s.Dv);
    ref::taylor_attention(p.q, p.k, p.v, out, o);
    dq.setConstant(7.0);
    dk.setConstant(7.0);
    dv.setConstant(7.0);
    ref::taylor_attention_backward(p.q, p.k, p.v, out, p.r, dq, dk, dv, o);
    expect_unseen_keys_get_zero(dq, dk, dv);
}

// A NaN in one key's value reaches the gradients that depend on that key and no others.
TEST(reference_taylor_attention_backward, nan_stays_in_the_rows_that_see_it) {
    const shape s{1, 4, 4, 1, 1, 2, 2};
    problem p = make_problem(s, 9);
    p.v(0, 3, 0, 1) = std::numeric_limits<double>::quiet_NaN();
    taylor_options o;
    o.causal = true;
    tensor4<double> out(s.B, s.Lq, s.H, s.Dv), dq(s.B, s.Lq, s.H, s.D), dk(s.B, s.Lk, s.Hk, s.D),
        dv(s.B, s.Lk, s.Hk, s.Dv);
    ref::taylor_attention(p.q, p.k, p.v, out, o);
    ref::taylor_attention_backward(p.q, p.k, p.v, out, p.r, dq, dk, dv, o);
    for (index_t i = 0; i < 3; ++i)
        for (index_t d = 0; d < s.D; ++d) EXPECT_TRUE(std::isfinite(dq(0, i, 0, d))) << "row " << i;
    EXPECT_TRUE(std::isnan(dq(0, 3, 0, 0)));
}

// Bad input is rejected before any gradient is written.
TEST(reference_taylor_attention_backward, bad_input_rejected_before_writing) {
    const shape s{1, 3, 4, 2, 1, 3, 2};
    problem p = make_problem(s, 13);
    tensor4<double> out(s.B, s.Lq, s.H, s.Dv), dq(s.B, s.Lq, s.H, s.D), dk(s.B, s.Lk, s.Hk, s.D),
        dv(s.B, s.Lk, s.Hk, s.Dv);
    ref::taylor_attention(p.q, p.k, p.v, out, {});
    dq.setConstant(5.0);
    dk.setConstant(5.0);
    dv.setConstant(5.0);
    tensor4<double> bad_dq(s.B, s.Lq, s.H, s.D + 1);
    expect_invalid([&] { ref::taylor_attention_backward(p.q, p.k, p.v, out, p.r, bad_dq, dk, dv); },
                   {"d_q", "[1, 3, 2, 4]"});
    tensor4<double> bad_dout(s.B, s.Lq + 1, s.H, s.Dv);
    expect_invalid([&] { ref::taylor_attention_backward(p.q, p.k, p.v, out, bad_dout, dq, dk, dv); },
                   {"d_out", "[1, 4, 2, 2]"});
    taylor_options bad_eps;
    bad_eps.eps = -1.0f;
    expect_invalid([&] { ref::taylor_attention_backward(p.q, p.k, p.v, out, p.r, dq, dk, dv, bad_eps); }, "eps");
    expect_invalid([&] { ref::taylor_attention_backward(p.q, p.k, p.v, out, p.r, p.q, dk, dv); }, "d_q");
    expect_invalid([&] { ref::taylor_attention_backward(p.q, p.k, p.v, out, p.r, dq, dk, p.k); }, "d_v");
    for (index_t i = 0; i < dq.size(); ++i) ASSERT_EQ(5.0, dq.data()[i]);
    for (index_t i = 0; i < dk.size(); ++i) ASSERT_EQ(5.0, dk.data()[i]);
    for (index_t i = 0; i < dv.size(); ++i) ASSERT_EQ(5.0, dv.data()[i]);
}

}  // namespace
