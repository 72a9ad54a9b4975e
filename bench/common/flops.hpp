// attnkit benchmarks: useful-work counters (FLOPs and bytes) of one attention call.
//
// Only the work a masked attention has to do is counted, never what a particular kernel
// happens to compute: a causal row counts the keys it sees, not Lk. Kernels that skip masked
// blocks and kernels that compute them and throw them away are compared on the same work, so
// FLOP/s of a wasteful path (the materialised baseline on a causal mask) is honestly lower.
//
// Conventions (FlashAttention's): per visible (query, key) pair and query head,
//   2*D  FLOPs for the score  q . k   (D multiplies + D adds)
//   2*Dv FLOPs for the update o += p * v
// i.e. 4*D when D == Dv. Softmax exponentials, maxima and the scaling are not counted.
// Masks follow docs/design.md "Conventions" exactly as attnkit::reference does: bottom-right causal
// (query i sits at p = i + Lk - Lq and sees j <= p), window_left, chunk (implies causal, as in
// Llama-4), key_lengths.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnkit/options.hpp"

namespace attnkit_bench {

// Problem size of one attention call; q [B,Lq,H,D], k [B,Lk,Hk,D], v [B,Lk,Hk,Dv].
struct attn_dims {
    std::int64_t B = 1, Lq = 0, Lk = 0, H = 1, Hk = 1, D = 0, Dv = 0;
};

namespace detail {

inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {  // b > 0, any sign of a
    std::int64_t q = a / b;
    if (a % b != 0 && a < 0) --q;
    return q;
}

// Keys [lo, hi] (inclusive; empty when hi < lo) visible to query i of batch item b.
inline void visible_range(const attn_dims& d, const attnkit::softmax_options& o, std::int64_t b,
                          std::int64_t i, std::int64_t& lo, std::int64_t& hi) {
    const std::int64_t p = i + (d.Lk - d.Lq);
    lo = 0;
    hi = d.Lk - 1;
    if (!o.key_lengths.empty()) hi = std::min(hi, o.key_lengths[static_cast<std::size_t>(b)] - 1);
    if (o.causal || o.chunk > 0) hi = std::min(hi, p);
    if (o.window_left >= 0) lo = std::max(lo, p - o.window_left);
    if (o.chunk > 0) {
        const std::int64_t start = o.chunk * floor_div(p, o.chunk);
        lo = std::max(lo, start);
        hi = std::min(hi, start + o.chunk - 1);
    }
}

}  // namespace detail

// Visible (query, key) pairs of ONE head, summed over the batch. O(B * Lq).
inline std::int64_t visible_pairs(const attn_dims& d, const attnkit::softmax_options& o) {
    std::int64_t n = 0;
    for (std::int64_t b = 0; b < d.B; ++b)
        for (std::int64_t i = 0; i < d.Lq; ++i) {
            std::int64_t lo, hi;
            detail::visible_range(d, o, b, i, lo, hi);
            if (hi >= lo) n += hi - lo + 1;
        }
    return n;
}

// Useful FLOPs of one call: visible pairs x H x (2*D + 2*Dv).
inline double attention_flops(const attn_dims& d, const attnkit::softmax_options& o) {
    return static_cast<double>(visible_pairs(d, o)) * static_cast<double>(d.H) *
           static_cast<double>(2 * d.D + 2 * d.Dv);
}

// Keys of batch item b that at least one query row sees (the keys a kernel must read). O(Lq+Lk).
inline std::int64_t keys_read(const attn_dims& d, const attnkit::softmax_options& o,
                              std::int64_t b) {
    if (d.Lk <= 0) return 0;
    std::vector<int> delta(static_cast<std::size_t>(d.Lk) + 1, 0);
    for (std::int64_t i = 0; i < d.Lq; ++i) {
        std::int64_t lo, hi;
        detail::visible_range(d, o, b, i, lo, hi);
        if (hi < lo) continue;
        ++delta[static_cast<std::size_t>(lo)];
        --delta[static_cast<std::size_t>(hi) + 1];
    }
    std::int64_t n = 0;
    int cover = 0;
    for (std::int64_t j = 0; j < d.Lk; ++j) {
        cover += delta[static_cast<std::size_t>(j)];
        if (cover > 0) ++n;
    }
    return n;
}

// K and V bytes that one call must stream (each key/value head read once; GQA query heads
// share it): sum_b keys_read(b) x Hk x (D + Dv) x element size. The decode-roofline quantity.
inline double kv_bytes(const attn_dims& d, const attnkit::softmax_options& o,
                       std::size_t k_elem_bytes = sizeof(float),
                       std::size_t v_elem_bytes = sizeof(float)) {
    double keys = 0;
    for (std::int64_t b = 0; b < d.B; ++b) keys += static_cast<double>(keys_read(d, o, b));
    return keys * static_cast<double>(d.Hk) *
           (static_cast<double>(d.D) * static_cast<double>(k_elem_bytes) +
            static_cast<double>(d.Dv) * static_cast<double>(v_elem_bytes));
}

}  // namespace attnkit_bench
