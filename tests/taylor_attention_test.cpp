// attnkit::taylor_attention (the fast kernel) against attnkit::reference::taylor_attention.
//
// The quadratic form runs on the tile engine with the Taylor row policy: panels of 2W rows
// (W = SIMD width: 8 AVX2, 4 SSE2, 16 AVX-512), blocks of up to 256 rows, key blocks of 96, and
// split-KV (pieces merged by addition) with fewer than 64 work items and Lk >= 512. The sweep
// straddles those edges and the lane width (1, W-1, W, W+1, 3W+2, odd primes), with Lq != Lk
// both ways, every GQA ratio of H = 12 (Hk = 1, 2, 3, 4, 6, 12) and H = 5, causal or not,
// key_lengths (including 0), rotating through the three input distributions.
//
// What is covered:
//   sweep.quadratic/<case>   opts.form = quadratic against the reference.
//   sweep.automatic/<case>   opts.form = automatic (whichever form the cost model picks;
//                            long_automatic cases make it pick linear) against the reference.
//   no_visible_key           rows that see no key (key_lengths 0, causal Lq > Lk) are exact
//                            zeros, also with eps = 0.
//   eps                      eps enters the denominator: eps = 0, the default and a large eps.
//   extreme                  scores of magnitude 1e4 stay finite and correct; a NaN in one value
//                            row reaches only the rows that see it.
//   threads                  1, 2 and 3 threads (and no pool) bitwise identical, every form.
//   bad_input                each rejected argument throws std::invalid_argument naming it, and
//                            out is unchanged.
//
// Tolerance: tolerance_for(kOutEps, attention_magnitude(q, k, v, scale)), the softmax's. Why it
// holds for w = 1 + s + s^2/2: an error ds in a score moves w by (1 + s) ds, and
// (1 + s) / (1 + s + s^2/2) <= 1.21, so each weight has the same relative error bound as a
// softmax probability, eps * S with S = scale max|q| max|k|; the output mixes values of size
// max|v|. kOutEps = 16, as softmax_attention_test.
#include "attnkit/taylor_attention.hpp"

#include "attnkit/reference/taylor_attention.hpp"
#include "attnkit/thread_pool.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::taylor_form;
using attnkit::taylor_options;
using attnkit::view;
using namespace attnkit_test;

constexpr double kOutEps = 16;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr index_t W = attnkit::simd::kLanes<attnkit::simd::default_arch>;

struct taylor_case {
    index_t B, Lq, Lk, H, Hk, D, Dv;
    bool causal;
    std::vector<std::int64_t> key_lengths;
    distribution dist;
    float scale = 0.0f;
};

std::string name_of(const taylor_case& c) {
    std::ostringstream os;
    os << "B" << c.B << "_Lq" << c.Lq << "_Lk" << c.Lk << "_H" << c.H << "_Hk" << c.Hk << "_D" << c.D << "_Dv"
       << c.Dv << (c.causal ? "_causal" : "_full");
    if (!c.key_lengths.empty()) {
        os << "_len";
        for (auto l : c.key_lengths) os << "_" << l;
    }
    os << "_" << c.dist;
    return os.str();
}

struct inputs {
    tensor4<float> q, k, v;
};

inputs make_inputs(const taylor_case& c, std::uint64_t seed) {
    return {random_bshd(c.B, c.Lq, c.H, c.D, c.dist, seed), random_bshd(c.B, c.Lk, c.Hk, c.D, c.dist, seed + 1),
            random_bshd(c.B, c.Lk, c.Hk, c.Dv, c.dist, seed + 2)};
}

taylor_options options_of(const taylor_case& c, taylor_form form) {
    taylor_options o;
    o.causal = c.causal;
    o.key_lengths = c.key_lengths;
    o.scale = c.scale;
    o.form = form;
    return o;
}

tensor4<float> run_fast(const inputs& in, const taylor_options& o) {
    tensor4<float> out = make_bshd<float>(in.q.dimension(0), in.q.dimension(1), in.q.dimension(2),
                                          in.v.dimension(3), kNaN);  // NaN: an unwritten element fails
    attnkit::taylor_attention(in.q, in.k, in.v, out, o);
    return out;
}

tensor4<double> run_reference(const inputs& in, const taylor_options& o) {
    tensor4<double> out = make_bshd<double>(in.q.dimension(0), in.q.dimension(1), in.q.dimension(2),
                                            in.v.dimension(3), 0.0);
    attnkit::reference::taylor_attention(in.q, in.k, in.v, out, o);
    return out;
}

double magnitude(const inputs& in, const taylor_options& o) {
    const double scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(in.q.dimension(3)));
    return attention_magnitude(in.q, in.k, in.v, scale);
}

std::vector<taylor_case> sweep() {
    std::vector<taylor_case> cs;
    int i = 0;
    auto add = [&](index_t B, index_t Lq, index_t Lk, index_t H, index_t Hk, index_t D, index_t Dv, bool causal,
                   std::vector<std::int64_t> lens = {}) {
        cs.push_back({B, Lq, Lk, H, Hk, D, Dv, causal, std::move(lens), kAllDistributions[i++ % 3]});
    };
    const index_t RT = 2 * W;
    for (bool causal : {false, true}) {
        // lengths around the lane width, the panel and the key block
        for (index_t L : {index_t(1), W - 1, W, W + 1, 3 * W + 2, RT + 1, index_t(95), index_t(97), index_t(193)})
            if (L >= 1) add(1, L, L, 2, 1, 16, 16, causal);
        // head dims around the lane width, odd primes, D != Dv
        for (index_t D : {index_t(1), W - 1, W + 1, 3 * W + 2, index_t(13), index_t(64)})
            if (D >= 1) add(1, 29, 41, 2, 2, D, D == 13 ? 7 : D, causal);
        add(1, 17, 130, 3, 1, 32, 48, causal);   // Lq < Lk (decode-like block)
        add(1, 150, 61, 2, 2, 24, 24, causal);   // Lq > Lk: causal rows before the first key see none
        add(2, 300, 300, 2, 1, 8, 8, causal);    // two row blocks
        add(1, 23, 700, 2, 1, 17, 33, causal);   // few items, >= 512 keys: split-KV
        // every GQA ratio of H = 12, and H = 5 (MHA, MQA)
        for (index_t Hk : {1, 2, 3, 4, 6, 12}) add(1, 19, 37, 12, Hk, 16, 16, causal);
        add(1, 19, 37, 5, 5, 11, 11, causal);
        add(1, 19, 37, 5, 1, 11, 11, causal);
        // key_lengths, including 0 and Lk
        add(3, 40, 90, 2, 1, 16, 16, causal, {0, 37, 90});
        add(2, 1, 300, 4, 2, 16, 16, causal, {299, 1});
    }
    return cs;
}

// Shapes where automatic takes the linear form (small D, long L), beside short ones.
std::vector<taylor_case> long_automatic() {
    return {{1, 700, 700, 2, 1, 4, 8, false, {}, distribution::gaussian},
            {1, 700, 700, 2, 1, 4, 8, true, {}, distribution::uniform},
            {2, 600, 900, 2, 2, 3, 5, true, {500, 900}, distribution::outliers}};
}

class sweep_test : public ::testing::TestWithParam<taylor_case> {};

TEST_P(sweep_test, quadratic) {
    const taylor_case& c = GetParam();
    const inputs in = make_inputs(c, 101);
    const taylor_options o = options_of(c, taylor_form::quadratic);
    EXPECT_TRUE(all_close(run_fast(in, o), run_reference(in, o), tolerance_for(kOutEps, magnitude(in, o))));
}

TEST_P(sweep_test, automatic) {
    const taylor_case& c = GetParam();
    const inputs in = make_inputs(c, 202);
    const taylor_options o = options_of(c, taylor_form::automatic);
    EXPECT_TRUE(all_close(run_fast(in, o), run_reference(in, o), tolerance_for(kOutEps, magnitude(in, o))));
}

INSTANTIATE_TEST_SUITE_P(sweep, sweep_test, ::testing::ValuesIn(sweep()),
                         [](const auto& info) { return std::to_string(info.index) + "_" + name_of(info.param); });
INSTANTIATE_TEST_SUITE_P(long_automatic, sweep_test, ::testing::ValuesIn(long_automatic()),
                         [](const auto& info) { return std::to_string(info.index) + "_" + name_of(info.param); });

// The cost model takes each form somewhere: the sweep above then tests both through automatic.
TEST(automatic, picks_both_forms) {
    attnkit::detail::attention_shape small{1, 64, 64, 8, 8, 64, 64}, long_small_d{1, 700, 700, 2, 1, 4, 8};
    taylor_options o;
    EXPECT_EQ(attnkit::detail::taylor::choose_form(small, o), taylor_form::quadratic);
    EXPECT_EQ(attnkit::detail::taylor::choose_form(long_small_d, o), taylor_form::linear);
    o.causal = true;
    EXPECT_EQ(attnkit::detail::taylor::choose_form(small, o), taylor_form::quadratic);
    EXPECT_EQ(attnkit::detail::taylor::choose_form(long_small_d, o), taylor_form::linear);
}

TEST(visible_pairs, matches_counting) {
    for (index_t Lq : {1, 5, 17})
        for (index_t Lk : {0, 1, 4, 17, 30})
            for (index_t len : {index_t(0), Lk / 2, Lk})
                for (bool causal : {false, true}) {
                    double want = 0;
                    for (index_t i = 0; i < Lq; ++i)
                        want += static_cast<double>(
                            std::max<index_t>(0, causal ? std::min(len, i + Lk - Lq + 1) : len));
                    EXPECT_EQ(attnkit::detail::taylor::visible_pairs(Lq, Lk, len, causal), want)
                        << Lq << " " << Lk << " " << len << " " << causal;
                }
}

TEST(no_visible_key, rows_are_zero) {
    for (float eps : {0.0f, 1e-6f})
        for (taylor_form form : {taylor_form::quadratic, taylor_form::linear, taylor_form::automatic}) {
            const taylor_case c{2, 40, 20, 4, 2, 16, 12, true, {0, 20}, distribution::gaussian};
            const inputs in = make_inputs(c, 7);
            taylor_options o = options_of(c, form);
            o.eps = eps;
            const tensor4<float> out = run_fast(in, o);
            for (index_t b = 0; b < c.B; ++b)
                for (index_t i = 0; i < c.Lq; ++i) {
                    const bool none = b == 0 || i + (c.Lk - c.Lq) < 0;
                    for (index_t h = 0; h < c.H; ++h)
                        for (index_t d = 0; d < c.Dv; ++d) {
                            const float x = out(b, i, h, d);
                            if (none)
                                EXPECT_EQ(x, 0.0f) << "b " << b << " i " << i << " form " << static_cast<int>(form);
                            else
                                EXPECT_TRUE(std::isfinite(x)) << "b " << b << " i " << i;
                        }
                }
            EXPECT_TRUE(all_close(out, run_reference(in, o), tolerance_for(kOutEps, magnitude(in, o))));
        }
}

TEST(eps, enters_the_denominator) {
    const taylor_case c{1, 9, 9, 2, 1, 8, 8, true, {}, distribution::uniform};
    const inputs in = make_inputs(c, 3);
    for (float eps : {0.0f, 1e-6f, 0.5f, 100.0f}) {
        taylor_options o = options_of(c, taylor_form::quadratic);
        o.eps = eps;
        EXPECT_TRUE(all_close(run_fast(in, o), run_reference(in, o), tolerance_for(kOutEps, magnitude(in, o))))
            << "eps " << eps;
    }
}

TEST(extreme, large_scores_and_nan_isolation) {
    taylor_case c{1, 50, 50, 2, 1, 16, 16, false, {}, distribution::gaussian};
    inputs in = make_inputs(c, 13);
    for (index_t d = 0; d < c.D; ++d) in.q(0, 3, 0, d) *= 400.0f, in.k(0, 10, 0, d) *= 400.0f;  // |s| ~ 1e4..1e5
    for (taylor_form form : {taylor_form::quadratic, taylor_form::linear}) {
        for (bool causal : {false, true}) {
            c.causal = causal;
            const taylor_options o = options_of(c, form);
            const tensor4<float> got = run_fast(in, o);
            const tensor4<double> want = run_reference(in, o);
            for (index_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(got.data()[i]));
            EXPECT_TRUE(all_close(got, want, tolerance_for(kOutEps, magnitude(in, o))))
                << "form " << static_cast<int>(form) << " causal " << causal;
        }
    }
    // NaN in value row 30, column 2: rows that see key 30 get NaN in column 2 (w * NaN), every
    // other element is finite.
    in.v(0, 30, 0, 2) = kNaN;
    for (taylor_form form : {taylor_form::quadratic, taylor_form::linear}) {
        c.causal = true;
        const tensor4<float> got = run_fast(in, options_of(c, form));
        for (index_t i = 0; i < c.Lq; ++i)
            for (index_t h = 0; h < c.H; ++h)
                for (index_t d = 0; d < c.Dv; ++d) {
                    const bool sees = i >= 30 && d == 2;
                    EXPECT_EQ(std::isnan(got(0, i, h, d)), sees) << "i " << i << " h " << h << " d " << d;
                }
    }
}

// Scores ~1e20: w = 1 + s + s^2/2 ~ 1e40 is past float, the output (a weighted mean of v) is not.
// Quadratic form: rows that overflowed are computed again with their scores scaled by an exact
// power of two (the weights by its square, eps with them); other rows keep their bits. Linear
// form: queries and keys past 2^20 are scaled by exact powers of two before they enter the
// features (the state and the weights by their squares). Both match the double reference to
// float rounding of the scores. Row kernel, tile kernel, split-KV, causal, segments.
TEST(extreme, scores_of_1e20_stay_finite) {
    for (const taylor_case& c : {taylor_case{1, 1, 2, 1, 1, 4, 3, false, {}, distribution::uniform},
                                 taylor_case{1, 40, 40, 2, 1, 4, 5, true, {}, distribution::uniform},
                                 taylor_case{1, 1, 3000, 2, 2, 4, 5, false, {}, distribution::uniform},
                                 taylor_case{2, 3, 700, 2, 1, 8, 3, true, {}, distribution::uniform}}) {
        SCOPED_TRACE(name_of(c));
        inputs in = make_inputs(c, 17);
        // Positive q and k (no cancellation in the scores), |q| |k| ~ 1e20 over D terms.
        for (index_t i = 0; i < in.q.size(); ++i) in.q.data()[i] = 1e10f * (1.5f + 0.5f * in.q.data()[i]);
        for (index_t i = 0; i < in.k.size(); ++i) in.k.data()[i] = 1e10f * (1.5f + 0.5f * in.k.data()[i]);
        for (taylor_form form : {taylor_form::quadratic, taylor_form::linear}) {
            const taylor_options o = options_of(c, form);
            const tensor4<float> got = run_fast(in, o);
            const tensor4<double> want = run_reference(in, o);
            for (index_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(got.data()[i])) << i;
            EXPECT_TRUE(all_close(got, want, tolerance_for(4 * kOutEps, max_abs(in.v))))
                << "form " << static_cast<int>(form);
        }
    }
}

TEST(threads, bitwise_identical) {
    const std::vector<taylor_case> cs = {{1, 300, 300, 4, 2, 32, 32, true, {}, distribution::gaussian},
                                         {1, 23, 1500, 2, 1, 16, 24, false, {}, distribution::uniform},
                                         {2, 130, 260, 3, 3, 8, 8, true, {200, 17}, distribution::outliers}};
    for (const auto& c : cs) {
        const inputs in = make_inputs(c, 17);
        for (taylor_form form : {taylor_form::quadratic, taylor_form::linear, taylor_form::automatic}) {
            taylor_options o = options_of(c, form);
            const tensor4<float> one = run_fast(in, o);
            for (int n : {1, 2, 3}) {
                attnkit::thread_pool pool(n);
                o.pool = &pool;
                const tensor4<float> got = run_fast(in, o);
                EXPECT_EQ(0, std::memcmp(one.data(), got.data(), sizeof(float) * one.size()))
                    << name_of(c) << " form " << static_cast<int>(form) << " threads " << n;
            }
        }
    }
}

// A bad argument throws std::invalid_argument whose message names it, and writes nothing.
template <class F>
void expect_rejected(F&& call, const std::string& needle, tensor4<float>& out) {
    out.setConstant(-7.0f);
    try {
        call();
        ADD_FAILURE() << "no exception; expected one naming " << needle;
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(all_equal_to(out, -7.0f)) << needle;
}

TEST(bad_input, rejected_before_writing) {
    const taylor_case c{2, 8, 12, 4, 2, 16, 8, false, {}, distribution::uniform};
    const inputs in = make_inputs(c, 1);
    tensor4<float> out = make_bshd<float>(2, 8, 4, 8);
    auto call = [&](const tensor4<float>& q, const tensor4<float>& k, const tensor4<float>& v, tensor4<float>& o,
                    const taylor_options& opts) { return [&, opts] { attnkit::taylor_attention(q, k, v, o, opts); }; };
    const taylor_options ok;
    tensor4<float> wrong_out = make_bshd<float>(2, 8, 4, 9);
    expect_rejected(call(in.q, in.k, in.v, wrong_out, ok), "out", wrong_out);
    const tensor4<float> k_batch = make_bshd<float>(1, 12, 2, 16), k_heads = make_bshd<float>(2, 12, 3, 16);
    const tensor4<float> k_dim = make_bshd<float>(2, 12, 2, 15), v_len = make_bshd<float>(2, 11, 2, 8);
    expect_rejected(call(in.q, k_batch, in.v, out, ok), "k:", out);
    expect_rejected(call(in.q, k_heads, make_bshd<float>(2, 12, 3, 8), out, ok), "k:", out);
    expect_rejected(call(in.q, k_dim, in.v, out, ok), "k:", out);
    expect_rejected(call(in.q, in.k, v_len, out, ok), "v:", out);
    for (float eps : {-1e-6f, kNaN, std::numeric_limits<float>::infinity()}) {
        taylor_options o;
        o.eps = eps;
        expect_rejected(call(in.q, in.k, in.v, out, o), "opts.eps", out);
    }
    for (float scale : {-1.0f, kNaN, std::numeric_limits<float>::infinity()}) {
        taylor_options o;
        o.scale = scale;
        expect_rejected(call(in.q, in.k, in.v, out, o), "opts.scale", out);
    }
    for (std::vector<std::int64_t> lens : {std::vector<std::int64_t>{3}, {3, 13}, {-1, 2}}) {
        taylor_options o;
        o.key_lengths = lens;
        expect_rejected(call(in.q, in.k, in.v, out, o), "opts.key_lengths", out);
    }
    taylor_options bad_form;
    bad_form.form = static_cast<taylor_form>(7);
    expect_rejected(call(in.q, in.k, in.v, out, bad_form), "opts.form", out);
    // A non-contiguous head dim, and out laid over k.
    const view<const float, 4> q_strided(in.q.data(), {2, 8, 4, 8}, {8 * 4 * 16, 4 * 16, 16, 2});
    expect_rejected([&] { attnkit::taylor_attention(q_strided, in.k, in.v, out, ok); }, "q:", out);
    tensor4<float> kv = make_bshd<float>(2, 12, 2, 16, 1.0f);
    const view<float, 4> out_over_k(kv.data(), {2, 8, 4, 8}, {8 * 4 * 8, 4 * 8, 8, 1});
    try {
        attnkit::taylor_attention(in.q, kv, in.v, out_over_k, ok);
        ADD_FAILURE() << "out over k accepted";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("out"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(all_equal_to(kv, 1.0f));
}

// out may be q itself (the same view): the result is bitwise that of a separate out.
TEST(in_place, out_is_q) {
    for (taylor_form form : {taylor_form::quadratic, taylor_form::linear})
        for (bool causal : {false, true}) {
            const taylor_case c{2, 130, 700, 4, 2, 16, 16, causal, {}, distribution::gaussian};
            inputs in = make_inputs(c, 31);
            const taylor_options o = options_of(c, form);
            const tensor4<float> want = run_fast(in, o);
            attnkit::taylor_attention(in.q, in.k, in.v, in.q, o);
            EXPECT_EQ(0, std::memcmp(want.data(), in.q.data(), sizeof(float) * want.size()))
                << "form " << static_cast<int>(form) << " causal " << causal;
        }
}

}  // namespace
