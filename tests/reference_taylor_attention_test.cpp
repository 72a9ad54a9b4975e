// attnkit::reference::taylor_attention (quadratic and linear forms) against hand-computed
// values, invariants, and each other.
//
// Mask tests use q = 0, so every visible key gets s = 0 and w = 1: with eps = 0 the weights of
// a row are 1/n on its n visible keys and, with v_j = j, the output is the mean of the visible
// key indices. The two forms share nothing but the validation, so their agreement to 1e-9 in
// double on random data is a real check of both.
#include "attnkit/reference/taylor_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/mask_probe.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::taylor_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;

using weights_t = Eigen::Tensor<double, 4, Eigen::RowMajor>;
constexpr double kTight = 1e-12;
constexpr double kSentinel = 7.0;

struct result {
    tensor4<double> out, out_linear;
    weights_t w;
};

template <class Q, class K, class V>
result run(const Q& q, const K& k, const V& v, const taylor_options& o) {
    result r{outputs_for<double>(q, v, kSentinel).out, outputs_for<double>(q, v, kSentinel).out, {}};
    ref::taylor_attention(q, k, v, r.out, r.w, o);
    ref::taylor_attention_linear(q, k, v, r.out_linear, o);
    return r;
}

// B batches, one head, D = Dv = 1; q = 0, k = 1, v_j = j (common/mask_probe.hpp); eps = 0.
result run_uniform(index_t B, index_t Lq, index_t Lk, taylor_options o) {
    o.eps = 0.0f;
    const mask_probe p = mask_probe_inputs(B, Lq, Lk);
    return run(p.q, p.k, p.v, o);
}

void expect_row_sees(const result& r, index_t b, index_t i, const std::vector<index_t>& keys) {
    SCOPED_TRACE(::testing::Message() << "batch " << b << ", query row " << i);
    expect_uniform_weights(r.w, b, i, keys, kTight);
    if (keys.empty()) {
        EXPECT_EQ(0.0, r.out(b, i, 0, 0));  // zeros, not the sentinel, never NaN (even with eps = 0)
        EXPECT_EQ(0.0, r.out_linear(b, i, 0, 0));
    } else {
        EXPECT_NEAR(mean_of(keys), r.out(b, i, 0, 0), kTight);
        EXPECT_NEAR(mean_of(keys), r.out_linear(b, i, 0, 0), kTight);
    }
}

TEST(reference_taylor_attention, no_mask_sees_everything) {
    const result r = run_uniform(1, 3, 4, {});
    for (index_t i = 0; i < 3; ++i) expect_row_sees(r, 0, i, {0, 1, 2, 3});
}

TEST(reference_taylor_attention, causal_is_bottom_right) {
    taylor_options o;
    o.causal = true;
    result r = run_uniform(1, 2, 5, o);  // positions 3, 4
    expect_row_sees(r, 0, 0, {0, 1, 2, 3});
    expect_row_sees(r, 0, 1, {0, 1, 2, 3, 4});
    r = run_uniform(1, 5, 2, o);  // positions -3 .. 1
    expect_row_sees(r, 0, 0, {});
    expect_row_sees(r, 0, 2, {});
    expect_row_sees(r, 0, 3, {0});
    expect_row_sees(r, 0, 4, {0, 1});
    r = run_uniform(1, 1, 6, o);  // decode sees the whole cache
    expect_row_sees(r, 0, 0, {0, 1, 2, 3, 4, 5});
}

TEST(reference_taylor_attention, key_lengths_alone_and_with_causal) {
    taylor_options o;
    o.key_lengths = {5, 2, 0};
    result r = run_uniform(3, 2, 5, o);
    for (index_t i = 0; i < 2; ++i) {
        expect_row_sees(r, 0, i, {0, 1, 2, 3, 4});
        expect_row_sees(r, 1, i, {0, 1});
        expect_row_sees(r, 2, i, {});
    }
    o.causal = true;
    o.key_lengths = {2, 4};
    r = run_uniform(2, 4, 4, o);
    expect_row_sees(r, 0, 0, {0});
    expect_row_sees(r, 0, 1, {0, 1});
    expect_row_sees(r, 0, 3, {0, 1});
    expect_row_sees(r, 1, 2, {0, 1, 2});
}

// q = 1, k = (1, -2), v = (3, 5), scale 1: s = (1, -2), w = (2.5, 1).
TEST(reference_taylor_attention, two_keys_by_hand) {
    tensor4<double> q = make_bshd<double>(1, 1, 1, 1, 1.0);
    tensor4<double> k = make_bshd<double>(1, 2, 1, 1);
    tensor4<double> v = make_bshd<double>(1, 2, 1, 1);
    k(0, 0, 0, 0) = 1.0, k(0, 1, 0, 0) = -2.0;
    v(0, 0, 0, 0) = 3.0, v(0, 1, 0, 0) = 5.0;
    taylor_options o;
    o.scale = 1.0f;
    o.eps = 0.0f;
    result r = run(q, k, v, o);
    EXPECT_NEAR(12.5 / 3.5, r.out(0, 0, 0, 0), kTight);
    EXPECT_NEAR(12.5 / 3.5, r.out_linear(0, 0, 0, 0), kTight);
    EXPECT_NEAR(2.5 / 3.5, r.w(0, 0, 0, 0), kTight);
    EXPECT_NEAR(1.0 / 3.5, r.w(0, 0, 0, 1), kTight);

    o.eps = 0.5f;  // eps enters the denominator only: weights sum to 3.5 / 4
    r = run(q, k, v, o);
    EXPECT_NEAR(12.5 / 4.0, r.out(0, 0, 0, 0), kTight);
    EXPECT_NEAR(12.5 / 4.0, r.out_linear(0, 0, 0, 0), kTight);
    EXPECT_NEAR(2.5 / 4.0, r.w(0, 0, 0, 0), kTight);

    o.eps = 0.0f;
    o.scale = 0.5f;  // s = (0.5, -1), w = (1.625, 0.5)
    r = run(q, k, v, o);
    EXPECT_NEAR((1.625 * 3 + 0.5 * 5) / 2.125, r.out(0, 0, 0, 0), kTight);
    EXPECT_NEAR((1.625 * 3 + 0.5 * 5) / 2.125, r.out_linear(0, 0, 0, 0), kTight);
}

// D = 4: default scale 1/2. q = (1,1,1,1), k = (1,1,1,1) -> s = 2, w = 5; k' = 0 -> w = 1.
TEST(reference_taylor_attention, default_scale_is_inverse_sqrt_dim) {
    tensor4<double> q = make_bshd<double>(1, 1, 1, 4, 1.0);
    tensor4<double> k = make_bshd<double>(1, 2, 1, 4, 0.0);
    tensor4<double> v = make_bshd<double>(1, 2, 1, 2, 0.0);
    for (index_t d = 0; d < 4; ++d) k(0, 0, 0, d) = 1.0;
    v(0, 0, 0, 0) = 1.0;  // v_0 = (1, 0), v_1 = (0, 1)
    v(0, 1, 0, 1) = 1.0;
    taylor_options o;
    o.eps = 0.0f;
    const result r = run(q, k, v, o);
    EXPECT_NEAR(5.0 / 6.0, r.out(0, 0, 0, 0), kTight);
    EXPECT_NEAR(1.0 / 6.0, r.out(0, 0, 0, 1), kTight);
    EXPECT_NEAR(5.0 / 6.0, r.out_linear(0, 0, 0, 0), kTight);
    EXPECT_NEAR(1.0 / 6.0, r.out_linear(0, 0, 0, 1), kTight);
}

// H = 4, Hk = 2: heads 0, 1 read kv head 0, heads 2, 3 kv head 1 (by index, never modulo).
TEST(reference_taylor_attention, gqa_by_index) {
    const tensor4<double> q = make_bshd<double>(1, 1, 4, 1, 0.0);
    const tensor4<double> k = make_bshd<double>(1, 3, 2, 1, 1.0);
    tensor4<double> v = make_bshd<double>(1, 3, 2, 1);
    for (index_t j = 0; j < 3; ++j) v(0, j, 0, 0) = 10.0, v(0, j, 1, 0) = -4.0;
    taylor_options o;
    o.eps = 0.0f;
    const result r = run(q, k, v, o);
    for (index_t h = 0; h < 4; ++h) {
        EXPECT_NEAR(h < 2 ? 10.0 : -4.0, r.out(0, 0, h, 0), kTight) << "head " << h;
        EXPECT_NEAR(h < 2 ? 10.0 : -4.0, r.out_linear(0, 0, h, 0), kTight) << "head " << h;
    }
}

// The weights are w / (sum w + eps): non-negative, rows sum to sum w / (sum w + eps), and they
// reproduce out = weights v.
TEST(reference_taylor_attention, weights_reproduce_the_output) {
    const auto q = random_bshd<double>(2, 5, 2, 3, distribution::gaussian, 1);
    const auto k = random_bshd<double>(2, 7, 1, 3, distribution::gaussian, 2);
    const auto v = random_bshd<double>(2, 7, 1, 4, distribution::gaussian, 3);
    taylor_options o;
    o.causal = true;
    o.eps = 0.25f;
    const result r = run(q, k, v, o);
    for (index_t b = 0; b < 2; ++b)
        for (index_t h = 0; h < 2; ++h)
            for (index_t i = 0; i < 5; ++i) {
                double sum = 0.0;
                for (index_t j = 0; j < 7; ++j) {
                    EXPECT_GE(r.w(b, h, i, j), 0.0);
                    if (j > i + 2) {
                        EXPECT_EQ(0.0, r.w(b, h, i, j));
                    }
                    sum += r.w(b, h, i, j);
                }
                EXPECT_LT(sum, 1.0);
                EXPECT_GT(sum, 1.0 - 0.25 / ((i + 3) * 0.5));  // sum w >= n / 2
                for (index_t d = 0; d < 4; ++d) {
                    double o_bd = 0.0;
                    for (index_t j = 0; j < 7; ++j) o_bd += r.w(b, h, i, j) * v(b, j, 0, d);
                    EXPECT_NEAR(o_bd, r.out(b, i, h, d), kTight);
                }
            }
}

// Float inputs and outputs are accepted and agree with the double computation.
TEST(reference_taylor_attention, float_storage) {
    const auto q = random_bshd<float>(1, 4, 2, 5, distribution::uniform, 4);
    const auto k = random_bshd<float>(1, 6, 2, 5, distribution::uniform, 5);
    const auto v = random_bshd<float>(1, 6, 2, 3, distribution::uniform, 6);
    tensor4<float> out = make_bshd<float>(1, 4, 2, 3, 7.0f);
    tensor4<double> expected = make_bshd<double>(1, 4, 2, 3);
    ref::taylor_attention(q, k, v, out);
    ref::taylor_attention(to_double(q), to_double(k), to_double(v), expected);
    EXPECT_TRUE(all_close(out, expected, tolerance_for(4, 1.0)));
}

// ---- the two forms agree on random data ---------------------------------------------------

struct sweep_case {
    index_t B, Lq, Lk, H, Hk, D, Dv;
    bool causal;
    std::vector<std::int64_t> key_lengths;
    float scale;
};

TEST(reference_taylor_attention, linear_form_equals_quadratic_form) {
    const std::vector<sweep_case> cases = {
        {1, 1, 1, 1, 1, 1, 1, false, {}, 0.0f},   {1, 9, 9, 2, 1, 3, 5, true, {}, 0.0f},
        {2, 5, 13, 4, 2, 8, 3, true, {}, 0.0f},   {2, 13, 5, 3, 3, 8, 8, true, {}, 0.3f},
        {1, 17, 17, 6, 2, 17, 4, false, {}, 0.0f}, {3, 7, 11, 2, 2, 5, 7, true, {11, 0, 4}, 0.0f},
        {2, 6, 10, 4, 1, 4, 2, false, {3, 10}, 1.5f}, {1, 33, 33, 1, 1, 16, 9, true, {}, 0.0f},
    };
    for (const distribution dist : kAllDistributions)
        for (const sweep_case& c : cases) {
            SCOPED_TRACE(::testing::Message() << dist << " B " << c.B << " Lq " << c.Lq << " Lk " << c.Lk << " H "
                                              << c.H << " Hk " << c.Hk << " D " << c.D << " Dv " << c.Dv
                                              << (c.causal ? " causal" : ""));
            const auto q = random_bshd<double>(c.B, c.Lq, c.H, c.D, dist, 11);
            const auto k = random_bshd<double>(c.B, c.Lk, c.Hk, c.D, dist, 12);
            const auto v = random_bshd<double>(c.B, c.Lk, c.Hk, c.Dv, dist, 13);
            taylor_options o;
            o.causal = c.causal;
            o.key_lengths = c.key_lengths;
            o.scale = c.scale;
            const result r = run(q, k, v, o);
            EXPECT_TRUE(all_close(r.out_linear, r.out, 1e-9, 1e-9 * max_abs(v)));
        }
}

// ---- bad input: std::invalid_argument naming the argument, nothing written ------------------

void expect_rejected(const std::function<void(tensor4<double>&)>& call, const std::string& needle) {
    tensor4<double> out = make_bshd<double>(1, 3, 2, 2, kSentinel);
    expect_invalid([&] { call(out); }, needle);
    EXPECT_TRUE(all_equal_to(out, kSentinel));
}

TEST(reference_taylor_attention, rejects_bad_arguments) {
    const auto q = random_bshd<double>(1, 3, 2, 4, distribution::uniform, 1);
    const auto k = random_bshd<double>(1, 5, 1, 4, distribution::uniform, 2);
    const auto v = random_bshd<double>(1, 5, 1, 2, distribution::uniform, 3);
    const auto k3 = random_bshd<double>(1, 5, 3, 4, distribution::uniform, 2);
    const auto v3 = random_bshd<double>(1, 5, 3, 2, distribution::uniform, 3);
    const auto k5 = random_bshd<double>(1, 5, 1, 5, distribution::uniform, 2);
    for (int form = 0; form < 2; ++form) {
        auto call = [&](const tensor4<double>& kk, const taylor_options& o,
                        const tensor4<double>* vv = nullptr) {
            const tensor4<double>& vr = vv ? *vv : v;
            return [&, o](tensor4<double>& out) {
                if (form == 0) {
                    ref::taylor_attention(q, kk, vr, out, o);
                } else {
                    ref::taylor_attention_linear(q, kk, vr, out, o);
                }
            };
        };
        taylor_options o;
        o.eps = -1e-3f;
        expect_rejected(call(k, o), "opts.eps");
        o.eps = std::numeric_limits<float>::quiet_NaN();
        expect_rejected(call(k, o), "opts.eps");
        o.eps = std::numeric_limits<float>::infinity();
        expect_rejected(call(k, o), "opts.eps");
        o = {};
        o.scale = -1.0f;
        expect_rejected(call(k, o), "opts.scale");
        o = {};
        o.key_lengths = {1, 2};
        expect_rejected(call(k, o), "opts.key_lengths");
        o.key_lengths = {6};
        expect_rejected(call(k, o), "opts.key_lengths[0]");
        o = {};
        expect_rejected(call(k3, o, &v3), "multiple of key heads");
        expect_rejected(call(k5, o), "k: expected shape");
    }
    // A wrong output shape, and a wrong weights call, write nothing either.
    tensor4<double> out = make_bshd<double>(1, 3, 2, 3, kSentinel);
    weights_t w;
    EXPECT_THROW(ref::taylor_attention(q, k, v, out, w), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(out, kSentinel));
    EXPECT_EQ(0, w.size());
}

// Outputs that overlap k, v or themselves are rejected by both forms, before anything is
// written; out = q, the very same view, is allowed and gives what a separate out gets.
TEST(reference_taylor_attention, out_overlapping_an_input) {
    tensor4<double> q = random_bshd<double>(1, 4, 2, 3, distribution::uniform, 1);
    tensor4<double> k = random_bshd<double>(1, 4, 2, 3, distribution::uniform, 2);
    tensor4<double> v = random_bshd<double>(1, 4, 2, 3, distribution::uniform, 3);
    const tensor4<double> k0 = k, v0 = v;
    taylor_options o;
    o.causal = true;
    expect_invalid([&] { ref::taylor_attention(q, k, v, k, o); }, "out [1, 4, 2, 3] and k [1, 4, 2, 3] overlap");
    expect_invalid([&] { ref::taylor_attention_linear(q, k, v, v, o); }, "out [1, 4, 2, 3] and v [1, 4, 2, 3] overlap");
    tensor4<double> row = make_bshd<double>(1, 1, 2, 3, kSentinel);
    const attnkit::view<double, 4> zero(row.data(), {1, 4, 2, 3}, {6, 0, 3, 1});
    expect_invalid([&] { ref::taylor_attention(q, k, v, zero, o); }, "make its elements overlap");
    EXPECT_TRUE(all_close(k, k0, 0.0, 0.0));
    EXPECT_TRUE(all_close(v, v0, 0.0, 0.0));
    EXPECT_TRUE(all_equal_to(row, kSentinel));

    tensor4<double> want = make_bshd<double>(1, 4, 2, 3), want_linear = make_bshd<double>(1, 4, 2, 3);
    ref::taylor_attention(q, k, v, want, o);
    ref::taylor_attention_linear(q, k, v, want_linear, o);
    tensor4<double> q2 = q;
    ref::taylor_attention(q, k, v, q, o);
    ref::taylor_attention_linear(q2, k, v, q2, o);
    EXPECT_TRUE(all_close(q, want, 0.0, 0.0));
    EXPECT_TRUE(all_close(q2, want_linear, 0.0, 0.0));
}

}  // namespace
