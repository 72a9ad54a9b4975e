// Self-gating ("Non-approximate") attention in an inference loop: prefill a prompt into a
// self_gating_state, then decode one token per step. The state is (max, sum, weighted sum of
// values) per head, O(H * Dv) floats whatever the length: there is no KV cache to grow.
//
// At the end, the outputs of prefill + decode are compared with one causal call over the whole
// sequence (the rows must agree to float rounding).
#include <attnkit/eigen.hpp>  // Eigen's Tensor module, for the tensors below
#include <attnkit/self_gating_attention.hpp>
#include <attnkit/thread_pool.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using attnkit::index_t;

int main() {
    const index_t B = 1, H = 8, Hk = 2, D = 64, Dv = 64;  // GQA: 4 query heads per key/value head
    const index_t prompt = 300, steps = 6, total = prompt + steps;

    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    tensor4 q(B, total, H, D), k(B, total, Hk, D), v(B, total, Hk, Dv);
    for (tensor4* t : {&q, &k, &v})
        for (index_t i = 0; i < t->size(); ++i) t->data()[i] = normal(rng);

    attnkit::thread_pool pool(2);
    attnkit::self_gating_options opts;
    opts.pool = &pool;
    attnkit::self_gating_state state(B, H, Hk, D, Dv, opts);

    // Prefill: the whole prompt in one step (the same schedule as a causal call).
    auto rows = [](const tensor4& x, index_t from, index_t n) {
        Eigen::array<Eigen::Index, 4> off{0, from, 0, 0}, ext{x.dimension(0), n, x.dimension(2), x.dimension(3)};
        tensor4 r = x.slice(off, ext);
        return r;
    };
    tensor4 out_prompt(B, prompt, H, Dv);
    state.step(rows(q, 0, prompt), rows(k, 0, prompt), rows(v, 0, prompt), out_prompt);
    std::printf("prefill: %ld tokens, out[0, last, 0, :3] = %.4f %.4f %.4f\n", static_cast<long>(prompt),
                out_prompt(0, prompt - 1, 0, 0), out_prompt(0, prompt - 1, 0, 1), out_prompt(0, prompt - 1, 0, 2));

    // Decode: one token per step; a model would produce q, k, v of the new token here.
    tensor4 out_steps(B, steps, H, Dv), out1(B, 1, H, Dv);
    for (index_t t = 0; t < steps; ++t) {
        state.step(rows(q, prompt + t, 1), rows(k, prompt + t, 1), rows(v, prompt + t, 1), out1);
        float norm = 0.0f;
        for (index_t c = 0; c < Dv; ++c) {
            norm += out1(0, 0, 0, c) * out1(0, 0, 0, c);
            for (index_t h = 0; h < H; ++h) out_steps(0, t, h, c) = out1(0, 0, h, c);
        }
        std::printf("decode step %ld: state length %ld, |out[head 0]| = %.4f\n", static_cast<long>(t),
                    static_cast<long>(state.length()), std::sqrt(norm));
    }

    // The same rows from one causal call over the whole sequence.
    opts.causal = true;
    tensor4 full(B, total, H, Dv);
    attnkit::self_gating_attention(q, k, v, full, opts);
    float diff = 0.0f;
    for (index_t t = 0; t < total; ++t)
        for (index_t h = 0; h < H; ++h)
            for (index_t c = 0; c < Dv; ++c) {
                const float got = t < prompt ? out_prompt(0, t, h, c) : out_steps(0, t - prompt, h, c);
                diff = std::max(diff, std::fabs(got - full(0, t, h, c)));
            }
    std::printf("max |prefill+decode - causal call| = %.3g\n", diff);
    return diff < 1e-4f ? 0 : 1;
}
