// The options of attnkit::model::rope (model/rope.hpp) and their checks, apart from the kernel so
// that the oracle (reference/model/rope.hpp) takes the same options and rejects the same input
// without sharing any of the kernel's arithmetic.
//
// The fields mirror a Hugging Face config: rope_theta -> theta, partial_rotary_factor (or a
// rotary dim) -> rotary_dim / partial_rotary_factor, rope_scaling {rope_type, factor, ...} ->
// scaling, and the layout of the rotated pairs -> style (the weights decide it, not the config:
// Hugging Face checkpoints pair x[c] with x[c + R/2], Meta's original and GGUF Llama weights
// pair x[2c] with x[2c + 1]).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "attnkit/detail/check.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace model {

// Which elements of the rotary part R (the first rotary_dim elements of a head) form the pair
// rotated by frequency c, c < R/2.
enum class rope_style {
    rotate_half,  // (x[c], x[c + R/2]): GPT-NeoX, Hugging Face's rotate_half (Llama, Qwen2, ...)
    interleaved,  // (x[2c], x[2c + 1]): GPT-J, Meta's reference Llama code, GGUF / llama.cpp
};

// Hugging Face's rope_scaling["rope_type"] (transformers' modeling_rope_utils).
enum class rope_scaling_type {
    none,    // "default": f_c = theta^(-2c/R)
    linear,  // "linear": position interpolation, f_c / factor
    llama3,  // "llama3": Llama 3.1's by-wavelength blend of f_c and f_c / factor
    yarn,    // "yarn": YaRN's ramp between f_c and f_c / factor, and cos/sin times an attention factor
};

struct rope_scaling {
    rope_scaling_type type = rope_scaling_type::none;
    double factor = 1.0;  // linear, llama3, yarn: finite, >= 1 (1 with type none)
    // llama3: wavelengths above original_max_position_embeddings / low_freq_factor are divided
    // by factor, those below original_max_position_embeddings / high_freq_factor kept, those
    // between blended. Llama 3.1: factor 8, 1, 4, 8192.
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    // llama3 and yarn: the pretrained context, > 0 (Hugging Face's
    // rope_scaling["original_max_position_embeddings"]; with yarn, when a config has no such
    // key, its max_position_embeddings).
    std::int64_t original_max_position_embeddings = 0;
    // yarn: the rotation counts that bound the ramp (Hugging Face's defaults 32 and 1), finite,
    // beta_fast >= beta_slow > 0; truncate: floor / ceil the ramp's ends (Hugging Face's default).
    double beta_fast = 32.0;
    double beta_slow = 1.0;
    bool truncate = true;
    // cos and sin are multiplied by attention_factor: 0 picks Hugging Face's default, for yarn
    // 0.1 ln(factor) + 1, or with mscale and mscale_all_dim both > 0 (DeepSeek) the ratio
    // (0.1 mscale ln(factor) + 1) / (0.1 mscale_all_dim ln(factor) + 1); for the others 1.
    // A value > 0 is used as it is with any type.
    double attention_factor = 0.0;
    double mscale = 0.0;
    double mscale_all_dim = 0.0;
};

class rope_cache;  // model/rope.hpp

struct rope_options {
    float theta = 10000.0f;            // base of the frequencies, finite and > 1
    std::int64_t position_offset = 0;  // position of row 0, >= 0 (the form without a positions tensor)
    thread_pool* pool = nullptr;
    rope_style style = rope_style::rotate_half;
    // The rotary part: the first R elements of each head are rotated, the other D - R pass
    // through. R = rotary_dim when > 0, else int(D * partial_rotary_factor) (Hugging Face's
    // rule); R even, 2 <= R <= D. Setting both is an error.
    index_t rotary_dim = 0;
    double partial_rotary_factor = 1.0;  // in (0, 1]
    rope_scaling scaling{};
    // Optional: a cache of cos / sin tables kept between calls (model/rope.hpp). nullptr: every
    // call computes its own. Either way the results are the same bits.
    rope_cache* cache = nullptr;
};

namespace detail {

using attnkit::detail::fail;
using attnkit::detail::number;

// The rotary dim R of x's heads (x [B, L, H, D]), after checking every option; throws naming the
// option and the shape of x otherwise (x named `name`: "d_x" for rope_backward).
template <class T>
index_t check_rope_options(const rope_options& o, const view<T, 4>& x, const char* name = "x") {
    const index_t D = x.dims[3];
    if (!(o.theta > 1.0f) || !std::isfinite(o.theta))
        fail("opts.theta: expected a finite value > 1, got " + number(o.theta));
    if (o.position_offset < 0) fail("opts.position_offset: expected >= 0, got " + number(o.position_offset));
    if (o.style != rope_style::rotate_half && o.style != rope_style::interleaved)
        fail("opts.style: expected rope_style::rotate_half or rope_style::interleaved, got " +
             number(static_cast<int>(o.style)));
    if (!(o.partial_rotary_factor > 0.0 && o.partial_rotary_factor <= 1.0))
        fail("opts.partial_rotary_factor: expected a value in (0, 1], got " + number(o.partial_rotary_factor));
    if (o.rotary_dim < 0) fail("opts.rotary_dim: expected 0 (from partial_rotary_factor) or > 0, got " + number(o.rotary_dim));
    if (o.rotary_dim > 0 && o.partial_rotary_factor != 1.0)
        fail("opts.rotary_dim: set either rotary_dim (" + number(o.rotary_dim) + ") or partial_rotary_factor (" +
             number(o.partial_rotary_factor) + "), not both");
    const index_t R =
        o.rotary_dim > 0 ? o.rotary_dim
                         : static_cast<index_t>(std::floor(static_cast<double>(D) * o.partial_rotary_factor));
    if (R > D || (D > 0 && (R % 2 != 0 || R < 2))) {
        const std::string which = o.rotary_dim > 0 ? "opts.rotary_dim" : "opts.partial_rotary_factor";
        const std::string got = "rotary dim " + number(R) + " for " + name + " " + shape_string(x);
        if (R > D) fail(which + ": the rotary dim must be <= the head dim D = " + number(D) + ", got " + got);
        if (o.rotary_dim == 0 && o.partial_rotary_factor == 1.0)
            fail(std::string(name) + ": the head dim must be even for RoPE (or set opts.rotary_dim), got " +
                 shape_string(x));
        fail(which + ": the rotary dim must be even and >= 2, got " + got);
    }

    const rope_scaling& s = o.scaling;
    const auto finite_at_least = [](double v, double lo) { return std::isfinite(v) && v >= lo; };
    if (s.type != rope_scaling_type::none && s.type != rope_scaling_type::linear &&
        s.type != rope_scaling_type::llama3 && s.type != rope_scaling_type::yarn)
        fail("opts.scaling.type: unknown value " + number(static_cast<int>(s.type)));
    if (s.type == rope_scaling_type::none) {
        if (s.factor != 1.0)
            fail("opts.scaling.factor: " + number(s.factor) + " with scaling type none (set opts.scaling.type)");
    } else if (!finite_at_least(s.factor, 1.0)) {
        fail("opts.scaling.factor: expected a finite value >= 1, got " + number(s.factor));
    }
    if (!(std::isfinite(s.attention_factor) && s.attention_factor >= 0.0))
        fail("opts.scaling.attention_factor: expected 0 (default) or a finite value > 0, got " +
             number(s.attention_factor));
    if (s.type == rope_scaling_type::llama3 || s.type == rope_scaling_type::yarn) {
        if (s.original_max_position_embeddings <= 0)
            fail("opts.scaling.original_max_position_embeddings: expected > 0, got " +
                 number(s.original_max_position_embeddings));
    }
    if (s.type == rope_scaling_type::llama3) {
        if (!(std::isfinite(s.low_freq_factor) && s.low_freq_factor > 0.0))
            fail("opts.scaling.low_freq_factor: expected a finite value > 0, got " + number(s.low_freq_factor));
        if (!(std::isfinite(s.high_freq_factor) && s.high_freq_factor > s.low_freq_factor))
            fail("opts.scaling.high_freq_factor: expected a finite value > low_freq_factor = " +
                 number(s.low_freq_factor) + ", got " + number(s.high_freq_factor));
    }
    if (s.type == rope_scaling_type::yarn) {
        if (!(std::isfinite(s.beta_slow) && s.beta_slow > 0.0))
            fail("opts.scaling.beta_slow: expected a finite value > 0, got " + number(s.beta_slow));
        if (!(std::isfinite(s.beta_fast) && s.beta_fast >= s.beta_slow))
            fail("opts.scaling.beta_fast: expected a finite value >= beta_slow = " + number(s.beta_slow) + ", got " +
                 number(s.beta_fast));
        if (!finite_at_least(s.mscale, 0.0))
            fail("opts.scaling.mscale: expected a finite value >= 0, got " + number(s.mscale));
        if (!finite_at_least(s.mscale_all_dim, 0.0))
            fail("opts.scaling.mscale_all_dim: expected a finite value >= 0, got " + number(s.mscale_all_dim));
    }
    return R;
}

}  // namespace detail
}  // namespace model
}  // namespace attnkit
