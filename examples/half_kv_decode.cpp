// Decode against a bfloat16 KV cache, a half one and an int8 one (values and a scale per token
// and head, from attnkit::quantize_kv): the same call as with float tensors, the kernel
// converting in its loads, checked against the reference on the stored values; the int8 result
// also against float K/V.
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
    T4 kf(B, Lk, Hk, D), vf(B, Lk, Hk, D);
    for (long i = 0; i < q.size(); ++i) q.data()[i] = n01(gen);
    for (long i = 0; i < kb.size(); ++i) {
        const float k = n01(gen), v = n01(gen);
        kb.data()[i] = Eigen::bfloat16(k), vb.data()[i] = Eigen::bfloat16(v);
        kh.data()[i] = Eigen::half(k), vh.data()[i] = Eigen::half(v);
        kf.data()[i] = k, vf.data()[i] = v;
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
    const double f16_err = worst;

    // int8: a quarter of float's bytes. Quantise once (a cache would quantise each appended
    // token), then pass values and scales together as an attnkit::int8_kv.
    Eigen::Tensor<std::int8_t, 4, Eigen::RowMajor> k8(B, Lk, Hk, D), v8(B, Lk, Hk, D);
    Eigen::Tensor<float, 3, Eigen::RowMajor> ks(B, Lk, Hk), vs(B, Lk, Hk);
    attnkit::quantize_kv(kf, k8, ks);
    attnkit::quantize_kv(vf, v8, vs);
    const attnkit::int8_kv k_int8(k8, ks), v_int8(v8, vs);
    attnkit::softmax_attention(q, k_int8, v_int8, out, o);
    attnkit::reference::softmax_attention(q, k_int8, v_int8, ref, o);
    worst = 0;
    for (long i = 0; i < out.size(); ++i) worst = std::fmax(worst, std::fabs(out.data()[i] - ref.data()[i]));
    T4 exact(B, 1, H, D);
    attnkit::reference::softmax_attention(q, kf, vf, exact, o);
    double to_float = 0, magnitude = 0;
    for (long i = 0; i < out.size(); ++i) {
        to_float = std::fmax(to_float, std::fabs(out.data()[i] - exact.data()[i]));
        magnitude = std::fmax(magnitude, std::fabs(exact.data()[i]));
    }
    std::printf("int8 cache: max |kernel - reference| = %.3g; against float K/V %.3g (output magnitude %.3g)\n",
                worst, to_float, magnitude);
    return (bf16_err < 1e-4 && f16_err < 1e-4 && worst < 1e-4 && to_float < 0.05 * magnitude) ? 0 : 1;
}
