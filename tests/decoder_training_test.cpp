// The decoder's training pass (model/decoder_training.hpp) and AdamW (model/adamw.hpp): every
// parameter's gradient against the double reference model (reference/model/decoder.hpp, itself
// checked against finite differences in reference_decoder_test), for every layer kind
// (rnd_emb_qk / fixed_seq_qk through the fixed stream's forward and backward); bitwise losses
// and gradients for 1, 2 and 3 threads; the training forward against prefill and decode after
// updates (also with q/k/v biases and an untied output head); AdamW's update against its
// formula; a short MQAR run whose loss must fall (it does not when a gradient is wrong); bad
// input rejected with no change.
#include "attnkit/model/adamw.hpp"
#include "attnkit/model/decoder.hpp"
#include "attnkit/model/tasks.hpp"
#include "attnkit/reference/model/decoder.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/decoder_weights.hpp"
#include "common/errors.hpp"

namespace {

using namespace attnkit::model;
using attnkit::index_t;
using attnkit_test::expect_invalid;
using attnkit_test::perturb;

decoder_config tiny(attention_variant v, const std::string& schedule) {
    decoder_config c;
    c.vocab = 29;
    c.d_model = 32;
    c.layers = 2;
    c.heads = 4;
    c.heads_kv = 2;
    c.max_length = 16;
    c.variant = v;
    c.schedule = schedule;
    c.seed = 11;
    // fixed_seq_qk: a given prefix with a repeat, then seeded random tokens up to max_length.
    if (v == attention_variant::fixed_seq_qk) c.fixed_sequence = {3, 17, 3, 8};
    return c;
}

struct batch_data {
    std::vector<std::int32_t> tokens, targets;
    index_t batch, length;
};

batch_data next_token_batch(index_t B, index_t L, index_t vocab, std::uint64_t seed) {
    weight_rng rng(seed);
    batch_data b{{}, {}, B, L};
    for (index_t i = 0; i < B * (L + 1); ++i)
        b.tokens.push_back(static_cast<std::int32_t>(rng.below(vocab)));
    std::vector<std::int32_t> t, y;
    for (index_t s = 0; s < B; ++s)
        for (index_t l = 0; l < L; ++l) {
            t.push_back(b.tokens[static_cast<std::size_t>(s * (L + 1) + l)]);
            // Every third target ignored: the mean counts only the rest.
            y.push_back(l % 3 == 2 ? -1 : b.tokens[static_cast<std::size_t>(s * (L + 1) + l + 1)]);
        }
    b.tokens = t;
    b.targets = y;
    return b;
}

attnkit::reference::model::parameter_map as_doubles(const decoder& m) {
    attnkit::reference::model::parameter_map w;
    m.for_each_parameter([&](const std::string& name, const auto& t) {
        w[name] = std::vector<double>(t.data(), t.data() + t.size());
    });
    return w;
}

struct kind_case {
    attention_variant variant;
    const char* schedule;
    bool bias = false;    // decoder_config::attention_bias
    bool untied = false;  // !decoder_config::tie_word_embeddings
};

decoder_config tiny(const kind_case& kc) {
    decoder_config c = tiny(kc.variant, kc.schedule);
    c.attention_bias = kc.bias;
    c.tie_word_embeddings = !kc.untied;
    return c;
}

class DecoderTraining : public ::testing::TestWithParam<kind_case> {};

TEST_P(DecoderTraining, GradientsMatchTheDoubleReference) {
    const kind_case kc = GetParam();
    const decoder_config c = tiny(kc);
    decoder m(c);
    perturb(m, 5);
    const batch_data b = next_token_batch(2, 7, c.vocab, 3);
    decoder_gradients g(m);
    const double loss = m.loss_and_gradients(b.tokens, b.targets, b.batch, g);

    // The fixed stream's input as the decoder has it (empty for the other kinds).
    const tensor2 sx = m.fixed_stream_input();
    const attnkit::reference::model::fixed_stream stream{std::vector<double>(sx.data(), sx.data() + sx.size()),
                                                         m.fixed_stream_tokens()};
    attnkit::reference::model::parameter_map grads;
    const double ref_loss = attnkit::reference::model::decoder_loss(c, as_doubles(m), b.tokens, b.targets, b.batch,
                                                                    b.length, &grads, &stream);
    EXPECT_NEAR(loss, ref_loss, 1e-5 * std::max(1.0, std::abs(ref_loss)));
    // Per tensor, the error relative to the tensor's largest gradient: float arithmetic through
    // two layers and a softmax over the vocab keeps ~1e-6; a wrong index or a missing term
    // is off by the gradient's own size.
    g.for_each([&](const std::string& name, const auto& t) {
        const auto it = grads.find(name);
        ASSERT_NE(it, grads.end()) << name;
        ASSERT_EQ(static_cast<std::size_t>(t.size()), it->second.size()) << name;
        double top = 0.0, err = 0.0;
        for (std::size_t i = 0; i < it->second.size(); ++i) {
            top = std::max(top, std::abs(it->second[i]));
            err = std::max(err, std::abs(static_cast<double>(t.data()[i]) - it->second[i]));
        }
        EXPECT_LE(err, 2e-4 * top + 1e-7) << name << ": largest gradient " << top;
        EXPECT_GT(top, 0.0) << name << ": a parameter without gradient";
    });
}

TEST_P(DecoderTraining, BitwiseForAnyThreadCount) {
    const kind_case kc = GetParam();
    const batch_data b = next_token_batch(3, 9, 29, 4);
    std::vector<std::vector<float>> first;
    double first_loss = 0.0;
    for (int threads : {1, 2, 3}) {
        attnkit::thread_pool pool(threads);
        decoder_config c = tiny(kc);
        c.pool = threads > 1 ? &pool : nullptr;
        decoder m(c);
        perturb(m, 6);
        decoder_gradients g(m);
        const double loss = m.loss_and_gradients(b.tokens, b.targets, b.batch, g);
        std::vector<std::vector<float>> all;
        g.for_each([&](const std::string&, const auto& t) { all.emplace_back(t.data(), t.data() + t.size()); });
        if (threads == 1) {
            first = all;
            first_loss = loss;
            continue;
        }
        EXPECT_EQ(std::memcmp(&loss, &first_loss, sizeof loss), 0) << threads << " threads";
        ASSERT_EQ(all.size(), first.size());
        for (std::size_t i = 0; i < all.size(); ++i)
            EXPECT_EQ(std::memcmp(all[i].data(), first[i].data(), all[i].size() * sizeof(float)), 0)
                << "tensor " << i << ", " << threads << " threads";
    }
}

// After AdamW steps, the training forward's logits equal prefill's (the inference path with its
// caches and decode states), and a decode step equals the last row of a longer prefill.
TEST_P(DecoderTraining, TrainedModelPrefillsAndDecodesAlike) {
    const kind_case kc = GetParam();
    const decoder_config c = tiny(kc);
    decoder m(c);
    perturb(m, 7);
    adamw_options o;
    o.lr = 1e-2f;
    adamw opt(m, o);
    decoder_gradients g(m);
    const batch_data b = next_token_batch(2, 8, c.vocab, 5);
    for (int s = 0; s < 3; ++s) {
        m.loss_and_gradients(b.tokens, b.targets, b.batch, g);
        opt.step(m, g);
    }
    const std::vector<std::int32_t> seq(b.tokens.begin() + 8, b.tokens.begin() + 16);  // the second item
    const tensor2 all = m.batch_logits(b.tokens, 2);
    const std::vector<std::int32_t> head(seq.begin(), seq.end() - 1);
    m.prefill(head);
    const std::vector<float> step = m.decode_step(seq.back());
    const std::vector<float> full = m.prefill(seq);
    float top = 0.0f;
    for (float x : full) top = std::max(top, std::abs(x));
    for (index_t v = 0; v < c.vocab; ++v) {
        EXPECT_NEAR(step[static_cast<std::size_t>(v)], full[static_cast<std::size_t>(v)], 1e-4f * top) << v;
        EXPECT_NEAR(all(2 * 8 - 1, v), full[static_cast<std::size_t>(v)], 1e-4f * top) << v;
    }
}

const kind_case kKinds[] = {
    {attention_variant::standard, "uniform"},     {attention_variant::taylor, "uniform"},
    {attention_variant::self_gating, "uniform"},  {attention_variant::mlp, "uniform"},
    {attention_variant::mta, "uniform"},          {attention_variant::embedding_qk, "uniform"},
    {attention_variant::taylor, "first"},         {attention_variant::embedding_qk, "last"},
    // q/k/v biases (Qwen2), an untied head (lm_head.weight), both: self-gating's bias goes in
    // before SiLU, embedding_qk layers have bv only.
    {attention_variant::standard, "uniform", true, false},
    {attention_variant::standard, "uniform", false, true},
    {attention_variant::self_gating, "uniform", true, true},
    {attention_variant::embedding_qk, "last", true, true},
    {attention_variant::mta, "hybrid", true, false},
    {attention_variant::taylor, "first", true, true},
    // The fixed stream: uniform (layer 0 static below the stream's top, layer 1 its top, q and k
    // only), hybrid (layer 0 static and the top: the stream is one norm and projection), odd
    // (layer 0 standard: the stream's q and k of layer 1 come through it).
    {attention_variant::rnd_emb_qk, "uniform"},
    {attention_variant::fixed_seq_qk, "uniform"},
    {attention_variant::rnd_emb_qk, "hybrid", true, false},
    {attention_variant::fixed_seq_qk, "odd", true, true},
    {attention_variant::fixed_seq_qk, "hybrid", false, true},
};

std::string kind_name(const ::testing::TestParamInfo<kind_case>& i) {
    return attention_variant_name(i.param.variant) + "_" + i.param.schedule + (i.param.bias ? "_bias" : "") +
           (i.param.untied ? "_untied" : "");
}

INSTANTIATE_TEST_SUITE_P(Kinds, DecoderTraining, ::testing::ValuesIn(kKinds), kind_name);

// One AdamW step against its formula, element by element, in double (the first step: m = (1 -
// b1) g, v = (1 - b2) g^2, bias corrections 1 - b1 and 1 - b2), with decay on matrices only
// and the global-norm clipping.
TEST(AdamW, FirstStepFollowsTheFormula) {
    decoder m(tiny(attention_variant::standard, "uniform"));
    perturb(m, 8);
    decoder_gradients g(m);
    const batch_data b = next_token_batch(2, 6, 29, 6);
    m.loss_and_gradients(b.tokens, b.targets, b.batch, g);
    const double norm = g.global_norm();
    adamw_options o;
    o.lr = 0.01f;
    o.weight_decay = 0.1f;
    o.clip_norm = static_cast<float>(norm / 2);  // clipping active: scale ~1/2
    o.warmup_steps = 4;                          // the first step's lr is lr / 4
    const auto before = as_doubles(m);
    std::vector<std::vector<double>> grads;
    g.for_each([&](const std::string&, const auto& t) { grads.emplace_back(t.data(), t.data() + t.size()); });
    adamw opt(m, o);
    EXPECT_DOUBLE_EQ(opt.step(m, g), norm);
    const double lr = 0.01 / 4, clip = (norm / 2) / (norm + 1e-6);
    std::size_t k = 0;
    m.for_each_parameter([&](const std::string& name, const auto& t) {
        const std::vector<double>& p0 = before.at(name);
        const std::vector<double>& gr = grads[k++];
        const bool matrix = t.NumDimensions >= 2;
        for (std::size_t i = 0; i < p0.size(); ++i) {
            const double gc = gr[i] * clip;
            const double mh = gc, vh = gc * gc;  // (1 - b) g / (1 - b): the bias-corrected moments
            const double want = p0[i] * (matrix ? 1.0 - lr * 0.1 : 1.0) - lr * mh / (std::sqrt(vh) + 1e-8);
            ASSERT_NEAR(t.data()[i], want, 1e-6 * std::max(1.0, std::abs(want))) << name << "[" << i << "]";
        }
    });
    // The gradients were clipped in place.
    EXPECT_NEAR(g.global_norm(), norm / 2, 1e-5 * norm);
}

TEST(AdamW, CosineScheduleAndOptions) {
    decoder m(tiny(attention_variant::standard, "uniform"));
    adamw_options o;
    o.lr = 1.0f;
    o.warmup_steps = 10;
    o.total_steps = 110;
    o.schedule = lr_schedule::cosine;
    o.min_lr_ratio = 0.1f;
    adamw opt(m, o);
    EXPECT_DOUBLE_EQ(opt.learning_rate(5), 0.5);
    EXPECT_DOUBLE_EQ(opt.learning_rate(10), 1.0);
    EXPECT_NEAR(opt.learning_rate(60), 0.55, 1e-8);  // half way: (1 + 0.1) / 2 (min_lr_ratio is a float)
    EXPECT_NEAR(opt.learning_rate(110), 0.1, 1e-8);
    EXPECT_NEAR(opt.learning_rate(500), 0.1, 1e-8);
    adamw_options bad = o;
    bad.total_steps = 10;
    expect_invalid([&] { adamw x(m, bad); }, {"total_steps"});
    bad = o;
    bad.beta2 = 1.0f;
    expect_invalid([&] { adamw x(m, bad); }, {"beta"});
    // Gradients of another decoder: rejected, the model unchanged.
    decoder other(tiny(attention_variant::mlp, "uniform"));
    decoder_gradients g_other(other);
    const auto before = as_doubles(m);
    expect_invalid([&] { opt.step(m, g_other); }, {"gradients"});
    EXPECT_EQ(as_doubles(m), before);
}

// Fitting one fixed MQAR batch: with correct gradients the loss falls far below its start in a
// few hundred steps; a wrong sign or a missing term leaves it near log(vocab).
TEST(DecoderTrainingRun, MqarLossFalls) {
    decoder_config c;
    c.vocab = 24;
    c.d_model = 32;
    c.layers = 2;
    c.heads = 2;
    c.heads_kv = 2;
    c.max_length = 32;
    c.seed = 3;
    decoder m(c);
    mqar_options mo;
    mo.vocab = c.vocab;
    mo.pairs = 4;
    mo.queries = 4;
    const token_batch b = mqar_batch(mo, 8, 21);
    adamw_options o;
    o.lr = 3e-3f;
    o.weight_decay = 0.0f;
    adamw opt(m, o);
    decoder_gradients g(m);
    double first = 0.0, last = 0.0;
    for (int s = 0; s < 200; ++s) {
        last = m.loss_and_gradients(b.tokens, b.targets, b.batch, g);
        if (s == 0) first = last;
        opt.step(m, g);
    }
    EXPECT_NEAR(first, std::log(24.0), 0.3);
    EXPECT_LT(last, 0.25 * first) << "first " << first << ", last " << last;
    EXPECT_GT(accuracy(m.batch_logits(b.tokens, b.batch), b.targets), 0.9);
}

// A training run (gradients, clipping, AdamW, parameters_changed) gives the same losses and the
// same final parameters bit for bit with 1, 2 and 3 threads.
TEST(DecoderTrainingRun, LossesBitwiseForAnyThreadCount) {
    mqar_options mo;
    mo.vocab = 29;
    mo.pairs = 3;
    mo.queries = 3;
    std::vector<double> first_losses;
    attnkit::reference::model::parameter_map first_params;
    for (int threads : {1, 2, 3}) {
        attnkit::thread_pool pool(threads);
        decoder_config c = tiny(attention_variant::mta, "first");
        c.pool = threads > 1 ? &pool : nullptr;
        decoder m(c);
        adamw_options o;
        o.lr = 1e-2f;
        o.clip_norm = 0.5f;
        adamw opt(m, o);
        decoder_gradients g(m);
        std::vector<double> losses;
        for (int s = 0; s < 4; ++s) {
            const token_batch b = mqar_batch(mo, 3, 40 + s);
            losses.push_back(m.loss_and_gradients(b.tokens, b.targets, b.batch, g));
            opt.step(m, g);
        }
        if (threads == 1) {
            first_losses = losses;
            first_params = as_doubles(m);
            continue;
        }
        EXPECT_EQ(std::memcmp(losses.data(), first_losses.data(), losses.size() * sizeof(double)), 0)
            << threads << " threads";
        EXPECT_EQ(as_doubles(m), first_params) << threads << " threads";
    }
}

TEST(DecoderTrainingArgs, BadInputIsRejectedWithoutChange) {
    decoder m(tiny(attention_variant::standard, "uniform"));
    decoder_gradients g(m);
    const auto before = as_doubles(m);
    const batch_data b = next_token_batch(2, 5, 29, 9);
    std::vector<std::int32_t> t = b.tokens, y = b.targets;
    expect_invalid([&] { m.loss_and_gradients(t, y, 3, g); }, {"tokens", "batch = 3"});
    y.pop_back();
    expect_invalid([&] { m.loss_and_gradients(t, y, 2, g); }, {"targets", "expected 10"});
    y = b.targets;
    y[3] = 29;
    expect_invalid([&] { m.loss_and_gradients(t, y, 2, g); }, {"targets", "vocab"});
    y = b.targets;
    t[4] = -2;
    expect_invalid([&] { m.loss_and_gradients(t, y, 2, g); }, {"tokens", "-2"});
    t = std::vector<std::int32_t>(34, 1);
    expect_invalid([&] { m.loss(t, std::vector<std::int32_t>(34, 1), 2); }, {"max_length"});
    decoder other(tiny(attention_variant::taylor, "first"));
    decoder_gradients g_other(other);
    expect_invalid([&] { m.loss_and_gradients(b.tokens, b.targets, 2, g_other); }, {"g"});
    decoder_config with_bias = tiny(attention_variant::standard, "uniform");
    with_bias.attention_bias = true;
    decoder biased(with_bias);
    decoder_gradients g_biased(biased);
    expect_invalid([&] { m.loss_and_gradients(b.tokens, b.targets, 2, g_biased); }, {"g", "biases"});
    // Static layers train; a static decoder still rejects another decoder's gradients (here the
    // standard one's, of the same shapes) and sequences past max_length (the stream's length).
    decoder st(tiny(attention_variant::rnd_emb_qk, "uniform"));
    decoder_gradients g_st(st);
    const auto st_before = as_doubles(st);
    expect_invalid([&] { st.loss_and_gradients(b.tokens, b.targets, 2, g); }, {"g", "other layers"});
    const std::vector<std::int32_t> too_long(2 * 17, 1);
    expect_invalid([&] { st.loss_and_gradients(too_long, too_long, 2, g_st); }, {"max_length"});
    EXPECT_EQ(as_doubles(st), st_before);
    EXPECT_EQ(as_doubles(m), before);
    // All targets ignored: loss 0 and zero gradients.
    const double loss = m.loss_and_gradients(b.tokens, std::vector<std::int32_t>(10, -1), 2, g);
    EXPECT_EQ(loss, 0.0);
    EXPECT_EQ(g.global_norm(), 0.0);
}

// Biases start at 0 and draw nothing; lm_head is drawn after everything else: the same seed gives
// the same other weights (and the same fixed stream) with or without them.
TEST(DecoderOptions, BiasAndUntiedHeadKeepTheSeedsWeights) {
    for (attention_variant v : {attention_variant::standard, attention_variant::rnd_emb_qk}) {
        const decoder_config c = tiny(v, "hybrid");
        decoder base(c);
        decoder_config cu = c;
        cu.attention_bias = true;
        cu.tie_word_embeddings = false;
        decoder other(cu);
        const auto w = as_doubles(base), wu = as_doubles(other);
        std::size_t biases = 0;
        for (const auto& p : wu) {
            if (p.first.find(".bias") != std::string::npos) {
                ++biases;
                EXPECT_EQ(p.second, std::vector<double>(p.second.size(), 0.0)) << p.first;
            } else if (p.first == "lm_head.weight") {
                EXPECT_NE(p.second, w.at("model.embed_tokens.weight"));
            } else {
                EXPECT_EQ(p.second, w.at(p.first)) << p.first;
            }
        }
        EXPECT_EQ(biases, 6u);
        EXPECT_EQ(wu.size(), w.size() + 7);
        if (v == attention_variant::rnd_emb_qk) {
            // Zero biases, tied head: the same model, fixed stream included.
            decoder_config cb = c;
            cb.attention_bias = true;
            decoder biased(cb);
            const std::vector<std::int32_t> t = {1, 5, 2, 7, 3};
            EXPECT_EQ(biased.prefill(t), base.prefill(t));
        }
    }
}

TEST(Mqar, BatchesAreWellFormed) {
    mqar_options o;
    o.vocab = 20;
    o.pairs = 5;
    o.queries = 7;
    const token_batch b = mqar_batch(o, 4, 9);
    ASSERT_EQ(b.length, 17);
    for (index_t s = 0; s < 4; ++s) {
        const std::int32_t* t = &b.tokens[static_cast<std::size_t>(s * 17)];
        const std::int32_t* y = &b.targets[static_cast<std::size_t>(s * 17)];
        for (index_t i = 0; i < 5; ++i) {
            EXPECT_GE(t[2 * i], 1);
            EXPECT_LE(t[2 * i], 9);
            EXPECT_GE(t[2 * i + 1], 10);
            EXPECT_LE(t[2 * i + 1], 19);
            EXPECT_EQ(y[2 * i], -1);
            for (index_t j = 0; j < i; ++j) EXPECT_NE(t[2 * i], t[2 * j]);
        }
        for (index_t q = 10; q < 17; ++q) {
            index_t p = 0;
            while (p < 5 && t[2 * p] != t[q]) ++p;
            ASSERT_LT(p, 5);
            EXPECT_EQ(y[q], t[2 * p + 1]);
        }
    }
    EXPECT_EQ(mqar_batch(o, 4, 9).tokens, b.tokens);  // seeded
    o.pairs = 10;
    expect_invalid([&] { mqar_batch(o, 1, 1); }, {"pairs"});
}

}  // namespace
