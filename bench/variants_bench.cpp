// attnkit benchmarks: the comparison suite. Every variant at equal shapes, side by side.
//
//   <variant>/prefill/L:<L>/D:64/H:8/threads:<t>    one causal prefill of L tokens (B = 1)
//   <variant>/decode/ctx:<N>/D:64/H:8/threads:<t>   one decode step after N tokens
//
// Variants (each through its public entry point, with the options a model would use):
//   softmax      softmax_attention, causal; decode: one query against a KV cache of N tokens
//   taylor       taylor_attention, causal, form = automatic; decode: one taylor_state step
//   self_gating  self_gating_attention, causal; decode: one self_gating_state step
//   static_qk    static_qk_attention (fixed Q/K of length L); decode: static_attention_map::apply
//                of the last row over a cache of N values (the map holds H N (N+1) / 2 floats,
//                so decode stops at 8192, 4096 in quick mode)
//   mta          mta_attention with the paper's layer (pre and post 6 x 11 key-query convolution,
//                pre and post head mixing, group norm with gate); decode: one mta_state step
//                (the state takes its prompt through the fused kernel)
//   mlp          gated_mlp on [L, H*D] with m = gated_mlp_width(H*D): no token mixing, no cache
//
//   decoder/<schedule>/<variant>/prefill/threads:1  the decoder template (model/decoder.hpp) at the
//   decoder/<schedule>/<variant>/decode/threads:1   70M shape (d_model 512, 6 layers, 8 heads):
//                                                   a 512-token prompt, then decode steps
//   (every schedule except "even", which is "hybrid", with every variant; the baseline is
//   decoder/uniform/standard; quick mode keeps uniform and middle)
//
// Counters: tokens/s (prefill: L / time; decode: 1 / time), state_bytes (what decode keeps at
// context N: the KV cache, the running state, the map), state_bytes_per_token (state_bytes / N).
// ATTNKIT_BENCH_QUICK=1: L up to 4096 and contexts up to 4096 (under 3 minutes on 2 cores).
// Default: L from 512 to 16384 and contexts from 1024 to 32768.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced

#include "attnkit/attnkit.hpp"
#include "attnkit/model/decoder.hpp"
#include "attnkit/taylor_attention.hpp"
#include "common/bench_main.hpp"
#include "common/machine.hpp"

namespace attnkit_bench {
namespace {

using tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using attnkit::index_t;

constexpr index_t kH = 8, kD = 64;

std::uint64_t mix(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

// Deterministic values in [-a, a]: the suite times kernels, it does not check them (each
// variant's own benchmark and tests do).
template <class T>
void fill(T& t, std::uint64_t seed, float a = 1.0f) {
    for (index_t i = 0; i < static_cast<index_t>(t.size()); ++i)
        t.data()[i] = a * (static_cast<float>(mix(seed * 1000003u + static_cast<std::uint64_t>(i)) >> 40) /
                               static_cast<float>(1u << 24) * 2.0f - 1.0f);
}

tensor4 bshd(index_t L, std::uint64_t seed) {
    tensor4 t(1, L, kH, kD);
    fill(t, seed);
    return t;
}

// The paper's MTA layer on H heads: kernels initialised to identity plus noise, as its
// released models start from.
struct mta_weights {
    Eigen::Tensor<float, 4, Eigen::RowMajor> kq_pre, kq_post;
    tensor2 head_pre, head_post;
    tensor1 norm, gate;
    mta_weights() : kq_pre(kH, 1, 6, 11), kq_post(kH, 1, 6, 11), head_pre(kH, kH), head_post(kH, kH), norm(kD), gate(kD) {
        fill(kq_pre, 11, 0.02f);
        fill(kq_post, 12, 0.02f);
        fill(head_pre, 13, 0.02f);
        fill(head_post, 14, 0.02f);
        for (index_t h = 0; h < kH; ++h) {
            kq_pre(h, 0, 5, 5) += 1.0f;
            kq_post(h, 0, 5, 5) += 1.0f;
            head_pre(h, h) += 1.0f;
            head_post(h, h) += 1.0f;
        }
        norm.setConstant(1.0f);
        fill(gate, 15, 0.1f);
    }
    attnkit::mta_options options(attnkit::thread_pool* pool) const {
        attnkit::mta_options o;
        o.kq_pre = kq_pre;
        o.head_pre = head_pre;
        o.kq_post = kq_post;
        o.head_post = head_post;
        o.norm_weight = norm;
        o.gate_weight = gate;
        o.pool = pool;
        return o;
    }
};
const mta_weights& mta_layer() {
    static const mta_weights w;
    return w;
}

void set_prefill_counters(benchmark::State& st, index_t L) {
    st.counters["tokens/s"] = benchmark::Counter(static_cast<double>(L), benchmark::Counter::kIsIterationInvariantRate);
}
void set_decode_counters(benchmark::State& st, index_t ctx, double state_bytes) {
    st.counters["tokens/s"] = benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
    st.counters["state_bytes"] = state_bytes;
    st.counters["state_bytes_per_token"] = state_bytes / static_cast<double>(ctx);
}

// ---- prefill -----------------------------------------------------------------------------

// The gated MLP that replaces attention: x [rows, H*D], m = gated_mlp_width(H*D).
struct mlp_case {
    tensor2 x, y, wg, wu, wd;
    explicit mlp_case(index_t rows) {
        const index_t d = kH * kD, m = attnkit::gated_mlp_width(d);
        x = tensor2(rows, d);
        y = tensor2(rows, d);
        wg = tensor2(d, m);
        wu = tensor2(d, m);
        wd = tensor2(m, d);
        fill(x, 4);
        fill(wg, 5, 0.05f);
        fill(wu, 6, 0.05f);
        fill(wd, 7, 0.05f);
    }
    void run(attnkit::thread_pool* pool) {
        attnkit::gated_mlp_options o;
        o.pool = pool;
        attnkit::gated_mlp(x, wg, wu, wd, y, o);
    }
};

// One causal prefill of a token-mixing variant through its public entry point.
void attention_call(const std::string& variant, const tensor4& q, const tensor4& k, const tensor4& v, tensor4& out,
                    attnkit::thread_pool* pool) {
    if (variant == "softmax") {
        attnkit::softmax_options o;
        o.causal = true;
        o.pool = pool;
        attnkit::softmax_attention(q, k, v, out, o);
    } else if (variant == "taylor") {
        attnkit::taylor_options o;
        o.causal = true;
        o.pool = pool;
        attnkit::taylor_attention(q, k, v, out, o);
    } else if (variant == "self_gating") {
        attnkit::self_gating_options o;
        o.causal = true;
        o.pool = pool;
        attnkit::self_gating_attention(q, k, v, out, o);
    } else if (variant == "static_qk") {
        attnkit::static_qk_options o;
        o.pool = pool;
        attnkit::static_qk_attention(q, k, v, out, o);
    } else if (variant == "mta") {
        attnkit::mta_attention(q, k, v, out, mta_layer().options(pool));
    }
}

// A prefill case's inputs, built and warmed up (scratch, page faults) once and kept while Google
// Benchmark calls the same case again (to size the iteration count, then once per repetition):
// a warm-up per call cost as much as the timed work at L = 8192.
struct prefill_setup {
    std::function<void()> call;
    std::unique_ptr<mlp_case> mlp;
    tensor4 q, k, v, out;
    prefill_setup(const std::string& variant, index_t L, attnkit::thread_pool* pool) {
        if (variant == "mlp") {
            mlp = std::make_unique<mlp_case>(L);
            call = [this, pool] { mlp->run(pool); };
        } else {
            q = bshd(L, 1);
            k = bshd(L, 2);
            v = bshd(L, 3);
            out = tensor4(1, L, kH, kD);
            call = [this, variant, pool] { attention_call(variant, q, k, v, out, pool); };
        }
        call();  // warm-up
    }
};

void prefill(benchmark::State& st, const std::string& variant, index_t L, int threads) {
    static std::string key;
    static std::unique_ptr<prefill_setup> cached;
    const std::string k = variant + "/" + std::to_string(L) + "/" + std::to_string(threads);
    if (!cached || key != k) {
        cached.reset();  // one case at a time: the large ones hold hundreds of MB
        cached = std::make_unique<prefill_setup>(variant, L, shared_pool(threads));
        key = k;
    }
    for (auto _ : st) {
        cached->call();
        benchmark::ClobberMemory();
    }
    set_prefill_counters(st, L);
}

// ---- decode ------------------------------------------------------------------------------

// A decode case's context (cache, state, map), built once before timing and kept while Google
// Benchmark calls the case again (it calls each case several times to size the iteration
// count, and a state's prefill at 32K tokens costs seconds). One case is kept at a time.
struct decode_setup {
    attnkit::thread_pool* pool;
    tensor4 q1 = bshd(1, 21), k1 = bshd(1, 22), v1 = bshd(1, 23);
    tensor4 out1{1, 1, kH, kD};
    std::function<void()> call;
    double state_bytes = 0.0;
    tensor4 qc, kc, vc, outc;
    std::unique_ptr<attnkit::taylor_state> ts;
    std::unique_ptr<attnkit::self_gating_state> gs;
    std::unique_ptr<attnkit::mta_state> ms;
    std::unique_ptr<attnkit::static_attention_map> map;
    std::unique_ptr<mlp_case> mlp;

    decode_setup(const std::string& variant, index_t ctx, int threads) : pool(shared_pool(threads)) {
    const double kv_bytes = 2.0 * static_cast<double>(ctx) * kH * kD * sizeof(float);
    auto context = [&] {
        qc = bshd(ctx, 31);
        kc = bshd(ctx, 32);
        vc = bshd(ctx, 33);
        outc = tensor4(1, ctx, kH, kD);
    };
    if (variant == "softmax") {
        kc = bshd(ctx, 32);
        vc = bshd(ctx, 33);
        state_bytes = kv_bytes;
        call = [&] {
            attnkit::softmax_options o;
            o.causal = true;
            o.pool = pool;
            attnkit::softmax_attention(q1, kc, vc, out1, o);
        };
    } else if (variant == "taylor") {
        context();
        attnkit::taylor_options o;
        o.pool = pool;
        ts = std::make_unique<attnkit::taylor_state>(1, kH, kH, kD, kD, o);
        ts->step(qc, kc, vc, outc);
        // Running state per head: S (F x Dv) and z (F), F = 1 + D + D (D + 1) / 2.
        const double F = 1.0 + kD + kD * (kD + 1) / 2.0;
        state_bytes = kH * (F * kD + F) * sizeof(float);
        call = [&] { ts->step(q1, k1, v1, out1); };
    } else if (variant == "self_gating") {
        context();
        attnkit::self_gating_options o;
        o.pool = pool;
        gs = std::make_unique<attnkit::self_gating_state>(1, kH, kH, kD, kD, o);
        gs->step(qc, kc, vc, outc);
        state_bytes = kH * (kD + 2.0) * sizeof(float);  // (m, z, n[Dv]) per head
        call = [&] { gs->step(q1, k1, v1, out1); };
    } else if (variant == "static_qk") {
        context();
        attnkit::static_qk_options o;
        o.pool = pool;
        map = std::make_unique<attnkit::static_attention_map>(qc, kc, o);
        // The map's packed triangle plus the value cache.
        state_bytes = kH * static_cast<double>(ctx) * (ctx + 1) / 2.0 * sizeof(float) + kv_bytes / 2.0;
        call = [&] { map->apply(vc, out1, pool); };
    } else if (variant == "mta") {
        context();
        const attnkit::mta_options o = mta_layer().options(pool);
        ms = std::make_unique<attnkit::mta_state>(1, kH, kH, kD, kD, o);
        ms->step(qc, kc, vc, outc);
        // K and V, plus the c_q score rows and c_q probability rows (6 + 6, each [H][N]) that the
        // convolutions read.
        state_bytes = kv_bytes + 12.0 * kH * static_cast<double>(ctx) * sizeof(float);
        call = [&] { ms->step(q1, k1, v1, out1); };
    } else if (variant == "mlp") {
        mlp = std::make_unique<mlp_case>(1);
        state_bytes = 0.0;
        call = [&] { mlp->run(pool); };
    }
    }
};

decode_setup& cached_decode_setup(const std::string& variant, index_t ctx, int threads) {
    static std::string key;
    static std::unique_ptr<decode_setup> setup;
    const std::string k = variant + "/" + std::to_string(ctx) + "/" + std::to_string(threads);
    if (!setup || key != k) {
        setup.reset();  // free the previous case first: static maps take gigabytes
        setup = std::make_unique<decode_setup>(variant, ctx, threads);
        key = k;
    }
    return *setup;
}

void decode(benchmark::State& st, const std::string& variant, index_t ctx, int threads) {
    decode_setup& d = cached_decode_setup(variant, ctx, threads);
    d.call();
    for (auto _ : st) {
        d.call();
        benchmark::ClobberMemory();
    }
    set_decode_counters(st, ctx, d.state_bytes);
}

// ---- the decoder template ------------------------------------------------------------------

constexpr index_t kDecoderPrompt = 512, kDecoderSteps = 64;

void decoder_run(benchmark::State& st, const std::string& schedule, const std::string& variant, bool prefill_phase) {
    // One decoder kept across Google Benchmark's calls of the same case (weights, fixed stream).
    static std::string key;
    static std::unique_ptr<attnkit::model::decoder> cached;
    attnkit::model::decoder_config cfg;
    cfg.schedule = schedule;
    cfg.variant = attnkit::model::parse_attention_variant(variant);
    cfg.max_length = kDecoderPrompt + kDecoderSteps;
    std::vector<std::int32_t> prompt;
    for (index_t i = 0; i < kDecoderPrompt; ++i) prompt.push_back(static_cast<std::int32_t>((i * 131 + 7) % cfg.vocab));
    if (!cached || key != schedule + "/" + variant) {
        cached.reset();
        cached = std::make_unique<attnkit::model::decoder>(cfg);
        key = schedule + "/" + variant;
        cached->prefill(prompt);  // warm-up, and the context of the decode phase
    }
    attnkit::model::decoder& model = *cached;
    model.reset_profile();
    std::int32_t token = 1;
    for (auto _ : st) {
        if (prefill_phase) {
            benchmark::DoNotOptimize(model.prefill(prompt).data());
        } else {
            if (model.length() == cfg.max_length) {  // the cache is full: start again, untimed
                st.PauseTiming();
                model.prefill(prompt);
                st.ResumeTiming();
            }
            const std::vector<float> logits = model.decode_step(token);
            token = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        }
    }
    const double tokens = prefill_phase ? static_cast<double>(kDecoderPrompt) : 1.0;
    st.counters["tokens/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
    const attnkit::model::decoder_profile& p = model.profile();
    if (p.total() > 0) st.counters["kernel_gemm_frac"] = (p.kernels + p.gemm) / p.total();
}

void register_decoder(bool quick) {
    std::vector<std::string> schedules;
    for (const std::string& s : attnkit::model::hybrid_schedule_names())
        if (s != "even" && (!quick || s == "uniform" || s == "middle")) schedules.push_back(s);
    std::vector<std::string> variants;
    for (const auto& v : attnkit::model::attention_variant_names())
        if (v.first != "standard") variants.push_back(v.first);
    auto add = [](const std::string& sched, const std::string& var) {
        for (bool pf : {true, false}) {
            const std::string name = "decoder/" + sched + "/" + var + (pf ? "/prefill" : "/decode") + "/threads:1";
            // 0.2 s: one prefill of the prompt (~0.4 s) per repetition, ~25 decode steps.
            benchmark::RegisterBenchmark(name.c_str(), [sched, var, pf](benchmark::State& st) { decoder_run(st, sched, var, pf); })
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond)
                ->MinTime(0.2);
        }
    };
    add("uniform", "standard");
    for (const std::string& sched : schedules)
        for (const std::string& var : variants) add(sched, var);
}

void register_suite() {
    const bool quick = bench_quick();
    const std::vector<index_t> lengths =
        quick ? std::vector<index_t>{512, 1024, 2048, 4096} : std::vector<index_t>{512, 1024, 2048, 4096, 8192, 16384};
    const std::vector<index_t> contexts =
        quick ? std::vector<index_t>{1024, 4096} : std::vector<index_t>{1024, 4096, 8192, 16384, 32768};
    const index_t quadratic_state_limit = quick ? 4096 : 8192;
    const char* variants[] = {"softmax", "taylor", "self_gating", "static_qk", "mta", "mlp"};
    for (int t : kThreadCounts)
        for (const char* var : variants)
            for (index_t L : lengths) {
                // MTA's O(L^2) convolutions make L = 16384 a minute per call: stop at 8192.
                if (std::string(var) == "mta" && L > 8192) continue;
                const std::string name = std::string(var) + "/prefill/L:" + std::to_string(L) + "/D:" +
                                         std::to_string(kD) + "/H:" + std::to_string(kH) + "/threads:" + std::to_string(t);
                const std::string v = var;
                benchmark::RegisterBenchmark(name.c_str(), [v, L, t](benchmark::State& st) { prefill(st, v, L, t); })
                    ->UseRealTime()
                    ->Unit(benchmark::kMillisecond)
                    ->MinTime(L >= 8192 ? 0.5 : 0.2);
            }
    for (int t : kThreadCounts)
        for (const char* var : variants)
            for (index_t ctx : contexts) {
                const std::string v = var;
                if (v == "static_qk" && ctx > quadratic_state_limit) continue;
                const std::string name = v + "/decode/ctx:" + std::to_string(ctx) + "/D:" + std::to_string(kD) +
                                         "/H:" + std::to_string(kH) + "/threads:" + std::to_string(t);
                benchmark::RegisterBenchmark(name.c_str(), [v, ctx, t](benchmark::State& st) { decode(st, v, ctx, t); })
                    ->UseRealTime()
                    ->Unit(benchmark::kMillisecond);
            }
    register_decoder(quick);
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, [] { attnkit_bench::register_suite(); }); }
