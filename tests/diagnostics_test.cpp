// attnkit::diagnose_attention against hand-computed values: identity attention, uniform causal
// rows, a two-head case for head diversity, and the errors.
#include "attnkit/diagnostics.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced

namespace {

using tensor3d = Eigen::Tensor<double, 3, Eigen::RowMajor>;
constexpr double kTol = 1e-12;

TEST(Diagnostics, IdentityAttention) {
    const int L = 7;
    tensor3d w(1, L, L);
    w.setZero();
    for (int i = 0; i < L; ++i) w(0, i, i) = 1.0;
    const auto d = attnkit::diagnose_attention(w);
    EXPECT_NEAR(d.entropy[0], 0.0, kTol);
    EXPECT_NEAR(d.concentration[0], std::sqrt(double(L)), kTol);
    EXPECT_NEAR(d.sink[0], 1.0 / L, kTol);  // only row 0 attends to token 0
    EXPECT_NEAR(d.local_focus[0][0], 1.0, kTol);
    for (int n = 1; n < 4; ++n) EXPECT_NEAR(d.local_focus[n][0], 0.0, kTol);
    EXPECT_NEAR(d.head_diversity, 0.0, kTol);  // one head: no spread
    EXPECT_NEAR(d.mean_local_focus[0], 1.0, kTol);
}

TEST(Diagnostics, UniformCausalRows) {
    const int L = 5;
    tensor3d w(1, L, L);
    w.setZero();
    double entropy = 0.0, sq = 0.0, sink = 0.0;
    for (int i = 0; i < L; ++i) {
        for (int j = 0; j <= i; ++j) w(0, i, j) = 1.0 / (i + 1);
        entropy += std::log(double(i + 1));   // row entropy of a uniform row over i + 1 keys
        sq += 1.0 / (i + 1);                  // (i + 1) * (1 / (i + 1))^2
        sink += 1.0 / (i + 1);
    }
    const auto d = attnkit::diagnose_attention(w);
    EXPECT_NEAR(d.entropy[0], entropy, kTol);
    EXPECT_NEAR(d.concentration[0], std::sqrt(sq), kTol);
    EXPECT_NEAR(d.sink[0], sink / L, kTol);
    // Sub-diagonal n holds 1 / (i + 1) for i = n .. L-1.
    for (int n = 0; n < 4; ++n) {
        double s = 0.0;
        for (int i = n; i < L; ++i) s += 1.0 / (i + 1);
        EXPECT_NEAR(d.local_focus[n][0], s / (L - n), kTol) << "N = " << n;
    }
}

TEST(Diagnostics, TwoHeadDiversity) {
    // L = 2. Head 0: identity; head 1: row 1 attends to token 0 only.
    tensor3d w(2, 2, 2);
    w.setZero();
    w(0, 0, 0) = 1.0;
    w(0, 1, 1) = 1.0;
    w(1, 0, 0) = 1.0;
    w(1, 1, 0) = 1.0;
    const auto d = attnkit::diagnose_attention(w);
    // Causal entries (0,0): {1, 1} std 0; (1,0): {0, 1} std 0.5; (1,1): {1, 0} std 0.5.
    EXPECT_NEAR(d.head_diversity, (0.0 + 0.5 + 0.5) / 3.0, kTol);
    EXPECT_NEAR(d.sink[0], 0.5, kTol);
    EXPECT_NEAR(d.sink[1], 1.0, kTol);
    EXPECT_NEAR(d.mean_sink, 0.75, kTol);
    EXPECT_NEAR(d.local_focus[1][1], 1.0, kTol);
    EXPECT_NEAR(d.local_focus[1][0], 0.0, kTol);
    EXPECT_NEAR(d.entropy[1], 0.0, kTol);
}

TEST(Diagnostics, FloatWeightsAndShortSequences) {
    Eigen::Tensor<float, 3, Eigen::RowMajor> w(1, 2, 2);
    w.setValues({{{1.0f, 0.0f}, {0.25f, 0.75f}}});
    const auto d = attnkit::diagnose_attention(w);
    EXPECT_NEAR(d.entropy[0], -(0.25 * std::log(0.25) + 0.75 * std::log(0.75)), 1e-7);
    EXPECT_NEAR(d.local_focus[2][0], 0.0, kTol);  // L <= N: defined as 0
    EXPECT_NEAR(d.local_focus[3][0], 0.0, kTol);
}

TEST(Diagnostics, RejectsNonSquareWeights) {
    tensor3d w(2, 3, 4);
    w.setZero();
    EXPECT_THROW(attnkit::diagnose_attention(w), std::invalid_argument);
    tensor3d e(0, 3, 3);
    EXPECT_THROW(attnkit::diagnose_attention(e), std::invalid_argument);
}

}  // namespace
