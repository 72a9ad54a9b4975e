// Taylor ("Approximate") attention in an inference loop: a causal prefill with the automatic
// form, then token-by-token decoding with attnkit::taylor_state, whose cost per step stops
// growing with the context once it has folded its cache into S (st.fold_length() tokens; a
// softmax decode step reads the whole K/V cache at any length; printed beside it).
//   taylor_attention [max_len]      decode up to max_len tokens of context (default 8192)
#include <attnkit/attnkit.hpp>
#include <attnkit/taylor_attention.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using clock_type = std::chrono::steady_clock;

int main(int argc, char** argv) {
    const attnkit::index_t B = 1, H = 8, Hk = 8, D = 64, prompt = 1024;
    const attnkit::index_t max_len = argc > 1 ? std::atol(argv[1]) : 8192;
    if (max_len < 2 * prompt) {
        std::fprintf(stderr, "usage: taylor_attention [max_len >= %ld]\n", static_cast<long>(2 * prompt));
        return 2;
    }

    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    auto randomize = [&](tensor4& t) {
        for (attnkit::index_t i = 0; i < t.size(); ++i) t.data()[i] = normal(rng);
    };

    attnkit::thread_pool pool(2);
    attnkit::taylor_options opts;
    opts.causal = true;
    opts.pool = &pool;  // form = automatic: the cost model picks quadratic or linear

    // K/V of every token, kept only to run the softmax comparison at the end.
    tensor4 k_all(B, max_len, Hk, D), v_all(B, max_len, Hk, D);
    randomize(k_all);
    randomize(v_all);
    auto tokens = [&](const tensor4& x, attnkit::index_t t0, attnkit::index_t n) {
        return attnkit::view<const float, 4>(x.data() + t0 * Hk * D, {B, n, Hk, D}, {max_len * Hk * D, Hk * D, D, 1});
    };

    // Prefill: all prompt queries at once.
    tensor4 q(B, prompt, H, D), out(B, prompt, H, D), out_state(B, prompt, H, D);
    randomize(q);
    auto t0 = clock_type::now();
    attnkit::taylor_attention(q, tokens(k_all, 0, prompt), tokens(v_all, 0, prompt), out, opts);
    const double t_prefill = std::chrono::duration<double>(clock_type::now() - t0).count();

    // The state takes the prompt as one step (the same outputs, through the linear form), then
    // one token per step.
    attnkit::taylor_state st(B, H, Hk, D, D, opts);
    st.step(q, tokens(k_all, 0, prompt), tokens(v_all, 0, prompt), out_state);
    double max_diff = 0.0;
    for (attnkit::index_t i = 0; i < out.size(); ++i)
        max_diff = std::fmax(max_diff, std::fabs(out.data()[i] - out_state.data()[i]));
    std::printf("prefill of %ld tokens: %.1f ms; state prefill matches within %.2e; state %.2f MB\n",
                static_cast<long>(prompt), t_prefill * 1e3, max_diff, static_cast<double>(st.state_bytes()) / 1e6);

    tensor4 q1(B, 1, H, D), out1(B, 1, H, D);
    attnkit::index_t report_at = 2 * prompt;
    double window = 0.0;
    attnkit::index_t window_steps = 0;
    while (st.length() < max_len) {
        randomize(q1);
        const attnkit::index_t n = st.length();
        t0 = clock_type::now();
        st.step(q1, tokens(k_all, n, 1), tokens(v_all, n, 1), out1);
        window += std::chrono::duration<double>(clock_type::now() - t0).count();
        ++window_steps;
        if (st.length() == report_at) {
            std::printf("context %5ld: taylor_state step %.3f ms (mean of %ld steps), out[0, 0, 0, :3] = %.4f %.4f %.4f\n",
                        static_cast<long>(st.length()), window / static_cast<double>(window_steps) * 1e3,
                        static_cast<long>(window_steps), out1(0, 0, 0, 0), out1(0, 0, 0, 1), out1(0, 0, 0, 2));
            report_at *= 2;
            window = 0.0;
            window_steps = 0;
        }
    }

    // For contrast: one softmax decode step against the whole cache of the same length.
    attnkit::softmax_options so;
    so.causal = true;
    so.pool = &pool;
    const int reps = 5;
    t0 = clock_type::now();
    for (int r = 0; r < reps; ++r) attnkit::softmax_attention(q1, k_all, v_all, out1, so);
    std::printf("context %5ld: softmax_attention decode step %.3f ms (reads the %.1f MB K/V cache)\n",
                static_cast<long>(max_len),
                std::chrono::duration<double>(clock_type::now() - t0).count() / reps * 1e3,
                2.0 * static_cast<double>(k_all.size()) * sizeof(float) / 1e6);
    return 0;
}
