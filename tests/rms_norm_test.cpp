// attnkit::model::rms_norm against the double oracle: widths around the lane width and its
// multiples, rank 2 and 3, strided views, in place, thread counts, and the errors. Then
// rms_norm_backward: the oracle against finite differences of the forward oracle, the kernel
// against the oracle on the same kinds of cases, d_weight's bits for any thread count, in place
// over d_out, and the errors.
#include "attnkit/model/rms_norm.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/reference/model/rms_norm.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/finite_differences.hpp"
#include "common/random.hpp"
#include "common/sweep.hpp"

namespace {

using namespace attnkit_test;
using attnkit::index_t;
using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
constexpr index_t W = attnkit::simd::kLanes<attnkit::simd::default_arch>;

class RmsNormWidths : public ::testing::TestWithParam<index_t> {};

TEST_P(RmsNormWidths, MatchesReference) {
    const index_t d = GetParam();
    for (distribution dist : kAllDistributions) {
        SCOPED_TRACE(name(dist));
        tensor2 x(5, d), out(5, d);
        tensor1 w(d);
        fill_random(x, dist, 11 + d);
        fill_random(w, distribution::uniform, 17 + d);
        attnkit::model::rms_norm(x, w, out, 1e-5f);
        Eigen::Tensor<double, 2, Eigen::RowMajor> ref(5, d);
        attnkit::reference::model::rms_norm(x, w, ref, 1e-5);
        // One rounding per product plus the float sum of squares: a few eps relative to the
        // normalised magnitude (|x| / rms is O(sqrt(d)) at most, times |w| <= 1).
        EXPECT_TRUE(all_close(out, ref, 1e-5, 1e-6));
    }
}

INSTANTIATE_TEST_SUITE_P(Widths, RmsNormWidths,
                         ::testing::Values(index_t(1), W - 1 > 0 ? W - 1 : 2, W, W + 1, 2 * W, 2 * W + 1, 3 * W + 2,
                                           index_t(13), index_t(896), index_t(4099)),
                         // The index keeps names unique where widths coincide (W = 1: the scalar build).
                         [](const auto& info) { return "d" + std::to_string(info.param) + "_" + std::to_string(info.index); });

// Scale: rows of |x| ~ 1e20 (squares past FLT_MAX) and ~1e-20 normalise as the oracle does at
// every width, the SIMD one (d >= 2 W) included; they used to give 0 there while shorter rows,
// summed in double, were right.
TEST(RmsNorm, HugeAndTinyRowsMatchTheReference) {
    for (index_t d : {index_t(3), 2 * W, 4 * W + 3, index_t(896)}) {
        for (float scale : {1e20f, 3e37f, 1e-20f}) {
            SCOPED_TRACE("d " + std::to_string(d) + ", scale " + std::to_string(scale));
            tensor2 x(3, d), out(3, d);
            tensor1 w(d);
            fill_random(x, distribution::gaussian, 5 + d);
            fill_random(w, distribution::uniform, 7 + d);
            for (index_t i = 0; i < x.size(); ++i) x.data()[i] *= scale;
            attnkit::model::rms_norm(x, w, out, 1e-30f);
            Eigen::Tensor<double, 2, Eigen::RowMajor> ref(3, d);
            attnkit::reference::model::rms_norm(x, w, ref, 1e-30);
            EXPECT_TRUE(all_close(out, ref, 1e-5, 1e-6));
        }
    }
}

TEST(RmsNorm, Rank3StridedAndInPlace) {
    const index_t B = 2, L = 3, d = 37;
    Eigen::Tensor<float, 3, Eigen::RowMajor> x(B, L, d), out(B, L, d);
    tensor1 w(d);
    fill_random(x, distribution::gaussian, 3);
    fill_random(w, distribution::gaussian, 4);
    Eigen::Tensor<double, 3, Eigen::RowMajor> ref(B, L, d);
    attnkit::reference::model::rms_norm(x, w, ref, 1e-6);
    attnkit::model::rms_norm(x, w, out);
    EXPECT_TRUE(all_close(out, ref, 1e-5, 1e-6));
    // In place over x.
    Eigen::Tensor<float, 3, Eigen::RowMajor> y = x;
    attnkit::model::rms_norm(y, w, y);
    EXPECT_TRUE(all_close(y, ref, 1e-5, 1e-6));
    // A strided [B, L, d] view: every row padded to 64 floats.
    std::vector<float> buf(static_cast<std::size_t>(B * L * 64), -1.0f), obuf(buf.size(), -1.0f);
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t c = 0; c < d; ++c) buf[static_cast<std::size_t>((b * L + l) * 64 + c)] = x(b, l, c);
    attnkit::view<const float, 3> xv(buf.data(), {B, L, d}, {L * 64, 64, 1});
    attnkit::view<float, 3> ov(obuf.data(), {B, L, d}, {L * 64, 64, 1});
    attnkit::model::rms_norm(xv, w, ov);
    EXPECT_TRUE(all_close(ov, ref, 1e-5, 1e-6));
    EXPECT_EQ(obuf[static_cast<std::size_t>(d)], -1.0f);  // padding untouched
}

TEST(RmsNorm, ThreadCountsGiveIdenticalResults) {
    tensor2 x(103, 96), o1(103, 96), o2(103, 96);
    tensor1 w(96);
    fill_random(x, distribution::outliers, 5);
    fill_random(w, distribution::uniform, 6);
    attnkit::model::rms_norm(x, w, o1);
    attnkit::thread_pool pool(3);
    attnkit::model::rms_norm(x, w, o2, 1e-6f, &pool);
    for (index_t i = 0; i < o1.size(); ++i) ASSERT_EQ(o1.data()[i], o2.data()[i]) << i;
}

TEST(RmsNorm, RejectsBadArguments) {
    tensor2 x(4, 8), out(4, 8), bad_out(4, 9);
    tensor1 w(8), w_bad(7);
    x.setConstant(1.0f);
    out.setConstant(5.0f);
    EXPECT_THROW(attnkit::model::rms_norm(x, w_bad, out), std::invalid_argument);
    EXPECT_THROW(attnkit::model::rms_norm(x, w, bad_out), std::invalid_argument);
    EXPECT_THROW(attnkit::model::rms_norm(x, w, out, 0.0f), std::invalid_argument);
    EXPECT_THROW(attnkit::model::rms_norm(x, w, out, -1.0f), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(out, 5.0f));  // nothing written after a throw
}

// out over x one row further on (threads would race and rows would be normalised twice), out
// addressing one row many times, and out over the weight: rejected before anything is written.
// out = x itself stays allowed (Rank3StridedAndInPlace).
TEST(RmsNorm, RejectsOutputOverlappingInputs) {
    const index_t N = 40, d = 8;
    std::vector<float> buf(static_cast<std::size_t>((N + 1) * d));
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = 0.5f + static_cast<float>(i % 7);
    const std::vector<float> buf0 = buf;
    tensor1 w(d);
    w.setConstant(1.0f);
    attnkit::thread_pool pool(2);
    const attnkit::view<const float, 2> x(buf.data(), {N, d});
    const attnkit::view<float, 2> shifted(buf.data() + d, {N, d});
    EXPECT_THROW(attnkit::model::rms_norm(x, w, shifted, 1e-6f, &pool), std::invalid_argument);
    EXPECT_TRUE(buf == buf0);
    tensor2 x2(N, d), one_row(1, d);
    x2.setConstant(2.0f);
    one_row.setConstant(5.0f);
    const attnkit::view<float, 2> repeated(one_row.data(), {N, d}, {0, 1});
    EXPECT_THROW(attnkit::model::rms_norm(x2, w, repeated), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(one_row, 5.0f));
    const attnkit::view<float, 2> over_w(w.data(), {1, d});
    EXPECT_THROW(attnkit::model::rms_norm(attnkit::view<const float, 2>(x2.data(), {1, d}), w, over_w),
                 std::invalid_argument);
    EXPECT_TRUE(all_equal_to(w, 1.0f));
}

// ---- backward ------------------------------------------------------------------------------

using dtensor2 = Eigen::Tensor<double, 2, Eigen::RowMajor>;
using dtensor1 = Eigen::Tensor<double, 1, Eigen::RowMajor>;

template <class T>
bool same_bits(const T& a, const T& b) {
    if (a.size() != b.size()) return false;
    return std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}

// The oracle's d_x and d_weight for x, w and the projection r against central differences of the
// forward oracle through the loss <rms_norm(x, w), r> (whose d_out is r).
template <class X>
void expect_oracle_matches_fd(X& x, dtensor1& w, const X& r, double eps, const std::string& label) {
    X dx = x, out = x;
    dtensor1 dw(w.size());
    attnkit::reference::model::rms_norm_backward(x, w, r, dx, dw, eps);
    const auto loss = [&] {
        attnkit::reference::model::rms_norm(x, w, out, eps);
        double l = 0.0;
        for (index_t i = 0; i < out.size(); ++i) l += out.data()[i] * r.data()[i];
        return l;
    };
    expect_gradient_matches_fd(x, dx, loss, ("d_x" + label).c_str());
    expect_gradient_matches_fd(w, dw, loss, ("d_weight" + label).c_str());
}

// The oracle against finite differences, for x and for the weight; rank 2 and 3, widths with
// and without SIMD tails.
TEST(RmsNormBackward, ReferenceMatchesFiniteDifferences) {
    const double eps = 1e-5;
    for (index_t d : {index_t(1), index_t(3), index_t(8), index_t(13)}) {
        SCOPED_TRACE("d " + std::to_string(d));
        dtensor2 x(4, d), r(4, d);
        dtensor1 w(d);
        fill_random(x, distribution::gaussian, 40 + d);
        fill_random(w, distribution::gaussian, 41 + d);
        fill_random(r, distribution::gaussian, 42 + d);
        expect_oracle_matches_fd(x, w, r, eps, "");
    }
    Eigen::Tensor<double, 3, Eigen::RowMajor> x(2, 3, 6), r(2, 3, 6);
    dtensor1 w(6);
    fill_random(x, distribution::outliers, 50);
    fill_random(w, distribution::uniform, 51);
    fill_random(r, distribution::gaussian, 52);
    expect_oracle_matches_fd(x, w, r, eps, " rank 3");
}

// The error scales of the two gradients, from the inputs in double: d_x[t, c] = inv (w g -
// xh k) rounds each term and sums k over d products; d_weight sums |g xh| over the rows.
struct grad_magnitudes {
    double dx = 0, dw = 0;
};
template <class X, class G>
grad_magnitudes rms_grad_magnitudes(const X& x_in, const tensor1& w, const G& g_in, double eps) {
    const auto x = as_view(x_in);
    const auto g = as_view(g_in);
    constexpr int N = rank_of<X>;
    const index_t d = x.dims[N - 1], rows = x.size() / std::max<index_t>(d, 1);
    grad_magnitudes m;
    std::vector<double> col(static_cast<std::size_t>(d), 0.0);
    for (index_t r = 0; r < rows; ++r) {
        std::vector<double> xr(static_cast<std::size_t>(d)), gr(xr.size());
        for (index_t c = 0; c < d; ++c) {
            std::array<index_t, N> idx{};
            index_t rest = r;
            for (int k = N - 2; k >= 0; --k) idx[k] = rest % x.dims[k], rest /= x.dims[k];
            idx[N - 1] = c;
            xr[static_cast<std::size_t>(c)] = at(x, idx);
            gr[static_cast<std::size_t>(c)] = at(g, idx);
        }
        double ss = 0.0;
        for (double v : xr) ss += v * v;
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
        double wg = 0.0, xh = 0.0, mean = 0.0;
        for (index_t c = 0; c < d; ++c) {
            const double h = xr[static_cast<std::size_t>(c)] * inv, gc = gr[static_cast<std::size_t>(c)];
            wg = std::max(wg, std::abs(w(c) * gc));
            xh = std::max(xh, std::abs(h));
            mean += std::abs(gc * w(c) * h) / static_cast<double>(d);
            col[static_cast<std::size_t>(c)] += std::abs(gc * h);
        }
        m.dx = std::max(m.dx, inv * (wg + xh * mean));
    }
    for (double v : col) m.dw = std::max(m.dw, v);
    return m;
}

class RmsNormBackwardWidths : public ::testing::TestWithParam<index_t> {};

// 37 rows: two chunks of d_weight's partials, the second one short.
TEST_P(RmsNormBackwardWidths, MatchesReference) {
    const index_t d = GetParam(), N = 37;
    std::size_t i = 0;
    for (distribution dist : kAllDistributions) {
        if (!sweep_takes(static_cast<std::size_t>(d) + i++, 0, 2)) continue;
        SCOPED_TRACE(name(dist));
        tensor2 x(N, d), g(N, d), dx(N, d);
        tensor1 w(d), dw(d);
        fill_random(x, dist, 61 + d);
        fill_random(g, distribution::gaussian, 62 + d);
        fill_random(w, distribution::uniform, 63 + d);
        dx.setConstant(7.0f), dw.setConstant(7.0f);
        attnkit::model::rms_norm_backward(x, w, g, dx, dw, 1e-5f);
        dtensor2 rdx(N, d);
        dtensor1 rdw(d);
        attnkit::reference::model::rms_norm_backward(x, w, g, rdx, rdw, 1e-5);
        // A few roundings per term; k sums d products in float lanes, d_weight 32 rows in float.
        const grad_magnitudes m = rms_grad_magnitudes(x, w, g, 1e-5);
        EXPECT_TRUE(all_close(dx, rdx, tolerance_for(32, m.dx)));
        EXPECT_TRUE(all_close(dw, rdw, tolerance_for(32, m.dw)));
    }
}

INSTANTIATE_TEST_SUITE_P(Widths, RmsNormBackwardWidths,
                         ::testing::Values(index_t(1), index_t(2), index_t(3), index_t(4), index_t(7), index_t(8),
                                           index_t(9), index_t(15), index_t(16), index_t(17), index_t(31),
                                           index_t(33), index_t(64), index_t(100), index_t(128), index_t(896)),
                         // The index keeps names unique where widths coincide (W = 1: the scalar build).
                         [](const auto& info) { return "d" + std::to_string(info.param) + "_" + std::to_string(info.index); });

// Rows of |x| ~ 1e20 and ~1e-20 (squares and inv^2 out of float range) against the oracle; the
// normalised row keeps the gradient in range at every scale.
TEST(RmsNormBackward, HugeAndTinyRowsMatchTheReference) {
    for (index_t d : {index_t(3), 2 * W + 1, index_t(64)}) {
        for (float scale : {1e20f, 3e37f, 1e-20f}) {
            SCOPED_TRACE("d " + std::to_string(d) + ", scale " + std::to_string(scale));
            tensor2 x(5, d), g(5, d), dx(5, d);
            tensor1 w(d), dw(d);
            fill_random(x, distribution::gaussian, 5 + d);
            fill_random(g, distribution::gaussian, 6 + d);
            fill_random(w, distribution::uniform, 7 + d);
            for (index_t i = 0; i < x.size(); ++i) x.data()[i] *= scale;
            attnkit::model::rms_norm_backward(x, w, g, dx, dw, 1e-30f);
            dtensor2 rdx(5, d);
            dtensor1 rdw(d);
            attnkit::reference::model::rms_norm_backward(x, w, g, rdx, rdw, 1e-30);
            const grad_magnitudes m = rms_grad_magnitudes(x, w, g, 1e-30);
            EXPECT_TRUE(all_close(dx, rdx, tolerance_for(32, m.dx)));
            EXPECT_TRUE(all_close(dw, rdw, tolerance_for(32, m.dw)));
        }
    }
}

// Rank 3 through strided views (rows padded to 64 floats), and d_x = d_out in place: the same
// bits as the dense out-of-place call.
TEST(RmsNormBackward, Rank3StridedAndInPlace) {
    const index_t B = 2, L = 5, d = 37;
    Eigen::Tensor<float, 3, Eigen::RowMajor> x(B, L, d), g(B, L, d), dx(B, L, d);
    tensor1 w(d), dw(d);
    fill_random(x, distribution::gaussian, 3);
    fill_random(g, distribution::gaussian, 4);
    fill_random(w, distribution::gaussian, 5);
    attnkit::model::rms_norm_backward(x, w, g, dx, dw);
    Eigen::Tensor<double, 3, Eigen::RowMajor> rdx(B, L, d);
    dtensor1 rdw(d);
    attnkit::reference::model::rms_norm_backward(x, w, g, rdx, rdw, 1e-6);
    const grad_magnitudes m = rms_grad_magnitudes(x, w, g, 1e-6);
    EXPECT_TRUE(all_close(dx, rdx, tolerance_for(32, m.dx)));
    EXPECT_TRUE(all_close(dw, rdw, tolerance_for(32, m.dw)));

    Eigen::Tensor<float, 3, Eigen::RowMajor> in_place = g;
    tensor1 dw2(d);
    attnkit::model::rms_norm_backward(x, w, in_place, in_place, dw2);
    EXPECT_TRUE(same_bits(in_place, dx));
    EXPECT_TRUE(same_bits(dw2, dw));

    std::vector<float> xb(static_cast<std::size_t>(B * L * 64), -1.0f), gb(xb.size(), -1.0f), db(xb.size(), -1.0f);
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t c = 0; c < d; ++c) {
                xb[static_cast<std::size_t>((b * L + l) * 64 + c)] = x(b, l, c);
                gb[static_cast<std::size_t>((b * L + l) * 64 + c)] = g(b, l, c);
            }
    const attnkit::view<const float, 3> xv(xb.data(), {B, L, d}, {L * 64, 64, 1});
    const attnkit::view<const float, 3> gv(gb.data(), {B, L, d}, {L * 64, 64, 1});
    const attnkit::view<float, 3> dv(db.data(), {B, L, d}, {L * 64, 64, 1});
    tensor1 dw3(d);
    attnkit::model::rms_norm_backward(xv, w, gv, dv, dw3);
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t c = 0; c < 64; ++c) {
                const float got = db[static_cast<std::size_t>((b * L + l) * 64 + c)];
                if (c < d) {
                    ASSERT_EQ(got, dx(b, l, c)) << b << " " << l << " " << c;
                } else {
                    ASSERT_EQ(got, -1.0f);  // padding untouched
                }
            }
    EXPECT_TRUE(same_bits(dw3, dw));
}

// d_weight sums over rows in chunks fixed by the row count: 1, 2 and 3 threads give the same
// bits, over more rows than one wave of chunks (2048) holds; in place too.
TEST(RmsNormBackward, ThreadCountsGiveIdenticalResults) {
    const index_t N = 2100, d = 33;
    tensor2 x(N, d), g(N, d);
    tensor1 w(d);
    fill_random(x, distribution::outliers, 8);
    fill_random(g, distribution::gaussian, 9);
    fill_random(w, distribution::uniform, 10);
    attnkit::thread_pool p2(2), p3(3);
    attnkit::thread_pool* pools[3] = {nullptr, &p2, &p3};
    tensor2 dx[3] = {tensor2(N, d), tensor2(N, d), tensor2(N, d)};
    tensor1 dw[3] = {tensor1(d), tensor1(d), tensor1(d)};
    for (int t = 0; t < 3; ++t) attnkit::model::rms_norm_backward(x, w, g, dx[t], dw[t], 1e-6f, pools[t]);
    for (int t = 1; t < 3; ++t) {
        EXPECT_TRUE(same_bits(dx[t], dx[0])) << t + 1 << " threads";
        EXPECT_TRUE(same_bits(dw[t], dw[0])) << t + 1 << " threads";
    }
    tensor2 in_place = g;
    tensor1 dw_in_place(d);
    attnkit::model::rms_norm_backward(x, w, in_place, in_place, dw_in_place, 1e-6f, &p3);
    EXPECT_TRUE(same_bits(in_place, dx[0]));
    EXPECT_TRUE(same_bits(dw_in_place, dw[0]));
    // Against the oracle too: the wave boundary adds nothing but its partials.
    dtensor2 rdx(N, d);
    dtensor1 rdw(d);
    attnkit::reference::model::rms_norm_backward(x, w, g, rdx, rdw, 1e-6);
    EXPECT_TRUE(all_close(dw[0], rdw, tolerance_for(32, rms_grad_magnitudes(x, w, g, 1e-6).dw)));
}

// No rows: d_weight is the empty sum, 0, written over whatever it held.
TEST(RmsNormBackward, NoRowsGiveZeroWeightGradient) {
    tensor2 x(0, 5), g(0, 5), dx(0, 5);
    tensor1 w(5), dw(5);
    w.setConstant(1.0f), dw.setConstant(7.0f);
    attnkit::model::rms_norm_backward(x, w, g, dx, dw);
    EXPECT_TRUE(all_equal_to(dw, 0.0f));
}

TEST(RmsNormBackward, RejectsBadArguments) {
    const index_t N = 4, d = 8;
    tensor2 x(N, d), g(N, d), dx(N, d), bad(N, d + 1);
    tensor1 w(d), dw(d), w_bad(d - 1);
    x.setConstant(1.0f), g.setConstant(1.0f), w.setConstant(1.0f);
    dx.setConstant(5.0f), dw.setConstant(5.0f);
    const auto untouched = [&] {
        EXPECT_TRUE(all_equal_to(dx, 5.0f));
        EXPECT_TRUE(all_equal_to(dw, 5.0f));
    };
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w_bad, g, dx, dw); },
                   "weight: expected shape [d] = [8] for x [4, 8], got [7]");
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w, bad, dx, dw); },
                   "d_out: expected the shape of x [4, 8], got [4, 9]");
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w, g, bad, dw); },
                   "d_x: expected the shape of x [4, 8], got [4, 9]");
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w, g, dx, w_bad); },
                   "d_weight: expected shape [d] = [8] for x [4, 8], got [7]");
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w, g, dx, dw, 0.0f); }, "eps");
    untouched();

    // Overlaps: d_x over x (the same view: x's later rows would be read after being written), d_x
    // one row into d_out, d_weight over the weight, over d_x, over d_out.
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w, g, x, dw); }, {"d_x", "x", "overlap"});
    std::vector<float> buf(static_cast<std::size_t>((N + 1) * d), 1.0f);
    const std::vector<float> buf0 = buf;
    const attnkit::view<const float, 2> gv(buf.data(), {N, d});
    const attnkit::view<float, 2> shifted(buf.data() + d, {N, d});
    attnkit::thread_pool pool(2);
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w, gv, shifted, dw, 1e-6f, &pool); },
                   {"d_x", "d_out", "overlap"});
    EXPECT_TRUE(buf == buf0);
    tensor1 w_copy = w;
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w_copy, g, dx, w_copy); }, {"d_weight", "weight"});
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w, g, dx, attnkit::view<float, 1>(dx.data() + 3, {d})); },
                   {"d_x", "d_weight", "overlap"});
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w, g, dx, attnkit::view<float, 1>(g.data(), {d})); },
                   {"d_weight", "d_out", "overlap"});
    const attnkit::view<float, 2> repeated(dx.data(), {N, d}, {0, 1});
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w, g, repeated, dw); }, "d_x: strides");
    untouched();
    EXPECT_TRUE(all_equal_to(w_copy, 1.0f));
    EXPECT_TRUE(all_equal_to(g, 1.0f));
}

}  // namespace
