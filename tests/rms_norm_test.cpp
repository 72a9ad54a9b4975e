// attnkit::model::rms_norm against the double oracle: widths around the lane width and its
// multiples, rank 2 and 3, strided views, in place, thread counts, and the errors.
#include "attnkit/model/rms_norm.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "attnkit/reference/model/rms_norm.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/compare.hpp"
#include "common/random.hpp"

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
                         [](const auto& info) { return "d" + std::to_string(info.param); });

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

}  // namespace
