#include "attnkit/thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ctime>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using attnkit::thread_pool;
using chunk = std::pair<std::int64_t, std::int64_t>;

const std::size_t kPoolSizes[] = {1, 2, 3, 8};

void expect_each_once(thread_pool& pool, std::int64_t n) {
  std::vector<std::atomic<int>> calls(static_cast<std::size_t>(n > 0 ? n : 0));
  std::atomic<std::int64_t> out_of_range{0};
  pool.parallel_for(n, [&](std::int64_t i) {
    if (i < 0 || i >= n) ++out_of_range;
    else ++calls[static_cast<std::size_t>(i)];
  });
  EXPECT_EQ(out_of_range.load(), 0) << "pool " << pool.size() << " n " << n;
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_EQ(calls[static_cast<std::size_t>(i)].load(), 1)
        << "pool " << pool.size() << " n " << n << " index " << i;
}

std::vector<chunk> record_chunks(thread_pool* pool, std::int64_t b, std::int64_t e,
                                 std::int64_t g) {
  std::mutex mu;
  std::vector<chunk> got;
  attnkit::parallel_for(pool, b, e, g, [&](std::int64_t cb, std::int64_t ce) {
    std::lock_guard<std::mutex> lk(mu);
    got.emplace_back(cb, ce);
  });
  std::sort(got.begin(), got.end());
  return got;
}

TEST(thread_pool, size_and_construction) {
  for (std::size_t n : kPoolSizes) EXPECT_EQ(thread_pool(n).size(), n);
  const std::size_t hw = std::thread::hardware_concurrency();
  EXPECT_EQ(thread_pool(0).size(), hw == 0 ? 1 : hw);
}

TEST(thread_pool, every_index_exactly_once) {
  for (std::size_t size : kPoolSizes) {
    thread_pool pool(size);
    for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, std::int64_t{1000},
                           std::int64_t{100000}})
      expect_each_once(pool, n);
    int calls = 0;
    pool.parallel_for(-5, [&](std::int64_t) { ++calls; });
    EXPECT_EQ(calls, 0);
  }
}

TEST(thread_pool, workers_actually_share_the_work) {
  // Every call waits until all size() calls have started: only true parallelism gets through.
  for (std::size_t size : {2, 3, 8}) {
    thread_pool pool(size);
    std::atomic<std::int64_t> started{0};
    std::atomic<bool> timed_out{false};
    const auto n = static_cast<std::int64_t>(size);
    pool.parallel_for(n, [&](std::int64_t) {
      ++started;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (started.load() < n && !timed_out.load()) {
        if (std::chrono::steady_clock::now() > deadline) { timed_out = true; return; }
        std::this_thread::yield();
      }
    });
    EXPECT_FALSE(timed_out.load()) << "pool " << size;
  }
}

TEST(thread_pool, idle_workers_do_not_spin) {
  thread_pool pool(8);
  expect_each_once(pool, 1000);
  const std::clock_t c0 = std::clock();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double cpu_ms = 1000.0 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  EXPECT_LT(cpu_ms, 60.0);  // spinning workers would burn hundreds of ms here
}

TEST(thread_pool, chunk_boundaries_exact_and_pool_independent) {
  struct range { std::int64_t b, e, g; };
  const range cases[] = {{0, 100, 10}, {0, 101, 10}, {3, 4, 100}, {-17, 45, 7}, {5, 5, 3},
                         {9, 2, 3},    {0, 1000, 1}, {0, 10, 10}, {0, 11, 10}};
  for (const range& r : cases) {
    std::vector<chunk> expected;
    for (std::int64_t cb = r.b; cb < r.e; cb += r.g) expected.emplace_back(cb, std::min(r.e, cb + r.g));
    EXPECT_EQ(record_chunks(nullptr, r.b, r.e, r.g), expected);
    for (std::size_t size : kPoolSizes) {
      thread_pool pool(size);
      EXPECT_EQ(record_chunks(&pool, r.b, r.e, r.g), expected)
          << "pool " << size << " [" << r.b << "," << r.e << ") grain " << r.g;
    }
  }
  thread_pool pool(2);
  auto noop = [](std::int64_t, std::int64_t) {};
  EXPECT_THROW(pool.parallel_for(0, 10, 0, noop), std::invalid_argument);
  EXPECT_THROW(attnkit::parallel_for(nullptr, 0, 10, -1, noop), std::invalid_argument);
}

// thread_pool(-1) wraps to SIZE_MAX threads: an invalid_argument naming the count, not a
// length_error from vector::reserve or an attempt to start billions of threads.
TEST(thread_pool, absurd_thread_counts_are_rejected) {
  for (std::size_t n : {static_cast<std::size_t>(-1), static_cast<std::size_t>(-2),
                        thread_pool::kMaxThreads + 1, std::size_t(1) << 40}) {
    try {
      thread_pool pool(n);
      ADD_FAILURE() << "accepted " << n << " threads";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(n)), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong exception type for " << n << ": " << e.what();
    }
  }
  EXPECT_EQ(thread_pool(thread_pool::kMaxThreads > 64 ? 64 : thread_pool::kMaxThreads).size(),
            thread_pool::kMaxThreads > 64 ? 64u : thread_pool::kMaxThreads);
}

// Ranges near the int64 limits: [begin, end) longer than INT64_MAX, chunks ending at INT64_MAX.
// Computing end - begin or cb + grain in int64 overflows (undefined behaviour, and wrong chunks).
TEST(thread_pool, ranges_near_int64_limits) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  constexpr std::int64_t kQuarter = std::int64_t(1) << 62;
  const std::vector<chunk> whole = {{kMin, -kQuarter}, {-kQuarter, 0}, {0, kQuarter}, {kQuarter, kMax}};
  const std::vector<chunk> top = {{kMax - 5, kMax - 3}, {kMax - 3, kMax - 1}, {kMax - 1, kMax}};
  const std::vector<chunk> big_grain = {{kMax - 10, kMax}};
  EXPECT_EQ(record_chunks(nullptr, kMin, kMax, kQuarter), whole);
  EXPECT_EQ(record_chunks(nullptr, kMax - 5, kMax, 2), top);
  EXPECT_EQ(record_chunks(nullptr, kMax - 10, kMax, kMax), big_grain);
  for (std::size_t size : kPoolSizes) {
    thread_pool pool(size);
    EXPECT_EQ(record_chunks(&pool, kMin, kMax, kQuarter), whole) << "pool " << size;
    EXPECT_EQ(record_chunks(&pool, kMax - 5, kMax, 2), top) << "pool " << size;
    EXPECT_EQ(record_chunks(&pool, kMax - 10, kMax, kMax), big_grain) << "pool " << size;
  }
  // More chunks than an int64 can count: rejected, not wrapped.
  auto noop = [](std::int64_t, std::int64_t) {};
  EXPECT_THROW(attnkit::parallel_for(nullptr, kMin, kMax, 1, noop), std::invalid_argument);
  thread_pool pool(2);
  EXPECT_THROW(pool.parallel_for(kMin, kMax, 1, noop), std::invalid_argument);
  // The last batches of a job with n near INT64_MAX: a failing task stops the job early; the
  // batch end (b + batch) must not overflow on the way.
  std::atomic<std::int64_t> calls{0};
  EXPECT_THROW(pool.parallel_for(kMax, [&](std::int64_t i) {
    ++calls;
    if (i >= 0) throw std::runtime_error("stop");
  }), std::runtime_error);
  EXPECT_GE(calls.load(), 1);
}

TEST(thread_pool, exception_rethrown_after_started_calls_end) {
  for (std::size_t size : kPoolSizes) {
    thread_pool pool(size);
    std::atomic<int> in_flight{0};
    std::atomic<std::int64_t> calls{0};
    bool caught = false;
    try {
      pool.parallel_for(20000, [&](std::int64_t i) {
        ++in_flight;
        ++calls;
        if (i % 100 == 42) {
          --in_flight;
          throw std::runtime_error("boom at " + std::to_string(i));
        }
        std::this_thread::sleep_for(std::chrono::microseconds(i % 7 == 0 ? 50 : 0));
        --in_flight;
      });
    } catch (const std::runtime_error& e) {
      caught = true;
      EXPECT_EQ(std::string(e.what()).rfind("boom at ", 0), 0u) << e.what();
      EXPECT_EQ(in_flight.load(), 0) << "returned while calls were still running";
    }
    EXPECT_TRUE(caught) << "pool " << size;
    EXPECT_LT(calls.load(), 20000) << "unstarted indices were not skipped, pool " << size;
    // A single failing index must surface with its own message.
    try {
      pool.parallel_for(1000, [](std::int64_t i) {
        if (i == 777) throw std::runtime_error("index 777 failed");
      });
      ADD_FAILURE() << "no exception, pool " << size;
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "index 777 failed");
    }
    expect_each_once(pool, 1000);
    expect_each_once(pool, 100000);
  }
}

TEST(thread_pool, concurrent_callers_on_one_pool) {
  thread_pool pool(3);
  constexpr int kCallers = 4, kRounds = 40;
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const std::int64_t n = 1 + (t * 997 + r * 131) % 3000;
        std::atomic<std::int64_t> sum{0};
        std::vector<std::atomic<int>> calls(static_cast<std::size_t>(n));
        pool.parallel_for(n, [&](std::int64_t i) {
          sum += (t + 1) * i;
          ++calls[static_cast<std::size_t>(i)];
        });
        bool ok = sum.load() == (t + 1) * n * (n - 1) / 2;
        for (auto& c : calls) ok = ok && c.load() == 1;
        if (!ok) ++failures;
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(thread_pool, nested_parallel_for_does_not_deadlock) {
  for (std::size_t size : kPoolSizes) {
    thread_pool pool(size);
    constexpr std::int64_t kOuter = 24, kInner = 300;
    std::vector<std::atomic<int>> calls(kOuter * kInner);
    pool.parallel_for(kOuter, [&](std::int64_t o) {
      pool.parallel_for(0, kInner, 16, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) ++calls[static_cast<std::size_t>(o * kInner + i)];
      });
    });
    for (auto& c : calls) ASSERT_EQ(c.load(), 1) << "pool " << size;
  }
}

TEST(thread_pool, free_function_with_null_pool_runs_inline_in_order) {
  const auto caller = std::this_thread::get_id();
  std::vector<std::int64_t> seen;
  bool other_thread = false;
  attnkit::parallel_for(nullptr, 50, [&](std::int64_t i) {
    seen.push_back(i);
    other_thread |= std::this_thread::get_id() != caller;
  });
  ASSERT_EQ(seen.size(), 50u);
  for (std::int64_t i = 0; i < 50; ++i) EXPECT_EQ(seen[static_cast<std::size_t>(i)], i);
  EXPECT_FALSE(other_thread);
  int calls = 0;
  attnkit::parallel_for(nullptr, 0, [&](std::int64_t) { ++calls; });
  attnkit::parallel_for(nullptr, -3, [&](std::int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
  EXPECT_THROW(attnkit::parallel_for(nullptr, 10,
                                     [](std::int64_t i) {
                                       if (i == 3) throw std::runtime_error("inline");
                                     }),
               std::runtime_error);
  thread_pool pool(3);  // and the non-null path of the free function
  std::vector<std::atomic<int>> hits(5000);
  attnkit::parallel_for(&pool, 5000, [&](std::int64_t i) { ++hits[static_cast<std::size_t>(i)]; });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(thread_pool, destruction_of_idle_and_unused_pools) {
  for (std::size_t size : kPoolSizes) {
    { thread_pool never_used(size); }
    {
      thread_pool idle(size);
      expect_each_once(idle, 1000);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let workers go to sleep
    }
    { thread_pool just_used(size); expect_each_once(just_used, 1000); }
  }
}

TEST(thread_pool, fixed_chunk_sum_bitwise_identical_across_pool_sizes) {
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> mag(-8.f, 8.f), val(-1.f, 1.f);
  std::vector<float> x(100003);
  for (float& v : x) v = val(rng) * std::exp2(mag(rng));  // wide magnitudes: order matters
  constexpr std::int64_t kGrain = 517;
  auto chunked_sum = [&](thread_pool* pool) {
    const std::int64_t n = static_cast<std::int64_t>(x.size());
    std::vector<float> partial(static_cast<std::size_t>((n + kGrain - 1) / kGrain));
    attnkit::parallel_for(pool, 0, n, kGrain, [&](std::int64_t b, std::int64_t e) {
      float s = 0.f;
      for (std::int64_t i = b; i < e; ++i) s += x[static_cast<std::size_t>(i)];
      partial[static_cast<std::size_t>(b / kGrain)] = s;
    });
    float total = 0.f;
    for (float p : partial) total += p;
    return total;
  };
  const float ref = chunked_sum(nullptr);
  for (std::size_t size : kPoolSizes) {
    thread_pool pool(size);
    for (int rep = 0; rep < 3; ++rep) {
      const float got = chunked_sum(&pool);
      EXPECT_EQ(std::memcmp(&got, &ref, sizeof ref), 0) << "pool " << size << ": " << got << " vs " << ref;
    }
  }
}

}  // namespace
