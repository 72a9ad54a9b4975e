// The fast kernel's parallel paths, small enough to run under ThreadSanitizer (label `threads`):
// prefill over (batch, head, query block), GQA, split-KV decode and its merge, a shared pool
// used by several callers at once, and concurrent calls without a pool. Each result must be
// bitwise identical to the single-threaded one.
#include <gtest/gtest.h>

#include <attnkit/attnkit.hpp>

#include <cstring>
#include <thread>
#include <vector>

#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit_test::distribution;

struct shape {
    index_t B, Lq, Lk, H, Hk, D;
    bool causal;
};

struct result {
    attnkit_test::tensor4<float> out;
    attnkit_test::tensor3<float> lse;
};

result run(const shape& s, attnkit::thread_pool* pool, std::uint64_t seed = 7) {
    const auto q = attnkit_test::random_bshd(s.B, s.Lq, s.H, s.D, distribution::gaussian, seed);
    const auto k = attnkit_test::random_bshd(s.B, s.Lk, s.Hk, s.D, distribution::gaussian, seed + 1);
    const auto v = attnkit_test::random_bshd(s.B, s.Lk, s.Hk, s.D, distribution::gaussian, seed + 2);
    result r{attnkit_test::make_bshd(s.B, s.Lq, s.H, s.D, 0.0f), attnkit_test::make_lse(s.B, s.Lq, s.H)};
    attnkit::softmax_options o;
    o.causal = s.causal;
    o.pool = pool;
    attnkit::softmax_attention(q, k, v, r.out, r.lse, o);
    return r;
}

bool bitwise_equal(const result& a, const result& b) {
    return a.out.size() == b.out.size() &&
           std::memcmp(a.out.data(), b.out.data(), sizeof(float) * a.out.size()) == 0 &&
           std::memcmp(a.lse.data(), b.lse.data(), sizeof(float) * a.lse.size()) == 0;
}

const std::vector<shape> kShapes = {
    {2, 300, 300, 4, 4, 32, true},   // prefill, several query blocks per head
    {1, 40, 200, 8, 2, 16, false},   // GQA
    {1, 1, 3000, 4, 2, 32, false},   // decode: split-KV and merge
    {1, 3, 2500, 2, 1, 16, true},    // short queries, split-KV
};

TEST(softmax_attention_threads, pools_of_any_size_match_the_calling_thread) {
    for (const shape& s : kShapes) {
        const result serial = run(s, nullptr);
        for (std::size_t n : {1, 2, 3}) {
            attnkit::thread_pool pool(n);
            EXPECT_TRUE(bitwise_equal(serial, run(s, &pool))) << "threads " << n << " Lq " << s.Lq << " Lk " << s.Lk;
        }
    }
}

TEST(softmax_attention_threads, concurrent_callers_share_one_pool) {
    attnkit::thread_pool pool(3);
    std::vector<result> expected;
    for (const shape& s : kShapes) expected.push_back(run(s, nullptr));
    std::vector<int> ok(kShapes.size(), 0);
    std::vector<std::thread> callers;
    for (std::size_t i = 0; i < kShapes.size(); ++i)
        callers.emplace_back([&, i] { ok[i] = bitwise_equal(expected[i], run(kShapes[i], &pool)); });
    for (auto& t : callers) t.join();
    for (std::size_t i = 0; i < kShapes.size(); ++i) EXPECT_TRUE(ok[i]) << "caller " << i;
}

TEST(softmax_attention_threads, concurrent_calls_without_a_pool) {
    const result expected = run(kShapes[0], nullptr);
    std::vector<int> ok(3, 0);
    std::vector<std::thread> callers;
    for (std::size_t i = 0; i < ok.size(); ++i)
        callers.emplace_back([&, i] { ok[i] = bitwise_equal(expected, run(kShapes[0], nullptr)); });
    for (auto& t : callers) t.join();
    for (std::size_t i = 0; i < ok.size(); ++i) EXPECT_TRUE(ok[i]) << "caller " << i;
}

}  // namespace
