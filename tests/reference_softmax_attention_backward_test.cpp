// attnkit::reference::softmax_attention_backward against central finite differences of the
// reference forward, all in double, with a random projection loss <out, R>: a loss that weighs
// every output element differently, so a gradient landing on the wrong element, head or row
// shows (sum(out) would hide it: it is invariant under permuting the outputs, and its d_out = 1
// makes D_i = sum_c out_ic, which misses layout errors of d_out entirely).
#include "attnkit/reference/softmax_attention_backward.hpp"

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
using attnkit::softmax_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;

using shape = fd_shape;
using problem = fd_problem;
const auto make_problem = make_fd_problem;

// loss = <out, r> of the reference forward in double.
double loss(const problem& p, const softmax_options& o) {
    tensor4<double> out(p.q.dimension(0), p.q.dimension(1), p.q.dimension(2), p.v.dimension(3));
    ref::softmax_attention(p.q, p.k, p.v, out, o);
    return projection_loss(out, p.r);
}

void expect_matches_fd(problem& p, tensor4<double>& x, const tensor4<double>& analytic, const softmax_options& o,
                       const char* name) {
    expect_gradient_matches_fd(x, analytic, [&] { return loss(p, o); }, name);
}

struct fd_case {
    std::string name;
    shape s;
    softmax_options o;
};

std::vector<fd_case> fd_cases() {
    std::vector<fd_case> cs;
    auto add = [&](std::string n, shape s, auto&& set) {
        softmax_options o;
        set(o);
        cs.push_back({std::move(n), s, o});
    };
    add("plain", {1, 4, 4, 2, 2, 3, 2}, [](softmax_options&) {});
    add("causal_gqa", {2, 5, 5, 4, 2, 5, 3}, [](softmax_options& o) { o.causal = true; });
    add("decode_rows", {1, 2, 7, 2, 1, 4, 3}, [](softmax_options& o) { o.causal = true; });
    add("more_queries_than_keys", {1, 6, 3, 2, 2, 3, 2}, [](softmax_options& o) { o.causal = true; });
    add("window", {1, 6, 6, 2, 1, 3, 3}, [](softmax_options& o) {
        o.causal = true;
        o.window_left = 1;
    });
    add("chunk", {1, 7, 7, 1, 1, 2, 2}, [](softmax_options& o) { o.chunk = 3; });
    add("key_lengths", {2, 3, 5, 2, 2, 3, 2}, [](softmax_options& o) { o.key_lengths = {3, 0}; });
    add("softcap_scale", {1, 4, 5, 2, 2, 4, 2}, [](softmax_options& o) {
        o.softcap = 1.5f;
        o.scale = 1.7f;
    });
    add("sinks_causal_gqa", {2, 4, 4, 4, 2, 3, 2}, [](softmax_options& o) {
        o.causal = true;
        o.sinks = {0.3f, -1.0f, 2.0f, -0.5f};
    });
    add("everything_mqa", {2, 5, 6, 3, 1, 3, 4}, [](softmax_options& o) {
        o.causal = true;
        o.window_left = 2;
        o.softcap = 2.0f;
        o.sinks = {0.5f, -0.25f, 1.0f};
        o.key_lengths = {6, 4};
    });
    return cs;
}

TEST(reference_softmax_attention_backward, matches_central_finite_differences) {
    std::uint64_t seed = 100;
    for (const fd_case& c : fd_cases()) {
        SCOPED_TRACE(c.name);
        const shape& s = c.s;
        problem p = make_problem(s, seed += 10);
        tensor4<double> out(s.B, s.Lq, s.H, s.Dv), dq(s.B, s.Lq, s.H, s.D), dk(s.B, s.Lk, s.Hk, s.D),
            dv(s.B, s.Lk, s.Hk, s.Dv);
        tensor3<double> lse(s.B, s.Lq, s.H);
        ref::softmax_attention(p.q, p.k, p.v, out, lse, c.o);
        Eigen::Tensor<double, 1, Eigen::RowMajor> ds(s.H);
        if (c.o.sinks.empty()) {
            ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, dq, dk, dv, c.o);
        } else {
            ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, dq, dk, dv, ds, c.o);
        }
        expect_matches_fd(p, p.q, dq, c.o, "d_q");
        expect_matches_fd(p, p.k, dk, c.o, "d_k");
        expect_matches_fd(p, p.v, dv, c.o, "d_v");
        // The sinks are float options: differences of +-h in float are not exact, so take the
        // step the float can hold exactly around each sink.
        for (std::size_t h = 0; h < c.o.sinks.size(); ++h) {
            softmax_options op = c.o, om = c.o;
            const float step = 1.0f / 1024.0f;
            op.sinks[h] += step;
            om.sinks[h] -= step;
            const double fd = (loss(p, op) - loss(p, om)) / (2.0 * step);
            EXPECT_NEAR(fd, ds(static_cast<index_t>(h)), 1e-5 * std::max(1.0, std::abs(fd))) << "d_sinks " << h;
        }
    }
}

// A row that sees no key contributes nothing; gradients of keys nobody sees are zero.
TEST(reference_softmax_attention_backward, masked_rows_and_keys_get_zero) {
    const shape s{2, 3, 4, 2, 1, 3, 2};
    problem p = make_problem(s, 7);
    softmax_options o;
    o.key_lengths = {2, 0};
    tensor4<double> out(s.B, s.Lq, s.H, s.Dv), dq(s.B, s.Lq, s.H, s.D), dk(s.B, s.Lk, s.Hk, s.D),
        dv(s.B, s.Lk, s.Hk, s.Dv);
    tensor3<double> lse(s.B, s.Lq, s.H);
    ref::softmax_attention(p.q, p.k, p.v, out, lse, o);
    dq.setConstant(7.0);
    dk.setConstant(7.0);
    dv.setConstant(7.0);
    ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, dq, dk, dv, o);
    expect_unseen_keys_get_zero(dq, dk, dv);
}

// A NaN in one key's value reaches the gradients that depend on that key and no others: rows
// that do not see it keep finite gradients.
TEST(reference_softmax_attention_backward, nan_stays_in_the_rows_that_see_it) {
    const shape s{1, 4, 4, 1, 1, 2, 2};
    problem p = make_problem(s, 9);
    p.v(0, 3, 0, 1) = std::numeric_limits<double>::quiet_NaN();
    softmax_options o;
    o.causal = true;
    tensor4<double> out(s.B, s.Lq, s.H, s.Dv), dq(s.B, s.Lq, s.H, s.D), dk(s.B, s.Lk, s.Hk, s.D),
        dv(s.B, s.Lk, s.Hk, s.Dv);
    tensor3<double> lse(s.B, s.Lq, s.H);
    ref::softmax_attention(p.q, p.k, p.v, out, lse, o);
    ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, dq, dk, dv, o);
    for (index_t i = 0; i < 3; ++i)
        for (index_t d = 0; d < s.D; ++d) EXPECT_TRUE(std::isfinite(dq(0, i, 0, d))) << "row " << i;
    EXPECT_TRUE(std::isnan(dq(0, 3, 0, 0)));
}

TEST(reference_softmax_attention_backward, float_inputs_and_gradients) {
    const shape s{1, 5, 5, 2, 1, 4, 3};
    problem p = make_problem(s, 11);
    softmax_options o;
    o.causal = true;
    tensor4<double> out(s.B, s.Lq, s.H, s.Dv), dq(s.B, s.Lq, s.H, s.D), dk(s.B, s.Lk, s.Hk, s.D),
        dv(s.B, s.Lk, s.Hk, s.Dv);
    tensor3<double> lse(s.B, s.Lq, s.H);
    // The double problem on float-representable values, then the float call on the same values.
    const tensor4<float> qf = p.q.cast<float>(), kf = p.k.cast<float>(), vf = p.v.cast<float>(), rf = p.r.cast<float>();
    p.q = qf.cast<double>();
    p.k = kf.cast<double>();
    p.v = vf.cast<double>();
    p.r = rf.cast<double>();
    ref::softmax_attention(p.q, p.k, p.v, out, lse, o);
    ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, dq, dk, dv, o);
    const tensor4<float> outf = out.cast<float>();
    const tensor3<float> lsef = lse.cast<float>();
    tensor4<float> gq(s.B, s.Lq, s.H, s.D), gk(s.B, s.Lk, s.Hk, s.D), gv(s.B, s.Lk, s.Hk, s.Dv);
    ref::softmax_attention_backward(qf, kf, vf, outf, lsef, rf, gq, gk, gv, o);
    for (index_t i = 0; i < dq.size(); ++i) EXPECT_EQ(static_cast<float>(dq.data()[i]), gq.data()[i]);
    for (index_t i = 0; i < dk.size(); ++i) EXPECT_EQ(static_cast<float>(dk.data()[i]), gk.data()[i]);
    for (index_t i = 0; i < dv.size(); ++i) EXPECT_EQ(static_cast<float>(dv.data()[i]), gv.data()[i]);
}

// Bad input is rejected before any gradient is written.
TEST(reference_softmax_attention_backward, bad_input_rejected_before_writing) {
    const shape s{1, 3, 4, 2, 1, 3, 2};
    problem p = make_problem(s, 13);
    tensor4<double> out(s.B, s.Lq, s.H, s.Dv), dq(s.B, s.Lq, s.H, s.D), dk(s.B, s.Lk, s.Hk, s.D),
        dv(s.B, s.Lk, s.Hk, s.Dv);
    tensor3<double> lse(s.B, s.Lq, s.H);
    ref::softmax_attention(p.q, p.k, p.v, out, lse, {});
    auto untouched = [&] {
        for (index_t i = 0; i < dq.size(); ++i) ASSERT_EQ(5.0, dq.data()[i]);
        for (index_t i = 0; i < dk.size(); ++i) ASSERT_EQ(5.0, dk.data()[i]);
        for (index_t i = 0; i < dv.size(); ++i) ASSERT_EQ(5.0, dv.data()[i]);
    };
    dq.setConstant(5.0);
    dk.setConstant(5.0);
    dv.setConstant(5.0);

    tensor4<double> bad_dq(s.B, s.Lq, s.H, s.D + 1);
    expect_invalid([&] { ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, bad_dq, dk, dv); },
                   {"d_q", "[1, 3, 2, 4]"});
    tensor4<double> bad_dout(s.B, s.Lq + 1, s.H, s.Dv);
    expect_invalid([&] { ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, bad_dout, dq, dk, dv); },
                   {"d_out", "[1, 4, 2, 2]"});
    tensor3<double> bad_lse(s.B, s.Lq, s.H + 1);
    expect_invalid([&] { ref::softmax_attention_backward(p.q, p.k, p.v, out, bad_lse, p.r, dq, dk, dv); }, "lse");
    Eigen::Tensor<double, 1, Eigen::RowMajor> ds(s.H);
    expect_invalid([&] { ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, dq, dk, dv, ds, {}); },
                   "d_sinks");
    softmax_options with_sinks;
    with_sinks.sinks = {0.0f, 0.0f};
    Eigen::Tensor<double, 1, Eigen::RowMajor> bad_ds(s.H + 1);
    expect_invalid(
        [&] { ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, dq, dk, dv, bad_ds, with_sinks); },
        "d_sinks");
    // Gradients that overlap an input or each other.
    expect_invalid([&] { ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, p.q, dk, dv); }, "d_q");
    expect_invalid([&] { ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, dq, dk, p.k); }, "d_v");
    // d_k and d_v in one buffer, overlapping.
    std::vector<double> shared(static_cast<std::size_t>(s.B * s.Lk * s.Hk * s.D));
    Eigen::TensorMap<tensor4<double>> dk_map(shared.data(), s.B, s.Lk, s.Hk, s.D);
    Eigen::TensorMap<tensor4<double>> dv_map(shared.data(), s.B, s.Lk, s.Hk, s.Dv);
    expect_invalid([&] { ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, dq, dk_map, dv_map); },
                   "d_v");
    untouched();
}

}  // namespace
