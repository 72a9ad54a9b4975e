// attnkit::reference::model::decoder_loss, the double oracle of the decoder's training loss and
// gradients: every parameter's gradient, element by element, against central finite differences
// of the loss, for every variant under uniform and hybrid schedules, with and without q/k/v
// biases and an untied output head (rnd_emb_qk / fixed_seq_qk: through the fixed stream's
// forward and backward, which the finite differences see as a function of the weights like any
// other); the forward against the inference decoder (model/decoder.hpp) on the decoder's own
// seeded weights and fixed stream; no target -> loss 0 and zero gradients; bad input rejected.
#include "attnkit/reference/model/decoder.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/gated_mlp.hpp"
#include "attnkit/model/decoder.hpp"
#include "common/errors.hpp"

namespace {

using attnkit::index_t;
using attnkit::model::attention_variant;
using attnkit::model::decoder_config;
using attnkit::reference::model::decoder_loss;
using attnkit::reference::model::decoder_parameter_shapes;
using attnkit::reference::model::fixed_stream;
using attnkit::reference::model::parameter_map;
using attnkit_test::expect_invalid;

constexpr index_t kB = 2, kL = 5;

decoder_config tiny(attention_variant v, const std::string& schedule) {
    decoder_config c;
    c.vocab = 13;
    c.d_model = 8;
    c.layers = 2;
    c.heads = 2;
    c.heads_kv = 1;  // GQA
    c.ffn = 12;
    c.max_length = 16;
    c.rope_theta = 100.0f;  // both frequencies of D = 4 turn visibly over 5 positions
    c.variant = v;
    c.schedule = schedule;
    // rnd_emb_qk / fixed_seq_qk: the fixed stream runs over max_length rows, 2 past the batch's
    // (rows the main pass never reads, whose gradient must stay out of the others').
    if (v == attention_variant::rnd_emb_qk || v == attention_variant::fixed_seq_qk) c.max_length = kL + 2;
    return c;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

index_t elements(const std::vector<index_t>& shape) {
    index_t n = 1;
    for (index_t e : shape) n *= e;
    return n;
}

// N(0, 0.3) projections and embeddings, norm weights 1 + N(0, 0.3); MTA's kernels identity
// (decoder_layer's placement) plus N(0, 0.1), its gate N(0, 0.3).
parameter_map random_weights(const decoder_config& c, std::uint64_t seed) {
    attnkit::model::weight_rng rng(seed);
    parameter_map w;
    const index_t H = c.heads;
    for (const auto& s : decoder_parameter_shapes(c)) {
        const std::string& name = s.first;
        const bool conv = contains(name, "mta.kq_pre"), mix = contains(name, "mta.head_");
        std::vector<double>& v = w[name];
        for (index_t i = 0; i < elements(s.second); ++i)
            v.push_back(static_cast<double>(rng.normal(conv || mix ? 0.1f : 0.3f)));
        if (contains(name, "norm")) {
            for (double& x : v) x += 1.0;
        } else if (conv) {
            for (index_t h = 0; h < H; ++h) v[static_cast<std::size_t>(h * 66 + 5 * 11 + 5)] += 1.0;
        } else if (mix) {
            for (index_t h = 0; h < H; ++h) v[static_cast<std::size_t>(h * H + h)] += 1.0;
        }
    }
    return w;
}

// The fixed stream's input for a config: N(0, 0.5) embeddings (rnd_emb_qk), or max_length
// tokens (fixed_seq_qk) with a repeat and tokens the batch also has, so that an embedding row
// gets gradient from both passes.
fixed_stream stream_of(const decoder_config& c) {
    fixed_stream s;
    attnkit::model::weight_rng rng(17);
    if (c.variant == attention_variant::rnd_emb_qk)
        for (index_t i = 0; i < c.max_length * c.d_model; ++i) s.embeddings.push_back(static_cast<double>(rng.normal(0.5f)));
    if (c.variant == attention_variant::fixed_seq_qk)
        for (index_t i = 0; i < c.max_length; ++i) s.tokens.push_back(static_cast<std::int32_t>((i * 5 + 3) % 7 + 3));
    return s;
}

// decoder_loss with the config's fixed stream (ignored by the other kinds).
double loss_of(const decoder_config& c, const parameter_map& w, const std::vector<std::int32_t>& tokens,
               const std::vector<std::int32_t>& targets, index_t batch, index_t length, parameter_map* g = nullptr) {
    const fixed_stream s = stream_of(c);
    return decoder_loss(c, w, tokens, targets, batch, length, g, &s);
}

// Tokens [B, L] and next-token targets, some ignored (-1).
struct batch_data {
    std::vector<std::int32_t> tokens, targets;
};
batch_data make_batch(const decoder_config& c) {
    batch_data b;
    for (index_t i = 0; i < kB * kL; ++i) {
        b.tokens.push_back(static_cast<std::int32_t>((i * 5 + 3) % c.vocab));
        b.targets.push_back(i % 4 == 2 ? -1 : static_cast<std::int32_t>((i * 7 + 1) % c.vocab));
    }
    return b;
}

const std::vector<std::string> kVariants = {"standard",     "taylor",     "self_gating",  "mlp",
                                            "mta",          "embedding_qk", "rnd_emb_qk", "fixed_seq_qk"};

class ReferenceDecoderGradients : public ::testing::TestWithParam<std::string> {};

// Every element of every parameter: the analytic gradient against (f(w + h) - f(w - h)) / 2h,
// h = 1e-5 max(1, |w|), within 1e-6 of that parameter's gradient norm.
void expect_finite_differences(const decoder_config& c) {
    parameter_map w = random_weights(c, 11);
    const batch_data d = make_batch(c);
    parameter_map g;
    const double loss = loss_of(c, w, d.tokens, d.targets, kB, kL, &g);
    ASSERT_TRUE(std::isfinite(loss));
    EXPECT_GT(loss, 0.5);
    EXPECT_EQ(loss_of(c, w, d.tokens, d.targets, kB, kL), loss);  // without grads: the same loss
    ASSERT_EQ(g.size(), w.size());
    for (const auto& s : decoder_parameter_shapes(c)) {
        const std::string& name = s.first;
        SCOPED_TRACE(name);
        ASSERT_EQ(g.count(name), 1u);
        const std::vector<double>& grad = g.at(name);
        ASSERT_EQ(grad.size(), w.at(name).size());
        double norm = 0.0;
        for (double x : grad) norm += x * x;
        norm = std::sqrt(norm);
        EXPECT_GT(norm, 1e-6);  // every parameter matters
        const double tol = 1e-6 * norm + 1e-10;
        std::vector<double>& p = w.at(name);
        for (std::size_t i = 0; i < p.size(); ++i) {
            const double x0 = p[i], h = 1e-5 * std::max(1.0, std::fabs(x0));
            p[i] = x0 + h;
            const double up = loss_of(c, w, d.tokens, d.targets, kB, kL);
            p[i] = x0 - h;
            const double down = loss_of(c, w, d.tokens, d.targets, kB, kL);
            p[i] = x0;
            const double fd = (up - down) / (2.0 * h);
            EXPECT_NEAR(grad[i], fd, tol) << name << "[" << i << "]";
        }
    }
}

TEST_P(ReferenceDecoderGradients, MatchFiniteDifferences) {
    const attention_variant v = attnkit::model::parse_attention_variant(GetParam());
    // uniform: both layers the variant; hybrid: layer 1 standard; odd: layer 0 standard (for
    // embedding_qk: the variant's layer takes Q and K from the raw embeddings, not its input;
    // for the static kinds: the stream's q and k of layer 1 come through its layer 0, standard).
    for (const char* schedule : {"uniform", "hybrid", "odd"}) {
        SCOPED_TRACE(schedule);
        expect_finite_differences(tiny(v, schedule));
    }
}

// q/k/v biases (before SiLU and RoPE; embedding_qk layers bv only) and an untied lm_head.weight,
// apart and together.
TEST_P(ReferenceDecoderGradients, BiasesAndUntiedHeadMatchFiniteDifferences) {
    const attention_variant v = attnkit::model::parse_attention_variant(GetParam());
    for (int options = 1; options <= 3; ++options) {
        decoder_config c = tiny(v, "odd");
        c.attention_bias = options & 1;
        c.tie_word_embeddings = !(options & 2);
        SCOPED_TRACE(std::string(c.attention_bias ? "bias" : "") + (c.tie_word_embeddings ? "" : " untied"));
        expect_finite_differences(c);
    }
}

INSTANTIATE_TEST_SUITE_P(Variants, ReferenceDecoderGradients, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// The inference decoder's weights from its seed, in the order its constructor draws them
// (decoder.hpp, decoder_layer.hpp), as stored parameters.
parameter_map decoder_weights(const decoder_config& c) {
    attnkit::model::weight_rng rng(c.seed);
    const std::vector<bool> standard = attnkit::model::hybrid_schedule(c.schedule, c.layers);
    parameter_map w;
    const auto draw = [&](const std::string& name, index_t n, float sigma) {
        std::vector<double>& v = w[name];
        for (index_t i = 0; i < n; ++i) v.push_back(static_cast<double>(rng.normal(sigma)));
        return &v;
    };
    const index_t d = c.d_model, H = c.heads, Hk = c.heads_kv, D = c.head_dim(), f = c.ffn_width();
    draw("model.embed_tokens.weight", c.vocab * d, 0.02f);
    for (index_t l = 0; l < c.layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        const attention_variant k = standard[static_cast<std::size_t>(l)] ? attention_variant::standard : c.variant;
        w[p + "input_layernorm.weight"].assign(static_cast<std::size_t>(d), 1.0);
        w[p + "post_attention_layernorm.weight"].assign(static_cast<std::size_t>(d), 1.0);
        if (k == attention_variant::mlp) {
            const index_t m = attnkit::gated_mlp_width(d);
            draw(p + "token_mlp.gate_proj.weight", d * m, 0.02f);
            draw(p + "token_mlp.up_proj.weight", d * m, 0.02f);
            draw(p + "token_mlp.down_proj.weight", m * d, 0.02f);
        } else {
            draw(p + "self_attn.q_proj.weight", d * H * D, 0.02f);
            draw(p + "self_attn.k_proj.weight", d * Hk * D, 0.02f);
            draw(p + "self_attn.v_proj.weight", d * Hk * D, 0.02f);
            draw(p + "self_attn.o_proj.weight", H * D * d, 0.02f);
        }
        if (k == attention_variant::mta) {
            auto* conv = draw(p + "self_attn.mta.kq_pre", H * 6 * 11, 0.01f);
            auto* pre = draw(p + "self_attn.mta.head_pre", H * H, 0.01f);
            auto* post = draw(p + "self_attn.mta.head_post", H * H, 0.01f);
            for (index_t h = 0; h < H; ++h) {
                // The decoder adds 1 in float: the reference gets the same float values.
                (*conv)[static_cast<std::size_t>(h * 66 + 5 * 11 + 5)] =
                    static_cast<double>(static_cast<float>((*conv)[static_cast<std::size_t>(h * 66 + 5 * 11 + 5)]) + 1.0f);
                (*pre)[static_cast<std::size_t>(h * H + h)] =
                    static_cast<double>(static_cast<float>((*pre)[static_cast<std::size_t>(h * H + h)]) + 1.0f);
                (*post)[static_cast<std::size_t>(h * H + h)] =
                    static_cast<double>(static_cast<float>((*post)[static_cast<std::size_t>(h * H + h)]) + 1.0f);
            }
            w[p + "self_attn.mta.group_norm.weight"].assign(static_cast<std::size_t>(D), 1.0);
            draw(p + "self_attn.mta.gate.weight", D, 0.02f);
        }
        draw(p + "mlp.gate_proj.weight", d * f, 0.02f);
        draw(p + "mlp.up_proj.weight", d * f, 0.02f);
        draw(p + "mlp.down_proj.weight", f * d, 0.02f);
    }
    w["model.norm.weight"].assign(static_cast<std::size_t>(d), 1.0);
    return w;
}

class ReferenceDecoderForward : public ::testing::TestWithParam<std::string> {};

// The loss with only the last position's target t set is lse(logits) - logits[t] of the last
// row: for every t, against the inference decoder's prefill logits (float kernels) on the same
// weights. The spread of the loss over t is the logits' spread, to which every sublayer adds.
TEST_P(ReferenceDecoderForward, MatchesInferenceDecoder) {
    const attention_variant v = attnkit::model::parse_attention_variant(GetParam());
    for (const char* schedule : {"uniform", "odd"}) {
        SCOPED_TRACE(schedule);
        decoder_config c;
        c.vocab = 29;
        c.d_model = 32;
        c.layers = 3;
        c.heads = 4;
        c.heads_kv = 2;
        c.max_length = 16;
        c.rope_theta = 500.0f;
        c.seed = 5;
        c.variant = v;
        c.schedule = schedule;
        const parameter_map w = decoder_weights(c);
        ASSERT_EQ(w.size(), decoder_parameter_shapes(c).size());
        attnkit::model::decoder model(c);
        // The decoder's own fixed stream (empty for the other kinds).
        const attnkit::model::tensor2 sx = model.fixed_stream_input();
        const fixed_stream stream{std::vector<double>(sx.data(), sx.data() + sx.size()), model.fixed_stream_tokens()};
        if (v == attention_variant::rnd_emb_qk || v == attention_variant::fixed_seq_qk) {
            ASSERT_EQ(sx.dimension(0), c.max_length);
            ASSERT_EQ(sx.dimension(1), c.d_model);
        }
        const index_t L = 9;
        std::vector<std::int32_t> tokens;
        for (index_t i = 0; i < L; ++i) tokens.push_back(static_cast<std::int32_t>((i * 11 + 4) % c.vocab));
        const std::vector<float> logits = model.prefill(tokens);
        double m = -1e300;
        for (float x : logits) m = std::max(m, static_cast<double>(x));
        double z = 0.0;
        for (float x : logits) z += std::exp(static_cast<double>(x) - m);
        const double lse = m + std::log(z);
        double spread = 0.0;
        for (float x : logits) spread = std::max(spread, std::fabs(static_cast<double>(x) - static_cast<double>(logits[0])));
        EXPECT_GT(spread, 1e-2);
        for (std::int32_t t = 0; t < c.vocab; ++t) {
            std::vector<std::int32_t> targets(static_cast<std::size_t>(L), -1);
            targets.back() = t;
            const double want = lse - static_cast<double>(logits[static_cast<std::size_t>(t)]);
            // Float kernels against double: ~1e-7 apart. With the decoder's N(0, 0.02) weights
            // the scores are small, so the attention kinds differ by ~5e-4 here and RoPE's
            // theta 500 against 400 by ~3e-5; 1e-6 tells them apart.
            EXPECT_NEAR(decoder_loss(c, w, tokens, targets, 1, L, nullptr, &stream), want, 1e-6) << "target " << t;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Variants, ReferenceDecoderForward, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(ReferenceDecoder, ParameterShapesInOrder) {
    const decoder_config c = tiny(attention_variant::mta, "hybrid");  // layer 0 mta, layer 1 standard
    const auto s = decoder_parameter_shapes(c);
    std::vector<std::string> names;
    for (const auto& p : s) names.push_back(p.first);
    const std::vector<std::string> want = {
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.self_attn.mta.kq_pre",
        "model.layers.0.self_attn.mta.head_pre",
        "model.layers.0.self_attn.mta.head_post",
        "model.layers.0.self_attn.mta.group_norm.weight",
        "model.layers.0.self_attn.mta.gate.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.input_layernorm.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight",
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "model.layers.1.mlp.gate_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight"};
    EXPECT_EQ(names, want);
    EXPECT_EQ(s[0].second, (std::vector<index_t>{13, 8}));
    EXPECT_EQ(s[2].second, (std::vector<index_t>{8, 8}));
    EXPECT_EQ(s[3].second, (std::vector<index_t>{8, 4}));
    EXPECT_EQ(s[5].second, (std::vector<index_t>{8, 8}));
    EXPECT_EQ(s[6].second, (std::vector<index_t>{2, 1, 6, 11}));
    EXPECT_EQ(s[7].second, (std::vector<index_t>{2, 2}));
    EXPECT_EQ(s[9].second, (std::vector<index_t>{4}));
    EXPECT_EQ(s[12].second, (std::vector<index_t>{8, 12}));
    EXPECT_EQ(s[14].second, (std::vector<index_t>{12, 8}));

    // Biases after their weights (embedding_qk layers: v only), lm_head.weight last, [vocab, d].
    decoder_config cb = tiny(attention_variant::embedding_qk, "odd");  // layer 0 standard
    cb.attention_bias = true;
    cb.tie_word_embeddings = false;
    const auto sb = decoder_parameter_shapes(cb);
    std::vector<std::string> attn;
    for (const auto& p : sb)
        if (p.first.find("self_attn") != std::string::npos) attn.push_back(p.first);
    EXPECT_EQ(attn, (std::vector<std::string>{
                        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
                        "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.k_proj.bias",
                        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.v_proj.bias",
                        "model.layers.0.self_attn.o_proj.weight", "model.layers.1.self_attn.q_proj.weight",
                        "model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight",
                        "model.layers.1.self_attn.v_proj.bias", "model.layers.1.self_attn.o_proj.weight"}));
    EXPECT_EQ(sb[3].second, (std::vector<index_t>{8}));  // q_proj.bias [H D]
    EXPECT_EQ(sb[5].second, (std::vector<index_t>{4}));  // k_proj.bias [Hk D]
    EXPECT_EQ(sb.back().first, "lm_head.weight");
    EXPECT_EQ(sb.back().second, (std::vector<index_t>{13, 8}));

    const auto m = decoder_parameter_shapes(tiny(attention_variant::mlp, "uniform"));
    EXPECT_EQ(m[2].first, "model.layers.0.token_mlp.gate_proj.weight");
    EXPECT_EQ(m[2].second, (std::vector<index_t>{8, attnkit::gated_mlp_width(8)}));
    EXPECT_EQ(m[3].first, "model.layers.0.token_mlp.up_proj.weight");
    EXPECT_EQ(m[4].first, "model.layers.0.token_mlp.down_proj.weight");
    EXPECT_EQ(m[4].second, (std::vector<index_t>{attnkit::gated_mlp_width(8), 8}));
}

// Batch items are independent sequences, each from position 0: the batch's loss is the
// per-item losses weighted by their counted targets.
TEST(ReferenceDecoder, BatchItemsAreIndependent) {
    for (const std::string& variant : kVariants) {
        SCOPED_TRACE(variant);
        const decoder_config c = tiny(attnkit::model::parse_attention_variant(variant), "hybrid");
        const parameter_map w = random_weights(c, 9);
        const batch_data d = make_batch(c);
        double sum = 0.0;
        index_t total = 0;
        for (index_t b = 0; b < kB; ++b) {
            const auto from = static_cast<std::ptrdiff_t>(b * kL), to = from + kL;
            const std::vector<std::int32_t> tok(d.tokens.begin() + from, d.tokens.begin() + to);
            const std::vector<std::int32_t> tgt(d.targets.begin() + from, d.targets.begin() + to);
            const index_t n = std::count_if(tgt.begin(), tgt.end(), [](std::int32_t t) { return t >= 0; });
            sum += static_cast<double>(n) * loss_of(c, w, tok, tgt, 1, kL);
            total += n;
        }
        EXPECT_NEAR(loss_of(c, w, d.tokens, d.targets, kB, kL), sum / static_cast<double>(total), 1e-13);
    }
}

TEST(ReferenceDecoder, NoTargetGivesZeroLossAndGradients) {
    for (const std::string& variant : kVariants) {
        SCOPED_TRACE(variant);
        const decoder_config c = tiny(attnkit::model::parse_attention_variant(variant), "uniform");
        const parameter_map w = random_weights(c, 3);
        const batch_data d = make_batch(c);
        const std::vector<std::int32_t> none(d.targets.size(), -1);
        parameter_map g;
        g["stale"] = {1.0};
        EXPECT_EQ(loss_of(c, w, d.tokens, none, kB, kL, &g), 0.0);
        ASSERT_EQ(g.size(), w.size());
        for (const auto& p : w) {
            ASSERT_EQ(g.count(p.first), 1u) << p.first;
            const std::vector<double>& gp = g.at(p.first);
            ASSERT_EQ(gp.size(), p.second.size());
            for (double x : gp) EXPECT_EQ(x, 0.0) << p.first;
        }
    }
}

TEST(ReferenceDecoder, RejectsBadInput) {
    const decoder_config c = tiny(attention_variant::taylor, "hybrid");
    const parameter_map w = random_weights(c, 5);
    const batch_data d = make_batch(c);
    parameter_map g;
    const auto loss = [&](const decoder_config& cc, const parameter_map& ww, const std::vector<std::int32_t>& tok,
                          const std::vector<std::int32_t>& tgt, index_t b, index_t l) {
        return decoder_loss(cc, ww, tok, tgt, b, l, &g);
    };
    std::vector<std::int32_t> bad = d.tokens;
    bad[3] = 13;
    expect_invalid([&] { loss(c, w, bad, d.targets, kB, kL); }, "token 13");
    bad[3] = -1;
    expect_invalid([&] { loss(c, w, bad, d.targets, kB, kL); }, "token -1");
    std::vector<std::int32_t> bad_target = d.targets;
    bad_target[0] = 13;
    expect_invalid([&] { loss(c, w, d.tokens, bad_target, kB, kL); }, "target 13");
    expect_invalid([&] { loss(c, w, d.tokens, d.targets, kB, kL + 1); }, "batch * length");
    std::vector<std::int32_t> short_tokens(d.tokens.begin(), d.tokens.end() - 1);
    expect_invalid([&] { loss(c, w, short_tokens, d.targets, kB, kL); }, "batch * length");
    std::vector<std::int32_t> short_targets(d.targets.begin(), d.targets.end() - 1);
    expect_invalid([&] { loss(c, w, d.tokens, short_targets, kB, kL); }, "batch * length");
    expect_invalid([&] { loss(c, w, {}, {}, 0, kL); }, "batch and length");
    decoder_config short_max = c;
    short_max.max_length = 4;
    expect_invalid([&] { loss(short_max, w, d.tokens, d.targets, kB, kL); }, "max_length");

    parameter_map missing = w;
    missing.erase("model.layers.1.self_attn.k_proj.weight");
    expect_invalid([&] { loss(c, missing, d.tokens, d.targets, kB, kL); },
                   {"model.layers.1.self_attn.k_proj.weight", "missing"});
    parameter_map wrong = w;
    wrong.at("model.layers.0.mlp.down_proj.weight").pop_back();
    expect_invalid([&] { loss(c, wrong, d.tokens, d.targets, kB, kL); },
                   {"model.layers.0.mlp.down_proj.weight", "95", "96"});
    parameter_map extra = w;
    extra["model.layers.0.self_attn.mta.gate.weight"] = std::vector<double>(4, 0.0);
    expect_invalid([&] { loss(c, extra, d.tokens, d.targets, kB, kL); }, "not one of this config's");

    // The static kinds need the fixed stream's input, of the config's sizes.
    for (attention_variant s : {attention_variant::rnd_emb_qk, attention_variant::fixed_seq_qk}) {
        SCOPED_TRACE(attnkit::model::attention_variant_name(s));
        const decoder_config st = tiny(s, "hybrid");
        const parameter_map ws = random_weights(st, 5);
        expect_invalid([&] { loss(st, ws, d.tokens, d.targets, kB, kL); }, {"stream", "fixed stream"});
        fixed_stream in = stream_of(st);
        if (s == attention_variant::rnd_emb_qk) {
            in.embeddings.pop_back();
            expect_invalid([&] { decoder_loss(st, ws, d.tokens, d.targets, kB, kL, &g, &in); },
                           {"stream: embeddings", "56", "55"});
        } else {
            in.tokens.pop_back();
            expect_invalid([&] { decoder_loss(st, ws, d.tokens, d.targets, kB, kL, &g, &in); },
                           {"stream: tokens", "7", "6"});
            in = stream_of(st);
            in.tokens[2] = 13;
            expect_invalid([&] { decoder_loss(st, ws, d.tokens, d.targets, kB, kL, &g, &in); }, "stream: token 13");
        }
    }
    decoder_config bad_config = c;
    bad_config.heads = 3;
    expect_invalid([&] { loss(bad_config, w, d.tokens, d.targets, kB, kL); }, "multiple of heads");
    decoder_config bad_schedule = c;
    bad_schedule.schedule = "sideways";
    expect_invalid([&] { loss(bad_schedule, w, d.tokens, d.targets, kB, kL); }, "unknown schedule");
    EXPECT_TRUE(g.empty());  // nothing written on a throw
}

}  // namespace
