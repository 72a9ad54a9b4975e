// The RoPE frequencies f_c (c < R/2) and the factor on cos / sin, from checked options
// (model/rope_options.hpp), in double: Hugging Face's inv_freq of each rope_type.
//
//   none    f_c = theta^(-2c/R)
//   linear  f_c / factor
//   llama3  by wavelength w_c = 2 pi / f_c against the pretrained context n:
//           w_c < n / high_freq_factor: f_c;  w_c > n / low_freq_factor: f_c / factor;
//           between: (1 - s) f_c / factor + s f_c, s = (n / w_c - low) / (high - low)
//   yarn    (1 - e_c) f_c / factor + e_c f_c, e_c = 1 - clamp((c - lo) / (hi - lo), 0, 1), where
//           lo, hi are the dims at which a frequency turns beta_fast and beta_slow times over n
//           positions, dim(b) = R ln(n / (2 pi b)) / (2 ln theta), floored / ceiled when
//           truncating and clamped to [0, R - 1]; hi = lo + 0.001 when they meet
//
// Computed in double where Hugging Face computes inv_freq in float32: at the positions of a
// long context (p f_c ~ 1e5 radians) a float frequency moves the angle by ~1e-2.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attnkit/model/rope_options.hpp"

namespace attnkit {
namespace detail {
namespace rope {

constexpr double kTwoPi = 6.283185307179586476925286766559;

// f_c for c < R/2 (options already checked).
inline std::vector<double> frequencies(const model::rope_options& o, index_t R) {
    const index_t half = R / 2;
    const double theta = static_cast<double>(o.theta);
    const model::rope_scaling& s = o.scaling;
    std::vector<double> f(static_cast<std::size_t>(half));
    for (index_t c = 0; c < half; ++c)
        f[static_cast<std::size_t>(c)] = 1.0 / std::pow(theta, static_cast<double>(2 * c) / static_cast<double>(R));
    switch (s.type) {
        case model::rope_scaling_type::none:
            break;
        case model::rope_scaling_type::linear:
            for (double& x : f) x /= s.factor;
            break;
        case model::rope_scaling_type::llama3: {
            const double n = static_cast<double>(s.original_max_position_embeddings);
            const double long_wavelength = n / s.low_freq_factor, short_wavelength = n / s.high_freq_factor;
            for (double& x : f) {
                const double wavelength = kTwoPi / x;
                if (wavelength > long_wavelength) {
                    x /= s.factor;
                } else if (!(wavelength < short_wavelength)) {
                    const double smooth = (n / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                    x = (1.0 - smooth) * x / s.factor + smooth * x;
                }
            }
            break;
        }
        case model::rope_scaling_type::yarn: {
            const double n = static_cast<double>(s.original_max_position_embeddings);
            const auto dim_of = [&](double rotations) {
                return static_cast<double>(R) * std::log(n / (rotations * kTwoPi)) / (2.0 * std::log(theta));
            };
            double lo = dim_of(s.beta_fast), hi = dim_of(s.beta_slow);
            if (s.truncate) lo = std::floor(lo), hi = std::ceil(hi);
            lo = std::max(lo, 0.0);
            hi = std::min(hi, static_cast<double>(R - 1));
            if (lo == hi) hi += 0.001;
            for (index_t c = 0; c < half; ++c) {
                double& x = f[static_cast<std::size_t>(c)];
                const double ramp = std::min(1.0, std::max(0.0, (static_cast<double>(c) - lo) / (hi - lo)));
                const double extrapolate = 1.0 - ramp;
                x = (x / s.factor) * (1.0 - extrapolate) + x * extrapolate;
            }
            break;
        }
    }
    return f;
}

// The factor on cos and sin (options already checked).
inline double attention_factor(const model::rope_scaling& s) {
    if (s.attention_factor > 0.0) return s.attention_factor;
    if (s.type != model::rope_scaling_type::yarn) return 1.0;
    const auto mscale = [&](double m) { return s.factor <= 1.0 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0; };
    if (s.mscale > 0.0 && s.mscale_all_dim > 0.0) return mscale(s.mscale) / mscale(s.mscale_all_dim);
    return mscale(1.0);
}

}  // namespace rope
}  // namespace detail
}  // namespace attnkit
