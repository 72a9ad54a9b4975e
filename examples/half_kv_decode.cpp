// Decode against a bfloat16 KV cache and a half one: the same call as with float tensors, the
// kernel converting in its loads, checked against the reference on the stored values.
#include <attnkit/attnkit.hpp>

#include <cmath>
#include <cstdio>
#include <random>

int main() {
    using T4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
    const long B = 1, Lk = 4096, H = 8, Hk = 2, D = 128;
    std::mt19937 gen(1);
    std::normal_distribution<float> n01;
    T4 q(B, 1, H, D), out(B, 1, H, D), ref(B, 1, H, D);
    Eigen::Tensor<Eigen::bfloat16, 4, Eigen::RowMajor> kb(B, Lk, Hk, D), vb(B, Lk, Hk, D);
    Eigen::Tensor<Eigen::half, 4, Eigen::RowMajor> kh(B, Lk, Hk, D), vh(B, Lk, Hk, D);
    for (long i = 0; i < q.size(); ++i) q.data()[i] = n01(gen);
    for (long i = 0; i < kb.size(); ++i) {
        const float k = n01(gen), v = n01(gen);
        kb.data()[i] = Eigen::bfloat16(k), vb.data()[i] = Eigen::bfloat16(v);
        kh.data()[i] = Eigen::half(k), vh.data()[i] = Eigen::half(v);
    }
    attnkit::thread_pool pool(2);
    attnkit::softmax_options o;
    o.pool = &pool;
    double worst = 0;
    attnkit::softmax_attention(q, kb, vb, out, o);
    attnkit::reference::softmax_attention(q, kb, vb, ref, o);
    for (long i = 0; i < out.size(); ++i) worst = std::fmax(worst, std::fabs(out.data()[i] - ref.data()[i]));
    std::printf("bf16 cache: max |kernel - reference| = %.3g\n", worst);
    const double bf16_err = worst;
    worst = 0;
    attnkit::softmax_attention(q, kh, vh, out, o);
    attnkit::reference::softmax_attention(q, kh, vh, ref, o);
    for (long i = 0; i < out.size(); ++i) worst = std::fmax(worst, std::fabs(out.data()[i] - ref.data()[i]));
    std::printf("f16 cache:  max |kernel - reference| = %.3g\n", worst);
    return (bf16_err < 1e-4 && worst < 1e-4) ? 0 : 1;
}
