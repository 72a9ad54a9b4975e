// The write-out of a work item of multi-token attention: O^T panels back to rows, then the
// per-row stages fused in one sweep over each row (head mixing of the outputs when it commutes
// with P V, group norm, depth scale, gate) and the store into out.
#pragma once

#include <algorithm>
#include <cmath>

#include "attnkit/detail/mta/plan.hpp"

namespace attnkit {
namespace detail {
namespace mta {

struct problem {
    strided4 q, k, v;
    float* out = nullptr;
    index_t ob = 0, ol = 0, oh = 0;
    float* stats = nullptr;  // [B, L, H] log2-domain lse of the pre-softmax result (two passes)
};

// ot: [H][npo][dv_pad][RT] panels of the item; l: per (head, row) softmax sums to divide by (one
// pass), or null (two passes: probabilities already normalised); rows: scratch of
// (block_rows + 2) * H * Dv floats.
template <index_t RT>
void write_rows(const plan& p, const problem& pr, index_t b, index_t i0, index_t R, const float* ot, const float* l,
                float* rows) {
    const index_t H = p.H, Dv = p.Dv;
    float* mixed = rows + p.block_rows * H * Dv;
    for (index_t h = 0; h < H; ++h)
        for (index_t r = 0; r < R; ++r) {
            const float* o = ot + (h * p.npo + r / RT) * p.dv_pad * RT + r % RT;
            float inv = 1.0f;
            if (l) {
                const float lv = l[h * p.npo * RT + r];
                inv = lv == 0.0f ? 0.0f : 1.0f / lv;
            }
            float* dst = rows + (r * H + h) * Dv;
            for (index_t c = 0; c < Dv; ++c) dst[c] = o[c * RT] * inv;
        }
    for (index_t r = 0; r < R; ++r) {
        float* x = rows + r * H * Dv;
        if (p.head_post && p.mix_outputs) {
            for (index_t h = 0; h < H; ++h) {
                float* y = mixed + h * Dv;
                std::fill(y, y + Dv, 0.0f);
                for (index_t g = 0; g < H; ++g) {
                    const float w = p.w_post[static_cast<std::size_t>(h * H + g)];
                    if (w == 0.0f) continue;
                    for (index_t c = 0; c < Dv; ++c) y[c] += w * x[g * Dv + c];
                }
            }
            x = mixed;
        }
        for (index_t h = 0; h < H; ++h) {
            float* y = x + h * Dv;
            float scale = p.depth;
            if (!p.norm_w.empty()) {
                float ss = 0.0f;
                for (index_t c = 0; c < Dv; ++c) ss += y[c] * y[c];
                const float rn = 1.0f / std::sqrt(ss / static_cast<float>(Dv) + p.eps);
                for (index_t c = 0; c < Dv; ++c) y[c] *= rn * p.norm_w[static_cast<std::size_t>(c)];
            }
            if (!p.gate_w.empty()) {
                float t = p.gate_b;
                for (index_t c = 0; c < Dv; ++c) t += y[c] * scale * p.gate_w[static_cast<std::size_t>(c)];
                scale *= 1.0f / (1.0f + std::exp(-t));
            }
            float* dst = pr.out + b * pr.ob + (i0 + r) * pr.ol + h * pr.oh;
            for (index_t c = 0; c < Dv; ++c) dst[c] = y[c] * scale;
        }
    }
}

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
