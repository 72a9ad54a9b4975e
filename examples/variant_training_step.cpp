// Training steps through the papers' token-mixing variants: Taylor ("Approximate") attention,
// self-gating ("Non-approximate") attention and a learned causal mixing matrix (MLP-Mixer style
// token mixing, static_attention_map::from_weights). Each fits its parameters by gradient
// descent so that the output matches a target, as examples/training_step.cpp does for softmax
// attention: forward, loss, backward, update. In a model the inputs come from projections and
// the gradients flow on into their weights.
#include <attnkit/attnkit.hpp>

#include <cstdio>

namespace {

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;

// loss = mean((out - target)^2) / 2; writes d_out = (out - target) / n and returns the loss.
float mse_loss(const tensor4& out, const tensor4& target, tensor4& d_out) {
    const float n = static_cast<float>(out.size());
    const tensor4 diff = out - target;
    const Eigen::Tensor<float, 0, Eigen::RowMajor> sq = (diff * diff).sum();
    d_out = diff / n;
    return 0.5f * sq() / n;
}

// Runs `step` (one forward, backward and update, returning the loss) and reports the fit.
template <class Step>
bool fit(const char* name, int steps, Step step) {
    float first = 0.0f, last = 0.0f;
    for (int s = 0; s < steps; ++s) {
        last = step();
        if (s == 0) first = last;
    }
    std::printf("%-12s loss %.5f -> %.5f\n", name, first, last);
    return last < 0.5f * first;
}

}  // namespace

int main() {
    const long B = 2, L = 32, H = 4, Hk = 2, D = 16;  // grouped-query: 2 query heads per K/V head
    attnkit::thread_pool pool(2);

    tensor4 target(B, L, H, D), out(B, L, H, D), d_out(B, L, H, D);
    target.setRandom();
    const float n = static_cast<float>(out.size());  // gradients of a mean are small: steps of lr / n

    // Taylor attention (opts.form picks the quadratic or linear form, forward and backward alike).
    tensor4 q(B, L, H, D), k(B, L, Hk, D), v(B, L, Hk, D);
    tensor4 d_q(B, L, H, D), d_k(B, L, Hk, D), d_v(B, L, Hk, D);
    q.setRandom(), k.setRandom(), v.setRandom();
    attnkit::taylor_options taylor;
    taylor.causal = true;
    taylor.pool = &pool;
    const bool taylor_ok = fit("taylor", 100, [&, lr = 0.5f * n] {
        attnkit::taylor_attention(q, k, v, out, taylor);
        const float loss = mse_loss(out, target, d_out);
        attnkit::taylor_attention_backward(q, k, v, out, d_out, d_q, d_k, d_v, taylor);
        q -= lr * d_q, k -= lr * d_k, v -= lr * d_v;
        return loss;
    });

    // Self-gating attention.
    q.setRandom(), k.setRandom(), v.setRandom();
    attnkit::self_gating_options gating;
    gating.causal = true;
    gating.pool = &pool;
    const bool gating_ok = fit("self-gating", 200, [&, lr = 0.5f * n] {
        attnkit::self_gating_attention(q, k, v, out, gating);
        const float loss = mse_loss(out, target, d_out);
        attnkit::self_gating_attention_backward(q, k, v, out, d_out, d_q, d_k, d_v, gating);
        q -= lr * d_q, k -= lr * d_k, v -= lr * d_v;
        return loss;
    });

    // A learned causal mixing matrix per head, w [H, L, L] (only its lower triangle is used),
    // mixing the value rows; w and v are the parameters.
    tensor3 w(H, L, L), d_w(H, L, L);
    w.setConstant(1.0f / static_cast<float>(L));
    v.setRandom();
    const bool mixing_ok = fit("mixing", 100, [&, lr = 0.01f * n] {
        attnkit::static_attention_map::from_weights(w).apply(v, out, &pool);
        const float loss = mse_loss(out, target, d_out);
        attnkit::static_attention_map_backward(w, v, d_out, d_w, d_v, &pool);
        w -= lr * d_w, v -= lr * d_v;
        return loss;
    });

    return taylor_ok && gating_ok && mixing_ok ? 0 : 1;
}
