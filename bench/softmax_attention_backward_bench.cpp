// attnkit benchmarks: the backward pass of softmax attention.
//
// Families, on the same shapes and inputs:
//   forward       attnkit::softmax_attention with lse (the pass a training step runs first)
//   backward      attnkit::softmax_attention_backward (fused, FlashAttention-2 style)
//   materialised  the math path (what PyTorch's non-fused CPU backward does): per (batch, head)
//                 S = Q K^T, P from lse, dV = P^T dO, dP = dO V^T, dS = P (dP - D), dQ = dS K,
//                 dK = dS^T Q, every product on attnkit's GEMM (detail/gemm.hpp, transposed
//                 operands read in place) over two materialised L x L matrices per thread;
//                 L <= 4096.
// Counters: FLOP/s and peak_frac against the FMA peak of the same run (common/bench_main.hpp),
// the backward's FLOPs counted as 2.5x the forward's (five products against two,
// FlashAttention-2's convention, common/flops.hpp for the forward); extra_MiB, the peak of heap
// bytes allocated during one call beyond what was live before it (the program counts every
// operator new).
//
// Shapes: B = 1, H = 8, D = 128, causal, L in {512, ..., 16384} (8192 and 16384 once per
// repetition; ATTNKIT_BENCH_QUICK=1 stops at 4096); at L = 2048 also non-causal, D = 64 and GQA
// 32/8; threads 1 and 2.
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

#include "attnkit/detail/gemm.hpp"
#include "attnkit/softmax_attention_backward.hpp"
#include "common/bench_main.hpp"
#include "common/heap_counter.hpp"
#include "common/flops.hpp"


namespace attnkit_bench {
namespace {

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
using attnkit::index_t;

struct bwd_case {
    attn_dims dims;
    bool causal = true;
    int threads = 1;
    std::string name() const {
        std::string s = "L:" + std::to_string(dims.Lq) + "/D:" + std::to_string(dims.D) + "/H:" + std::to_string(dims.H);
        if (dims.Hk != dims.H) s += "/Hk:" + std::to_string(dims.Hk);
        return s + "/causal:" + std::to_string(causal ? 1 : 0) + "/threads:" + std::to_string(threads);
    }
    attnkit::softmax_options options() const {
        attnkit::softmax_options o;
        o.causal = causal;
        o.pool = shared_pool(threads);
        return o;
    }
};

// Inputs of a shape, and the forward's out and lse (for the backward families).
struct problem {
    tensor4 q, k, v, dout, out, dq, dk, dv;
    tensor3 lse;
};

problem make_problem(const bwd_case& c) {
    const attn_dims& d = c.dims;
    problem p{tensor4(d.B, d.Lq, d.H, d.D),  tensor4(d.B, d.Lk, d.Hk, d.D), tensor4(d.B, d.Lk, d.Hk, d.Dv),
              tensor4(d.B, d.Lq, d.H, d.Dv), tensor4(d.B, d.Lq, d.H, d.Dv), tensor4(d.B, d.Lq, d.H, d.D),
              tensor4(d.B, d.Lk, d.Hk, d.D), tensor4(d.B, d.Lk, d.Hk, d.Dv), tensor3(d.B, d.Lq, d.H)};
    std::uint64_t s = 0x9E3779B97F4A7C15ull;
    auto next = [&s] {  // xorshift: a fixed, library-independent sequence in [-1, 1)
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        return static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 - 1.0);
    };
    for (tensor4* t : {&p.q, &p.k, &p.v, &p.dout})
        for (index_t i = 0; i < t->size(); ++i) t->data()[i] = 2.0f * next();
    attnkit::softmax_options o = c.options();
    attnkit::softmax_attention(p.q, p.k, p.v, p.out, p.lse, o);
    return p;
}

// The math path on the engine's GEMM (see the header).
void materialised_backward(problem& p, const attnkit::softmax_options& o) {
    namespace ad = attnkit::detail;
    const index_t B = p.q.dimension(0), L = p.q.dimension(1), H = p.q.dimension(2), D = p.q.dimension(3);
    const index_t Hk = p.k.dimension(2), Dv = p.v.dimension(3), G = H / Hk;
    const float scale = ad::resolve_scale(o.scale, D);
    p.dk.setZero();
    p.dv.setZero();
    // One thread per (batch, key/value head): its G query heads add into the same dK, dV.
    attnkit::parallel_for(o.pool, B * Hk, [&](index_t it) {
        const index_t b = it / Hk, hk = it % Hk;
        std::vector<float> qh(L * D), kh(L * D), vh(L * Dv), doh(L * Dv), pm(L * L), dp(L * L), dqh(L * D), dkh(L * D),
            dvh(L * Dv);
        for (index_t j = 0; j < L; ++j) {
            for (index_t d = 0; d < D; ++d) kh[j * D + d] = p.k(b, j, hk, d);
            for (index_t c = 0; c < Dv; ++c) vh[j * Dv + c] = p.v(b, j, hk, c);
        }
        const auto none = ad::gemm_op::none, tr = ad::gemm_op::transpose;
        for (index_t g = 0; g < G; ++g) {
            const index_t h = hk * G + g;
            for (index_t i = 0; i < L; ++i) {
                for (index_t d = 0; d < D; ++d) qh[i * D + d] = p.q(b, i, h, d);
                for (index_t c = 0; c < Dv; ++c) doh[i * Dv + c] = p.dout(b, i, h, c);
            }
            ad::gemm({qh.data(), L, D, D}, none, {kh.data(), L, D, D}, tr, {pm.data(), L, L, L});      // S = Q K^T
            ad::gemm({doh.data(), L, Dv, Dv}, none, {vh.data(), L, Dv, Dv}, tr, {dp.data(), L, L, L});  // dP = dO V^T
            for (index_t i = 0; i < L; ++i) {
                const float lse = p.lse(b, i, h);
                float di = 0.0f;
                for (index_t c = 0; c < Dv; ++c) di += p.dout(b, i, h, c) * p.out(b, i, h, c);
                for (index_t j = 0; j < L; ++j) {
                    const bool vis = !o.causal || j <= i;
                    const float pij = vis ? std::exp(scale * pm[i * L + j] - lse) : 0.0f;
                    pm[i * L + j] = pij;                        // P, in place of S
                    dp[i * L + j] = pij * (dp[i * L + j] - di);  // dS, in place of dP
                }
            }
            const ad::gemm_mode acc = g == 0 ? ad::gemm_mode::assign : ad::gemm_mode::add;
            ad::gemm({pm.data(), L, L, L}, tr, {doh.data(), L, Dv, Dv}, none, {dvh.data(), L, Dv, Dv}, acc);  // dV += P^T dO
            ad::gemm({dp.data(), L, L, L}, none, {kh.data(), L, D, D}, none, {dqh.data(), L, D, D});  // dQ = dS K
            ad::gemm({dp.data(), L, L, L}, tr, {qh.data(), L, D, D}, none, {dkh.data(), L, D, D}, acc);  // dK += dS^T Q
            for (index_t i = 0; i < L; ++i)
                for (index_t d = 0; d < D; ++d) p.dq(b, i, h, d) = scale * dqh[i * D + d];
        }
        for (index_t j = 0; j < L; ++j) {
            for (index_t d = 0; d < D; ++d) p.dk(b, j, hk, d) = scale * dkh[j * D + d];
            for (index_t c = 0; c < Dv; ++c) p.dv(b, j, hk, c) = dvh[j * Dv + c];
        }
    });
}

enum class family { forward, backward, materialised };

void run_case(benchmark::State& state, const bwd_case& c, family f) {
    problem p = make_problem(c);
    const attnkit::softmax_options o = c.options();
    auto call = [&] {
        switch (f) {
            case family::forward: attnkit::softmax_attention(p.q, p.k, p.v, p.out, p.lse, o); break;
            case family::backward:
                attnkit::softmax_attention_backward(p.q, p.k, p.v, p.out, p.lse, p.dout, p.dq, p.dk, p.dv, o);
                break;
            case family::materialised: materialised_backward(p, o); break;
        }
    };
    const double fwd = attention_flops(c.dims, o);
    time_counting_heap(state, call, f == family::forward ? fwd : 2.5 * fwd, c.threads);
}

std::vector<bwd_case> cases() {
    std::vector<bwd_case> cs;
    auto add = [&](index_t L, index_t D, index_t H, index_t Hk, bool causal) {
        for (int t : kThreadCounts) {
            bwd_case c;
            c.dims = attn_dims{1, L, L, H, Hk, D, D};
            c.causal = causal;
            c.threads = t;
            cs.push_back(c);
        }
    };
    const bool quick = bench_quick();
    for (index_t L : {512, 1024, 2048, 4096, 8192, 16384})
        if (!quick || L <= 4096) add(L, 128, 8, 8, true);
    add(2048, 128, 8, 8, false);
    add(2048, 64, 8, 8, true);
    add(2048, 128, 32, 8, true);
    return cs;
}

void register_all() {
    for (const bwd_case& c : cases()) {
        const bool long_seq = c.dims.Lq > 4096;
        for (family f : {family::forward, family::backward, family::materialised}) {
            if (f == family::materialised && c.dims.Lq > 4096) continue;
            const char* fam = f == family::forward ? "forward" : f == family::backward ? "backward" : "materialised";
            auto* b = benchmark::RegisterBenchmark((std::string(fam) + "/" + c.name()).c_str(),
                                                   [c, f](benchmark::State& s) { run_case(s, c, f); });
            b->UseRealTime()->Unit(benchmark::kMillisecond);
            if (long_seq) b->Iterations(1);
        }
    }
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, attnkit_bench::register_all); }
