// The "MLP" variant of Xue et al.: a pre-norm transformer block whose attention slot holds a
// gated MLP instead, so the block has no token mixing (and no KV cache):
//
//   h   = x + gated_mlp(rms_norm(x), W_gate^mix, W_up^mix, W_down^mix)    (the attention slot)
//   out = h + gated_mlp(rms_norm(h), W_gate^ffn, W_up^ffn, W_down^ffn)    (the usual FFN)
//
// The mixer's width m = gated_mlp_width(d_model) gives it the 4 d_model^2 parameters of the
// attention sublayer it replaces. The example runs a [B, L, d_model] batch through the block on
// a thread pool, checks one call against the reference, and shows that changing one token
// changes no other token's output.
#include <attnkit/attnkit.hpp>

#include <cmath>
#include <cstdio>
#include <random>

using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;

struct mlp_weights {
    tensor2 gate, up, down;
};

static mlp_weights make_weights(attnkit::index_t d, attnkit::index_t m, std::mt19937& rng) {
    std::normal_distribution<float> normal;
    mlp_weights w{tensor2(d, m), tensor2(d, m), tensor2(m, d)};
    for (tensor2* t : {&w.gate, &w.up, &w.down}) {
        const float s = 1.0f / std::sqrt(static_cast<float>(t->dimension(0)));
        for (attnkit::index_t i = 0; i < t->size(); ++i) t->data()[i] = normal(rng) * s;
    }
    return w;
}

static void rms_norm(const tensor3& x, tensor3& y) {
    const attnkit::index_t d = x.dimension(2);
    for (attnkit::index_t b = 0; b < x.dimension(0); ++b)
        for (attnkit::index_t t = 0; t < x.dimension(1); ++t) {
            float ss = 0.0f;
            for (attnkit::index_t c = 0; c < d; ++c) ss += x(b, t, c) * x(b, t, c);
            const float r = 1.0f / std::sqrt(ss / static_cast<float>(d) + 1e-6f);
            for (attnkit::index_t c = 0; c < d; ++c) y(b, t, c) = x(b, t, c) * r;
        }
}

// One block; `tmp` and `n` are scratch of x's shape.
static void block(const tensor3& x, const mlp_weights& mix, const mlp_weights& ffn, tensor3& out,
                  const attnkit::gated_mlp_options& o) {
    tensor3 n(x.dimensions()), y(x.dimensions()), h(x.dimensions());
    rms_norm(x, n);
    attnkit::gated_mlp(n, mix.gate, mix.up, mix.down, y, o);  // the attention slot
    for (attnkit::index_t i = 0; i < x.size(); ++i) h.data()[i] = x.data()[i] + y.data()[i];
    rms_norm(h, n);
    attnkit::gated_mlp(n, ffn.gate, ffn.up, ffn.down, y, o);
    for (attnkit::index_t i = 0; i < x.size(); ++i) out.data()[i] = h.data()[i] + y.data()[i];
}

int main() {
    const attnkit::index_t B = 2, L = 128, d = 192;
    const attnkit::index_t m = attnkit::gated_mlp_width(d);  // 256: 3 d m = 4 d^2 parameters
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    const mlp_weights mix = make_weights(d, m, rng), ffn = make_weights(d, 4 * d, rng);
    tensor3 x(B, L, d), out(B, L, d);
    for (attnkit::index_t i = 0; i < x.size(); ++i) x.data()[i] = normal(rng);

    attnkit::thread_pool pool(2);
    attnkit::gated_mlp_options o;
    o.pool = &pool;
    block(x, mix, ffn, out, o);
    std::printf("block: [%ld, %ld, %ld] -> out[0, 0, :4] = %.4f %.4f %.4f %.4f (mixer width m = %ld)\n",
                static_cast<long>(B), static_cast<long>(L), static_cast<long>(d), out(0, 0, 0), out(0, 0, 1),
                out(0, 0, 2), out(0, 0, 3), static_cast<long>(m));

    // The fast kernel agrees with the oracle on the mixer's input.
    tensor3 n(B, L, d), fast(B, L, d), ref(B, L, d);
    rms_norm(x, n);
    attnkit::gated_mlp(n, mix.gate, mix.up, mix.down, fast, o);
    attnkit::reference::gated_mlp(n, mix.gate, mix.up, mix.down, ref);
    float err = 0.0f, mag = 0.0f;
    for (attnkit::index_t i = 0; i < ref.size(); ++i) {
        err = std::max(err, std::abs(fast.data()[i] - ref.data()[i]));
        mag = std::max(mag, std::abs(ref.data()[i]));
    }
    std::printf("max |fast - reference| = %.2e (max |out| %.2f)\n", err, mag);

    // No token mixing: change token 5 of batch item 1, and only that token's output moves.
    tensor3 x2 = x, out2(B, L, d);
    for (attnkit::index_t c = 0; c < d; ++c) x2(1, 5, c) += 1.0f;
    block(x2, mix, ffn, out2, o);
    attnkit::index_t moved = 0, moved_elsewhere = 0;
    for (attnkit::index_t b = 0; b < B; ++b)
        for (attnkit::index_t t = 0; t < L; ++t)
            for (attnkit::index_t c = 0; c < d; ++c)
                if (out2(b, t, c) != out(b, t, c)) (b == 1 && t == 5 ? moved : moved_elsewhere)++;
    std::printf("perturbing token (1, 5): %ld of its %ld outputs changed, %ld elsewhere\n", static_cast<long>(moved),
                static_cast<long>(d), static_cast<long>(moved_elsewhere));
    return err <= 1e-4f * (1.0f + mag) && moved > 0 && moved_elsewhere == 0 ? 0 : 1;
}
