// attnkit::reference::static_qk_attention against hand-computed values, invariants, and the
// softmax oracle on the per-batch problem it stands for (q and k repeated over the batch, causal).
#include "attnkit/reference/static_qk_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "attnkit/reference/softmax_attention.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::static_qk_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;

using weights3 = Eigen::Tensor<double, 3, Eigen::RowMajor>;
constexpr double kTight = 1e-12;
constexpr double kSentinel = 7.0;

// q_fixed = 0: every visible key scores 0, so row i weighs keys 0..i by 1/(i+1) and, with
// v_j = j, outputs i/2.
TEST(reference_static_qk_attention, zero_queries_average_the_visible_prefix) {
    const index_t Lmax = 6, L = 5, B = 2;
    const tensor4<double> qf = make_bshd<double>(1, Lmax, 1, 3, 0.0);
    const tensor4<double> kf = random_bshd<double>(1, Lmax, 1, 3, distribution::gaussian, 1);
    tensor4<double> v = make_bshd<double>(B, L, 1, 1);
    for (index_t b = 0; b < B; ++b)
        for (index_t j = 0; j < L; ++j) v(b, j, 0, 0) = static_cast<double>(j + 10 * b);
    tensor4<double> out = make_bshd<double>(B, L, 1, 1, kSentinel);
    weights3 w;
    ref::static_qk_attention(qf, kf, v, out, w);
    ASSERT_EQ(w.dimension(0), 1);
    ASSERT_EQ(w.dimension(1), L);
    ASSERT_EQ(w.dimension(2), L);
    for (index_t i = 0; i < L; ++i) {
        for (index_t j = 0; j < L; ++j) EXPECT_NEAR(j <= i ? 1.0 / (i + 1) : 0.0, w(0, i, j), kTight) << i << "," << j;
        for (index_t b = 0; b < B; ++b) EXPECT_NEAR(i / 2.0 + 10 * b, out(b, i, 0, 0), kTight);
    }
}

// Row 1 sees two keys: weights are a sigmoid of the score difference. Row 0 sees only key 0.
TEST(reference_static_qk_attention, two_keys_closed_form_with_scale) {
    tensor4<double> qf = make_bshd<double>(1, 2, 1, 2);
    tensor4<double> kf = make_bshd<double>(1, 2, 1, 2);
    qf(0, 1, 0, 0) = 1.0;
    qf(0, 1, 0, 1) = 2.0;
    kf(0, 0, 0, 0) = 0.5;
    kf(0, 1, 0, 1) = -1.0;
    tensor4<double> v = make_bshd<double>(1, 2, 1, 2);
    v(0, 0, 0, 0) = 3.0;
    v(0, 1, 0, 1) = 5.0;
    static_qk_options o;
    o.scale = 0.25f;
    tensor4<double> out = make_bshd<double>(1, 2, 1, 2, kSentinel);
    weights3 w;
    ref::static_qk_attention(qf, kf, v, out, w, o);
    const double s0 = 0.25 * 0.5, s1 = 0.25 * -2.0;
    const double a0 = 1.0 / (1.0 + std::exp(s1 - s0)), a1 = 1.0 - a0;
    EXPECT_NEAR(1.0, w(0, 0, 0), kTight);
    EXPECT_EQ(0.0, w(0, 0, 1));
    EXPECT_NEAR(a0, w(0, 1, 0), kTight);
    EXPECT_NEAR(a1, w(0, 1, 1), kTight);
    EXPECT_NEAR(3.0, out(0, 0, 0, 0), kTight);
    EXPECT_NEAR(0.0, out(0, 0, 0, 1), kTight);
    EXPECT_NEAR(3.0 * a0, out(0, 1, 0, 0), kTight);
    EXPECT_NEAR(5.0 * a1, out(0, 1, 0, 1), kTight);
}

// Default scale is 1/sqrt(D).
TEST(reference_static_qk_attention, default_scale_is_inverse_sqrt_dim) {
    const tensor4<double> qf = random_bshd<double>(1, 4, 1, 9, distribution::gaussian, 2);
    const tensor4<double> kf = random_bshd<double>(1, 4, 1, 9, distribution::gaussian, 3);
    const tensor4<double> v = random_bshd<double>(1, 4, 1, 2, distribution::gaussian, 4);
    tensor4<double> a = make_bshd<double>(1, 4, 1, 2), b = make_bshd<double>(1, 4, 1, 2);
    ref::static_qk_attention(qf, kf, v, a);
    static_qk_options o;
    o.scale = static_cast<float>(1.0 / 3.0);
    ref::static_qk_attention(qf, kf, v, b, o);
    EXPECT_TRUE(all_close(a, b, 1e-7, 1e-7));  // 1/3 as float against resolve_scale's float
}

// The oracle equals causal softmax attention with q_fixed / k_fixed cut to L and repeated over
// the batch: that is what "query i uses row i of the top-left L x L block" means. GQA included.
TEST(reference_static_qk_attention, equals_causal_softmax_on_repeated_stream) {
    for (index_t Hk : {1, 2, 4}) {
        const index_t B = 3, Lmax = 11, L = 7, H = 4, D = 5, Dv = 3;
        SCOPED_TRACE(::testing::Message() << "Hk " << Hk);
        const tensor4<double> qf = random_bshd<double>(1, Lmax, H, D, distribution::gaussian, 10 + Hk);
        const tensor4<double> kf = random_bshd<double>(1, Lmax, Hk, D, distribution::gaussian, 20 + Hk);
        const tensor4<double> v = random_bshd<double>(B, L, Hk, Dv, distribution::outliers, 30 + Hk);
        tensor4<double> q(B, L, H, D), k(B, L, Hk, D);
        for (index_t b = 0; b < B; ++b)
            for (index_t i = 0; i < L; ++i) {
                for (index_t h = 0; h < H; ++h)
                    for (index_t d = 0; d < D; ++d) q(b, i, h, d) = qf(0, i, h, d);
                for (index_t h = 0; h < Hk; ++h)
                    for (index_t d = 0; d < D; ++d) k(b, i, h, d) = kf(0, i, h, d);
            }
        tensor4<double> got = make_bshd<double>(B, L, H, Dv, kSentinel), want = make_bshd<double>(B, L, H, Dv);
        ref::static_qk_attention(qf, kf, v, got);
        attnkit::softmax_options so;
        so.causal = true;
        ref::softmax_attention(q, k, v, want, so);
        EXPECT_TRUE(all_close(got, want, 1e-12, 1e-12));
    }
}

// Shorter values only cut rows: the weights of L < Lmax are the top-left block of L = Lmax's.
TEST(reference_static_qk_attention, shorter_length_is_the_top_left_block) {
    const index_t Lmax = 9, H = 2, D = 4;
    const tensor4<double> qf = random_bshd<double>(1, Lmax, H, D, distribution::uniform, 5);
    const tensor4<double> kf = random_bshd<double>(1, Lmax, H, D, distribution::uniform, 6);
    const tensor4<double> v_full = random_bshd<double>(1, Lmax, H, 2, distribution::uniform, 7);
    tensor4<double> out_full = make_bshd<double>(1, Lmax, H, 2);
    weights3 w_full;
    ref::static_qk_attention(qf, kf, v_full, out_full, w_full);
    for (index_t L : {index_t(1), index_t(4), Lmax}) {
        tensor4<double> v(1, L, H, 2), out = make_bshd<double>(1, L, H, 2);
        for (index_t j = 0; j < L; ++j)
            for (index_t h = 0; h < H; ++h)
                for (index_t c = 0; c < 2; ++c) v(0, j, h, c) = v_full(0, j, h, c);
        weights3 w;
        ref::static_qk_attention(qf, kf, v, out, w);
        for (index_t h = 0; h < H; ++h)
            for (index_t i = 0; i < L; ++i) {
                double sum = 0.0;
                for (index_t j = 0; j < L; ++j) {
                    EXPECT_EQ(w_full(h, i, j), w(h, i, j));
                    sum += w(h, i, j);
                }
                EXPECT_NEAR(1.0, sum, kTight);
                for (index_t c = 0; c < 2; ++c) EXPECT_EQ(out_full(0, i, h, c), out(0, i, h, c));
            }
    }
}

// Scores of 1e4 in magnitude stay finite (stable softmax: max subtracted first).
TEST(reference_static_qk_attention, extreme_logits_are_finite) {
    tensor4<double> qf = make_bshd<double>(1, 3, 1, 1), kf = make_bshd<double>(1, 3, 1, 1);
    qf(0, 2, 0, 0) = 100.0;
    kf(0, 0, 0, 0) = 100.0;
    kf(0, 1, 0, 0) = -100.0;
    kf(0, 2, 0, 0) = 99.0;
    const tensor4<double> v = random_bshd<double>(1, 3, 1, 2, distribution::gaussian, 8);
    tensor4<double> out = make_bshd<double>(1, 3, 1, 2);
    weights3 w;
    static_qk_options o;
    o.scale = 1.0f;  // scores 1e4, -1e4, 9900
    ref::static_qk_attention(qf, kf, v, out, w, o);
    EXPECT_NEAR(1.0, w(0, 2, 0), kTight);
    EXPECT_EQ(0.0, w(0, 2, 1));
    EXPECT_NEAR(0.0, w(0, 2, 2), kTight);
    EXPECT_NEAR(v(0, 0, 0, 0), out(0, 2, 0, 0), kTight);
}

// ---- bad input: std::invalid_argument naming the argument, nothing written ------------------

TEST(reference_static_qk_attention, bad_input_throws_before_writing) {
    const index_t B = 2, Lmax = 5, H = 4, Hk = 2, D = 3;
    const tensor4<float> qf = random_bshd(1, Lmax, H, D, distribution::uniform, 1);
    const tensor4<float> kf = random_bshd(1, Lmax, Hk, D, distribution::uniform, 2);
    const tensor4<float> v = random_bshd(B, Lmax, Hk, D, distribution::uniform, 3);
    tensor4<float> out = make_bshd<float>(B, Lmax, H, D, 7.0f);
    weights3 w;

    const tensor4<float> qf_b2 = random_bshd(2, Lmax, H, D, distribution::uniform, 4);
    expect_invalid([&] { ref::static_qk_attention(qf_b2, kf, v, out); }, "q_fixed: expected batch 1");
    const tensor4<float> kf_b2 = random_bshd(2, Lmax, Hk, D, distribution::uniform, 5);
    expect_invalid([&] { ref::static_qk_attention(qf, kf_b2, v, out); }, "k_fixed: expected batch 1");
    const tensor4<float> v_long = random_bshd(B, Lmax + 1, Hk, D, distribution::uniform, 6);
    tensor4<float> out_long = make_bshd<float>(B, Lmax + 1, H, D, 7.0f);
    expect_invalid([&] { ref::static_qk_attention(qf, kf, v_long, out_long); }, "exceeds the fixed stream's Lmax");
    EXPECT_TRUE(all_equal_to(out_long, 7.0f));
    const tensor4<float> kf_h3 = random_bshd(1, Lmax, 3, D, distribution::uniform, 7);
    const tensor4<float> v_h3 = random_bshd(B, Lmax, 3, D, distribution::uniform, 8);
    expect_invalid([&] { ref::static_qk_attention(qf, kf_h3, v_h3, out); }, "multiple of key heads");
    const tensor4<float> kf_d = random_bshd(1, Lmax, Hk, D + 1, distribution::uniform, 9);
    expect_invalid([&] { ref::static_qk_attention(qf, kf_d, v, out); }, "k_fixed: expected shape");
    const tensor4<float> kf_l = random_bshd(1, Lmax - 1, Hk, D, distribution::uniform, 10);
    expect_invalid([&] { ref::static_qk_attention(qf, kf_l, v, out); }, "k_fixed: expected shape");
    const tensor4<float> v_h = random_bshd(B, Lmax, H, D, distribution::uniform, 11);
    expect_invalid([&] { ref::static_qk_attention(qf, kf, v_h, out); }, "v: expected 2 key/value heads");
    tensor4<float> out_bad = make_bshd<float>(B, Lmax - 1, H, D, 7.0f);
    expect_invalid([&] { ref::static_qk_attention(qf, kf, v, out_bad); }, "out: expected shape");
    static_qk_options o;
    o.scale = -1.0f;
    expect_invalid([&] { ref::static_qk_attention(qf, kf, v, out, w, o); }, "opts.scale");
    o.scale = std::numeric_limits<float>::quiet_NaN();
    expect_invalid([&] { ref::static_qk_attention(qf, kf, v, out, o); }, "opts.scale");
    EXPECT_TRUE(all_equal_to(out, 7.0f));
    EXPECT_TRUE(all_equal_to(out_bad, 7.0f));
    EXPECT_EQ(0, w.size());
}

// The oracle rejects outputs over the stream or the values (not even out = v), before writing.
TEST(reference_static_qk_attention, out_overlapping_an_input_is_rejected) {
    tensor4<double> qf = random_bshd<double>(1, 5, 2, 3, distribution::uniform, 1);
    tensor4<double> kf = random_bshd<double>(1, 5, 2, 3, distribution::uniform, 2);
    tensor4<double> v = random_bshd<double>(1, 5, 2, 3, distribution::uniform, 3);
    const tensor4<double> v0 = v, qf0 = qf;
    expect_invalid([&] { ref::static_qk_attention(qf, kf, v, v); }, "out [1, 5, 2, 3] and v [1, 5, 2, 3] overlap");
    expect_invalid([&] { ref::static_qk_attention(qf, kf, v, qf); }, "and q_fixed");
    expect_invalid([&] { ref::static_qk_attention(qf, kf, v, kf); }, "and k_fixed");
    EXPECT_TRUE(all_close(v, v0, 0.0, 0.0));
    EXPECT_TRUE(all_close(qf, qf0, 0.0, 0.0));
}

}  // namespace
