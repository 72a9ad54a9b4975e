// attnkit's decode beside ggml's CPU flash attention (ggml_flash_attn_ext, what llama.cpp runs),
// on the same inputs, in the same run, through the attention harness (common/attention_harness.hpp):
// both families get the harness's tensors and views, the same output spot check against a
// double recomputation, and the same GB/s and bw_frac counters.
//
// ggml is not a dependency of attnkit: bench/scripts/fetch_ggml.sh unpacks the copy of ggml that
// the npm package llama.rn ships (its symbols prefixed lm_ggml_), and configuring the benchmarks
// with -DATTNKIT_GGML_DIR=<that directory> builds this program (docs/benchmarks.md, "Decode
// against ggml").
//
// ggml is handed the harness's memory without a copy: K and V as 4-d views with the strides of
// the harness's tensors (token-major [B, L, Hk, D], or head-major [B, Hk, L, D] memory seen
// through attnkit::view strides), q as a view of [B, 1, H, D], and the result written into the
// harness's out ([Dv, H, 1, B] in ggml's order is out's [B, 1, H, Dv] memory). Graphs are built
// once per (inputs, threads) and reused, as llama.cpp reuses its graphs between tokens; ggml's
// threads are OpenMP's, as in llama.cpp's default build.
//
// Cases: decode Lq = 1, Lk in {4096, 16384, 65536}, D in {64, 128}, H = 8 and GQA 32/8, K/V float,
// bfloat16 and half, token-major and head-major, threads 1 and 2. ATTNKIT_BENCH_QUICK=1: Lk 16384
// only.
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <vector>

#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced
#include <benchmark/benchmark.h>

#include "attnkit/softmax_attention.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/attention_harness.hpp"
#include "common/bench_main.hpp"

#include "ggml-cpu.h"
#include "ggml.h"

namespace attnkit_bench {
namespace {

// Pointer, dims and strides (elements) of a rank-4 input, from an Eigen tensor or an attnkit::view.
struct strided4 {
    const void* data;
    std::int64_t dims[4], strides[4];
};
template <class T>
strided4 strided_of(const Eigen::Tensor<T, 4, Eigen::RowMajor>& t) {
    strided4 s{t.data(), {t.dimension(0), t.dimension(1), t.dimension(2), t.dimension(3)}, {}};
    s.strides[3] = 1;
    for (int i = 2; i >= 0; --i) s.strides[i] = s.strides[i + 1] * s.dims[i + 1];
    return s;
}
template <class T>
strided4 strided_of(const attnkit::view<const T, 4>& v) {
    return strided4{v.data, {v.dims[0], v.dims[1], v.dims[2], v.dims[3]},
                    {v.strides[0], v.strides[1], v.strides[2], v.strides[3]}};
}

template <class X>
struct element_of;
template <class T>
struct element_of<Eigen::Tensor<T, 4, Eigen::RowMajor>> {
    using type = T;
};
template <class T>
struct element_of<attnkit::view<const T, 4>> {
    using type = T;
};

template <class T>
lm_ggml_type ggml_type_of() {
    if (std::is_same<T, float>::value) return LM_GGML_TYPE_F32;
    if (std::is_same<T, Eigen::half>::value) return LM_GGML_TYPE_F16;
    return LM_GGML_TYPE_BF16;
}

// One ggml graph computing flash attention over fixed memory.
class ggml_decode_graph {
   public:
    ggml_decode_graph(const strided4& q, const strided4& k, lm_ggml_type kt, const strided4& v, lm_ggml_type vt,
                      float* out, int threads) {
        lm_ggml_init_params ip{std::size_t(4) << 20, nullptr, /*no_alloc=*/true};
        ctx_.reset(lm_ggml_init(ip));
        if (!ctx_) throw std::runtime_error("lm_ggml_init failed");
        lm_ggml_tensor* qv = view_of(q, LM_GGML_TYPE_F32);
        lm_ggml_tensor* kv = view_of(k, kt);
        lm_ggml_tensor* vv = view_of(v, vt);
        const float scale = 1.0f / std::sqrt(static_cast<float>(q.dims[3]));
        lm_ggml_tensor* o = lm_ggml_flash_attn_ext(ctx_.get(), qv, kv, vv, nullptr, scale, 0.0f, 0.0f);
        lm_ggml_flash_attn_ext_set_prec(o, LM_GGML_PREC_F32);
        o->data = out;
        graph_ = lm_ggml_new_graph(ctx_.get());
        lm_ggml_build_forward_expand(graph_, o);
        plan_ = lm_ggml_graph_plan(graph_, threads, nullptr);
        work_.resize(plan_.work_size + 64);
        plan_.work_data = work_.data();
    }
    void compute() {
        if (lm_ggml_graph_compute(graph_, &plan_) != LM_GGML_STATUS_SUCCESS)
            throw std::runtime_error("lm_ggml_graph_compute failed");
    }

   private:
    struct free_ctx {
        void operator()(lm_ggml_context* c) const { lm_ggml_free(c); }
    };
    // x [B, L, Hh, D] with any strides as ggml's [D, L, Hh, B]: a 1-d tensor over the span,
    // then a view with x's strides in bytes.
    lm_ggml_tensor* view_of(const strided4& x, lm_ggml_type type) {
        std::int64_t span = 1;
        for (int i = 0; i < 4; ++i) span += (x.dims[i] - 1) * x.strides[i];
        lm_ggml_tensor* base = lm_ggml_new_tensor_1d(ctx_.get(), type, span);
        base->data = const_cast<void*>(x.data);
        const std::size_t es = lm_ggml_type_size(type);
        return lm_ggml_view_4d(ctx_.get(), base, x.dims[3], x.dims[1], x.dims[2], x.dims[0], x.strides[1] * es,
                               x.strides[2] * es, x.strides[0] * es, 0);
    }
    std::unique_ptr<lm_ggml_context, free_ctx> ctx_;
    lm_ggml_cgraph* graph_ = nullptr;
    lm_ggml_cplan plan_{};
    std::vector<std::uint8_t> work_;
};

// The ggml family: a graph per (memory, shape, threads), built on first use.
template <class Q, class K, class V>
void ggml_attention(const Q& q, const K& k, const V& v, tensor4& out, const attnkit::softmax_options& opts) {
    using KT = typename element_of<std::decay_t<K>>::type;
    using VT = typename element_of<std::decay_t<V>>::type;
    const strided4 qs = strided_of(q), ks = strided_of(k), vs = strided_of(v);
    const int threads = opts.pool ? static_cast<int>(opts.pool->size()) : 1;
    using key_t = std::tuple<const void*, const void*, const void*, float*, int, std::vector<std::int64_t>>;
    std::vector<std::int64_t> shape;
    for (const strided4* s : {&qs, &ks, &vs})
        for (int i = 0; i < 4; ++i) shape.insert(shape.end(), {s->dims[i], s->strides[i]});
    static std::map<key_t, std::unique_ptr<ggml_decode_graph>> graphs;
    const key_t key{qs.data, ks.data, vs.data, out.data(), threads, shape};
    auto it = graphs.find(key);
    if (it == graphs.end()) {
        if (graphs.size() > 64) graphs.clear();  // a new shape: the old inputs are gone
        it = graphs.emplace(key, std::make_unique<ggml_decode_graph>(qs, ks, ggml_type_of<KT>(), vs, ggml_type_of<VT>(),
                                                                     out.data(), threads))
                 .first;
    }
    it->second->compute();
}

std::vector<attn_case> decode_cases() {
    return decode_sweep({kv_storage::f32, kv_storage::bf16, kv_storage::f16},
                        bench_quick() ? std::vector<std::int64_t>{16384} : std::vector<std::int64_t>{4096, 16384, 65536});
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) {
    return attnkit_bench::bench_main(argc, argv, [] {
        using namespace attnkit_bench;
        add_typed_family("attnkit", [](auto& q, auto& k, auto& v, auto& out, auto& opts) {
            attnkit::softmax_attention(q, k, v, out, opts);
        });
        // ggml rounds q to the K type for its dot products (half or bfloat16 queries against
        // 16-bit keys), so its spot check gets a looser tolerance than attnkit's float queries.
        family_options ggml_options;
        ggml_options.tolerance = 2e-2;
        add_typed_family("ggml", [](auto& q, auto& k, auto& v, auto& out, auto& opts) {
            ggml_attention(q, k, v, out, opts);
        }, ggml_options);
        register_attention_benchmarks(decode_cases());
    });
}
