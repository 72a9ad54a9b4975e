// attnkit::reference::softmax_attention against hand-computed values and invariants.
//
// Mask tests use q = 0, so every visible key gets the same score 0: the weights of a row are
// 1/n on its n visible keys, lse = log(n), and with v_j = j the output is the mean of the visible
// key indices. Everything else is a closed form with one or two keys, or an invariant.
#include "attnkit/reference/softmax_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/compare.hpp"
#include "common/mask_probe.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::softmax_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;

using weights_t = Eigen::Tensor<double, 4, Eigen::RowMajor>;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTight = 1e-12;
constexpr float kSentinel = 7.0f;

struct result {
    tensor4<double> out;
    tensor3<double> lse;
    weights_t w;
};

template <class Q, class K, class V>
result run(const Q& q, const K& k, const V& v, const softmax_options& o) {
    attention_outputs<double> io = outputs_for<double>(q, v, kSentinel);
    result r{std::move(io.out), std::move(io.lse), {}};
    ref::softmax_attention_weights(q, k, v, r.out, r.lse, r.w, o);
    return r;
}

// ---- masks, with q = 0 -------------------------------------------------------------------

// B batches, one head, D = Dv = 1; q = 0, k = 1, v_j = j (common/mask_probe.hpp).
result run_uniform(index_t B, index_t Lq, index_t Lk, const softmax_options& o) {
    const mask_probe p = mask_probe_inputs(B, Lq, Lk);
    return run(p.q, p.k, p.v, o);
}

// Row i of batch b sees exactly `keys`.
void expect_row_sees(const result& r, index_t b, index_t i, const std::vector<index_t>& keys) {
    SCOPED_TRACE(::testing::Message() << "batch " << b << ", query row " << i);
    expect_uniform_weights(r.w, b, i, keys, kTight);
    if (keys.empty()) {
        EXPECT_EQ(0.0, r.out(b, i, 0, 0));  // zeros, not the sentinel, never NaN
        EXPECT_EQ(-kInf, r.lse(b, i, 0));
    } else {
        EXPECT_NEAR(mean_of(keys), r.out(b, i, 0, 0), kTight);
        EXPECT_NEAR(std::log(static_cast<double>(keys.size())), r.lse(b, i, 0), kTight);
    }
}

TEST(reference_softmax_attention, no_mask_sees_everything) {
    softmax_options o;
    const result r = run_uniform(1, 3, 4, o);
    for (index_t i = 0; i < 3; ++i) expect_row_sees(r, 0, i, {0, 1, 2, 3});
}

TEST(reference_softmax_attention, causal_is_bottom_right_when_lq_lt_lk) {
    softmax_options o;
    o.causal = true;
    const result r = run_uniform(1, 2, 5, o);  // query i sits at position i + 3
    expect_row_sees(r, 0, 0, {0, 1, 2, 3});
    expect_row_sees(r, 0, 1, {0, 1, 2, 3, 4});
}

TEST(reference_softmax_attention, causal_is_bottom_right_when_lq_gt_lk) {
    softmax_options o;
    o.causal = true;
    const result r = run_uniform(1, 5, 2, o);  // query i sits at position i - 3
    expect_row_sees(r, 0, 0, {});
    expect_row_sees(r, 0, 1, {});
    expect_row_sees(r, 0, 2, {});
    expect_row_sees(r, 0, 3, {0});
    expect_row_sees(r, 0, 4, {0, 1});
}

TEST(reference_softmax_attention, causal_decode_sees_whole_cache) {
    softmax_options o;
    o.causal = true;
    const result r = run_uniform(1, 1, 6, o);
    expect_row_sees(r, 0, 0, {0, 1, 2, 3, 4, 5});
}

TEST(reference_softmax_attention, window_bound_is_inclusive) {
    softmax_options o;
    o.causal = true;
    o.window_left = 0;  // only itself
    result r = run_uniform(1, 4, 4, o);
    for (index_t i = 0; i < 4; ++i) expect_row_sees(r, 0, i, {i});

    o.window_left = 1;  // itself and one before
    r = run_uniform(1, 4, 4, o);
    expect_row_sees(r, 0, 0, {0});
    expect_row_sees(r, 0, 1, {0, 1});
    expect_row_sees(r, 0, 3, {2, 3});

    o.window_left = 2;  // bottom-right: Lq = 2, Lk = 6, positions 4 and 5
    r = run_uniform(1, 2, 6, o);
    expect_row_sees(r, 0, 0, {2, 3, 4});
    expect_row_sees(r, 0, 1, {3, 4, 5});
}

TEST(reference_softmax_attention, window_without_causal_limits_the_left_only) {
    softmax_options o;
    o.window_left = 1;
    const result r = run_uniform(1, 4, 4, o);
    expect_row_sees(r, 0, 0, {0, 1, 2, 3});
    expect_row_sees(r, 0, 2, {1, 2, 3});
    expect_row_sees(r, 0, 3, {2, 3});
}

TEST(reference_softmax_attention, chunk_edges_and_implied_causality) {
    // chunk = 2, Lq = Lk = 5: blocks {0,1} {2,3} {4}; causal within the block, with or without
    // opts.causal (chunked local attention is causal, as in Llama-4).
    for (bool causal : {false, true}) {
        SCOPED_TRACE(causal ? "causal" : "not causal");
        softmax_options o;
        o.causal = causal;
        o.chunk = 2;
        const result r = run_uniform(1, 5, 5, o);
        expect_row_sees(r, 0, 0, {0});
        expect_row_sees(r, 0, 1, {0, 1});
        expect_row_sees(r, 0, 2, {2});
        expect_row_sees(r, 0, 3, {2, 3});
        expect_row_sees(r, 0, 4, {4});
    }
    softmax_options o;
    o.chunk = 3;  // Lq = 2, Lk = 5: positions 3 and 4 are in block [3, 6)
    result r = run_uniform(1, 2, 5, o);
    expect_row_sees(r, 0, 0, {3});
    expect_row_sees(r, 0, 1, {3, 4});

    o.chunk = 2;  // Lq = 4 > Lk = 2: positions -2, -1, 0, 1
    r = run_uniform(1, 4, 2, o);
    expect_row_sees(r, 0, 0, {});
    expect_row_sees(r, 0, 1, {});
    expect_row_sees(r, 0, 2, {0});
    expect_row_sees(r, 0, 3, {0, 1});

    o.chunk = 4;  // with a window: both limits apply
    o.window_left = 1;
    r = run_uniform(1, 6, 6, o);
    expect_row_sees(r, 0, 3, {2, 3});
    expect_row_sees(r, 0, 4, {4});
    expect_row_sees(r, 0, 5, {4, 5});

    o.window_left = -1;
    o.chunk = 1;  // every position alone
    r = run_uniform(1, 3, 3, o);
    for (index_t i = 0; i < 3; ++i) expect_row_sees(r, 0, i, {i});
}

TEST(reference_softmax_attention, key_lengths_per_batch) {
    softmax_options o;
    o.key_lengths = {5, 2, 0};
    const result r = run_uniform(3, 2, 5, o);
    for (index_t i = 0; i < 2; ++i) {
        expect_row_sees(r, 0, i, {0, 1, 2, 3, 4});
        expect_row_sees(r, 1, i, {0, 1});
        expect_row_sees(r, 2, i, {});  // length 0: every row zero, lse -inf
    }
}

TEST(reference_softmax_attention, key_lengths_with_causal) {
    softmax_options o;
    o.causal = true;
    o.key_lengths = {2, 4};
    const result r = run_uniform(2, 4, 4, o);
    expect_row_sees(r, 0, 0, {0});
    expect_row_sees(r, 0, 1, {0, 1});
    expect_row_sees(r, 0, 3, {0, 1});
    expect_row_sees(r, 1, 2, {0, 1, 2});
}

// window_left is a left bound only: without causal, w = 0 sees itself and every later key.
TEST(reference_softmax_attention, window_zero_is_only_itself_with_causal_only) {
    softmax_options o;
    o.window_left = 0;
    result r = run_uniform(1, 3, 3, o);
    expect_row_sees(r, 0, 0, {0, 1, 2});
    expect_row_sees(r, 0, 1, {1, 2});
    expect_row_sees(r, 0, 2, {2});
    o.causal = true;
    r = run_uniform(1, 3, 3, o);
    for (index_t i = 0; i < 3; ++i) expect_row_sees(r, 0, i, {i});
}

// Batched decode with padding: causal positions come from the tensor length Lk, never from
// key_lengths[b] (which only masks keys). With Lq = 2 and Lk = 6 the queries sit at positions 4
// and 5 in every item; item 0, of length 3, therefore lets both queries see all of its keys.
TEST(reference_softmax_attention, causal_positions_come_from_lk_not_key_lengths) {
    softmax_options o;
    o.causal = true;
    o.key_lengths = {3, 6};
    const result r = run_uniform(2, 2, 6, o);
    expect_row_sees(r, 0, 0, {0, 1, 2});
    expect_row_sees(r, 0, 1, {0, 1, 2});
    expect_row_sees(r, 1, 0, {0, 1, 2, 3, 4});
    expect_row_sees(r, 1, 1, {0, 1, 2, 3, 4, 5});
}

// FlashAttention-varlen alignment (queries end at key_lengths[b]) is one call per item over
// that item's keys, as the README shows: then item 0's queries sit at positions 1 and 2.
TEST(reference_softmax_attention, varlen_alignment_by_a_call_per_item) {
    softmax_options o;
    o.causal = true;
    const result r = run_uniform(1, 2, 3, o);  // item 0 of the test above, keys cut to length 3
    expect_row_sees(r, 0, 0, {0, 1});
    expect_row_sees(r, 0, 1, {0, 1, 2});
}

TEST(reference_softmax_attention, fully_masked_row_between_visible_rows) {
    // key_lengths 1 and window 0: row 0 sees key 0; rows 1 and 2 see nothing.
    softmax_options o;
    o.causal = true;
    o.window_left = 0;
    o.key_lengths = {1};
    result r = run_uniform(1, 3, 3, o);
    expect_row_sees(r, 0, 0, {0});
    expect_row_sees(r, 0, 1, {});
    expect_row_sees(r, 0, 2, {});

    // Lk = 0: nothing to see anywhere; also without lse.
    r = run_uniform(1, 2, 0, softmax_options{});
    expect_row_sees(r, 0, 0, {});
    tensor4<float> out = make_bshd(1, 2, 1, 3, kSentinel);
    ref::softmax_attention(make_bshd(1, 2, 1, 4), make_bshd(1, 0, 1, 4), make_bshd(1, 0, 1, 3),
                           out);
    EXPECT_TRUE(all_equal_to(out, 0.0f));
}

// ---- closed forms ---------------------------------------------------------------------------

// One batch, one head, Lq = 1, D = Dv = 1: q = 1, k_j = s_j (so the raw score is s_j), v_j given.
result run_scores(const std::vector<double>& s, const std::vector<double>& vals,
                  const softmax_options& o) {
    const index_t Lk = static_cast<index_t>(s.size());
    tensor4<double> q = make_bshd<double>(1, 1, 1, 1, 1.0), k = make_bshd<double>(1, Lk, 1, 1),
                    v = make_bshd<double>(1, Lk, 1, 1);
    for (index_t j = 0; j < Lk; ++j) k(0, j, 0, 0) = s[j], v(0, j, 0, 0) = vals[j];
    return run(q, k, v, o);
}

TEST(reference_softmax_attention, lse_and_output_two_keys) {
    // D = 2, default scale 1/sqrt(2): q = (1, 2), k0 = (1, 0), k1 = (0, 1).
    tensor4<double> q(1, 1, 1, 2), k(1, 2, 1, 2), v(1, 2, 1, 2);
    q.setValues({{{{1.0, 2.0}}}});
    k.setValues({{{{1.0, 0.0}}, {{0.0, 1.0}}}});
    v.setValues({{{{3.0, -1.0}}, {{-2.0, 5.0}}}});
    const result r = run(q, k, v, softmax_options{});
    const double s0 = 1.0 / std::sqrt(2.0), s1 = 2.0 / std::sqrt(2.0);
    const double z = std::exp(s0) + std::exp(s1);
    const double a0 = std::exp(s0) / z, a1 = std::exp(s1) / z;
    // The reference uses the float scale 1/sqrt(2) widened; compare at float-scale precision.
    EXPECT_NEAR(std::log(z), r.lse(0, 0, 0), 1e-7);
    EXPECT_NEAR(a0, r.w(0, 0, 0, 0), 1e-7);
    EXPECT_NEAR(a1, r.w(0, 0, 0, 1), 1e-7);
    EXPECT_NEAR(3.0 * a0 - 2.0 * a1, r.out(0, 0, 0, 0), 1e-7);
    EXPECT_NEAR(-1.0 * a0 + 5.0 * a1, r.out(0, 0, 0, 1), 1e-7);
}

TEST(reference_softmax_attention, explicit_and_default_scale) {
    // D = 4, q = k0 = (1, 1, 1, 1), k1 = 0: raw scores 4 and 0; default scale 1/2 -> 2 and 0.
    tensor4<double> q = make_bshd<double>(1, 1, 1, 4, 1.0), k = make_bshd<double>(1, 2, 1, 4, 0.0),
                    v = make_bshd<double>(1, 2, 1, 1);
    for (index_t d = 0; d < 4; ++d) k(0, 0, 0, d) = 1.0;
    v(0, 0, 0, 0) = 1.0;
    result r = run(q, k, v, softmax_options{});
    EXPECT_NEAR(1.0 / (1.0 + std::exp(-2.0)), r.out(0, 0, 0, 0), kTight);
    EXPECT_NEAR(std::log(std::exp(2.0) + 1.0), r.lse(0, 0, 0), kTight);
    softmax_options o;
    o.scale = 0.25f;
    r = run(q, k, v, o);
    EXPECT_NEAR(1.0 / (1.0 + std::exp(-1.0)), r.out(0, 0, 0, 0), kTight);
}

TEST(reference_softmax_attention, extreme_finite_logits) {
    softmax_options o;
    o.scale = 1.0f;
    const result r = run_scores({1e4, 1e4 - 1.0, -1e4}, {1.0, 0.0, 5.0}, o);
    EXPECT_NEAR(1.0 / (1.0 + std::exp(-1.0)), r.out(0, 0, 0, 0), kTight);
    EXPECT_NEAR(1e4 + std::log1p(std::exp(-1.0)), r.lse(0, 0, 0), 1e-9);
    EXPECT_EQ(0.0, r.w(0, 0, 0, 2));
}

TEST(reference_softmax_attention, softcap_closed_form) {
    softmax_options o;
    o.scale = 1.0f;
    o.softcap = 10.0f;
    const double r0 = 30.0, r1 = -4.0;
    const result r = run_scores({r0, r1}, {2.0, -1.0}, o);
    const double s0 = 10.0 * std::tanh(r0 / 10.0), s1 = 10.0 * std::tanh(r1 / 10.0);
    const double a0 = 1.0 / (1.0 + std::exp(s1 - s0)), a1 = 1.0 - a0;
    EXPECT_NEAR(a0, r.w(0, 0, 0, 0), kTight);
    EXPECT_NEAR(2.0 * a0 - a1, r.out(0, 0, 0, 0), kTight);
    EXPECT_NEAR(std::log(std::exp(s0) + std::exp(s1)), r.lse(0, 0, 0), kTight);
    EXPECT_LT(r.lse(0, 0, 0), 10.0 + std::log(2.0));  // capped

    // Softcap is applied after scaling: scale 2 doubles the raw score before the cap.
    o.scale = 2.0f;
    const result r2 = run_scores({3.0, 0.0}, {1.0, 0.0}, o);
    EXPECT_NEAR(1.0 / (1.0 + std::exp(-10.0 * std::tanh(0.6))), r2.out(0, 0, 0, 0), kTight);
}

TEST(reference_softmax_attention, sinks_closed_form) {
    softmax_options o;
    o.scale = 1.0f;
    o.sinks = {0.5f};
    // One key: a = e^s / (e^s + e^sink), out = a v, lse = log(e^s + e^sink).
    result r = run_scores({1.25}, {3.0}, o);
    double z = std::exp(1.25) + std::exp(0.5);
    EXPECT_NEAR(3.0 * std::exp(1.25) / z, r.out(0, 0, 0, 0), kTight);
    EXPECT_NEAR(std::log(z), r.lse(0, 0, 0), kTight);
    EXPECT_NEAR(std::exp(1.25) / z, r.w(0, 0, 0, 0), kTight);

    // Two keys; the sink is the largest logit.
    o.sinks = {2.0f};
    r = run_scores({1.0, -1.0}, {1.0, 4.0}, o);
    z = std::exp(1.0) + std::exp(-1.0) + std::exp(2.0);
    EXPECT_NEAR((std::exp(1.0) * 1.0 + std::exp(-1.0) * 4.0) / z, r.out(0, 0, 0, 0), kTight);
    EXPECT_NEAR(std::log(z), r.lse(0, 0, 0), kTight);
    EXPECT_NEAR(1.0 - std::exp(2.0) / z, r.w(0, 0, 0, 0) + r.w(0, 0, 0, 1), kTight);

    // A sink of -inf is no sink.
    o.sinks = {-std::numeric_limits<float>::infinity()};
    r = run_scores({1.0, -1.0}, {1.0, 4.0}, o);
    z = std::exp(1.0) + std::exp(-1.0);
    EXPECT_NEAR((std::exp(1.0) + 4.0 * std::exp(-1.0)) / z, r.out(0, 0, 0, 0), kTight);
    EXPECT_NEAR(std::log(z), r.lse(0, 0, 0), kTight);
}

TEST(reference_softmax_attention, sinks_per_head_and_with_no_visible_key) {
    // Two heads with their own sinks, q = 0 (scores 0), Lk = 2, v = 1; batch 1 has no keys.
    softmax_options o;
    o.sinks = {0.0f, std::log(2.0f)};
    o.key_lengths = {2, 0};
    const tensor4<double> q = make_bshd<double>(2, 1, 2, 1, 0.0),
                          k = make_bshd<double>(2, 2, 1, 1, 1.0),
                          v = make_bshd<double>(2, 2, 1, 1, 1.0);
    const result r = run(q, k, v, o);
    EXPECT_NEAR(2.0 / 3.0, r.out(0, 0, 0, 0), kTight);  // 2 / (2 + e^0)
    EXPECT_NEAR(std::log(3.0), r.lse(0, 0, 0), kTight);
    EXPECT_NEAR(2.0 / 4.0, r.out(0, 0, 1, 0), 1e-7);  // 2 / (2 + 2), sink log(2) in float
    EXPECT_NEAR(std::log(4.0), r.lse(0, 0, 1), 1e-7);
    // No visible key but a sink: output zeros, lse = the sink.
    EXPECT_EQ(0.0, r.out(1, 0, 0, 0));
    EXPECT_EQ(0.0, r.lse(1, 0, 0));
    EXPECT_EQ(0.0, r.out(1, 0, 1, 0));
    EXPECT_NEAR(std::log(2.0), r.lse(1, 0, 1), 1e-7);
}

TEST(reference_softmax_attention, gqa_head_mapping) {
    // H = 4, Hk = 2: heads 0, 1 read kv head 0; heads 2, 3 read kv head 1. q = 0 (uniform
    // weights), v of kv head g = 10 * (g + 1) + j, so out = 10 * (g + 1) + mean(j).
    for (index_t hk : {1, 2, 4}) {
        SCOPED_TRACE(::testing::Message() << "Hk = " << hk);
        const index_t H = 4, Lk = 3;
        const tensor4<double> q = make_bshd<double>(1, 2, H, 2, 0.0),
                              k = make_bshd<double>(1, Lk, hk, 2, 0.5);
        tensor4<double> v = make_bshd<double>(1, Lk, hk, 1);
        for (index_t g = 0; g < hk; ++g)
            for (index_t j = 0; j < Lk; ++j)
                v(0, j, g, 0) = 10.0 * static_cast<double>(g + 1) + static_cast<double>(j);
        const result r = run(q, k, v, softmax_options{});
        for (index_t h = 0; h < H; ++h) {
            const index_t g = h / (H / hk);
            EXPECT_NEAR(10.0 * static_cast<double>(g + 1) + 1.0, r.out(0, 1, h, 0), kTight)
                << "head " << h;
        }
    }
    // With random data: head h equals a single-head run on its kv head.
    const index_t B = 2, Lq = 3, Lk = 4, H = 4, Hk = 2, D = 3, Dv = 2;
    const tensor4<float> q = random_bshd(B, Lq, H, D, distribution::gaussian, 1),
                         k = random_bshd(B, Lk, Hk, D, distribution::gaussian, 2),
                         v = random_bshd(B, Lk, Hk, Dv, distribution::gaussian, 3);
    softmax_options o;
    o.causal = true;
    const result full = run(q, k, v, o);
    for (index_t h = 0; h < H; ++h) {
        const index_t g = h / 2;
        const attnkit::view<const float, 4> qh(&q(0, 0, h, 0), {B, Lq, 1, D},
                                               {Lq * H * D, H * D, D, 1});
        const attnkit::view<const float, 4> kh(&k(0, 0, g, 0), {B, Lk, 1, D},
                                               {Lk * Hk * D, Hk * D, D, 1});
        const attnkit::view<const float, 4> vh(&v(0, 0, g, 0), {B, Lk, 1, Dv},
                                               {Lk * Hk * Dv, Hk * Dv, Dv, 1});
        const result one = run(qh, kh, vh, o);
        const attnkit::view<const double, 4> full_h(&full.out(0, 0, h, 0), {B, Lq, 1, Dv},
                                                    {Lq * H * Dv, H * Dv, Dv, 1});
        EXPECT_TRUE(all_close(full_h, one.out, 0.0, 0.0)) << "head " << h;
    }
}

// ---- invariants on random data --------------------------------------------------------------

struct random_problem {
    tensor4<float> q, k, v;
};

random_problem make_problem(index_t B, index_t Lq, index_t Lk, index_t H, index_t Hk, index_t D,
                            index_t Dv, distribution d, std::uint64_t seed) {
    return {random_bshd(B, Lq, H, D, d, seed), random_bshd(B, Lk, Hk, D, d, seed + 1),
            random_bshd(B, Lk, Hk, Dv, d, seed + 2)};
}

std::vector<softmax_options> some_masks(index_t B, index_t H) {
    std::vector<softmax_options> m(6);
    m[1].causal = true;
    m[2].causal = true, m[2].window_left = 2;
    m[3].chunk = 3;
    m[4].key_lengths.assign(static_cast<std::size_t>(B), 4), m[4].softcap = 2.0f;
    m[5].causal = true, m[5].sinks.assign(static_cast<std::size_t>(H), 0.3f);
    return m;
}

TEST(reference_softmax_attention, weight_rows_sum_to_one_and_match_lse) {
    for (distribution d : kAllDistributions) {
        const random_problem p = make_problem(2, 5, 7, 4, 2, 6, 3, d, 10);
        for (const softmax_options& o : some_masks(2, 4)) {
            SCOPED_TRACE(::testing::Message()
                         << name(d) << " causal " << o.causal << " window " << o.window_left
                         << " chunk " << o.chunk << " sinks " << o.sinks.size());
            const result r = run(p.q, p.k, p.v, o);
            for_each_index<3>({2, 4, 5}, [&](const std::array<index_t, 3>& i) {
                const index_t b = i[0], h = i[1], row = i[2];
                double sum = 0.0;
                for (index_t j = 0; j < 7; ++j) sum += r.w(b, h, row, j);
                const double lse = r.lse(b, row, h);
                if (o.sinks.empty()) {
                    EXPECT_NEAR(1.0, sum, 1e-12);
                } else {
                    // The sink takes exp(sink - lse) of the mass.
                    EXPECT_LT(sum, 1.0);
                    EXPECT_NEAR(1.0 - std::exp(static_cast<double>(o.sinks[h]) - lse), sum, 1e-12);
                }
                // out = weights . v
                for (index_t e = 0; e < 3; ++e) {
                    double acc = 0.0;
                    for (index_t j = 0; j < 7; ++j) acc += r.w(b, h, row, j) * p.v(b, j, h / 2, e);
                    EXPECT_NEAR(acc, r.out(b, row, h, e), 1e-12);
                }
            });
        }
    }
}

TEST(reference_softmax_attention, adding_a_constant_to_a_row_of_logits_changes_nothing) {
    // Append one dimension: q'_i = (q_i, c_i), k'_j = (k_j, 1), so s'_ij = s_ij + scale * c_i.
    // The output is unchanged and lse moves by scale * c_i. c_i up to 1e4 (extreme logits).
    const index_t B = 1, Lq = 4, Lk = 6, H = 2, D = 3, Dv = 2;
    const random_problem p = make_problem(B, Lq, Lk, H, H, D, Dv, distribution::gaussian, 20);
    tensor4<double> q2(B, Lq, H, D + 1), k2(B, Lk, H, D + 1);
    const double c[] = {1e4, -3.0, 0.5, -1e4};
    for_each_index<3>({B, Lq, H}, [&](const std::array<index_t, 3>& i) {
        for (index_t d = 0; d < D; ++d) q2(i[0], i[1], i[2], d) = p.q(i[0], i[1], i[2], d);
        q2(i[0], i[1], i[2], D) = c[i[1]];
    });
    for_each_index<3>({B, Lk, H}, [&](const std::array<index_t, 3>& i) {
        for (index_t d = 0; d < D; ++d) k2(i[0], i[1], i[2], d) = p.k(i[0], i[1], i[2], d);
        k2(i[0], i[1], i[2], D) = 1.0;
    });
    softmax_options o;
    o.scale = 0.5f;
    o.causal = true;
    const result base = run(p.q, p.k, p.v, o);
    const result shifted = run(q2, k2, p.v, o);
    EXPECT_TRUE(all_close(shifted.out, base.out, 1e-9, 1e-9));
    for_each_index<3>({B, Lq, H}, [&](const std::array<index_t, 3>& i) {
        EXPECT_NEAR(base.lse(i[0], i[1], i[2]) + 0.5 * c[i[1]], shifted.lse(i[0], i[1], i[2]),
                    1e-9);
    });
}

TEST(reference_softmax_attention, permuting_keys_and_values_together_changes_nothing) {
    const index_t B = 2, Lq = 3, Lk = 7, H = 2, D = 4, Dv = 3;
    for (distribution d : kAllDistributions) {
        SCOPED_TRACE(name(d));
        const random_problem p = make_problem(B, Lq, Lk, H, H, D, Dv, d, 30);
        const std::vector<index_t> perm = {3, 6, 0, 5, 1, 4, 2};
        tensor4<float> kp = p.k, vp = p.v;
        for_each_index<4>({B, Lk, H, D}, [&](const std::array<index_t, 4>& i) {
            kp(i[0], i[1], i[2], i[3]) = p.k(i[0], perm[i[1]], i[2], i[3]);
        });
        for_each_index<4>({B, Lk, H, Dv}, [&](const std::array<index_t, 4>& i) {
            vp(i[0], i[1], i[2], i[3]) = p.v(i[0], perm[i[1]], i[2], i[3]);
        });
        softmax_options o;
        o.softcap = 1.5f;
        o.sinks = {0.1f, -0.2f};
        const result a = run(p.q, p.k, p.v, o), b = run(p.q, kp, vp, o);
        EXPECT_TRUE(all_close(b.out, a.out, 1e-12, 1e-12));
        EXPECT_TRUE(all_close(b.lse, a.lse, 1e-12, 1e-12));
        for_each_index<4>({B, H, Lq, Lk}, [&](const std::array<index_t, 4>& i) {
            EXPECT_NEAR(a.w(i[0], i[1], i[2], perm[i[3]]), b.w(i[0], i[1], i[2], i[3]), 1e-12);
        });
    }
}

TEST(reference_softmax_attention, double_inputs_equal_float_inputs) {
    const random_problem p = make_problem(2, 5, 6, 4, 2, 5, 3, distribution::outliers, 40);
    for (const softmax_options& o : some_masks(2, 4)) {
        const result f = run(p.q, p.k, p.v, o);
        const result d = run(to_double(p.q), to_double(p.k), to_double(p.v), o);
        const result mixed = run(p.q, to_double(p.k), p.v, o);
        // Floats widen exactly, so the double computation is the same one.
        EXPECT_TRUE(all_close(d.out, f.out, 1e-15, 1e-15));
        EXPECT_TRUE(all_close(d.lse, f.lse, 1e-15, 1e-15));
        EXPECT_TRUE(all_close(mixed.out, f.out, 1e-15, 1e-15));

        // float outputs are the double results rounded; the lse-less overload agrees.
        tensor4<float> out_f = make_bshd(2, 5, 4, 3, kSentinel), out_nolse = out_f;
        tensor3<float> lse_f = make_lse(2, 5, 4, kSentinel);
        ref::softmax_attention(p.q, p.k, p.v, out_f, lse_f, o);
        ref::softmax_attention(p.q, p.k, p.v, out_nolse, o);
        EXPECT_TRUE(all_close(out_f, f.out, 6e-8, 1e-30));
        EXPECT_TRUE(all_close(lse_f, f.lse, 6e-8, 1e-30));
        EXPECT_TRUE(all_close(out_nolse, out_f, 0.0, 0.0));
    }
}

TEST(reference_softmax_attention, strided_views_equal_dense_tensors) {
    // q, k, v from a fused [B, L, 3, H, D] buffer; out into a [B, H, L, D] buffer.
    const index_t B = 2, L = 5, H = 3, D = 4;
    std::vector<float> fused(static_cast<std::size_t>(B * L * 3 * H * D));
    fill_random(fused.data(), fused.size(), distribution::gaussian, 50);
    const qkv_views<float> f = fused_qkv_views(fused.data(), B, L, H, D);
    tensor4<float> q = make_bshd(B, L, H, D), k = q, v = q;
    for_each_index<4>({B, L, H, D}, [&](const std::array<index_t, 4>& i) {
        q(i[0], i[1], i[2], i[3]) = at(f.q, i);
        k(i[0], i[1], i[2], i[3]) = at(f.k, i);
        v(i[0], i[1], i[2], i[3]) = at(f.v, i);
    });
    softmax_options o;
    o.causal = true;
    tensor4<float> out_dense = make_bshd(B, L, H, D, kSentinel);
    ref::softmax_attention(q, k, v, out_dense, o);
    std::vector<float> bhld(static_cast<std::size_t>(B * H * L * D), kSentinel);
    const attnkit::view<const float, 4> cq = f.q;
    ref::softmax_attention(cq, f.k, f.v, bhld_as_bshd(bhld.data(), B, H, L, D), o);
    EXPECT_TRUE(all_close(bhld_as_bshd(bhld.data(), B, H, L, D), out_dense, 0.0, 0.0));
    // TensorMaps, including of const float.
    Eigen::TensorMap<Eigen::Tensor<const float, 4, Eigen::RowMajor>> qm(q.data(), B, L, H, D);
    tensor4<float> out_map = make_bshd(B, L, H, D, kSentinel);
    Eigen::TensorMap<tensor4<float>> om(out_map.data(), B, L, H, D);
    ref::softmax_attention(qm, k, v, om, o);
    EXPECT_TRUE(all_close(out_map, out_dense, 0.0, 0.0));
}

TEST(reference_softmax_attention, nan_propagates_to_affected_rows_only) {
    const index_t B = 1, Lq = 4, Lk = 4, H = 2, D = 3, Dv = 2;
    random_problem p = make_problem(B, Lq, Lk, H, H, D, Dv, distribution::uniform, 60);
    softmax_options o;
    o.causal = true;
    const result clean = run(p.q, p.k, p.v, o);
    p.q(0, 1, 0, 2) = std::nanf("");  // query row 1, head 0
    p.k(0, 2, 1, 0) = std::nanf("");  // key 2 of head 1: rows 2 and 3 see it
    const result r = run(p.q, p.k, p.v, o);
    for_each_index<3>({B, Lq, H}, [&](const std::array<index_t, 3>& i) {
        const index_t row = i[1], h = i[2];
        const bool affected = (h == 0 && row == 1) || (h == 1 && row >= 2);
        SCOPED_TRACE(::testing::Message() << "row " << row << " head " << h);
        EXPECT_EQ(affected, std::isnan(r.lse(0, row, h)));
        for (index_t e = 0; e < Dv; ++e) {
            if (affected)
                EXPECT_TRUE(std::isnan(r.out(0, row, h, e)));
            else
                EXPECT_EQ(clean.out(0, row, h, e), r.out(0, row, h, e));
        }
    });
}

TEST(reference_softmax_attention, options_passed_as_non_const_lvalue) {
    // Overload resolution: a mutable softmax_options must not be taken for an lse tensor.
    const tensor4<float> q = make_bshd(1, 2, 1, 2, 1.0f), k = make_bshd(1, 2, 1, 2, 1.0f),
                         v = make_bshd(1, 2, 1, 1, 3.0f);
    tensor4<float> out = make_bshd(1, 2, 1, 1, kSentinel);
    softmax_options o;
    o.causal = true;
    ref::softmax_attention(q, k, v, out, o);
    EXPECT_TRUE(all_close(out, make_bshd(1, 2, 1, 1, 3.0f), 1e-6, 1e-6));
    ref::softmax_attention(q, k, v, attnkit::view<float, 4>(out), {});
    EXPECT_TRUE(all_close(out, make_bshd(1, 2, 1, 1, 3.0f), 1e-6, 1e-6));
}

// softmax_attention_weights is the weights-returning oracle, with or without lse; its output
// equals softmax_attention's.
TEST(reference_softmax_attention, weights_function_with_and_without_lse) {
    const random_problem p = make_problem(2, 3, 5, 4, 2, 6, 3, distribution::gaussian, 90);
    softmax_options o;
    o.causal = true;
    const result with_lse = run(p.q, p.k, p.v, o);
    tensor4<double> out(2, 3, 4, 3), plain(2, 3, 4, 3);
    weights_t w;
    ref::softmax_attention_weights(p.q, p.k, p.v, out, w, o);
    ref::softmax_attention(p.q, p.k, p.v, plain, o);
    EXPECT_TRUE(all_close(out, with_lse.out, 0.0, 0.0));
    EXPECT_TRUE(all_close(plain, with_lse.out, 0.0, 0.0));
    ASSERT_EQ(w.dimensions(), with_lse.w.dimensions());
    for (index_t i = 0; i < w.size(); ++i) ASSERT_EQ(w.data()[i], with_lse.w.data()[i]);
}

}  // namespace
