// The write-out of a work item of multi-token attention: O^T panels back to rows, then the
// per-row stages fused in one sweep over each row (head mixing of the outputs when it commutes
// with P V, group norm, depth scale, gate) and the store into out. row_stages is also what
// mta_state applies to each decoded row, so that a row decoded token by token is finished with
// the same arithmetic as the same row of a fused call.
#pragma once

#include <algorithm>
#include <cmath>

#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/detail/mta/params.hpp"
#include "attnkit/detail/mta/plan.hpp"

namespace attnkit {
namespace detail {
namespace mta {

struct problem {
    strided_rows q, k, v;
    float* out = nullptr;
    index_t ob = 0, ol = 0, oh = 0;
    float* stats = nullptr;  // [B, L, H] log2-domain lse of the pre-softmax result (two passes)
};

// The stages after P V on one output row y [Dv] of one head, in the order of docs/variants.md
// section 7: group norm (RMS over Dv, in place in y), depth scale, gate; dst[c] = the result.
// The depth scale and the gate are folded into one factor applied with the store, the gate's
// argument taken on the depth-scaled row.
inline void row_stages(const params& w, float* y, index_t dv, float* dst) {
    float scale = w.depth;
    if (!w.norm_weight.empty()) {
        float ss = 0.0f;
        for (index_t c = 0; c < dv; ++c) ss += y[c] * y[c];
        const float rn = 1.0f / std::sqrt(ss / static_cast<float>(dv) + w.norm_eps);
        for (index_t c = 0; c < dv; ++c) y[c] *= rn * w.norm_weight[static_cast<std::size_t>(c)];
    }
    if (!w.gate_weight.empty()) {
        float t = w.gate_bias;
        for (index_t c = 0; c < dv; ++c) t += y[c] * scale * w.gate_weight[static_cast<std::size_t>(c)];
        scale *= 1.0f / (1.0f + std::exp(-t));
    }
    for (index_t c = 0; c < dv; ++c) dst[c] = y[c] * scale;
}

// ot: [H][out_panels][dv_pad][RT] panels of the item; l: per (head, row) softmax sums to divide
// by (one pass), or null (two passes: probabilities already normalised); rows: the out_rows
// scratch, (block_rows + 2) * H * Dv floats.
template <index_t RT>
void write_rows(const plan& p, const problem& pr, index_t b, index_t i0, index_t R, const float* ot, const float* l,
                float* rows) {
    const index_t H = p.H, Dv = p.Dv, np = p.at.out_panels, dv_pad = p.at.dv_pad;
    const params& w = *p.w;
    float* mixed = rows + p.block_rows * H * Dv;
    for (index_t h = 0; h < H; ++h)
        for (index_t r = 0; r < R; ++r) {
            const float* o = ot + (h * np + r / RT) * dv_pad * RT + r % RT;
            const float inv = l ? row_inv_sum(l[h * np * RT + r]) : 1.0f;
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
                    const float wg = w.head_post[static_cast<std::size_t>(h * H + g)];
                    if (wg == 0.0f) continue;
                    for (index_t c = 0; c < Dv; ++c) y[c] += wg * x[g * Dv + c];
                }
            }
            x = mixed;
        }
        for (index_t h = 0; h < H; ++h)
            row_stages(w, x + h * Dv, Dv, pr.out + b * pr.ob + (i0 + r) * pr.ol + h * pr.oh);
    }
}

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
