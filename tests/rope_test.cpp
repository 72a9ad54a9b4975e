// attnkit::model::rope against the double oracle; decode positions equal prefill positions;
// the rotation keeps every pair's norm; strided views; errors.
#include "attnkit/model/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "attnkit/reference/model/rope.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using namespace attnkit_test;
using attnkit::index_t;

struct rope_case {
    index_t B, L, H, D;
    float theta;
    std::int64_t offset;
};

class RopeCases : public ::testing::TestWithParam<rope_case> {};

TEST_P(RopeCases, MatchesReference) {
    const rope_case c = GetParam();
    tensor4<float> x = random_bshd(c.B, c.L, c.H, c.D, distribution::gaussian, 7);
    tensor4<double> ref = make_bshd<double>(c.B, c.L, c.H, c.D);
    attnkit::reference::model::rope(x, ref, c.theta, c.offset);
    attnkit::model::rope_options o;
    o.theta = c.theta;
    o.position_offset = c.offset;
    attnkit::model::rope(x, o);
    // cos/sin are rounded to float once: error ~ 2 eps times |x| ~ 4 (gaussian tails).
    EXPECT_TRUE(all_close(x, ref, 1e-5, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeCases,
                         ::testing::Values(rope_case{1, 1, 1, 2, 10000.0f, 0}, rope_case{2, 9, 3, 64, 10000.0f, 0},
                                           rope_case{1, 5, 2, 128, 1e6f, 4093},
                                           rope_case{1, 3, 4, 6, 500.0f, 32768}),
                         [](const auto& info) {
                             const rope_case& c = info.param;
                             return "L" + std::to_string(c.L) + "_D" + std::to_string(c.D) + "_off" +
                                    std::to_string(c.offset);
                         });

TEST(Rope, DecodeStepsEqualPrefillRows) {
    const index_t L = 11, H = 2, D = 16;
    tensor4<float> full = random_bshd(1, L, H, D, distribution::uniform, 9);
    tensor4<float> rows = full;
    attnkit::thread_pool pool(2);
    attnkit::model::rope_options o;
    o.pool = &pool;
    attnkit::model::rope(full, o);
    // Row by row, each at its own offset, through a [1, 1, H, D] view into `rows`.
    for (index_t l = 0; l < L; ++l) {
        attnkit::view<float, 4> step(rows.data() + l * H * D, {1, 1, H, D});
        attnkit::model::rope_options so;
        so.position_offset = l;
        attnkit::model::rope(step, so);
    }
    for (index_t i = 0; i < full.size(); ++i) ASSERT_EQ(full.data()[i], rows.data()[i]) << i;
}

TEST(Rope, KeepsPairNormsAndPositionZeroIsIdentity) {
    const index_t L = 6, H = 3, D = 10;
    tensor4<float> x = random_bshd(2, L, H, D, distribution::outliers, 3);
    const tensor4<float> before = x;
    attnkit::model::rope(x);
    for (index_t b = 0; b < 2; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < H; ++h)
                for (index_t c = 0; c < D / 2; ++c) {
                    const double n0 = std::hypot(before(b, l, h, c), before(b, l, h, c + D / 2));
                    const double n1 = std::hypot(x(b, l, h, c), x(b, l, h, c + D / 2));
                    ASSERT_NEAR(n1, n0, 1e-5 * (1.0 + n0));
                    if (l == 0) {
                        ASSERT_EQ(x(b, l, h, c), before(b, l, h, c));
                    }
                }
}

TEST(Rope, RejectsBadArguments) {
    tensor4<float> odd = make_bshd<float>(1, 2, 1, 5, 1.0f);
    EXPECT_THROW(attnkit::model::rope(odd), std::invalid_argument);
    tensor4<float> x = make_bshd<float>(1, 2, 1, 4, 1.0f);
    attnkit::model::rope_options o;
    o.theta = 1.0f;
    EXPECT_THROW(attnkit::model::rope(x, o), std::invalid_argument);
    o.theta = 10000.0f;
    o.position_offset = -1;
    EXPECT_THROW(attnkit::model::rope(x, o), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(x, 1.0f));
}

// A view that reaches one row through several indices (a zero stride) would rotate that row
// several times (and race between threads): rejected, nothing written. Positions past int64
// are rejected too.
TEST(Rope, RejectsSelfOverlappingViewAndPositionOverflow) {
    tensor4<float> one = make_bshd<float>(1, 1, 1, 4, 1.0f);
    const attnkit::view<float, 4> repeated(one.data(), {1, 1, 3, 4}, {4, 4, 0, 1});
    EXPECT_THROW(attnkit::model::rope(repeated), std::invalid_argument);
    const attnkit::view<float, 4> repeated_rows(one.data(), {1, 5, 1, 4}, {4, 0, 4, 1});
    attnkit::model::rope_options o;
    o.position_offset = 1;
    EXPECT_THROW(attnkit::model::rope(repeated_rows, o), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(one, 1.0f));
    tensor4<float> x = make_bshd<float>(1, 3, 1, 4, 1.0f);
    o.position_offset = std::numeric_limits<std::int64_t>::max() - 1;
    EXPECT_THROW(attnkit::model::rope(x, o), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(x, 1.0f));
}

}  // namespace
