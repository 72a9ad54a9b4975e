// Rotary position embedding, in place, in the rotate-half convention of Llama / Qwen2.5
// (Hugging Face `rotate_half`): the head dim D (even) splits into halves x1 = x[:D/2] and
// x2 = x[D/2:], and for c < D/2, position p and frequency f_c = theta^(-2c/D):
//
//   x1'[c] = x1[c] cos(p f_c) - x2[c] sin(p f_c)
//   x2'[c] = x2[c] cos(p f_c) + x1[c] sin(p f_c)
//
//   attnkit::model::rope_options ro;   ro.theta = 1e6f (Qwen2.5) or 1e4f (Llama 2);
//   ro.position_offset = n_cached;     // decode: the first row of x sits at this position
//   attnkit::model::rope(q, ro);       // q [B, L, H, D] (any view, e.g. into a fused QKV buffer)
//   attnkit::model::rope(k, ro);
//
// Row l of x is at position position_offset + l, so a decode step with the offset equal to
// the cache length rotates exactly as the same row of a full prefill. Angles are computed in
// double (p f_c reaches 1e5 radians at long contexts, where float arguments would lose the
// phase) once per (position, c) and shared by every batch item and head.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace model {

struct rope_options {
    float theta = 10000.0f;             // base of the frequencies, finite and > 1
    std::int64_t position_offset = 0;   // position of row 0, >= 0
    thread_pool* pool = nullptr;
};

template <class X>
void rope(X&& x_in, const rope_options& o = {}) {
    const auto x = attnkit::detail::output_view<4>("x", std::forward<X>(x_in), "[B, L, H, D]");
    static_assert(std::is_same<typename decltype(x)::value_type, float>::value, "attnkit::model::rope: float x");
    attnkit::detail::check_layout("x", x);
    const index_t B = x.dims[0], L = x.dims[1], H = x.dims[2], D = x.dims[3];
    if (D % 2 != 0) attnkit::detail::fail("x: the head dim must be even for rotate-half RoPE, got " + shape_string(x));
    if (!(o.theta > 1.0f) || !std::isfinite(o.theta))
        attnkit::detail::fail("opts.theta: expected a finite value > 1, got " + attnkit::detail::number(o.theta));
    if (o.position_offset < 0)
        attnkit::detail::fail("opts.position_offset: expected >= 0, got " + std::to_string(o.position_offset));
    if (L > 0 && o.position_offset > std::numeric_limits<std::int64_t>::max() - L)
        attnkit::detail::fail("opts.position_offset: " + std::to_string(o.position_offset) + " + L = " +
                              std::to_string(L) + " overflows int64");
    // A row reached through several indices (a zero stride) would be rotated several times.
    attnkit::detail::check_outputs_apart({attnkit::detail::region_of("x", x)}, {});
    const index_t half = D / 2;
    if (B == 0 || L == 0 || H == 0 || D == 0) return;

    std::vector<float> cs(static_cast<std::size_t>(L * half)), sn(cs.size());
    std::vector<double> freq(static_cast<std::size_t>(half));
    for (index_t c = 0; c < half; ++c)
        freq[static_cast<std::size_t>(c)] =
            std::pow(static_cast<double>(o.theta), -2.0 * static_cast<double>(c) / static_cast<double>(D));
    for (index_t l = 0; l < L; ++l)
        for (index_t c = 0; c < half; ++c) {
            const double a = static_cast<double>(o.position_offset + l) * freq[static_cast<std::size_t>(c)];
            cs[static_cast<std::size_t>(l * half + c)] = static_cast<float>(std::cos(a));
            sn[static_cast<std::size_t>(l * half + c)] = static_cast<float>(std::sin(a));
        }
    parallel_for(o.pool, B * L, [&](index_t bl) {
        const index_t b = bl / L, l = bl % L;
        const float* c0 = cs.data() + l * half;
        const float* s0 = sn.data() + l * half;
        for (index_t h = 0; h < H; ++h) {
            float* r = x.ptr(b, l, h);
            for (index_t c = 0; c < half; ++c) {
                const float x1 = r[c], x2 = r[c + half];
                r[c] = x1 * c0[c] - x2 * s0[c];
                r[c + half] = x2 * c0[c] + x1 * s0[c];
            }
        }
    });
}

}  // namespace model
}  // namespace attnkit
