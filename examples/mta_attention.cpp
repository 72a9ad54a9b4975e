// Multi-token attention: one layer configured as in the paper's 830M models (key-query
// convolution 6 x 11 before and after the softmax, head mixing, group norm with a gate), run on a
// prompt with the fused kernel, checked against the oracle, then continued token by token with
// mta_state, whose outputs match the rows of one call over the whole sequence.
#include <attnkit/attnkit.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

using tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;

int main() {
    const attnkit::index_t B = 1, H = 8, D = 64, prompt = 300, steps = 20, L = prompt + steps;
    const attnkit::index_t cq = 6, ck = 11, c_h = 2;  // query taps, key taps, head-conv group
    std::mt19937 gen(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto randomise = [&](auto& t, float s) {
        for (attnkit::index_t i = 0; i < t.size(); ++i) t.data()[i] = s * normal(gen);
    };

    // Projections of a sequence (random here), BSHD.
    tensor4 q(B, L, H, D), k(B, L, H, D), v(B, L, H, D);
    randomise(q, 1.0f), randomise(k, 1.0f), randomise(v, 1.0f);

    // Identity-initialised kernels plus noise, as the models start training.
    tensor4 kq_pre(H, 1, cq, ck), kq_post(H, 1, cq, ck);
    randomise(kq_pre, 0.02f), randomise(kq_post, 0.02f);
    for (attnkit::index_t h = 0; h < H; ++h) kq_pre(h, 0, cq - 1, ck / 2) += 1.0f, kq_post(h, 0, cq - 1, ck / 2) += 1.0f;
    tensor2 head_pre(H, H), head_post(H, H);
    randomise(head_pre, 0.05f);
    for (attnkit::index_t h = 0; h < H; ++h) head_pre(h, h) += 1.0f;
    // The post-softmax head mixing as the paper's grouped head convolution [H / c_h, c_h, c_h].
    tensor3 head_kernel(H / c_h, c_h, c_h);
    randomise(head_kernel, 0.05f);
    for (attnkit::index_t g = 0; g < H / c_h; ++g)
        for (attnkit::index_t i = 0; i < c_h; ++i) head_kernel(g, i, i) += 1.0f;
    attnkit::mta_head_kernel_to_matrix(head_kernel, head_post);
    tensor1 norm_w(D), gate_w(D);
    norm_w.setConstant(1.0f);
    randomise(gate_w, 0.1f);

    attnkit::thread_pool pool(2);
    attnkit::mta_options o;
    o.kq_pre = kq_pre, o.head_pre = head_pre, o.kq_post = kq_post, o.head_post = head_post;
    o.norm_weight = norm_w, o.norm_layer = 3, o.gate_weight = gate_w, o.gate_bias = 0.0f;
    o.pool = &pool;

    // The whole sequence in one call: the rows the decode steps must reproduce.
    tensor4 full(B, L, H, D);
    auto t0 = std::chrono::steady_clock::now();
    attnkit::mta_attention(q, k, v, full, o);
    const double ms_full = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    // The prompt against the oracle (every stage materialised in double).
    Eigen::array<Eigen::Index, 4> off{0, 0, 0, 0}, ext{B, prompt, H, D};
    const tensor4 qp = q.slice(off, ext), kp = k.slice(off, ext), vp = v.slice(off, ext);
    tensor4 out_p(B, prompt, H, D);
    attnkit::mta_attention(qp, kp, vp, out_p, o);
    Eigen::Tensor<double, 4, Eigen::RowMajor> ref(B, prompt, H, D);
    attnkit::reference::mta_attention(qp, kp, vp, ref, o);
    double err_ref = 0;
    for (attnkit::index_t i = 0; i < out_p.size(); ++i)
        err_ref = std::max(err_ref, std::fabs(static_cast<double>(out_p.data()[i]) - ref.data()[i]));

    // Decode: the prompt in one step, then one token at a time.
    attnkit::mta_state st(B, H, H, D, D, o);
    tensor4 out_step(B, prompt, H, D);
    st.step(qp, kp, vp, out_step);
    double err_dec = 0;
    for (attnkit::index_t i = 0; i < out_step.size(); ++i)
        err_dec = std::max(err_dec, std::fabs(static_cast<double>(out_step.data()[i] - out_p.data()[i])));
    t0 = std::chrono::steady_clock::now();
    for (attnkit::index_t t = prompt; t < L; ++t) {
        Eigen::array<Eigen::Index, 4> o1{0, t, 0, 0}, e1{B, 1, H, D};
        const tensor4 q1 = q.slice(o1, e1), k1 = k.slice(o1, e1), v1 = v.slice(o1, e1);
        tensor4 y(B, 1, H, D);
        st.step(q1, k1, v1, y);
        for (attnkit::index_t h = 0; h < H; ++h)
            for (attnkit::index_t d = 0; d < D; ++d)
                err_dec = std::max(err_dec, std::fabs(static_cast<double>(y(0, 0, h, d) - full(0, t, h, d))));
    }
    const double ms_dec = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    std::printf("MTA layer: H = %lld, D = %lld, conv %lld x %lld pre and post, head mixing, group norm + gate\n",
                static_cast<long long>(H), static_cast<long long>(D), static_cast<long long>(cq),
                static_cast<long long>(ck));
    std::printf("  %lld tokens in one call: %.1f ms (2 threads)\n", static_cast<long long>(L), ms_full);
    std::printf("  prompt of %lld vs the oracle: max |diff| %.2e\n", static_cast<long long>(prompt), err_ref);
    std::printf("  %lld decode steps: %.2f ms per token; max |diff| to the full call %.2e\n",
                static_cast<long long>(steps), ms_dec / static_cast<double>(steps), err_dec);
    const bool ok = err_ref < 1e-4 && err_dec < 1e-4;
    std::printf("%s\n", ok ? "ok" : "MISMATCH");
    return ok ? 0 : 1;
}
