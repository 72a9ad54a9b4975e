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
// L=2048; decode Lq=1, Lk in {4096, 16384, 65536}, D in {64, 128}, H=8 and GQA 32/8, K/V float,
// bfloat16 ("kv:bf16/"), half ("kv:f16/") and int8 with row scales ("kv:i8/", attnkit::int8_kv:
// GB/s counts the scales), token-major and head-major ("layout:head_major/"); batched decode
// B=4 with key_lengths of four different lengths ("kl:mixed"); prefill L=2048, D=128 causal with bfloat16 K/V; all with
// threads 1 and 2.
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

#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced
#include <benchmark/benchmark.h>

#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/attention_harness.hpp"
#include "common/bench_main.hpp"
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

std::vector<attn_case> softmax_cases() {
    std::vector<attn_case> cases;
    for (std::int64_t L : {256, 512, 1024, 2048, 4096})
        for (std::int64_t D : {64, 128})
            for (bool causal : {false, true})
                for (int t : kThreadCounts) cases.push_back(prefill_case(L, D, 8, 8, causal, t));
    for (bool causal : {false, true})
        for (int t : kThreadCounts) cases.push_back(prefill_case(2048, 128, 32, 8, causal, t));
    // Decode: K/V streamed once, GB/s and bw_frac against the read probe of the run; float,
    // bfloat16, half and int8 K/V; MHA H = 8 and GQA 32/8; K/V token-major ([B, L, Hk, D], as
    // llama.cpp's cache) and head-major ([B, Hk, L, D] views, as PyTorch's and Hugging Face's).
    for (const attn_case& c : decode_sweep({kv_storage::f32, kv_storage::bf16, kv_storage::f16, kv_storage::i8},
                                           {4096, 16384, 65536}))
        cases.push_back(c);
    // Batched decode with padding: B = 4 caches of different lengths in one [4, Lk] tensor.
    for (kv_storage st : {kv_storage::f32, kv_storage::bf16, kv_storage::f16})
        for (int t : kThreadCounts) {
            const std::int64_t Lk = 16384;
            attn_case c = decode_case(Lk, 128, 8, 8, t, 4);
            c.key_lengths = {Lk, 3 * Lk / 4 + 5, Lk / 2 + 3, Lk / 4 + 1};
            c.kv = st;
            cases.push_back(c);
        }
    // Prefill with a bfloat16 and an int8 cache beside the float row of the same shape.
    for (kv_storage st : {kv_storage::bf16, kv_storage::i8})
        for (int t : kThreadCounts) {
            attn_case c = prefill_case(2048, 128, 8, 8, true, t);
            c.kv = st;
            cases.push_back(c);
        }
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

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) {
    return attnkit_bench::bench_main(argc, argv, [] {
        using namespace attnkit_bench;
        register_baselines();
        register_fast_kernels();  // softmax_attention_fast.hpp
        register_attention_benchmarks(softmax_cases());
    });
}
