// attnkit benchmarks: the gated MLP ("MLP", no token mixing; docs/variants.md section 6).
//
// Families (rows of the bench_report table), N = 2048 tokens, d_model in {512, 896},
// m = gated_mlp_width(d_model), threads 1 and 2:
//   gated_mlp   attnkit::gated_mlp: fused row blocks (gate and up products, SiLU * up in SIMD,
//               down product per block of 256 rows; detail/gemm.hpp)
//   unfused     the textbook path, written here: three Eigen GEMMs with the full [N, m]
//               intermediates G = X W_gate, U = X W_up, H = SiLU(G) * U (Eigen array
//               expression), out = H W_down. With 2 threads the N rows are halved, each half
//               one set of full-size Eigen products on its own thread.
//   reference   attnkit::reference::gated_mlp (double loops) at N = 32, one thread, one
//               iteration: the baseline ratio only.
//   backward    attnkit::gated_mlp_backward (d_x and the three weight gradients from d_out):
//               FLOP/s counts the eight products it runs, 16 N d_model m (the six of the
//               gradients and the two of the forward it recomputes, as no activations are
//               saved); bwd_useful_frac = peak_frac x 6/8, the same time over the gradients'
//               own 12 N d_model m.
// Counters: FLOP/s = 6 N d_model m per call (the three products; SiLU not counted),
// cpu_peak_frac = the same FLOPs over the process CPU time / the per-thread peak (meaningful
// when other processes share the cores),
// peak_frac = FLOP/s / (measured FMA peak per thread x threads), from common/bench_main.hpp.
//
//   ./attnkit_gated_mlp_bench --benchmark_repetitions=3
//       --benchmark_min_time=0.1 --benchmark_display_aggregates_only=true
#include <algorithm>
#include <cmath>
#include <ctime>
#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced
#include <benchmark/benchmark.h>

#include "attnkit/gated_mlp.hpp"
#include "attnkit/gated_mlp_backward.hpp"
#include "attnkit/reference/gated_mlp.hpp"
#include "common/bench_main.hpp"
#include "common/machine.hpp"

namespace attnkit_bench {
namespace {

using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using const_map = Eigen::Map<const row_matrix>;
using mut_map = Eigen::Map<row_matrix>;

struct mlp_inputs {
    tensor2 x, wg, wu, wd;
};

// Deterministic N(0, 1)-like data scaled as a trained layer's (unit-variance activations).
void fill(tensor2& t, std::uint64_t seed, float scale) {
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (std::int64_t i = 0; i < t.size(); ++i) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const float u = static_cast<float>(s >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        t.data()[i] = (u * 3.4641016f - 1.7320508f) * scale;                 // unit variance
    }
}

mlp_inputs make_inputs(std::int64_t n, std::int64_t d) {
    const std::int64_t m = attnkit::gated_mlp_width(d);
    mlp_inputs in{tensor2(n, d), tensor2(d, m), tensor2(d, m), tensor2(m, d)};
    fill(in.x, 1, 1.0f);
    fill(in.wg, 2, 1.0f / std::sqrt(static_cast<float>(d)));
    fill(in.wu, 3, 1.0f / std::sqrt(static_cast<float>(d)));
    fill(in.wd, 4, 1.0f / std::sqrt(static_cast<float>(m)));
    return in;
}

// The unfused path on rows [r0, r1): full-size intermediates, one Eigen product each.
void unfused_rows(const mlp_inputs& in, tensor2& out, std::int64_t r0, std::int64_t r1, row_matrix& g, row_matrix& u) {
    const std::int64_t d = in.x.dimension(1), m = in.wg.dimension(1), n = r1 - r0;
    const const_map X(in.x.data() + r0 * d, n, d), Wg(in.wg.data(), d, m), Wu(in.wu.data(), d, m),
        Wd(in.wd.data(), m, d);
    mut_map O(out.data() + r0 * d, n, d);
    g.resize(n, m);
    u.resize(n, m);
    g.noalias() = X * Wg;
    u.noalias() = X * Wu;
    g.array() = g.array() / (1.0f + (-g.array()).exp()) * u.array();
    O.noalias() = g * Wd;
}

void BM_mlp(benchmark::State& state, std::string family, std::int64_t n, std::int64_t d, int threads) {
    const std::int64_t m = attnkit::gated_mlp_width(d);
    const mlp_inputs in = make_inputs(n, d);
    tensor2 out(n, d);
    out.setConstant(std::nanf(""));
    attnkit::gated_mlp_options o;
    o.pool = shared_pool(threads);
    std::vector<row_matrix> g(static_cast<std::size_t>(threads)), u(static_cast<std::size_t>(threads));
    auto run = [&] {
        if (family == "gated_mlp") {
            attnkit::gated_mlp(in.x, in.wg, in.wu, in.wd, out, o);
        } else if (family == "unfused") {
            const std::int64_t part = (n + threads - 1) / threads;
            attnkit::parallel_for(o.pool, threads, [&](std::int64_t t) {
                const std::int64_t r0 = t * part, r1 = std::min(n, r0 + part);
                if (r0 < r1) unfused_rows(in, out, r0, r1, g[static_cast<std::size_t>(t)], u[static_cast<std::size_t>(t)]);
            });
        } else {
            attnkit::reference::gated_mlp(in.x, in.wg, in.wu, in.wd, out);
        }
    };
    const double c0 = process_cpu_seconds();
    const auto t0 = clock_type::now();
    for (auto _ : state) {
        run();
        benchmark::ClobberMemory();
    }
    const double seconds = seconds_since(t0), cpu_seconds = process_cpu_seconds() - c0;
    for (std::int64_t i = 0; i < out.size(); ++i)
        if (!std::isfinite(out.data()[i])) {
            state.SkipWithError("non-finite output");
            return;
        }
    const double flops = 6.0 * static_cast<double>(n) * static_cast<double>(d) * static_cast<double>(m);
    set_flop_counters(state, flops, seconds, cpu_seconds, threads);
}

void BM_mlp_backward(benchmark::State& state, std::int64_t n, std::int64_t d, int threads) {
    const std::int64_t m = attnkit::gated_mlp_width(d);
    const mlp_inputs in = make_inputs(n, d);
    tensor2 dout(n, d), dx(n, d), dwg(d, m), dwu(d, m), dwd(m, d);
    fill(dout, 99, 1.0f);
    attnkit::gated_mlp_options o;
    o.pool = shared_pool(threads);
    attnkit::gated_mlp_backward(in.x, in.wg, in.wu, in.wd, dout, dx, dwg, dwu, dwd, o);  // warm: first touch
    const double c0 = process_cpu_seconds();
    const auto t0 = clock_type::now();
    for (auto _ : state) {
        attnkit::gated_mlp_backward(in.x, in.wg, in.wu, in.wd, dout, dx, dwg, dwu, dwd, o);
        benchmark::ClobberMemory();
    }
    const double seconds = seconds_since(t0), cpu_seconds = process_cpu_seconds() - c0;
    for (const tensor2* t : {&dx, &dwg, &dwu, &dwd})
        for (std::int64_t i = 0; i < t->size(); ++i)
            if (!std::isfinite(t->data()[i])) {
                state.SkipWithError("non-finite gradient");
                return;
            }
    const double flops = 16.0 * static_cast<double>(n) * static_cast<double>(d) * static_cast<double>(m);
    set_flop_counters(state, flops, seconds, cpu_seconds, threads);
    state.counters["bwd_useful_frac"] = state.counters["peak_frac"] * 0.75;
}

void register_mlp() {
    const std::int64_t kN = 2048;
    for (std::int64_t d : {512, 896}) {
        const std::string shape = "/N:" + std::to_string(kN) + "/d_model:" + std::to_string(d) +
                                  "/m:" + std::to_string(attnkit::gated_mlp_width(d));
        for (int t : kThreadCounts)
            for (const char* fam : {"gated_mlp", "unfused"})
                benchmark::RegisterBenchmark((std::string(fam) + shape + "/threads:" + std::to_string(t)).c_str(),
                                             BM_mlp, std::string(fam), kN, d, t)
                    ->UseRealTime()
                    ->Unit(benchmark::kMillisecond);
        for (int t : kThreadCounts)
            benchmark::RegisterBenchmark(("backward" + shape + "/threads:" + std::to_string(t)).c_str(), BM_mlp_backward,
                                         kN, d, t)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        benchmark::RegisterBenchmark(("reference/N:32/d_model:" + std::to_string(d) + "/m:" +
                                      std::to_string(attnkit::gated_mlp_width(d)) + "/threads:1")
                                         .c_str(),
                                     BM_mlp, std::string("reference"), 32, d, 1)
            ->UseRealTime()
            ->Iterations(1)
            ->Unit(benchmark::kMillisecond);
    }
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) {
    return attnkit_bench::bench_main(argc, argv, [] { attnkit_bench::register_mlp(); });
}
