// attnkit benchmarks: the attention diagnostics of Xue et al. (docs/variants.md section 9) for
// a seeded decoder (model/decoder.hpp, the 70M shape) on a synthetic sequence, one table per
// variant, in Markdown.
//
//   attnkit_diagnostics_report [--length L] [--output FILE.md]
//
// Every layer of the "uniform" schedule is the variant (standard: the plain model). The
// sequence is a seeded token stream with repeats (a period-17 motif inside noise), so that
// local and copying patterns have something to find. Weights are untrained (N(0, 0.02)): the
// numbers describe the initialised maps, the baseline a trained model is compared with.
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
#include "attnkit/model/decoder.hpp"

namespace {

const char* const kUsage = "usage: attnkit_diagnostics_report [--length L] [--output FILE.md]   (L an integer >= 1, default 128)";

constexpr double kMaxMapBytes = 4.0 * (1 << 30);

struct arguments {
    long long length = 128;
    std::string output;
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

arguments parse(int argc, char** argv) {
    arguments r;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::cout << kUsage << "\n";
            std::exit(0);
        }
        if (a != "--length" && a != "--output") usage_error("unknown argument '" + a + "'");
        if (i + 1 >= argc) usage_error(a + ": missing value");
        const std::string value = argv[++i];
        if (a == "--length") r.length = positive_integer("--length", value);
        else if (value.empty()) usage_error("--output: expected a file name, got ''");
        else r.output = value;
    }
    // Every layer's [H, L, L] map of doubles is kept at once: bound that before allocating it.
    const attnkit::model::decoder_config cfg;
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
    const long long L = args.length;
    const std::string& output = args.output;
    std::ostringstream md;
    md << "## Attention diagnostics (seeded 70M decoder, L = " << L << ", per layer, mean over heads)\n\n";
    md << "| variant | layer | entropy | concentration | head diversity | sink | local 0 | local 1 | local 2 | local 3 |\n";
    md << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    std::vector<std::int32_t> tokens;
    std::uint64_t s = 12345;
    for (long long t = 0; t < L; ++t) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        tokens.push_back(t % 3 == 0 ? static_cast<std::int32_t>((t % 17) * 29 % 512) : static_cast<std::int32_t>((s >> 33) % 512));
    }
    for (const auto& v : attention_variant_names()) {
        if (v.second == attention_variant::mlp) continue;  // no token mixing, no weights
        decoder_config cfg;
        cfg.variant = v.second;
        cfg.max_length = L;
        decoder m(cfg);
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
        std::cerr << "attnkit_diagnostics_report: error (--length " << args.length << "): " << e.what() << "\n";
        return 1;
    }
}
