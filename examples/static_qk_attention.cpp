// Static QK attention (RndEmbQK / FixedSeqQK): Q and K come from a fixed random stream, not from
// the layer input, so every head has ONE causal attention map for every input.
//
// 1. Draw the fixed stream's Q and K (a model keeps them as constants of the layer).
// 2. Store the map once (static_attention_map), and apply it to a batch of value tensors; check
//    it against static_qk_attention, which recomputes the scores once for the whole batch.
// 3. Decode: each new token appends its V to a cache; one step is row len - 1 of the map
//    against the cache (T = 1), no scores at all.
#include <attnkit/attnkit.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using attnkit::index_t;

int main() {
    const index_t B = 4, Lmax = 512, H = 8, Hk = 4, D = 64, Dv = 64;
    const index_t prompt = 384, steps = 6;

    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    auto randomize = [&](float* p, index_t n) {
        for (index_t i = 0; i < n; ++i) p[i] = normal(rng);
    };

    // 1. The fixed stream.
    tensor4 q_fixed(1, Lmax, H, D), k_fixed(1, Lmax, Hk, D);
    randomize(q_fixed.data(), q_fixed.size());
    randomize(k_fixed.data(), k_fixed.size());

    attnkit::thread_pool pool(2);
    attnkit::static_qk_options opts;
    opts.pool = &pool;

    // 2. The map: H * Lmax (Lmax + 1) / 2 floats.
    const attnkit::static_attention_map map(q_fixed, k_fixed, opts);
    std::printf("map: %ld heads, Lmax %ld, %.1f MiB\n", static_cast<long>(map.heads()),
                static_cast<long>(map.max_length()), static_cast<double>(map.bytes()) / (1 << 20));

    // The value cache of every batch item, [B, Lmax, Hk, Dv], filled up to `prompt` positions.
    std::vector<float> v_cache(static_cast<std::size_t>(B * Lmax * Hk * Dv));
    randomize(v_cache.data(), static_cast<index_t>(v_cache.size()));
    const std::array<index_t, 4> strides{Lmax * Hk * Dv, Hk * Dv, Dv, 1};
    auto cache = [&](index_t len) { return attnkit::view<const float, 4>(v_cache.data(), {B, len, Hk, Dv}, strides); };

    tensor4 out_map(B, prompt, H, Dv), out_kernel(B, prompt, H, Dv);
    map.apply(cache(prompt), out_map, &pool);
    attnkit::static_qk_attention(q_fixed, k_fixed, cache(prompt), out_kernel, opts);
    float diff = 0.0f;
    for (index_t i = 0; i < out_map.size(); ++i) diff = std::max(diff, std::fabs(out_map.data()[i] - out_kernel.data()[i]));
    std::printf("prefill: %ld items x %ld tokens; map vs kernel max |diff| = %.2e\n", static_cast<long>(B),
                static_cast<long>(prompt), static_cast<double>(diff));

    // 3. Decode: the step at length len reads the cache [0, len) and row len - 1 of each head.
    tensor4 out1(B, 1, H, Dv);
    for (index_t t = 0; t < steps; ++t) {
        const index_t len = prompt + t + 1;  // the new token's V is already in the cache
        map.apply(cache(len), out1, &pool);
        float norm = 0.0f;
        for (index_t c = 0; c < Dv; ++c) norm += out1(0, 0, 0, c) * out1(0, 0, 0, c);
        std::printf("decode step %ld: %ld cached values, |out[0, head 0]| = %.4f\n", static_cast<long>(t),
                    static_cast<long>(len), std::sqrt(norm));
    }

    // The last decode step equals the last row of a full call over the same cache.
    const index_t len = prompt + steps;
    tensor4 full(B, len, H, Dv);
    attnkit::static_qk_attention(q_fixed, k_fixed, cache(len), full, opts);
    float step_diff = 0.0f;
    for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < H; ++h)
            for (index_t c = 0; c < Dv; ++c) step_diff = std::max(step_diff, std::fabs(out1(b, 0, h, c) - full(b, len - 1, h, c)));
    std::printf("last decode step vs full call: max |diff| = %.2e\n", static_cast<double>(step_diff));
    return diff < 1e-4f && step_diff < 1e-4f ? 0 : 1;
}
