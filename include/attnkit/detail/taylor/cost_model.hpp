// The cost model behind taylor_form::automatic (taylor_attention.hpp documents the constants and
// the crossovers; the measured runs are in docs/benchmarks.md): taylor_attention picks a form per call, taylor_state runs a step in
// the linear form from the causal crossover length of its shapes on, and folds its cached
// tokens into the linear state once the cache outgrows S (decode_fold_length).
#pragma once

#include <algorithm>
#include <cmath>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/taylor/linear.hpp"
#include "attnkit/options.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

// Effective FLOP rates of each form, in GFLOP/s of its own arithmetic (see taylor_attention.hpp):
// medians of bench/taylor_attention_bench at B = 1, H = 8, 1 thread, L = 2048..8192,
// D = 64 and 128 (quadratic 74-80, linear 67-74; the ratio is what matters).
constexpr double kQuadraticGflops = 78.0;
constexpr double kLinearGflops = 68.0;

// The most keys one quadratic-form call (or a quadratic taylor_state) may hold: the engine's
// (detail/check.hpp).
constexpr index_t kMaxQuadraticKeys = kMaxKeys;

// Visible (query, key) pairs of one batch item's query head: row i sees min(len, i + Lk - Lq + 1)
// keys when causal (at least 0), len otherwise.
inline double visible_pairs(index_t len_q, index_t len_k, index_t len, bool causal) {
    if (!causal) return static_cast<double>(len_q) * static_cast<double>(len);
    // n_i = clamp(i + a, 0, len), i in [0, Lq), a = Lk - Lq + 1: a ramp, then a plateau at len.
    const double a = static_cast<double>(len_k - len_q + 1), L = static_cast<double>(len);
    double sum = 0.0;
    const double x0 = std::max(a, 1.0), x1 = std::min(a + static_cast<double>(len_q) - 1.0, L);  // ramp x in [x0, x1]
    if (x1 >= x0) sum += (x0 + x1) * (x1 - x0 + 1.0) / 2.0;
    const double plateau_from = std::max(a, L + 1.0), last = a + static_cast<double>(len_q) - 1.0;
    if (last >= plateau_from) sum += (last - plateau_from + 1.0) * L;
    return sum;
}

// Visible pairs of a whole call: every batch item (its key length) and query head.
inline double visible_pairs(const attention_shape& s, const taylor_options& o) {
    double pairs = 0.0;
    for (index_t b = 0; b < s.batch; ++b) {
        const index_t len = o.key_lengths.empty() ? s.len_k : static_cast<index_t>(o.key_lengths[b]);
        pairs += visible_pairs(s.len_q, s.len_k, len, o.causal);
    }
    return pairs * static_cast<double>(s.heads);
}

inline taylor_form choose_form(const attention_shape& s, const taylor_options& o) {
    const double pairs = visible_pairs(s, o);
    const double D = static_cast<double>(s.dim), Dv = static_cast<double>(s.dim_v);
    const double F = 1.0 + D + D * (D + 1.0) / 2.0;
    const double rows = static_cast<double>(s.batch) *
                        (static_cast<double>(s.len_q * s.heads) + static_cast<double>(s.len_k * s.heads_k));
    const double local = o.causal ? static_cast<double>(s.batch * s.len_q * s.heads) * (kChunk / 2.0) : 0.0;
    const double t_quad = 2.0 * pairs * (D + Dv) / kQuadraticGflops;
    const double t_lin = 2.0 * rows * F * (Dv + 1.0) / kLinearGflops + 2.0 * local * (D + Dv) / kQuadraticGflops;
    return t_lin < t_quad ? taylor_form::linear : taylor_form::quadratic;
}

// The backward's choice (taylor_attention_backward.hpp), the same model with the backward's
// work: the quadratic form's tile kernel forms five products per visible pair,
// 2 P (3 D + 2 Dv) FLOPs, plus the row sums (D^2 per row and key); the linear form reads and
// updates two states, S forward over the keys and R in reverse over the queries:
// 2 F (Dv + 1) FLOPs per state update or read, two per query row (read S, enter R) and three per
// key row (enter S, read R twice: for d_k and for d_v), plus the chunk-local pairs through the
// tile kernel when causal. The rates are the backward kernels' own in these units, calibrated
// from bench/taylor_attention_backward_bench (the runs and the crossovers they give are in
// docs/benchmarks.md, "Taylor attention backward"); the linear form's rate is the lower one
// because its GEMMs have Dv + 1 columns, a poor fit for the micro-tile at Dv = 64.
constexpr double kQuadraticBackwardGflops = 24.0;
constexpr double kLinearBackwardGflops = 21.0;

inline taylor_form choose_backward_form(const attention_shape& s, const taylor_options& o) {
    const double pairs = visible_pairs(s, o);
    const double D = static_cast<double>(s.dim), Dv = static_cast<double>(s.dim_v);
    const double F = 1.0 + D + D * (D + 1.0) / 2.0;
    const double q_rows = static_cast<double>(s.batch) * static_cast<double>(s.len_q * s.heads);
    const double k_rows = static_cast<double>(s.batch) * static_cast<double>(s.len_k * s.heads_k);
    const double row_sums = 2.0 * (q_rows + k_rows) * D * D;
    const double local = o.causal ? q_rows * (kBackwardChunk / 2.0) : 0.0;
    const double t_quad = (2.0 * pairs * (3.0 * D + 2.0 * Dv) + row_sums) / kQuadraticBackwardGflops;
    const double t_lin = (2.0 * F * (Dv + 1.0) * (2.0 * q_rows + 3.0 * k_rows) + row_sums +
                          2.0 * local * (3.0 * D + 2.0 * Dv)) /
                         kLinearBackwardGflops;
    return t_lin < t_quad ? taylor_form::linear : taylor_form::quadratic;
}

// The causal crossover of a state's shapes: the smallest L for which automatic picks the linear
// form for a causal call with Lq = Lk = L (the batch size cancels out of the model), at most
// kMaxQuadraticKeys. The quadratic cost grows as L^2 and the linear one as L, so the choice
// changes once: a bisection finds the point.
inline index_t causal_crossover(index_t heads, index_t heads_kv, index_t dim, index_t dim_v) {
    taylor_options o;
    o.causal = true;
    const auto linear_at = [&](index_t L) {
        return choose_form(attention_shape{1, L, L, heads, heads_kv, dim, dim_v}, o) == taylor_form::linear;
    };
    index_t lo = 1, hi = kMaxQuadraticKeys;
    if (!linear_at(hi)) return hi;
    while (lo < hi) {
        const index_t mid = lo + (hi - lo) / 2;
        if (linear_at(mid))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

// The decode break-even of a quadratic state: a decode step reads the whole cache, D + Dv floats
// per token and key/value head, where a linear step reads S and z, F (Dv + 1) floats per
// key/value head; both steps are bound by that read. From this many tokens the cache is the
// larger, so a state folds once it holds them (D = Dv = 64: 1090), whatever the prefill
// crossover.
inline index_t decode_fold_length(index_t dim, index_t dim_v) {
    const double D = static_cast<double>(dim), Dv = static_cast<double>(dim_v);
    const double F = 1.0 + D + D * (D + 1.0) / 2.0;
    const double n = std::ceil(F * (Dv + 1.0) / (D + Dv));
    return static_cast<index_t>(std::min(n, static_cast<double>(kMaxQuadraticKeys)));
}

}  // namespace taylor
}  // namespace detail
}  // namespace attnkit
