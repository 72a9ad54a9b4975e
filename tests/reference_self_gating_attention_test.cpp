// attnkit::reference::self_gating_attention on cases small enough to work out by hand, and the
// weight matrix it returns. The fast kernel is tested against this oracle, so the oracle is
// tested against arithmetic done here on paper, not against any other code.
#include "attnkit/reference/self_gating_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/compare.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::self_gating_options;
using namespace attnkit_test;

// Three tokens, one head, D = 1, Dv = 2, scale 1: gates g = q * k = (0, ln 2, ln 3) give weights
// proportional to (1, 2, 3).
struct three_tokens {
    tensor4<double> q = make_bshd<double>(1, 3, 1, 1), k = make_bshd<double>(1, 3, 1, 1, 1.0),
                    v = make_bshd<double>(1, 3, 1, 2);
    three_tokens() {
        q(0, 0, 0, 0) = 0.0;
        q(0, 1, 0, 0) = std::log(2.0);
        q(0, 2, 0, 0) = std::log(3.0);
        const double vals[3][2] = {{6, 0}, {0, 6}, {12, -6}};
        for (int j = 0; j < 3; ++j)
            for (int d = 0; d < 2; ++d) v(0, j, 0, d) = vals[j][d];
    }
};

TEST(ReferenceSelfGating, CausalByHand) {
    three_tokens t;
    self_gating_options o;
    o.scale = 1.0f;
    o.causal = true;
    tensor4<double> out = make_bshd<double>(1, 3, 1, 2);
    Eigen::Tensor<double, 4, Eigen::RowMajor> w;
    attnkit::reference::self_gating_attention(t.q, t.k, t.v, out, w, o);
    // Row 0: v0 = (6, 0). Row 1: (1 v0 + 2 v1) / 3 = (2, 4). Row 2: (v0 + 2 v1 + 3 v2) / 6 = (7, -1).
    const double want[3][2] = {{6, 0}, {2, 4}, {7, -1}};
    const double wmat[3][3] = {{1, 0, 0}, {1.0 / 3, 2.0 / 3, 0}, {1.0 / 6, 2.0 / 6, 3.0 / 6}};
    for (int i = 0; i < 3; ++i) {
        for (int d = 0; d < 2; ++d) EXPECT_NEAR(out(0, i, 0, d), want[i][d], 1e-12) << i << "," << d;
        for (int j = 0; j < 3; ++j) EXPECT_NEAR(w(0, 0, i, j), wmat[i][j], 1e-15) << i << "," << j;
    }
}

// lse = log of the sum of exp(g) a row sees: exp(g) = (1, 2, 3), so log 1, log 3, log 6 causal,
// log 6 for every row without the mask; -inf for a row that sees nothing (key_lengths 0).
TEST(ReferenceSelfGating, LseByHand) {
    three_tokens t;
    for (bool causal : {true, false}) {
        self_gating_options o;
        o.scale = 1.0f;
        o.causal = causal;
        tensor4<double> out = make_bshd<double>(1, 3, 1, 2);
        tensor3<double> lse = make_lse<double>(1, 3, 1, -99.0);
        attnkit::reference::self_gating_attention(t.q, t.k, t.v, out, lse, o);
        const double want[3] = {causal ? 0.0 : std::log(6.0), causal ? std::log(3.0) : std::log(6.0), std::log(6.0)};
        for (int i = 0; i < 3; ++i) EXPECT_NEAR(lse(0, i, 0), want[i], 1e-15) << i;
        o.key_lengths = {0};
        attnkit::reference::self_gating_attention(t.q, t.k, t.v, out, lse, o);
        for (int i = 0; i < 3; ++i) EXPECT_EQ(lse(0, i, 0), -std::numeric_limits<double>::infinity()) << i;
    }
}

TEST(ReferenceSelfGating, NonCausalEveryRowTheSameMean) {
    three_tokens t;
    self_gating_options o;
    o.scale = 1.0f;
    tensor4<double> out = make_bshd<double>(1, 3, 1, 2);
    attnkit::reference::self_gating_attention(t.q, t.k, t.v, out, o);
    for (int i = 0; i < 3; ++i) {
        EXPECT_NEAR(out(0, i, 0, 0), 7.0, 1e-12);
        EXPECT_NEAR(out(0, i, 0, 1), -1.0, 1e-12);
    }
}

// key_lengths = 2 drops token 2: every row that could see it sees (v0 + 2 v1) / 3 instead;
// key_lengths = 0 gives zero rows and zero weights.
TEST(ReferenceSelfGating, KeyLengthsByHand) {
    three_tokens t;
    for (bool causal : {false, true}) {
        self_gating_options o;
        o.scale = 1.0f;
        o.causal = causal;
        o.key_lengths = {2};
        tensor4<double> out = make_bshd<double>(1, 3, 1, 2, -99.0);
        attnkit::reference::self_gating_attention(t.q, t.k, t.v, out, o);
        EXPECT_NEAR(out(0, 0, 0, 0), causal ? 6.0 : 2.0, 1e-12);
        EXPECT_NEAR(out(0, 2, 0, 0), 2.0, 1e-12);
        EXPECT_NEAR(out(0, 2, 0, 1), 4.0, 1e-12);
        o.key_lengths = {0};
        Eigen::Tensor<double, 4, Eigen::RowMajor> w;
        attnkit::reference::self_gating_attention(t.q, t.k, t.v, out, w, o);
        EXPECT_TRUE(all_equal_to(out, 0.0));
        EXPECT_TRUE(all_equal_to(w, 0.0));
    }
}

// The default scale is 1/sqrt(D); the gate uses only the token's own q and k (here q_1 . k_0
// would be huge and must not matter). GQA: query heads 0 and 1 share key/value head 0.
TEST(ReferenceSelfGating, DefaultScaleOwnTokenAndGqa) {
    tensor4<double> q = make_bshd<double>(1, 2, 2, 4), k = make_bshd<double>(1, 2, 1, 4), v = make_bshd<double>(1, 2, 1, 1);
    // Token 0: q . k = 0 -> g = 0. Token 1: q . k = 4 ln 2 -> g = 4 ln 2 / sqrt(4) = 2 ln 2 -> weight 4.
    for (int d = 0; d < 4; ++d) {
        q(0, 0, 0, d) = q(0, 0, 1, d) = 0.0;
        k(0, 0, 0, d) = 100.0;
        q(0, 1, 0, d) = std::log(2.0);
        q(0, 1, 1, d) = 0.0;  // head 1: both gates 0 -> plain mean
        k(0, 1, 0, d) = 1.0;
    }
    v(0, 0, 0, 0) = 1.0;
    v(0, 1, 0, 0) = 6.0;
    self_gating_options o;
    o.causal = true;
    tensor4<double> out = make_bshd<double>(1, 2, 2, 1);
    attnkit::reference::self_gating_attention(q, k, v, out, o);
    EXPECT_NEAR(out(0, 1, 0, 0), (1.0 + 4.0 * 6.0) / 5.0, 1e-12);
    EXPECT_NEAR(out(0, 1, 1, 0), 3.5, 1e-12);
    EXPECT_NEAR(out(0, 0, 0, 0), 1.0, 1e-12);
}

// Gates of 1e3 and more stay exact: weights (1, e^-1) whatever the common offset.
TEST(ReferenceSelfGating, HugeGatesAreStable) {
    for (double offset : {0.0, 1000.0, -1000.0, 1e4}) {
        tensor4<double> q = make_bshd<double>(1, 2, 1, 1), k = make_bshd<double>(1, 2, 1, 1, 1.0),
                        v = make_bshd<double>(1, 2, 1, 1);
        q(0, 0, 0, 0) = offset;
        q(0, 1, 0, 0) = offset - 1.0;
        v(0, 0, 0, 0) = 1.0;
        v(0, 1, 0, 0) = 0.0;
        self_gating_options o;
        o.scale = 1.0f;
        tensor4<double> out = make_bshd<double>(1, 2, 1, 1);
        attnkit::reference::self_gating_attention(q, k, v, out, o);
        EXPECT_NEAR(out(0, 0, 0, 0), 1.0 / (1.0 + std::exp(-1.0)), 1e-12) << offset;
    }
}

TEST(ReferenceSelfGating, RejectsLqNeLk) {
    tensor4<double> q = make_bshd<double>(1, 3, 1, 2), k = make_bshd<double>(1, 4, 1, 2), v = make_bshd<double>(1, 4, 1, 2);
    tensor4<double> out = make_bshd<double>(1, 3, 1, 2, 5.0);
    EXPECT_THROW(attnkit::reference::self_gating_attention(q, k, v, out), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(out, 5.0));
}

}  // namespace
