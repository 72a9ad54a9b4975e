// A training step through softmax attention: forward with lse, a loss, the backward pass, and an
// update. Here q, k and v themselves are the parameters, fitted by gradient descent so that the
// causal attention output matches a target; in a model they come from projections, and d_q,
// d_k, d_v flow back into those projections' weights.
#include <attnkit/attnkit.hpp>

#include <cstdio>

int main() {
    using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
    using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
    const long B = 2, L = 32, H = 4, Hk = 2, D = 16;  // grouped-query: 2 query heads per K/V head

    tensor4 q(B, L, H, D), k(B, L, Hk, D), v(B, L, Hk, D), target(B, L, H, D);
    q.setRandom();
    k.setRandom();
    v.setRandom();
    target.setRandom();

    attnkit::thread_pool pool(2);
    attnkit::softmax_options opts;
    opts.causal = true;
    opts.pool = &pool;

    tensor4 out(B, L, H, D), d_out(B, L, H, D), d_q(B, L, H, D), d_k(B, L, Hk, D), d_v(B, L, Hk, D);
    tensor3 lse(B, L, H);  // the forward's log-sum-exp: the backward recomputes P from it
    const float n = static_cast<float>(out.size());
    const float lr = 0.5f * n;  // per-element gradients of a mean are small: step by lr / n each
    float first = 0.0f, last = 0.0f;
    for (int step = 0; step < 100; ++step) {
        attnkit::softmax_attention(q, k, v, out, lse, opts);
        // loss = mean((out - target)^2) / 2, so d_out = (out - target) / n.
        const tensor4 diff = out - target;
        const Eigen::Tensor<float, 0, Eigen::RowMajor> sq = (diff * diff).sum();
        const float loss = 0.5f * sq() / n;
        d_out = diff / n;
        if (step == 0) first = loss;
        last = loss;
        if (step % 20 == 0) std::printf("step %2d: loss %.5f\n", step, loss);

        attnkit::softmax_attention_backward(q, k, v, out, lse, d_out, d_q, d_k, d_v, opts);
        q -= lr * d_q;
        k -= lr * d_k;
        v -= lr * d_v;
    }
    std::printf("loss %.5f -> %.5f\n", first, last);
    return last < 0.5f * first ? 0 : 1;
}
