// attnkit::model::cross_entropy: the oracle against finite differences of its own loss, the
// kernel against the oracle over vocabulary sizes around the lane widths and three logit
// distributions, ignored rows (bitwise the same as leaving them out), no counted row, logits at
// 1e4 scale, masked (-inf) and NaN logits, in place, the three target types, 1 / 2 / 3 threads
// bitwise, and the errors.
#include "attnkit/model/cross_entropy.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnkit/reference/model/cross_entropy.hpp"
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
using dtensor2 = Eigen::Tensor<double, 2, Eigen::RowMajor>;
using targets_t = std::vector<std::int32_t>;

constexpr float kInf = std::numeric_limits<float>::infinity();

bool same_bits(const tensor2& a, const tensor2& b) {
    return a.size() == b.size() &&
           std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Targets for n rows over a vocabulary of v: seeded, every `ignore_every`-th row ignored (-100).
targets_t make_targets(index_t n, index_t v, std::uint64_t seed, index_t ignore_every = 0) {
    random_source rs(seed);
    targets_t t(static_cast<std::size_t>(n));
    for (index_t r = 0; r < n; ++r) {
        const bool ignored = ignore_every > 0 && r % ignore_every == ignore_every - 1;
        const auto target = static_cast<std::int32_t>(rs.below(static_cast<std::uint64_t>(v)));
        t[static_cast<std::size_t>(r)] = ignored ? -100 : target;
    }
    return t;
}

index_t counted(const targets_t& t) {
    index_t n = 0;
    for (std::int32_t x : t) n += x >= 0 ? 1 : 0;
    return n;
}

// The loss is max + log(sum) - target in double, the sum of exponentials within a few eps each
// (exp's own error and the float shift z - max, rounded by eps |z - max|, which the softmax
// weighs to about eps ln V): an absolute error of a few eps plus eps ln V, whatever the scale of
// the logits (plus the double rounding of a large loss). The gradient (p - onehot) / n: a few
// eps of p, whose error is at most ~eps (p ln(1/p) <= 1/e), over n.
void expect_matches_reference(const tensor2& logits, const targets_t& t, const tensor2& d, double loss) {
    dtensor2 ref(logits.dimension(0), logits.dimension(1));
    const double want = attnkit::reference::model::cross_entropy(logits, t, ref);
    if (std::isfinite(want)) {
        const double log_v = std::log(static_cast<double>(logits.dimension(1)) + 1.0);
        EXPECT_NEAR(loss, want, (8 + 2 * log_v) * kEpsFloat + 1e-14 * std::abs(want));
    } else {
        EXPECT_TRUE(same_bits(loss, want) || (std::isnan(loss) && std::isnan(want))) << loss << " vs " << want;
    }
    const double n = static_cast<double>(std::max<index_t>(counted(t), 1));
    EXPECT_TRUE(all_close(d, ref, tolerance_for(16, 1.0 / n), /*equal_nan=*/true));
}

// ---- the oracle ----------------------------------------------------------------------------

// d loss / d logits of the oracle against central differences of the oracle's own loss (a
// scalar already), with an ignored row, a vocabulary of 1 and a masked entry.
TEST(CrossEntropyReference, MatchesFiniteDifferences) {
    for (index_t V : {index_t(1), index_t(2), index_t(7), index_t(13)}) {
        SCOPED_TRACE("V " + std::to_string(V));
        const index_t N = 5;
        dtensor2 z(N, V), d(N, V), scratch(N, V);
        fill_random(z, distribution::gaussian, 30 + V);
        for (index_t i = 0; i < z.size(); ++i) z.data()[i] *= 3.0;
        const targets_t t = make_targets(N, V, 31 + V, 3);
        attnkit::reference::model::cross_entropy(z, t, d);
        const auto loss = [&] { return attnkit::reference::model::cross_entropy(z, t, scratch); };
        expect_gradient_matches_fd(z, d, loss, "d_logits");
        for (index_t j = 0; j < V; ++j) EXPECT_EQ(d(2, j), 0.0);  // the ignored row
    }
}

// ---- the kernel against the oracle ---------------------------------------------------------

class CrossEntropyVocab : public ::testing::TestWithParam<index_t> {};

TEST_P(CrossEntropyVocab, MatchesReference) {
    const index_t V = GetParam(), N = 7;
    std::size_t i = 0;
    for (distribution dist : kAllDistributions) {
        if (!sweep_takes(static_cast<std::size_t>(V) + i++, 0, 2)) continue;
        SCOPED_TRACE(name(dist));
        tensor2 z(N, V), d(N, V);
        fill_random(z, dist, 50 + V);
        for (index_t k = 0; k < z.size(); ++k) z.data()[k] *= 4.0f;
        d.setConstant(7.0f);
        const targets_t t = make_targets(N, V, 51 + V, 4);
        const double loss = attnkit::model::cross_entropy(z, t, d);
        expect_matches_reference(z, t, d, loss);
    }
}

INSTANTIATE_TEST_SUITE_P(Vocab, CrossEntropyVocab,
                         ::testing::Values(index_t(1), index_t(2), index_t(3), index_t(4), index_t(7), index_t(8),
                                           index_t(9), index_t(15), index_t(16), index_t(17), index_t(31),
                                           index_t(33), index_t(64), index_t(100), index_t(128), index_t(257),
                                           index_t(1000), index_t(32003)),
                         [](const auto& info) { return "V" + std::to_string(info.param); });

// Logits at 1e4 scale (and rows of near-equal large logits): the shift by the row maximum keeps
// them finite and accurate.
TEST(CrossEntropy, LargeLogitsAreStable) {
    const index_t N = 6, V = 37;
    tensor2 z(N, V), d(N, V);
    fill_random(z, distribution::gaussian, 7);
    for (index_t k = 0; k < z.size(); ++k) z.data()[k] *= 1e4f;
    for (index_t j = 0; j < V; ++j) {
        z(4, j) = 1e4f + static_cast<float>(j % 5);   // close values at a large offset
        z(5, j) = -3e4f - static_cast<float>(j % 3);  // all very negative
    }
    const targets_t t = {0, 5, 36, 17, 2, 1};
    const double loss = attnkit::model::cross_entropy(z, t, d);
    EXPECT_TRUE(std::isfinite(loss));
    for (index_t k = 0; k < d.size(); ++k) ASSERT_TRUE(std::isfinite(d.data()[k])) << k;
    expect_matches_reference(z, t, d, loss);
}

// Ignored rows (any negative target) get a zero gradient, are not read (NaN there changes
// nothing) and do not count: the loss and the other rows' gradients are the same bits as a call
// without those rows.
TEST(CrossEntropy, IgnoredRowsAreLeftOut) {
    const index_t N = 9, V = 21;
    tensor2 z(N, V), d(N, V);
    fill_random(z, distribution::outliers, 3);
    targets_t t = make_targets(N, V, 4);
    t[1] = -100, t[4] = -1, t[8] = std::numeric_limits<std::int32_t>::min();
    for (index_t j = 0; j < V; ++j) z(1, j) = std::numeric_limits<float>::quiet_NaN();
    d.setConstant(7.0f);
    const double loss = attnkit::model::cross_entropy(z, t, d);
    expect_matches_reference(z, t, d, loss);
    tensor2 kept(N - 3, V), dk(N - 3, V);
    targets_t tk;
    for (index_t r = 0, k = 0; r < N; ++r) {
        if (t[static_cast<std::size_t>(r)] < 0) continue;
        for (index_t j = 0; j < V; ++j) kept(k, j) = z(r, j);
        tk.push_back(t[static_cast<std::size_t>(r)]);
        ++k;
    }
    const double loss_kept = attnkit::model::cross_entropy(kept, tk, dk);
    EXPECT_TRUE(same_bits(loss, loss_kept)) << loss << " vs " << loss_kept;
    for (index_t r = 0, k = 0; r < N; ++r) {
        for (index_t j = 0; j < V; ++j) {
            if (t[static_cast<std::size_t>(r)] < 0) {
                ASSERT_EQ(d(r, j), 0.0f) << r << " " << j;
            } else {
                ASSERT_EQ(d(r, j), dk(k, j)) << r << " " << j;
            }
        }
        k += t[static_cast<std::size_t>(r)] >= 0 ? 1 : 0;
    }
}

TEST(CrossEntropy, NoCountedRowGivesZero) {
    tensor2 z(4, 10), d(4, 10);
    fill_random(z, distribution::gaussian, 5);
    d.setConstant(7.0f);
    EXPECT_EQ(attnkit::model::cross_entropy(z, targets_t{-100, -100, -1, -5}, d), 0.0);
    EXPECT_TRUE(all_equal_to(d, 0.0f));
    dtensor2 ref(4, 10);
    EXPECT_EQ(attnkit::reference::model::cross_entropy(z, targets_t{-100, -100, -1, -5}, ref), 0.0);
    tensor2 empty(0, 10), d_empty(0, 10);
    EXPECT_EQ(attnkit::model::cross_entropy(empty, targets_t{}, d_empty), 0.0);
}

// Masked vocabulary entries (-inf) have probability 0; a target at a masked entry makes its
// row's loss +inf with a finite gradient; a row with no finite logit has loss +inf and gradient
// -onehot / n; a NaN makes only its own row NaN.
TEST(CrossEntropy, MaskedAndNaNLogitsStayInTheirRows) {
    const index_t N = 5, V = 19;
    tensor2 z(N, V), d(N, V);
    fill_random(z, distribution::gaussian, 9);
    for (index_t j = 0; j < V; j += 3) z(0, j) = -kInf;  // masked entries, target unmasked
    z(1, 4) = -kInf;                                     // target masked
    for (index_t j = 0; j < V; ++j) z(2, j) = -kInf;     // nothing left
    const targets_t t = {1, 4, 6, 2, 3};
    const double loss = attnkit::model::cross_entropy(z, t, d);
    EXPECT_EQ(loss, std::numeric_limits<double>::infinity());
    for (index_t k = 0; k < d.size(); ++k) ASSERT_TRUE(std::isfinite(d.data()[k])) << k;
    for (index_t j = 0; j < V; j += 3) EXPECT_EQ(d(0, j), 0.0f);
    EXPECT_EQ(d(1, 4), -0.2f);
    for (index_t j = 0; j < V; ++j) EXPECT_EQ(d(2, j), j == 6 ? -0.2f : 0.0f);
    expect_matches_reference(z, t, d, loss);

    // A NaN logit: its row's loss and gradient are NaN, the other counted row's gradient is what
    // it is without the NaN row (at n = 2 against n = 1: half of it).
    tensor2 nan_row = z;
    nan_row(3, 5) = std::numeric_limits<float>::quiet_NaN();
    tensor2 dn(N, V);
    const double loss_nan = attnkit::model::cross_entropy(nan_row, targets_t{-1, -1, -1, 2, 3}, dn);
    EXPECT_TRUE(std::isnan(loss_nan));
    for (index_t j = 0; j < V; ++j) {
        EXPECT_TRUE(std::isnan(dn(3, j))) << j;
        EXPECT_TRUE(std::isfinite(dn(4, j))) << j;
    }
    tensor2 dn_alone(N, V);
    attnkit::model::cross_entropy(z, targets_t{-1, -1, -1, -1, 3}, dn_alone);
    tensor2 dn4(1, V), da4(1, V);
    for (index_t j = 0; j < V; ++j) dn4(0, j) = dn(4, j) * 2.0f, da4(0, j) = dn_alone(4, j);
    EXPECT_TRUE(all_close(dn4, da4, tolerance_for(4, 1.0)));
}

// d_logits = logits (the same view): the same bits as separate tensors; targets as a
// std::vector, an Eigen tensor and a strided view give the same.
TEST(CrossEntropy, InPlaceAndTargetTypes) {
    const index_t N = 11, V = 45;
    tensor2 z(N, V), d(N, V);
    fill_random(z, distribution::gaussian, 12);
    const targets_t t = make_targets(N, V, 13, 5);
    const double loss = attnkit::model::cross_entropy(z, t, d);

    tensor2 in_place = z;
    EXPECT_TRUE(same_bits(attnkit::model::cross_entropy(in_place, t, in_place), loss));
    EXPECT_TRUE(same_bits(in_place, d));

    Eigen::Tensor<std::int32_t, 1, Eigen::RowMajor> te(N);
    std::vector<std::int32_t> spaced(static_cast<std::size_t>(3 * N), 99);
    for (index_t r = 0; r < N; ++r) {
        te(r) = t[static_cast<std::size_t>(r)];
        spaced[static_cast<std::size_t>(3 * r)] = t[static_cast<std::size_t>(r)];
    }
    tensor2 de(N, V), ds(N, V);
    EXPECT_TRUE(same_bits(attnkit::model::cross_entropy(z, te, de), loss));
    EXPECT_TRUE(same_bits(de, d));
    const attnkit::view<const std::int32_t, 1> tv(spaced.data(), {N}, {3});
    EXPECT_TRUE(same_bits(attnkit::model::cross_entropy(z, tv, ds), loss));
    EXPECT_TRUE(same_bits(ds, d));

    // Strided logits and gradient: rows padded to 64 floats, the padding untouched.
    std::vector<float> zb(static_cast<std::size_t>(N * 64), -1.0f), db(zb.size(), -2.0f);
    for (index_t r = 0; r < N; ++r)
        for (index_t j = 0; j < V; ++j) zb[static_cast<std::size_t>(r * 64 + j)] = z(r, j);
    const attnkit::view<const float, 2> zv(zb.data(), {N, V}, {64, 1});
    const attnkit::view<float, 2> dv(db.data(), {N, V}, {64, 1});
    EXPECT_TRUE(same_bits(attnkit::model::cross_entropy(zv, t, dv), loss));
    for (index_t r = 0; r < N; ++r)
        for (index_t j = 0; j < 64; ++j)
            ASSERT_EQ(db[static_cast<std::size_t>(r * 64 + j)], j < V ? d(r, j) : -2.0f) << r << " " << j;
}

// Rows split over the pool in blocks fixed by V, losses added in row order: 1, 2 and 3 threads
// give the same bits for the loss and the gradient.
TEST(CrossEntropy, ThreadCountsGiveIdenticalResults) {
    const index_t N = 61, V = 3001;  // 10 rows per task: 7 tasks
    tensor2 z(N, V);
    fill_random(z, distribution::outliers, 21);
    const targets_t t = make_targets(N, V, 22, 7);
    attnkit::thread_pool p2(2), p3(3);
    attnkit::thread_pool* pools[3] = {nullptr, &p2, &p3};
    tensor2 d[3] = {tensor2(N, V), tensor2(N, V), tensor2(N, V)};
    double loss[3];
    for (int k = 0; k < 3; ++k) loss[k] = attnkit::model::cross_entropy(z, t, d[k], pools[k]);
    for (int k = 1; k < 3; ++k) {
        EXPECT_TRUE(same_bits(loss[k], loss[0])) << k + 1 << " threads";
        EXPECT_TRUE(same_bits(d[k], d[0])) << k + 1 << " threads";
    }
    expect_matches_reference(z, t, d[0], loss[0]);
}

TEST(CrossEntropy, RejectsBadArguments) {
    const index_t N = 4, V = 6;
    tensor2 z(N, V), d(N, V), bad(N, V + 1);
    z.setConstant(1.0f);
    d.setConstant(5.0f);
    expect_invalid([&] { attnkit::model::cross_entropy(z, targets_t{0, 1, 6, 2}, d); },
                   "targets: expected < V = 6 (or < 0 to ignore the row), got 6 at [2] for logits [4, 6]");
    expect_invalid([&] { attnkit::model::cross_entropy(z, targets_t{0, 1, 2}, d); },
                   "targets: expected shape [N] = [4] for logits [4, 6], got [3]");
    expect_invalid([&] { attnkit::model::cross_entropy(z, targets_t{0, 1, 2, 3}, bad); },
                   "d_logits: expected the shape of logits [4, 6], got [4, 7]");
    // d_logits one row into logits, over the targets, or repeating a row.
    std::vector<float> buf(static_cast<std::size_t>((N + 1) * V), 1.0f);
    const std::vector<float> buf0 = buf;
    const attnkit::view<const float, 2> zv(buf.data(), {N, V});
    const attnkit::view<float, 2> shifted(buf.data() + V, {N, V});
    attnkit::thread_pool pool(2);
    expect_invalid([&] { attnkit::model::cross_entropy(zv, targets_t{0, 1, 2, 3}, shifted, &pool); },
                   {"d_logits", "logits", "overlap"});
    EXPECT_TRUE(buf == buf0);
    std::vector<std::int32_t> tbuf(static_cast<std::size_t>(N * V), 0);
    const attnkit::view<const std::int32_t, 1> tv(tbuf.data(), {N});
    const attnkit::view<float, 2> over_targets(reinterpret_cast<float*>(tbuf.data()), {N, V});
    expect_invalid([&] { attnkit::model::cross_entropy(z, tv, over_targets); }, {"d_logits", "targets", "overlap"});
    EXPECT_TRUE(std::all_of(tbuf.begin(), tbuf.end(), [](std::int32_t x) { return x == 0; }));
    const attnkit::view<float, 2> repeated(d.data(), {N, V}, {0, 1});
    expect_invalid([&] { attnkit::model::cross_entropy(z, targets_t{0, 1, 2, 3}, repeated); }, "d_logits: strides");
    EXPECT_TRUE(all_equal_to(d, 5.0f));
    dtensor2 ref(N, V);
    EXPECT_THROW(attnkit::reference::model::cross_entropy(z, targets_t{0, 1, 6, 2}, ref), std::invalid_argument);
}

}  // namespace
