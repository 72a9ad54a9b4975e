// Ring attention's scaling on this machine: causal prefill of B = 1, H = Hk = 8, D = 128, one
// thread per rank, on 1 rank (rank 0 alone, MPI_COMM_SELF: the single-process rate) and on every
// rank of the run, in the same run. Run it under MPI, as docs/distributed.md shows:
//
//   mpirun -np 2 build/bench-all/bench/attnkit_distributed_bench --benchmark_repetitions=3
//
// Counters (medians over repetitions; time is the slowest rank's): tokens_per_s (L / time),
// tflops (causal attention FLOPs, 2 L^2 D H, over time), wait_frac (the largest share of a
// rank's time blocked on transfers that its local work did not hide), ranks.
// ATTNKIT_BENCH_QUICK=1: L = 8192 instead of 32768.
#include <mpi.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attnkit/distributed.hpp"

namespace {

using attnkit::index_t;

constexpr index_t kHeads = 8, kDim = 128;

int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}
int world_size() {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

void fill(std::vector<float>& x, unsigned seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& e : x) e = u(g);
}

// alone: rank 0 runs the whole sequence on MPI_COMM_SELF while the other ranks wait.
void ring_prefill(benchmark::State& st, index_t L, bool alone) {
    const int P = alone ? 1 : world_size(), me = world_rank();
    const bool active = !alone || me == 0;
    const MPI_Comm comm = alone ? MPI_COMM_SELF : MPI_COMM_WORLD;
    const index_t n = active ? attnkit::distributed::rank_length(attnkit::distributed::sequence_layout::zigzag, L, P,
                                                                  alone ? 0 : me)
                             : 0;
    std::vector<float> q(static_cast<std::size_t>(n * kHeads * kDim)), k(q.size()), v(q.size()), out(q.size()),
        lse(static_cast<std::size_t>(n * kHeads));
    fill(q, 1u + static_cast<unsigned>(me));
    fill(k, 11u + static_cast<unsigned>(me));
    fill(v, 21u + static_cast<unsigned>(me));
    const attnkit::view<const float, 4> qv(q.data(), {1, n, kHeads, kDim}), kv(k.data(), {1, n, kHeads, kDim}),
        vv(v.data(), {1, n, kHeads, kDim});
    const attnkit::view<float, 4> ov(out.data(), {1, n, kHeads, kDim});
    const attnkit::view<float, 3> lv(lse.data(), {1, n, kHeads});
    attnkit::distributed::ring_stats stats;
    attnkit::distributed::ring_options ro;
    ro.attention.causal = true;
    ro.stats = &stats;

    double wait_frac = 0.0;
    for (auto _ : st) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        if (active) attnkit::distributed::ring_attention(qv, kv, vv, ov, lv, ro, comm);
        const double mine = MPI_Wtime() - t0;
        double slowest = 0.0, frac = active ? stats.wait_seconds / std::max(mine, 1e-12) : 0.0, worst = 0.0;
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&frac, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        st.SetIterationTime(slowest);
        wait_frac = worst;
        benchmark::DoNotOptimize(out.data());
    }
    const double flops = 2.0 * static_cast<double>(L) * static_cast<double>(L) * kDim * kHeads;
    st.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(L), benchmark::Counter::kIsIterationInvariantRate);
    st.counters["tflops"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
    st.counters["wait_frac"] = wait_frac;
    st.counters["ranks"] = P;
}

// Only rank 0 reports; the others run the same benchmarks (every call is collective) silently.
class silent_reporter : public benchmark::BenchmarkReporter {
   public:
    bool ReportContext(const Context&) override { return true; }
    void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    bool file_out = false;  // --benchmark_out: written by rank 0 only
    for (int i = 1; i < argc; ++i) file_out = file_out || std::strncmp(argv[i], "--benchmark_out=", 16) == 0;
    benchmark::Initialize(&argc, argv);
    const char* quick = std::getenv("ATTNKIT_BENCH_QUICK");
    const index_t L = quick && *quick && std::strcmp(quick, "0") != 0 ? 8192 : 32768;
    for (const bool alone : {true, false}) {
        const std::string name = std::string("BM_ring_prefill_causal/L:") + std::to_string(L) +
                                 (alone ? "/ranks:1" : "/ranks:" + std::to_string(world_size()));
        // Fixed iterations: an adaptive count could differ between ranks, and every call is collective.
        benchmark::RegisterBenchmark(name.c_str(), [L, alone](benchmark::State& st) { ring_prefill(st, L, alone); })
            ->Iterations(1)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
    }
    if (world_rank() == 0) {
        benchmark::RunSpecifiedBenchmarks();
    } else {
        silent_reporter quiet, quiet_file;
        if (file_out)
            benchmark::RunSpecifiedBenchmarks(&quiet, &quiet_file);
        else
            benchmark::RunSpecifiedBenchmarks(&quiet);
    }
    MPI_Finalize();
    return 0;
}
