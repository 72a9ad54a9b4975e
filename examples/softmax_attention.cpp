// Prefill, then decode against a growing KV cache: the usual shape of an inference loop.
//
// The cache is one preallocated [B, max_len, Hk, D] buffer; each step attends over its first
// `len` positions through an attnkit::view (no copies), with bottom-right causal alignment so
// that the prefill's queries and each decode query sit at the end of the visible keys.
#include <attnkit/attnkit.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;

int main() {
    const attnkit::index_t B = 1, H = 8, Hk = 2, D = 64;  // GQA: 4 query heads per key/value head
    const attnkit::index_t prompt = 37, steps = 5, max_len = prompt + steps;

    std::mt19937 rng(42);
    std::normal_distribution<float> normal;
    auto randomize = [&](float* p, attnkit::index_t n) {
        for (attnkit::index_t i = 0; i < n; ++i) p[i] = normal(rng);
    };

    // KV cache with room for every step; a model would write each new token's K/V here.
    std::vector<float> k_cache(B * max_len * Hk * D), v_cache(B * max_len * Hk * D);
    randomize(k_cache.data(), static_cast<attnkit::index_t>(k_cache.size()));
    randomize(v_cache.data(), static_cast<attnkit::index_t>(v_cache.size()));
    const std::array<attnkit::index_t, 4> cache_strides{max_len * Hk * D, Hk * D, D, 1};
    auto cache_view = [&](const std::vector<float>& c, attnkit::index_t len) {
        return attnkit::view<const float, 4>(c.data(), {B, len, Hk, D}, cache_strides);
    };

    attnkit::thread_pool pool(2);
    attnkit::softmax_options opts;
    opts.causal = true;
    opts.pool = &pool;

    // Prefill: all prompt queries at once, also keeping lse (for split or merged attention).
    tensor4 q(B, prompt, H, D), out(B, prompt, H, D);
    Eigen::Tensor<float, 3, Eigen::RowMajor> lse(B, prompt, H);
    randomize(q.data(), q.size());
    attnkit::softmax_attention(q, cache_view(k_cache, prompt), cache_view(v_cache, prompt), out, lse, opts);
    std::printf("prefill: %ld queries, out[0, last, 0, :4] = %.4f %.4f %.4f %.4f, lse = %.4f\n",
                static_cast<long>(prompt), out(0, prompt - 1, 0, 0), out(0, prompt - 1, 0, 1),
                out(0, prompt - 1, 0, 2), out(0, prompt - 1, 0, 3), lse(0, prompt - 1, 0));

    // Decode: one query per step against the cache grown by one token.
    tensor4 q1(B, 1, H, D), out1(B, 1, H, D);
    for (attnkit::index_t t = 0; t < steps; ++t) {
        const attnkit::index_t len = prompt + t + 1;
        randomize(q1.data(), q1.size());
        attnkit::softmax_attention(q1, cache_view(k_cache, len), cache_view(v_cache, len), out1, opts);
        float norm = 0.0f;
        for (attnkit::index_t c = 0; c < D; ++c) norm += out1(0, 0, 0, c) * out1(0, 0, 0, c);
        std::printf("decode step %ld: %ld keys, |out[head 0]| = %.4f\n", static_cast<long>(t),
                    static_cast<long>(len), std::sqrt(norm));
    }

    // The fast kernel agrees with the naive reference.
    tensor4 ref(B, 1, H, D);
    attnkit::reference::softmax_attention(q1, cache_view(k_cache, max_len), cache_view(v_cache, max_len), ref, opts);
    float err = 0.0f;
    for (attnkit::index_t i = 0; i < ref.size(); ++i) err = std::max(err, std::abs(ref.data()[i] - out1.data()[i]));
    std::printf("max |fast - reference| on the last step: %.2e\n", err);
    return err < 1e-4f ? 0 : 1;
}
