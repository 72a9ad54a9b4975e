// The training comparison: what each attention variant (and hybrid schedule) learns at equal
// size and budget on this machine. Three tasks, every variant that trains, three seeds each:
//
//   mqar    multi-query associative recall (Zoology): recall accuracy on held-out sequences
//   blocks  the multi-token attention paper's block task: error rate (a sequence counts as right
//           when its whole answer block comes out)
//   text    a character-level language model on the fortunes corpus (Debian's `fortunes`):
//           validation loss, for the variant alone (uniform) and in a hybrid schedule (middle)
//
// Each run trains with AdamW (warm-up, cosine decay, clipping at 1), records the training loss
// curve, the held-out measure, training tokens/s and the share of the step spent in attnkit's
// kernels and GEMMs (decoder_profile), and for the text task the attention diagnostics of the
// trained model (entropy, head diversity) on a validation window. Writes one JSON file;
// bench/scripts/plot_training.py turns it into train_report.md and the PNG curves.
//
//   attnkit_train_compare [--quick] [--out FILE] [--threads N] [--corpus DIR] [--only TASK]
//
// --quick (or ATTNKIT_TRAIN_QUICK=1): a fifth of the steps, for a look in a few minutes. The
// sizes are scaled down from the papers' so that the default run takes well under 30 minutes on
// 2 cores (docs/training.md says what was scaled).
#include <attnkit/diagnostics.hpp>
#include <attnkit/model/adamw.hpp>
#include <attnkit/model/decoder.hpp>
#include <attnkit/model/tasks.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace attnkit::model;
using attnkit::index_t;

struct task_setup {
    std::string task;
    decoder_config model;
    index_t batch = 32;
    int steps = 300;
    float lr = 3e-3f;
};

struct run_result {
    std::string task, variant, schedule;
    std::uint64_t seed = 0;
    std::vector<int> steps;
    std::vector<double> loss;
    double eval_loss = 0.0, eval_accuracy = -1.0;  // accuracy < 0: not measured (text)
    double tokens_per_s = 0.0, kernel_share = 0.0, seconds = 0.0;
    double entropy = -1.0, head_diversity = -1.0;  // text: diagnostics of the trained model
};

// The CPU's model name from /proc/cpuinfo ("unknown" elsewhere), for the report's header.
std::string cpu_name() {
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);)
        if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
            std::string n = line.substr(line.find(':') + 1);
            n.erase(0, n.find_first_not_of(' '));
            return n;
        }
    return "unknown";
}

std::string json_numbers(const std::vector<double>& v) {
    std::ostringstream o;
    o.precision(6);
    o << "[";
    for (std::size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
    o << "]";
    return o.str();
}

}  // namespace

int main(int argc, char** argv) {
    bool quick = std::getenv("ATTNKIT_TRAIN_QUICK") && std::string(std::getenv("ATTNKIT_TRAIN_QUICK")) == "1";
    std::string out_path = "train_results.json", corpus_dir = "/usr/share/games/fortunes", only;
    int threads = 2;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--quick") {
            quick = true;
        } else if (i + 1 < argc && a == "--out") {
            out_path = argv[++i];
        } else if (i + 1 < argc && a == "--threads") {
            threads = std::atoi(argv[++i]);
        } else if (i + 1 < argc && a == "--corpus") {
            corpus_dir = argv[++i];
        } else if (i + 1 < argc && a == "--only") {
            only = argv[++i];
        } else {
            std::fprintf(stderr, "usage: %s [--quick] [--out FILE] [--threads N] [--corpus DIR] [--only TASK]\n", argv[0]);
            return 2;
        }
    }
    attnkit::thread_pool pool(static_cast<std::size_t>(std::max(1, threads)));
    const int scale = quick ? 5 : 1;
    const std::vector<std::uint64_t> seeds{1, 2, 3};
    const std::vector<attention_variant> variants{attention_variant::standard,    attention_variant::taylor,
                                                  attention_variant::self_gating, attention_variant::mlp,
                                                  attention_variant::mta,         attention_variant::embedding_qk,
                                                  attention_variant::rnd_emb_qk,  attention_variant::fixed_seq_qk};

    // Tasks and their models. MQAR and the block task: 2 layers, d 64, 4 heads; the text task: 4
    // layers (so that a schedule has layers to mix), d 64.
    mqar_options mq;
    mq.vocab = 64;
    mq.pairs = 4;
    mq.queries = 4;
    block_task_options bt;  // 8 blocks of 5 letters, 2 query letters (N = 5, L = 2 of the paper)
    std::vector<std::int32_t> corpus;
    if (only.empty() || only == "text") corpus = read_text_corpus(corpus_dir);
    const index_t text_len = 64, split = static_cast<index_t>(corpus.size()) * 9 / 10;

    std::vector<run_result> results;
    const auto t_all = std::chrono::steady_clock::now();
    const auto train = [&](const task_setup& s, attention_variant v, const std::string& schedule, std::uint64_t seed) {
        decoder_config c = s.model;
        c.variant = v;
        c.schedule = schedule;
        c.seed = seed;
        c.pool = &pool;
        if (s.task == "text" && v == attention_variant::fixed_seq_qk)  // FixedSeqQK's fixed text: the corpus' start
            c.fixed_sequence.assign(corpus.begin(), corpus.begin() + std::min<index_t>(c.max_length, static_cast<index_t>(corpus.size())));
        decoder m(c);
        const int steps = std::max(10, s.steps / scale);
        adamw_options o;
        o.lr = s.lr;
        o.warmup_steps = steps / 10;
        o.total_steps = steps;
        o.schedule = lr_schedule::cosine;
        adamw opt(m, o);
        decoder_gradients g(m);
        weight_rng data_rng(seed * 1000 + 17);
        const auto batch_of = [&](std::uint64_t k) {
            if (s.task == "mqar") return mqar_batch(mq, s.batch, seed * 1000003 + k);
            if (s.task == "blocks") return block_task_batch(bt, s.batch, seed * 1000003 + k);
            return stream_windows(corpus, 0, split, s.batch, text_len, data_rng);
        };
        run_result r;
        r.task = s.task;
        r.variant = attention_variant_name(v);
        r.schedule = schedule;
        r.seed = seed;
        m.reset_profile();
        const auto t0 = std::chrono::steady_clock::now();
        const int every = std::max(1, steps / 50);
        double window = 0.0;
        int in_window = 0;
        for (int st = 1; st <= steps; ++st) {
            const token_batch b = batch_of(static_cast<std::uint64_t>(st));
            window += m.loss_and_gradients(b.tokens, b.targets, b.batch, g);
            ++in_window;
            opt.step(m, g);
            if (st % every == 0 || st == steps) {  // the mean training loss since the last point
                r.steps.push_back(st);
                r.loss.push_back(window / in_window);
                window = 0.0;
                in_window = 0;
            }
        }
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double tokens = static_cast<double>(steps) * static_cast<double>(s.batch * m.config().max_length);
        r.tokens_per_s = tokens / r.seconds;
        const decoder_profile& p = m.profile();
        r.kernel_share = (p.kernels + p.gemm) / p.total();
        // Held-out: sequences the training never drew (another seed stream), or the corpus' last
        // tenth.
        weight_rng eval_rng(99);
        token_batch e = s.task == "mqar"     ? mqar_batch(mq, 256, 777777 + seed)
                        : s.task == "blocks" ? block_task_batch(bt, 256, 777777 + seed)
                                             : stream_windows(corpus, split, static_cast<index_t>(corpus.size()), 64,
                                                              text_len, eval_rng);
        r.eval_loss = m.loss(e.tokens, e.targets, e.batch);
        if (s.task == "mqar") r.eval_accuracy = accuracy(m.batch_logits(e.tokens, e.batch), e.targets);
        if (s.task == "blocks") r.eval_accuracy = sequence_accuracy(m.batch_logits(e.tokens, e.batch), e.targets, e.batch);
        if (s.task == "text") {  // diagnostics of the trained model's attention, last layer that mixes tokens
            const std::vector<std::int32_t> window_tokens(e.tokens.begin(), e.tokens.begin() + text_len);
            const auto w = m.attention_weights(window_tokens);
            double ent = 0.0, div = 0.0;
            int n = 0;
            for (const auto& wl : w) {
                if (wl.size() == 0) continue;
                const attnkit::attention_diagnostics d = attnkit::diagnose_attention(wl);
                ent += d.mean_entropy;
                div += d.head_diversity;
                ++n;
            }
            if (n > 0) {
                r.entropy = ent / n;
                r.head_diversity = div / n;
            }
        }
        const std::string acc = r.eval_accuracy >= 0 ? ", accuracy " + std::to_string(r.eval_accuracy).substr(0, 5) : "";
        std::fprintf(stderr, "%-6s %-12s %-8s seed %llu: loss %.3f -> %.3f, held-out loss %.3f%s, %.0f tok/s, %.1f s\n",
                     r.task.c_str(), r.variant.c_str(), schedule.c_str(), static_cast<unsigned long long>(seed),
                     r.loss.front(), r.loss.back(), r.eval_loss, acc.c_str(), r.tokens_per_s, r.seconds);
        results.push_back(r);
    };

    task_setup mqar_setup{"mqar", {}, 64, 800, 3e-3f};
    mqar_setup.model.vocab = mq.vocab;
    mqar_setup.model.d_model = 64;
    mqar_setup.model.layers = 2;
    mqar_setup.model.heads = 4;
    mqar_setup.model.heads_kv = 4;
    mqar_setup.model.max_length = mq.length();
    task_setup block_setup = mqar_setup;
    block_setup.task = "blocks";
    block_setup.model.vocab = block_task_options::kVocab;
    block_setup.model.max_length = bt.length();
    block_setup.batch = 32;
    block_setup.steps = 600;
    task_setup text_setup = mqar_setup;
    text_setup.task = "text";
    text_setup.model.vocab = 256;
    text_setup.model.layers = 4;
    text_setup.model.max_length = text_len;
    text_setup.batch = 16;
    text_setup.steps = 300;

    for (attention_variant v : variants)
        for (std::uint64_t seed : seeds) {
            if (only.empty() || only == "mqar") train(mqar_setup, v, "uniform", seed);
            if (only.empty() || only == "blocks") train(block_setup, v, "uniform", seed);
            if (!corpus.empty() && (only.empty() || only == "text")) {
                train(text_setup, v, "uniform", seed);
                if (v != attention_variant::standard) train(text_setup, v, "middle", seed);
            }
        }
    if ((only.empty() || only == "text") && corpus.empty())
        std::fprintf(stderr, "text task skipped: no corpus in %s (install Debian's fortunes)\n", corpus_dir.c_str());

    std::ofstream out(out_path);
    out << "{\n  \"machine\": \"" << cpu_name() << "\",\n  \"quick\": " << (quick ? "true" : "false")
        << ",\n  \"threads\": " << threads << ",\n  \"seconds\": "
        << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_all).count()
        << ",\n  \"setups\": {\"mqar\": \"vocab 64, 4 pairs, 4 queries (length " << mq.length() << "); d_model 64, 2 layers, 4 heads; batch 64, "
        << std::max(10, mqar_setup.steps / scale) << " steps\", \"blocks\": \"8 blocks of N = 5 letters, L = 2 query letters (length "
        << bt.length() << "); d_model 64, 2 layers, 4 heads; batch 32, " << std::max(10, block_setup.steps / scale)
        << " steps\", \"text\": \"fortunes, bytes, " << corpus.size() << " characters (last tenth held out); windows of "
        << text_len << "; d_model 64, 4 layers, 4 heads; batch 16, " << std::max(10, text_setup.steps / scale) << " steps\"},\n"
        << "  \"runs\": [\n";
    for (std::size_t i = 0; i < results.size(); ++i) {
        const run_result& r = results[i];
        std::vector<double> st(r.steps.begin(), r.steps.end());
        out << "    {\"task\": \"" << r.task << "\", \"variant\": \"" << r.variant << "\", \"schedule\": \"" << r.schedule
            << "\", \"seed\": " << r.seed << ", \"eval_loss\": " << r.eval_loss << ", \"eval_accuracy\": " << r.eval_accuracy
            << ", \"tokens_per_s\": " << r.tokens_per_s << ", \"kernel_share\": " << r.kernel_share
            << ", \"seconds\": " << r.seconds << ", \"entropy\": " << r.entropy << ", \"head_diversity\": "
            << r.head_diversity << ",\n     \"steps\": " << json_numbers(st) << ",\n     \"loss\": " << json_numbers(r.loss)
            << "}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    out << "  ]\n}\n";
    std::fprintf(stderr, "wrote %s (%zu runs)\n", out_path.c_str(), results.size());
    return 0;
}
