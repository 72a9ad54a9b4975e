// attnkit::model::load_decoder / save_decoder (model/checkpoint.hpp) and decoder::prefill_logits:
// the golden Qwen2 (q/k/v biases, tied, BF16) and Llama (untied lm_head, F32) checkpoints of
// tests/golden/make_checkpoint_golden.py give transformers' logits (an independent numpy
// forward); save -> load gives the same parameters and logits bit for bit for every layer kind,
// with and without biases and tie; F16 files load exactly; every malformed file or config is
// rejected naming what is wrong.
#include "attnkit/model/decoder.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/decoder_weights.hpp"
#include "common/errors.hpp"
#include "golden/checkpoint_golden.hpp"

namespace {

namespace fs = std::filesystem;
using namespace attnkit::model;
using attnkit::index_t;
using attnkit_test::expect_invalid;
using attnkit_test::perturb;
using json = nlohmann::json;

const fs::path kGolden = fs::path(__FILE__).parent_path() / "golden";

// A fresh directory under the system's temporary one, removed with the object.
struct temp_dir {
    fs::path path;
    explicit temp_dir(const std::string& name) {
        path = fs::temp_directory_path() /
               ("attnkit_checkpoint_test_" + name + "_" + std::to_string(reinterpret_cast<std::uintptr_t>(this)));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~temp_dir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string str() const { return path.string(); }
};

std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_bytes(const fs::path& p, const std::string& s) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// ---- safetensors by hand, for the malformed files ----

std::string le64(std::uint64_t n) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    return s;
}

// A file's header and each tensor's bytes.
struct st_file {
    json header;
    std::map<std::string, std::string> bytes;
};

st_file read_st(const fs::path& p) {
    const std::string all = read_bytes(p);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(all[static_cast<std::size_t>(i)]);
    st_file f;
    f.header = json::parse(all.substr(8, n));
    for (auto it = f.header.begin(); it != f.header.end(); ++it) {
        if (it.key() == "__metadata__") continue;
        const auto b = it.value()["data_offsets"][0].get<std::size_t>(), e = it.value()["data_offsets"][1].get<std::size_t>();
        f.bytes[it.key()] = all.substr(8 + n + b, e - b);
    }
    return f;
}

// Lays the tensors out one after another (name order), offsets recomputed, header padded.
std::string st_bytes(st_file f) {
    std::string data;
    for (auto& kv : f.bytes) {
        f.header[kv.first]["data_offsets"] = {data.size(), data.size() + kv.second.size()};
        data += kv.second;
    }
    std::string h = f.header.dump();
    h.append((8 - h.size() % 8) % 8, ' ');
    return le64(h.size()) + h + data;
}

// A header and data as given, with the header length field `length`.
std::string raw_bytes(const std::string& header, const std::string& data, std::uint64_t length) {
    return le64(length) + header + data;
}

// ---- models ----

// name -> (shape, values) of every parameter, in walk order.
struct param {
    std::string name;
    std::vector<index_t> shape;
    std::vector<float> values;
};
std::vector<param> parameters(const decoder& m) {
    std::vector<param> out;
    m.for_each_parameter([&](const std::string& name, const auto& t) {
        param p{name, {}, std::vector<float>(t.data(), t.data() + t.size())};
        for (auto e : t.dimensions()) p.shape.push_back(e);
        out.push_back(std::move(p));
    });
    return out;
}

bool same_bits(const tensor2& a, const tensor2& b) {
    return a.dimension(0) == b.dimension(0) && a.dimension(1) == b.dimension(1) &&
           std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(float)) == 0;
}

decoder_config tiny(attention_variant v, const std::string& schedule, bool bias, bool tied) {
    decoder_config c;
    c.vocab = 23;
    c.d_model = 32;
    c.layers = 3;
    c.heads = 4;
    c.heads_kv = 2;
    c.ffn = 40;
    c.max_length = 16;
    c.rope_theta = 500.0f;
    c.norm_eps = 1e-5f;
    c.seed = 9;
    c.variant = v;
    c.schedule = schedule;
    c.attention_bias = bias;
    c.tie_word_embeddings = tied;
    return c;
}

const std::vector<std::int32_t> kPrompt = {3, 17, 4, 22, 9, 0, 12, 5, 8};

// ---- golden checkpoints ----

TEST(CheckpointGolden, LogitsMatchTransformersForward) {
    for (const auto& g : checkpoint_golden::kModels) {
        SCOPED_TRACE(g.dir);
        const std::string dir = (kGolden / g.dir).string();
        const decoder m0 = load_decoder(dir);
        const bool qwen2 = std::string(g.dir) == "checkpoint_qwen2";
        EXPECT_EQ(m0.config().attention_bias, qwen2);
        EXPECT_EQ(m0.config().tie_word_embeddings, qwen2);
        EXPECT_EQ(m0.config().vocab, checkpoint_golden::kVocab);
        EXPECT_EQ(m0.config().d_model, 32);
        EXPECT_EQ(m0.config().heads_kv, 2);
        EXPECT_EQ(m0.config().ffn_width(), 48);
        EXPECT_EQ(m0.config().max_length, 64);

        const std::vector<std::int32_t> tokens(checkpoint_golden::kTokens,
                                               checkpoint_golden::kTokens + checkpoint_golden::kLength);
        decoder m = load_decoder(dir);
        const tensor2 logits = m.prefill_logits(tokens);
        ASSERT_EQ(logits.dimension(0), checkpoint_golden::kLength);
        ASSERT_EQ(logits.dimension(1), checkpoint_golden::kVocab);
        double top = 0.0, err = 0.0;
        for (int i = 0; i < checkpoint_golden::kLength * checkpoint_golden::kVocab; ++i) {
            top = std::max(top, std::fabs(g.logits[i]));
            err = std::max(err, std::fabs(static_cast<double>(logits.data()[i]) - g.logits[i]));
        }
        EXPECT_GT(top, 1.0);
        // Float against float64 through two layers: ~1e-6 of the logits' size. A missing bias,
        // another RoPE pairing or an untransposed projection is off by the logits' own size.
        EXPECT_LE(err, 2e-5 * top) << "largest logit " << top;

        // Every position, decoded one token at a time after a prefill of the first.
        m.prefill({tokens[0]});
        for (int t = 1; t < checkpoint_golden::kLength; ++t) {
            const std::vector<float> step = m.decode_step(tokens[static_cast<std::size_t>(t)]);
            for (int v = 0; v < checkpoint_golden::kVocab; ++v)
                ASSERT_NEAR(step[static_cast<std::size_t>(v)], g.logits[t * checkpoint_golden::kVocab + v], 2e-5 * top)
                    << "position " << t << ", token " << v;
        }

        // On a pool: the same bits.
        attnkit::thread_pool pool(2);
        decoder mp = load_decoder(dir, &pool);
        EXPECT_EQ(mp.config().pool, &pool);
        EXPECT_TRUE(same_bits(mp.prefill_logits(tokens), logits));
    }
}

// The golden files as transformers would have them: tensors in name order, BF16 in one.
TEST(CheckpointGolden, FilesAreAsGenerated) {
    const st_file q = read_st(kGolden / "checkpoint_qwen2" / "model.safetensors");
    EXPECT_EQ(q.header["model.layers.0.self_attn.q_proj.bias"]["dtype"], "BF16");
    EXPECT_EQ(q.header["model.layers.0.self_attn.k_proj.weight"]["shape"], json({16, 32}));
    EXPECT_FALSE(q.header.contains("lm_head.weight"));
    const st_file l = read_st(kGolden / "checkpoint_llama" / "model.safetensors");
    EXPECT_EQ(l.header["lm_head.weight"]["dtype"], "F32");
    EXPECT_EQ(l.header["model.layers.1.mlp.down_proj.weight"]["shape"], json({32, 48}));
    EXPECT_FALSE(l.header.contains("model.layers.0.self_attn.q_proj.bias"));
}

// ---- round trips ----

struct trip_case {
    attention_variant variant;
    const char* schedule;
    bool bias, tied;
};

class CheckpointRoundTrip : public ::testing::TestWithParam<trip_case> {};

TEST_P(CheckpointRoundTrip, SameParametersAndLogitsBitwise) {
    const trip_case tc = GetParam();
    decoder_config c = tiny(tc.variant, tc.schedule, tc.bias, tc.tied);
    if (tc.variant == attention_variant::fixed_seq_qk) c.fixed_sequence = {1, 2, 3, 20};
    decoder m(c);
    perturb(m, 4);
    temp_dir dir(attention_variant_name(tc.variant));
    save_decoder(m, dir.str());
    decoder back = load_decoder(dir.str());

    const decoder_config& b = back.config();
    EXPECT_EQ(b.vocab, c.vocab);
    EXPECT_EQ(b.d_model, c.d_model);
    EXPECT_EQ(b.layers, c.layers);
    EXPECT_EQ(b.heads, c.heads);
    EXPECT_EQ(b.heads_kv, c.heads_kv);
    EXPECT_EQ(b.ffn_width(), c.ffn_width());
    EXPECT_EQ(b.max_length, c.max_length);
    EXPECT_EQ(b.rope_theta, c.rope_theta);
    EXPECT_EQ(b.norm_eps, c.norm_eps);
    EXPECT_EQ(b.seed, c.seed);
    EXPECT_EQ(b.schedule, c.schedule);
    EXPECT_EQ(b.variant, c.variant);
    EXPECT_EQ(b.fixed_sequence, c.fixed_sequence);
    EXPECT_EQ(b.attention_bias, c.attention_bias);
    EXPECT_EQ(b.tie_word_embeddings, c.tie_word_embeddings);
    EXPECT_EQ(back.layer_kinds(), m.layer_kinds());

    const std::vector<param> want = parameters(m), got = parameters(back);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i].name, want[i].name);
        EXPECT_EQ(got[i].shape, want[i].shape) << want[i].name;
        EXPECT_EQ(std::memcmp(got[i].values.data(), want[i].values.data(), want[i].values.size() * sizeof(float)), 0)
            << want[i].name;
    }
    const tensor2 lm = m.prefill_logits(kPrompt), lb = back.prefill_logits(kPrompt);
    EXPECT_TRUE(same_bits(lm, lb));
    EXPECT_EQ(m.decode_step(7), back.decode_step(7));

    // The files: Hugging Face's names and [out, in] projections, F32, the data 8-byte aligned.
    const std::string file = read_bytes(dir.path / "model.safetensors");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(file[static_cast<std::size_t>(i)]);
    EXPECT_EQ(n % 8, 0u);
    const json h = json::parse(file.substr(8, n));
    EXPECT_EQ(h["__metadata__"]["format"], "pt");
    EXPECT_EQ(h["model.embed_tokens.weight"]["shape"], json({23, 32}));
    EXPECT_EQ(h["model.layers.2.mlp.gate_proj.weight"]["shape"], json({40, 32}));
    EXPECT_EQ(h["model.layers.2.mlp.gate_proj.weight"]["dtype"], "F32");
    EXPECT_EQ(h.contains("lm_head.weight"), !tc.tied);
    const json cfg = json::parse(read_bytes(dir.path / "config.json"));
    EXPECT_EQ(cfg["architectures"][0], tc.bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
    EXPECT_EQ(cfg["model_type"], tc.bias ? "qwen2" : "llama");
    EXPECT_EQ(cfg["torch_dtype"], "float32");
    EXPECT_EQ(cfg["rms_norm_eps"], 1e-5);  // the float's shortest decimal
    EXPECT_EQ(cfg["intermediate_size"], 40);
    EXPECT_EQ(cfg["attnkit_variant"], attention_variant_name(tc.variant));

    // Saving over a checkpoint replaces it.
    perturb(m, 5);
    save_decoder(m, dir.str());
    decoder again = load_decoder(dir.str());
    EXPECT_TRUE(same_bits(again.prefill_logits(kPrompt), m.prefill_logits(kPrompt)));
}

const trip_case kTrips[] = {
    {attention_variant::standard, "uniform", false, true},   {attention_variant::standard, "uniform", true, true},
    {attention_variant::standard, "uniform", false, false},  {attention_variant::standard, "uniform", true, false},
    {attention_variant::taylor, "hybrid", true, false},      {attention_variant::self_gating, "odd", true, true},
    {attention_variant::mta, "hybrid", true, false},         {attention_variant::mlp, "first", true, true},
    {attention_variant::embedding_qk, "last", true, false},  {attention_variant::embedding_qk, "uniform", false, true},
    {attention_variant::rnd_emb_qk, "hybrid", true, true},   {attention_variant::fixed_seq_qk, "last", false, false},
};

INSTANTIATE_TEST_SUITE_P(Kinds, CheckpointRoundTrip, ::testing::ValuesIn(kTrips),
                         [](const ::testing::TestParamInfo<trip_case>& i) {
                             return attention_variant_name(i.param.variant) + "_" + i.param.schedule +
                                    (i.param.bias ? "_bias" : "") + (i.param.tied ? "" : "_untied");
                         });

// float -> IEEE half bits for a float that a half holds exactly (normal or subnormal).
std::uint16_t exact_half(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const float a = std::fabs(f);
    if (a == 0.0f) return sign;
    int e = 0;
    std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
    if (e - 1 >= -14)    // normal: 1.f x 2^(e-1)
        return static_cast<std::uint16_t>(sign | ((e - 1 + 15) << 10) |
                                          static_cast<std::uint32_t>(std::ldexp(a, 11 - e) - 1024.0f));
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::ldexp(a, 24)));  // subnormal: k 2^-24
}

// F16 (and BF16) files load exactly: every value representable, subnormals and -0 included.
TEST(CheckpointDtypes, HalfAndBfloat16LoadExactly) {
    decoder m(tiny(attention_variant::standard, "uniform", true, false));
    m.for_each_parameter([&](const std::string&, auto& t) {
        for (index_t i = 0; i < static_cast<index_t>(t.size()); ++i)  // multiples of 2^-10 in [-2, 2): in both
            t.data()[i] = std::round(t.data()[i] * 1024.0f * 20.0f) / 1024.0f;
    });
    float* e = nullptr;
    m.for_each_parameter([&](const std::string& name, auto& t) {
        if (name == "model.embed_tokens.weight") e = t.data();
    });
    e[0] = std::ldexp(1.0f, -24);   // the smallest half subnormal (a normal bfloat16)
    e[1] = -std::ldexp(3.0f, -20);  // a subnormal half
    e[2] = -0.0f;
    e[3] = 65504.0f;  // the largest half
    e[4] = std::ldexp(1.0f, -14);  // the smallest normal half
    m.parameters_changed();
    temp_dir dir("dtypes");
    save_decoder(m, dir.str());
    const st_file f32 = read_st(dir.path / "model.safetensors");
    for (const char* dtype : {"F16", "BF16"}) {
        SCOPED_TRACE(dtype);
        st_file f = f32;
        for (auto& kv : f.bytes) {
            std::string out;
            for (std::size_t i = 0; i < kv.second.size(); i += 4) {
                std::uint32_t u;
                std::memcpy(&u, kv.second.data() + i, 4);  // the test host is little-endian (x86)
                float v;
                std::memcpy(&v, &u, 4);
                const std::uint16_t h = dtype[0] == 'F' ? exact_half(v) : static_cast<std::uint16_t>(u >> 16);
                out += static_cast<char>(h & 0xff);
                out += static_cast<char>(h >> 8);
            }
            kv.second = out;
            f.header[kv.first]["dtype"] = dtype;
        }
        write_bytes(dir.path / "model.safetensors", st_bytes(f));
        decoder back = load_decoder(dir.str());
        const std::vector<param> want = parameters(m), got = parameters(back);
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t i = 0; i < want.size(); ++i) {
            for (std::size_t j = 0; j < want[i].values.size(); ++j) {
                const float w = want[i].values[j];
                std::uint32_t u;
                std::memcpy(&u, &w, 4);
                // bfloat16 keeps float's top 16 bits: what the file holds is w truncated.
                const std::uint32_t kept = dtype[0] == 'F' ? u : (u & 0xffff0000u);
                float expect;
                std::memcpy(&expect, &kept, 4);
                ASSERT_EQ(std::memcmp(&got[i].values[j], &expect, 4), 0)
                    << want[i].name << "[" << j << "]: " << got[i].values[j] << " vs " << expect;
            }
        }
    }
}

// ---- malformed files ----

class CheckpointRejects : public ::testing::Test {
   protected:
    void SetUp() override {
        decoder m(tiny(attention_variant::standard, "uniform", true, true));
        save_decoder(m, dir.str());
        good = read_st(dir.path / "model.safetensors");
        config = json::parse(read_bytes(dir.path / "config.json"));
    }
    void write_st(const std::string& bytes) { write_bytes(dir.path / "model.safetensors", bytes); }
    void write_config(const json& j) { write_bytes(dir.path / "config.json", j.dump()); }
    void expect_rejected(std::initializer_list<std::string> needles) {
        expect_invalid([&] { load_decoder(dir.str()); }, needles);
    }

    temp_dir dir{"rejects"};
    st_file good;
    json config;
};

const std::string kQ0 = "model.layers.0.self_attn.q_proj.weight";
const std::string kK1 = "model.layers.1.self_attn.k_proj.weight";

TEST_F(CheckpointRejects, MissingTensor) {
    st_file f = good;
    f.header.erase(kK1);
    f.bytes.erase(kK1);
    write_st(st_bytes(f));
    expect_rejected({"model.safetensors", "tensor \"" + kK1 + "\" missing"});
}

TEST_F(CheckpointRejects, ExtraTensor) {
    st_file f = good;
    f.header["model.layers.0.self_attn.rotary_emb.inv_freq"] = {{"dtype", "F32"}, {"shape", {4}}};
    f.bytes["model.layers.0.self_attn.rotary_emb.inv_freq"] = std::string(16, '\0');
    write_st(st_bytes(f));
    expect_rejected({"rotary_emb.inv_freq", "not a parameter of this config"});
    // lm_head.weight in a tied checkpoint: named as such.
    f = good;
    f.header["lm_head.weight"] = {{"dtype", "F32"}, {"shape", {23, 32}}};
    f.bytes["lm_head.weight"] = std::string(23 * 32 * 4, '\0');
    write_st(st_bytes(f));
    expect_rejected({"lm_head.weight", "tie_word_embeddings is true"});
    // Biases in a checkpoint whose config has none.
    json c = config;
    c["model_type"] = "llama";
    c["attention_bias"] = false;
    write_st(st_bytes(good));
    write_config(c);
    expect_rejected({"_proj.bias", "not a parameter", "no biases"});
}

TEST_F(CheckpointRejects, Misshapen) {
    st_file f = good;
    f.header[kK1]["shape"] = {32, 16};  // attnkit's [in, out], not Hugging Face's [out, in]
    write_st(st_bytes(f));
    expect_rejected({kK1, "shape [32, 16]", "expected [16, 32]", "[out, in]"});
    f = good;
    f.header["model.norm.weight"]["shape"] = {2, 16};  // the right size, the wrong rank
    write_st(st_bytes(f));
    expect_rejected({"model.norm.weight", "shape [2, 16]", "expected [32]"});
}

TEST_F(CheckpointRejects, UnknownDtype) {
    for (const char* dtype : {"F64", "I8", "Q4_K", "f32"}) {
        st_file f = good;
        f.header[kQ0]["dtype"] = dtype;
        write_st(st_bytes(f));
        expect_rejected({kQ0, std::string("dtype \"") + dtype + "\"", "not supported"});
    }
    st_file f = good;
    f.header[kQ0]["dtype"] = 4;
    write_st(st_bytes(f));
    expect_rejected({kQ0, "dtype must be a string"});
}

TEST_F(CheckpointRejects, TruncatedData) {
    const std::string full = st_bytes(good);
    for (std::size_t cut : {std::size_t(1), std::size_t(4), std::size_t(1000)}) {
        write_st(full.substr(0, full.size() - cut));
        expect_rejected({"model.safetensors", "truncated", "holds only"});
    }
    write_st(full.substr(0, 5));
    expect_rejected({"fewer than the 8"});
    write_st(full + "trailing");
    expect_rejected({"after the last tensor", "belong to no tensor"});
}

TEST_F(CheckpointRejects, HeaderLengthPastTheFile) {
    const std::string full = st_bytes(good);
    std::string bad = full;
    const std::string len = le64(full.size());
    std::copy(len.begin(), len.end(), bad.begin());
    write_st(bad);
    expect_rejected({"header length " + std::to_string(full.size()), "past the end of the file"});
    std::copy_n(le64(~std::uint64_t(0)).begin(), 8, bad.begin());  // 2^64 - 1: no wrap-around
    write_st(bad);
    expect_rejected({"past the end of the file"});
}

TEST_F(CheckpointRejects, BadJson) {
    for (const std::string header : {"{\"a\": [1, 2", "not json", "[1, 2, 3]", "{\"x\": 1}  x"}) {
        SCOPED_TRACE(header);
        write_st(raw_bytes(header, "", header.size()));
        expect_rejected({"model.safetensors", header[0] == '[' ? "not a JSON object" : "not valid JSON"});
    }
    // A duplicate name (a JSON reader would keep one and lose the other's bytes).
    const std::string h = "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    write_st(raw_bytes(h, std::string(8, '\0'), h.size()));
    expect_rejected({"model.norm.weight", "twice"});
    // Entries of the wrong form.
    st_file f = good;
    f.header[kQ0].erase("data_offsets");
    write_st(raw_bytes(f.header.dump(), "", f.header.dump().size()));
    expect_rejected({kQ0, "expected {\"dtype\", \"shape\", \"data_offsets\"}"});
    f = good;
    f.header["__metadata__"] = {{"format", 1}};
    write_st(st_bytes(f));
    expect_rejected({"__metadata__", "object of strings"});
}

TEST_F(CheckpointRejects, OffsetsOverlappingOrWrong) {
    const std::string full = st_bytes(good);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(full[static_cast<std::size_t>(i)]);
    const json h = json::parse(full.substr(8, n));
    const std::string data = full.substr(8 + n);
    // Tensors in name order: the embedding, then layer 0's input_layernorm [32] (128 bytes).
    const std::string a = "model.embed_tokens.weight", b = "model.layers.0.input_layernorm.weight";
    ASSERT_EQ(h[a]["data_offsets"][1], h[b]["data_offsets"][0]);
    const auto write_header = [&](const json& j) {
        std::string t = j.dump();
        t.append((8 - t.size() % 8) % 8, ' ');
        write_st(raw_bytes(t, data, t.size()));
    };
    json o = h;
    const std::uint64_t a0 = h[a]["data_offsets"][0];
    o[b]["data_offsets"] = {a0 + 8, a0 + 8 + 128};  // inside the embedding's bytes
    write_header(o);
    expect_rejected({"overlap", b, a});
    o = h;
    o[b]["data_offsets"] = {h[b]["data_offsets"][0], h[b]["data_offsets"][0].get<std::uint64_t>() + 64};
    write_header(o);
    expect_rejected({b, "hold 64 bytes", "needs 128"});
    o = h;
    o[b]["data_offsets"] = {400, 300};
    write_header(o);
    expect_rejected({b, "end before they begin"});
    o = h;
    o[b]["data_offsets"] = {-1, 127};
    write_header(o);
    expect_rejected({b, "data_offsets must be [begin, end]"});
    o = h;
    o[b]["shape"] = {std::uint64_t(1) << 62, 4};  // bytes past 2^64
    write_header(o);
    expect_rejected({b, "more than 2^64"});
    // Past the end of the data.
    o = h;
    const std::uint64_t end = data.size();
    o[b]["data_offsets"] = {end, end + 128};
    write_header(o);
    expect_rejected({"model.safetensors", "belong to no tensor"});
}

TEST_F(CheckpointRejects, MissingFiles) {
    fs::remove(dir.path / "model.safetensors");
    expect_rejected({"model.safetensors", "cannot open"});
    write_bytes(dir.path / "model.safetensors.index.json", "{}");
    expect_rejected({"sharded"});
    fs::remove(dir.path / "config.json");
    expect_rejected({"config.json", "cannot open"});
    expect_invalid([&] { load_decoder((dir.path / "nowhere").string()); }, {"nowhere", "cannot open"});
}

TEST_F(CheckpointRejects, ConfigMissingKeysOrInconsistent) {
    for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                            "vocab_size", "model_type"}) {
        json c = config;
        c.erase(key);
        write_config(c);
        expect_rejected({"config.json", std::string("\"") + key + "\" missing"});
    }
    json c = config;
    c["hidden_size"] = 30;
    write_config(c);
    expect_rejected({"config.json", "hidden_size = 30 is not a multiple of num_attention_heads = 4"});
    c = config;
    c["num_key_value_heads"] = 3;
    write_config(c);
    expect_rejected({"num_attention_heads = 4 is not a multiple of num_key_value_heads = 3"});
    c = config;
    c["vocab_size"] = "23";
    write_config(c);
    expect_rejected({"\"vocab_size\" must be an integer >= 1", "\"23\""});
    c = config;
    c["num_hidden_layers"] = 0;
    write_config(c);
    expect_rejected({"\"num_hidden_layers\" must be an integer >= 1"});
    c = config;
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
    write_config(c);
    expect_rejected({"rope_scaling", "llama3", "not supported"});
    c = config;
    c["head_dim"] = 16;
    write_config(c);
    expect_rejected({"head_dim = 16", "hidden_size / num_attention_heads = 8"});
    c = config;
    c["model_type"] = "mistral";
    write_config(c);
    expect_rejected({"model_type", "mistral"});
    c = config;
    c["hidden_act"] = "gelu";
    write_config(c);
    expect_rejected({"hidden_act", "gelu"});
    c = config;
    c["rope_theta"] = 0.5;
    write_config(c);
    expect_rejected({"config.json", "rope_theta"});
    c = config;
    c["attnkit_variant"] = "sideways";
    write_config(c);
    expect_rejected({"attnkit_variant", "sideways"});
    c = config;
    c["attnkit_schedule"] = "sideways";
    write_config(c);
    expect_rejected({"config.json", "sideways"});
    c = config;
    c["tie_word_embeddings"] = "yes";
    write_config(c);
    expect_rejected({"tie_word_embeddings", "true or false"});
    write_bytes(dir.path / "config.json", "{\"hidden_size\": ");
    expect_rejected({"config.json", "not valid JSON"});
    // A good config with another shape than the weights: the tensors say so.
    c = config;
    c["intermediate_size"] = 48;
    write_config(c);
    expect_rejected({"model.layers.0.mlp.gate_proj.weight", "shape [40, 32]", "expected [48, 32]"});
}

// transformers' defaults for the keys a config may leave out.
TEST_F(CheckpointRejects, ConfigDefaults) {
    json c = config;
    for (const char* key : {"num_key_value_heads", "rope_theta", "rms_norm_eps", "max_position_embeddings",
                            "tie_word_embeddings", "attnkit_variant", "attnkit_schedule", "attnkit_seed",
                            "attnkit_fixed_sequence", "rope_scaling", "attention_bias"})
        c.erase(key);
    c["num_key_value_heads"] = nullptr;  // transformers writes null for "as many as the heads"
    write_config(c);
    // Without num_key_value_heads: 4 KV heads, so k_proj's shape no longer fits; with tie false
    // lm_head is missing. Either is reported; give the file what the defaults need.
    st_file f = good;
    for (int l = 0; l < 3; ++l)
        for (const char* p : {"k_proj", "v_proj"}) {
            const std::string w = "model.layers." + std::to_string(l) + ".self_attn." + p;
            f.header[w + ".weight"]["shape"] = {32, 32};
            f.bytes[w + ".weight"] = std::string(32 * 32 * 4, '\0');
            f.header[w + ".bias"]["shape"] = {32};
            f.bytes[w + ".bias"] = std::string(32 * 4, '\0');
        }
    f.header["lm_head.weight"] = {{"dtype", "F32"}, {"shape", {23, 32}}};
    f.bytes["lm_head.weight"] = std::string(23 * 32 * 4, '\0');
    write_st(st_bytes(f));
    const decoder m = load_decoder(dir.str());
    const decoder_config& d = m.config();
    EXPECT_EQ(d.heads_kv, 4);
    EXPECT_EQ(d.rope_theta, 10000.0f);
    EXPECT_EQ(d.norm_eps, 1e-6f);
    EXPECT_EQ(d.max_length, 32768);  // qwen2's default
    EXPECT_FALSE(d.tie_word_embeddings);
    EXPECT_TRUE(d.attention_bias);  // qwen2: always
    EXPECT_EQ(d.variant, attention_variant::standard);
    EXPECT_EQ(d.schedule, "uniform");
    EXPECT_EQ(d.seed, 1u);
}

TEST(CheckpointSave, RejectsAnUnwritableDirectory) {
    temp_dir dir("save");
    write_bytes(dir.path / "file", "x");
    decoder m(tiny(attention_variant::standard, "uniform", false, true));
    expect_invalid([&] { save_decoder(m, (dir.path / "file").string()); }, {"save_decoder", "file", "cannot"});
    expect_invalid([&] { save_decoder(m, (dir.path / "file" / "sub").string()); }, {"save_decoder", "cannot"});
}

// prefill_logits: every row, the last one prefill's; decode continues after it.
TEST(PrefillLogits, EveryPositionAndContinues) {
    decoder m(tiny(attention_variant::standard, "uniform", true, false));
    perturb(m, 3);
    const tensor2 all = m.prefill_logits(kPrompt);
    const std::vector<float> next = m.decode_step(2);
    ASSERT_EQ(all.dimension(0), static_cast<index_t>(kPrompt.size()));
    for (std::size_t t = 1; t <= kPrompt.size(); ++t) {
        const std::vector<float> row = m.prefill(std::vector<std::int32_t>(kPrompt.begin(), kPrompt.begin() + t));
        float top = 0.0f;
        for (float x : row) top = std::max(top, std::fabs(x));
        for (index_t v = 0; v < 23; ++v)
            EXPECT_NEAR(all(static_cast<index_t>(t - 1), v), row[static_cast<std::size_t>(v)], 1e-5f * top);
    }
    m.prefill(kPrompt);
    EXPECT_EQ(m.decode_step(2), next);
    EXPECT_EQ(m.length(), static_cast<index_t>(kPrompt.size()) + 1);
    expect_invalid([&] { m.prefill_logits({}); }, "no tokens");
    expect_invalid([&] { m.prefill_logits({23}); }, "token 23");
}

}  // namespace
