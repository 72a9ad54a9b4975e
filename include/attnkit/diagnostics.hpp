// Attention diagnostics of Xue et al. (docs/variants.md section 9) on one layer's normalised
// weights w [H, L, L] (row i of head h: the weights query i gives keys j; causal rows have
// zeros above the diagonal). Every variant's oracle has an overload returning such weights
// (softmax, Taylor, self-gating and MTA as [B, H, L, L]: pass one batch item; static QK as
// [H, L, L]).
//
//   attnkit::attention_diagnostics d = attnkit::diagnose_attention(w);
//   d.entropy[h], d.concentration[h], d.sink[h], d.local_focus[n][h] (n = 0..3),
//   d.mean_entropy, ..., d.head_diversity (one number per layer)
//
// Definitions, per head on the L x L matrix A:
//   entropy        -sum over all entries of a log a (0 log 0 = 0); a negative weight, which
//                  MTA's post-softmax convolution can produce, enters as |a| log |a|
//   concentration  Frobenius norm sqrt(sum a^2)
//   sink           (1/L) sum_i A[i][0], attention paid to the first token
//   local focus N  mean of the N-th sub-diagonal, (1/(L-N)) sum_{i>=N} A[i][i-N]; 0 when L <= N
// and over heads: head diversity = mean over the L(L+1)/2 causal entries (i >= j) of the
// population standard deviation across heads of A^h[i][j]. Sums run in double.
#pragma once

#include <array>
#include <cmath>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/view.hpp"

namespace attnkit {

struct attention_diagnostics {
    static constexpr int kLocalFocus = 4;  // N = 0 .. 3
    std::vector<double> entropy, concentration, sink;
    std::array<std::vector<double>, kLocalFocus> local_focus;
    double head_diversity = 0.0;
    double mean_entropy = 0.0, mean_concentration = 0.0, mean_sink = 0.0;
    std::array<double, kLocalFocus> mean_local_focus{};
};

template <class W>
attention_diagnostics diagnose_attention(const W& weights) {
    const auto w = detail::input_view<3>("weights", weights, "[H, L, L]");
    detail::check_layout("weights", w);
    const index_t H = w.dims[0], L = w.dims[1];
    if (H < 1 || L < 1 || w.dims[2] != L)
        detail::fail("weights: expected a non-empty [H, L, L] tensor, got " + shape_string(w));

    attention_diagnostics d;
    const auto n_heads = static_cast<std::size_t>(H);
    d.entropy.assign(n_heads, 0.0);
    d.concentration.assign(n_heads, 0.0);
    d.sink.assign(n_heads, 0.0);
    for (auto& f : d.local_focus) f.assign(n_heads, 0.0);

    for (index_t h = 0; h < H; ++h) {
        const auto hs = static_cast<std::size_t>(h);
        double ent = 0.0, sq = 0.0, sink = 0.0;
        for (index_t i = 0; i < L; ++i) {
            const auto* row = w.ptr(h, i);
            for (index_t j = 0; j < L; ++j) {
                const double a = static_cast<double>(row[j]);
                if (a != 0.0) ent -= std::fabs(a) * std::log(std::fabs(a));
                sq += a * a;
            }
            sink += static_cast<double>(row[0]);
        }
        d.entropy[hs] = ent;
        d.concentration[hs] = std::sqrt(sq);
        d.sink[hs] = sink / static_cast<double>(L);
        for (int n = 0; n < attention_diagnostics::kLocalFocus; ++n) {
            if (L <= n) continue;
            double s = 0.0;
            for (index_t i = n; i < L; ++i) s += static_cast<double>(w(h, i, i - n));
            d.local_focus[static_cast<std::size_t>(n)][hs] = s / static_cast<double>(L - n);
        }
    }

    double div = 0.0;
    for (index_t i = 0; i < L; ++i)
        for (index_t j = 0; j <= i; ++j) {
            double mean = 0.0;
            for (index_t h = 0; h < H; ++h) mean += static_cast<double>(w(h, i, j));
            mean /= static_cast<double>(H);
            double var = 0.0;
            for (index_t h = 0; h < H; ++h) {
                const double e = static_cast<double>(w(h, i, j)) - mean;
                var += e * e;
            }
            div += std::sqrt(var / static_cast<double>(H));
        }
    d.head_diversity = div / (static_cast<double>(L) * static_cast<double>(L + 1) / 2.0);

    auto mean_of = [&](const std::vector<double>& v) {
        double s = 0.0;
        for (double x : v) s += x;
        return s / static_cast<double>(H);
    };
    d.mean_entropy = mean_of(d.entropy);
    d.mean_concentration = mean_of(d.concentration);
    d.mean_sink = mean_of(d.sink);
    for (int n = 0; n < attention_diagnostics::kLocalFocus; ++n)
        d.mean_local_focus[static_cast<std::size_t>(n)] = mean_of(d.local_focus[static_cast<std::size_t>(n)]);
    return d;
}

}  // namespace attnkit
