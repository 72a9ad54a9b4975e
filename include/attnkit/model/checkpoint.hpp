// Checkpoints of the decoder template (model/decoder.hpp) in Hugging Face's format: a directory
// with config.json (the Llama / Qwen2 keys) and model.safetensors. Included by model/decoder.hpp.
//
//   attnkit::model::save_decoder(model, "ckpt");                      // writes both files
//   attnkit::model::decoder m = attnkit::model::load_decoder("ckpt", &pool);
//   attnkit::model::tensor2 logits = m.prefill_logits(tokens);        // [L, vocab]
//
// A Qwen2 or Llama checkpoint of transformers loads as it is (one model.safetensors; sharded
// checkpoints are not read), and what save_decoder writes loads in transformers (standard layers;
// a variant's own weights, token_mlp.* and self_attn.mta.*, have no transformers module).
//
// config.json. Read: model_type ("llama" or "qwen2"), hidden_size, num_hidden_layers,
// num_attention_heads, intermediate_size, vocab_size (required); num_key_value_heads
// (default num_attention_heads), rope_theta (10000), rms_norm_eps (1e-6),
// max_position_embeddings (llama 2048, qwen2 32768: decoder_config::max_length, which sizes the
// caches), tie_word_embeddings (false), attention_bias (llama, false; qwen2 always has q/k/v
// biases) -- transformers' defaults where a key is missing. Rejected: rope_scaling other than
// null (the decoder rotates with rope_theta only), head_dim other than hidden_size /
// num_attention_heads, hidden_act other than "silu", mlp_bias true, use_sliding_window true.
// attnkit's own keys: attnkit_variant (attention_variant_names(), default "standard"),
// attnkit_schedule (hybrid_schedule_names(), default "uniform"), attnkit_seed (default 1) and
// attnkit_fixed_sequence (default []): the seed and the sequence make the fixed stream of
// rnd_emb_qk / fixed_seq_qk layers, which is not stored. Other keys are ignored.
// Written: those keys, "architectures" ["Qwen2ForCausalLM"] (attention_bias) or
// ["LlamaForCausalLM"], model_type "qwen2" or "llama", hidden_act "silu", rope_scaling null,
// torch_dtype "float32".
//
// model.safetensors: an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__": {string:
// string}}, then the data, each tensor's row-major little-endian bytes at [begin, end) of it.
// Names are decoder::for_each_parameter's; shapes Hugging Face's: every *_proj.weight is [out,
// in] in the file (attnkit stores [in, out]: transposed on load and save), the embedding and
// lm_head.weight [vocab, hidden], biases and norms [n], self_attn.mta.* as attnkit stores them.
// Read dtypes F32, BF16 and F16 (converted to float exactly); written F32, the header padded
// with spaces to a multiple of 8 bytes, "__metadata__" {"format": "pt"} as transformers expects.
//
// Every check runs before a tensor is read, and load_decoder returns a decoder only when all of
// it loaded (no half-loaded model). std::invalid_argument naming the file and, where one is at
// fault, the tensor: a config key missing, of the wrong type or inconsistent (hidden_size not a
// multiple of num_attention_heads, anything check_decoder_config rejects); a file shorter than
// its header length or its tensors' data; a header that is not JSON, not an object or has a
// duplicate name; a tensor missing, not a parameter of the config (extra), of the wrong shape,
// of another dtype, with data_offsets that do not hold shape x dtype bytes, overlap another's,
// or leave bytes of the data covered by no tensor (the reference implementation's rules).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnkit/model/decoder.hpp"

namespace attnkit {
namespace model {

namespace checkpoint_impl {

using json = nlohmann::json;

[[noreturn]] inline void fail(const std::string& where, const std::string& what) {
    throw std::invalid_argument("attnkit::model::load_decoder: " + where + ": " + what);
}

inline std::string shape_string(const std::vector<std::uint64_t>& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

// Attnkit stores every *_proj.weight [in, out] (one row-major GEMM of the activations);
// Hugging Face stores it [out, in] (torch.nn.Linear's weight).
inline bool transposed_in_file(const std::string& name) {
    const std::string tail = "_proj.weight";
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

// A parameter's shape as the file holds it.
template <class T>
std::vector<std::uint64_t> file_shape(const std::string& name, const T& t) {
    std::vector<std::uint64_t> s;
    for (auto e : t.dimensions()) s.push_back(static_cast<std::uint64_t>(e));
    if (transposed_in_file(name)) std::swap(s[0], s[1]);
    return s;
}

// A parameter as a stored [rows, cols] matrix whose transpose the file holds: an *_proj.weight
// [in, out]; any other tensor as [1, size] (its transpose, [size, 1], holds the same order).
template <class T>
std::pair<index_t, index_t> stored_matrix(const std::string& name, const T& t) {
    if constexpr (T::NumDimensions == 2)
        if (transposed_in_file(name)) return {t.dimension(0), t.dimension(1)};
    return {1, static_cast<index_t>(t.size())};
}

struct dtype_info {
    const char* name;
    std::uint64_t bytes;
};
inline const dtype_info* find_dtype(const std::string& name) {
    static const dtype_info known[] = {{"F32", 4}, {"BF16", 2}, {"F16", 2}};
    for (const auto& d : known)
        if (name == d.name) return &d;
    return nullptr;
}

// Little-endian bytes, whatever the host's order.
inline std::uint32_t le32(const unsigned char* p) {
    return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24;
}
inline std::uint16_t le16(const unsigned char* p) { return static_cast<std::uint16_t>(p[0] | p[1] << 8); }
inline float bits_float(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
// IEEE half -> float, exactly (every half is a float): subnormals normalised, inf and NaN kept.
inline float half_to_float(std::uint16_t h) {
    const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return bits_float(sign);
        exp = 1;
        while (!(man & 0x400u)) {  // shift the subnormal's leading 1 into the implicit bit
            man <<= 1;
            --exp;
        }
        man &= 0x3ffu;
    }
    return bits_float(sign | ((exp + 112u) << 23) | (man << 13));  // rebias 15 -> 127
}
inline float element(const unsigned char* p, const dtype_info& dt) {
    if (dt.bytes == 4) return bits_float(le32(p));
    if (dt.name[0] == 'B') return bits_float(std::uint32_t(le16(p)) << 16);  // bf16: float's top half
    return half_to_float(le16(p));
}

// The shortest decimal that reads back as f, as a JSON number (1e-06 rather than
// 9.999999974752427e-07, the float's exact double).
inline json float_number(float f) {
    char buf[32];
    for (int digits = 1; digits <= 9; ++digits) {
        std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
        if (std::strtof(buf, nullptr) == f) break;
    }
    return json(std::strtod(buf, nullptr));
}

inline std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(path, "cannot open the file");
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return s;
}

// config.json -> decoder_config (pool left unset).
inline decoder_config config_from_json(const std::string& text, const std::string& path) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded()) fail(path, "not valid JSON");
    if (!j.is_object()) fail(path, "not a JSON object");
    const auto has = [&](const char* key) { return j.contains(key) && !j.at(key).is_null(); };
    const auto bad = [&](const char* key, const std::string& want) {
        fail(path, std::string("\"") + key + "\" must be " + want + ", got " + j.at(key).dump());
    };
    const auto positive = [&](const char* key, std::int64_t def, bool required) -> index_t {
        if (!has(key)) {
            if (required) fail(path, std::string("\"") + key + "\" missing");
            return def;
        }
        const json& v = j.at(key);
        if (!v.is_number_integer() || v.get<std::int64_t>() < 1) bad(key, "an integer >= 1");
        return v.get<std::int64_t>();
    };
    const auto number = [&](const char* key, double def) -> double {
        if (!has(key)) return def;
        if (!j.at(key).is_number()) bad(key, "a number");
        return j.at(key).get<double>();
    };
    const auto boolean = [&](const char* key, bool def) -> bool {
        if (!has(key)) return def;
        if (!j.at(key).is_boolean()) bad(key, "true or false");
        return j.at(key).get<bool>();
    };
    const auto text_of = [&](const char* key, const std::string& def) -> std::string {
        if (!has(key)) return def;
        if (!j.at(key).is_string()) bad(key, "a string");
        return j.at(key).get<std::string>();
    };

    if (!has("model_type")) fail(path, "\"model_type\" missing (\"llama\" or \"qwen2\")");
    const std::string type = text_of("model_type", "");
    if (type != "llama" && type != "qwen2")
        fail(path, "\"model_type\" must be \"llama\" or \"qwen2\", got \"" + type + "\"");
    const bool qwen2 = type == "qwen2";
    decoder_config c;
    c.d_model = positive("hidden_size", 0, true);
    c.layers = positive("num_hidden_layers", 0, true);
    c.heads = positive("num_attention_heads", 0, true);
    c.ffn = positive("intermediate_size", 0, true);
    c.vocab = positive("vocab_size", 0, true);
    c.heads_kv = positive("num_key_value_heads", c.heads, false);
    c.max_length = positive("max_position_embeddings", qwen2 ? 32768 : 2048, false);
    const double theta = number("rope_theta", 10000.0), eps = number("rms_norm_eps", 1e-6);
    c.rope_theta = static_cast<float>(theta);
    c.norm_eps = static_cast<float>(eps);
    c.tie_word_embeddings = boolean("tie_word_embeddings", false);
    // Qwen2's attention always has q/k/v biases (transformers reads no key for them).
    c.attention_bias = qwen2 || boolean("attention_bias", false);

    if (c.d_model % c.heads != 0)
        fail(path, "hidden_size = " + std::to_string(c.d_model) + " is not a multiple of num_attention_heads = " +
                       std::to_string(c.heads));
    if (c.heads % c.heads_kv != 0)
        fail(path, "num_attention_heads = " + std::to_string(c.heads) + " is not a multiple of num_key_value_heads = " +
                       std::to_string(c.heads_kv));
    if (has("head_dim") && positive("head_dim", 0, false) != c.d_model / c.heads)
        fail(path, "head_dim = " + j.at("head_dim").dump() + " differs from hidden_size / num_attention_heads = " +
                       std::to_string(c.d_model / c.heads) + " (the decoder's heads span hidden_size)");
    if (has("rope_scaling"))
        fail(path, "rope_scaling = " + j.at("rope_scaling").dump() +
                       " is not supported (only null: the decoder rotates with rope_theta alone)");
    if (text_of("hidden_act", "silu") != "silu")
        fail(path, "hidden_act = \"" + text_of("hidden_act", "") + "\" is not supported (only \"silu\")");
    if (boolean("mlp_bias", false)) fail(path, "mlp_bias = true is not supported (the MLPs have no biases)");
    if (boolean("use_sliding_window", false))
        fail(path, "use_sliding_window = true is not supported (every layer attends to every earlier position)");

    const std::string variant = text_of("attnkit_variant", "standard");
    try {
        c.variant = parse_attention_variant(variant);
    } catch (const std::invalid_argument& e) {
        fail(path, std::string("attnkit_variant: ") + e.what());
    }
    c.schedule = text_of("attnkit_schedule", "uniform");
    if (has("attnkit_seed")) {
        if (!j.at("attnkit_seed").is_number_unsigned()) bad("attnkit_seed", "an integer >= 0");
        c.seed = j.at("attnkit_seed").get<std::uint64_t>();
    }
    if (has("attnkit_fixed_sequence")) {
        const json& s = j.at("attnkit_fixed_sequence");
        if (!s.is_array()) bad("attnkit_fixed_sequence", "an array of token ids");
        for (const json& t : s) {
            if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() > INT32_MAX)
                bad("attnkit_fixed_sequence", "an array of token ids");
            c.fixed_sequence.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
        }
    }
    try {
        check_decoder_config(c);
        hybrid_schedule(c.schedule, c.layers);
    } catch (const std::invalid_argument& e) {
        fail(path, e.what());
    }
    return c;
}

inline json config_to_json(const decoder_config& c) {
    json j;
    j["architectures"] = json::array({c.attention_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"});
    j["model_type"] = c.attention_bias ? "qwen2" : "llama";
    j["hidden_size"] = c.d_model;
    j["num_hidden_layers"] = c.layers;
    j["num_attention_heads"] = c.heads;
    j["num_key_value_heads"] = c.heads_kv;
    j["intermediate_size"] = c.ffn_width();
    j["vocab_size"] = c.vocab;
    j["max_position_embeddings"] = c.max_length;
    j["rope_theta"] = float_number(c.rope_theta);
    j["rms_norm_eps"] = float_number(c.norm_eps);
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["attention_bias"] = c.attention_bias;
    j["hidden_act"] = "silu";
    j["rope_scaling"] = nullptr;
    j["torch_dtype"] = "float32";
    j["attnkit_variant"] = attention_variant_name(c.variant);
    j["attnkit_schedule"] = c.schedule;
    j["attnkit_seed"] = c.seed;
    j["attnkit_fixed_sequence"] = c.fixed_sequence;
    return j;
}

// One tensor's entry of a safetensors header.
struct entry {
    std::string name;
    const dtype_info* dtype;
    std::vector<std::uint64_t> shape;
    std::uint64_t begin, end;
};

// Parses and checks a safetensors header against the data's length; the entries sorted by
// their offsets.
inline std::vector<entry> parse_header(const std::string& text, std::uint64_t data_bytes, const std::string& path) {
    // Duplicate names: nlohmann keeps the last silently, which would hide a tensor's bytes.
    std::string duplicate;
    std::set<std::string> seen;
    const json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
        if (depth == 1 && event == json::parse_event_t::key && !seen.insert(parsed.get<std::string>()).second)
            duplicate = parsed.get<std::string>();
        return true;
    };
    const json h = json::parse(text, cb, false);
    if (h.is_discarded()) fail(path, "the header is not valid JSON");
    if (!h.is_object()) fail(path, "the header is not a JSON object");
    if (!duplicate.empty()) fail(path, "tensor \"" + duplicate + "\" appears twice in the header");
    std::vector<entry> out;
    for (auto it = h.begin(); it != h.end(); ++it) {
        const std::string& name = it.key();
        const json& v = it.value();
        if (name == "__metadata__") {
            bool ok = v.is_object();
            if (ok)
                for (const auto& m : v) ok = ok && m.is_string();
            if (!ok) fail(path, "__metadata__ must be an object of strings, got " + v.dump());
            continue;
        }
        const std::string who = "tensor \"" + name + "\": ";
        if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
            fail(path, who + "expected {\"dtype\", \"shape\", \"data_offsets\"}, got " + v.dump());
        const json &dt = v.at("dtype"), &sh = v.at("shape"), &off = v.at("data_offsets");
        if (!dt.is_string()) fail(path, who + "dtype must be a string, got " + dt.dump());
        entry e{name, find_dtype(dt.get<std::string>()), {}, 0, 0};
        if (!e.dtype)
            fail(path, who + "dtype \"" + dt.get<std::string>() + "\" is not supported (F32, BF16 or F16)");
        if (!sh.is_array()) fail(path, who + "shape must be an array of integers >= 0, got " + sh.dump());
        for (const json& s : sh) {
            if (!s.is_number_unsigned()) fail(path, who + "shape must be an array of integers >= 0, got " + sh.dump());
            e.shape.push_back(s.get<std::uint64_t>());
        }
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            fail(path, who + "data_offsets must be [begin, end], integers >= 0, got " + off.dump());
        e.begin = off[0].get<std::uint64_t>();
        e.end = off[1].get<std::uint64_t>();
        // shape x dtype bytes, without wrapping.
        std::uint64_t bytes = e.dtype->bytes;
        bool fits = true;
        for (std::uint64_t s : e.shape) {
            if (s != 0 && bytes > UINT64_MAX / s) fits = false;
            bytes = fits ? bytes * s : 0;
        }
        if (e.end < e.begin)
            fail(path, who + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                           "] end before they begin");
        if (!fits || e.end - e.begin != bytes)
            fail(path, who + "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] hold " +
                           std::to_string(e.end - e.begin) + " bytes; shape " + shape_string(e.shape) + " of " +
                           e.dtype->name + " needs " + (fits ? std::to_string(bytes) : "more than 2^64"));
        out.push_back(std::move(e));
    }
    // The tensors must tile the data exactly: each begins where the previous ends.
    std::sort(out.begin(), out.end(), [](const entry& a, const entry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::uint64_t at = 0;
    const entry* prev = nullptr;
    for (const entry& e : out) {
        if (e.begin < at)
            fail(path, "tensor \"" + e.name + "\": data_offsets [" + std::to_string(e.begin) + ", " +
                           std::to_string(e.end) + "] overlap those of tensor \"" + prev->name + "\" [" +
                           std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "]");
        if (e.begin > at)
            fail(path, "bytes [" + std::to_string(at) + ", " + std::to_string(e.begin) +
                           ") of the data belong to no tensor (before tensor \"" + e.name + "\")");
        at = e.end;
        prev = &e;
    }
    if (at > data_bytes)
        fail(path, "truncated: tensor \"" + prev->name + "\" ends at byte " + std::to_string(at) +
                       " of the data, which holds only " + std::to_string(data_bytes) + " bytes");
    if (at < data_bytes)
        fail(path, "bytes [" + std::to_string(at) + ", " + std::to_string(data_bytes) +
                       ") of the data, after the last tensor, belong to no tensor");
    return out;
}

}  // namespace checkpoint_impl

// Builds and fills a decoder from a checkpoint (model/decoder.hpp befriends it).
class checkpoint_access {
   public:
    static decoder load(const std::string& dir, thread_pool* pool) {
        namespace ci = checkpoint_impl;
        const std::string config_path = dir + "/config.json", path = dir + "/model.safetensors";
        decoder_config c = ci::config_from_json(ci::read_text(config_path), config_path);
        c.pool = pool;

        std::ifstream in(path, std::ios::binary);
        if (!in) {
            if (std::filesystem::exists(dir + "/model.safetensors.index.json"))
                ci::fail(path, "cannot open the file (sharded checkpoints, model.safetensors.index.json, are not read)");
            ci::fail(path, "cannot open the file");
        }
        in.seekg(0, std::ios::end);
        const auto size = static_cast<std::uint64_t>(in.tellg());
        in.seekg(0);
        unsigned char len8[8];
        if (size < 8 || !in.read(reinterpret_cast<char*>(len8), 8))
            ci::fail(path, "the file holds " + std::to_string(size) + " bytes, fewer than the 8 of the header length");
        const std::uint64_t n = std::uint64_t(ci::le32(len8)) | std::uint64_t(ci::le32(len8 + 4)) << 32;
        if (n > size - 8)
            ci::fail(path, "the header length " + std::to_string(n) + " runs past the end of the file (" +
                               std::to_string(size) + " bytes)");
        std::string header(static_cast<std::size_t>(n), '\0');
        if (!in.read(&header[0], static_cast<std::streamsize>(n))) ci::fail(path, "cannot read the header");
        const std::uint64_t data_start = 8 + n;
        const std::vector<ci::entry> entries = ci::parse_header(header, size - data_start, path);

        decoder m(c, decoder::no_weights{});
        // Names and shapes against the config, all before a byte of data is read.
        std::map<std::string, const ci::entry*> by_name;
        for (const auto& e : entries) by_name[e.name] = &e;
        std::set<std::string> expected;
        m.for_each_parameter([&](const std::string& name, const auto& t) {
            expected.insert(name);
            const auto it = by_name.find(name);
            if (it == by_name.end()) ci::fail(path, "tensor \"" + name + "\" missing");
            const std::vector<std::uint64_t> want = ci::file_shape(name, t);
            if (it->second->shape != want)
                ci::fail(path, "tensor \"" + name + "\": shape " + ci::shape_string(it->second->shape) +
                                   ", expected " + ci::shape_string(want) +
                                   (ci::transposed_in_file(name) ? " (Hugging Face's [out, in])" : ""));
        });
        for (const auto& e : entries)
            if (!expected.count(e.name))
                ci::fail(path, "tensor \"" + e.name + "\" is not a parameter of this config (" +
                                   (e.name == "lm_head.weight" ? "tie_word_embeddings is true"
                                                               : "layer kinds " + kinds_string(m) +
                                                                     (c.attention_bias ? ", q/k/v biases" : ", no biases")) +
                                   ")");
        std::vector<unsigned char> bytes;
        m.for_each_parameter([&](const std::string& name, auto& t) {
            const ci::entry& e = *by_name.at(name);
            bytes.resize(static_cast<std::size_t>(e.end - e.begin));
            in.seekg(static_cast<std::streamoff>(data_start + e.begin));
            if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size())))
                ci::fail(path, "tensor \"" + name + "\": cannot read its bytes");
            const auto [rows, cols] = ci::stored_matrix(name, t);
            const index_t w = static_cast<index_t>(e.dtype->bytes);
            float* dst = t.data();
            // File element f sits at stored (f % rows, f / rows) when transposed (rows = 1 else).
            for (index_t f = 0; f < rows * cols; ++f)
                dst[(f % rows) * cols + f / rows] = ci::element(&bytes[static_cast<std::size_t>(f * w)], *e.dtype);
        });
        m.parameters_changed();
        return m;
    }

   private:
    static std::string kinds_string(const decoder& m) {
        std::string s;
        for (attention_variant k : m.layer_kinds()) s += (s.empty() ? "" : " ") + attention_variant_name(k);
        return s;
    }
};

// Reads dir/config.json and dir/model.safetensors (the header comment says what is read and
// what is rejected). The decoder runs on `pool` (decoder_config::pool).
inline decoder load_decoder(const std::string& dir, thread_pool* pool = nullptr) {
    return checkpoint_access::load(dir, pool);
}

// Writes dir/config.json and dir/model.safetensors (F32, Hugging Face's names and layouts),
// creating dir if needed. Each file is written beside its name and renamed into place, so a
// failed save leaves any earlier checkpoint there whole.
inline void save_decoder(const decoder& model, const std::string& dir) {
    namespace ci = checkpoint_impl;
    const auto bad = [&](const std::string& what) {
        throw std::invalid_argument("attnkit::model::save_decoder: dir \"" + dir + "\": " + what);
    };
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) bad("cannot create the directory (" + ec.message() + ")");

    ci::json header = ci::json::object();
    header["__metadata__"] = {{"format", "pt"}};
    std::uint64_t at = 0;
    model.for_each_parameter([&](const std::string& name, const auto& t) {
        const std::uint64_t bytes = static_cast<std::uint64_t>(t.size()) * 4;
        header[name] = {{"dtype", "F32"}, {"shape", ci::file_shape(name, t)}, {"data_offsets", {at, at + bytes}}};
        at += bytes;
    });
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned

    const auto write_file = [&](const std::string& name, const auto& write) {
        const std::string final_path = dir + "/" + name, tmp = final_path + ".tmp";
        {
            std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
            if (!out) bad("cannot write " + tmp);
            write(out);
            out.flush();
            if (!out) bad("cannot write " + tmp);
        }
        std::filesystem::rename(tmp, final_path, ec);
        if (ec) bad("cannot rename " + tmp + " to " + final_path + " (" + ec.message() + ")");
    };
    write_file("model.safetensors", [&](std::ofstream& out) {
        unsigned char len8[8];
        for (int i = 0; i < 8; ++i) len8[i] = static_cast<unsigned char>(std::uint64_t(text.size()) >> (8 * i));
        out.write(reinterpret_cast<const char*>(len8), 8);
        out.write(text.data(), static_cast<std::streamsize>(text.size()));
        std::vector<unsigned char> buf;
        model.for_each_parameter([&](const std::string& name, const auto& t) {
            const auto [rows, cols] = ci::stored_matrix(name, t);
            const index_t count = rows * cols;
            buf.resize(static_cast<std::size_t>(count) * 4);
            const float* src = t.data();
            for (index_t i = 0; i < count; ++i) {
                const float v = src[(i % rows) * cols + i / rows];  // as on load
                std::uint32_t u;
                std::memcpy(&u, &v, 4);
                for (int b = 0; b < 4; ++b) buf[static_cast<std::size_t>(i * 4 + b)] = static_cast<unsigned char>(u >> (8 * b));
            }
            out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
        });
    });
    write_file("config.json", [&](std::ofstream& out) { out << ci::config_to_json(model.config()).dump(2) << "\n"; });
}

}  // namespace model
}  // namespace attnkit
