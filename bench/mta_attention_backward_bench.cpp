// attnkit benchmarks: the backward pass of multi-token attention, the 830M configuration's layer.
//
// Families (B = 1, c_q = 6, c_k = 11, G = 1, causal, Dv = D):
//   forward/full            attnkit::mta_attention with every stage (kq_pre, head_pre, kq_post,
//                           head_post, group norm with depth scale, gate): the yardstick of the
//                           full backward
//   backward/full           attnkit::mta_attention_backward, every stage, every weight gradient
//   backward/pre_conv       the pre-softmax convolution only (d_kq_pre wanted)
//   softmax_backward        attnkit::softmax_attention_backward, causal, same shapes: the
//                           yardstick of backward/pre_conv
//   materialised/full       the same backward arithmetic over whole [H, L, L] tensors (the fused
//                           kernel's block run with one block of the whole sequence: no halo
//                           recomputation, every stage on materialised score tensors, as an
//                           autograd framework keeps them); L = 1024 and 2048 (six [H, L, L]
//                           float arrays: 0.4 GiB at 1024, 1.6 GiB at 2048; ATTNKIT_BENCH_QUICK=1
//                           runs 1024 only). Like the fused backward it keeps its arrays for the
//                           thread's next call, so the timed calls fault in no pages (as with an
//                           allocator that caches blocks); the warm-up call, on a thread of its
//                           own, pays for them and reports them in extra_MiB
// Shapes: H = 16, D = 96 at L = 1024 and 2048, threads 1 and 2 (the ratios are at 1
// thread); the memory case L = 8192, H = 8, D = 64 (forward/full and backward/full, 1 thread,
// one iteration per repetition).
// Counters: extra_MiB, the peak of heap bytes allocated during one call beyond what was live
// before it (common/heap_counter.hpp); FLOP/s of the forward's causal softmax work basis
// (2 L (L + 1) / 2 H (D + Dv)), the same for every family so that it reads as a rate.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/eigen.hpp"
#include <benchmark/benchmark.h>

#include "attnkit/mta_attention.hpp"
#include "attnkit/mta_attention_backward.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/softmax_attention_backward.hpp"
#include "common/bench_main.hpp"
#include "common/heap_counter.hpp"

namespace attnkit_bench {
namespace {

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using attnkit::index_t;

constexpr index_t kCq = 6, kCk = 11;

enum class family { forward_full, backward_full, backward_pre_conv, softmax_backward, materialised_full };

const char* name_of(family f) {
    switch (f) {
        case family::forward_full: return "forward/full";
        case family::backward_full: return "backward/full";
        case family::backward_pre_conv: return "backward/pre_conv";
        case family::softmax_backward: return "softmax_backward";
        case family::materialised_full: return "materialised/full";
    }
    return "";
}

struct layer {
    index_t L, kH, kD;
    tensor4 q, k, v, dout, out, dq, dk, dv, th_pre, th_post, d_th_pre, d_th_post;
    tensor3 lse;
    tensor2 w_pre, w_post, d_w_pre, d_w_post;
    tensor1 norm_w, gate_w, d_norm_w, d_gate_w;
    float d_bias = 0.0f;

    layer(index_t l, index_t h, index_t d)
        : L(l), kH(h), kD(d), q(1, l, kH, kD), k(1, l, kH, kD), v(1, l, kH, kD), dout(1, l, kH, kD), out(1, l, kH, kD),
          dq(1, l, kH, kD), dk(1, l, kH, kD), dv(1, l, kH, kD), th_pre(kH, 1, kCq, kCk), th_post(kH, 1, kCq, kCk),
          d_th_pre(kH, 1, kCq, kCk), d_th_post(kH, 1, kCq, kCk), lse(1, l, kH), w_pre(kH, kH), w_post(kH, kH),
          d_w_pre(kH, kH), d_w_post(kH, kH), norm_w(kD), gate_w(kD), d_norm_w(kD), d_gate_w(kD) {
        std::uint64_t s = 0x9E3779B97F4A7C15ull;
        auto next = [&s] {  // xorshift: a fixed, library-independent sequence in [-1, 1)
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            return static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 - 1.0);
        };
        for (tensor4* t : {&q, &k, &v, &dout})
            for (index_t i = 0; i < t->size(); ++i) t->data()[i] = 2.0f * next();
        for (tensor4* t : {&th_pre, &th_post}) {
            for (index_t i = 0; i < t->size(); ++i) t->data()[i] = 0.025f * next();
            for (index_t h = 0; h < kH; ++h) (*t)(h, 0, kCq - 1, (kCk - 1) / 2) += 1.0f;
        }
        for (tensor2* w : {&w_pre, &w_post}) {
            for (index_t i = 0; i < w->size(); ++i) w->data()[i] = 0.05f * next();
            for (index_t h = 0; h < kH; ++h) (*w)(h, h) += 1.0f;
        }
        for (index_t i = 0; i < kD; ++i) norm_w(i) = 1.0f + 0.1f * next(), gate_w(i) = 0.1f * next();
        // Fault every output page in now: they are the caller's memory, not the kernel's.
        for (tensor4* t : {&out, &dq, &dk, &dv}) t->setZero();
    }

    attnkit::mta_options options(family f, attnkit::thread_pool* pool) const {
        attnkit::mta_options o;
        o.pool = pool;
        o.kq_pre = th_pre;
        if (f == family::backward_pre_conv) return o;
        o.head_pre = w_pre;
        o.kq_post = th_post;
        o.head_post = w_post;
        o.norm_weight = norm_w;
        o.norm_layer = 3;
        o.gate_weight = gate_w;
        o.gate_bias = 0.1f;
        return o;
    }
    attnkit::mta_weight_grads grads(family f) {
        attnkit::mta_weight_grads g;
        g.kq_pre = d_th_pre;
        if (f == family::backward_pre_conv) return g;
        g.head_pre = d_w_pre;
        g.kq_post = d_th_post;
        g.head_post = d_w_post;
        g.norm_weight = d_norm_w;
        g.gate_weight = d_gate_w;
        g.gate_bias = &d_bias;
        return g;
    }
};

void run_case(benchmark::State& state, family f, index_t L, index_t H, index_t D, int threads) {
    layer x(L, H, D);
    attnkit::thread_pool* pool = shared_pool(threads);
    attnkit::softmax_options so;
    so.causal = true;
    so.pool = pool;
    const attnkit::mta_options o = x.options(f, pool);
    attnkit::mta_weight_grads g = x.grads(f);
    if (f == family::softmax_backward)
        attnkit::softmax_attention(x.q, x.k, x.v, x.out, x.lse, so);
    else
        attnkit::mta_attention(x.q, x.k, x.v, x.out, o);
    namespace am = attnkit::detail::mta;
    auto call = [&] {
        switch (f) {
            case family::forward_full: attnkit::mta_attention(x.q, x.k, x.v, x.out, o); break;
            case family::backward_full:
            case family::backward_pre_conv:
                attnkit::mta_attention_backward(x.q, x.k, x.v, x.out, x.dout, x.dq, x.dk, x.dv, g, o);
                break;
            case family::softmax_backward:
                attnkit::softmax_attention_backward(x.q, x.k, x.v, x.out, x.lse, x.dout, x.dq, x.dk, x.dv, so);
                break;
            case family::materialised_full:
                am::attention_backward_impl<attnkit::simd::default_arch>(
                    attnkit::detail::q_view(x.q), attnkit::detail::k_view(x.k), attnkit::detail::v_view(x.v),
                    attnkit::view<const float, 4>(x.out), attnkit::view<const float, 4>(x.dout),
                    attnkit::view<float, 4>(x.dq), attnkit::view<float, 4>(x.dk), attnkit::view<float, 4>(x.dv), g, o,
                    L);
                break;
        }
        benchmark::DoNotOptimize(x.dq.data());
        benchmark::ClobberMemory();
    };
    const double flops = 2.0 * static_cast<double>(L) * static_cast<double>(L + 1) / 2.0 * double(H) * 2.0 * double(D);
    time_counting_heap(state, call, flops, threads);
}

void add(family f, index_t L, index_t H, index_t D, int t) {
    const std::string n = std::string(name_of(f)) + "/L:" + std::to_string(L) + "/H:" + std::to_string(H) +
                          "/D:" + std::to_string(D) + "/threads:" + std::to_string(t);
    auto* b = benchmark::RegisterBenchmark(n.c_str(), [f, L, H, D, t](benchmark::State& s) { run_case(s, f, L, H, D, t); });
    b->UseRealTime()->Unit(benchmark::kMillisecond);
    if (L > 2048) b->Iterations(1);
}

void register_all() {
    for (int t : kThreadCounts)
        for (index_t L : {1024, 2048})
            for (family f : {family::forward_full, family::backward_full, family::backward_pre_conv,
                             family::softmax_backward, family::materialised_full})
                if (f != family::materialised_full || L <= 1024 || !bench_quick()) add(f, L, 16, 96, t);
    // The memory case: L = 8192, H = 8, D = 64, every stage, one thread (ATTNKIT_BENCH_QUICK=1
    // leaves it out).
    if (!bench_quick())
        for (family f : {family::forward_full, family::backward_full}) add(f, 8192, 8, 64, 1);
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, attnkit_bench::register_all); }
