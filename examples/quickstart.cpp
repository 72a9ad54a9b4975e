// The smallest complete use of attnkit: Eigen tensors in [batch, seq, heads, dim], one call.
#include <attnkit/attnkit.hpp>

#include <cstdio>

int main() {
    using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
    const long B = 1, L = 6, H = 2, D = 8;

    tensor4 q(B, L, H, D), k(B, L, H, D), v(B, L, H, D), out(B, L, H, D);
    q.setRandom();
    k.setRandom();
    v.setRandom();

    attnkit::softmax_options opts;  // defaults: scale 1/sqrt(D), no mask, calling thread
    opts.causal = true;
    attnkit::softmax_attention(q, k, v, out, opts);

    for (long i = 0; i < L; ++i)
        std::printf("query %ld, head 0: out[:3] = %+.4f %+.4f %+.4f\n", i, out(0, i, 0, 0), out(0, i, 0, 1),
                    out(0, i, 0, 2));
    // Under the causal mask query 0 sees only key 0, so its output is v[0] exactly.
    return out(0, 0, 0, 0) == v(0, 0, 0, 0) ? 0 : 1;
}
