// attnkit::reference::mta_attention against hand computations.
//
// The oracle is what the fast kernel is held to, so each stage is pinned here on its own:
//   conv_index.*   which neighbour each convolution tap reads (query taps causal, key taps centred,
//                  not flipped), on literal 3 x 3 tables and on every tap of a 3 x 3 kernel;
//   identity.*     identity kernels and W = I give exactly causal softmax attention (G = 1, 2);
//   stage.*        head mixing (pre and post), group norm, depth scale and gate alone, each against
//                  a formula written out here from causal softmax weights or outputs;
//   head_matrix.*  the grouped head kernel as a block-diagonal matrix;
//   bad_input.*    every rejected argument, with nothing written.
#include "attnkit/reference/mta_attention.hpp"

#include "attnkit/reference/softmax_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/mta_inputs.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::mta_options;
using namespace attnkit_test;

using tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using wtensor = Eigen::Tensor<double, 4, Eigen::RowMajor>;

constexpr double kTol = 1e-12;  // double against double: only rounding differences

tensor4<float> zeros4(index_t a, index_t b, index_t c, index_t d) {
    tensor4<float> t(a, b, c, d);
    t.setZero();
    return t;
}

// theta [H, G, cq, ck] with theta[h, h mod G, cq - 1, (ck - 1) / 2] = 1: the identity.
tensor4<float> identity_kernel(index_t H, index_t G, index_t cq, index_t ck) {
    tensor4<float> t = zeros4(H, G, cq, ck);
    for (index_t h = 0; h < H; ++h) t(h, h % G, cq - 1, (ck - 1) / 2) = 1.0f;
    return t;
}

tensor2 eye(index_t H) {
    tensor2 w(H, H);
    w.setZero();
    for (index_t h = 0; h < H; ++h) w(h, h) = 1.0f;
    return w;
}

// q = 0: every visible score is 0, so the causal softmax weights are 1 / (i + 1) for j <= i.
struct flat_problem {
    tensor4<float> q, k, v;
    explicit flat_problem(index_t L) : q(zeros4(1, L, 1, 1)), k(random_bshd(1, L, 1, 1, distribution::uniform, 1)),
                                       v(random_bshd(1, L, 1, 2, distribution::uniform, 2)) {}
};

wtensor weights_of(const flat_problem& p, const mta_options& o) {
    tensor4<double> out(1, p.q.dimension(1), 1, 2);
    wtensor w;
    attnkit::reference::mta_attention(p.q, p.k, p.v, out, w, o);
    return w;
}

// ---- the convolution index convention --------------------------------------------------------

TEST(conv_index, post_literal_tables) {
    // L = 3, c_q = 2, c_k = 3. Causal softmax weights P0 = [[1], [1/2, 1/2], [1/3, 1/3, 1/3]].
    flat_problem p(3);
    tensor4<float> theta = zeros4(1, 1, 2, 3);
    mta_options o;
    o.kq_post = theta;
    // Tap a = 1 (current query), c = 2 (key j + 1): Z[i][j] = P0[i][j + 1], then Mask0.
    theta(0, 0, 1, 2) = 1.0f;
    const double next_key[3][3] = {{0, 0, 0}, {0.5, 0, 0}, {1.0 / 3, 1.0 / 3, 0}};
    wtensor w = weights_of(p, o);
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) EXPECT_NEAR(w(0, 0, i, j), next_key[i][j], kTol) << i << "," << j;
    // Tap a = 0 (the previous query), c = 1 (same key): Z[i][j] = P0[i - 1][j].
    theta.setZero();
    theta(0, 0, 0, 1) = 1.0f;
    const double prev_query[3][3] = {{0, 0, 0}, {1, 0, 0}, {0.5, 0.5, 0}};
    w = weights_of(p, o);
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) EXPECT_NEAR(w(0, 0, i, j), prev_query[i][j], kTol) << i << "," << j;
    // Tap a = 1, c = 0 (key j - 1): Z[i][j] = P0[i][j - 1] for j <= i.
    theta.setZero();
    theta(0, 0, 1, 0) = 1.0f;
    const double prev_key[3][3] = {{0, 0, 0}, {0, 0.5, 0}, {0, 1.0 / 3, 1.0 / 3}};
    w = weights_of(p, o);
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) EXPECT_NEAR(w(0, 0, i, j), prev_key[i][j], kTol) << i << "," << j;
}

// Every single tap of a 3 x 5 kernel, on L = 6: the weight at (i, j) is P0 read s = c_q - 1 - a
// queries back and c - 2 keys to the right, 0 when that falls outside the causal triangle.
TEST(conv_index, post_every_tap) {
    const index_t L = 6, cq = 3, ck = 5, hk = 2;
    flat_problem p(L);
    for (index_t a = 0; a < cq; ++a)
        for (index_t c = 0; c < ck; ++c) {
            tensor4<float> theta = zeros4(1, 1, cq, ck);
            theta(0, 0, a, c) = 1.0f;
            mta_options o;
            o.kq_post = theta;
            const wtensor w = weights_of(p, o);
            for (index_t i = 0; i < L; ++i)
                for (index_t j = 0; j < L; ++j) {
                    const index_t ii = i - (cq - 1 - a), jj = j + c - hk;
                    const double want = (j <= i && ii >= 0 && jj >= 0 && jj <= ii) ? 1.0 / static_cast<double>(ii + 1) : 0.0;
                    EXPECT_NEAR(w(0, 0, i, j), want, kTol) << "tap " << a << "," << c << " at " << i << "," << j;
                }
        }
}

// Pre-softmax taps on scores s_ij = q_i k_j (D = 1, scale 1): Y[i][j] = X[i - s][j + c - hk]
// with X = 0 above the diagonal and out of range, then a causal softmax of Y.
TEST(conv_index, pre_every_tap) {
    const index_t L = 5, cq = 2, ck = 3, hk = 1;
    tensor4<float> q(1, L, 1, 1), k(1, L, 1, 1), v = random_bshd(1, L, 1, 1, distribution::uniform, 3);
    for (index_t i = 0; i < L; ++i) {
        q(0, i, 0, 0) = 0.5f + 0.25f * static_cast<float>(i);
        k(0, i, 0, 0) = 1.0f - 0.5f * static_cast<float>(i);
    }
    auto x = [&](index_t i, index_t j) {
        if (i < 0 || j < 0 || j > i) return 0.0;
        return static_cast<double>(q(0, i, 0, 0)) * static_cast<double>(k(0, j, 0, 0));
    };
    for (index_t a = 0; a < cq; ++a)
        for (index_t c = 0; c < ck; ++c) {
            tensor4<float> theta = zeros4(1, 1, cq, ck);
            theta(0, 0, a, c) = 1.0f;
            mta_options o;
            o.scale = 1.0f;
            o.kq_pre = theta;
            tensor4<double> out(1, L, 1, 1);
            wtensor w;
            attnkit::reference::mta_attention(q, k, v, out, w, o);
            for (index_t i = 0; i < L; ++i) {
                double z = 0.0;
                for (index_t j = 0; j <= i; ++j) z += std::exp(x(i - (cq - 1 - a), j + c - hk));
                for (index_t j = 0; j < L; ++j) {
                    const double want = j <= i ? std::exp(x(i - (cq - 1 - a), j + c - hk)) / z : 0.0;
                    EXPECT_NEAR(w(0, 0, i, j), want, kTol) << "tap " << a << "," << c << " at " << i << "," << j;
                }
            }
        }
}

// ---- identity initialisation ----------------------------------------------------------------

void expect_identity_is_softmax(index_t G, index_t H, index_t Hk) {
    const index_t L = 9, D = 5, Dv = 3, cq = 3, ck = 5;
    const auto q = random_bshd(2, L, H, D, distribution::gaussian, 10);
    const auto k = random_bshd(2, L, Hk, D, distribution::gaussian, 11);
    const auto v = random_bshd(2, L, Hk, Dv, distribution::gaussian, 12);
    const tensor4<float> theta = identity_kernel(H, G, cq, ck);
    const tensor2 w = eye(H);
    mta_options o;
    o.kq_pre = theta;
    o.head_pre = w;
    o.kq_post = theta;
    o.head_post = w;
    tensor4<double> got(2, L, H, Dv), want(2, L, H, Dv);
    attnkit::reference::mta_attention(q, k, v, got, o);
    attnkit::softmax_options so;
    so.causal = true;
    attnkit::reference::softmax_attention(q, k, v, want, so);
    EXPECT_TRUE(all_close(got, want, kTol, kTol));
}

TEST(identity, equals_causal_softmax_g1) { expect_identity_is_softmax(1, 4, 2); }
TEST(identity, equals_causal_softmax_g2) { expect_identity_is_softmax(2, 4, 4); }

// ---- each stage alone ------------------------------------------------------------------------

struct random_problem {
    index_t B = 1, L = 7, H = 3, D = 4, Dv = 5;
    tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 20);
    tensor4<float> k = random_bshd(B, L, H, D, distribution::gaussian, 21);
    tensor4<float> v = random_bshd(B, L, H, Dv, distribution::gaussian, 22);
    // Causal softmax weights and output of the plain softmax oracle.
    wtensor p0;
    tensor4<double> o0;
    random_problem() : o0(B, L, H, Dv) {
        tensor3<double> lse(B, L, H);
        attnkit::softmax_options so;
        so.causal = true;
        attnkit::reference::softmax_attention_weights(q, k, v, o0, lse, p0, so);
    }
};

tensor2 random_matrix(index_t H, std::uint64_t seed) {
    tensor2 w(H, H);
    fill_random(w, distribution::gaussian, seed);
    return w;
}

TEST(stage, head_post_mixes_probabilities) {
    random_problem p;
    const tensor2 w = random_matrix(p.H, 30);
    mta_options o;
    o.head_post = w;
    tensor4<double> out(p.B, p.L, p.H, p.Dv);
    wtensor got;
    attnkit::reference::mta_attention(p.q, p.k, p.v, out, got, o);
    for (index_t h = 0; h < p.H; ++h)
        for (index_t i = 0; i < p.L; ++i)
            for (index_t j = 0; j < p.L; ++j) {
                double want = 0.0;
                for (index_t g = 0; g < p.H; ++g) want += static_cast<double>(w(h, g)) * p.p0(0, g, i, j);
                EXPECT_NEAR(got(0, h, i, j), want, kTol);
            }
    // And the output is those weights times V.
    for (index_t i = 0; i < p.L; ++i)
        for (index_t h = 0; h < p.H; ++h)
            for (index_t d = 0; d < p.Dv; ++d) {
                double want = 0.0;
                for (index_t j = 0; j <= i; ++j) want += got(0, h, i, j) * static_cast<double>(p.v(0, j, h, d));
                EXPECT_NEAR(out(0, i, h, d), want, kTol);
            }
}

TEST(stage, head_pre_mixes_scores) {
    random_problem p;
    const tensor2 w = random_matrix(p.H, 31);
    mta_options o;
    o.head_pre = w;
    tensor4<double> out(p.B, p.L, p.H, p.Dv);
    wtensor got;
    attnkit::reference::mta_attention(p.q, p.k, p.v, out, got, o);
    const double scale = 1.0 / std::sqrt(static_cast<double>(p.D));
    for (index_t h = 0; h < p.H; ++h)
        for (index_t i = 0; i < p.L; ++i) {
            std::vector<double> y(static_cast<std::size_t>(i + 1));
            double z = 0.0;
            for (index_t j = 0; j <= i; ++j) {
                double s = 0.0;
                for (index_t g = 0; g < p.H; ++g) {
                    double dot = 0.0;
                    for (index_t d = 0; d < p.D; ++d) dot += static_cast<double>(p.q(0, i, g, d)) * p.k(0, j, g, d);
                    s += static_cast<double>(w(h, g)) * scale * dot;
                }
                y[j] = std::exp(s);
                z += y[j];
            }
            for (index_t j = 0; j <= i; ++j) EXPECT_NEAR(got(0, h, i, j), y[j] / z, 1e-10);
        }
}

// Norm, depth scale and gate act on the plain softmax output o0, per token and head.
TEST(stage, norm_depth_gate) {
    random_problem p;
    tensor1 nw(p.Dv), gw(p.Dv);
    fill_random(nw, distribution::gaussian, 40);
    fill_random(gw, distribution::gaussian, 41);
    for (int which = 0; which < 4; ++which) {
        mta_options o;
        if (which == 0 || which == 3) o.norm_weight = nw, o.norm_eps = 0.25f;
        if (which == 1 || which == 3) o.norm_layer = 2;
        if (which == 2 || which == 3) o.gate_weight = gw, o.gate_bias = -0.3f;
        tensor4<double> out(p.B, p.L, p.H, p.Dv);
        attnkit::reference::mta_attention(p.q, p.k, p.v, out, o);
        for (index_t i = 0; i < p.L; ++i)
            for (index_t h = 0; h < p.H; ++h) {
                std::vector<double> x(static_cast<std::size_t>(p.Dv));
                for (index_t d = 0; d < p.Dv; ++d) x[d] = p.o0(0, i, h, d);
                if (o.norm_weight.data) {
                    double ms = 0.0;
                    for (double e : x) ms += e * e / static_cast<double>(p.Dv);
                    for (index_t d = 0; d < p.Dv; ++d) x[d] = x[d] / std::sqrt(ms + 0.25) * static_cast<double>(nw(d));
                }
                if (o.norm_layer >= 0)
                    for (double& e : x) e *= 0.2 + 0.6 * std::exp(-0.6);
                if (o.gate_weight.data) {
                    double t = static_cast<double>(-0.3f);
                    for (index_t d = 0; d < p.Dv; ++d) t += x[d] * static_cast<double>(gw(d));
                    for (double& e : x) e /= 1.0 + std::exp(-t);
                }
                for (index_t d = 0; d < p.Dv; ++d) EXPECT_NEAR(out(0, i, h, d), x[d], 1e-12) << which;
            }
    }
}

// The grouped (G = 2) pre convolution on the scores of a one-tap-per-head kernel: output head h
// reads head (h / 2) * 2 + m with weight theta[h, m, cq - 1, hk] (a per-position head mix within
// each group), so it must equal head_pre with that block-diagonal matrix.
TEST(stage, grouped_conv_is_in_group_head_mix) {
    const index_t H = 4, L = 6;
    const auto q = random_bshd(1, L, H, 3, distribution::gaussian, 50);
    const auto k = random_bshd(1, L, H, 3, distribution::gaussian, 51);
    const auto v = random_bshd(1, L, H, 2, distribution::gaussian, 52);
    tensor4<float> theta = zeros4(H, 2, 2, 3);
    tensor2 w(H, H);
    w.setZero();
    random_source rs(53);
    for (index_t h = 0; h < H; ++h)
        for (index_t m = 0; m < 2; ++m) {
            const float x = static_cast<float>(rs.uniform(-1, 1));
            theta(h, m, 1, 1) = x;
            w(h, (h / 2) * 2 + m) = x;
        }
    mta_options a, b;
    a.kq_pre = theta;
    b.head_pre = w;
    tensor4<double> oa(1, L, H, 2), ob(1, L, H, 2);
    attnkit::reference::mta_attention(q, k, v, oa, a);
    attnkit::reference::mta_attention(q, k, v, ob, b);
    EXPECT_TRUE(all_close(oa, ob, kTol, kTol));
}

TEST(head_matrix, block_diagonal_of_transposed_blocks) {
    Eigen::Tensor<float, 3, Eigen::RowMajor> kern(2, 2, 2);  // 2 groups of 2 heads
    for (int g = 0; g < 2; ++g)
        for (int i = 0; i < 2; ++i)
            for (int o = 0; o < 2; ++o) kern(g, i, o) = static_cast<float>(100 * g + 10 * i + o);
    const auto w = attnkit::reference::head_kernel_to_matrix(kern);
    const double want[4][4] = {{0, 10, 0, 0}, {1, 11, 0, 0}, {0, 0, 100, 110}, {0, 0, 101, 111}};
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 4; ++c) EXPECT_EQ(w(r, c), want[r][c]) << r << "," << c;
}

// ---- bad input --------------------------------------------------------------------------------

// Every bad option and shape of common/mta_inputs.hpp (the kernel's test runs the same cases),
// and an out of the wrong shape.
TEST(bad_input, every_rejected_argument) {
    const mta_bad_inputs bad;
    bad.expect_all_rejected([](const auto& q, const auto& k, const auto& v, auto& out, const auto& o) {
        attnkit::reference::mta_attention(q, k, v, out, o);
    });
    tensor4<float> out_bad = make_bshd<float>(1, bad.kL, bad.kH, bad.kDv + 1, 7.0f);
    EXPECT_THROW(attnkit::reference::mta_attention(bad.q, bad.k, bad.v, out_bad, {}), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(out_bad, 7.0f));
}

}  // namespace
