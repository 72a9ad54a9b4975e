// The decoder template: a hybrid schedule of standard attention and one variant, a prompt
// prefilled, then greedy decoding. Copy this file to start a model.
//
//   hybrid_decoder [--schedule NAME] [--variant NAME] [--layers N] [--d-model N] [--heads N]
//                  [--heads-kv N] [--prompt N] [--new N] [--threads N] [--seed N]
//
//   hybrid_decoder --schedule middle --variant taylor
//
// Schedules: uniform, hybrid (= even), odd, top, middle, bottom, 25%, first, last, bilateral
// (layers that keep standard attention, Xue et al.). Variants: standard, taylor, self_gating,
// rnd_emb_qk, fixed_seq_qk, embedding_qk, mlp, mta. Weights are random from the seed (nothing
// is downloaded), so the tokens mean nothing; the speed and the plumbing are the point.
#include <attnkit/model/decoder.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    using namespace attnkit::model;
    decoder_config cfg;  // the 70M shape of Xue et al.: d_model 512, 6 layers, 8 heads
    cfg.schedule = "middle";
    cfg.variant = attention_variant::taylor;
    int prompt_len = 128, new_tokens = 32, threads = 1;
    try {
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            if (i + 1 >= argc) throw std::invalid_argument("missing value after " + a);
            const std::string v = argv[++i];
            if (a == "--schedule") cfg.schedule = v;
            else if (a == "--variant") cfg.variant = parse_attention_variant(v);
            else if (a == "--layers") cfg.layers = std::stoll(v);
            else if (a == "--d-model") cfg.d_model = std::stoll(v);
            else if (a == "--heads") cfg.heads = std::stoll(v);
            else if (a == "--heads-kv") cfg.heads_kv = std::stoll(v);
            else if (a == "--prompt") prompt_len = std::stoi(v);
            else if (a == "--new") new_tokens = std::stoi(v);
            else if (a == "--threads") threads = std::stoi(v);
            else if (a == "--seed") cfg.seed = std::stoull(v);
            else throw std::invalid_argument("unknown option " + a);
        }
        if (prompt_len < 1 || new_tokens < 0 || threads < 1) throw std::invalid_argument("--prompt >= 1, --new >= 0, --threads >= 1");
        cfg.max_length = prompt_len + new_tokens;
        attnkit::thread_pool pool(static_cast<std::size_t>(threads));
        cfg.pool = threads > 1 ? &pool : nullptr;

        decoder model(cfg);
        std::printf("decoder: d_model %lld, %lld layers, %lld heads (%lld kv), schedule %s, variant %s\n",
                    static_cast<long long>(cfg.d_model), static_cast<long long>(cfg.layers),
                    static_cast<long long>(cfg.heads), static_cast<long long>(cfg.heads_kv), cfg.schedule.c_str(),
                    attention_variant_name(cfg.variant).c_str());
        for (std::size_t l = 0; l < model.layer_kinds().size(); ++l)
            std::printf("  layer %2zu: %s\n", l + 1, attention_variant_name(model.layer_kinds()[l]).c_str());

        std::vector<std::int32_t> prompt;
        for (int i = 0; i < prompt_len; ++i) prompt.push_back(static_cast<std::int32_t>((i * 131 + 7) % cfg.vocab));
        using clock = std::chrono::steady_clock;
        auto t0 = clock::now();
        std::vector<float> logits = model.prefill(prompt);
        const double prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
        const decoder_profile pp = model.profile();

        std::vector<std::int32_t> out;
        t0 = clock::now();
        for (int s = 0; s < new_tokens; ++s) {
            const auto next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
            out.push_back(next);
            if (s + 1 < new_tokens) logits = model.decode_step(next);
        }
        const double decode_s = std::chrono::duration<double>(clock::now() - t0).count();

        std::printf("prefill: %d tokens in %.1f ms, %.0f tokens/s (%.0f%% in attnkit kernels and GEMMs)\n", prompt_len,
                    prefill_s * 1e3, prompt_len / prefill_s, 100.0 * (pp.kernels + pp.gemm) / pp.total());
        if (new_tokens > 1)
            std::printf("decode:  %d tokens in %.1f ms, %.0f tokens/s\n", new_tokens - 1, decode_s * 1e3,
                        (new_tokens - 1) / decode_s);
        std::printf("greedy tokens:");
        for (std::int32_t t : out) std::printf(" %d", t);
        std::printf("\n");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "hybrid_decoder: %s\n", e.what());
        return 1;
    }
    return 0;
}
