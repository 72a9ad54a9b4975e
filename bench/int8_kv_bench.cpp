// attnkit benchmarks: int8 K/V (attnkit/int8_kv.hpp): the measurements behind one scale per
// (token, key/value head) rather than llama.cpp's q8_0 (one per 32 values), and quantize_kv.
// The decode and prefill kernels over int8 K/V are in softmax_attention_bench ("kv:i8/").
//
// Families:
//   int8_error/<format>/<data>   accuracy: a GQA 32/8 decode (Lk 4096, D 128) over K/V quantised
//                                per row (format "row", quantize_kv) or per 32 values ("q8_0":
//                                scale max|block| / 127, written here), against float K/V, both
//                                in the double oracle. Counters: max_err = max |error| / max
//                                |out|, rms_err = rms error / rms out. data: "gaussian" N(0, 1)
//                                K and V, or "channels": K with 4 of 128 channels 10x larger
//                                (the outlier channels of LLM keys), V Gaussian. One iteration.
//   int8_scores/<format>/Lk:n    speed: the scores of one query row against n int8 keys of
//                                D = 128, four keys at a time: "row" applies each key's scale
//                                to its finished dot product, "q8_0" folds each block's scale
//                                in after every 32 values. Lk 4096 (in L2) and 1048576 (from
//                                DRAM). Counters: keys/s; GB/s of values plus scales read.
//   quantize_kv/L:n              quantize_kv of x [1, n, 8, 128] float: GB/s of x read.
// The format measured better on both speed and bytes is the one attnkit stores; see
// docs/serving.md ("int8 K/V") and docs/benchmarks.md for the numbers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced

#include "attnkit/int8_kv.hpp"
#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/simd/convert.hpp"
#include "common/bench_main.hpp"
#include "common/machine.hpp"

namespace attnkit_bench {
namespace {

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using tensor4d = Eigen::Tensor<double, 4, Eigen::RowMajor>;
using tensor4i = Eigen::Tensor<std::int8_t, 4, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;

constexpr std::int64_t kBlock = 32;  // q8_0's block

tensor4 gaussian(std::int64_t B, std::int64_t L, std::int64_t H, std::int64_t D, std::uint64_t seed) {
    tensor4 x(B, L, H, D);
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    auto uniform = [&] {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        return (static_cast<double>(s >> 11) + 0.5) * 0x1.0p-53;
    };
    for (std::int64_t i = 0; i < x.size(); i += 2) {
        const double r = std::sqrt(-2.0 * std::log(uniform())), a = 6.283185307179586 * uniform();
        x.data()[i] = static_cast<float>(r * std::cos(a));
        if (i + 1 < x.size()) x.data()[i + 1] = static_cast<float>(r * std::sin(a));
    }
    return x;
}

// x through quantize_kv and back, in double.
tensor4d per_row(const tensor4& x) {
    tensor4i q(x.dimensions());
    tensor3 s(x.dimension(0), x.dimension(1), x.dimension(2));
    attnkit::quantize_kv(x, q, s);
    tensor4d d(x.dimensions());
    for (std::int64_t i = 0; i < x.size(); ++i) d.data()[i] = double(s.data()[i / x.dimension(3)]) * q.data()[i];
    return d;
}

// x through q8_0 (scale max|block| / 127, round to nearest) and back, in double.
tensor4d per_block(const tensor4& x) {
    tensor4d d(x.dimensions());
    for (std::int64_t i0 = 0; i0 < x.size(); i0 += kBlock) {
        float amax = 0.0f;
        for (std::int64_t i = i0; i < i0 + kBlock; ++i) amax = std::max(amax, std::fabs(x.data()[i]));
        const float s = amax / 127.0f;
        for (std::int64_t i = i0; i < i0 + kBlock; ++i)
            d.data()[i] = s == 0.0f ? 0.0 : double(s) * std::nearbyint(double(x.data()[i]) / double(s));
    }
    return d;
}

void BM_int8_error(benchmark::State& state, bool block_format, bool channels) {
    const std::int64_t Lk = 4096, H = 32, Hk = 8, D = 128;
    const tensor4 q = gaussian(1, 1, H, D, 1);
    tensor4 k = gaussian(1, Lk, Hk, D, 2);
    const tensor4 v = gaussian(1, Lk, Hk, D, 3);
    if (channels)
        for (std::int64_t l = 0; l < Lk; ++l)
            for (std::int64_t h = 0; h < Hk; ++h)
                for (std::int64_t c : {5, 37, 70, 101}) k(0, l, h, c) *= 10.0f;
    attnkit::softmax_options o;
    o.causal = true;
    tensor4d exact(1, 1, H, D), approx(1, 1, H, D);
    for (auto _ : state) {
        attnkit::reference::softmax_attention(q, k, v, exact, o);
        const tensor4d kq = block_format ? per_block(k) : per_row(k);
        const tensor4d vq = block_format ? per_block(v) : per_row(v);
        attnkit::reference::softmax_attention(q, kq, vq, approx, o);
    }
    double max_err = 0.0, max_out = 0.0, se = 0.0, so = 0.0;
    for (std::int64_t i = 0; i < exact.size(); ++i) {
        const double e = approx.data()[i] - exact.data()[i];
        max_err = std::max(max_err, std::fabs(e));
        max_out = std::max(max_out, std::fabs(exact.data()[i]));
        se += e * e;
        so += exact.data()[i] * exact.data()[i];
    }
    state.counters["max_err"] = max_err / max_out;
    state.counters["rms_err"] = std::sqrt(se / so);
}

template <bool kBlockFormat>
void BM_int8_scores(benchmark::State& state) {
    using A = attnkit::simd::default_arch;
    using V = attnkit::simd::vfloat<A>;
    constexpr std::int64_t W = attnkit::simd::kLanes<A>, D = 128, KG = 4;
    const std::int64_t Lk = state.range(0);
    const std::int64_t n_scales = kBlockFormat ? D / kBlock : 1;
    std::vector<std::int8_t> keys(static_cast<std::size_t>(Lk * D));
    std::vector<float> scales(static_cast<std::size_t>(Lk * n_scales)), q(D), out(static_cast<std::size_t>(Lk));
    for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<std::int8_t>((i * 37 + 11) % 255 - 127);
    for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = 0.01f + 1e-6f * static_cast<float>(i % 101);
    for (std::int64_t d = 0; d < D; ++d) q[static_cast<std::size_t>(d)] = 0.1f * static_cast<float>(d % 7) - 0.3f;
    for (auto _ : state) {
        for (std::int64_t j = 0; j < Lk; j += KG) {
            const std::int8_t* kp = keys.data() + j * D;
            const float* sp = scales.data() + j * n_scales;
            V acc[KG];
            for (auto& a : acc) a = V(0.0f);
            if constexpr (kBlockFormat) {
                for (std::int64_t b = 0; b < D / kBlock; ++b) {
                    V part[KG];
                    for (auto& p : part) p = V(0.0f);
                    for (std::int64_t d = b * kBlock; d < (b + 1) * kBlock; d += W) {
                        const V qv = attnkit::simd::loadu<A>(q.data() + d);
                        for (std::int64_t u = 0; u < KG; ++u)
                            part[u] = attnkit::simd::fma(qv, attnkit::simd::load_float<A>(kp + u * D + d), part[u]);
                    }
                    for (std::int64_t u = 0; u < KG; ++u)
                        acc[u] = attnkit::simd::fma(part[u], V(sp[u * n_scales + b]), acc[u]);
                }
                for (std::int64_t u = 0; u < KG; ++u) out[static_cast<std::size_t>(j + u)] = attnkit::simd::hsum(acc[u]);
            } else {
                for (std::int64_t d = 0; d < D; d += W) {
                    const V qv = attnkit::simd::loadu<A>(q.data() + d);
                    for (std::int64_t u = 0; u < KG; ++u)
                        acc[u] = attnkit::simd::fma(qv, attnkit::simd::load_float<A>(kp + u * D + d), acc[u]);
                }
                for (std::int64_t u = 0; u < KG; ++u)
                    out[static_cast<std::size_t>(j + u)] = attnkit::simd::hsum(acc[u]) * sp[u];
            }
        }
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    const double bytes = static_cast<double>(keys.size()) + 4.0 * static_cast<double>(scales.size());
    state.counters["keys/s"] = benchmark::Counter(static_cast<double>(Lk), benchmark::Counter::kIsIterationInvariantRate);
    state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_quantize_kv(benchmark::State& state) {
    const std::int64_t L = state.range(0), Hk = 8, D = 128;
    const tensor4 x = gaussian(1, L, Hk, D, 7);
    tensor4i q(1, L, Hk, D);
    tensor3 s(1, L, Hk);
    for (auto _ : state) {
        attnkit::quantize_kv(x, q, s);
        benchmark::ClobberMemory();
    }
    const double bytes = 4.0 * static_cast<double>(x.size());
    state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["bw_frac"] =
        benchmark::Counter(bytes / dram_read_bandwidth(1), benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
    for (bool block : {false, true})
        for (bool channels : {false, true}) {
            const std::string name = std::string("int8_error/") + (block ? "q8_0/" : "row/") +
                                     (channels ? "channels" : "gaussian");
            benchmark::RegisterBenchmark(name.c_str(), BM_int8_error, block, channels)
                ->Iterations(1)
                ->Unit(benchmark::kMillisecond);
        }
    for (auto* b : {benchmark::RegisterBenchmark("int8_scores/row", BM_int8_scores<false>),
                    benchmark::RegisterBenchmark("int8_scores/q8_0", BM_int8_scores<true>)})
        b->ArgName("Lk")->Arg(4096)->Arg(1 << 20)->UseRealTime()->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("quantize_kv", BM_quantize_kv)
        ->ArgName("L")
        ->Arg(16384)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, [] { attnkit_bench::register_all(); }); }
