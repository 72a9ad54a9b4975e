// attnkit benchmarks: the attention diagnostics of Xue et al. (docs/variants.md section 9) of
// trained decoders (model/decoder.hpp), one table per variant, in Markdown.
//
//   attnkit_diagnostics_report [--length L] [--train-steps N] [--corpus DIR] [--output FILE.md]
//
// Every layer of the "uniform" schedule is the variant (standard: the plain model). Each model
// is the training comparison's text model (docs/training.md: d_model 64, 4 layers, 4 heads,
// bytes as tokens) trained for N steps (default 300, AdamW, cosine) on Debian's fortunes corpus
// (the first nine tenths), and diagnosed on a window of L characters from the held-out tenth:
// the maps a trained model uses on text it has not seen. --train-steps 0 keeps the seeded
// weights (N(0, 0.02)): the baseline, whose maps are near uniform for every variant.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "attnkit/diagnostics.hpp"
#include "attnkit/model/adamw.hpp"
#include "attnkit/model/decoder.hpp"
#include "attnkit/model/tasks.hpp"

namespace {

const char* const kUsage =
    "usage: attnkit_diagnostics_report [--length L] [--train-steps N] [--corpus DIR] [--output FILE.md]   (L >= 1, "
    "default 128; N >= 0, default 300; DIR default /usr/share/games/fortunes)";

constexpr double kMaxMapBytes = 4.0 * (1 << 30);

struct arguments {
    long long length = 128;
    long long train_steps = 300;
    std::string output, corpus = "/usr/share/games/fortunes";
};

[[noreturn]] void usage_error(const std::string& what) {
    std::cerr << "attnkit_diagnostics_report: " << what << "\n" << kUsage << "\n";
    std::exit(2);
}

// The whole of `text` as an integer >= 1, or a usage error naming the option.
long long positive_integer(const char* option, const std::string& text) {
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || x < 1)
        usage_error(std::string(option) + ": expected an integer >= 1, got '" + text + "'");
    return x;
}

// The training comparison's text model (bench/train_compare.cpp), long enough for L.
attnkit::model::decoder_config model_config(long long length) {
    attnkit::model::decoder_config c;
    c.vocab = 256;
    c.d_model = 64;
    c.layers = 4;
    c.heads = 4;
    c.heads_kv = 4;
    c.max_length = std::max<long long>(length, 64);
    return c;
}

arguments parse(int argc, char** argv) {
    arguments r;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::cout << kUsage << "\n";
            std::exit(0);
        }
        if (a != "--length" && a != "--output" && a != "--train-steps" && a != "--corpus")
            usage_error("unknown argument '" + a + "'");
        if (i + 1 >= argc) usage_error(a + ": missing value");
        const std::string value = argv[++i];
        if (a == "--length") r.length = positive_integer("--length", value);
        else if (a == "--train-steps") r.train_steps = value == "0" ? 0 : positive_integer("--train-steps", value);
        else if (value.empty()) usage_error(a + ": expected a name, got ''");
        else if (a == "--corpus") r.corpus = value;
        else r.output = value;
    }
    // Every layer's [H, L, L] map of doubles is kept at once: bound that before allocating it.
    const attnkit::model::decoder_config cfg = model_config(r.length);
    const double map_bytes = 8.0 * static_cast<double>(cfg.layers * cfg.heads) * static_cast<double>(r.length) *
                             static_cast<double>(r.length);
    if (map_bytes > kMaxMapBytes) {
        char what[256];
        std::snprintf(what, sizeof what,
                      "--length: L = %lld needs %.3g GiB of attention maps (%lld layers x %lld heads x L x L doubles), "
                      "above the %.3g GiB this report allows",
                      r.length, map_bytes / (1 << 30), static_cast<long long>(cfg.layers),
                      static_cast<long long>(cfg.heads), kMaxMapBytes / (1 << 30));
        usage_error(what);
    }
    return r;
}

int run(const arguments& args) {
    using namespace attnkit::model;
    using attnkit::index_t;
    const long long L = args.length;
    const std::string& output = args.output;
    const std::vector<std::int32_t> corpus = read_text_corpus(args.corpus);
    const index_t split = static_cast<index_t>(corpus.size()) * 9 / 10;
    const bool trained = args.train_steps > 0;
    if (trained && static_cast<index_t>(corpus.size()) - split < L + 1)
        throw std::invalid_argument("no corpus of held-out length >= L + 1 in " + args.corpus +
                                    " (install Debian's fortunes, or pass --train-steps 0)");
    std::ostringstream md;
    if (trained)
        md << "## Attention diagnostics (text models trained " << args.train_steps
           << " steps on fortunes, a held-out window of L = " << L << ", per layer, mean over heads)\n\n";
    else
        md << "## Attention diagnostics (seeded, untrained text models, L = " << L << ", per layer, mean over heads)\n\n";
    md << "| variant | layer | entropy | concentration | head diversity | sink | local 0 | local 1 | local 2 | local 3 |\n";
    md << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    std::vector<std::int32_t> tokens;
    if (trained) {
        tokens.assign(corpus.begin() + split, corpus.begin() + split + L);
    } else {
        std::uint64_t s = 12345;  // a seeded stream with a period-17 motif inside noise
        for (long long t = 0; t < L; ++t) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            tokens.push_back(t % 3 == 0 ? static_cast<std::int32_t>((t % 17) * 29 % 256) : static_cast<std::int32_t>((s >> 33) % 256));
        }
    }
    attnkit::thread_pool pool(2);
    for (const auto& v : attention_variant_names()) {
        if (v.second == attention_variant::mlp) continue;  // no token mixing, no weights
        decoder_config cfg = model_config(L);
        cfg.variant = v.second;
        cfg.pool = &pool;
        if (v.second == attention_variant::fixed_seq_qk && !corpus.empty())
            cfg.fixed_sequence.assign(corpus.begin(), corpus.begin() + std::min<index_t>(cfg.max_length, split));
        decoder m(cfg);
        if (trained) {  // as the training comparison's text task
            adamw_options o;
            o.lr = 3e-3f;
            o.warmup_steps = args.train_steps / 10;
            o.total_steps = args.train_steps;
            o.schedule = lr_schedule::cosine;
            adamw opt(m, o);
            decoder_gradients g(m);
            weight_rng rng(17);
            for (long long st = 0; st < args.train_steps; ++st) {
                const token_batch b = stream_windows(corpus, 0, split, 16, 64, rng);
                m.loss_and_gradients(b.tokens, b.targets, b.batch, g);
                opt.step(m, g);
            }
        }
        const auto weights = m.attention_weights(tokens);
        for (std::size_t l = 0; l < weights.size(); ++l) {
            if (weights[l].size() == 0) continue;
            const attnkit::attention_diagnostics d = attnkit::diagnose_attention(weights[l]);
            char row[512];
            std::snprintf(row, sizeof row, "| %s | %zu | %.3f | %.3f | %.4f | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
                          v.first.c_str(), l + 1, d.mean_entropy, d.mean_concentration, d.head_diversity, d.mean_sink,
                          d.mean_local_focus[0], d.mean_local_focus[1], d.mean_local_focus[2], d.mean_local_focus[3]);
            md << row;
        }
    }
    std::cout << md.str();
    if (!output.empty()) {
        std::ofstream f(output);
        f << md.str();
        if (!f.flush()) {
            std::cerr << "attnkit_diagnostics_report: cannot write " << output << "\n";
            return 1;
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const arguments args = parse(argc, argv);
    // The model rejects what it cannot build (a length above its limits, ...) with an exception;
    // report it instead of terminating.
    try {
        return run(args);
    } catch (const std::exception& e) {
        std::cerr << "attnkit_diagnostics_report: error (--length " << args.length << ", --train-steps "
                  << args.train_steps << "): " << e.what() << "\n";
        return 1;
    }
}
