// Training the decoder template: a hybrid schedule of standard attention and one variant,
// AdamW with warm-up and cosine decay, gradient clipping, the loss printed as it falls. Copy this
// file to train a model of your own.
//
//   train_decoder [--data mqar | --text FILE | --tokens FILE] [--schedule NAME] [--variant NAME]
//                 [--layers N] [--d-model N] [--heads N] [--heads-kv N] [--length N] [--batch N]
//                 [--steps N] [--lr X] [--threads N] [--seed N] [--save DIR]
//
//   train_decoder --variant taylor --schedule middle --text /usr/share/games/fortunes/fortunes
//
// Data: mqar (the default) draws multi-query associative recall batches from the seed
// (model/tasks.hpp) and reports the recall accuracy; --text trains a character-level model
// on a text file (bytes as tokens, vocab 256); --tokens reads a file of little-endian int32
// token ids (vocab: the largest id + 1) and trains next-token prediction on random windows.
// Every layer kind trains (rnd_emb_qk and fixed_seq_qk through their fixed stream: docs/training.md).
// --save DIR writes the trained model as DIR/config.json + DIR/model.safetensors (Hugging Face's
// names, docs/checkpoints.md); attnkit::model::load_decoder(DIR) reads it back.
#include <attnkit/model/adamw.hpp>
#include <attnkit/model/decoder.hpp>
#include <attnkit/model/tasks.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    using namespace attnkit::model;
    decoder_config cfg;
    cfg.d_model = 64;
    cfg.layers = 2;
    cfg.heads = 4;
    cfg.heads_kv = 4;
    cfg.schedule = "first";  // layer 1 standard, the rest the variant
    cfg.variant = attention_variant::taylor;
    std::string data = "mqar", path, save_dir;
    attnkit::index_t length = 64, batch = 16;
    int steps = 150, threads = 1;
    float lr = 3e-3f;
    try {
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            if (i + 1 >= argc) throw std::invalid_argument("missing value after " + a);
            const std::string v = argv[++i];
            if (a == "--data") data = v;
            else if (a == "--text") data = "text", path = v;
            else if (a == "--tokens") data = "tokens", path = v;
            else if (a == "--schedule") cfg.schedule = v;
            else if (a == "--variant") cfg.variant = parse_attention_variant(v);
            else if (a == "--layers") cfg.layers = std::stoll(v);
            else if (a == "--d-model") cfg.d_model = std::stoll(v);
            else if (a == "--heads") cfg.heads = std::stoll(v);
            else if (a == "--heads-kv") cfg.heads_kv = std::stoll(v);
            else if (a == "--length") length = std::stoll(v);
            else if (a == "--batch") batch = std::stoll(v);
            else if (a == "--steps") steps = std::stoi(v);
            else if (a == "--lr") lr = std::stof(v);
            else if (a == "--threads") threads = std::stoi(v);
            else if (a == "--seed") cfg.seed = std::stoull(v);
            else if (a == "--save") save_dir = v;
            else throw std::invalid_argument("unknown option " + a);
        }
        if (steps < 1 || threads < 1 || batch < 1 || length < 2)
            throw std::invalid_argument("--steps, --threads, --batch >= 1 and --length >= 2");

        // The data: a batch source for training and one held-out batch to evaluate.
        std::vector<std::int32_t> stream;
        mqar_options mq;
        if (data == "mqar") {
            mq.vocab = 64;
            mq.pairs = 4;
            mq.queries = 4;
            cfg.vocab = mq.vocab;
            length = mq.length();
        } else if (data == "text" || data == "tokens") {
            std::ifstream f(path, std::ios::binary);
            if (!f) throw std::invalid_argument("cannot read " + path);
            const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
            if (data == "text") {
                for (char c : bytes) stream.push_back(static_cast<unsigned char>(c));
                cfg.vocab = 256;
            } else {
                if (bytes.size() % 4 != 0) throw std::invalid_argument(path + ": not a whole number of int32 tokens");
                std::int32_t top = 0;
                for (std::size_t i = 0; i < bytes.size(); i += 4) {
                    const auto u = static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) |
                                   static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 |
                                   static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 2])) << 16 |
                                   static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 3])) << 24;
                    const auto t = static_cast<std::int32_t>(u);
                    if (t < 0) throw std::invalid_argument(path + ": a negative token id");
                    stream.push_back(t);
                    top = std::max(top, t);
                }
                cfg.vocab = top + 1;
            }
            if (static_cast<attnkit::index_t>(stream.size()) < length + 2)
                throw std::invalid_argument(path + ": fewer tokens than --length + 2");
        } else {
            throw std::invalid_argument("--data: mqar, or --text FILE / --tokens FILE");
        }
        cfg.max_length = length;

        attnkit::thread_pool pool(static_cast<std::size_t>(threads));
        cfg.pool = threads > 1 ? &pool : nullptr;
        decoder model(cfg);
        adamw_options o;
        o.lr = lr;
        o.warmup_steps = std::max(1, steps / 10);
        o.total_steps = steps;
        o.schedule = lr_schedule::cosine;
        adamw opt(model, o);
        decoder_gradients g(model);

        weight_rng data_rng(cfg.seed + 1000);
        std::uint64_t batch_seed = cfg.seed * 7919;
        // Next-token windows anywhere in the token file.
        const auto window_batch = [&] {
            return stream_windows(stream, 0, static_cast<attnkit::index_t>(stream.size()), batch, length, data_rng);
        };
        const auto next = [&]() {
            return data == "mqar" ? mqar_batch(mq, batch, ++batch_seed) : window_batch();
        };
        const token_batch held_out = data == "mqar" ? mqar_batch(mq, 64, 1) : window_batch();

        std::printf("decoder: d_model %lld, %lld layers (%s, schedule %s), %lld heads, vocab %lld, length %lld, batch %lld\n",
                    static_cast<long long>(cfg.d_model), static_cast<long long>(cfg.layers),
                    attention_variant_name(cfg.variant).c_str(), cfg.schedule.c_str(),
                    static_cast<long long>(cfg.heads), static_cast<long long>(cfg.vocab),
                    static_cast<long long>(length), static_cast<long long>(batch));
        using clock = std::chrono::steady_clock;
        const auto t0 = clock::now();
        double loss = 0.0;
        for (int s = 1; s <= steps; ++s) {
            const token_batch b = next();
            loss = model.loss_and_gradients(b.tokens, b.targets, b.batch, g);
            const double norm = opt.step(model, g);
            if (s == 1 || s % std::max(1, steps / 10) == 0 || s == steps)
                std::printf("step %4d  loss %.4f  grad norm %.3f  lr %.2e\n", s, loss, norm, opt.learning_rate(s));
        }
        const double secs = std::chrono::duration<double>(clock::now() - t0).count();
        const double held = model.loss(held_out.tokens, held_out.targets, held_out.batch);
        std::printf("held-out loss %.4f", held);
        if (data == "mqar")
            std::printf(", recall accuracy %.3f", accuracy(model.batch_logits(held_out.tokens, held_out.batch), held_out.targets));
        std::printf("\n%.0f training tokens/s (%d steps of %lld tokens in %.2f s)\n",
                    static_cast<double>(steps) * static_cast<double>(batch * length) / secs, steps,
                    static_cast<long long>(batch * length), secs);
        if (!save_dir.empty()) {
            save_decoder(model, save_dir);
            // A checkpoint is only worth saving if it loads back to the same model.
            decoder loaded = load_decoder(save_dir);
            const double again = loaded.loss(held_out.tokens, held_out.targets, held_out.batch);
            std::printf("saved %s/config.json and model.safetensors; reloaded: held-out loss %.4f\n", save_dir.c_str(),
                        again);
        }
        const decoder_profile& p = model.profile();
        std::printf("time in attnkit kernels %.0f%%, GEMMs %.0f%%, other %.0f%%\n", 100 * p.kernels / p.total(),
                    100 * p.gemm / p.total(), 100 * p.other / p.total());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "train_decoder: %s\n", e.what());
        return 1;
    }
    return 0;
}
