// attnkit::taylor_state: steps of any size equal one causal call over the whole sequence.
//
// Uneven steps (13, 1, 1, 7, 64, 65, ...) cross the chunk size (64) both ways; outputs are held
// against the quadratic oracle in double over the concatenated sequence, with the per-row
// float tolerance of taylor_linear_test (eps times the magnitude of the feature sums). A
// prefill in one step is bitwise the linear form of taylor_attention (same chunks, same order).
#include "attnkit/taylor_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/reference/taylor_attention.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::taylor_options;
using attnkit::taylor_state;
using namespace attnkit_test;
namespace ref = attnkit::reference;

// Rows [t0, t0 + T) of a [B, L, H, D] tensor as a dense [B, T, H, D] tensor.
tensor4<float> slice(const tensor4<float>& x, index_t t0, index_t T) {
    tensor4<float> y(x.dimension(0), T, x.dimension(2), x.dimension(3));
    for (index_t b = 0; b < x.dimension(0); ++b)
        for (index_t t = 0; t < T; ++t)
            for (index_t h = 0; h < x.dimension(2); ++h)
                for (index_t d = 0; d < x.dimension(3); ++d) y(b, t, h, d) = x(b, t0 + t, h, d);
    return y;
}

// |out - expected| <= 16 eps max|v| mean_j (1 + (1 + scale |q_i|·|k_j|)^2) per row (causal).
::testing::AssertionResult causal_close(const tensor4<float>& out, const tensor4<double>& expected,
                                        const tensor4<float>& q, const tensor4<float>& k, const tensor4<float>& v) {
    const index_t B = q.dimension(0), L = q.dimension(1), H = q.dimension(2), Hk = k.dimension(2);
    const index_t D = q.dimension(3), Dv = v.dimension(3);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D)), vmax = max_abs(v);
    for (index_t b = 0; b < B; ++b)
        for (index_t i = 0; i < L; ++i)
            for (index_t h = 0; h < H; ++h) {
                double mag = 0.0;
                for (index_t j = 0; j <= i; ++j) {
                    double dot = 1.0;
                    for (index_t d = 0; d < D; ++d)
                        dot += scale * std::fabs(q(b, i, h, d)) * std::fabs(k(b, j, h / (H / Hk), d));
                    mag += 1.0 + dot * dot;
                }
                const double tol = 16 * kEpsFloat * vmax * mag / static_cast<double>(i + 1);
                for (index_t d = 0; d < Dv; ++d)
                    if (!(std::fabs(out(b, i, h, d) - expected(b, i, h, d)) <= tol))
                        return ::testing::AssertionFailure()
                               << "at [" << b << ", " << i << ", " << h << ", " << d << "]: got " << out(b, i, h, d)
                               << ", expected " << expected(b, i, h, d) << ", allowed " << tol;
            }
    return ::testing::AssertionSuccess();
}

struct sequence {
    tensor4<float> q, k, v;
};

sequence make_sequence(index_t B, index_t L, index_t H, index_t Hk, index_t D, index_t Dv, distribution d,
                       std::uint64_t seed) {
    return {random_bshd<float>(B, L, H, D, d, seed), random_bshd<float>(B, L, Hk, D, d, seed + 1),
            random_bshd<float>(B, L, Hk, Dv, d, seed + 2)};
}

// Runs the steps and returns the concatenated outputs [B, sum(steps), H, Dv].
tensor4<float> run_steps(taylor_state& st, const sequence& s, const std::vector<index_t>& steps) {
    const index_t B = s.q.dimension(0), H = s.q.dimension(2), Dv = s.v.dimension(3);
    index_t L = 0;
    for (index_t t : steps) L += t;
    tensor4<float> out = make_bshd<float>(B, L, H, Dv, 7.0f);
    index_t t0 = 0;
    for (index_t T : steps) {
        tensor4<float> o = make_bshd<float>(B, T, H, Dv, 7.0f);
        st.step(slice(s.q, t0, T), slice(s.k, t0, T), slice(s.v, t0, T), o);
        for (index_t b = 0; b < B; ++b)
            for (index_t t = 0; t < T; ++t)
                for (index_t h = 0; h < H; ++h)
                    for (index_t d = 0; d < Dv; ++d) out(b, t0 + t, h, d) = o(b, t, h, d);
        t0 += T;
        EXPECT_EQ(t0, st.length());
    }
    return out;
}

const std::vector<index_t> kUneven = {13, 1, 1, 7, 64, 65, 1, 2, 130, 3, 1};  // 288 tokens

TEST(taylor_state, uneven_steps_equal_one_causal_call) {
    for (const distribution dist : kAllDistributions)
        for (const index_t D : {index_t(1), index_t(8), index_t(17), index_t(64)}) {
            SCOPED_TRACE(::testing::Message() << dist << " D " << D);
            const sequence s = make_sequence(2, 288, 4, 2, D, 9, dist, 100 + static_cast<std::uint64_t>(D));
            taylor_state st(2, 4, 2, D, 9);
            const tensor4<float> out = run_steps(st, s, kUneven);
            tensor4<double> expected = make_bshd<double>(2, 288, 4, 9);
            taylor_options o;
            o.causal = true;
            ref::taylor_attention(s.q, s.k, s.v, expected, o);
            EXPECT_TRUE(causal_close(out, expected, s.q, s.k, s.v));
        }
}

TEST(taylor_state, decode_one_token_at_a_time) {
    const sequence s = make_sequence(1, 150, 2, 1, 16, 16, distribution::gaussian, 7);
    taylor_state st(1, 2, 1, 16, 16);
    const tensor4<float> out = run_steps(st, s, std::vector<index_t>(150, 1));
    tensor4<double> expected = make_bshd<double>(1, 150, 2, 16);
    taylor_options o;
    o.causal = true;
    ref::taylor_attention(s.q, s.k, s.v, expected, o);
    EXPECT_TRUE(causal_close(out, expected, s.q, s.k, s.v));
}

// One step of L tokens is the linear form of taylor_attention, bit for bit (B Hk >= 4: no
// chunk segments in the call either).
TEST(taylor_state, prefill_in_one_step_is_the_linear_form) {
    const sequence s = make_sequence(2, 300, 4, 2, 12, 10, distribution::uniform, 9);
    taylor_state st(2, 4, 2, 12, 10);
    const tensor4<float> a = run_steps(st, s, {300});
    tensor4<float> b = make_bshd<float>(2, 300, 4, 10);
    taylor_options o;
    o.causal = true;
    o.form = attnkit::taylor_form::linear;
    attnkit::taylor_attention(s.q, s.k, s.v, b, o);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())));
    o.form = attnkit::taylor_form::quadratic;  // and the quadratic form within float tolerance
    tensor4<double> expected = make_bshd<double>(2, 300, 4, 10);
    ref::taylor_attention(s.q, s.k, s.v, expected, o);
    EXPECT_TRUE(causal_close(a, expected, s.q, s.k, s.v));
}

TEST(taylor_state, reset_and_thread_count_determinism) {
    const sequence s = make_sequence(1, 200, 3, 3, 8, 8, distribution::outliers, 11);
    const std::vector<index_t> steps = {70, 1, 64, 65};
    taylor_state st(1, 3, 3, 8, 8);
    const tensor4<float> first = run_steps(st, s, steps);
    st.reset();
    EXPECT_EQ(0, st.length());
    const tensor4<float> again = run_steps(st, s, steps);
    EXPECT_EQ(0, std::memcmp(first.data(), again.data(), sizeof(float) * static_cast<std::size_t>(first.size())));
    for (std::size_t n : {2u, 3u}) {
        attnkit::thread_pool pool(n);
        taylor_options o;
        o.pool = &pool;
        taylor_state sp(1, 3, 3, 8, 8, o);
        const tensor4<float> many = run_steps(sp, s, steps);
        EXPECT_EQ(0, std::memcmp(first.data(), many.data(), sizeof(float) * static_cast<std::size_t>(first.size())))
            << n << " threads";
    }
}

TEST(taylor_state, state_bytes_do_not_grow) {
    taylor_state st(1, 8, 8, 64, 64);
    const std::size_t bytes = st.state_bytes();
    EXPECT_GE(bytes, std::size_t(8) * 2145 * 65 * sizeof(float));  // F = 2145 rows of Dv + 1
    const sequence s = make_sequence(1, 5, 8, 8, 64, 64, distribution::uniform, 13);
    run_steps(st, s, {5});
    EXPECT_EQ(bytes, st.state_bytes());
}

// ---- bad steps: std::invalid_argument naming the argument; out and the state unchanged ----

TEST(taylor_state, bad_steps_change_nothing) {
    const sequence s = make_sequence(2, 20, 4, 2, 8, 6, distribution::gaussian, 17);
    taylor_state st(2, 4, 2, 8, 6), fresh(2, 4, 2, 8, 6);
    run_steps(st, s, {10});
    run_steps(fresh, s, {10});
    const auto q = slice(s.q, 10, 3), k = slice(s.k, 10, 3), v = slice(s.v, 10, 3);
    tensor4<float> out = make_bshd<float>(2, 3, 4, 6, 7.0f);
    const auto q_b = random_bshd<float>(1, 3, 4, 8, distribution::uniform, 1);   // B
    const auto q_h = random_bshd<float>(2, 3, 2, 8, distribution::uniform, 1);   // H
    const auto k_hk = random_bshd<float>(2, 3, 4, 8, distribution::uniform, 1);  // Hk
    const auto k_d = random_bshd<float>(2, 3, 2, 9, distribution::uniform, 1);   // D
    const auto v_dv = random_bshd<float>(2, 3, 2, 5, distribution::uniform, 1);  // Dv
    const auto k_t = random_bshd<float>(2, 4, 2, 8, distribution::uniform, 1);   // T differs
    const auto q_0 = random_bshd<float>(2, 0, 4, 8, distribution::uniform, 1);   // T = 0
    tensor4<float> out_dv = make_bshd<float>(2, 3, 4, 5, 7.0f);
    expect_invalid([&] { st.step(q_b, k, v, out); }, "q: expected shape");
    expect_invalid([&] { st.step(q_h, k, v, out); }, "q: expected shape");
    expect_invalid([&] { st.step(q, k_hk, v, out); }, "k: expected shape");
    expect_invalid([&] { st.step(q, k_d, v, out); }, "k: expected shape");
    expect_invalid([&] { st.step(q, k, v_dv, out_dv); }, "v: expected shape");
    expect_invalid([&] { st.step(q, k_t, v, out); }, "k: expected shape");
    expect_invalid([&] { st.step(q_0, slice(s.k, 0, 0), slice(s.v, 0, 0), out); }, "T >= 1");
    expect_invalid([&] { st.step(q, k, v, out_dv); }, "out: expected shape");
    tensor4<float> kk = k;  // out overlapping k
    expect_invalid([&] { st.step(q, kk, v, attnkit::view<float, 4>(kk.data(), {2, 3, 4, 6})); }, "out");
    EXPECT_TRUE(all_equal_to(out, 7.0f));
    EXPECT_TRUE(all_equal_to(out_dv, 7.0f));
    EXPECT_EQ(10, st.length());
    // The state is unchanged: the next good step gives what a never-failed state gives.
    tensor4<float> a = make_bshd<float>(2, 3, 4, 6), b = make_bshd<float>(2, 3, 4, 6);
    st.step(q, k, v, a);
    fresh.step(q, k, v, b);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())));
}

TEST(taylor_state, bad_construction) {
    taylor_options o;
    expect_invalid([&] { taylor_state(1, 3, 2, 8, 8, o); }, "multiple of heads_kv");
    expect_invalid([&] { taylor_state(1, 2, 2, 0, 8, o); }, "dim");
    o.eps = -1.0f;
    expect_invalid([&] { taylor_state(1, 2, 2, 8, 8, o); }, "opts.eps");
    o = {};
    o.key_lengths = {3};
    expect_invalid([&] { taylor_state(1, 2, 2, 8, 8, o); }, "key_lengths");
}

}  // namespace
