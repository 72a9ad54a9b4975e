// attnkit::model::hybrid_schedule: every schedule exactly as the paper's 24-layer table, the
// scaled rules at 6 and 12 layers, and the errors.
#include "attnkit/model/hybrid_schedule.hpp"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using attnkit::model::hybrid_schedule;

// 1-indexed layers keeping standard attention, as the paper lists them.
std::set<int> standard_layers(const std::string& name, int n) {
    const std::vector<bool> keep = hybrid_schedule(name, n);
    EXPECT_EQ(keep.size(), static_cast<std::size_t>(n));
    std::set<int> s;
    for (int l = 0; l < n; ++l)
        if (keep[static_cast<std::size_t>(l)]) s.insert(l + 1);
    return s;
}

std::set<int> range(int a, int b) {
    std::set<int> s;
    for (int l = a; l <= b; ++l) s.insert(l);
    return s;
}
std::set<int> step(int first, int last, int by) {
    std::set<int> s;
    for (int l = first; l <= last; l += by) s.insert(l);
    return s;
}
std::set<int> join(std::set<int> a, const std::set<int>& b) {
    a.insert(b.begin(), b.end());
    return a;
}

TEST(HybridSchedule, PaperTableAt24Layers) {
    EXPECT_EQ(standard_layers("uniform", 24), std::set<int>{});
    EXPECT_EQ(standard_layers("hybrid", 24), step(2, 24, 2));
    EXPECT_EQ(standard_layers("even", 24), step(2, 24, 2));
    EXPECT_EQ(standard_layers("odd", 24), step(1, 23, 2));
    EXPECT_EQ(standard_layers("top", 24), range(1, 12));
    EXPECT_EQ(standard_layers("middle", 24), join(range(1, 6), range(19, 24)));
    EXPECT_EQ(standard_layers("bottom", 24), range(13, 24));
    EXPECT_EQ(standard_layers("25%", 24), (std::set<int>{4, 8, 12, 16, 20, 24}));
    EXPECT_EQ(standard_layers("first", 24), std::set<int>{1});
    EXPECT_EQ(standard_layers("last", 24), std::set<int>{24});
    EXPECT_EQ(standard_layers("bilateral", 24), (std::set<int>{1, 24}));
}

TEST(HybridSchedule, ScaledTo12Layers) {
    EXPECT_EQ(standard_layers("hybrid", 12), step(2, 12, 2));
    EXPECT_EQ(standard_layers("odd", 12), step(1, 11, 2));
    EXPECT_EQ(standard_layers("top", 12), range(1, 6));
    EXPECT_EQ(standard_layers("middle", 12), join(range(1, 3), range(10, 12)));
    EXPECT_EQ(standard_layers("bottom", 12), range(7, 12));
    EXPECT_EQ(standard_layers("25%", 12), (std::set<int>{4, 8, 12}));
    EXPECT_EQ(standard_layers("last", 12), std::set<int>{12});
    EXPECT_EQ(standard_layers("bilateral", 12), (std::set<int>{1, 12}));
}

TEST(HybridSchedule, ScaledTo6Layers) {
    EXPECT_EQ(standard_layers("uniform", 6), std::set<int>{});
    EXPECT_EQ(standard_layers("even", 6), (std::set<int>{2, 4, 6}));
    EXPECT_EQ(standard_layers("odd", 6), (std::set<int>{1, 3, 5}));
    EXPECT_EQ(standard_layers("top", 6), range(1, 3));
    EXPECT_EQ(standard_layers("middle", 6), (std::set<int>{1, 2, 5, 6}));  // round(6/4) = 2 at each end
    EXPECT_EQ(standard_layers("middle", 5), (std::set<int>{1, 5}));
    EXPECT_EQ(standard_layers("middle", 7), (std::set<int>{1, 2, 6, 7}));
    EXPECT_EQ(standard_layers("middle", 3), (std::set<int>{1, 3}));
    EXPECT_EQ(standard_layers("bottom", 6), range(4, 6));
    EXPECT_EQ(standard_layers("25%", 6), std::set<int>{4});
    EXPECT_EQ(standard_layers("first", 6), std::set<int>{1});
    EXPECT_EQ(standard_layers("bilateral", 6), (std::set<int>{1, 6}));
}

TEST(HybridSchedule, OneLayer) {
    EXPECT_EQ(standard_layers("bilateral", 1), std::set<int>{1});
    EXPECT_EQ(standard_layers("top", 1), std::set<int>{});
}

TEST(HybridSchedule, UnknownNameListsTheValidOnes) {
    try {
        hybrid_schedule("sandwich", 24);
        FAIL() << "no exception";
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("sandwich"), std::string::npos) << what;
        for (const std::string& n : attnkit::model::hybrid_schedule_names())
            EXPECT_NE(what.find(n), std::string::npos) << n << " missing from: " << what;
    }
    EXPECT_THROW(hybrid_schedule("top", 0), std::invalid_argument);
}

}  // namespace

// A layer count past 2^24 is std::invalid_argument naming n_layers (2^62 used to reach the
// vector's allocation: length_error or bad_alloc).
TEST(HybridSchedule, RejectsLayerCountsPastTheLimit) {
    for (attnkit::index_t n : {attnkit::index_t(0), (attnkit::index_t(1) << 24) + 1, attnkit::index_t(1) << 62}) {
        try {
            attnkit::model::hybrid_schedule("middle", n);
            ADD_FAILURE() << "no exception for n_layers = " << n;
        } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("n_layers"), std::string::npos) << e.what();
        } catch (const std::exception& e) {
            ADD_FAILURE() << "wrong exception type for n_layers = " << n << ": " << e.what();
        }
    }
    EXPECT_EQ(attnkit::model::hybrid_schedule("first", 3).size(), 3u);
}
