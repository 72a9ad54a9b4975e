// Synthetic tasks to train the decoder template on, generated from a seed (nothing is
// downloaded), and the accuracy of a model's logits on them.
//
//   attnkit::model::mqar_options mo;   // vocab 64, 8 key-value pairs, 8 queries
//   attnkit::model::token_batch b = attnkit::model::mqar_batch(mo, 32, seed);
//   double loss = model.loss_and_gradients(b.tokens, b.targets, b.batch, g);
//   double acc = attnkit::model::accuracy(model.batch_logits(b.tokens, b.batch), b.targets);
//
// mqar_batch, block_task_batch: seeded batches of the two synthetic tasks; stream_windows:
// next-token windows of a token stream (read_text_corpus: a directory of text files as bytes);
// accuracy per scored
// position, sequence_accuracy per sequence.
//
// MQAR, multi-query associative recall (Arora et al., "Zoology", 2023): a sequence lists
// `pairs` key-value pairs k_1 v_1 ... k_n v_n (distinct keys from the lower half of the vocab,
// values from the upper half, token 0 unused), then `queries` keys drawn from those pairs
// (distinct while there are enough); the target at each query is its key's value, every other
// target is ignored (-1). Zoology scatters its queries among noise tokens; here they follow the
// pairs directly, which keeps the sequences short enough to train on two cores in minutes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/config.hpp"
#include "attnkit/model/decoder_config.hpp"

namespace attnkit {
namespace model {

// tokens and targets [batch, length], row-major; a target < 0 is not scored.
struct token_batch {
    std::vector<std::int32_t> tokens, targets;
    index_t batch = 0, length = 0;
};

struct mqar_options {
    index_t vocab = 64;
    index_t pairs = 8;
    index_t queries = 8;
    index_t length() const { return 2 * pairs + queries; }
};

namespace detail {

// A batch of `batch` sequences of length L: tokens 0, every target ignored.
inline token_batch empty_batch(index_t batch, index_t L) {
    token_batch b;
    b.batch = batch;
    b.length = L;
    b.tokens.assign(static_cast<std::size_t>(batch * L), 0);
    b.targets.assign(static_cast<std::size_t>(batch * L), -1);
    return b;
}

}  // namespace detail

inline token_batch mqar_batch(const mqar_options& o, index_t batch, std::uint64_t seed) {
    const index_t keys = (o.vocab - 1) / 2;  // keys 1 .. keys, values keys + 1 .. vocab - 1
    if (o.pairs < 1 || o.queries < 1 || batch < 1)
        throw std::invalid_argument("attnkit::model::mqar_batch: pairs, queries and batch must be >= 1, got " +
                                    std::to_string(o.pairs) + ", " + std::to_string(o.queries) + ", " +
                                    std::to_string(batch));
    if (o.pairs > keys || o.vocab - 1 - keys < 1)
        throw std::invalid_argument("attnkit::model::mqar_batch: vocab = " + std::to_string(o.vocab) +
                                    " has " + std::to_string(keys) + " keys, fewer than pairs = " +
                                    std::to_string(o.pairs) + " (or no values)");
    const index_t values = o.vocab - 1 - keys, L = o.length();
    weight_rng rng(seed);
    token_batch b = detail::empty_batch(batch, L);
    std::vector<index_t> pool(static_cast<std::size_t>(keys)), order(static_cast<std::size_t>(o.pairs));
    for (index_t s = 0; s < batch; ++s) {
        std::int32_t* t = &b.tokens[static_cast<std::size_t>(s * L)];
        std::int32_t* y = &b.targets[static_cast<std::size_t>(s * L)];
        for (index_t i = 0; i < keys; ++i) pool[static_cast<std::size_t>(i)] = i;
        for (index_t i = 0; i < o.pairs; ++i) {  // a partial Fisher-Yates shuffle: distinct keys
            std::swap(pool[static_cast<std::size_t>(i)], pool[static_cast<std::size_t>(i + rng.below(keys - i))]);
            t[2 * i] = static_cast<std::int32_t>(1 + pool[static_cast<std::size_t>(i)]);
            t[2 * i + 1] = static_cast<std::int32_t>(1 + keys + rng.below(values));
        }
        for (index_t q = 0; q < o.queries; ++q) {
            if (q % o.pairs == 0) {  // a new round of distinct pairs
                for (index_t i = 0; i < o.pairs; ++i) order[static_cast<std::size_t>(i)] = i;
                for (index_t i = 0; i + 1 < o.pairs; ++i)
                    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(i + rng.below(o.pairs - i))]);
            }
            const index_t p = order[static_cast<std::size_t>(q % o.pairs)];
            t[2 * o.pairs + q] = t[2 * p];
            y[2 * o.pairs + q] = t[2 * p + 1];
        }
    }
    return b;
}

// The block task of the multi-token attention paper (Golovneva et al., 2025, section 4.1):
// `blocks` blocks of `block_size` distinct random letters, each followed by '.', then '#', the
// `query` letters of one block (distinct, in random order, and held together by no other block),
// '=' and that block's letters, which are the targets (teacher forcing: the target at '=' is the
// block's first letter, ...). Finding the block needs several query letters matched at once,
// which one attention head's single query-key similarity cannot express and MTA's key-query
// convolution can. Tokens: letters 0..25, '.' 26, '#' 27, '=' 28 (vocab 29).
struct block_task_options {
    index_t blocks = 8;
    index_t block_size = 5;  // N of the paper
    index_t query = 2;       // L of the paper
    static constexpr index_t kLetters = 26, kDot = 26, kHash = 27, kEquals = 28, kVocab = 29;
    index_t length() const { return blocks * (block_size + 1) + 1 + query + 1 + block_size - 1; }
};

inline token_batch block_task_batch(const block_task_options& o, index_t batch, std::uint64_t seed) {
    using O = block_task_options;
    if (o.blocks < 2 || o.block_size < 1 || o.block_size > O::kLetters || o.query < 1 || o.query > o.block_size ||
        batch < 1)
        throw std::invalid_argument("attnkit::model::block_task_batch: need blocks >= 2, 1 <= query <= block_size <= 26 "
                                    "and batch >= 1, got blocks " + std::to_string(o.blocks) + ", block_size " +
                                    std::to_string(o.block_size) + ", query " + std::to_string(o.query) +
                                    ", batch " + std::to_string(batch));
    const index_t L = o.length(), N = o.block_size;
    weight_rng rng(seed);
    token_batch b = detail::empty_batch(batch, L);
    std::vector<std::vector<std::int32_t>> blocks(static_cast<std::size_t>(o.blocks));
    std::vector<std::int32_t> letters(O::kLetters), q;
    for (index_t s = 0; s < batch; ++s) {
        // Draw until the query letters sit together in the target block alone (with 8 blocks of
        // 5 letters and 2 query letters, about one draw in six needs a second).
        index_t target = 0;
        for (bool unique = false; !unique;) {
            for (auto& blk : blocks) {
                for (index_t i = 0; i < O::kLetters; ++i) letters[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
                blk.clear();
                for (index_t i = 0; i < N; ++i) {
                    std::swap(letters[static_cast<std::size_t>(i)], letters[static_cast<std::size_t>(i + rng.below(O::kLetters - i))]);
                    blk.push_back(letters[static_cast<std::size_t>(i)]);
                }
            }
            target = rng.below(o.blocks);
            q = blocks[static_cast<std::size_t>(target)];
            for (index_t i = 0; i < o.query; ++i)
                std::swap(q[static_cast<std::size_t>(i)], q[static_cast<std::size_t>(i + rng.below(N - i))]);
            q.resize(static_cast<std::size_t>(o.query));
            unique = true;
            for (index_t k = 0; k < o.blocks && unique; ++k) {
                if (k == target) continue;
                const auto& blk = blocks[static_cast<std::size_t>(k)];
                bool all = true;
                for (std::int32_t c : q) all = all && std::find(blk.begin(), blk.end(), c) != blk.end();
                unique = !all;
            }
        }
        std::int32_t* t = &b.tokens[static_cast<std::size_t>(s * L)];
        std::int32_t* y = &b.targets[static_cast<std::size_t>(s * L)];
        index_t at = 0;
        for (const auto& blk : blocks) {
            for (std::int32_t c : blk) t[at++] = c;
            t[at++] = O::kDot;
        }
        t[at++] = O::kHash;
        for (std::int32_t c : q) t[at++] = c;
        t[at++] = O::kEquals;
        const auto& ans = blocks[static_cast<std::size_t>(target)];
        for (index_t i = 0; i < N; ++i) {
            y[at - 1 + i] = ans[static_cast<std::size_t>(i)];
            if (i + 1 < N) t[at + i] = ans[static_cast<std::size_t>(i)];
        }
    }
    return b;
}

// Random windows of a token stream, starting in [begin, end - L - 1]: inputs stream[s .. s + L),
// targets stream[s + 1 .. s + L + 1) (next-token prediction).
inline token_batch stream_windows(const std::vector<std::int32_t>& stream, index_t begin, index_t end, index_t batch,
                                  index_t L, weight_rng& rng) {
    if (begin < 0 || end > static_cast<index_t>(stream.size()) || end - begin < L + 1 || L < 1 || batch < 1)
        throw std::invalid_argument("attnkit::model::stream_windows: need L + 1 = " + std::to_string(L + 1) +
                                    " tokens in [" + std::to_string(begin) + ", " + std::to_string(end) +
                                    ") of a stream of " + std::to_string(stream.size()));
    token_batch b;
    b.batch = batch;
    b.length = L;
    const index_t starts = end - begin - L;
    for (index_t s = 0; s < batch; ++s) {
        const index_t at = begin + rng.below(starts);
        b.tokens.insert(b.tokens.end(), stream.begin() + at, stream.begin() + at + L);
        b.targets.insert(b.targets.end(), stream.begin() + at + 1, stream.begin() + at + L + 1);
    }
    return b;
}

// The bytes of every plain file directly in `dir` whose name has no '.' (Debian's fortunes
// directory holds each collection as `name`, its index `name.dat` and a UTF-8 copy `name.u8`:
// this keeps the collections once), sorted by name and concatenated, as tokens 0..255 (a
// character-level corpus, vocab 256). Empty when the directory does not exist.
inline std::vector<std::int32_t> read_text_corpus(const std::string& dir) {
    namespace fs = std::filesystem;
    std::vector<std::int32_t> bytes;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return bytes;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        if (e.is_regular_file(ec) && !n.empty() && n.find('.') == std::string::npos) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
        std::ifstream in(f, std::ios::binary);
        for (std::istreambuf_iterator<char> it(in), end; it != end; ++it)
            bytes.push_back(static_cast<unsigned char>(*it));
    }
    return bytes;
}

// The fraction of sequences whose every scored position is right (the block task's measure:
// the whole block must come out).
template <class Logits>
double sequence_accuracy(const Logits& logits, const std::vector<std::int32_t>& targets, index_t batch) {
    const index_t N = static_cast<index_t>(logits.dimension(0)), V = static_cast<index_t>(logits.dimension(1));
    if (batch < 1 || N % batch != 0 || static_cast<index_t>(targets.size()) != N)
        throw std::invalid_argument("attnkit::model::sequence_accuracy: " + std::to_string(targets.size()) +
                                    " targets and " + std::to_string(N) + " logits rows for batch " +
                                    std::to_string(batch));
    const index_t L = N / batch;
    index_t right = 0;
    for (index_t s = 0; s < batch; ++s) {
        bool all = true;
        for (index_t l = 0; l < L && all; ++l) {
            const std::int32_t y = targets[static_cast<std::size_t>(s * L + l)];
            if (y < 0) continue;
            const float* r = logits.data() + (s * L + l) * V;
            all = static_cast<index_t>(std::max_element(r, r + V) - r) == y;
        }
        right += all;
    }
    return static_cast<double>(right) / static_cast<double>(batch);
}

// The fraction of scored positions (target >= 0) whose largest logit is the target's (the first
// index on ties). logits [N, vocab] row-major as decoder::batch_logits gives them.
template <class Logits>
double accuracy(const Logits& logits, const std::vector<std::int32_t>& targets) {
    const index_t N = static_cast<index_t>(logits.dimension(0)), V = static_cast<index_t>(logits.dimension(1));
    if (static_cast<index_t>(targets.size()) != N)
        throw std::invalid_argument("attnkit::model::accuracy: targets: expected " + std::to_string(N) +
                                    " values (one per logits row), got " + std::to_string(targets.size()));
    index_t hit = 0, counted = 0;
    for (index_t n = 0; n < N; ++n) {
        const std::int32_t y = targets[static_cast<std::size_t>(n)];
        if (y < 0) continue;
        const float* r = logits.data() + n * V;
        hit += static_cast<index_t>(std::max_element(r, r + V) - r) == y;
        ++counted;
    }
    return counted > 0 ? static_cast<double>(hit) / static_cast<double>(counted) : 0.0;
}

}  // namespace model
}  // namespace attnkit
