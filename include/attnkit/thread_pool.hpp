// attnkit: a small fork-join thread pool owned by the caller (DESIGN.md, "Threads").
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
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
// [begin, end) into the same chunks whatever runs them.
inline std::int64_t chunk_count(std::int64_t begin, std::int64_t end, std::int64_t grain) {
  if (end <= begin) return 0;
  if (grain <= 0)
    throw std::invalid_argument("attnkit::parallel_for: grain must be > 0, got " +
                                std::to_string(grain));
  return (end - begin - 1) / grain + 1;  // ceil without overflowing end - begin + grain
}

template <class F>
void call_chunk(F& fn, std::int64_t c, std::int64_t begin, std::int64_t end, std::int64_t grain) {
  const std::int64_t cb = begin + c * grain;
  fn(cb, end - cb > grain ? cb + grain : end);  // avoids overflow of cb + grain near INT64_MAX
}

}  // namespace detail

class thread_pool {
 public:
  explicit thread_pool(std::size_t n_threads) {
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
        : n(n_), batch(batch_), run(run_), ctx(ctx_) {}
    const std::int64_t n, batch;
    void (*const run)(void*, std::int64_t, std::int64_t, const std::atomic<bool>&);
    void* const ctx;
    std::atomic<std::int64_t> next{0};
    std::atomic<bool> failed{false};
    int active = 0;
    std::exception_ptr error;
    std::condition_variable done;
    bool exhausted() const { return failed.load(std::memory_order_relaxed) ||
                                    next.load(std::memory_order_relaxed) >= n; }
  };

  template <class Fn>
  static void run_range(void* ctx, std::int64_t b, std::int64_t e, const std::atomic<bool>& stop) {
    Fn& fn = *static_cast<Fn*>(ctx);
    // Checking per index lets a failure skip the rest of batches already handed out.
    for (std::int64_t i = b; i < e && !stop.load(std::memory_order_relaxed); ++i) fn(i);
  }

  void work(job& j) {
    for (;;) {
      const std::int64_t b = j.next.fetch_add(j.batch, std::memory_order_relaxed);
      if (b >= j.n || j.failed.load(std::memory_order_relaxed)) return;
      try {
        j.run(j.ctx, b, std::min(j.n, b + j.batch), j.failed);
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
      const std::int64_t batches = (j.n + j.batch - 1) / j.batch;
      helpers = static_cast<std::size_t>(std::min<std::int64_t>(
          batches - 1, static_cast<std::int64_t>(workers_.size())));
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
