// attnkit::model::decoder: for every variant, the last row of a prefill equals a decode step
// after a prefill of one token fewer; thread counts give identical tokens; configs and inputs
// that cannot work are rejected without a state change.
#include "attnkit/model/decoder.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/errors.hpp"

namespace {

using namespace attnkit::model;
using attnkit::index_t;
using attnkit_test::expect_invalid;

decoder_config small_config(attention_variant v, const std::string& schedule) {
    decoder_config c;
    c.vocab = 97;
    c.d_model = 64;
    c.layers = 4;
    c.heads = 4;
    c.heads_kv = 2;
    c.max_length = 48;
    c.variant = v;
    c.schedule = schedule;
    c.seed = 7;
    return c;
}

std::vector<std::int32_t> prompt(index_t n) {
    std::vector<std::int32_t> t;
    for (index_t i = 0; i < n; ++i) t.push_back(static_cast<std::int32_t>((i * 37 + 11) % 97));
    return t;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
    return m;
}

class DecoderVariants : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderVariants, DecodeStepEqualsLastPrefillRow) {
    const attention_variant v = parse_attention_variant(GetParam());
    for (const char* schedule : {"uniform", "hybrid"}) {
        SCOPED_TRACE(schedule);
        decoder full(small_config(v, schedule));
        const std::vector<std::int32_t> p = prompt(21);
        const std::vector<float> want = full.prefill(p);
        decoder inc(small_config(v, schedule));
        inc.prefill(std::vector<std::int32_t>(p.begin(), p.end() - 1));
        const std::vector<float> got = inc.decode_step(p.back());
        ASSERT_EQ(got.size(), want.size());
        double scale = 0;
        for (float x : want) scale = std::max(scale, double(std::fabs(x)));
        // Different but equivalent kernels (tile vs row kernel, full call vs state step):
        // float rounding of a 4-layer model, relative to the logits' magnitude.
        EXPECT_LE(max_abs_diff(got, want), 2e-4 * (1.0 + scale)) << GetParam();
        EXPECT_EQ(inc.length(), 21);
    }
}

TEST_P(DecoderVariants, ThreadCountsGiveIdenticalTokens) {
    const attention_variant v = parse_attention_variant(GetParam());
    std::vector<std::vector<float>> runs;
    for (int threads : {1, 2, 3}) {
        attnkit::thread_pool pool(static_cast<std::size_t>(threads));
        decoder_config c = small_config(v, "middle");
        c.pool = threads > 1 ? &pool : nullptr;
        decoder m(c);
        std::vector<float> logits = m.prefill(prompt(9));
        for (int s = 0; s < 4; ++s) {
            const auto next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
            logits = m.decode_step(next);
        }
        runs.push_back(logits);
    }
    for (std::size_t r = 1; r < runs.size(); ++r)
        for (std::size_t i = 0; i < runs[0].size(); ++i) ASSERT_EQ(runs[r][i], runs[0][i]) << "run " << r << " logit " << i;
}

INSTANTIATE_TEST_SUITE_P(Variants, DecoderVariants,
                         ::testing::Values("standard", "taylor", "self_gating", "rnd_emb_qk", "fixed_seq_qk",
                                           "embedding_qk", "mlp", "mta"),
                         [](const auto& info) { return info.param; });

TEST(Decoder, LayerKindsFollowTheSchedule) {
    decoder m(small_config(attention_variant::taylor, "bilateral"));
    const std::vector<attention_variant> want = {attention_variant::standard, attention_variant::taylor,
                                                 attention_variant::taylor, attention_variant::standard};
    EXPECT_EQ(m.layer_kinds(), want);
}

TEST(Decoder, RejectsBadConfigsAndInputs) {
    EXPECT_THROW(parse_attention_variant("linear_rnn"), std::invalid_argument);
    decoder_config c = small_config(attention_variant::standard, "no_such_schedule");
    EXPECT_THROW(decoder{c}, std::invalid_argument);
    c = small_config(attention_variant::standard, "uniform");
    c.d_model = 66;  // not a multiple of 4 heads
    EXPECT_THROW(decoder{c}, std::invalid_argument);
    c = small_config(attention_variant::standard, "uniform");
    c.heads_kv = 3;
    EXPECT_THROW(decoder{c}, std::invalid_argument);
    c = small_config(attention_variant::standard, "uniform");
    c.d_model = 12;  // head dim 3: odd, no rotate-half RoPE
    EXPECT_THROW(decoder{c}, std::invalid_argument);

    decoder m(small_config(attention_variant::standard, "uniform"));
    m.prefill(prompt(47));
    const std::vector<float> at47 = m.decode_step(5);  // position 47: the last one
    EXPECT_THROW(m.decode_step(5), std::invalid_argument);  // beyond max_length
    EXPECT_EQ(m.length(), 48);
    EXPECT_THROW(m.prefill(prompt(49)), std::invalid_argument);
    EXPECT_EQ(m.length(), 48);  // nothing changed
    EXPECT_THROW(m.prefill({1, 2, 97}), std::invalid_argument);  // token outside the vocabulary
    EXPECT_THROW(m.prefill({}), std::invalid_argument);
    EXPECT_EQ(m.length(), 48);
}

// Bad configurations the check used to pass are std::invalid_argument naming the field, before
// anything is allocated: sizes whose products overflow int64 (then a segfault), an
// attention_variant outside the enum (then uninitialised reads), a max_length past what one
// attention call takes (then bad_alloc).
TEST(Decoder, RejectsSizesWhoseProductsOverflow) {
    decoder_config c = small_config(attention_variant::standard, "uniform");
    c.vocab = index_t(1) << 33;
    c.d_model = index_t(1) << 31;
    c.heads = c.heads_kv = 1;
    expect_invalid([&] { decoder{c}; }, {"attnkit::model::decoder:", "vocab * d_model"});
    c = small_config(attention_variant::standard, "uniform");
    c.ffn = index_t(1) << 60;
    expect_invalid([&] { decoder{c}; }, {"attnkit::model::decoder:", "d_model * ffn"});
    c = small_config(attention_variant::embedding_qk, "uniform");
    c.layers = index_t(1) << 24;
    c.d_model = index_t(1) << 20;
    expect_invalid([&] { decoder{c}; }, {"attnkit::model::decoder:", "the embedding_qk weights"});
}

TEST(Decoder, RejectsAnUnknownVariant) {
    decoder_config c = small_config(attention_variant::standard, "uniform");
    c.variant = static_cast<attention_variant>(99);
    expect_invalid([&] { decoder{c}; }, {"attnkit::model::decoder:", "variant", "99"});
}

TEST(Decoder, RejectsMaxLengthPastOneCall) {
    decoder_config c = small_config(attention_variant::standard, "uniform");
    c.max_length = index_t(1) << 40;
    expect_invalid([&] { decoder{c}; }, {"attnkit::model::decoder:", "max_length", "1099511627776"});
}

TEST(Decoder, ProfileCountsKernelsAndGemms) {
    decoder m(small_config(attention_variant::standard, "uniform"));
    m.prefill(prompt(32));
    const decoder_profile& p = m.profile();
    EXPECT_GT(p.kernels, 0.0);
    EXPECT_GT(p.gemm, 0.0);
    EXPECT_GE(p.other, 0.0);
}

}  // namespace

namespace {

TEST(Decoder, AttentionWeightsFeedTheDiagnostics) {
    for (const char* var : {"standard", "taylor", "self_gating", "rnd_emb_qk", "fixed_seq_qk", "embedding_qk", "mta", "mlp"}) {
        SCOPED_TRACE(var);
        decoder m(small_config(parse_attention_variant(var), "bilateral"));
        const auto p = prompt(12);
        const auto w = m.attention_weights(p);
        ASSERT_EQ(w.size(), 4u);
        for (std::size_t l = 0; l < w.size(); ++l) {
            if (m.layer_kinds()[l] == attention_variant::mlp) {
                EXPECT_EQ(w[l].size(), 0);
                continue;
            }
            ASSERT_EQ(w[l].dimension(0), 4);
            ASSERT_EQ(w[l].dimension(1), 12);
            // Causal: nothing above the diagonal. Softmax-normalised kinds: rows sum to 1.
            for (index_t h = 0; h < 4; ++h)
                for (index_t i = 0; i < 12; ++i) {
                    double sum = 0;
                    for (index_t j = 0; j < 12; ++j) {
                        if (j > i) {
                            EXPECT_EQ(w[l](h, i, j), 0.0);
                        }
                        sum += w[l](h, i, j);
                    }
                    if (m.layer_kinds()[l] != attention_variant::mta) {
                        EXPECT_NEAR(sum, 1.0, 1e-5) << l << " " << h << " " << i;
                    }
                }
            const attnkit::attention_diagnostics d = attnkit::diagnose_attention(w[l]);
            EXPECT_TRUE(std::isfinite(d.mean_entropy));
            EXPECT_GT(d.mean_local_focus[0], 0.0);
        }
        // The capture leaves the model prefilled with the sequence.
        EXPECT_EQ(m.length(), 12);
    }
}

// Self-gating's query is SiLU(W_Q n) (Xue et al.), and RoPE rotates q_j and k_j of the same
// position by the same angle, so the gate <RoPE(SiLU(W_Q n_j)), RoPE(k_j)> = <SiLU(W_Q n_j), k_j>
// does not depend on RoPE at all: an all-self-gating model must give the same weights for any
// rope_theta. (SiLU applied after RoPE would make the gate depend on the position's angle.)
TEST(Decoder, SelfGatingQueryIsSiluBeforeRope) {
    decoder_config a = small_config(attention_variant::self_gating, "uniform"), b = a;
    a.rope_theta = 1e4f;
    b.rope_theta = 1e6f;
    decoder ma(a), mb(b);
    const auto p = prompt(30);
    const auto wa = ma.attention_weights(p), wb = mb.attention_weights(p);
    ASSERT_EQ(wa.size(), wb.size());
    for (std::size_t l = 0; l < wa.size(); ++l) {
        ASSERT_EQ(wa[l].size(), wb[l].size());
        double diff = 0;
        for (index_t i = 0; i < wa[l].size(); ++i) diff = std::max(diff, std::fabs(wa[l].data()[i] - wb[l].data()[i]));
        EXPECT_LE(diff, 1e-6) << "layer " << l;
    }
}

}  // namespace
