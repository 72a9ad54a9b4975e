// attnkit::taylor_state: steps of any size equal one causal call over the whole sequence, in
// the form the state used (quadratic below its crossover, linear from it on).
//
// Uneven steps (13, 1, 1, 7, 64, 65, ...) cross the chunk size (64) both ways; outputs are held
// against the quadratic oracle in double over the concatenated sequence, with the per-row
// float tolerance of taylor_linear_test (eps times the magnitude of the feature sums). Bitwise:
// a prefill in one step is taylor_attention(causal, form = automatic), i.e. the quadratic form
// below the crossover and the linear form from it on (lengths swept around the crossover and
// the 64-token chunk edges), and after the fold (cached tokens into S) every step of >= 2
// tokens gives the linear form's bits, which a wrong fold point or chunk order would change.
#include "attnkit/taylor_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/reference/taylor_attention.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/sweep.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::taylor_options;
using attnkit::taylor_state;
using namespace attnkit_test;
namespace ref = attnkit::reference;

// |out - expected| <= 16 eps max|v| mean_j (1 + (1 + scale |q_i|·|k_j|)^2) per row (causal), rows
// i >= from_row.
template <class E>
::testing::AssertionResult causal_close(const tensor4<float>& out, const tensor4<E>& expected,
                                        const tensor4<float>& q, const tensor4<float>& k, const tensor4<float>& v,
                                        index_t from_row = 0) {
    const index_t B = q.dimension(0), L = q.dimension(1), H = q.dimension(2), Hk = k.dimension(2);
    const index_t D = q.dimension(3), Dv = v.dimension(3);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D)), vmax = max_abs(v);
    for (index_t b = 0; b < B; ++b)
        for (index_t i = from_row; i < L; ++i)
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
        st.step(sequence_rows(s.q, t0, T), sequence_rows(s.k, t0, T), sequence_rows(s.v, t0, T), o);
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
    const index_t dims[] = {1, 8, 17, 64};
    for (std::size_t t = 0; t < std::size(kAllDistributions); ++t)
        for (std::size_t di = 0; di < std::size(dims); ++di) {
            // The sanitizer builds: every head dim, in one distribution each (the values reach
            // no other code).
            if (kSanitizerSweep && t != di % std::size(kAllDistributions)) continue;
            const distribution dist = kAllDistributions[t];
            const index_t D = dims[di];
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
// chunk segments in the call either): L = 300 is past this shape's crossover (220).
TEST(taylor_state, prefill_in_one_step_is_the_linear_form) {
    const sequence s = make_sequence(2, 300, 4, 2, 12, 10, distribution::uniform, 9);
    taylor_state st(2, 4, 2, 12, 10);
    ASSERT_LE(st.crossover(), 300);
    const tensor4<float> a = run_steps(st, s, {300});
    EXPECT_EQ(attnkit::taylor_form::linear, st.form());
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
    ASSERT_LT(135, st.crossover());  // the last step folds the cache (crossover 180 <= 200)
    ASSERT_GE(200, st.crossover());
    const tensor4<float> first = run_steps(st, s, steps);
    EXPECT_EQ(attnkit::taylor_form::linear, st.form());
    st.reset();
    EXPECT_EQ(0, st.length());
    EXPECT_EQ(attnkit::taylor_form::quadratic, st.form());
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

// form = linear: the old always-linear state, S from the start, constant size.
TEST(taylor_state, linear_state_bytes_do_not_grow) {
    taylor_options o;
    o.form = attnkit::taylor_form::linear;
    taylor_state st(1, 8, 8, 64, 64, o);
    EXPECT_EQ(0, st.crossover());
    EXPECT_EQ(attnkit::taylor_form::linear, st.form());
    const std::size_t bytes = st.state_bytes();
    EXPECT_GE(bytes, std::size_t(8) * 2145 * 65 * sizeof(float));  // F = 2145 rows of Dv + 1
    const sequence s = make_sequence(1, 5, 8, 8, 64, 64, distribution::uniform, 13);
    run_steps(st, s, {5});
    EXPECT_EQ(bytes, st.state_bytes());
    st.reset();
    EXPECT_EQ(bytes, st.state_bytes());
    EXPECT_EQ(attnkit::taylor_form::linear, st.form());
}

// The documented crossover of the suite's shape (D = Dv = 64, H = Hk = 8): 5061; its fold
// length 1090 = ceil(F (Dv + 1) / (D + Dv)), F = 2145; forced forms fold at their crossover.
TEST(taylor_state, crossover_of_the_decoder_shape) {
    EXPECT_EQ(5061, taylor_state(1, 8, 8, 64, 64).crossover());
    EXPECT_EQ(1090, taylor_state(1, 8, 8, 64, 64).fold_length());
    taylor_options lo;
    lo.form = attnkit::taylor_form::linear;
    EXPECT_EQ(0, taylor_state(1, 8, 8, 64, 64, lo).fold_length());
    taylor_options o;
    o.form = attnkit::taylor_form::quadratic;
    EXPECT_EQ(index_t(1) << 24, taylor_state(1, 8, 8, 64, 64, o).crossover());
}

// taylor_attention over the first L tokens of s, causal, in the given form.
tensor4<float> causal_call(const sequence& s, index_t L, attnkit::taylor_form form) {
    tensor4<float> out = make_bshd<float>(s.q.dimension(0), L, s.q.dimension(2), s.v.dimension(3));
    taylor_options o;
    o.causal = true;
    o.form = form;
    attnkit::taylor_attention(sequence_rows(s.q, 0, L), sequence_rows(s.k, 0, L), sequence_rows(s.v, 0, L), out, o);
    return out;
}

bool same_bits(const tensor4<float>& a, const tensor4<float>& b) {
    return a.size() == b.size() &&
           std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<std::size_t>(a.size())) == 0;
}

// x with rows [t0, t0 + T) replaced by the step's output o [B, T, H, Dv].
tensor4<float> with_rows(tensor4<float> x, const tensor4<float>& o, index_t t0) {
    for (index_t b = 0; b < o.dimension(0); ++b)
        for (index_t t = 0; t < o.dimension(1); ++t)
            for (index_t h = 0; h < o.dimension(2); ++h)
                for (index_t d = 0; d < o.dimension(3); ++d) x(b, t0 + t, h, d) = o(b, t, h, d);
    return x;
}

// Shape of the fold tests: B Hk = 4 (the linear call runs no chunk segments), crossover 343 =
// 5 * 64 + 23: a fold adds up to 5 chunks (enough for their order to change the bits; with 2,
// A + B = B + A), and the sweeps cross chunk edges on both sides of it.
constexpr index_t kB = 2, kH = 4, kHk = 2, kD = 16, kDv = 16;

TEST(taylor_state, one_step_prefill_is_the_automatic_form_around_the_crossover) {
    const index_t X = taylor_state(kB, kH, kHk, kD, kDv).crossover();
    ASSERT_EQ(343, X);
    const sequence s = make_sequence(kB, X + 130, kH, kHk, kD, kDv, distribution::gaussian, 21);
    for (const index_t L : {index_t(1), index_t(2), index_t(63), index_t(64), index_t(65), index_t(127),
                            index_t(128), index_t(129), index_t(320), X - 1, X, X + 1, X + 41, X + 42, X + 43,
                            X + 63, X + 65, X + 130}) {
        // The sanitizer builds keep the block edges and the crossover, not the lengths between.
        if (kSanitizerSweep && (L == 2 || L == 127 || L == 320 || L == X + 41 || L == X + 43 || L == X + 130))
            continue;
        SCOPED_TRACE(::testing::Message() << "L " << L);
        taylor_state st(kB, kH, kHk, kD, kDv);
        const tensor4<float> out = run_steps(st, s, {L});
        const auto used = L < X ? attnkit::taylor_form::quadratic : attnkit::taylor_form::linear;
        // After the step: folded once L reaches the fold length (below X here).
        EXPECT_EQ(L < st.fold_length() ? attnkit::taylor_form::quadratic : attnkit::taylor_form::linear, st.form());
        EXPECT_TRUE(same_bits(out, causal_call(s, L, used)));
        // The state's crossover is automatic's: the call picks the same form at every L.
        EXPECT_TRUE(same_bits(out, causal_call(s, L, attnkit::taylor_form::automatic)));
        tensor4<double> expected = make_bshd<double>(kB, L, kH, kDv);
        taylor_options o;
        o.causal = true;
        ref::taylor_attention(sequence_rows(s.q, 0, L), sequence_rows(s.k, 0, L),
                              sequence_rows(s.v, 0, L), expected, o);
        EXPECT_TRUE(causal_close(out, expected, sequence_rows(s.q, 0, L), sequence_rows(s.k, 0, L),
                                 sequence_rows(s.v, 0, L)));
    }
    // The two forms differ in their bits here, so the comparisons above can tell them apart.
    EXPECT_FALSE(same_bits(causal_call(s, X, attnkit::taylor_form::quadratic),
                           causal_call(s, X, attnkit::taylor_form::linear)));
}

// A quadratic prefill, then steps of >= 2 tokens across the crossover: the step that reaches it
// folds the cache, and from it on every row is the linear form's, bit for bit (the fold's
// chunks, their order and the current chunk's tokens must all be the linear kernel's). 1, 2 and
// 3 threads.
TEST(taylor_state, fold_gives_the_linear_forms_bits) {
    const index_t X = taylor_state(kB, kH, kHk, kD, kDv).crossover();
    const sequence s = make_sequence(kB, X + 200, kH, kHk, kD, kDv, distribution::uniform, 23);
    const std::vector<std::vector<index_t>> plans = {
        {X - 1, 2, 65},      {X - 1, 66, 64}, {X - 2, 64, 3},       {320, 22, 2, 63},      {320, 23, 64},
        {64, X - 64, 65},    {255, 100, 2},   {1, 2, X - 4, 2, 63}, {63, 64, 13, 192, 130}, {X - 3, 3, 2},
        {X - 65, 64, 2, 65}, {2, 2, 2, X, 2}, {256, 64, 23}};
    for (const auto& steps : plans) {
        SCOPED_TRACE(::testing::Message() << "steps " << ::testing::PrintToString(steps));
        index_t total = 0;
        for (index_t T : steps) total += T;
        const tensor4<float> lin = causal_call(s, total, attnkit::taylor_form::linear);
        for (std::size_t threads : {1u, 2u, 3u}) {
            attnkit::thread_pool pool(threads);
            taylor_options o;
            o.pool = threads > 1 ? &pool : nullptr;
            taylor_state st(kB, kH, kHk, kD, kDv, o);
            const index_t Y = st.fold_length();
            index_t t0 = 0;
            bool folded = false;  // before the step
            for (std::size_t i = 0; i < steps.size(); ++i) {
                const index_t T = steps[i];
                tensor4<float> o_step = make_bshd<float>(kB, T, kH, kDv, 7.0f);
                st.step(sequence_rows(s.q, t0, T), sequence_rows(s.k, t0, T), sequence_rows(s.v, t0, T), o_step);
                const bool linear_step = folded || t0 + T >= X;
                folded = folded || t0 + T >= Y;
                EXPECT_EQ(folded ? attnkit::taylor_form::linear : attnkit::taylor_form::quadratic, st.form());
                if (linear_step) {
                    EXPECT_TRUE(same_bits(o_step, sequence_rows(lin, t0, T)))
                        << "step " << i << ", " << threads << " threads";
                } else if (i == 0) {  // a first quadratic step is the quadratic call
                    EXPECT_TRUE(same_bits(o_step, causal_call(s, T, attnkit::taylor_form::quadratic)));
                } else {  // later quadratic steps: the call's driver splits keys differently
                    const tensor4<float> quad = causal_call(s, t0 + T, attnkit::taylor_form::quadratic);
                    EXPECT_TRUE(causal_close(with_rows(quad, o_step, t0), quad, sequence_rows(s.q, 0, t0 + T),
                                             sequence_rows(s.k, 0, t0 + T), sequence_rows(s.v, 0, t0 + T), t0));
                }
                t0 += T;
            }
        }
    }
}

// One token at a time across the fold length: the form switches exactly at it, each decode row
// equals the last row of a prefill one token longer in the form the step used (float
// tolerance: a one-token step reads S with the row kernel), and the cache grows only up to the
// fold, within its bound, after which the size stays constant.
TEST(taylor_state, decode_across_the_crossover) {
    taylor_state st(kB, kH, kHk, kD, kDv);
    // One-token steps never reach the prefill crossover before the fold length: they switch
    // at the latter (82 here: the cache's 32 floats per token outgrow S's 153 x 17).
    const index_t X = st.fold_length();
    ASSERT_EQ(82, X);
    const index_t L = X + 140;
    const sequence s = make_sequence(kB, L, kH, kHk, kD, kDv, distribution::outliers, 29);
    tensor4<float> out = make_bshd<float>(kB, L, kH, kDv, 7.0f);
    std::size_t prev_bytes = st.state_bytes();
    int growths = 0;
    const auto cache_bytes = [](index_t n) {
        return sizeof(float) * static_cast<std::size_t>(kB * kHk * n * (kD + kDv));
    };
    for (index_t n = 0; n < L; ++n) {
        EXPECT_EQ(n >= X ? attnkit::taylor_form::linear : attnkit::taylor_form::quadratic, st.form()) << n;
        tensor4<float> o = make_bshd<float>(kB, 1, kH, kDv, 7.0f);
        st.step(sequence_rows(s.q, n, 1), sequence_rows(s.k, n, 1), sequence_rows(s.v, n, 1), o);
        out = with_rows(std::move(out), o, n);
        const bool linear = n + 1 >= X;
        ASSERT_EQ(linear ? attnkit::taylor_form::linear : attnkit::taylor_form::quadratic, st.form()) << n;
        if (!linear) {  // the cache: the tokens held, at most twice (doubling)
            EXPECT_GE(st.state_bytes(), prev_bytes) << n;
            EXPECT_GE(st.state_bytes(), cache_bytes(n + 1)) << n;
            EXPECT_LE(st.state_bytes(), cache_bytes(std::max<index_t>(2 * n, 64))) << n;
            EXPECT_LE(st.state_bytes(), cache_bytes(128)) << n;  // one doubling past X at most
            growths += st.state_bytes() != prev_bytes;
        } else if (n + 1 > X) {
            EXPECT_EQ(prev_bytes, st.state_bytes()) << n;  // S and the current chunk: constant
        }
        prev_bytes = st.state_bytes();
        for (const index_t edge : {index_t(63), index_t(64), index_t(65), X - 2, X - 1, X, X + 1, X + 63, X + 65})
            if (n == edge) {
                SCOPED_TRACE(::testing::Message() << "decode at " << n);
                const tensor4<float> pre =
                    causal_call(s, n + 1, n >= X ? attnkit::taylor_form::linear : attnkit::taylor_form::quadratic);
                EXPECT_TRUE(causal_close(with_rows(pre, o, n), pre, sequence_rows(s.q, 0, n + 1),
                                         sequence_rows(s.k, 0, n + 1), sequence_rows(s.v, 0, n + 1),
                                         n));
            }
    }
    EXPECT_EQ(2, growths);  // amortised: 64, then 128, folded at 82
    tensor4<double> expected = make_bshd<double>(kB, L, kH, kDv);
    taylor_options o;
    o.causal = true;
    ref::taylor_attention(s.q, s.k, s.v, expected, o);
    EXPECT_TRUE(causal_close(out, expected, s.q, s.k, s.v));
}

// Cache growth: steps across the capacity doublings (64, 128, 256) at odd offsets, GQA 4:1,
// against the oracle, in automatic (crossover 297 here: folds in the 129-token step) and both
// forced forms.
TEST(taylor_state, uneven_steps_in_every_form) {
    const std::vector<index_t> steps = {1, 62, 1, 1, 63, 2, 64, 1, 65, 3, 129, 1, 7};  // 400 tokens
    const index_t L = 400;
    const sequence s = make_sequence(1, L, 4, 1, 16, 16, distribution::gaussian, 31);
    tensor4<double> expected = make_bshd<double>(1, L, 4, 16);
    taylor_options ro;
    ro.causal = true;
    ref::taylor_attention(s.q, s.k, s.v, expected, ro);
    for (const auto form : {attnkit::taylor_form::automatic, attnkit::taylor_form::quadratic,
                            attnkit::taylor_form::linear}) {
        SCOPED_TRACE(::testing::Message() << "form " << static_cast<int>(form));
        taylor_options o;
        o.form = form;
        taylor_state st(1, 4, 1, 16, 16, o);
        if (form == attnkit::taylor_form::automatic) {
            ASSERT_EQ(297, st.crossover());
        }
        const tensor4<float> out = run_steps(st, s, steps);
        EXPECT_EQ(form == attnkit::taylor_form::quadratic ? attnkit::taylor_form::quadratic
                                                          : attnkit::taylor_form::linear,
                  st.form());
        EXPECT_TRUE(causal_close(out, expected, s.q, s.k, s.v));
        if (form == attnkit::taylor_form::quadratic) {  // a pure cache: 4 (D + Dv) bytes per token
            EXPECT_GE(st.state_bytes(), sizeof(float) * std::size_t(L * 32));
        }
    }
}

// Forced forms keep one form: linear below the crossover gives the linear call's bits, quadratic
// past it the quadratic call's.
TEST(taylor_state, forced_forms) {
    const index_t X = taylor_state(kB, kH, kHk, kD, kDv).crossover();
    const sequence s = make_sequence(kB, X + 65, kH, kHk, kD, kDv, distribution::gaussian, 37);
    taylor_options o;
    o.form = attnkit::taylor_form::linear;
    taylor_state lin(kB, kH, kHk, kD, kDv, o);
    EXPECT_TRUE(same_bits(run_steps(lin, s, {100}), causal_call(s, 100, attnkit::taylor_form::linear)));
    o.form = attnkit::taylor_form::quadratic;
    taylor_state quad(kB, kH, kHk, kD, kDv, o);
    EXPECT_TRUE(same_bits(run_steps(quad, s, {X + 65}), causal_call(s, X + 65, attnkit::taylor_form::quadratic)));
    EXPECT_EQ(attnkit::taylor_form::quadratic, quad.form());
}

// ---- bad steps: std::invalid_argument naming the argument; out and the state unchanged ----

// Scores ~1e20 (w ~ s^2/2 past float) in every form of the state, with keys that grow from
// ordinary to ~1e10 mid-sequence: the linear state then scales what S holds by an exact power
// of two (its key shift rises) and each step's large queries by their own. Outputs are weighted
// means of v and match the oracle to float rounding of the scores (as taylor_attention_test's
// scores_of_1e20_stay_finite). Uneven steps cross the chunk edges and the fold.
TEST(taylor_state, scores_of_1e20_stay_finite) {
    for (const attnkit::taylor_form form :
         {attnkit::taylor_form::linear, attnkit::taylor_form::automatic, attnkit::taylor_form::quadratic}) {
        SCOPED_TRACE(static_cast<int>(form));
        sequence s = make_sequence(1, 288, 2, 1, 4, 5, distribution::uniform, 31);
        for (index_t i = 0; i < 288; ++i)
            for (index_t d = 0; d < 4; ++d) {
                for (index_t h = 0; h < 2; ++h) s.q(0, i, h, d) = 1e10f * (1.5f + 0.5f * s.q(0, i, h, d));
                s.k(0, i, 0, d) = (i >= 100 ? 1e10f : 1.0f) * (1.5f + 0.5f * s.k(0, i, 0, d));
            }
        taylor_options o;
        o.form = form;
        taylor_state st(1, 2, 1, 4, 5, o);
        const tensor4<float> out = run_steps(st, s, kUneven);
        for (index_t i = 0; i < out.size(); ++i) ASSERT_TRUE(std::isfinite(out.data()[i])) << i;
        tensor4<double> expected = make_bshd<double>(1, 288, 2, 5);
        o.causal = true;
        ref::taylor_attention(s.q, s.k, s.v, expected, o);
        EXPECT_TRUE(all_close(out, expected, tolerance_for(64, max_abs(s.v))));
    }
}

TEST(taylor_state, bad_steps_change_nothing) {
  for (const auto form : {attnkit::taylor_form::automatic, attnkit::taylor_form::linear}) {
    SCOPED_TRACE(::testing::Message() << "form " << static_cast<int>(form));
    const sequence s = make_sequence(2, 20, 4, 2, 8, 6, distribution::gaussian, 17);
    taylor_options fo;
    fo.form = form;
    taylor_state st(2, 4, 2, 8, 6, fo), fresh(2, 4, 2, 8, 6, fo);
    run_steps(st, s, {10});
    run_steps(fresh, s, {10});
    const auto q = sequence_rows(s.q, 10, 3), k = sequence_rows(s.k, 10, 3), v = sequence_rows(s.v, 10, 3);
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
    expect_invalid([&] { st.step(q_0, sequence_rows(s.k, 0, 0), sequence_rows(s.v, 0, 0), out); }, "T >= 1");
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
    o = {};
    o.form = static_cast<attnkit::taylor_form>(7);
    expect_invalid([&] { taylor_state(1, 2, 2, 8, 8, o); }, "opts.form");
}

// The linear form's feature table has F = 1 + D + D(D+1)/2 rows: a form = quadratic state never
// builds it (D = 2^31 constructs, holds nothing and steps nothing bigger than its cache), and a
// state that may go linear rejects a D whose table or state cannot be counted, naming dim.
TEST(taylor_state, huge_dim_builds_no_feature_table_unless_linear) {
    const index_t D = index_t(1) << 31;
    taylor_options o;
    o.form = attnkit::taylor_form::quadratic;
    const taylor_state st(1, 1, 1, D, 1, o);
    EXPECT_EQ(0u, st.state_bytes());
    EXPECT_EQ(attnkit::taylor_form::quadratic, st.form());
    for (auto form : {attnkit::taylor_form::automatic, attnkit::taylor_form::linear}) {
        o.form = form;
        expect_invalid([&] { taylor_state(1, 1, 1, D, 1, o); }, "dim");
    }
}

}  // namespace
