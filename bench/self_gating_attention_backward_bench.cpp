// attnkit benchmarks: the backward pass of self-gating ("Non-approximate") attention, memory-bound.
//
// Families (names "<family>/L:../D:../H:../causal:1/threads:N"), B = 1, H = Hk = 8, D = Dv = 128,
// causal, L in {4096, 32768}, threads 1 and 2:
//   backward      attnkit::self_gating_attention_backward
//   backward_lse  the same given the forward's lse (self_gating_attention(q, k, v, out, lse)):
//                 no pass over q and k for the rows' statistics
//   forward       attnkit::self_gating_attention on the same inputs (the pass a training step runs first)
//   forward_lse   the same, also writing lse
//   traffic       no attention: a plain loop that moves the backward's bytes over the same
//                 tensors in the backward's order (positions and rows descending; per vector five
//                 loads, one sum, three streamed stores), the yardstick of what the placement
//                 allows; with threads, tasks of 64 positions from the last down, which the pool
//                 hands out in batches
// "/probe:alternating" (backward_lse and traffic at L 32768): each iteration also runs one pass
// of the 8-stream read probe, alternately before and after the call; counters call_ms (median)
// and frac_alternating (median per iteration of the call's bytes per second over the probe
// pass's next to it), a fraction of the read bandwidth that the host's drift between the
// program's start and the benchmark does not move.
// Layouts: the plain names use Eigen::Tensor allocations, one after another as a program makes
// them (equal 128 MiB tensors then start 2^27 + 4 KiB apart); "/layout:apart" runs the backward
// on the same values placed by common/placement.hpp's spaced_arena (start to start 2^27 + 4 MiB
// + 4 KiB, at Eigen's offset into a page), which separates what the kernel costs from what the
// natural placement costs on some cores.
// Counters: GB/s = the bytes one backward must move once (q, k, v, out and d_out read; d_q, d_k
// and d_v written: 8 L H D floats) per second, for both families, so that their times compare;
// bw_frac = that over the 8-stream DRAM read bandwidth measured in the same run with as many
// threads (common/bench_main.hpp). The backward without lse reads q and k twice (its gates pass,
// then the reverse scan): the counted bytes are the minimum, not what crosses the bus.
// After the timed loop the gradients are checked: finite, and a few tokens of two heads against a
// double recomputation, otherwise SkipWithError.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include "attnkit/eigen.hpp"

#include "attnkit/self_gating_attention.hpp"
#include "attnkit/self_gating_attention_backward.hpp"
#include "common/bench_main.hpp"
#include "common/machine.hpp"
#include "common/placement.hpp"

namespace attnkit_bench {
namespace {

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using map4 = Eigen::TensorMap<tensor4>;
using map3 = Eigen::TensorMap<Eigen::Tensor<float, 3, Eigen::RowMajor>>;
constexpr std::int64_t kH = 8, kD = 128;
// Iterations of the "/probe:alternating" rows: a median over this many call / probe pairs.
constexpr int kAlternatingIterations = 15;

struct inputs {
    tensor4 q, k, v, out, dout;
    Eigen::Tensor<float, 3, Eigen::RowMajor> lse;
};

enum class family { backward, backward_lse, forward, forward_lse, traffic };
enum class layout { natural, apart };

const inputs& inputs_for(std::int64_t L) {
    static std::map<std::int64_t, std::unique_ptr<inputs>> cache;
    auto& p = cache[L];
    if (!p) {
        p = std::make_unique<inputs>();
        std::uint64_t s = 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(L);
        auto next = [&] {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            return static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-53);
        };
        for (tensor4* t : {&p->q, &p->k, &p->v, &p->dout}) {
            t->resize(1, L, kH, kD);
            for (std::int64_t i = 0; i < t->size(); ++i) t->data()[i] = (next() + next() + next() - 1.5f) * 2.0f;
        }
        p->out.resize(1, L, kH, kD);
        p->lse.resize(1, L, kH);
        attnkit::self_gating_options o;
        o.causal = true;
        attnkit::self_gating_attention(p->q, p->k, p->v, p->out, p->lse, o);
    }
    return *p;
}

// The inputs' values and room for the gradients in a spaced_arena (layout:apart).
struct spaced_inputs {
    // At Eigen's own offset into a page (32 bytes with AVX, 64 with AVX-512).
    explicit spaced_inputs(const inputs& in)
        : arena(sizes(in), reinterpret_cast<std::uintptr_t>(in.q.data()) % spaced_arena::kPage) {
        const tensor4* src[5] = {&in.q, &in.k, &in.v, &in.out, &in.dout};
        for (int t = 0; t < 5; ++t) std::copy(src[t]->data(), src[t]->data() + src[t]->size(), arena[t]);
        std::copy(in.lse.data(), in.lse.data() + in.lse.size(), arena[8]);
    }
    // q, k, v, out, d_out, d_q, d_k, d_v, lse.
    static std::vector<std::size_t> sizes(const inputs& in) {
        std::vector<std::size_t> n(8, static_cast<std::size_t>(in.q.size()));
        n.push_back(static_cast<std::size_t>(in.lse.size()));
        return n;
    }
    spaced_arena arena;
};

const spaced_inputs& spaced_inputs_for(std::int64_t L) {
    static std::map<std::int64_t, std::unique_ptr<spaced_inputs>> cache;
    auto& p = cache[L];
    if (!p) p = std::make_unique<spaced_inputs>(inputs_for(L));
    return *p;
}

// family::traffic: positions [l0, l1) of the tensors p[0..4] (read) and p[5..7] (written), rows
// of kH * kD floats, descending; streamed stores where the rows allow them, as the backward's.
// Returns the sum of what it read.
float move_traffic(float* const* p, std::int64_t l0, std::int64_t l1) {
    using A = attnkit::simd::default_arch;
    using V = attnkit::simd::vfloat<A>;
    constexpr std::int64_t W = attnkit::simd::kLanes<A>, R = kH * kD;
    const bool stream = attnkit::simd::stream_aligned<A>(p[5]) && attnkit::simd::stream_aligned<A>(p[6]) &&
                        attnkit::simd::stream_aligned<A>(p[7]);  // rows of R floats keep it
    V acc(0.0f);
    for (std::int64_t l = l1 - 1; l >= l0; --l) {
        const std::int64_t base = l * R;
        for (std::int64_t c = R - W; c >= 0; c -= W) {
            V x = attnkit::simd::loadu<A>(p[0] + base + c);
            for (int t = 1; t < 5; ++t) x = x + attnkit::simd::loadu<A>(p[t] + base + c);
            acc = acc + x;
            for (int t = 5; t < 8; ++t) {
                if (stream)
                    attnkit::simd::stream_store(p[t] + base + c, x);
                else
                    attnkit::simd::storeu(p[t] + base + c, x);
            }
        }
    }
    attnkit::simd::store_fence();
    return attnkit::simd::hsum(acc);
}

double bytes_of(std::int64_t L) { return 8.0 * static_cast<double>(L * kH * kD) * sizeof(float); }

// Tokens j of heads 0 and H-1 against a double recomputation of d_v_j = sum_{i >= j} w_ij dO_i
// and d_q_j = scale k_j sum_{i >= j} w_ij (<dO_i, v_j> - <dO_i, O_i>).
bool check(const inputs& in, const map4& dq, const map4& dv, std::string& why) {
    for (const map4* t : {&dq, &dv})
        for (std::int64_t i = 0; i < t->size(); ++i)
            if (!std::isfinite(t->data()[i])) return why = "non-finite gradient", false;
    const std::int64_t L = in.q.dimension(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
    for (std::int64_t h : {std::int64_t(0), kH - 1}) {
        std::vector<double> g(static_cast<std::size_t>(L)), m(g.size()), z(g.size());
        double mm = -HUGE_VAL, zz = 0;
        for (std::int64_t j = 0; j < L; ++j) {
            double s = 0;
            for (std::int64_t d = 0; d < kD; ++d) s += double(in.q(0, j, h, d)) * double(in.k(0, j, h, d));
            g[j] = scale * s;
            const double nm = std::max(mm, g[j]);
            zz = zz * std::exp(mm - nm) + std::exp(g[j] - nm);
            mm = nm;
            m[j] = mm, z[j] = zz;
        }
        for (std::int64_t j : {L - 1, L - 2, L - 64}) {
            double dqs = 0;
            std::vector<double> dvj(kD, 0.0);
            for (std::int64_t i = j; i < L; ++i) {
                const double w = std::exp(g[j] - m[i]) / z[i];
                double a = 0, b = 0;
                for (std::int64_t c = 0; c < kD; ++c) {
                    a += double(in.dout(0, i, h, c)) * double(in.v(0, j, h, c));
                    b += double(in.dout(0, i, h, c)) * double(in.out(0, i, h, c));
                    dvj[c] += w * in.dout(0, i, h, c);
                }
                dqs += w * (a - b);
            }
            for (std::int64_t c = 0; c < kD; ++c) {
                if (std::fabs(dvj[c] - dv(0, j, h, c)) > 1e-3 * (1.0 + std::fabs(dvj[c])))
                    return why = "d_v of token " + std::to_string(j) + " differs", false;
                const double want = scale * dqs * in.k(0, j, h, c);
                if (std::fabs(want - dq(0, j, h, c)) > 1e-3 * (1.0 + std::fabs(want)))
                    return why = "d_q of token " + std::to_string(j) + " differs", false;
            }
        }
    }
    return true;
}

void BM_case(benchmark::State& state, family f, std::int64_t L, int threads, layout where, bool alternating) {
    const inputs& in = inputs_for(L);
    const bool fwd = f == family::forward || f == family::forward_lse;
    // The gradients first, then the forward's outputs (only for the forward families): in the
    // natural placement the gradients follow the inputs as a program would allocate them.
    tensor4 dq_t, dk_t, dv_t, out_t;
    Eigen::Tensor<float, 3, Eigen::RowMajor> lse_t;
    // The tensors the call reads and writes, as maps over either placement.
    float* p[9];
    if (where == layout::apart) {
        const spaced_inputs& sp = spaced_inputs_for(L);
        for (int t = 0; t < 9; ++t) p[t] = sp.arena[static_cast<std::size_t>(t)];
    } else {
        for (tensor4* t : {&dq_t, &dk_t, &dv_t}) t->resize(1, L, kH, kD);
        const float* src[5] = {in.q.data(), in.k.data(), in.v.data(), in.out.data(), in.dout.data()};
        for (int t = 0; t < 5; ++t) p[t] = const_cast<float*>(src[t]);
        p[5] = dq_t.data(), p[6] = dk_t.data(), p[7] = dv_t.data(), p[8] = const_cast<float*>(in.lse.data());
    }
    if (fwd) {
        out_t.resize(1, L, kH, kD);
        lse_t.resize(1, L, kH);
    }
    const map4 q(p[0], 1, L, kH, kD), k(p[1], 1, L, kH, kD), v(p[2], 1, L, kH, kD), fw_out(p[3], 1, L, kH, kD),
        dout(p[4], 1, L, kH, kD);
    map4 dq(p[5], 1, L, kH, kD), dk(p[6], 1, L, kH, kD), dv(p[7], 1, L, kH, kD);
    const map3 lse(p[8], 1, L, kH);
    attnkit::self_gating_options o;
    o.causal = true;
    o.pool = shared_pool(threads);
    auto run = [&] {
        switch (f) {
            case family::backward:
                attnkit::self_gating_attention_backward(q, k, v, fw_out, dout, dq, dk, dv, o);
                break;
            case family::backward_lse:
                attnkit::self_gating_attention_backward(q, k, v, fw_out, lse, dout, dq, dk, dv, o);
                break;
            case family::forward:
                attnkit::self_gating_attention(q, k, v, out_t, o);
                break;
            case family::forward_lse:
                attnkit::self_gating_attention(q, k, v, out_t, lse_t, o);
                break;
            case family::traffic: {
                constexpr std::int64_t kBlock = 64;
                std::vector<float> part(static_cast<std::size_t>((L + kBlock - 1) / kBlock));
                attnkit::parallel_for(o.pool, static_cast<std::int64_t>(part.size()), [&](std::int64_t i) {
                    const std::int64_t hi = L - i * kBlock;
                    part[static_cast<std::size_t>(i)] = move_traffic(p, std::max<std::int64_t>(hi - kBlock, 0), hi);
                });
                benchmark::DoNotOptimize(part.data());
                break;
            }
        }
    };
    // One untimed call: the outputs' pages are faulted in here, not in the first timed call.
    run();
    // "/probe:alternating": each iteration is also one pass of the read probe, before or after
    // the call in turn, each timed on its own; frac_alternating is the median over iterations of
    // the call's rate over its neighbouring probe pass's. The plain bw_frac divides by the best of
    // five passes at the program's start, and this host's bandwidth drifts by tens of percent
    // between then and a benchmark minutes later.
    std::vector<double> call_seconds, frac;
    float sink = 0;
    for (auto _ : state) {
        double t_call = 0, t_probe = 0, probe_bytes = 0;
        const bool probe_first = call_seconds.size() % 2 == 1;  // odd iterations probe first
        for (int i = 0; i < (alternating ? 2 : 1); ++i) {
            const auto t0 = clock_type::now();
            if (alternating && (i == 0) == probe_first) {
                probe_bytes = dram_read_run(threads, &sink);
                t_probe = seconds_since(t0);
            } else {
                run();
                benchmark::ClobberMemory();
                t_call = seconds_since(t0);
            }
        }
        call_seconds.push_back(t_call);
        if (alternating) frac.push_back(bytes_of(L) / t_call / (probe_bytes / t_probe));
    }
    benchmark::DoNotOptimize(sink);
    std::string why;
    const bool backward = !fwd && f != family::traffic;
    if (backward && !check(in, dq, dv, why)) state.SkipWithError(why.c_str());
    state.counters["GB/s"] = benchmark::Counter(bytes_of(L) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    if (!alternating) {
        state.counters["bw_frac"] =
            benchmark::Counter(bytes_of(L) / dram_read_bandwidth(threads), benchmark::Counter::kIsIterationInvariantRate);
        return;
    }
    state.counters["call_ms"] = 1e3 * median_of(call_seconds);
    state.counters["frac_alternating"] = median_of(frac);
}

void register_all() {
    for (std::int64_t L : {4096, 32768})
        for (layout where : {layout::natural, layout::apart})
            for (int t : kThreadCounts)
                for (const auto& [f, fname] : {std::pair<family, const char*>{family::backward, "backward"},
                                               {family::backward_lse, "backward_lse"},
                                               {family::forward, "forward"},
                                               {family::forward_lse, "forward_lse"},
                                               {family::traffic, "traffic"}}) {
                    const bool fwd = f == family::forward || f == family::forward_lse;
                    if (where == layout::apart && fwd) continue;  // the backward's placement only
                    const std::string name = std::string(fname) + "/L:" + std::to_string(L) + "/D:128/H:8/causal:1" +
                                             (where == layout::apart ? "/layout:apart" : "") +
                                             "/threads:" + std::to_string(t);
                    benchmark::RegisterBenchmark(name.c_str(), BM_case, f, L, t, where, false)
                        ->UseRealTime()
                        ->Unit(benchmark::kMillisecond);
                }
    // The training issue's row with the read probe alternating (BM_case), and the traffic loop
    // beside it as the yardstick.
    for (int t : kThreadCounts)
        for (const auto& [f, fname] : {std::pair<family, const char*>{family::backward_lse, "backward_lse"},
                                       {family::traffic, "traffic"}}) {
            const std::string name = std::string(fname) + "/L:32768/D:128/H:8/causal:1/probe:alternating/threads:" +
                                     std::to_string(t);
            benchmark::RegisterBenchmark(name.c_str(), BM_case, f, std::int64_t(32768), t, layout::natural, true)
                ->Iterations(kAlternatingIterations)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        }
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, [] { attnkit_bench::register_all(); }); }
