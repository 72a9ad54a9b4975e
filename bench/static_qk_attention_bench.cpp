// attnkit benchmarks: static QK attention (RndEmbQK / FixedSeqQK), against softmax attention on
// the same shapes in the same run.
//
// Families (rows "<family>/B:<B>/L:<L>/D:<D>/H:<H>/threads:<n>"):
//   softmax      attnkit::softmax_attention, causal, a separate Q and K per batch item: what a
//                framework does for these variants (recompute everything per item).
//   static_qk    attnkit::static_qk_attention(q_fixed, k_fixed, v, out): scores once, B value sets.
//   map_apply    static_attention_map::apply(v, out, pool) with the map built beforehand.
//   map_build    building the map from q_fixed, k_fixed (B-independent, listed at B = 1).
//   reference    attnkit::reference::static_qk_attention, one thread, small L only.
// Counters: FLOP/s (each family's useful work: a causal head has L (L + 1) / 2 pairs, 2 D FLOPs
// per pair for a score and 2 Dv for a value update; softmax counts B score sets, static_qk and
// the reference one), peak_frac (over the FMA peak measured by this run), and x_softmax: the
// family's time over the median time of `softmax` on the same case in this run.
//
// Shapes: B in {1, 8}, L in {1024, 2048, 4096}, H = 8, D = Dv = 64, threads 1 and 2; plus L = 256
// with the reference. ATTNKIT_BENCH_QUICK=1 drops L = 4096.
// Targets (issue 9), B = 8, L = 2048, 1 thread: static_qk x_softmax <= 0.6, map_apply <= 0.55.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "attnkit/reference/static_qk_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/static_qk_attention.hpp"
#include "common/attention_harness.hpp"
#include "common/bench_main.hpp"
#include "common/machine.hpp"

namespace attnkit_bench {
namespace {

struct sq_case {
    std::int64_t B, L, H, D;
    int threads;
    std::string name() const {
        std::ostringstream s;
        s << "B:" << B << "/L:" << L << "/D:" << D << "/H:" << H << "/threads:" << threads;
        return s.str();
    }
    double pairs() const { return static_cast<double>(H) * static_cast<double>(L) * (L + 1) / 2.0; }
};

// Inputs of the current shape (benchmarks run case-major): the fixed stream, per-item Q and K for
// softmax, the values, and the map (built once, outside any timing).
struct sq_inputs {
    std::int64_t B = -1, L = -1, H = -1, D = -1;
    tensor4 qf, kf, q, k, v, out;
    std::unique_ptr<attnkit::static_attention_map> map;
};

sq_inputs& inputs_for(const sq_case& c) {
    static sq_inputs in;
    if (in.B == c.B && in.L == c.L && in.H == c.H && in.D == c.D) return in;
    release_stream_buffer();
    const bool same_stream = in.L == c.L && in.H == c.H && in.D == c.D;
    if (!same_stream) {
        in.map.reset();
        in.qf = random_tensor(1, c.L, c.H, c.D, 11 + c.L);
        in.kf = random_tensor(1, c.L, c.H, c.D, 12 + c.L);
        in.map = std::make_unique<attnkit::static_attention_map>(in.qf, in.kf);
    }
    in.q = random_tensor(c.B, c.L, c.H, c.D, 13 + c.L * c.B);
    in.k = random_tensor(c.B, c.L, c.H, c.D, 14 + c.L * c.B);
    in.v = random_tensor(c.B, c.L, c.H, c.D, 15 + c.L * c.B);
    in.out = tensor4(c.B, c.L, c.H, c.D);
    in.B = c.B, in.L = c.L, in.H = c.H, in.D = c.D;
    return in;
}

// A few rows of out against a double recomputation from the fixed stream (not for softmax,
// whose Q and K differ per item); empty when fine.
std::string check_static(const sq_inputs& in) {
    const std::int64_t L = in.L, H = in.H, D = in.D;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    std::vector<double> s(static_cast<std::size_t>(L));
    for (std::int64_t b : {std::int64_t(0), in.B - 1})
        for (std::int64_t i : {std::int64_t(0), L / 3, L - 1})
            for (std::int64_t h : {std::int64_t(0), H - 1}) {
                double m = -1e300, z = 0;
                for (std::int64_t j = 0; j <= i; ++j) {
                    double acc = 0;
                    for (std::int64_t d = 0; d < D; ++d) acc += double(in.qf(0, i, h, d)) * in.kf(0, j, h, d);
                    s[j] = acc * scale;
                    m = std::max(m, s[j]);
                }
                for (std::int64_t j = 0; j <= i; ++j) z += std::exp(s[j] - m);
                for (std::int64_t c = 0; c < D; ++c) {
                    double o = 0;
                    for (std::int64_t j = 0; j <= i; ++j) o += std::exp(s[j] - m) / z * in.v(b, j, h, c);
                    if (!(std::abs(in.out(b, i, h, c) - o) <= 2e-3 * (1 + std::abs(o)))) {
                        std::ostringstream e;
                        e << "mismatch at (" << b << ", " << i << ", " << h << ", " << c << "): " << in.out(b, i, h, c)
                          << " vs " << o;
                        return e.str();
                    }
                }
            }
    return {};
}

std::map<std::string, std::vector<double>>& softmax_times() {
    static std::map<std::string, std::vector<double>> t;
    return t;
}

enum class fam { softmax, static_qk, map_apply, map_build, reference };

void run(benchmark::State& state, fam f, sq_case c) {
    sq_inputs& in = inputs_for(c);
    attnkit::thread_pool* pool = shared_pool(c.threads);
    attnkit::softmax_options so;
    so.causal = true;
    so.pool = pool;
    attnkit::static_qk_options qo;
    qo.pool = pool;
    const double score = c.pairs() * 2.0 * c.D, value = c.pairs() * 2.0 * c.D * c.B;
    double flops = 0;
    const auto t0 = clock_type::now();
    for (auto _ : state) {
        switch (f) {
            case fam::softmax:
                attnkit::softmax_attention(in.q, in.k, in.v, in.out, so);
                flops = c.B * score + value;
                break;
            case fam::static_qk:
                attnkit::static_qk_attention(in.qf, in.kf, in.v, in.out, qo);
                flops = score + value;
                break;
            case fam::map_apply:
                in.map->apply(in.v, in.out, pool);
                flops = value;
                break;
            case fam::map_build: {
                attnkit::static_attention_map m(in.qf, in.kf, qo);
                benchmark::DoNotOptimize(m.row(0, 0));
                flops = score;
                break;
            }
            case fam::reference:
                attnkit::reference::static_qk_attention(in.qf, in.kf, in.v, in.out);
                flops = score + value;
                break;
        }
        benchmark::ClobberMemory();
    }
    const double per_iter = seconds_since(t0) / static_cast<double>(state.iterations());
    if (f != fam::softmax && f != fam::map_build) {
        const std::string err = check_static(in);
        if (!err.empty()) return state.SkipWithError(err.c_str());
    }
    state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["peak_frac"] = flops / per_iter / machine_peak_flops(c.threads);
    std::vector<double>& st = softmax_times()[c.name()];
    if (f == fam::softmax) {
        st.push_back(per_iter);
    } else if (!st.empty()) {
        std::vector<double> t = st;
        std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
        state.counters["x_softmax"] = per_iter / t[t.size() / 2];
    }
}

void register_all() {
    const std::pair<fam, const char*> fams[] = {{fam::softmax, "softmax"},
                                                {fam::static_qk, "static_qk"},
                                                {fam::map_apply, "map_apply"},
                                                {fam::map_build, "map_build"},
                                                {fam::reference, "reference"}};
    std::vector<std::int64_t> lens{256, 1024, 2048};
    if (!bench_quick()) lens.push_back(4096);
    for (std::int64_t L : lens)
        for (std::int64_t B : {1, 8})
            for (int t : kThreadCounts) {
                const sq_case c{B, L, 8, 64, t};
                for (const auto& f : fams) {
                    if (f.first == fam::reference && (L > 256 || t != 1)) continue;
                    if (f.first == fam::map_build && B != 1) continue;
                    auto* b = benchmark::RegisterBenchmark((std::string(f.second) + "/" + c.name()).c_str(),
                                                           [f, c](benchmark::State& s) { run(s, f.first, c); });
                    b->UseRealTime()->Unit(benchmark::kMillisecond);
                    if (f.first == fam::reference) b->Iterations(1)->Repetitions(1);
                }
            }
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, attnkit_bench::register_all); }
