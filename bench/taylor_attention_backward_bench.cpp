// attnkit benchmarks: the backward pass of Taylor ("Approximate") attention, both forms.
//
// Families, on the same shapes and inputs (names <family>/L:<L>/D:<D>/H:8/causal:1/threads:<t>):
//   forward    attnkit::taylor_attention, form = automatic (the pass a training step runs first)
//   quadratic  attnkit::taylor_attention_backward, form = quadratic (the backward tile kernel)
//   linear     attnkit::taylor_attention_backward, form = linear (feature-map states)
//   automatic  attnkit::taylor_attention_backward, form = automatic (the backward cost model;
//              counter linear_form: 1 where it picks the linear form, 0 for the quadratic one)
// Counters: FLOP/s and peak_frac against the FMA peak of the same run (common/bench_main.hpp),
// every backward family's FLOPs counted as the quadratic form's, 2.5x the forward's quadratic
// FLOPs (five products against two, as the softmax backward bench counts them; common/flops.hpp
// for the forward), so that the counter compares the forms' times on one scale (for the
// quadratic family it is its own arithmetic; the row sums Z, ~D^2 per row and key, are not
// counted); extra_MiB, the peak of heap bytes allocated during one call beyond what was live
// before it.
//
// Shapes: B = 1, H = Hk = 8, causal; D = 128 at L in {1024, 2048, 4096}; D = 64 at L in
// {1024, ..., 16384} (the crossover and the long-sequence case); threads 1 and 2. Cases of more
// than 1e11 counted FLOPs run one iteration per repetition. ATTNKIT_BENCH_QUICK=1 stops at 4096.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "attnkit/eigen.hpp"
#include <benchmark/benchmark.h>

#include "attnkit/taylor_attention_backward.hpp"
#include "common/bench_main.hpp"
#include "common/heap_counter.hpp"
#include "common/flops.hpp"


namespace attnkit_bench {
namespace {

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using attnkit::index_t;
using attnkit::taylor_form;

struct bwd_case {
    attn_dims dims;
    int threads = 1;
    std::string name() const {
        return "L:" + std::to_string(dims.Lq) + "/D:" + std::to_string(dims.D) + "/H:" + std::to_string(dims.H) +
               "/causal:1/threads:" + std::to_string(threads);
    }
    attnkit::taylor_options options(taylor_form f) const {
        attnkit::taylor_options o;
        o.causal = true;
        o.form = f;
        o.pool = shared_pool(threads);
        return o;
    }
};

struct problem {
    tensor4 q, k, v, dout, out, dq, dk, dv;
};

problem make_problem(const bwd_case& c) {
    const attn_dims& d = c.dims;
    problem p{tensor4(d.B, d.Lq, d.H, d.D),  tensor4(d.B, d.Lk, d.Hk, d.D), tensor4(d.B, d.Lk, d.Hk, d.Dv),
              tensor4(d.B, d.Lq, d.H, d.Dv), tensor4(d.B, d.Lq, d.H, d.Dv), tensor4(d.B, d.Lq, d.H, d.D),
              tensor4(d.B, d.Lk, d.Hk, d.D), tensor4(d.B, d.Lk, d.Hk, d.Dv)};
    std::uint64_t s = 0x9E3779B97F4A7C15ull;
    auto next = [&s] {  // xorshift: a fixed, library-independent sequence in [-1, 1)
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        return static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 - 1.0);
    };
    for (tensor4* t : {&p.q, &p.k, &p.v, &p.dout})
        for (index_t i = 0; i < t->size(); ++i) t->data()[i] = 2.0f * next();
    attnkit::taylor_attention(p.q, p.k, p.v, p.out, c.options(taylor_form::automatic));
    return p;
}

enum class family { forward, quadratic, linear, automatic };

double counted_flops(const bwd_case& c, family f) {
    attnkit::softmax_options so;
    so.causal = true;
    const double fwd = attention_flops(c.dims, so);
    return f == family::forward ? fwd : 2.5 * fwd;
}

void run_case(benchmark::State& state, const bwd_case& c, family f) {
    problem p = make_problem(c);
    const taylor_form form = f == family::quadratic ? taylor_form::quadratic
                             : f == family::linear  ? taylor_form::linear
                                                    : taylor_form::automatic;
    const attnkit::taylor_options o = c.options(form);
    auto call = [&] {
        if (f == family::forward)
            attnkit::taylor_attention(p.q, p.k, p.v, p.out, o);
        else
            attnkit::taylor_attention_backward(p.q, p.k, p.v, p.out, p.dout, p.dq, p.dk, p.dv, o);
    };
    time_counting_heap(state, call, counted_flops(c, f), c.threads);
    if (f == family::automatic) {
        // The form the backward's cost model picks here: the automatic row runs that form's code,
        // so its time is read against that form's own row (bench/scripts/training_targets.py).
        const attn_dims& d = c.dims;
        const attnkit::detail::attention_shape s{d.B, d.Lq, d.Lk, d.H, d.Hk, d.D, d.Dv};
        state.counters["linear_form"] =
            attnkit::detail::taylor::choose_backward_form(s, o) == taylor_form::linear ? 1.0 : 0.0;
    }
}

std::vector<bwd_case> cases() {
    std::vector<bwd_case> cs;
    const bool quick = bench_quick();
    auto add = [&](index_t L, index_t D) {
        if (quick && L > 4096) return;
        for (int t : kThreadCounts) {
            bwd_case c;
            c.dims = attn_dims{1, L, L, 8, 8, D, D};
            c.threads = t;
            cs.push_back(c);
        }
    };
    for (index_t L : {1024, 2048, 4096}) add(L, 128);
    for (index_t L : {1024, 2048, 4096, 8192, 16384}) add(L, 64);
    return cs;
}

void register_all() {
    for (const bwd_case& c : cases())
        for (family f : {family::forward, family::quadratic, family::linear, family::automatic}) {
            const char* fam = f == family::forward     ? "forward"
                              : f == family::quadratic ? "quadratic"
                              : f == family::linear    ? "linear"
                                                       : "automatic";
            auto* b = benchmark::RegisterBenchmark((std::string(fam) + "/" + c.name()).c_str(),
                                                   [c, f](benchmark::State& s) { run_case(s, c, f); });
            b->UseRealTime()->Unit(benchmark::kMillisecond);
            if (counted_flops(c, f) > 1e11) b->Iterations(1);
        }
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, attnkit_bench::register_all); }
