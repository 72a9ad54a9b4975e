// attnkit benchmarks: training the decoder template (docs/training.md): one step is
// decoder::loss_and_gradients (batched forward keeping activations, cross-entropy, the backward
// through every block) and an AdamW update.
//
// Families, threads 1 and 2:
//   train_step/<variant>/d:512/L:512/B:4   the 70M shape of the suite (d_model 512, 6 layers, 8
//                                          heads, vocab 512), each layer the variant
//   train_step/<variant>/d:64/L:24/B:32    the MQAR shape of the training comparison (2 layers,
//                                          4 heads, vocab 64)
// Counters: tokens/s = B L per step; kernel_share = the fraction of the step's time inside
// attnkit's kernels and GEMMs (decoder_profile: attention, norms, RoPE, cross-entropy, every
// product; the rest is embedding lookup, copies, residual adds and the optimizer). The same
// model, data and optimizer in PyTorch: bench/scripts/torch_train_bench.py (tokens/s against
// these rows: docs/benchmarks.md, "Training").
//
//   ./attnkit_decoder_training_bench --benchmark_repetitions=3 --benchmark_display_aggregates_only=true
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced
#include <benchmark/benchmark.h>

#include "attnkit/model/adamw.hpp"
#include "attnkit/model/decoder.hpp"
#include "common/bench_main.hpp"

namespace attnkit_bench {
namespace {

using namespace attnkit::model;

struct shape {
    std::int64_t d, layers, heads, vocab, L, B;
};

void train_step(benchmark::State& state, attention_variant v, shape s, int threads) {
    attnkit::thread_pool pool(static_cast<std::size_t>(threads));
    decoder_config c;
    c.vocab = s.vocab;
    c.d_model = s.d;
    c.layers = s.layers;
    c.heads = s.heads;
    c.heads_kv = s.heads;
    c.max_length = s.L;
    c.variant = v;
    c.pool = threads > 1 ? &pool : nullptr;
    decoder m(c);
    decoder_gradients g(m);
    adamw opt(m, adamw_options{});
    weight_rng rng(7);
    std::vector<std::int32_t> tokens, targets;
    for (std::int64_t i = 0; i < s.B * s.L; ++i) {
        tokens.push_back(static_cast<std::int32_t>(rng.below(s.vocab)));
        targets.push_back(static_cast<std::int32_t>(rng.below(s.vocab)));
    }
    m.loss_and_gradients(tokens, targets, s.B, g);  // first call sizes the buffers
    opt.step(m, g);
    m.reset_profile();
    const auto t0 = std::chrono::steady_clock::now();
    for (auto _ : state) {
        benchmark::DoNotOptimize(m.loss_and_gradients(tokens, targets, s.B, g));
        opt.step(m, g);
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const decoder_profile& p = m.profile();
    state.counters["tokens/s"] =
        benchmark::Counter(static_cast<double>(s.B * s.L), benchmark::Counter::kIsIterationInvariantRate);
    // The whole step's wall time, optimizer included, against the time the profile saw inside
    // kernels and GEMMs.
    state.counters["kernel_share"] = wall > 0.0 ? (p.kernels + p.gemm) / wall : 0.0;
}

void register_all() {
    const bool quick = bench_quick();
    const std::vector<attention_variant> variants{attention_variant::standard,    attention_variant::taylor,
                                                  attention_variant::self_gating, attention_variant::mlp,
                                                  attention_variant::mta,         attention_variant::embedding_qk,
                                                  attention_variant::rnd_emb_qk,  attention_variant::fixed_seq_qk};
    std::vector<shape> shapes{{64, 2, 4, 64, 24, 32}};
    if (!quick) shapes.push_back({512, 6, 8, 512, 512, 4});
    for (const shape& s : shapes)
        for (attention_variant v : variants)
            for (int t : kThreadCounts) {
                const std::string name = "train_step/" + attention_variant_name(v) + "/d:" + std::to_string(s.d) +
                                         "/L:" + std::to_string(s.L) + "/B:" + std::to_string(s.B) +
                                         "/threads:" + std::to_string(t);
                benchmark::RegisterBenchmark(name.c_str(), train_step, v, s, t)->UseRealTime()->Unit(benchmark::kMillisecond);
            }
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, attnkit_bench::register_all); }
