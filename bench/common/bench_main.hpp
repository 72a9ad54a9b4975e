// attnkit benchmarks: the main() every benchmark program shares.
//
//     int main(int argc, char** argv) {
//         return attnkit_bench::bench_main(argc, argv, [] { /* RegisterBenchmark(...) */ });
//     }
//
// It measures the machine once before anything runs (FMA peak per thread, DRAM read bandwidth
// with 1 and 2 threads) and writes the numbers into the JSON context, so that every program's
// report can state fractions of what the same run measured; registers the machine probes
// (BM_fma_peak, BM_dram_read, BM_dram_triad, threads 1 and 2); then calls `register_all`.
//
// Options beyond Google Benchmark's own flags (flags given on the command line win):
//   ATTNKIT_BENCH_FILTER=<regex>        default for --benchmark_filter
//   ATTNKIT_BENCH_REPETITIONS=<n>       --benchmark_repetitions=n (median/mean/stddev
//                                       aggregates; the console shows the aggregates only)
//   ATTNKIT_BENCH_QUICK=1               programs may shrink their shape sweeps (see each one)
//   --benchmark_min_time defaults to 0.2 (seconds per repetition).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <time.h>

#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced
#include <benchmark/benchmark.h>

#include "common/machine.hpp"

namespace attnkit_bench {

constexpr int kThreadCounts[] = {1, 2};

// ATTNKIT_BENCH_REPETITIONS from the environment (0 when unset or invalid).
inline int bench_repetitions_env() {
    const char* e = std::getenv("ATTNKIT_BENCH_REPETITIONS");
    if (!e || !*e) return 0;
    const long n = std::strtol(e, nullptr, 10);
    return n > 0 && n < 1000 ? static_cast<int>(n) : 0;
}

// ATTNKIT_BENCH_QUICK=1: a smaller sweep for a fast look (each program says what it drops).
inline bool bench_quick() {
    const char* e = std::getenv("ATTNKIT_BENCH_QUICK");
    return e && *e && std::strcmp(e, "0") != 0;
}

// CPU seconds of the whole process (every thread), for cpu_peak_frac.
inline double process_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// FLOP/s, peak_frac (over the wall time and the in-run FMA peak of `threads` threads) and
// cpu_peak_frac (the same work over the CPU time the process got, against the one-thread peak:
// on a shared machine, what the cores did while they ran this benchmark) of a compute-bound
// case that did `flops` useful FLOPs per iteration.
inline void set_flop_counters(benchmark::State& state, double flops, double seconds, double cpu_seconds, int threads) {
    state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
    const double iters = static_cast<double>(state.iterations());
    state.counters["peak_frac"] = flops * iters / seconds / machine_peak_flops(threads);
    state.counters["cpu_peak_frac"] = flops * iters / (cpu_seconds > 1e-9 ? cpu_seconds : 1e-9) / machine_peak_flops(1);
}

namespace detail_main {

inline void BM_fma_peak(benchmark::State& state, int threads) {
    const std::int64_t steps = std::int64_t(1) << 18;  // ~0.5 ms of one AVX2 core
    float sink = 0;
    double flops = 0;
    const auto t0 = clock_type::now();
    for (auto _ : state) flops = fma_peak_run(steps, threads, &sink);
    const double seconds = seconds_since(t0);
    benchmark::DoNotOptimize(sink);
    const double iters = static_cast<double>(state.iterations());
    state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["peak_frac"] = flops * iters / seconds / machine_peak_flops(threads);
}

inline void BM_dram_read(benchmark::State& state, int threads) {
    float sink = 0;
    double bytes = 0;
    stream_buffer();  // allocate and touch outside the timed loop
    const auto t0 = clock_type::now();
    for (auto _ : state) bytes = dram_read_run(threads, &sink);
    const double seconds = seconds_since(t0);
    benchmark::DoNotOptimize(sink);
    const double iters = static_cast<double>(state.iterations());
    state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["bw_frac"] = bytes * iters / seconds / dram_read_bandwidth(threads);
}

inline void BM_dram_triad(benchmark::State& state, int threads) {
    double bytes = 0;
    stream_buffer();
    float s = 0.5f;
    const auto t0 = clock_type::now();
    for (auto _ : state) {
        bytes = dram_triad_run(threads, s);
        benchmark::ClobberMemory();
    }
    const double seconds = seconds_since(t0);
    const double iters = static_cast<double>(state.iterations());
    state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    // Fraction of the read-stream bandwidth with as many threads (triad also writes).
    state.counters["bw_frac"] = bytes * iters / seconds / dram_read_bandwidth(threads);
}

inline bool has_flag(const std::vector<std::string>& args, const char* flag) {
    const std::size_t n = std::strlen(flag);
    for (const std::string& a : args)
        if (a.compare(0, n, flag) == 0 && (a.size() == n || a[n] == '=')) return true;
    return false;
}

inline bool flag_on(const std::vector<std::string>& args, const char* flag) {
    const std::string f = flag;
    for (const std::string& a : args)
        if (a == f || a == f + "=true" || a == f + "=1") return true;
    return false;
}

inline std::string fmt(const char* f, double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, x);
    return buf;
}

}  // namespace detail_main

inline void register_machine_probes() {
    using namespace detail_main;
    const std::pair<const char*, void (*)(benchmark::State&, int)> probes[] = {
        {"BM_fma_peak", BM_fma_peak}, {"BM_dram_read", BM_dram_read}, {"BM_dram_triad", BM_dram_triad}};
    for (const auto& p : probes)
        for (int t : kThreadCounts)
            benchmark::RegisterBenchmark((std::string(p.first) + "/threads:" + std::to_string(t)).c_str(),
                                         p.second, t)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
}

template <class Register>
int bench_main(int argc, char** argv, Register&& register_all) {
    using namespace detail_main;
    std::vector<std::string> args(argv, argv + argc);
    if (!has_flag(args, "--benchmark_min_time")) args.push_back("--benchmark_min_time=0.2");
    if (const char* f = std::getenv("ATTNKIT_BENCH_FILTER"))
        if (*f && !has_flag(args, "--benchmark_filter")) args.push_back(std::string("--benchmark_filter=") + f);
    if (const int reps = bench_repetitions_env(); reps > 1) {
        if (!has_flag(args, "--benchmark_repetitions"))
            args.push_back("--benchmark_repetitions=" + std::to_string(reps));
        if (!has_flag(args, "--benchmark_display_aggregates_only") &&
            !has_flag(args, "--benchmark_report_aggregates_only"))
            args.push_back("--benchmark_display_aggregates_only=true");
    }
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    int cargc = static_cast<int>(args.size());
    benchmark::Initialize(&cargc, cargs.data());
    if (benchmark::ReportUnrecognizedArguments(cargc, cargs.data())) return 1;
    Eigen::initParallel();

    // The machine's peak and bandwidth, once, before anything runs; also into the JSON context
    // so that the report has them whatever the filter selected.
    if (!flag_on(args, "--benchmark_list_tests")) {
        const fma_peak_info& p = fma_peak();
        benchmark::AddCustomContext("attnkit_simd", simd::name);
        benchmark::AddCustomContext("attnkit_fma_peak_gflops_per_thread", fmt("%.2f", p.per_thread * 1e-9));
        benchmark::AddCustomContext("attnkit_fma_peak_gflops_range",
                                    fmt("%.2f", p.min * 1e-9) + ".." + fmt("%.2f", p.max * 1e-9) + " over " +
                                        std::to_string(p.runs) + " runs");
        for (int t : kThreadCounts)
            benchmark::AddCustomContext("attnkit_dram_read_gbs_threads_" + std::to_string(t),
                                        fmt("%.2f", dram_read_bandwidth(t) * 1e-9));
        benchmark::AddCustomContext("attnkit_llc_bytes", std::to_string(llc_bytes()));
        release_stream_buffer();
    }

    register_machine_probes();
    register_all();

    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}

}  // namespace attnkit_bench
