// StaticEmbQK (Xue et al.): every layer takes its Q and K from the token embeddings, so one GEMM
// computes the Q and K of all layers before the first layer runs, and each layer reads its own
// as strided views of that buffer. V (and everything else) still comes from the layer's input.
//
// A 4-layer toy: stack the per-layer W_Q^l, W_K^l once; project e once; then per layer
//   v   = h W_V^l                      (the layer's own input)
//   a   = softmax_attention(embedding_q(qk, lay, l), embedding_k(qk, lay, l), v)   causal
//   h   = h + a W_O^l
// and check the last layer's attention against the reference on copied Q and K.
#include <attnkit/attnkit.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

int main() {
    const attnkit::index_t B = 2, L = 96, d = 128;
    const attnkit::embedding_qk_layout lay{4, 8, 2, 16};  // 4 layers, GQA 8 query / 2 key heads, D = 16
    const attnkit::index_t Dv = 16, hv = lay.heads_kv * Dv, ho = lay.heads * Dv;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    auto random = [&](attnkit::index_t r, attnkit::index_t c) {
        tensor2 t(r, c);
        const float s = 1.0f / std::sqrt(static_cast<float>(r));
        for (attnkit::index_t i = 0; i < t.size(); ++i) t.data()[i] = normal(rng) * s;
        return t;
    };

    std::vector<tensor2> wq, wk, wv, wo;
    for (attnkit::index_t l = 0; l < lay.layers; ++l) {
        wq.push_back(random(d, lay.heads * lay.dim));
        wk.push_back(random(d, lay.heads_kv * lay.dim));
        wv.push_back(random(d, hv));
        wo.push_back(random(ho, d));
    }
    tensor2 w(d, lay.layers * (lay.heads + lay.heads_kv) * lay.dim);
    attnkit::stack_embedding_qk_weights(wq, wk, w);  // once, at load time

    tensor3 e(B, L, d), qk(B, L, w.dimension(1));
    for (attnkit::index_t i = 0; i < e.size(); ++i) e.data()[i] = normal(rng);
    attnkit::thread_pool pool(2);
    attnkit::embedding_qk_projection(e, w, qk, lay, &pool);  // every layer's Q and K, one GEMM
    std::printf("projection: e [%ld, %ld, %ld] x w [%ld, %ld] -> qk (%.1f MiB for %ld layers)\n",
                static_cast<long>(B), static_cast<long>(L), static_cast<long>(d), static_cast<long>(d),
                static_cast<long>(w.dimension(1)), qk.size() * 4.0 / (1 << 20), static_cast<long>(lay.layers));

    attnkit::softmax_options opts;
    opts.causal = true;
    opts.pool = &pool;
    tensor3 h = e;
    tensor4 v(B, L, lay.heads_kv, Dv), a(B, L, lay.heads, Dv);
    for (attnkit::index_t l = 0; l < lay.layers; ++l) {
        Eigen::Map<const row_matrix> H(h.data(), B * L, d), Wv(wv[l].data(), d, hv), Wo(wo[l].data(), ho, d);
        Eigen::Map<row_matrix>(v.data(), B * L, hv).noalias() = H * Wv;
        attnkit::softmax_attention(attnkit::embedding_q(qk, lay, l), attnkit::embedding_k(qk, lay, l), v, a, opts);
        row_matrix update = Eigen::Map<const row_matrix>(a.data(), B * L, ho) * Wo;
        Eigen::Map<row_matrix>(h.data(), B * L, d) += update;
        std::printf("layer %ld: |h| = %.3f\n", static_cast<long>(l), Eigen::Map<const row_matrix>(h.data(), B * L, d).norm());
    }

    // The views are plain BSHD views into qk: the last layer's attention equals the reference
    // computed on dense copies of its Q and K.
    const attnkit::index_t last = lay.layers - 1;
    const auto qv = attnkit::embedding_q(qk, lay, last), kv = attnkit::embedding_k(qk, lay, last);
    tensor4 q(B, L, lay.heads, lay.dim), k(B, L, lay.heads_kv, lay.dim), ref(B, L, lay.heads, Dv);
    for (attnkit::index_t b = 0; b < B; ++b)
        for (attnkit::index_t t = 0; t < L; ++t)
            for (attnkit::index_t x = 0; x < lay.dim; ++x) {
                for (attnkit::index_t hh = 0; hh < lay.heads; ++hh) q(b, t, hh, x) = qv(b, t, hh, x);
                for (attnkit::index_t hh = 0; hh < lay.heads_kv; ++hh) k(b, t, hh, x) = kv(b, t, hh, x);
            }
    attnkit::reference::softmax_attention(q, k, v, ref, opts);
    float err = 0.0f;
    for (attnkit::index_t i = 0; i < ref.size(); ++i) err = std::max(err, std::abs(ref.data()[i] - a.data()[i]));
    std::printf("last layer: max |views - reference on copies| = %.2e\n", err);
    return err < 1e-4f ? 0 : 1;
}
