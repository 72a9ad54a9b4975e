// attnkit: a small fork-join thread pool owned by the caller (docs/design.md, "Threads").
//
//   attnkit::thread_pool pool(2);           // 2 threads in all: this one and one worker
//   attnkit::softmax_options opts;
//   opts.pool = &pool;                       // every entry point takes it through its options
//   attnkit::parallel_for(&pool, n, [&](std::int64_t i) { ... });   // or directly
//
// Without a pool (nullptr) every call runs on the calling thread. Results never depend on the
// thread count: work is split by the shapes alone.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace attnkit {

namespace detail {

// Shared by the pool and the inline path so that both reject the same arguments and split
// [begin, end) into the same chunks whatever runs them. Any int64 range works, including
// [INT64_MIN, INT64_MAX): lengths and chunk starts are computed in uint64 (exact, since
// end - begin < 2^64), never as int64 sums that could overflow.
inline std::int64_t chunk_count(std::int64_t begin, std::int64_t end, std::int64_t grain) {
  if (end <= begin) return 0;
  if (grain <= 0)
    throw std::invalid_argument("attnkit::parallel_for: grain must be > 0, got " +
                                std::to_string(grain));
  const std::uint64_t len = static_cast<std::uint64_t>(end) - static_cast<std::uint64_t>(begin);
  const std::uint64_t chunks = (len - 1) / static_cast<std::uint64_t>(grain) + 1;
  if (chunks > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    throw std::invalid_argument("attnkit::parallel_for: [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") in chunks of " + std::to_string(grain) +
                                " has more than INT64_MAX chunks");
  return static_cast<std::int64_t>(chunks);
}

template <class F>
void call_chunk(F& fn, std::int64_t c, std::int64_t begin, std::int64_t end, std::int64_t grain) {
  // cb = begin + c * grain < end, in uint64 and back (two's complement, exact in range).
  const std::uint64_t off = static_cast<std::uint64_t>(c) * static_cast<std::uint64_t>(grain);
  const std::uint64_t left = static_cast<std::uint64_t>(end) - static_cast<std::uint64_t>(begin) - off;
  const std::int64_t cb = static_cast<std::int64_t>(static_cast<std::uint64_t>(begin) + off);
  fn(cb, left > static_cast<std::uint64_t>(grain)
             ? static_cast<std::int64_t>(static_cast<std::uint64_t>(cb) + static_cast<std::uint64_t>(grain))
             : end);
}

}  // namespace detail

// thread_pool pool(n): n threads in all, the caller's included (n - 1 workers; the calling
// thread always works on its own parallel_for). n = 0 means std::thread::hardware_concurrency()
// (1 if unknown). n above kMaxThreads is rejected with std::invalid_argument: the count is a
// size_t, so thread_pool(-1) arrives as SIZE_MAX and is a mistake, not a request.
class thread_pool {
 public:
  static constexpr std::size_t kMaxThreads = 4096;

  explicit thread_pool(std::size_t n_threads) {
    if (n_threads > kMaxThreads)
      throw std::invalid_argument(
          "attnkit::thread_pool: expected 0 (hardware concurrency) to " + std::to_string(kMaxThreads) +
          " threads, got " + std::to_string(n_threads) +
          (n_threads > (std::numeric_limits<std::size_t>::max() >> 1) ? " (a negative count converted to size_t?)"
                                                                       : ""));
    if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
    size_ = n_threads;
    try {
      workers_.reserve(n_threads - 1);
      for (std::size_t t = 1; t < n_threads; ++t) workers_.emplace_back([this] { worker_loop(); });
    } catch (...) {
      shutdown();  // threads already started would otherwise hit std::terminate in ~thread
      throw;
    }
  }
  ~thread_pool() { shutdown(); }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  std::size_t size() const noexcept { return size_; }

  template <class F>
  void parallel_for(std::int64_t n, F&& fn) {
    if (n <= 0) return;
    if (workers_.empty() || n == 1) {  // nothing to share: skip the queue and its locking
      for (std::int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    using fn_t = std::remove_reference_t<F>;
    // Small batches amortise the atomic increment while leaving enough pieces for balancing.
    const std::int64_t per = static_cast<std::int64_t>(size_) * 16;
    job j(n, std::max<std::int64_t>(1, n / per), &run_range<fn_t>,
          const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
    submit(j);
    work(j);  // the caller always works on its own job, so it finishes even with busy workers
    finish(j);
  }

  template <class F>
  void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, F&& fn) {
    const std::int64_t chunks = detail::chunk_count(begin, end, grain);
    parallel_for(chunks, [&](std::int64_t c) { detail::call_chunk(fn, c, begin, end, grain); });
  }

 private:
  // Lives on the caller's stack; `active` (guarded by mu_) keeps it alive while workers use it.
  struct job {
    job(std::int64_t n_, std::int64_t batch_, void (*run_)(void*, std::int64_t, std::int64_t,
                                                           const std::atomic<bool>&),
        void* ctx_)
        : n(n_), batch(batch_), batches((n_ - 1) / batch_ + 1), run(run_), ctx(ctx_) {}
    // Work is handed out by batch index, so no counter ever runs past n (n may be INT64_MAX).
    const std::int64_t n, batch, batches;
    void (*const run)(void*, std::int64_t, std::int64_t, const std::atomic<bool>&);
    void* const ctx;
    std::atomic<std::int64_t> next{0};  // next batch index
    std::atomic<bool> failed{false};
    int active = 0;
    std::exception_ptr error;
    std::condition_variable done;
    bool exhausted() const { return failed.load(std::memory_order_relaxed) ||
                                    next.load(std::memory_order_relaxed) >= batches; }
  };

  template <class Fn>
  static void run_range(void* ctx, std::int64_t b, std::int64_t e, const std::atomic<bool>& stop) {
    Fn& fn = *static_cast<Fn*>(ctx);
    // Checking per index lets a failure skip the rest of batches already handed out.
    for (std::int64_t i = b; i < e && !stop.load(std::memory_order_relaxed); ++i) fn(i);
  }

  void work(job& j) {
    for (;;) {
      const std::int64_t k = j.next.fetch_add(1, std::memory_order_relaxed);
      if (k >= j.batches || j.failed.load(std::memory_order_relaxed)) return;
      const std::int64_t b = k * j.batch;  // < n
      try {
        j.run(j.ctx, b, b + std::min(j.n - b, j.batch), j.failed);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!j.error) j.error = std::current_exception();
        j.failed.store(true, std::memory_order_relaxed);
        return;
      }
    }
  }

  void submit(job& j) {
    std::size_t helpers;
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(&j);
      helpers = static_cast<std::size_t>(std::min<std::int64_t>(
          j.batches - 1, static_cast<std::int64_t>(workers_.size())));
    }
    // Wake only as many workers as there are spare batches; the rest keep sleeping.
    if (helpers == workers_.size()) wake_.notify_all();
    else for (std::size_t k = 0; k < helpers; ++k) wake_.notify_one();
  }

  void finish(job& j) {
    std::unique_lock<std::mutex> lk(mu_);
    unqueue(&j);  // no worker can join once it is out of the queue
    j.done.wait(lk, [&] { return j.active == 0; });
    if (j.error) std::rethrow_exception(j.error);
  }

  void unqueue(job* j) {
    auto it = std::find(queue_.begin(), queue_.end(), j);
    if (it != queue_.end()) queue_.erase(it);
  }

  // Drops finished jobs and joins the one with the fewest helpers, so concurrent callers share
  // the workers and a blocked nested caller gets help first. Called with mu_ held.
  job* pick_job() {
    job* best = nullptr;
    for (std::size_t k = 0; k < queue_.size();) {
      job* j = queue_[k];
      if (j->exhausted()) { queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(k)); continue; }
      if (!best || j->active < best->active) best = j;
      ++k;
    }
    return best;
  }

  void worker_loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      job* j = nullptr;
      wake_.wait(lk, [&] { return stop_ || (j = pick_job()) != nullptr; });
      if (stop_) return;
      ++j->active;
      lk.unlock();
      work(*j);
      lk.lock();
      // Notifying under the lock: the caller may destroy j as soon as it can observe active==0.
      if (--j->active == 0) j->done.notify_one();
    }
  }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  std::size_t size_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<job*> queue_;
  bool stop_ = false;
};

template <class F>
void parallel_for(thread_pool* pool, std::int64_t n, F&& fn) {
  if (pool) return pool->parallel_for(n, fn);
  for (std::int64_t i = 0; i < n; ++i) fn(i);
}

template <class F>
void parallel_for(thread_pool* pool, std::int64_t begin, std::int64_t end, std::int64_t grain,
                  F&& fn) {
  if (pool) return pool->parallel_for(begin, end, grain, fn);
  const std::int64_t chunks = detail::chunk_count(begin, end, grain);
  for (std::int64_t c = 0; c < chunks; ++c) detail::call_chunk(fn, c, begin, end, grain);
}

}  // namespace attnkit
