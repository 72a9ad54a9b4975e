// attnkit benchmarks: Taylor ("Approximate") attention, both forms, the automatic choice, the
// decode state, and softmax_attention on the same shapes.
//
// Families (prefill, names <family>/L:<L>/D:<D>/H:8/causal:<0|1>/threads:<t>):
//   taylor_quadratic   attnkit::taylor_attention, opts.form = quadratic (the tile engine)
//   taylor_linear      attnkit::taylor_attention, opts.form = linear (chunked feature map)
//   taylor_automatic   attnkit::taylor_attention, opts.form = automatic (the cost model)
//   taylor_linear_full the linear kernel with the full D^2 split instead of the symmetric map
//                      (the measurement behind linear.hpp's choice; L = 4096 only)
//   softmax            attnkit::softmax_attention, same shapes and mask
//   taylor_reference   attnkit::reference::taylor_attention (double loops), L = 512, 1 thread
// Counters: FLOP/s and peak_frac count each algorithm's own arithmetic (quadratic and softmax:
// 2 (D + Dv) per visible pair and head, as flops.hpp; linear: 2 F (Dv + 1) per query head row
// and per key/value head key, plus the chunk-local pairs), so peak_frac says how well a form
// runs (automatic: the work of the form it picks); the time (and the ratio of times) says
// which form is faster.
//
// State prefill (names <family>/L:<L>/D:64/H:8/causal:1/threads:<t>, L in {512, 4096}):
//   taylor_state_prefill         reset() and one taylor_state::step of L tokens (form = automatic:
//                                quadratic below the state's crossover, 5061 here, linear above)
//   taylor_state_prefill_linear  the same with opts.form = linear (the always-linear state)
// Counter: tokens/s.
//
// Decode (names <family>/decode/Lk:<N>/D:64/H:8/threads:<t>), N in 512..32K:
//   taylor_state_step  one taylor_state::step of one token with N tokens already in the state
//                      (the state is filled once per thread count, outside the timing, and
//                      refilled outside the timing after 256 steps, so it stays near N)
//   taylor_state_step_linear  the same with opts.form = linear
//   softmax_decode     softmax_attention with Lq = 1 against an N-token K/V cache
// Counters: state_bytes (the whole state, read once per step) or kv_bytes (the K/V cache read
// per step), GB/s and bw_frac (over the measured DRAM read bandwidth; the 4.8 MB state of
// H = 8, D = 64 stays in the last-level cache between steps, so its bw_frac can exceed 1).
//
// Shapes: B = 1, H = Hk = 8, L in {512, ..., 16384}, D in {64, 128}, causal 0/1, threads 1, 2.
// ATTNKIT_BENCH_QUICK=1 drops L >= 8192 and decode contexts above 16K. Cases of more than
// 1e11 FLOPs run one iteration per repetition. Outputs are spot-checked against a double
// recomputation (rows 0, L/2, L-1 of heads 0 and 7) after the timing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "attnkit/reference/taylor_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/taylor_attention.hpp"
#include "common/attention_harness.hpp"
#include "common/bench_main.hpp"
#include "common/flops.hpp"
#include "common/machine.hpp"

namespace attnkit_bench {
namespace {

enum class fam { quadratic, linear, automatic, linear_full, softmax, reference };
const char* fam_name(fam f) {
    switch (f) {
        case fam::quadratic: return "taylor_quadratic";
        case fam::linear: return "taylor_linear";
        case fam::automatic: return "taylor_automatic";
        case fam::linear_full: return "taylor_linear_full";
        case fam::softmax: return "softmax";
        case fam::reference: return "taylor_reference";
    }
    return "?";
}

double pairs_of(const attn_dims& d, bool causal) {
    attnkit::softmax_options o;
    o.causal = causal;
    return static_cast<double>(visible_pairs(d, o));
}

// Each algorithm's own FLOPs (see the header comment).
double work_flops(fam f, const attn_dims& d, bool causal) {
    const double D = static_cast<double>(d.D), Dv = static_cast<double>(d.Dv);
    const double quad = pairs_of(d, causal) * static_cast<double>(d.H) * 2.0 * (D + Dv);
    if (f == fam::automatic) {  // the work of the form the cost model picks
        attnkit::taylor_options o;
        o.causal = causal;
        const attnkit::detail::attention_shape s{d.B, d.Lq, d.Lk, d.H, d.Hk, d.D, d.Dv};
        f = attnkit::detail::taylor::choose_form(s, o) == attnkit::taylor_form::linear ? fam::linear
                                                                                        : fam::quadratic;
    }
    if (f != fam::linear && f != fam::linear_full) return quad;
    const double F = f == fam::linear ? 1.0 + D + D * (D + 1.0) / 2.0 : 1.0 + D + D * D;
    const double rows = static_cast<double>(d.B) * static_cast<double>(d.Lq * d.H + d.Lk * d.Hk);
    const double local = causal ? static_cast<double>(d.B * d.Lq * d.H) * 0.5 *
                                      static_cast<double>(attnkit::detail::taylor::kChunk) * 2.0 * (D + Dv)
                                : 0.0;
    return rows * 2.0 * F * (Dv + 1.0) + local;
}

// Max |error| / (1 + |ref|) over spot rows, ref in double (Taylor or softmax).
double spot_error(fam f, const attn_inputs& in, bool causal) {
    const attn_dims& d = in.dims;
    const tensor4& q = in.q;
    const tensor4& k = in.k[0];
    const tensor4& v = in.v[0];
    const double scale = 1.0 / std::sqrt(static_cast<double>(d.D));
    double worst = 0.0;
    std::vector<double> s(static_cast<std::size_t>(d.Lk)), o(static_cast<std::size_t>(d.Dv));
    for (std::int64_t i : {std::int64_t(0), d.Lq / 2, d.Lq - 1})
        for (std::int64_t h : {std::int64_t(0), d.H - 1}) {
            const std::int64_t kh = h / (d.H / d.Hk), n = causal ? i + d.Lk - d.Lq + 1 : d.Lk;
            double m = -1e300, z = 0.0;
            for (std::int64_t j = 0; j < n; ++j) {
                double acc = 0.0;
                for (std::int64_t c = 0; c < d.D; ++c) acc += static_cast<double>(q(0, i, h, c)) * k(0, j, kh, c);
                s[static_cast<std::size_t>(j)] = acc * scale;
                m = std::max(m, acc * scale);
            }
            std::fill(o.begin(), o.end(), 0.0);
            for (std::int64_t j = 0; j < n; ++j) {
                const double x = s[static_cast<std::size_t>(j)];
                const double w = f == fam::softmax ? std::exp(x - m) : 1.0 + x + 0.5 * x * x;
                z += w;
                for (std::int64_t c = 0; c < d.Dv; ++c) o[static_cast<std::size_t>(c)] += w * v(0, j, kh, c);
            }
            if (f != fam::softmax) z += 1e-6;
            for (std::int64_t c = 0; c < d.Dv; ++c) {
                const double ref = o[static_cast<std::size_t>(c)] / z, got = in.out(0, i, h, c);
                const double e = std::abs(got - ref) / (1.0 + std::abs(ref));
                worst = std::isfinite(got) ? std::max(worst, e) : 1e300;
            }
        }
    return worst;
}

void call(fam f, const attn_inputs& in, tensor4& out, bool causal, attnkit::thread_pool* pool) {
    const tensor4& k = in.k[0];
    const tensor4& v = in.v[0];
    if (f == fam::softmax) {
        attnkit::softmax_options o;
        o.causal = causal;
        o.pool = pool;
        attnkit::softmax_attention(in.q, k, v, out, o);
        return;
    }
    attnkit::taylor_options o;
    o.causal = causal;
    o.pool = pool;
    switch (f) {
        case fam::quadratic: o.form = attnkit::taylor_form::quadratic; break;
        case fam::linear: o.form = attnkit::taylor_form::linear; break;
        case fam::linear_full: {
            using A = attnkit::simd::default_arch;
            attnkit::detail::taylor::linear_forward_split<A>(in.q, k, v, out, o,
                                                             attnkit::detail::taylor::feature_split::full);
            return;
        }
        case fam::reference: attnkit::reference::taylor_attention(in.q, k, v, out, o); return;
        default: break;
    }
    attnkit::taylor_attention(in.q, k, v, out, o);
}

void run_prefill(benchmark::State& state, fam f, const attn_case& c) {
    attn_inputs& in = inputs_for(c);
    attnkit::thread_pool* pool = shared_pool(c.threads);
    std::fill_n(in.out.data(), in.out.size(), std::numeric_limits<float>::quiet_NaN());
    const auto t0 = clock_type::now();
    for (auto _ : state) {
        call(f, in, in.out, c.causal, pool);
        benchmark::ClobberMemory();
    }
    const double seconds = seconds_since(t0);
    const double err = spot_error(f, in, c.causal);
    if (!(err <= 2e-3)) {
        state.SkipWithError(("output mismatch against the double recomputation: " + std::to_string(err)).c_str());
        return;
    }
    const double flops = work_flops(f, c.dims, c.causal), iters = static_cast<double>(state.iterations());
    state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["peak_frac"] = flops * iters / seconds / machine_peak_flops(c.threads);
}

// One state per thread count, filled up to the context of the case (cases run in increasing
// context, so each fill only appends).
struct decode_fixture {
    std::unique_ptr<attnkit::taylor_state> st;
    tensor4 q1, k1, v1, out1;
};

void run_state_step(benchmark::State& state, const attn_case& c, attnkit::taylor_form form) {
    static std::map<int, decode_fixture> fixtures;
    const attn_dims& d = c.dims;
    decode_fixture& fx = fixtures[c.threads * 4 + static_cast<int>(form)];
    attnkit::taylor_options o;
    o.pool = shared_pool(c.threads);
    o.form = form;
    // A fresh state when there is none or it has run past the context, then append up to it.
    const auto fill = [&] {
        if (!fx.st || fx.st->length() > d.Lk + 256) {
            fx.st = std::make_unique<attnkit::taylor_state>(d.B, d.H, d.Hk, d.D, d.Dv, o);
            fx.q1 = random_tensor(d.B, 1, d.H, d.D, 5);
            fx.k1 = random_tensor(d.B, 1, d.Hk, d.D, 6);
            fx.v1 = random_tensor(d.B, 1, d.Hk, d.Dv, 7);
            fx.out1 = tensor4(d.B, 1, d.H, d.Dv);
        }
        const std::int64_t n = d.Lk - fx.st->length();
        if (n > 0) {
            const tensor4 q = random_tensor(d.B, n, d.H, d.D, 11), k = random_tensor(d.B, n, d.Hk, d.D, 12);
            const tensor4 v = random_tensor(d.B, n, d.Hk, d.Dv, 13);
            tensor4 out(d.B, n, d.H, d.Dv);
            fx.st->step(q, k, v, out);
        }
    };
    fill();
    // Time per step without the refills (after 256 steps; an automatic state near its
    // crossover would otherwise fold inside the timing).
    double seconds = 0.0;
    auto t0 = clock_type::now();
    for (auto _ : state) {
        fx.st->step(fx.q1, fx.k1, fx.v1, fx.out1);
        benchmark::ClobberMemory();
        if (fx.st->length() > d.Lk + 256) {
            state.PauseTiming();
            seconds += seconds_since(t0);
            fill();
            t0 = clock_type::now();
            state.ResumeTiming();
        }
    }
    seconds += seconds_since(t0);
    const double iters = static_cast<double>(state.iterations());
    for (std::int64_t x = 0; x < fx.out1.size(); ++x)
        if (!std::isfinite(fx.out1.data()[x])) return state.SkipWithError("non-finite decode output");
    // Bytes read per step: the whole linear state (a chunk update, every 64th step, writes it
    // too), or the cached K and V of a quadratic state.
    const bool quadratic = fx.st->form() == attnkit::taylor_form::quadratic;
    const double bytes = quadratic ? 4.0 * static_cast<double>(d.B * d.Hk * (d.D + d.Dv) * fx.st->length())
                                   : static_cast<double>(fx.st->state_bytes());
    state.counters["state_bytes"] = static_cast<double>(fx.st->state_bytes());
    state.counters["quadratic"] = quadratic ? 1.0 : 0.0;
    state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["bw_frac"] = bytes * iters / seconds / dram_read_bandwidth(c.threads);
}

// reset() and one step of the whole prompt, as a decoder's prefill does.
void run_state_prefill(benchmark::State& state, const attn_case& c, attnkit::taylor_form form) {
    attn_inputs& in = inputs_for(c);
    const attn_dims& d = c.dims;
    attnkit::taylor_options o;
    o.pool = shared_pool(c.threads);
    o.form = form;
    attnkit::taylor_state st(d.B, d.H, d.Hk, d.D, d.Dv, o);
    std::fill_n(in.out.data(), in.out.size(), std::numeric_limits<float>::quiet_NaN());
    for (auto _ : state) {
        st.reset();
        st.step(in.q, in.k[0], in.v[0], in.out);
        benchmark::ClobberMemory();
    }
    const double err = spot_error(fam::quadratic, in, true);
    if (!(err <= 2e-3)) {
        state.SkipWithError(("output mismatch against the double recomputation: " + std::to_string(err)).c_str());
        return;
    }
    state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(d.Lq), benchmark::Counter::kIsIterationInvariantRate);
    state.counters["state_bytes"] = static_cast<double>(st.state_bytes());
}

void run_softmax_decode(benchmark::State& state, const attn_case& c) {
    attn_inputs& in = inputs_for(c);
    attnkit::softmax_options o;
    o.causal = true;
    o.pool = shared_pool(c.threads);
    std::size_t slot = 0;
    const auto t0 = clock_type::now();
    for (auto _ : state) {
        attnkit::softmax_attention(in.q, in.k[slot], in.v[slot], in.out, o);
        if (++slot == in.k.size()) slot = 0;
        benchmark::ClobberMemory();
    }
    const double seconds = seconds_since(t0), iters = static_cast<double>(state.iterations());
    const double bytes = kv_bytes(c.dims, o);
    state.counters["kv_bytes"] = bytes;
    state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["bw_frac"] = bytes * iters / seconds / dram_read_bandwidth(c.threads);
}

void register_all() {
    const bool quick = bench_quick();
    for (std::int64_t L : {512, 1024, 2048, 4096, 8192, 16384}) {
        if (quick && L >= 8192) continue;
        for (std::int64_t D : {64, 128})
            for (bool causal : {false, true})
                for (int t : kThreadCounts) {
                    const attn_case c = prefill_case(L, D, 8, 8, causal, t);
                    for (fam f : {fam::quadratic, fam::linear, fam::automatic, fam::linear_full, fam::softmax,
                                  fam::reference}) {
                        if (f == fam::linear_full && L != 4096) continue;
                        if (f == fam::reference && (L != 512 || t != 1 || D != 64)) continue;
                        auto* b = benchmark::RegisterBenchmark((std::string(fam_name(f)) + "/" + c.name()).c_str(),
                                                               [f, c](benchmark::State& st) { run_prefill(st, f, c); });
                        b->UseRealTime()->Unit(benchmark::kMillisecond);
                        const double fl = work_flops(f == fam::reference ? fam::quadratic : f, c.dims, causal);
                        if (f == fam::reference || fl > 1e11) b->Iterations(1);
                    }
                }
    }
    for (int t : kThreadCounts)
        for (std::int64_t L : {512, 4096}) {
            const attn_case c = prefill_case(L, 64, 8, 8, true, t);
            for (const auto form : {attnkit::taylor_form::automatic, attnkit::taylor_form::linear}) {
                const std::string fam = form == attnkit::taylor_form::linear ? "taylor_state_prefill_linear/"
                                                                             : "taylor_state_prefill/";
                benchmark::RegisterBenchmark((fam + c.name()).c_str(),
                                             [c, form](benchmark::State& st) { run_state_prefill(st, c, form); })
                    ->UseRealTime()
                    ->Unit(benchmark::kMillisecond);
            }
        }
    for (int t : kThreadCounts)
        for (std::int64_t N : {512, 1024, 2048, 4096, 8192, 16384, 32768}) {
            if (quick && N > 16384) continue;
            const attn_case c = decode_case(N, 64, 8, 8, t);
            for (const auto form : {attnkit::taylor_form::automatic, attnkit::taylor_form::linear}) {
                const std::string fam =
                    form == attnkit::taylor_form::linear ? "taylor_state_step_linear/" : "taylor_state_step/";
                benchmark::RegisterBenchmark((fam + c.name()).c_str(),
                                             [c, form](benchmark::State& st) { run_state_step(st, c, form); })
                    ->UseRealTime()
                    ->Unit(benchmark::kMillisecond);
            }
            benchmark::RegisterBenchmark(("softmax_decode/" + c.name()).c_str(),
                                         [c](benchmark::State& st) { run_softmax_decode(st, c); })
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        }
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, [] { attnkit_bench::register_all(); }); }
