// Heap accounting for the benchmarks that report the extra memory of a call ("extra_MiB"): the
// replaced global operator new / delete keep the live bytes and their peak. Include it from
// exactly one translation unit of a benchmark program (each program is one).
//
//   attnkit_bench::time_counting_heap(state, call, flops_per_call, threads);
//       one warm-up call on a new thread, whose heap peak beyond what was live is reported as
//       extra_MiB (the scratch the call keeps included), then
//       call() timed over the benchmark's iterations with the FLOP counters of bench_main.hpp
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <thread>

#include "common/bench_main.hpp"
#include "common/machine.hpp"

namespace attnkit_bench {
namespace heap_detail {
inline std::atomic<std::int64_t> g_live{0}, g_peak{0};
constexpr std::size_t kHeader = 16;  // keeps the user pointer 16-byte aligned

inline void* counted_alloc(std::size_t n) {
    void* p = std::malloc(n + kHeader);
    if (!p) throw std::bad_alloc();
    *static_cast<std::size_t*>(p) = n;
    const std::int64_t live = g_live.fetch_add(static_cast<std::int64_t>(n)) + static_cast<std::int64_t>(n);
    std::int64_t peak = g_peak.load();
    while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
    }
    return static_cast<char*>(p) + kHeader;
}
inline void counted_free(void* q) noexcept {
    if (!q) return;
    void* p = static_cast<char*>(q) - kHeader;
    g_live.fetch_sub(static_cast<std::int64_t>(*static_cast<std::size_t*>(p)));
    std::free(p);
}
}  // namespace heap_detail

inline std::int64_t heap_live() { return heap_detail::g_live.load(); }
inline std::int64_t heap_peak() { return heap_detail::g_peak.load(); }
// From now on the peak counts from what is live now.
inline void heap_reset_peak() { heap_detail::g_peak.store(heap_detail::g_live.load()); }

// The warm-up call runs on a thread of its own: the kernels keep their scratch per thread across
// calls (include/attnkit/detail/scratch.hpp), so on the benchmark's thread a call after a larger
// one would allocate nothing and report no extra memory. A new thread starts with none, and
// frees what it kept when it ends, inside the measured window.
template <class Call>
void time_counting_heap(benchmark::State& state, Call&& call, double flops, int threads) {
    const std::int64_t before = heap_live();
    heap_reset_peak();
    std::thread([&] { call(); }).join();  // warm-up, and the extra heap of one call
    const double extra = static_cast<double>(heap_peak() - before);
    const double cpu0 = process_cpu_seconds();
    const auto t0 = clock_type::now();
    for (auto _ : state) call();
    const double seconds = seconds_since(t0), cpu = process_cpu_seconds() - cpu0;
    set_flop_counters(state, flops, seconds, cpu, threads);
    state.counters["extra_MiB"] = extra / (1024.0 * 1024.0);
}
}  // namespace attnkit_bench

void* operator new(std::size_t n) { return attnkit_bench::heap_detail::counted_alloc(n); }
void* operator new[](std::size_t n) { return attnkit_bench::heap_detail::counted_alloc(n); }
void operator delete(void* p) noexcept { attnkit_bench::heap_detail::counted_free(p); }
void operator delete[](void* p) noexcept { attnkit_bench::heap_detail::counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { attnkit_bench::heap_detail::counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { attnkit_bench::heap_detail::counted_free(p); }
