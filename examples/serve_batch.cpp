// Continuous batching over a paged bfloat16 KV cache: requests arrive at different steps with
// prompts of different lengths, prompts are prefilled in chunks under a per-step token budget
// while other sequences decode, finished sequences release their pages to the next arrivals.
// Each step is one kv_cache::begin_step and, per layer, one append (K rotated by RoPE on the
// way in) and one attention call over the whole ragged batch. The "model" is a stand-in (random
// projections, residual, no MLP or LM head): the cache, the batch and the calls are the template.
#include <attnkit/attnkit.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

using index_t = attnkit::index_t;
using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using packed = Eigen::Tensor<T, 3, Eigen::RowMajor>;

constexpr index_t kLayers = 2, kHeads = 8, kHeadsKv = 2, kDim = 64, kModel = kHeads * kDim;
constexpr index_t kTokenBudget = 256;  // new tokens per step (prefill chunks + decode tokens)

struct request {
    index_t arrival = 0, prompt = 0,
            generate = 0;  // step it arrives, prompt tokens, tokens to generate
    index_t id = -1, prefilled = 0, generated = 0;
    std::vector<float> hidden;  // the hidden state of its next input token (the stand-in's output)
};

}  // namespace

int main() {
    std::mt19937 gen(7);
    std::normal_distribution<float> n01;
    std::vector<matrix> wq, wk, wv;
    for (index_t l = 0; l < kLayers; ++l) {
        wq.push_back(matrix::NullaryExpr(kModel, kHeads * kDim, [&] { return 0.05f * n01(gen); }));
        wk.push_back(
            matrix::NullaryExpr(kModel, kHeadsKv * kDim, [&] { return 0.05f * n01(gen); }));
        wv.push_back(
            matrix::NullaryExpr(kModel, kHeadsKv * kDim, [&] { return 0.05f * n01(gen); }));
    }

    attnkit::kv_cache_config cfg;
    cfg.layers = kLayers;
    cfg.heads_kv = kHeadsKv;
    cfg.dim = kDim;
    cfg.pages = 160;  // 10240 tokens in all: fewer than the requests' total, so pages get reused
    cfg.page_rows = 64;
    attnkit::kv_cache<Eigen::bfloat16> cache(cfg);
    attnkit::model::rope_options rope;
    rope.theta = 500000.0f;  // Llama 3 style; q gets the same rotation at the same positions
    attnkit::thread_pool pool(2);
    attnkit::softmax_options opts;
    opts.causal = true;
    opts.pool = &pool;

    std::vector<request> requests;
    for (index_t r = 0; r < 16; ++r) {
        request q;
        q.arrival = r * 3;
        q.prompt = 64 + (r * 397) % 700;
        q.generate = 16 + (r * 7) % 40;
        requests.push_back(q);
    }

    index_t steps = 0, tokens = 0, peak_pages = 0;
    double worst = 0.0, check_seconds = 0.0;
    const auto t0 = std::chrono::steady_clock::now();
    for (;; ++steps) {
        // Admit arrivals while pages remain for their prompts (a simple scheduler).
        std::vector<request*> batch;
        std::vector<index_t> new_tokens;
        // Pages are promised to a request at admission, for its prompt and its whole generation,
        // so that a running sequence never finds the cache full.
        auto pages_for = [&](const request& r) {
            return (r.prompt + r.generate + cfg.page_rows - 1) / cfg.page_rows;
        };
        index_t budget = kTokenBudget, pages_left = cache.free_pages();
        for (const request& r : requests)
            if (r.id >= 0 && r.generated < r.generate)
                pages_left -= pages_for(r) - static_cast<index_t>(cache.pages_of(r.id).size());
        bool pending = false;
        for (request& r : requests) {
            if (r.generated == r.generate) continue;
            pending = true;
            if (r.arrival > steps) continue;
            if (r.id < 0) {
                const index_t need = pages_for(r);
                if (need > pages_left) continue;  // waits for pages
                pages_left -= need;
                r.id = cache.add_sequence();
            }
            const index_t n = r.prefilled < r.prompt ? std::min(budget, r.prompt - r.prefilled) : 1;
            if (n == 0 || budget < n) continue;
            budget -= n;
            batch.push_back(&r);
            new_tokens.push_back(n);
        }
        if (!pending) break;
        if (batch.empty()) continue;
        std::vector<index_t> ids;
        for (const request* r : batch) ids.push_back(r->id);
        const attnkit::kv_step step = cache.begin_step(ids, new_tokens);
        const index_t T = step.tokens();

        // Input hidden states: prompt tokens are random embeddings, a decode token is the
        // stand-in model's last output for that sequence.
        matrix x(T, kModel);
        for (std::size_t i = 0; i < batch.size(); ++i) {
            for (std::int64_t t = step.kv.cu_seqlens_q[i]; t < step.kv.cu_seqlens_q[i + 1]; ++t)
                for (index_t c = 0; c < kModel; ++c)
                    x(t, c) =
                        batch[i]->prefilled < batch[i]->prompt ? n01(gen) : batch[i]->hidden[c];
        }
        for (index_t l = 0; l < kLayers; ++l) {
            matrix q = x * wq[l], k = x * wk[l], v = x * wv[l];
            attnkit::model::rope(attnkit::view<float, 4>(q.data(), {1, T, kHeads, kDim}),
                                 step.positions_tensor(), rope);
            cache.append(l, step, attnkit::view<const float, 3>(k.data(), {T, kHeadsKv, kDim}),
                         attnkit::view<const float, 3>(v.data(), {T, kHeadsKv, kDim}), rope);
            matrix out(T, kModel);
            const attnkit::view<const float, 3> qv(q.data(), {T, kHeads, kDim});
            cache.attention(l, step, qv, attnkit::view<float, 3>(out.data(), {T, kHeads, kDim}),
                            opts);
            if (l == 0 &&
                steps % 25 == 0) {  // now and then, the oracle on the same pages (untimed)
                const auto c0 = std::chrono::steady_clock::now();
                packed<double> ref(T, kHeads, kDim);
                attnkit::reference::paged_attention(qv, cache.k_pages(l), cache.v_pages(l), step.kv,
                                                    ref, opts);
                for (index_t t = 0; t < T; ++t)
                    for (index_t c = 0; c < kModel; ++c)
                        worst = std::max(worst, std::fabs(out(t, c) - ref.data()[t * kModel + c]));
                check_seconds +=
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
            }
            x += out;  // residual
        }
        peak_pages = std::max(peak_pages, cfg.pages - cache.free_pages());
        tokens += T;

        // Advance each sequence; a finished one releases its pages.
        for (std::size_t i = 0; i < batch.size(); ++i) {
            request& r = *batch[i];
            if (r.prefilled < r.prompt) r.prefilled += new_tokens[i];
            if (r.prefilled == r.prompt) {
                const std::int64_t last = step.kv.cu_seqlens_q[i + 1] - 1;
                r.hidden.assign(x.row(last).data(), x.row(last).data() + kModel);
                if (new_tokens[i] == 1 || r.generated == 0) ++r.generated;
            }
            if (r.generated == r.generate) cache.release(r.id);
        }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
        check_seconds;
    std::printf(
        "%zu requests, %ld steps, %ld tokens in %.3f s: %.0f tokens/s; peak %ld of %ld pages in "
        "use\n",
        requests.size(), static_cast<long>(steps), static_cast<long>(tokens), seconds,
        tokens / seconds, static_cast<long>(peak_pages), static_cast<long>(cfg.pages));
    std::printf("attention against the reference on the same bf16 pages: max |difference| = %.3g\n",
                worst);
    return worst < 1e-3 ? 0 : 1;
}
