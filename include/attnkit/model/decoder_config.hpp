// The decoder template's configuration: sizes, the attention variant and the layer schedule
// (model/hybrid_schedule.hpp) that decides which layers keep standard attention, and the
// seeded weight initialisation (nothing is downloaded). See model/decoder.hpp for the model.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/config.hpp"
#include "attnkit/detail/limits.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace model {

// The attention sublayer of a non-standard layer (Xue et al.'s variants and MTA).
enum class attention_variant {
    standard,      // softmax attention with a KV cache
    taylor,        // "Approximate": second-order Taylor softmax, taylor_state in decode
    self_gating,   // "Non-approximate": each token scores itself, self_gating_state in decode
    rnd_emb_qk,    // static Q/K from a stream of random embeddings run through the model
    fixed_seq_qk,  // static Q/K from the embeddings of one fixed token sequence
    embedding_qk,  // StaticEmbQK: Q/K from the token embeddings, one projection for all layers
    mlp,           // no token mixing: the attention sublayer is a gated MLP of the same size
    mta            // multi-token attention: key-query convolution, head mixing, group norm
};

inline const std::vector<std::pair<std::string, attention_variant>>& attention_variant_names() {
    static const std::vector<std::pair<std::string, attention_variant>> names = {
        {"standard", attention_variant::standard},       {"taylor", attention_variant::taylor},
        {"self_gating", attention_variant::self_gating}, {"rnd_emb_qk", attention_variant::rnd_emb_qk},
        {"fixed_seq_qk", attention_variant::fixed_seq_qk}, {"embedding_qk", attention_variant::embedding_qk},
        {"mlp", attention_variant::mlp},                 {"mta", attention_variant::mta}};
    return names;
}

inline attention_variant parse_attention_variant(const std::string& name) {
    std::string valid;
    for (const auto& n : attention_variant_names()) {
        if (n.first == name) return n.second;
        valid += (valid.empty() ? "" : ", ") + n.first;
    }
    throw std::invalid_argument("attnkit::model: unknown attention variant \"" + name + "\"; valid names: " + valid);
}

inline const std::string& attention_variant_name(attention_variant v) {
    for (const auto& n : attention_variant_names())
        if (n.second == v) return n.first;
    throw std::invalid_argument("attnkit::model: invalid attention_variant value");
}

// A Qwen2.5-shaped pre-norm decoder. Defaults: the 70M shape of Xue et al. (Table 10:
// d_model 512, 6 layers, 8 heads).
struct decoder_config {
    index_t vocab = 512;
    index_t d_model = 512;
    index_t layers = 6;
    index_t heads = 8;
    index_t heads_kv = 8;
    index_t ffn = 0;            // SwiGLU width; 0: 8 d_model / 3 rounded up to a multiple of 64
    index_t max_length = 1024;  // longest sequence (KV caches and static maps are sized by it)
    float rope_theta = 1e6f;    // Qwen2.5's RoPE base
    float norm_eps = 1e-6f;
    std::uint64_t seed = 1;     // every weight (and the fixed stream) derives from it
    std::string schedule = "uniform";  // hybrid_schedule name: layers that keep standard attention
    attention_variant variant = attention_variant::standard;
    // FixedSeqQK's fixed text as token ids (< vocab); empty: a seeded random sequence.
    std::vector<std::int32_t> fixed_sequence;
    // q/k/v projection biases (Qwen2 has them, Llama does not): bq [H D], bk and bv [Hk D],
    // added right after the projections. They start at 0 and draw nothing from the seed.
    // embedding_qk layers take Q and K from the shared projection of the embeddings, which has
    // no bias: those layers have bv only.
    bool attention_bias = false;
    // false: a separate output projection lm_head.weight [vocab, d_model] (Hugging Face's layout,
    // the embedding's), drawn N(0, 0.02) after every other draw of the seed, so that a tied and
    // an untied model of one seed share every other weight (and the fixed stream).
    bool tie_word_embeddings = true;
    thread_pool* pool = nullptr;

    index_t head_dim() const { return heads > 0 ? d_model / heads : 0; }
    index_t ffn_width() const { return ffn > 0 ? ffn : (8 * d_model / 3 + 63) / 64 * 64; }
};

// Throws std::invalid_argument naming the field when the shapes cannot work together.
inline void check_decoder_config(const decoder_config& c) {
    auto bad = [](const std::string& what) { throw std::invalid_argument("attnkit::model::decoder: " + what); };
    if (c.vocab < 1 || c.d_model < 1 || c.layers < 1 || c.heads < 1 || c.heads_kv < 1 || c.max_length < 1)
        bad("vocab, d_model, layers, heads, heads_kv and max_length must be >= 1");
    if (c.d_model % c.heads != 0)
        bad("d_model = " + std::to_string(c.d_model) + " must be a multiple of heads = " + std::to_string(c.heads));
    if (c.heads % c.heads_kv != 0)
        bad("heads = " + std::to_string(c.heads) + " must be a multiple of heads_kv = " + std::to_string(c.heads_kv));
    if (c.head_dim() % 2 != 0)
        bad("head dim d_model / heads = " + std::to_string(c.head_dim()) + " must be even (rotate-half RoPE)");
    if (c.ffn < 0) bad("ffn must be >= 0 (0: default width), got " + std::to_string(c.ffn));
    bool known = false;
    for (const auto& n : attention_variant_names()) known = known || n.second == c.variant;
    if (!known) bad("variant: not an attention_variant, got the value " + std::to_string(static_cast<int>(c.variant)));
    // Every position of the longest sequence is a key of one attention call over the cache.
    if (c.max_length > attnkit::detail::kMaxKeys)
        bad("max_length must be <= 2^24 - 1 (the most keys one attention call takes), got " +
            std::to_string(c.max_length));
    // The weights and caches as float tensors: each size in bytes must be a number (a wrapped
    // product would size a tensor wrongly and write past it).
    auto fits = [&](const char* what, index_t a, index_t b) {
        index_t n = 0, bytes = 0;
        if (!attnkit::detail::mul_fits(a, b, n) || !attnkit::detail::mul_fits(n, index_t(sizeof(float)), bytes))
            bad(std::string(what) + " = " + std::to_string(a) + " * " + std::to_string(b) +
                " floats overflows int64 bytes");
    };
    if (c.d_model > std::numeric_limits<index_t>::max() / 8)
        bad("d_model is too large, got " + std::to_string(c.d_model));
    fits("vocab * d_model (the embedding)", c.vocab, c.d_model);
    fits("d_model * d_model (the attention projections)", c.d_model, c.d_model);
    fits("d_model * ffn (the feed-forward weights)", c.d_model, c.ffn_width());
    fits("max_length * d_model (the caches and the fixed stream)", c.max_length, c.d_model);
    if (c.variant == attention_variant::embedding_qk) {  // one [d_model, layers * (H + Hk) D] matrix
        index_t width = 0;
        if (!attnkit::detail::mul_fits(c.layers, 2 * c.d_model, width))
            bad("layers * 2 d_model overflows int64, got layers = " + std::to_string(c.layers));
        fits("d_model * layers * (heads + heads_kv) * head dim (the embedding_qk weights)", c.d_model, width);
    }
    if (c.variant == attention_variant::rnd_emb_qk || c.variant == attention_variant::fixed_seq_qk)
        fits("heads * max_length^2 (the static attention maps)", c.heads, c.max_length * c.max_length);
    if (!(c.norm_eps > 0.0f) || !std::isfinite(c.norm_eps)) bad("norm_eps must be finite and > 0");
    if (!(c.rope_theta > 1.0f) || !std::isfinite(c.rope_theta)) bad("rope_theta must be finite and > 1");
    for (std::int32_t t : c.fixed_sequence)
        if (t < 0 || t >= c.vocab)
            bad("fixed_sequence: token " + std::to_string(t) + " outside [0, vocab = " + std::to_string(c.vocab) + ")");
}

// Seeded N(0, sigma) values: splitmix64 bits through Box-Muller, the same on every platform.
class weight_rng {
   public:
    // The seed goes through the generator's finaliser first: the state advances by the same
    // constant every draw, so seeding it with seed * constant would make seed + 1 the stream of
    // seed shifted by one draw (consecutive seeds, as a run over seeds or a batch counter uses
    // them, would give nearly the same weights or data).
    explicit weight_rng(std::uint64_t seed) : s_(mix(seed + 0x632be59bd9b4e019ULL)) {}
    double uniform() {  // (0, 1)
        s_ += 0x9e3779b97f4a7c15ULL;
        return (static_cast<double>(mix(s_) >> 11) + 0.5) / 9007199254740992.0;
    }
    // Uniform in {0, ..., n - 1}, n >= 1 (token ids, shuffles, window starts).
    index_t below(index_t n) { return static_cast<index_t>(uniform() * static_cast<double>(n)) % n; }
    float normal(float sigma) {
        const double r = std::sqrt(-2.0 * std::log(uniform())), a = 6.283185307179586 * uniform();
        return static_cast<float>(sigma * r * std::cos(a));
    }
    template <class T>
    void fill(T& t, float sigma) {
        for (index_t i = 0; i < static_cast<index_t>(t.size()); ++i) t.data()[i] = normal(sigma);
    }

   private:
    static std::uint64_t mix(std::uint64_t z) {  // splitmix64's finaliser
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    std::uint64_t s_;
};

}  // namespace model
}  // namespace attnkit
