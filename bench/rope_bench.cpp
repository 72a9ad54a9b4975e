// attnkit benchmarks: model::rope, a streaming kernel (each element read once and written once).
//
// Families (names "<family>/<dtype>/<form>/B:../L:../H:../D:../threads:N"):
//   rope_decode   the K of one decode step of a ragged batch: x [16, 1, 8, 128], positions per
//                 row ([16, 1], sixteen distinct lengths 1000 .. 31000): one call, 16 x 64
//                 angles (cos and sin in double) for 16 x 8 x 128 elements
//   rope_prefill  a prompt's Q: x [1, 4096, 32, 128] at position_offset 0: 4096 x 64 angles for
//                 16.8M elements
//   *_cached      the same with a model::rope_cache: every call after the first finds its table
//                 (the 2nd .. 2 n_layers-th call of a step, q and k of every layer at the same
//                 positions), so only the rotation is timed
// dtype f32 or bf16 (x stored as Eigen::bfloat16, rotated in float, rounded once); form half
// (rotate-half, Qwen2's defaults) or inter_llama3 (interleaved pairs with Llama 3.1's scaling,
// Meta's layout). Threads 1 and 2.
// Counters: GB/s = bytes of x read plus written (2 x its size) per second; bw_frac = that over the
// 8-stream DRAM read bandwidth measured in the same run with as many threads
// (common/bench_main.hpp); angles/s = cos / sin pairs computed per second. The decode step's x
// (64 KiB float) stays in cache between iterations, so its bw_frac is what the call's fixed costs
// (angles, table, dispatch) leave of a memory-speed pass; the prefill's x (64 MiB float) streams
// from DRAM.
// After the timed loop one fresh call is checked against the double oracle on every row,
// otherwise SkipWithError.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced

#include "attnkit/model/rope.hpp"
#include "attnkit/reference/model/rope.hpp"
#include "common/bench_main.hpp"
#include "common/machine.hpp"

namespace attnkit_bench {
namespace {

template <class T>
using tensor4 = Eigen::Tensor<T, 4, Eigen::RowMajor>;
using positions2 = Eigen::Tensor<std::int64_t, 2, Eigen::RowMajor>;

enum class form { half, interleaved_llama3 };

attnkit::model::rope_options options_for(form f, int threads) {
    attnkit::model::rope_options o;
    o.pool = shared_pool(threads);
    if (f == form::half) {
        o.theta = 1e6f;  // Qwen2
    } else {
        o.theta = 500000.0f;  // Llama 3.1
        o.style = attnkit::model::rope_style::interleaved;
        o.scaling.type = attnkit::model::rope_scaling_type::llama3;
        o.scaling.factor = 8.0;
        o.scaling.low_freq_factor = 1.0;
        o.scaling.high_freq_factor = 4.0;
        o.scaling.original_max_position_embeddings = 8192;
    }
    return o;
}

template <class T>
tensor4<T> random_x(std::int64_t B, std::int64_t L, std::int64_t H, std::int64_t D) {
    tensor4<T> x(B, L, H, D);
    std::uint64_t s = 0x9E3779B97F4A7C15ull;
    for (std::int64_t i = 0; i < x.size(); ++i) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x.data()[i] = T(static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-53 * 2.0 - 1.0));
    }
    return x;
}

// One call on a fresh copy against the oracle (one head of every row; 16-bit: half an ulp of
// the stored result on top of the float error).
template <class T>
bool check(const tensor4<T>& x0, const positions2* pos, const attnkit::model::rope_options& o, std::string& why) {
    tensor4<T> x = x0;
    if (pos)
        attnkit::model::rope(x, *pos, o);
    else
        attnkit::model::rope(x, o);
    const std::int64_t B = x.dimension(0), L = x.dimension(1), D = x.dimension(3);
    tensor4<float> head(B, L, 1, D);
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t l = 0; l < L; ++l)
            for (std::int64_t d = 0; d < D; ++d) head(b, l, 0, d) = static_cast<float>(x0(b, l, 0, d));
    tensor4<double> ref(B, L, 1, D);
    if (pos)
        attnkit::reference::model::rope(head, ref, *pos, o);
    else
        attnkit::reference::model::rope(head, ref, o);
    const double tol = std::is_same<T, float>::value ? 1e-6 : 1e-2;
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t l = 0; l < L; ++l)
            for (std::int64_t d = 0; d < D; ++d)
                if (!(std::fabs(static_cast<double>(static_cast<float>(x(b, l, 0, d))) - ref(b, l, 0, d)) <= tol * 2.0))
                    return why = "row " + std::to_string(b) + "," + std::to_string(l) + " differs from the oracle", false;
    return true;
}

template <class T>
void BM_rope(benchmark::State& state, bool decode, form f, int threads, bool cached) {
    const std::int64_t B = decode ? 16 : 1, L = decode ? 1 : 4096, H = decode ? 8 : 32, D = 128;
    const tensor4<T> x0 = random_x<T>(B, L, H, D);
    tensor4<T> x = x0;
    positions2 pos(B, L);
    for (std::int64_t b = 0; b < B; ++b) pos(b, 0) = 1000 + 2000 * b;
    attnkit::model::rope_options o = options_for(f, threads);
    attnkit::model::rope_cache cache;
    if (cached) o.cache = &cache;
    // Repeated rotation in place keeps every pair's norm: the values stay in range.
    for (auto _ : state) {
        if (decode)
            attnkit::model::rope(x, pos, o);
        else
            attnkit::model::rope(x, o);
        benchmark::ClobberMemory();
    }
    std::string why;
    if (!check(x0, decode ? &pos : nullptr, o, why)) state.SkipWithError(why.c_str());
    if (cached && cache.misses() != 1) state.SkipWithError("the cache missed more than once");
    const double bytes = 2.0 * static_cast<double>(x.size()) * sizeof(T);
    const double angles = static_cast<double>(decode ? B : L) * (D / 2);
    state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["bw_frac"] =
        benchmark::Counter(bytes / dram_read_bandwidth(threads), benchmark::Counter::kIsIterationInvariantRate);
    state.counters["angles/s"] = benchmark::Counter(angles, benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
    for (bool decode : {true, false})
        for (bool cached : {false, true})
            for (form f : {form::half, form::interleaved_llama3})
                for (bool bf16 : {false, true})
                    for (int t : kThreadCounts) {
                        if (f == form::interleaved_llama3 && bf16) continue;  // the form costs the same in both
                        const std::string name = std::string(decode ? "rope_decode" : "rope_prefill") +
                                                 (cached ? "_cached/" : "/") + (bf16 ? "bf16" : "f32") + "/" +
                                                 (f == form::half ? "half" : "inter_llama3") +
                                                 (decode ? "/B:16/L:1/H:8" : "/B:1/L:4096/H:32") +
                                                 "/D:128/threads:" + std::to_string(t);
                        auto* b = bf16 ? benchmark::RegisterBenchmark(name.c_str(), BM_rope<Eigen::bfloat16>, decode,
                                                                      f, t, cached)
                                       : benchmark::RegisterBenchmark(name.c_str(), BM_rope<float>, decode, f, t,
                                                                      cached);
                        b->UseRealTime()->Unit(decode ? benchmark::kMicrosecond : benchmark::kMillisecond);
                    }
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, [] { attnkit_bench::register_all(); }); }
