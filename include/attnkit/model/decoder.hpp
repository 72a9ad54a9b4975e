// A Qwen2.5-shaped pre-norm decoder whose attention sublayer per layer is standard attention or
// one variant, chosen by a hybrid schedule: the template to copy when starting a model.
//
//   attnkit::model::decoder_config cfg;            // the 70M shape: d 512, 6 layers, 8 heads
//   cfg.schedule = "middle";  cfg.variant = attnkit::model::attention_variant::taylor;
//   attnkit::model::decoder model(cfg);            // weights from cfg.seed
//   std::vector<float> logits = model.prefill(prompt);
//   logits = model.decode_step(next_token);        // per-layer KV cache or variant state
//   attnkit::model::tensor2 all = model.prefill_logits(prompt);   // [L, vocab]
//   attnkit::model::save_decoder(model, "dir");    // Hugging Face files (model/checkpoint.hpp)
//   attnkit::model::decoder loaded = attnkit::model::load_decoder("dir", &pool);
//
// Per layer: x += Wo . attention(RoPE(Wq . n + bq), RoPE(Wk . n + bk), Wv . n + bv),
// n = RMSNorm(x) (the biases with attention_bias, as Qwen2 has them); then x += SwiGLU(RMSNorm(x));
// final RMSNorm and the output projection: the embedding (tied) or lm_head.weight.
// Layer kinds (decoder_config.hpp): standard keeps a KV cache; taylor, self_gating and mta keep
// their decode states (prefill runs through the state, which equals the full causal call);
// self-gating's query is SiLU(Wq . n) as in the paper, taken before RoPE (which then leaves its
// gate <q_j, k_j> unchanged); rnd_emb_qk / fixed_seq_qk take Q and K
// from the fixed stream (random embeddings, or the embeddings of one token sequence) that the
// constructor runs once through the model (every layer as standard attention; again on
// parameters_changed(), and in every training pass with its backward, model/decoder_training.hpp),
// keeping a value cache and a static_attention_map for decode; embedding_qk takes Q and K of all its layers from
// the token embeddings in one projection (embedding_qk.hpp) and keeps a KV cache; mlp replaces
// the sublayer with a gated MLP of width gated_mlp_width(d). The q/k/v biases are added right
// after the projections in every path (self-gating: before SiLU; all: before RoPE; the fixed
// stream too); embedding_qk layers have bv only. Batch size 1: a decoding session.
//
// profile() reports the seconds spent in attnkit kernels (attention, norms, RoPE), in GEMMs
// (projections, MLPs, logits) and elsewhere (embedding lookup, cache copies, residual adds),
// measured with a steady clock around each stage.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "attnkit/detail/gemm.hpp"
#include "attnkit/diagnostics.hpp"
#include "attnkit/eigen.hpp"
#include "attnkit/embedding_qk.hpp"
#include "attnkit/gated_mlp.hpp"
#include "attnkit/model/hybrid_schedule.hpp"
#include "attnkit/model/rms_norm.hpp"
#include "attnkit/model/rope.hpp"
#include "attnkit/model/decoder_config.hpp"
#include "attnkit/model/decoder_activations.hpp"
#include "attnkit/model/decoder_gradients.hpp"
#include "attnkit/model/decoder_layer.hpp"

namespace attnkit {
namespace model {

class checkpoint_access;  // model/checkpoint.hpp: builds a decoder without drawing its weights

struct decoder_profile {
    double kernels = 0, gemm = 0, other = 0;  // seconds
    double total() const { return kernels + gemm + other; }
};

class decoder {
   public:
    explicit decoder(const decoder_config& cfg) : c_(cfg) {
        check_decoder_config(c_);
        const std::vector<bool> standard = hybrid_schedule(c_.schedule, c_.layers);  // throws on bad names
        weight_rng rng(c_.seed);
        const index_t d = c_.d_model;
        embed_ = tensor2(c_.vocab, d);
        rng.fill(embed_, 0.02f);
        final_norm_ = tensor1(d);
        final_norm_.setConstant(1.0f);
        build_layers(standard, &rng);
        if (emb_layout_.layers > 0) build_embedding_qk();
        if (has_static()) {
            draw_fixed_stream(rng);
            run_fixed_stream();
        }
        // After every other draw (the fixed stream's too): untying the head changes no other
        // weight of a seed.
        if (!c_.tie_word_embeddings) {
            lm_head_ = tensor2(c_.vocab, d);
            rng.fill(lm_head_, 0.02f);
        }
        refresh_head();
        reset();
    }

    const decoder_config& config() const { return c_; }

    // Every parameter with its name (model/decoder_layer.hpp, for_each_layer_parameter), in a
    // fixed order: model.embed_tokens.weight, each layer's, model.norm.weight, then (untied
    // only) lm_head.weight [vocab, d] (stored as Hugging Face stores it, like the embedding,
    // not transposed as the projections are). f(name, tensor) gets an Eigen tensor of rank 1,
    // 2 or 4. After changing values through the non-const walk, call parameters_changed().
    template <class F>
    void for_each_parameter(F&& f) {
        walk_parameters(*this, f);
    }
    template <class F>
    void for_each_parameter(F&& f) const {
        walk_parameters(*this, f);
    }
    // Re-derives what the decoder keeps computed from its parameters: the transposed output
    // projection, the stacked StaticEmbQK projection, the fixed stream's Q, K and maps (the
    // stream runs again through the new weights). Starts a new sequence (the caches hold values
    // of the old weights).
    void parameters_changed() {
        refresh_derived();
        if (has_static()) {
            if (stream_x_.size() == 0 && stream_tokens_.empty()) {  // a checkpoint's decoder: drawn once
                weight_rng rng(c_.seed);
                skip_initial_weights(rng);
                draw_fixed_stream(rng);
            }
            run_fixed_stream();
        }
        reset();
    }

    // rnd_emb_qk / fixed_seq_qk: the fixed stream's input [max_length, d_model], the rows that
    // run through the model: rnd_emb_qk's seeded random embeddings (a constant, never trained),
    // or fixed_seq_qk's rows of model.embed_tokens.weight for fixed_stream_tokens() (the current
    // weights). Empty ([0, d_model]) without such layers.
    tensor2 fixed_stream_input() const {
        const index_t d = c_.d_model;
        if (stream_x_.size() > 0) return stream_x_;
        tensor2 x(static_cast<index_t>(stream_tokens_.size()), d);
        for (std::size_t t = 0; t < stream_tokens_.size(); ++t)
            std::copy_n(&embed_(stream_tokens_[t], 0), d, &x(static_cast<index_t>(t), 0));
        return x;
    }
    // fixed_seq_qk: the stream's max_length token ids (config().fixed_sequence, completed with
    // seeded random tokens); empty otherwise.
    const std::vector<std::int32_t>& fixed_stream_tokens() const { return stream_tokens_; }

    // Training (model/decoder_training.hpp): tokens and targets [batch, L] row-major, each
    // sequence from position 0, causal; a target < 0 is ignored. Returns the mean cross-entropy
    // over the counted targets (the next-token loss when targets are the tokens shifted by
    // one) and writes (overwrites) g, the gradient of that mean. loss() is the forward alone.
    // Every layer kind trains; with rnd_emb_qk / fixed_seq_qk layers each call also runs the
    // fixed stream (max_length rows) through the current weights, and loss_and_gradients its
    // backward (docs/training.md).
    double loss_and_gradients(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
                              index_t batch, decoder_gradients& g);
    double loss(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets, index_t batch);
    // The logits of every position of a batch [batch * L, vocab] (row b * L + l), each sequence
    // from position 0; valid until the next call of a training-pass method.
    const tensor2& batch_logits(const std::vector<std::int32_t>& tokens, index_t batch);
    const std::vector<attention_variant>& layer_kinds() const { return kinds_; }
    index_t length() const { return pos_; }
    const decoder_profile& profile() const { return prof_; }
    void reset_profile() { prof_ = {}; }

    void reset() {
        pos_ = 0;
        for (auto& l : layers_) l->reset_state(c_);
    }

    // Starts a new sequence: the logits of the last prompt token.
    std::vector<float> prefill(const std::vector<std::int32_t>& tokens) {
        check_tokens(tokens, 0);
        reset();
        tensor2 logits = forward(tokens, false);
        return std::vector<float>(logits.data(), logits.data() + logits.size());
    }
    // Starts a new sequence like prefill and returns the logits of every position [L, vocab],
    // row-major (row t predicts token t + 1); decode_step continues after it.
    tensor2 prefill_logits(const std::vector<std::int32_t>& tokens) {
        check_tokens(tokens, 0);
        reset();
        return forward(tokens, true);
    }
    // Appends one token: the logits that predict the next.
    std::vector<float> decode_step(std::int32_t token) {
        const std::vector<std::int32_t> t{token};
        check_tokens(t, pos_);
        tensor2 logits = forward(t, false);
        return std::vector<float>(logits.data(), logits.data() + logits.size());
    }

    // Starts a new sequence like prefill and returns each layer's normalised attention weights
    // [H, L, L] from its oracle (empty for mlp layers, which mix no tokens), for
    // attnkit::diagnose_attention. Costs O(L^2) memory per layer: for diagnostics, not serving.
    std::vector<Eigen::Tensor<double, 3, Eigen::RowMajor>> attention_weights(const std::vector<std::int32_t>& tokens) {
        check_tokens(tokens, 0);
        reset();
        std::vector<Eigen::Tensor<double, 3, Eigen::RowMajor>> w(layers_.size());
        capture_ = &w;
        try {
            forward(tokens, false);
        } catch (...) {
            capture_ = nullptr;
            throw;
        }
        capture_ = nullptr;
        return w;
    }

   private:
    friend class checkpoint_access;
    struct no_weights {};
    // Every tensor allocated, none drawn, nothing derived: checkpoint_access fills the
    // parameters and calls parameters_changed().
    decoder(const decoder_config& cfg, no_weights) : c_(cfg) {
        check_decoder_config(c_);
        build_layers(hybrid_schedule(c_.schedule, c_.layers), nullptr);
        embed_ = tensor2(c_.vocab, c_.d_model);
        embed_.setZero();
        final_norm_ = tensor1(c_.d_model);
        final_norm_.setConstant(1.0f);
        if (!c_.tie_word_embeddings) {
            lm_head_ = tensor2(c_.vocab, c_.d_model);
            lm_head_.setZero();
        }
    }

    void build_layers(const std::vector<bool>& standard, weight_rng* rng) {
        index_t n_emb = 0;
        for (index_t l = 0; l < c_.layers; ++l) {
            const attention_variant kind = standard[static_cast<std::size_t>(l)] ? attention_variant::standard : c_.variant;
            layers_.push_back(std::make_unique<decoder_layer>(c_, kind, l, rng));
            if (kind == attention_variant::embedding_qk) layers_.back()->emb_index = n_emb++;
            kinds_.push_back(kind);
        }
        if (n_emb > 0) emb_layout_ = {n_emb, c_.heads, c_.heads_kv, c_.head_dim()};
    }

    // The training pass (model/decoder_training.hpp): check_batch, then train_forward and
    // train_backward over the main pass and, with static layers, the fixed stream's pass.
    struct train_input;
    struct train_kit;
    index_t check_batch(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>* targets,
                        index_t batch) const;
    double train_pass(const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>* targets, index_t batch,
                      decoder_gradients* g);
    void train_forward(const train_input& p);
    void train_backward(const train_input& p, decoder_gradients& g);

    static bool is_static(attention_variant k) {
        return k == attention_variant::rnd_emb_qk || k == attention_variant::fixed_seq_qk;
    }
    bool has_static() const { return std::any_of(kinds_.begin(), kinds_.end(), is_static); }

    void check_tokens(const std::vector<std::int32_t>& tokens, index_t at) const {
        if (tokens.empty()) throw std::invalid_argument("attnkit::model::decoder: no tokens to process");
        if (at + static_cast<index_t>(tokens.size()) > c_.max_length)
            throw std::invalid_argument("attnkit::model::decoder: " + std::to_string(at) + " + " +
                                        std::to_string(tokens.size()) + " tokens exceed max_length = " +
                                        std::to_string(c_.max_length));
        for (std::int32_t t : tokens)
            if (t < 0 || t >= c_.vocab)
                throw std::invalid_argument("attnkit::model::decoder: token " + std::to_string(t) +
                                            " outside [0, vocab = " + std::to_string(c_.vocab) + ")");
    }

    template <class F>
    void timed(double& bucket, F&& f) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        bucket += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }

    // One GEMM over the pool: C [rows, n] = A [rows, k] W [k, n].
    void project(const float* a, index_t rows, const tensor2& w, float* out) {
        const index_t k = w.dimension(0), n = w.dimension(1);
        timed(prof_.gemm, [&] {
            attnkit::detail::gemm_blocks({a, rows, k, k}, {w.data(), k, n, n}, {out, rows, n, n}, c_.pool, 64, 256);
        });
    }

    template <class Self, class F>
    static void walk_parameters(Self& self, F& f) {
        f(std::string("model.embed_tokens.weight"), self.embed_);
        for (auto& l : self.layers_) for_each_layer_parameter(l->kind, self.c_.attention_bias, l->index, *l, f);
        f(std::string("model.norm.weight"), self.final_norm_);
        if (!self.c_.tie_word_embeddings) f(std::string("lm_head.weight"), self.lm_head_);
    }

    // The output projection [vocab, d]: the embedding when tied.
    const tensor2& head() const { return c_.tie_word_embeddings ? embed_ : lm_head_; }

    // The copies of parameters kept in the layout a product wants.
    void refresh_derived() {
        refresh_head();
        if (emb_layout_.layers > 0) build_embedding_qk();
    }
    void refresh_head() {
        const index_t d = c_.d_model;
        const tensor2& w = head();
        head_t_ = tensor2(d, c_.vocab);  // the output projection, stored transposed for the GEMM
        for (index_t t = 0; t < c_.vocab; ++t)
            for (index_t i = 0; i < d; ++i) head_t_(i, t) = w(t, i);
    }

    // The fixed stream of the static kinds is drawn from the weight generator after the
    // weights: to draw the same stream again, skip as many values as the constructor drew.
    void skip_initial_weights(weight_rng& rng) const {
        const auto ends_with = [](const std::string& name, const std::string& tail) {
            return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
        };
        for_each_parameter([&](const std::string& name, const auto& t) {
            // Norm weights (every name ending in norm.weight) start at 1 and biases at 0, drawing
            // nothing; lm_head is drawn after the stream; every other tensor draws one value per
            // element (MTA's identity-plus-noise kernels too).
            if (ends_with(name, "norm.weight") || ends_with(name, ".bias") || name == "lm_head.weight") return;
            for (index_t i = 0; i < static_cast<index_t>(t.size()); ++i) rng.normal(1.0f);
        });
    }

    // StaticEmbQK: every embedding_qk layer's W_Q^l, W_K^l side by side, one projection.
    void build_embedding_qk() {
        const index_t n_emb = emb_layout_.layers;
        const index_t w = (c_.heads + c_.heads_kv) * c_.head_dim();
        emb_w_ = tensor2(c_.d_model, n_emb * w);
        for (const auto& l : layers_) {
            if (l->emb_index < 0) continue;
            for (index_t i = 0; i < c_.d_model; ++i) {
                std::copy_n(&l->wq(i, 0), l->wq.dimension(1), &emb_w_(i, l->emb_index * w));
                std::copy_n(&l->wk(i, 0), l->wk.dimension(1), &emb_w_(i, l->emb_index * w + l->wq.dimension(1)));
            }
        }
    }

    // RndEmbQK / FixedSeqQK: the fixed stream's input, drawn after the weights: random rows
    // (rnd_emb_qk) or the token ids whose embeddings are the rows (fixed_seq_qk).
    void draw_fixed_stream(weight_rng& rng) {
        const index_t L = c_.max_length, d = c_.d_model;
        if (c_.variant == attention_variant::rnd_emb_qk) {
            stream_x_ = tensor2(L, d);
            rng.fill(stream_x_, 1.0f / std::sqrt(static_cast<float>(d)));  // RMS ~ 1 after the first norm
        } else {
            std::vector<std::int32_t> seq = c_.fixed_sequence;
            while (static_cast<index_t>(seq.size()) < L)
                seq.push_back(static_cast<std::int32_t>(rng.below(c_.vocab)));
            seq.resize(static_cast<std::size_t>(L));
            stream_tokens_ = std::move(seq);
        }
    }

    // Runs the fixed stream through the model, every layer as standard attention, and keeps each
    // static layer's Q and K (as the paper does) and its map for decode.
    void run_fixed_stream() {
        const index_t L = c_.max_length;
        tensor2 x = fixed_stream_input();
        scratch s(c_, L);
        for (auto& l : layers_) layer_forward(*l, x, s, L, 0, /*stream=*/true);
        for (auto& l : layers_)
            if (is_static(l->kind)) l->build_map(c_);
    }

    struct scratch {
        tensor2 h, a, q, k, v, att;
        scratch(const decoder_config& c, index_t T)
            : h(T, c.d_model), a(T, c.d_model), q(T, c.heads * c.head_dim()), k(T, c.heads_kv * c.head_dim()),
              v(T, c.heads_kv * c.head_dim()), att(T, c.heads * c.head_dim()) {}
    };

    // The logits of the last position [1, vocab], or of every position [T, vocab] (all).
    tensor2 forward(const std::vector<std::int32_t>& tokens, bool all) {
        const index_t T = static_cast<index_t>(tokens.size()), d = c_.d_model;
        tensor2 x(T, d);
        timed(prof_.other, [&] {
            for (index_t t = 0; t < T; ++t) std::copy_n(&embed_(tokens[static_cast<std::size_t>(t)], 0), d, &x(t, 0));
        });
        if (emb_layout_.layers > 0) {  // StaticEmbQK: Q and K of all its layers from the embeddings, once
            emb_qk_ = tensor3(1, T, emb_w_.dimension(1));
            const view<const float, 3> e(x.data(), {1, T, d});
            timed(prof_.gemm, [&] { embedding_qk_projection(e, emb_w_, emb_qk_, emb_layout_, c_.pool); });
            timed(prof_.kernels, [&] {
                rope_options ro{c_.rope_theta, pos_, c_.pool};
                rope(view<float, 4>(emb_qk_.data(), {1, T, emb_w_.dimension(1) / c_.head_dim(), c_.head_dim()}), ro);
            });
        }
        scratch s(c_, T);
        for (auto& l : layers_) layer_forward(*l, x, s, T, pos_, /*stream=*/false);
        pos_ += T;
        const index_t rows = all ? T : 1;
        tensor2 logits(rows, c_.vocab), xf(rows, d);
        timed(prof_.kernels, [&] {
            rms_norm(view<const float, 2>(&x(T - rows, 0), {rows, d}), final_norm_, xf, c_.norm_eps, c_.pool);
        });
        project(xf.data(), rows, head_t_, logits.data());
        return logits;
    }

    void layer_forward(decoder_layer& l, tensor2& x, scratch& s, index_t T, index_t pos, bool stream) {
        const index_t d = c_.d_model, H = c_.heads, Hk = c_.heads_kv, D = c_.head_dim();
        const view<const float, 2> xin(x.data(), {T, d});
        const view<float, 2> h(s.h.data(), {T, d}), a(s.a.data(), {T, d});
        timed(prof_.kernels, [&] { rms_norm(xin, l.attn_norm, h, c_.norm_eps, c_.pool); });
        if (l.kind == attention_variant::mlp) {
            timed(prof_.gemm, [&] { gated_mlp(h, l.mg, l.mu, l.md, a, gated_mlp_options{c_.pool}); });
        } else {
            const view<float, 4> q(s.q.data(), {1, T, H, D}), k(s.k.data(), {1, T, Hk, D}), v(s.v.data(), {1, T, Hk, D});
            const view<float, 4> att(s.att.data(), {1, T, H, D});
            project(s.h.data(), T, l.wv, s.v.data());
            if (l.bv.size() > 0) timed(prof_.other, [&] { add_row_bias(s.v.data(), T, l.bv); });
            if (l.kind == attention_variant::embedding_qk && !stream) {
                timed(prof_.other, [&] {  // copies out of the shared projection (already rotated)
                    const auto eq = embedding_q(emb_qk_, emb_layout_, l.emb_index);
                    const auto ek = embedding_k(emb_qk_, emb_layout_, l.emb_index);
                    for (index_t t = 0; t < T; ++t) {
                        for (index_t hh = 0; hh < H; ++hh) std::copy_n(eq.ptr(0, t, hh), D, q.ptr(0, t, hh));
                        for (index_t hh = 0; hh < Hk; ++hh) std::copy_n(ek.ptr(0, t, hh), D, k.ptr(0, t, hh));
                    }
                });
            } else {
                project(s.h.data(), T, l.wq, s.q.data());
                project(s.h.data(), T, l.wk, s.k.data());
                if (l.bq.size() > 0)
                    timed(prof_.other, [&] {
                        add_row_bias(s.q.data(), T, l.bq);
                        add_row_bias(s.k.data(), T, l.bk);
                    });
                // The paper's self-gating query is SiLU(H W_Q), before RoPE: RoPE then rotates q_j
                // and k_j alike and leaves the gate <q_j, k_j> as the paper has it (SiLU after
                // RoPE would make the gate depend on the position's angle).
                if (l.kind == attention_variant::self_gating && !stream)
                    timed(prof_.other, [&] {
                        for (index_t i = 0; i < T * H * D; ++i) q.data[i] = q.data[i] / (1.0f + std::exp(-q.data[i]));
                    });
                timed(prof_.kernels, [&] {
                    // Every layer rotates at the same positions: one table per step.
                    rope_options ro{c_.rope_theta, pos, c_.pool};
                    ro.cache = rope_cache_.get();
                    rope(q, ro);
                    rope(k, ro);
                });
            }
            if (capture_ && !stream) (*capture_)[static_cast<std::size_t>(l.index)] = l.reference_weights(c_, q, k, v);
            timed(prof_.kernels, [&] { l.attend(c_, q, k, v, att, pos, stream); });
            project(s.att.data(), T, l.wo, s.a.data());
        }
        timed(prof_.other, [&] { add_rows(x, s.a, T); });
        timed(prof_.kernels, [&] { rms_norm(xin, l.ffn_norm, h, c_.norm_eps, c_.pool); });
        timed(prof_.gemm, [&] { gated_mlp(h, l.fg, l.fu, l.fd, a, gated_mlp_options{c_.pool}); });
        timed(prof_.other, [&] { add_rows(x, s.a, T); });
    }

    // The residual: x[:T] += a[:T].
    static void add_rows(tensor2& x, const tensor2& a, index_t T) {
        const index_t n = T * x.dimension(1);
        for (index_t i = 0; i < n; ++i) x.data()[i] += a.data()[i];
    }

    decoder_config c_;
    std::vector<std::unique_ptr<decoder_layer>> layers_;
    std::vector<attention_variant> kinds_;
    tensor2 embed_, lm_head_, head_t_, emb_w_;  // lm_head_: untied only; head_t_ = head() transposed
    tensor1 final_norm_;
    tensor3 emb_qk_;
    embedding_qk_layout emb_layout_{};
    index_t pos_ = 0;
    decoder_profile prof_;
    std::vector<Eigen::Tensor<double, 3, Eigen::RowMajor>>* capture_ = nullptr;
    tensor2 stream_x_;                        // rnd_emb_qk: the fixed stream's input [max_length, d]
    std::vector<std::int32_t> stream_tokens_;  // fixed_seq_qk: the fixed stream's tokens [max_length]
    decoder_activations act_;  // the training pass's saved activations and buffers (the stream's too)
    std::unique_ptr<rope_cache> rope_cache_ = std::make_unique<rope_cache>();  // held by pointer: the decoder stays movable
};

}  // namespace model
}  // namespace attnkit

#include "attnkit/model/decoder_training.hpp"
#include "attnkit/model/checkpoint.hpp"
