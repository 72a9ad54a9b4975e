// attnkit benchmarks: the StaticEmbQK projection (docs/variants.md section 5).
//
// Shape: 24 layers, d_model = 896, H = Hk = 14, D = 64, B = 1, L = 2048 (every layer's Q and K:
// 43008 columns), threads 1 and 2. Families:
//   embedding_qk   attnkit::embedding_qk_projection: one GEMM e [L, 896] x w [896, 43008] on
//                  detail/gemm.hpp's fixed block grid (256 rows x 2048 columns per block)
//   per_layer      what a framework does: 24 separate GEMMs, e x [W_Q^l W_K^l] into 24 separate
//                  [L, 1792] outputs, each an Eigen product (with 2 threads, the rows of each
//                  layer's product halved over the two threads)
//   backward       attnkit::embedding_qk_projection_backward: d_e = d_qk w^T and d_w = e^T d_qk,
//                  two GEMMs with w and e read transposed (FLOP/s counts both: 4 L d_model 43008)
// Counters: FLOP/s = 2 L d_model 43008 per call, cpu_peak_frac = the same over process CPU
// time / the per-thread peak (for shared machines), peak_frac = FLOP/s / (measured FMA peak per
// thread x threads). Memory: about 1 GiB.
//
//   ./attnkit_embedding_qk_bench --benchmark_repetitions=3
//       --benchmark_min_time=0.1 --benchmark_display_aggregates_only=true
#include <algorithm>
#include <cmath>
#include <ctime>
#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced
#include <benchmark/benchmark.h>

#include "attnkit/embedding_qk.hpp"
#include "attnkit/embedding_qk_backward.hpp"
#include "common/bench_main.hpp"
#include "common/machine.hpp"

namespace attnkit_bench {
namespace {

using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using const_map = Eigen::Map<const row_matrix>;
using mut_map = Eigen::Map<row_matrix>;

void fill(float* p, std::int64_t n, std::uint64_t seed, float scale) {
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (std::int64_t i = 0; i < n; ++i) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[i] = (static_cast<float>(s >> 40) * (1.0f / 16777216.0f) * 3.4641016f - 1.7320508f) * scale;
    }
}

void BM_projection(benchmark::State& state, bool one_gemm, int threads) {
    const attnkit::embedding_qk_layout lay{24, 14, 14, 64};
    const std::int64_t L = 2048, d = 896, per = (lay.heads + lay.heads_kv) * lay.dim, W = lay.layers * per;
    tensor3 e(1, L, d);
    fill(e.data(), e.size(), 1, 1.0f);
    attnkit::thread_pool* pool = shared_pool(threads);
    // Per-layer weights as a model stores them, stacked once (not timed) for the one-GEMM path.
    std::vector<tensor2> wl;
    for (std::int64_t l = 0; l < lay.layers; ++l) {
        wl.emplace_back(d, per);
        fill(wl.back().data(), wl.back().size(), 10 + l, 1.0f / std::sqrt(static_cast<float>(d)));
    }
    tensor2 w;
    tensor3 qk;
    std::vector<tensor2> outs;
    if (one_gemm) {
        w = tensor2(d, W);
        qk = tensor3(1, L, W);
        std::vector<tensor2> wq, wk;
        for (const tensor2& x : wl) {  // split each layer's [W_Q W_K] for the stacking call
            tensor2 q(d, lay.heads * lay.dim), k(d, lay.heads_kv * lay.dim);
            for (std::int64_t r = 0; r < d; ++r)
                for (std::int64_t c = 0; c < per; ++c)
                    (c < lay.heads * lay.dim ? q(r, c) : k(r, c - lay.heads * lay.dim)) = x(r, c);
            wq.push_back(std::move(q));
            wk.push_back(std::move(k));
        }
        attnkit::stack_embedding_qk_weights(wq, wk, w);
    } else {
        for (std::int64_t l = 0; l < lay.layers; ++l) outs.emplace_back(L, per);
    }
    auto run = [&] {
        if (one_gemm) {
            attnkit::embedding_qk_projection(e, w, qk, lay, pool);
            return;
        }
        const std::int64_t part = (L + threads - 1) / threads;
        for (std::int64_t l = 0; l < lay.layers; ++l)
            attnkit::parallel_for(pool, threads, [&](std::int64_t t) {
                const std::int64_t r0 = t * part, r1 = std::min(L, r0 + part);
                if (r0 >= r1) return;
                const const_map E(e.data() + r0 * d, r1 - r0, d), Wl(wl[static_cast<std::size_t>(l)].data(), d, per);
                mut_map O(outs[static_cast<std::size_t>(l)].data() + r0 * per, r1 - r0, per);
                O.noalias() = E * Wl;
            });
    };
    run();  // warm: first touch of the outputs
    const double c0 = process_cpu_seconds();
    const auto t0 = clock_type::now();
    for (auto _ : state) {
        run();
        benchmark::ClobberMemory();
    }
    const double seconds = seconds_since(t0), cpu_seconds = process_cpu_seconds() - c0;
    const float probe = one_gemm ? qk(0, L - 1, W - 1) : outs.back()(L - 1, per - 1);
    if (!std::isfinite(probe)) state.SkipWithError("non-finite output");
    const double flops = 2.0 * static_cast<double>(L) * static_cast<double>(d) * static_cast<double>(W);
    set_flop_counters(state, flops, seconds, cpu_seconds, threads);
}

void BM_projection_backward(benchmark::State& state, int threads) {
    const attnkit::embedding_qk_layout lay{24, 14, 14, 64};
    const std::int64_t L = 2048, d = 896, W = lay.layers * (lay.heads + lay.heads_kv) * lay.dim;
    tensor3 e(1, L, d), dqk(1, L, W), de(1, L, d);
    tensor2 w(d, W), dw(d, W);
    fill(e.data(), e.size(), 1, 1.0f);
    fill(w.data(), w.size(), 2, 1.0f / std::sqrt(static_cast<float>(d)));
    fill(dqk.data(), dqk.size(), 3, 1.0f);
    attnkit::thread_pool* pool = shared_pool(threads);
    attnkit::embedding_qk_projection_backward(e, w, dqk, de, dw, lay, pool);  // warm: first touch
    const double c0 = process_cpu_seconds();
    const auto t0 = clock_type::now();
    for (auto _ : state) {
        attnkit::embedding_qk_projection_backward(e, w, dqk, de, dw, lay, pool);
        benchmark::ClobberMemory();
    }
    const double seconds = seconds_since(t0), cpu_seconds = process_cpu_seconds() - c0;
    if (!std::isfinite(de(0, L - 1, d - 1)) || !std::isfinite(dw(d - 1, W - 1))) state.SkipWithError("non-finite gradient");
    const double flops = 4.0 * static_cast<double>(L) * static_cast<double>(d) * static_cast<double>(W);
    set_flop_counters(state, flops, seconds, cpu_seconds, threads);
}

void register_projection() {
    for (int t : kThreadCounts)
        benchmark::RegisterBenchmark(("backward/layers:24/d_model:896/H:14/Hk:14/D:64/L:2048/threads:" + std::to_string(t)).c_str(),
                                     BM_projection_backward, t)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
    for (int t : kThreadCounts)
        for (bool one : {true, false})
            benchmark::RegisterBenchmark((std::string(one ? "embedding_qk" : "per_layer") +
                                          "/layers:24/d_model:896/H:14/Hk:14/D:64/L:2048/threads:" + std::to_string(t))
                                             .c_str(),
                                         BM_projection, one, t)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) {
    return attnkit_bench::bench_main(argc, argv, [] { attnkit_bench::register_projection(); });
}
