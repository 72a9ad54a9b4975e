// attnkit benchmarks: standard softmax attention.
//
// Families (rows of the bench_report table):
//   reference     attnkit::reference::softmax_attention: naive loops in double; the baseline
//                 ratio only, on prefill L in {512, 1024}, MHA, one thread, one iteration.
//   materialised  the classic path, written here: per (batch, head) S = Q K^T (Eigen GEMM on
//                 strided maps of the BSHD buffers), mask to -inf, row softmax, O = P V. Heads
//                 are split over the case's thread pool.
//   (fast kernels: softmax_attention_fast.hpp)
// Machine probes: BM_fma_peak, BM_dram_read, BM_dram_triad (common/machine.hpp).
//
// Shapes: prefill B=1, H=8, L in {256..4096}, D in {64, 128}, causal 0/1; GQA H=32/Hk=8, D=128,
// L=2048; decode Lq=1, Lk in {4096, 16384}, D=128, H=8; all with threads 1 and 2.
//
// Options beyond Google Benchmark's own flags (flags given on the command line win):
//   ATTNKIT_BENCH_FILTER=<regex>        default for --benchmark_filter
//   ATTNKIT_BENCH_REPETITIONS=<n>       --benchmark_repetitions=n (median/mean/stddev
//                                       aggregates; console shows the aggregates only); capped
//                                       at 3 for heavy cases and 1 for the reference
//   --benchmark_min_time defaults to 0.2 (seconds per repetition) here.
// Run everything and get the Markdown table: `cmake --build <build> --target bench_report`.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <benchmark/benchmark.h>

#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/attention_harness.hpp"
#include "common/machine.hpp"
#include "softmax_attention_fast.hpp"

namespace attnkit_bench {
namespace {

// ---------------------------------------------------------------------------------------------
// The materialised baseline.
using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using const_head = Eigen::Map<const row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using mut_head = Eigen::Map<row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

void materialised_attention(const tensor4& q, const tensor4& k, const tensor4& v, tensor4& out,
                            const attnkit::softmax_options& opts) {
    const std::int64_t B = q.dimension(0), Lq = q.dimension(1), H = q.dimension(2),
                       D = q.dimension(3);
    const std::int64_t Lk = k.dimension(1), Hk = k.dimension(2), Dv = v.dimension(3);
    const std::int64_t group = H / Hk;
    const float scale = opts.scale > 0 ? opts.scale : 1.0f / std::sqrt(static_cast<float>(D));
    const std::int64_t offset = Lk - Lq;  // bottom-right causal: query i sees j <= i + offset

    attnkit::parallel_for(opts.pool, B * H, [&](std::int64_t bh) {
        const std::int64_t b = bh / H, h = bh % H, kh = h / group;
        const_head Q(q.data() + (b * Lq * H + h) * D, Lq, D, Eigen::OuterStride<>(H * D));
        const_head K(k.data() + (b * Lk * Hk + kh) * D, Lk, D, Eigen::OuterStride<>(Hk * D));
        const_head V(v.data() + (b * Lk * Hk + kh) * Dv, Lk, Dv, Eigen::OuterStride<>(Hk * Dv));
        mut_head O(out.data() + (b * Lq * H + h) * Dv, Lq, Dv, Eigen::OuterStride<>(H * Dv));

        // The score matrix: per-thread scratch, grown once and reused (a workspace, as any real
        // implementation of this path keeps).
        thread_local std::vector<float> scratch;
        const std::size_t need = static_cast<std::size_t>(Lq * Lk);
        if (scratch.size() < need) scratch.resize(need);
        Eigen::Map<row_matrix> S(scratch.data(), Lq, Lk);

        S.noalias() = Q * K.transpose();
        for (std::int64_t i = 0; i < Lq; ++i) {
            const std::int64_t n =
                opts.causal ? std::min(Lk, std::max<std::int64_t>(0, i + offset + 1)) : Lk;
            if (n < Lk) S.row(i).tail(Lk - n).setZero();  // -inf scores: exp() = 0
            if (n == 0) continue;                          // no visible key: zero output row
            const float m = S.row(i).head(n).maxCoeff();
            S.row(i).head(n).array() = ((S.row(i).head(n).array() - m) * scale).exp();
            S.row(i).head(n) *= 1.0f / S.row(i).head(n).sum();
        }
        O.noalias() = S * V;
    });
}

void reference_attention(const tensor4& q, const tensor4& k, const tensor4& v, tensor4& out,
                         const attnkit::softmax_options& opts) {
    attnkit::reference::softmax_attention(q, k, v, out, opts);
}

// ---------------------------------------------------------------------------------------------
// Machine probes.
void BM_fma_peak(benchmark::State& state, int threads) {
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

void BM_dram_read(benchmark::State& state, int threads) {
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

void BM_dram_triad(benchmark::State& state, int threads) {
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

constexpr int kThreadCounts[] = {1, 2};

void register_machine_probes() {
    const std::pair<const char*, void (*)(benchmark::State&, int)> probes[] = {
        {"BM_fma_peak", BM_fma_peak}, {"BM_dram_read", BM_dram_read}, {"BM_dram_triad", BM_dram_triad}};
    for (const auto& p : probes)
        for (int t : kThreadCounts)
            benchmark::RegisterBenchmark((std::string(p.first) + "/threads:" + std::to_string(t)).c_str(),
                                         p.second, t)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
}

std::vector<attn_case> softmax_cases() {
    std::vector<attn_case> cases;
    for (std::int64_t L : {256, 512, 1024, 2048, 4096})
        for (std::int64_t D : {64, 128})
            for (bool causal : {false, true})
                for (int t : kThreadCounts) cases.push_back(prefill_case(L, D, 8, 8, causal, t));
    for (bool causal : {false, true})
        for (int t : kThreadCounts) cases.push_back(prefill_case(2048, 128, 32, 8, causal, t));
    for (std::int64_t Lk : {4096, 16384})
        for (int t : kThreadCounts) cases.push_back(decode_case(Lk, 128, 8, 8, t));
    return cases;
}

void register_baselines() {
    family_options ref;
    ref.applies = [](const attn_case& c) {
        return !c.decode && !c.gqa() && c.threads == 1 && c.dims.Lq == c.dims.Lk &&
               (c.dims.Lq == 512 || c.dims.Lq == 1024 || c.dims.Lq == 2048);
    };
    ref.iterations = 1;
    ref.max_repetitions = 1;
    add_family("reference", reference_attention, ref);
    add_family("materialised", materialised_attention);
}

// ---------------------------------------------------------------------------------------------
// Command line: defaults from the environment for flags the user did not give.
bool has_flag(const std::vector<std::string>& args, const char* flag) {
    const std::size_t n = std::strlen(flag);
    for (const std::string& a : args)
        if (a.compare(0, n, flag) == 0 && (a.size() == n || a[n] == '=')) return true;
    return false;
}

bool flag_on(const std::vector<std::string>& args, const char* flag) {
    const std::string f = flag;
    for (const std::string& a : args)
        if (a == f || a == f + "=true" || a == f + "=1") return true;
    return false;
}

std::string fmt(const char* f, double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, x);
    return buf;
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) {
    using namespace attnkit_bench;
    std::vector<std::string> args(argv, argv + argc);
    if (!has_flag(args, "--benchmark_min_time")) args.push_back("--benchmark_min_time=0.2");
    if (const char* f = std::getenv("ATTNKIT_BENCH_FILTER"))
        if (*f && !has_flag(args, "--benchmark_filter"))
            args.push_back(std::string("--benchmark_filter=") + f);
    if (const int reps = requested_repetitions(); reps > 1) {
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
    // so that bench_report has them whatever the filter selected.
    if (!flag_on(args, "--benchmark_list_tests")) {
        const fma_peak_info& p = fma_peak();
        benchmark::AddCustomContext("attnkit_simd", simd::name);
        benchmark::AddCustomContext("attnkit_fma_peak_gflops_per_thread", fmt("%.2f", p.per_thread * 1e-9));
        benchmark::AddCustomContext("attnkit_fma_peak_gflops_range",
                                    fmt("%.2f", p.min * 1e-9) + ".." + fmt("%.2f", p.max * 1e-9) +
                                        " over " + std::to_string(p.runs) + " runs");
        for (int t : kThreadCounts)
            benchmark::AddCustomContext("attnkit_dram_read_gbs_threads_" + std::to_string(t),
                                        fmt("%.2f", dram_read_bandwidth(t) * 1e-9));
        benchmark::AddCustomContext("attnkit_llc_bytes", std::to_string(llc_bytes()));
        release_stream_buffer();
    }

    register_machine_probes();
    register_baselines();
    register_fast_kernels();  // softmax_attention_fast.hpp
    register_attention_benchmarks(softmax_cases());

    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
