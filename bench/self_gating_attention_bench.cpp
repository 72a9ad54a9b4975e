// attnkit benchmarks: self-gating ("Non-approximate") attention, a memory-bound kernel.
//
// Families (names "<family>/L:../D:../H:../causal:../threads:N"):
//   self_gating   attnkit::self_gating_attention, L in {4096, 16384, 32768}, causal 0/1
//   reference     attnkit::reference::self_gating_attention (materialises L x L, double), L = 512
//                 only, one thread, one iteration; the fast kernel also runs at L = 512
//   self_gating_state  one decode step (T = 1) of attnkit::self_gating_state, tokens/s
//   softmax       attnkit::softmax_attention, causal, L in {4096, 16384, 32768}; one iteration
//                 at 16384 and 32768 (~29 s with one thread), which ATTNKIT_BENCH_QUICK=1 drops
// Shapes: B = 1, H = Hk = 8, D = Dv = 128 (and 64 at the suite's lengths 2048, 8192); threads
// 1 and 2.
// Counters: GB/s = bytes of q, k, v and out (each once) per second; bw_frac = that over the DRAM
// read bandwidth measured in the same run with as many threads (common/bench_main.hpp);
// FLOP/s and peak_frac with the work of each family (self-gating: (2 D + 2 Dv) per token and
// head; softmax and the reference: 4 D per visible pair and head, common/flops.hpp).
// After the timed loop the output is checked (finite everywhere; a few rows of two heads against
// a double recomputation), otherwise SkipWithError.
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced

#include "attnkit/reference/self_gating_attention.hpp"
#include "attnkit/self_gating_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "common/bench_main.hpp"
#include "common/machine.hpp"

namespace attnkit_bench {
namespace {

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
constexpr std::int64_t kH = 8, kD = 128;  // kD: every row but the suite's twins (D = 64)

struct inputs {
    tensor4 q, k, v;
};

// Deterministic inputs per length and head dim (xorshift + sum of uniforms, ~N(0, 1)), cached.
const inputs& inputs_for(std::int64_t L, std::int64_t D) {
    static std::map<std::pair<std::int64_t, std::int64_t>, std::unique_ptr<inputs>> cache;
    auto& p = cache[{L, D}];
    if (!p) {
        p = std::make_unique<inputs>();
        std::uint64_t s = 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(L);
        auto next = [&] {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            return static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-53);
        };
        for (tensor4* t : {&p->q, &p->k, &p->v}) {
            t->resize(1, L, kH, D);
            for (std::int64_t i = 0; i < t->size(); ++i)
                t->data()[i] = (next() + next() + next() - 1.5f) * 2.0f;
        }
    }
    return *p;
}

double bytes_of(std::int64_t L, std::int64_t D) { return 4.0 * static_cast<double>(L * kH * D) * sizeof(float); }

// Row i of head h against a double recomputation of the self-gating mean.
bool check_self_gating(const inputs& in, const tensor4& out, bool causal, std::string& why) {
    const std::int64_t L = in.q.dimension(1), D = in.q.dimension(3);
    for (std::int64_t i = 0; i < out.size(); ++i)
        if (!std::isfinite(out.data()[i])) return why = "non-finite output", false;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (std::int64_t h : {std::int64_t(0), kH - 1}) {
        std::vector<double> g(static_cast<std::size_t>(L));
        for (std::int64_t j = 0; j < L; ++j) {
            double s = 0;
            for (std::int64_t d = 0; d < D; ++d) s += double(in.q(0, j, h, d)) * double(in.k(0, j, h, d));
            g[j] = scale * s;
        }
        for (std::int64_t i : {std::int64_t(0), L / 3, L - 1}) {
            const std::int64_t n = causal ? i + 1 : L;
            double m = -HUGE_VAL, z = 0;
            for (std::int64_t j = 0; j < n; ++j) m = std::max(m, g[j]);
            std::vector<double> acc(D, 0.0);
            for (std::int64_t j = 0; j < n; ++j) {
                const double w = std::exp(g[j] - m);
                z += w;
                for (std::int64_t d = 0; d < D; ++d) acc[d] += w * in.v(0, j, h, d);
            }
            for (std::int64_t d = 0; d < D; ++d)
                if (std::fabs(acc[d] / z - out(0, i, h, d)) > 1e-4 * (1.0 + std::fabs(acc[d] / z)))
                    return why = "row " + std::to_string(i) + " head " + std::to_string(h) + " differs", false;
        }
    }
    return true;
}

enum class family { self_gating, reference, softmax };

void BM_case(benchmark::State& state, family f, std::int64_t L, std::int64_t D, bool causal, int threads) {
    const inputs& in = inputs_for(L, D);
    tensor4 out(1, L, kH, D);
    out.setConstant(std::nanf(""));
    attnkit::thread_pool* pool = shared_pool(threads);
    for (auto _ : state) {
        if (f == family::self_gating) {
            attnkit::self_gating_options o;
            o.causal = causal;
            o.pool = pool;
            attnkit::self_gating_attention(in.q, in.k, in.v, out, o);
        } else if (f == family::reference) {
            attnkit::self_gating_options o;
            o.causal = causal;
            attnkit::reference::self_gating_attention(in.q, in.k, in.v, out, o);
        } else {
            attnkit::softmax_options o;
            o.causal = causal;
            o.pool = pool;
            attnkit::softmax_attention(in.q, in.k, in.v, out, o);
        }
        benchmark::ClobberMemory();
    }
    std::string why;
    if (f != family::softmax && !check_self_gating(in, out, causal, why)) state.SkipWithError(why.c_str());
    const double pairs = f == family::self_gating ? static_cast<double>(L)
                                                  : (causal ? 0.5 * static_cast<double>(L) * (L + 1) : double(L) * L);
    const double flops = pairs * kH * 4.0 * D;
    state.counters["GB/s"] = benchmark::Counter(bytes_of(L, D) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
    // Fractions need the rate: Google Benchmark divides rate counters by the time afterwards,
    // so these are set as rates of (bytes / bandwidth) and (flops / peak).
    state.counters["bw_frac"] = benchmark::Counter(bytes_of(L, D) / dram_read_bandwidth(threads),
                                                   benchmark::Counter::kIsIterationInvariantRate);
    state.counters["peak_frac"] = benchmark::Counter(flops / machine_peak_flops(threads),
                                                     benchmark::Counter::kIsIterationInvariantRate);
}

// One decode step of self_gating_state (T = 1 token, B = 1): the state is O(H Dv) whatever the
// length, so a step costs the same at any position; tokens/s and the latency are the numbers.
void BM_decode_step(benchmark::State& state, int threads) {
    tensor4 q(1, 1, kH, kD), k(1, 1, kH, kD), v(1, 1, kH, kD), out(1, 1, kH, kD);
    for (tensor4* t : {&q, &k, &v}) t->setConstant(0.5f);
    attnkit::self_gating_options o;
    o.pool = shared_pool(threads);
    attnkit::self_gating_state st(1, kH, kH, kD, kD, o);
    for (auto _ : state) {
        st.step(q, k, v, out);
        benchmark::ClobberMemory();
    }
    if (!(std::fabs(out(0, 0, 0, 0) - 0.5f) < 1e-5f)) state.SkipWithError("decode output differs from 0.5");
    state.counters["tokens/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
    const char* names[] = {"self_gating", "reference", "softmax"};
    auto add = [&](family f, std::int64_t L, bool causal, int threads, std::int64_t iterations,
                   std::int64_t D = kD) {
        const std::string name = std::string(names[static_cast<int>(f)]) + "/L:" + std::to_string(L) +
                                 "/D:" + std::to_string(D) + "/H:" + std::to_string(kH) +
                                 "/causal:" + (causal ? "1" : "0") + "/threads:" + std::to_string(threads);
        auto* b = benchmark::RegisterBenchmark(name.c_str(), BM_case, f, L, D, causal, threads)
                      ->UseRealTime()
                      ->Unit(benchmark::kMillisecond);
        if (iterations > 0) b->Iterations(iterations)->Repetitions(1);
    };
    add(family::reference, 512, true, 1, 1);
    add(family::reference, 512, false, 1, 1);
    for (bool causal : {true, false}) add(family::self_gating, 512, causal, 1, 0);
    for (std::int64_t L : {4096, 16384, 32768})
        for (bool causal : {true, false})
            for (int t : kThreadCounts) add(family::self_gating, L, causal, t, 0);
    benchmark::RegisterBenchmark("self_gating_state/T:1/D:128/H:8/threads:1", BM_decode_step, 1)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    for (int t : kThreadCounts) {
        add(family::softmax, 4096, true, t, 0);
        add(family::softmax, 16384, true, t, 1);
        if (!bench_quick()) add(family::softmax, 32768, true, t, 1);
    }
    // The comparison suite's shape (bench/variants_bench.cpp: D = 64, causal), so that its
    // self_gating rows have a twin here (bench/scripts/plot_report.py, suite against own).
    for (std::int64_t L : {2048, 8192})
        for (int t : kThreadCounts) add(family::self_gating, L, true, t, 0, 64);
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, [] { attnkit_bench::register_all(); }); }
