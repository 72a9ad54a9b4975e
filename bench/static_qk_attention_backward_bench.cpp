// attnkit benchmarks: the backward pass of static QK attention against softmax attention's on
// the same shapes.
//
// Families (names "<family>/B:8/L:2048/D:64/H:8/threads:N"), Hk = H = 8, Dv = D = 64, causal:
//   static_qk  attnkit::static_qk_attention_backward: one fixed stream q_fixed, k_fixed [1, L, ..]
//              for all B items (score tiles, P, dS, dK and dQ once; dP and dV per item)
//   softmax    attnkit::softmax_attention_backward with q and k = the stream repeated for every
//              item (what the same model step costs without sharing the map), out and lse from
//              its forward
// Counters: FLOP/s and peak_frac with softmax's backward work (five products of 2 L^2 D / 2 per
// item and head, common/flops.hpp convention: 2.5x the forward), for both families, so that their
// times compare directly; the ratio static_qk / softmax is in docs/benchmarks.md.
#include <cmath>
#include <cstdint>
#include <string>

#include <benchmark/benchmark.h>
#include "attnkit/eigen.hpp"

#include "attnkit/softmax_attention_backward.hpp"
#include "attnkit/static_qk_attention_backward.hpp"
#include "common/bench_main.hpp"
#include "common/machine.hpp"

namespace attnkit_bench {
namespace {

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
constexpr std::int64_t kB = 8, kL = 2048, kH = 8, kD = 64;

struct inputs {
    tensor4 qf, kf, q, k, v, dout, out_static, out_softmax;
    tensor3 lse;
};

const inputs& data() {
    static inputs* p = [] {
        auto* in = new inputs;
        std::uint64_t s = 0x243F6A8885A308D3ull;
        auto next = [&] {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            return static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-53);
        };
        auto fill = [&](tensor4& t, std::int64_t b) {
            t.resize(b, kL, kH, kD);
            for (std::int64_t i = 0; i < t.size(); ++i) t.data()[i] = (next() + next() + next() - 1.5f) * 2.0f;
        };
        fill(in->qf, 1), fill(in->kf, 1), fill(in->v, kB), fill(in->dout, kB);
        in->q.resize(kB, kL, kH, kD);
        in->k.resize(kB, kL, kH, kD);
        for (std::int64_t b = 0; b < kB; ++b)
            for (std::int64_t i = 0; i < kL * kH * kD; ++i) {
                in->q.data()[b * kL * kH * kD + i] = in->qf.data()[i];
                in->k.data()[b * kL * kH * kD + i] = in->kf.data()[i];
            }
        in->out_static.resize(kB, kL, kH, kD);
        in->out_softmax.resize(kB, kL, kH, kD);
        in->lse.resize(kB, kL, kH);
        attnkit::static_qk_attention(in->qf, in->kf, in->v, in->out_static);
        attnkit::softmax_options o;
        o.causal = true;
        attnkit::softmax_attention(in->q, in->k, in->v, in->out_softmax, in->lse, o);
        return in;
    }();
    return *p;
}

void BM_case(benchmark::State& state, bool is_static, int threads) {
    const inputs& in = data();
    tensor4 dq(is_static ? 1 : kB, kL, kH, kD), dk(is_static ? 1 : kB, kL, kH, kD), dv(kB, kL, kH, kD);
    for (auto _ : state) {
        if (is_static) {
            attnkit::static_qk_options o;
            o.pool = shared_pool(threads);
            attnkit::static_qk_attention_backward(in.qf, in.kf, in.v, in.out_static, in.dout, dq, dk, dv, o);
        } else {
            attnkit::softmax_options o;
            o.causal = true;
            o.pool = shared_pool(threads);
            attnkit::softmax_attention_backward(in.q, in.k, in.v, in.out_softmax, in.lse, in.dout, dq, dk, dv, o);
        }
        benchmark::ClobberMemory();
    }
    for (const tensor4* t : {&dq, &dk, &dv})
        for (std::int64_t i = 0; i < t->size(); ++i)
            if (!std::isfinite(t->data()[i])) {
                state.SkipWithError("non-finite gradient");
                return;
            }
    const double flops = 2.5 * kB * kH * 2.0 * 2.0 * kD * 0.5 * static_cast<double>(kL) * (kL + 1);
    state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["peak_frac"] =
        benchmark::Counter(flops / machine_peak_flops(threads), benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
    for (int t : kThreadCounts)
        for (bool st : {true, false}) {
            const std::string name = std::string(st ? "static_qk" : "softmax") + "/B:8/L:2048/D:64/H:8/threads:" +
                                     std::to_string(t);
            benchmark::RegisterBenchmark(name.c_str(), BM_case, st, t)->UseRealTime()->Unit(benchmark::kMillisecond);
        }
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, [] { attnkit_bench::register_all(); }); }
