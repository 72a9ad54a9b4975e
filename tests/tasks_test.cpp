// The training tasks' generators (model/tasks.hpp): the block task's sequences hold what the
// task promises (a query answered by one block only, the answer as targets), stream windows
// are next-token pairs inside their range, and the accuracies count what they say.
#include "attnkit/model/tasks.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "attnkit/eigen.hpp"
#include "common/errors.hpp"

namespace {

using namespace attnkit::model;
using attnkit::index_t;
using attnkit_test::expect_invalid;

TEST(BlockTask, SequencesAreWellFormed) {
    block_task_options o;
    o.blocks = 6;
    o.block_size = 4;
    o.query = 2;
    using O = block_task_options;
    const index_t L = o.length();
    ASSERT_EQ(L, 6 * 5 + 1 + 2 + 1 + 3);
    const token_batch b = block_task_batch(o, 50, 3);
    ASSERT_EQ(b.length, L);
    for (index_t s = 0; s < 50; ++s) {
        const std::int32_t* t = &b.tokens[static_cast<std::size_t>(s * L)];
        const std::int32_t* y = &b.targets[static_cast<std::size_t>(s * L)];
        std::vector<std::set<std::int32_t>> blocks;
        for (index_t k = 0; k < 6; ++k) {
            std::set<std::int32_t> blk(t + k * 5, t + k * 5 + 4);
            EXPECT_EQ(blk.size(), 4u) << "letters of a block are distinct";
            for (std::int32_t c : blk) EXPECT_LT(c, O::kLetters);
            EXPECT_EQ(t[k * 5 + 4], O::kDot);
            blocks.push_back(blk);
        }
        ASSERT_EQ(t[30], O::kHash);
        ASSERT_EQ(t[33], O::kEquals);
        // Exactly one block holds both query letters, and the targets spell it.
        index_t holders = 0, target = -1;
        for (index_t k = 0; k < 6; ++k)
            if (blocks[static_cast<std::size_t>(k)].count(t[31]) && blocks[static_cast<std::size_t>(k)].count(t[32])) {
                ++holders;
                target = k;
            }
        ASSERT_EQ(holders, 1);
        EXPECT_NE(t[31], t[32]);
        for (index_t i = 0; i < 4; ++i) EXPECT_EQ(y[33 + i], t[target * 5 + i]);
        for (index_t i = 0; i + 1 < 4; ++i) EXPECT_EQ(t[34 + i], t[target * 5 + i]);  // teacher forcing
        for (index_t l = 0; l < 33; ++l) EXPECT_EQ(y[l], -1);
    }
    EXPECT_EQ(block_task_batch(o, 50, 3).tokens, b.tokens);
    EXPECT_NE(block_task_batch(o, 50, 4).tokens, b.tokens);
    o.query = 5;
    expect_invalid([&] { block_task_batch(o, 1, 1); }, {"query"});
}

TEST(StreamWindows, NextTokenPairsInsideTheRange) {
    std::vector<std::int32_t> stream;
    for (int i = 0; i < 100; ++i) stream.push_back(i);
    weight_rng rng(5);
    const token_batch b = stream_windows(stream, 20, 60, 30, 8, rng);
    for (index_t s = 0; s < 30; ++s)
        for (index_t l = 0; l < 8; ++l) {
            const std::int32_t t = b.tokens[static_cast<std::size_t>(s * 8 + l)];
            EXPECT_EQ(b.targets[static_cast<std::size_t>(s * 8 + l)], t + 1);
            EXPECT_EQ(t, b.tokens[static_cast<std::size_t>(s * 8)] + l);
            EXPECT_GE(t, 20);
            EXPECT_LT(t + 1, 60);
        }
    expect_invalid([&] { stream_windows(stream, 20, 25, 1, 8, rng); }, {"L + 1 = 9"});
}

TEST(Accuracy, PositionsAndSequences) {
    Eigen::Tensor<float, 2, Eigen::RowMajor> logits(4, 3);
    logits.setZero();
    logits(0, 1) = 1;  // argmax 1
    logits(1, 2) = 1;  // argmax 2
    logits(2, 0) = 1;  // argmax 0
    logits(3, 0) = 1;  // argmax 0
    const std::vector<std::int32_t> y{1, 1, -1, 0};
    EXPECT_DOUBLE_EQ(accuracy(logits, y), 2.0 / 3.0);
    EXPECT_DOUBLE_EQ(sequence_accuracy(logits, y, 2), 0.5);  // [1, 1] wrong, [-1, 0] right
    expect_invalid([&] { sequence_accuracy(logits, y, 3); }, {"batch 3"});
}

}  // namespace
