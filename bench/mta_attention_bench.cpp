// attnkit benchmarks: multi-token attention, the 830M configuration's shapes.
//
// Families (B = 1, H = 16, D = Dv = 96, L in {512, 2048, 8192}, threads 1 and 2):
//   softmax        attnkit::softmax_attention, causal: the yardstick of every ratio
//   mta_pre        kq_pre 6 x 11 + head_pre (one pass)
//   talking_heads  head_pre + head_post + group norm + gate (two passes: with MHA each head
//                  has its own V, so post mixing needs the final probabilities)
//   mta_full       kq_pre + head_pre + kq_post + head_post + group norm + gate (two passes)
//   materialised   the full layer as the authors' PyTorch code runs it: per head S = Q K^T by
//                  Eigen GEMM into whole [H, L, L] tensors, the convolutions as loops over them,
//                  softmax, head mixing, O = P V by GEMM. L <= 2048 only: at 8192 one [H, L, L]
//                  copy is 4 GiB and it needs two.
//   mta_full_d64   mta_full at D = Dv = 64, L = 8192, one thread: the memory case.
//   mta_full/L:2048/D:64/H:8  the comparison suite's shape, 1 and 2 threads (its twin rows).
// Counters: peak_frac (causal softmax attention FLOPs, 2 L (L + 1) / 2 H (D + Dv), per second
// over the in-run FMA peak: the same work basis for every family, so it reads as "fraction of
// peak softmax would need"), peak_add_MiB (peak RSS during the benchmark minus RSS before it,
// from /proc/self/status VmHWM after resetting it through /proc/self/clear_refs).
// ATTNKIT_BENCH_QUICK=1 drops L = 8192.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced
#include <benchmark/benchmark.h>

#include "attnkit/mta_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/bench_main.hpp"
#include "common/machine.hpp"

namespace {

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using index_t = std::int64_t;

// VmRSS / VmHWM in KiB.
long status_kib(const char* key) {
    std::ifstream f("/proc/self/status");
    std::string line;
    const std::string k(key);
    while (std::getline(f, line))
        if (line.compare(0, k.size(), k) == 0) return std::stol(line.substr(k.size() + 1));
    return -1;
}
void reset_hwm() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct layer {
    index_t L, H, D;
    tensor4 q, k, v, th_pre, th_post;
    tensor2 w_pre, w_post;
    tensor1 norm_w, gate_w;
    layer(index_t l, index_t h, index_t d)
        : L(l), H(h), D(d), q(1, l, h, d), k(1, l, h, d), v(1, l, h, d), th_pre(h, 1, 6, 11), th_post(h, 1, 6, 11),
          w_pre(h, h), w_post(h, h), norm_w(d), gate_w(d) {
        q.setRandom(), k.setRandom(), v.setRandom();
        for (tensor4* t : {&th_pre, &th_post}) {
            t->setRandom();
            *t = (*t - 0.5f) * 0.05f;
            for (index_t i = 0; i < h; ++i) (*t)(i, 0, 5, 5) += 1.0f;
        }
        for (tensor2* w : {&w_pre, &w_post}) {
            w->setRandom();
            *w = (*w - 0.5f) * 0.1f;
            for (index_t i = 0; i < h; ++i) (*w)(i, i) += 1.0f;
        }
        norm_w.setConstant(1.0f);
        gate_w.setRandom();
    }
};

enum class family { softmax, mta_pre, talking_heads, mta_full, materialised };

attnkit::mta_options options_for(const layer& x, family f) {
    attnkit::mta_options o;
    if (f == family::mta_pre || f == family::mta_full) o.kq_pre = x.th_pre;
    o.head_pre = x.w_pre;
    if (f == family::talking_heads || f == family::mta_full) {
        o.head_post = x.w_post;
        o.norm_weight = x.norm_w;
        o.gate_weight = x.gate_w;
    }
    if (f == family::mta_full) o.kq_post = x.th_post;
    return o;
}

// ---- the materialised baseline ----------------------------------------------------------------

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using const_head = Eigen::Map<const row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using mut_head = Eigen::Map<row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

// y[h] = conv(x) on whole [H, L, L] tensors (G = 1), as torch's conv2d with padding would.
void conv_cube(const std::vector<float>& x, std::vector<float>& y, const tensor4& th, index_t H, index_t L,
               attnkit::thread_pool* pool) {
    const index_t cq = th.dimension(2), ck = th.dimension(3), hk = (ck - 1) / 2;
    attnkit::parallel_for(pool, H, [&](index_t h) {
        float* yh = y.data() + h * L * L;
        std::fill(yh, yh + L * L, 0.0f);
        for (index_t i = 0; i < L; ++i)
            for (index_t a = 0; a < cq; ++a) {
                const index_t ii = i + a - (cq - 1);
                if (ii < 0) continue;
                const float* xr = x.data() + (h * L + ii) * L;
                for (index_t c = 0; c < ck; ++c) {
                    const float w = th(h, 0, a, c);
                    const index_t sh = c - hk, j0 = std::max<index_t>(0, -sh), j1 = std::min(L, L - sh);
                    float* yr = yh + i * L;
                    for (index_t j = j0; j < j1; ++j) yr[j] += w * xr[j + sh];
                }
            }
    });
}

void mix_cube(const std::vector<float>& x, std::vector<float>& y, const tensor2& w, index_t H, index_t L,
              attnkit::thread_pool* pool) {
    attnkit::parallel_for(pool, H, [&](index_t h) {
        Eigen::Map<Eigen::VectorXf> yh(y.data() + h * L * L, L * L);
        yh.setZero();
        for (index_t g = 0; g < H; ++g) yh += w(h, g) * Eigen::Map<const Eigen::VectorXf>(x.data() + g * L * L, L * L);
    });
}

void materialised_mta(const layer& x, tensor4& out, attnkit::thread_pool* pool) {
    const index_t L = x.L, H = x.H, D = x.D;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    std::vector<float> a(static_cast<std::size_t>(H * L * L)), b(a.size());
    attnkit::parallel_for(pool, H, [&](index_t h) {
        const_head Q(x.q.data() + h * D, L, D, Eigen::OuterStride<>(H * D));
        const_head K(x.k.data() + h * D, L, D, Eigen::OuterStride<>(H * D));
        Eigen::Map<row_matrix> S(a.data() + h * L * L, L, L);
        S.noalias() = (Q * scale) * K.transpose();
        for (index_t i = 0; i < L; ++i) S.row(i).tail(L - i - 1).setZero();  // Mask0
    });
    conv_cube(a, b, x.th_pre, H, L, pool);
    mix_cube(b, a, x.w_pre, H, L, pool);
    attnkit::parallel_for(pool, H, [&](index_t h) {  // causal softmax
        for (index_t i = 0; i < L; ++i) {
            float* r = a.data() + (h * L + i) * L;
            const float m = *std::max_element(r, r + i + 1);
            float s = 0;
            for (index_t j = 0; j <= i; ++j) s += (r[j] = std::exp(r[j] - m));
            for (index_t j = 0; j <= i; ++j) r[j] /= s;
            std::fill(r + i + 1, r + L, 0.0f);
        }
    });
    conv_cube(a, b, x.th_post, H, L, pool);
    attnkit::parallel_for(pool, H, [&](index_t h) {
        for (index_t i = 0; i < L; ++i) std::fill(b.data() + (h * L + i) * L + i + 1, b.data() + (h * L + i + 1) * L, 0.0f);
    });
    mix_cube(b, a, x.w_post, H, L, pool);
    attnkit::parallel_for(pool, H, [&](index_t h) {
        const_head V(x.v.data() + h * D, L, D, Eigen::OuterStride<>(H * D));
        mut_head O(out.data() + h * D, L, D, Eigen::OuterStride<>(H * D));
        O.noalias() = Eigen::Map<const row_matrix>(a.data() + h * L * L, L, L) * V;
        for (index_t i = 0; i < L; ++i) {  // group norm and gate
            auto o = O.row(i);
            o *= 1.0f / std::sqrt(o.squaredNorm() / static_cast<float>(D) + 1e-5f);
            o = o.cwiseProduct(Eigen::Map<const Eigen::RowVectorXf>(x.norm_w.data(), D));
            o *= 1.0f / (1.0f + std::exp(-o.dot(Eigen::Map<const Eigen::RowVectorXf>(x.gate_w.data(), D))));
        }
    });
}

// ---- registration -------------------------------------------------------------------------------

void run_case(benchmark::State& state, family f, index_t L, index_t D, int threads, index_t H = 16) {
    const layer x(L, H, D);
    tensor4 out(1, L, H, D);
    out.setZero();  // fault the output's pages in now: they are not the kernel's memory
    std::unique_ptr<attnkit::thread_pool> pool;
    if (threads > 1) pool = std::make_unique<attnkit::thread_pool>(static_cast<std::size_t>(threads));
    attnkit::mta_options o = options_for(x, f);
    o.pool = pool.get();
    attnkit::softmax_options so;
    so.causal = true;
    so.pool = pool.get();
    const long rss0 = status_kib("VmRSS:");
    reset_hwm();
    for (auto _ : state) {
        switch (f) {
            case family::softmax: attnkit::softmax_attention(x.q, x.k, x.v, out, so); break;
            case family::materialised: materialised_mta(x, out, pool.get()); break;
            default: attnkit::mta_attention(x.q, x.k, x.v, out, o); break;
        }
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    const long hwm = status_kib("VmHWM:");
    const double flops = 2.0 * static_cast<double>(L) * static_cast<double>(L + 1) / 2.0 * static_cast<double>(H) * 2.0 *
                         static_cast<double>(D);
    state.counters["peak_frac"] = benchmark::Counter(flops / attnkit_bench::machine_peak_flops(threads),
                                                     benchmark::Counter::kIsIterationInvariantRate);
    state.counters["peak_add_MiB"] = static_cast<double>(hwm - rss0) / 1024.0;
}

void register_all() {
    const char* names[] = {"softmax", "mta_pre", "talking_heads", "mta_full", "materialised"};
    const family fams[] = {family::softmax, family::mta_pre, family::talking_heads, family::mta_full,
                           family::materialised};
    for (index_t L : {512, 2048, 8192}) {
        if (L == 8192 && attnkit_bench::bench_quick()) continue;
        for (int t : attnkit_bench::kThreadCounts)
            for (int fi = 0; fi < 5; ++fi) {
                if (fams[fi] == family::materialised && L > 2048) continue;
                const std::string n = std::string(names[fi]) + "/L:" + std::to_string(L) + "/D:96/threads:" + std::to_string(t);
                auto* b = benchmark::RegisterBenchmark(n.c_str(), [=](benchmark::State& s) { run_case(s, fams[fi], L, 96, t); });
                b->Unit(benchmark::kMillisecond)->UseRealTime();
                if (L == 8192) b->Iterations(1)->Repetitions(1);
            }
    }
    benchmark::RegisterBenchmark("mta_full_d64/L:8192/D:64/threads:1",
                                 [](benchmark::State& s) { run_case(s, family::mta_full, 8192, 64, 1); })
        ->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1)->Repetitions(1);
    // The comparison suite's shape (variants_bench: H = 8, D = 64): the twin of its mta rows, so
    // that the report can check that no kernel is slower in the suite than here.
    for (int t : attnkit_bench::kThreadCounts) {
        const std::string n = "mta_full/L:2048/D:64/H:8/threads:" + std::to_string(t);
        benchmark::RegisterBenchmark(n.c_str(), [=](benchmark::State& s) { run_case(s, family::mta_full, 2048, 64, t, 8); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    }
    benchmark::RegisterBenchmark("softmax_d64/L:8192/D:64/threads:1",
                                 [](benchmark::State& s) { run_case(s, family::softmax, 8192, 64, 1); })
        ->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1)->Repetitions(1);
}

}  // namespace

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, [] { register_all(); }); }
