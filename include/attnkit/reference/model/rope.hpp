// Oracles of attnkit::model::rope and rope_backward: RoPE and its gradient in double, out of
// place, straight from the published formulas (Su et al.'s rotation; Hugging Face transformers'
// modeling_rope_utils for the frequencies of "default", "linear", "llama3" and "yarn"; GPT-NeoX's
// rotate_half and GPT-J's interleaved pairs), every element's frequency and angle computed on its
// own. Shares only the options and their checks with the kernel.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "attnkit/detail/check.hpp"
#include "attnkit/model/rope_options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace model {

// Hugging Face's inv_freq[c] for a rotary dim R (options checked by the caller).
inline double rope_inv_freq(const attnkit::model::rope_options& o, std::int64_t R, std::int64_t c) {
    using attnkit::model::rope_scaling_type;
    const double pi = 3.14159265358979323846;
    const double base = static_cast<double>(o.theta);
    const double dim = static_cast<double>(R);
    const double i = static_cast<double>(c);
    const double inv = std::pow(base, -(2.0 * i) / dim);
    const auto& s = o.scaling;
    if (s.type == rope_scaling_type::linear) return inv / s.factor;
    if (s.type == rope_scaling_type::llama3) {
        const double old_context = static_cast<double>(s.original_max_position_embeddings);
        const double wavelen = 2.0 * pi / inv;
        const double low_freq_wavelen = old_context / s.low_freq_factor;
        const double high_freq_wavelen = old_context / s.high_freq_factor;
        if (wavelen < high_freq_wavelen) return inv;
        if (wavelen > low_freq_wavelen) return inv / s.factor;
        const double smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        return (1.0 - smooth) * inv / s.factor + smooth * inv;
    }
    if (s.type == rope_scaling_type::yarn) {
        const double n = static_cast<double>(s.original_max_position_embeddings);
        // The dimension whose wavelength fits `rotations` times into the pretrained context.
        const auto correction_dim = [&](double rotations) {
            return dim * std::log(n / (rotations * 2.0 * pi)) / (2.0 * std::log(base));
        };
        double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
        if (s.truncate) {
            low = std::floor(low);
            high = std::ceil(high);
        }
        low = std::max(low, 0.0);
        high = std::min(high, dim - 1.0);
        if (low == high) high += 0.001;
        double ramp = (i - low) / (high - low);
        ramp = ramp < 0.0 ? 0.0 : (ramp > 1.0 ? 1.0 : ramp);
        const double extrapolation = 1.0 - ramp;
        const double interpolated = 1.0 / (s.factor * std::pow(base, 2.0 * i / dim));
        const double extrapolated = 1.0 / std::pow(base, 2.0 * i / dim);
        return interpolated * (1.0 - extrapolation) + extrapolated * extrapolation;
    }
    return inv;
}

// Hugging Face's attention_factor (yarn's get_mscale; 1 elsewhere) or the explicit one.
inline double rope_attention_factor(const attnkit::model::rope_scaling& s) {
    if (s.attention_factor > 0.0) return s.attention_factor;
    if (s.type != attnkit::model::rope_scaling_type::yarn) return 1.0;
    const auto get_mscale = [](double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    if (s.mscale > 0.0 && s.mscale_all_dim > 0.0)
        return get_mscale(s.factor, s.mscale) / get_mscale(s.factor, s.mscale_all_dim);
    return get_mscale(s.factor, 1.0);
}

// out [B, L, H, D] (double or float) = each pair of x turned by sign * its angle, row (b, l) at
// position(b, l): (u, v) -> af (u cos - sign v sin, v cos + sign u sin). sign = 1 is RoPE; sign
// = -1 the transposed rotation, RoPE's gradient (below). Past the rotary dim: the identity.
template <class X, class O, class Position>
void rope_rotate(const char* name, const char* who, const X& x_in, O&& out_in, const attnkit::model::rope_options& o,
                 Position&& position, double sign) {
    const auto x = attnkit::detail::input_view<4>(name, x_in, "[B, L, H, D]");
    const auto out = attnkit::detail::output_view<4>("out", std::forward<O>(out_in), "[B, L, H, D]");
    if (out.dims != x.dims)
        attnkit::detail::fail(std::string("reference::model::") + who + ": shapes " + name + " " + shape_string(x) +
                              ", out " + shape_string(out));
    const index_t D = x.dims[3];
    const index_t R = attnkit::model::detail::check_rope_options(o, x, name);
    const bool interleaved = o.style == attnkit::model::rope_style::interleaved;
    const double mscale = rope_attention_factor(o.scaling);
    using T = std::remove_reference_t<decltype(out(0, 0, 0, 0))>;
    for (index_t b = 0; b < x.dims[0]; ++b)
        for (index_t l = 0; l < x.dims[1]; ++l)
            for (index_t h = 0; h < x.dims[2]; ++h) {
                for (index_t d = R; d < D; ++d) out(b, l, h, d) = static_cast<T>(static_cast<double>(x(b, l, h, d)));
                for (index_t c = 0; c < R / 2; ++c) {
                    const double angle = static_cast<double>(position(b, l)) * rope_inv_freq(o, R, c);
                    const double cs = std::cos(angle), sn = sign * std::sin(angle);
                    const index_t i1 = interleaved ? 2 * c : c;
                    const index_t i2 = interleaved ? 2 * c + 1 : c + R / 2;
                    const double u = static_cast<double>(x(b, l, h, i1));
                    const double v = static_cast<double>(x(b, l, h, i2));
                    out(b, l, h, i1) = static_cast<T>((u * cs - v * sn) * mscale);
                    out(b, l, h, i2) = static_cast<T>((v * cs + u * sn) * mscale);
                }
            }
}

// out [B, L, H, D] (double or float) = RoPE of x, row (b, l) at position position(b, l).
template <class X, class O, class Position>
void rope_at(const X& x, O&& out, const attnkit::model::rope_options& o, Position&& position) {
    rope_rotate("x", "rope", x, std::forward<O>(out), o, std::forward<Position>(position), 1.0);
}

// Row l at o.position_offset + l.
template <class X, class O>
void rope(const X& x, O&& out, const attnkit::model::rope_options& o) {
    rope_at(x, std::forward<O>(out), o, [&](index_t, index_t l) { return o.position_offset + l; });
}

// Row (b, l) at positions(b, l) ([B, L], int64 or int32).
template <class X, class O, class P>
void rope(const X& x, O&& out, const P& positions_in, const attnkit::model::rope_options& o) {
    const auto pos = attnkit::detail::input_view<2>("positions", positions_in, "[B, L]");
    rope_at(x, std::forward<O>(out), o, [&](index_t b, index_t l) { return static_cast<std::int64_t>(pos(b, l)); });
}

// Rotate-half with the default frequencies, row l at position_offset + l.
template <class X, class O>
void rope(const X& x, O&& out, double theta, std::int64_t position_offset) {
    attnkit::model::rope_options o;
    o.theta = static_cast<float>(theta);
    o.position_offset = position_offset;
    rope(x, std::forward<O>(out), o);
}

// Oracle of attnkit::model::rope_backward: out [B, L, H, D] (double or float) = the gradient of
// rope with respect to x, given d = dLoss/d(rope(x)). Each pair's forward (u, v) ->
// af (u cos - v sin, v cos + u sin) has the Jacobian af [[cos, -sin], [sin, cos]]; its transpose
// takes (a, b) = (d[i1], d[i2]) to af (a cos + b sin, b cos - a sin): the rotation by the
// opposite angle. Past the rotary dim the forward is the identity, and so is its gradient.
template <class G, class O, class Position>
void rope_backward_at(const G& d, O&& out, const attnkit::model::rope_options& o, Position&& position) {
    rope_rotate("d", "rope_backward", d, std::forward<O>(out), o, std::forward<Position>(position), -1.0);
}

// Row l at o.position_offset + l.
template <class G, class O>
void rope_backward(const G& d, O&& out, const attnkit::model::rope_options& o) {
    rope_backward_at(d, std::forward<O>(out), o, [&](index_t, index_t l) { return o.position_offset + l; });
}

// Row (b, l) at positions(b, l) ([B, L], int64 or int32).
template <class G, class O, class P>
void rope_backward(const G& d, O&& out, const P& positions_in, const attnkit::model::rope_options& o) {
    const auto pos = attnkit::detail::input_view<2>("positions", positions_in, "[B, L]");
    rope_backward_at(d, std::forward<O>(out), o,
                     [&](index_t b, index_t l) { return static_cast<std::int64_t>(pos(b, l)); });
}

}  // namespace model
}  // namespace reference
}  // namespace attnkit
