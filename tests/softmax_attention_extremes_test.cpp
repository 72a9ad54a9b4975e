// attnkit::softmax_attention at the edges of its inputs, against attnkit::reference (the
// sweeps and layouts are softmax_attention_test.cpp, with the tolerances its header comment
// derives):
//   logits of magnitude 1e4 (and equal logits of +-1e4): the online softmax stays normalised;
//   NaN or Inf in one key, value or query row stays in the rows that see it; NaN garbage past
//   key_lengths is never read; fully masked rows give zeros and lse = -inf; a window or chunk
//   longer than the keys means unlimited; a subnormal softcap or a huge scale is rejected.
#include "attnkit/softmax_attention.hpp"

#include "attnkit/reference/softmax_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/softmax_checks.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::softmax_options;
using attnkit::view;
using namespace attnkit_test;

// ---- extreme inputs ------------------------------------------------------------------------

// Largest |scale * <q_i, k_j>| over every pair a query head and its key/value head form.
double max_abs_score(const tensor4<float>& q, const tensor4<float>& k, float scale) {
    const index_t B = q.dimension(0), Lq = q.dimension(1), H = q.dimension(2), D = q.dimension(3);
    const index_t Lk = k.dimension(1), Hk = k.dimension(2), G = H / Hk;
    double m = 0.0;
    for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < H; ++h)
            for (index_t i = 0; i < Lq; ++i)
                for (index_t j = 0; j < Lk; ++j) {
                    double s = 0.0;
                    for (index_t d = 0; d < D; ++d)
                        s += double(q(b, i, h, d)) * double(k(b, j, h / G, d));
                    m = std::max(m, std::fabs(scale * s));
                }
    return m;
}

TEST(softmax_attention, logits_of_magnitude_1e4) {
    struct cfg {
        index_t B, Lq, Lk, H, Hk, D;
        bool causal;
        float softcap;
    };
    for (const cfg& g :
         {cfg{2, 129, 129, 4, 2, 64, true, 0.0f}, cfg{2, 1, 300, 4, 2, 64, false, 0.0f},
          cfg{1, 1, 2000, 2, 1, 32, false, 0.0f}, cfg{1, 70, 70, 2, 2, 16, false, 0.0f},
          cfg{2, 65, 65, 4, 1, 48, true, 5000.0f}}) {
        SCOPED_TRACE(::testing::Message()
                     << "Lq " << g.Lq << " Lk " << g.Lk << " softcap " << g.softcap);
        tensor4<float> q = random_bshd(g.B, g.Lq, g.H, g.D, distribution::gaussian, 91);
        tensor4<float> k = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::gaussian, 92);
        const tensor4<float> v = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::gaussian, 93);
        softmax_options o;
        o.causal = g.causal;
        o.softcap = g.softcap;
        // Scale q and k together so that the largest |score| is 1e4.
        const double f = std::sqrt(1e4 / max_abs_score(q, k, resolved_scale(o, g.D)));
        q = q * static_cast<float>(f);
        k = k * static_cast<float>(f);
        const double smax = max_abs_score(q, k, resolved_scale(o, g.D));
        ASSERT_GT(smax, 0.9e4);
        ASSERT_LT(smax, 1.1e4);

        const fast_result got = run_fast(q, k, v, o);
        const ref_result want = run_reference(q, k, v, o);
        for (index_t i = 0; i < got.out.size(); ++i)
            ASSERT_TRUE(std::isfinite(got.out.data()[i])) << i;
        for (index_t i = 0; i < got.lse.size(); ++i)
            ASSERT_TRUE(std::isfinite(got.lse.data()[i])) << i;
        // A score of 1e4 rounds to float with an absolute error of ~1e-3, which moves the weights
        // by a relative ~1e-3: the tolerance scales with the logit magnitude.
        EXPECT_TRUE(all_close(got.out, want.out, out_tolerance(q, k, v, o))) << "out";
        EXPECT_TRUE(all_close(got.lse, want.lse, lse_tolerance(q, k, o))) << "lse";
        // ... and with the actual logit magnitude 1e4 instead of the Cauchy-Schwarz bound.
        EXPECT_TRUE(all_close(got.out, want.out, tolerance_for(kOutEps, max_abs(v) * (1.0 + smax))))
            << "out (1e4)";
        EXPECT_TRUE(all_close(got.lse, want.lse, tolerance_for(kLseEps, 1.0 + smax)))
            << "lse (1e4)";
    }
}

// Values near FLT_MAX: the output is a convex combination of them, representable, while the
// unnormalised sum over keys (weights up to 1 each) is not. Rows whose output overflowed are
// computed again with their weights scaled down by a power of two (exactly); the other rows keep
// their bits. Row kernel (Lq = 1), tile kernel (Lq = 40), split-KV (Lk = 3000), sinks.
TEST(softmax_attention, values_near_float_max_stay_finite) {
    struct cfg {
        index_t Lq, Lk, H;
        bool sinks;
    };
    const float big = std::numeric_limits<float>::max() / 2;
    for (const cfg& g : {cfg{1, 2, 1, false}, cfg{40, 2, 2, false}, cfg{1, 3000, 1, false}, cfg{3, 700, 2, true},
                         cfg{40, 300, 2, true}}) {
        SCOPED_TRACE(::testing::Message() << "Lq " << g.Lq << " Lk " << g.Lk << " sinks " << g.sinks);
        const index_t D = 8, Dv = 5;
        tensor4<float> q = random_bshd(1, g.Lq, g.H, D, distribution::gaussian, 95);
        tensor4<float> k = random_bshd(1, g.Lk, g.H, D, distribution::gaussian, 96);
        tensor4<float> v = random_bshd(1, g.Lk, g.H, Dv, distribution::uniform, 97);
        q = q * 0.01f;  // nearly equal weights: the sum over keys is ~Lk times the values
        for (index_t i = 0; i < v.size(); ++i) v.data()[i] = big * (1.5f + 0.25f * v.data()[i]);  // 1.25 .. 1.75 x
        softmax_options o;
        if (g.sinks) o.sinks.assign(static_cast<std::size_t>(g.H), -3.0f);
        const fast_result got = run_fast(q, k, v, o);
        const ref_result want = run_reference(q, k, v, o);
        for (index_t i = 0; i < got.out.size(); ++i) ASSERT_TRUE(std::isfinite(got.out.data()[i])) << i;
        EXPECT_TRUE(all_close(got.out, want.out, tolerance_for(kOutEps, max_abs(v)))) << "out";
        EXPECT_TRUE(all_close(got.lse, want.lse, lse_tolerance(q, k, o))) << "lse";
    }
}

TEST(softmax_attention, equal_logits_of_plus_and_minus_1e4) {
    // Every key is the same vector u, q = +-c u: a row's scores all equal +-1e4, so the weights
    // are exactly uniform and lse = +-1e4 + log(Lk). Checks exp underflow of exp(-1e4) handling.
    for (index_t Lq : {1, 3, 40}) {
        const index_t B = 1, Lk = 150, H = 2, D = 16;
        std::vector<double> u = random_values(D, distribution::gaussian, 95);
        double norm2 = 0.0;
        for (double x : u) norm2 += x * x;
        const double scale = 1.0 / 4.0;  // default for D = 16
        tensor4<float> q(B, Lq, H, D), k(B, Lk, 1, D);
        for (index_t j = 0; j < Lk; ++j)
            for (index_t d = 0; d < D; ++d) k(0, j, 0, d) = static_cast<float>(u[d]);
        for (index_t i = 0; i < Lq; ++i)
            for (index_t h = 0; h < H; ++h)
                for (index_t d = 0; d < D; ++d)
                    q(0, i, h, d) =
                        static_cast<float>((h == 0 ? 1.0 : -1.0) * 1e4 / (scale * norm2) * u[d]);
        const tensor4<float> v = random_bshd(B, Lk, 1, 8, distribution::uniform, 96);
        const fast_result got = run_fast(q, k, v, softmax_options{});
        const ref_result want = run_reference(q, k, v, softmax_options{});
        EXPECT_TRUE(all_close(got.out, want.out, tolerance_for(kOutEps, max_abs(v))));
        EXPECT_TRUE(all_close(got.lse, want.lse, tolerance_for(kLseEps, 1e4)));
        EXPECT_NEAR(1e4 + std::log(double(Lk)), got.lse(0, 0, 0), tolerance_for(kLseEps, 1e4).atol);
        EXPECT_NEAR(-1e4 + std::log(double(Lk)), got.lse(0, 0, 1),
                    tolerance_for(kLseEps, 1e4).atol);
    }
}

// A NaN in one key (or value) row of head hk, batch b: rows that cannot see it equal the clean
// run bitwise; rows that see it are NaN (at least not finite): every element and lse for a NaN
// key (the score is NaN), the poisoned column for a NaN value (scores and lse stay clean).
void check_nan_isolation(index_t B, index_t Lq, index_t Lk, index_t H, index_t Hk, index_t D,
                         softmax_options o, index_t bad_b, index_t bad_j, index_t bad_hk,
                         bool in_value, bool some_row_sees = true, float bad_value = kNaN) {
    SCOPED_TRACE(::testing::Message()
                 << bad_value << (in_value ? " in v" : " in k") << ": B " << B << " Lq " << Lq
                 << " Lk " << Lk << " H " << H << " Hk " << Hk << " key " << bad_j);
    const tensor4<float> q = random_bshd(B, Lq, H, D, distribution::gaussian, 101);
    tensor4<float> k = random_bshd(B, Lk, Hk, D, distribution::gaussian, 102);
    tensor4<float> v = random_bshd(B, Lk, Hk, D, distribution::gaussian, 103);
    const fast_result clean = run_fast(q, k, v, o);
    const index_t bad_c = D / 2;
    (in_value ? v : k)(bad_b, bad_j, bad_hk, bad_c) = bad_value;
    const fast_result dirty = run_fast(q, k, v, o);
    const ref_result want = run_reference(q, k, v, o);

    const index_t G = H / Hk;
    index_t n_seeing = 0, n_clean = 0, bad_rows = 0;
    for (index_t b = 0; b < B; ++b) {
        const index_t len = o.key_lengths.empty() ? Lk : o.key_lengths[b];
        for (index_t i = 0; i < Lq; ++i)
            for (index_t h = 0; h < H; ++h) {
                const bool hit = b == bad_b && h / G == bad_hk && sees(o, Lq, Lk, i, bad_j, len);
                bool ok = true;
                for (index_t c = 0; c < D; ++c) {
                    const bool poisoned = hit && (!in_value || c == bad_c);
                    const float x = dirty.out(b, i, h, c), y = clean.out(b, i, h, c);
                    if (poisoned)
                        ok = ok && !std::isfinite(x);
                    else if (!hit)
                        ok = ok && std::memcmp(&x, &y, sizeof x) == 0;
                    // The reference agrees on which elements are poisoned.
                    ok = ok && !std::isfinite(want.out(b, i, h, c)) == poisoned;
                }
                const float lx = dirty.lse(b, i, h), ly = clean.lse(b, i, h);
                if (hit && !in_value)
                    ok = ok && !std::isfinite(lx);
                else if (!hit)
                    ok = ok && std::memcmp(&lx, &ly, sizeof lx) == 0;
                if (!ok && ++bad_rows <= 5)
                    ADD_FAILURE() << "row b " << b << " i " << i << " h " << h
                                  << (hit ? " sees" : " does not see") << " the NaN; out[" << bad_c
                                  << "] " << dirty.out(b, i, h, bad_c) << " (clean "
                                  << clean.out(b, i, h, bad_c) << "), out[0] "
                                  << dirty.out(b, i, h, 0) << " (clean " << clean.out(b, i, h, 0)
                                  << "), lse " << lx << " (clean " << ly << ")";
                (hit ? n_seeing : n_clean)++;
            }
    }
    EXPECT_EQ(0, bad_rows) << "rows wrong";
    EXPECT_EQ(some_row_sees, n_seeing > 0);
    EXPECT_GT(n_clean, 0);
}

TEST(softmax_attention, nan_in_a_key_row_affects_only_rows_that_see_it) {
    softmax_options causal;
    causal.causal = true;
    check_nan_isolation(2, 129, 129, 4, 2, 32, causal, 1, 60, 1, false);    // tile kernel
    check_nan_isolation(2, 300, 300, 2, 1, 16, causal, 0, 5, 0, false);     // two query blocks
    check_nan_isolation(1, 4, 200, 4, 2, 16, causal, 0, 198, 0, false);     // row kernel
    check_nan_isolation(1, 4, 3000, 2, 1, 48, causal, 0, 2998, 0, false);   // row kernel, split-KV
    check_nan_isolation(1, 64, 1100, 1, 1, 32, causal, 0, 1060, 0, false);  // tile kernel, split-KV
    softmax_options window;
    window.window_left = 5;
    check_nan_isolation(2, 65, 65, 4, 4, 16, window, 0, 20, 3, false);
    softmax_options kl;
    kl.key_lengths = {30, 65};
    check_nan_isolation(2, 1, 65, 8, 1, 64, kl, 0, 40, 0, false, false);  // masked by key_lengths
    check_nan_isolation(2, 1, 65, 8, 1, 64, kl, 1, 40, 0, false);
}

// docs/design.md: "NaN or Inf in the inputs propagate to the affected rows only". A NaN (or Inf)
// value row must not leak into rows whose weight for that key is 0 because of the mask.
//
//
// The tile kernel multiplies a whole V tile by every row's probabilities, so a row that the mask
// excludes from key j would compute 0 * NaN = NaN; it guards zeros in partially masked panels
// over tiles with non-finite values. Reproducer of the original bug: B = H = Hk = D = Dv = 1,
// Lq = Lk = 9, causal, q = k = 0, v = 3 except v[0, 8, 0, 0] = NaN: queries 0..7 must give 3.
// Cases marked "row / tile" take the tile kernel on SSE2 and scalar builds only.
TEST(softmax_attention, nan_in_a_value_row_affects_only_rows_that_see_it) {
    softmax_options causal;
    causal.causal = true;
    softmax_options window;
    window.window_left = 5;
    const float inf = std::numeric_limits<float>::infinity();
    check_nan_isolation(2, 129, 129, 4, 2, 32, causal, 1, 60, 1, true);             // tile
    check_nan_isolation(2, 65, 65, 4, 4, 16, window, 0, 20, 3, true);               // tile
    check_nan_isolation(2, 100, 100, 2, 1, 16, causal, 0, 70, 0, true, true, inf);  // tile
    check_nan_isolation(1, 4, 200, 4, 2, 16, causal, 0, 198, 0, true);              // row / tile
    check_nan_isolation(1, 4, 3000, 2, 1, 48, causal, 0, 2998, 0, true);  // row / tile, split-KV
    check_nan_isolation(1, 4, 200, 4, 2, 16, causal, 0, 198, 0, true, true, inf);  // row / tile
    // One row per item (Lq = G = 1, the row kernel on every build): the key outside the window
    // is never even loaded; the last case checks that a seen NaN does reach the split-KV merge.
    softmax_options w100;
    w100.window_left = 100;
    check_nan_isolation(2, 1, 200, 2, 2, 16, w100, 0, 60, 1, true, false);          // row
    check_nan_isolation(2, 1, 3000, 2, 2, 16, w100, 1, 2880, 0, true, false);       // row, split-KV
    check_nan_isolation(2, 1, 3000, 2, 2, 16, w100, 1, 2880, 0, true, false, inf);  // row, split-KV
    check_nan_isolation(2, 1, 3000, 2, 2, 16, w100, 1, 2950, 0, true);  // row, split-KV, seen
}

// A NaN in one query row poisons that row only (rows share K/V loads and score tiles).
TEST(softmax_attention, nan_in_a_query_row_affects_only_that_row) {
    struct cfg {
        index_t Lq, Lk, H, Hk;
    };
    for (const cfg& g :
         {cfg{40, 100, 4, 2}, cfg{2, 300, 4, 1}, cfg{1, 2000, 8, 2}, cfg{300, 300, 1, 1}}) {
        SCOPED_TRACE(::testing::Message()
                     << "Lq " << g.Lq << " Lk " << g.Lk << " H " << g.H << " Hk " << g.Hk);
        const index_t B = 2, D = 32;
        tensor4<float> q = random_bshd(B, g.Lq, g.H, D, distribution::gaussian, 151);
        const tensor4<float> k = random_bshd(B, g.Lk, g.Hk, D, distribution::gaussian, 152);
        const tensor4<float> v = random_bshd(B, g.Lk, g.Hk, D, distribution::gaussian, 153);
        softmax_options o;
        o.causal = true;
        const fast_result clean = run_fast(q, k, v, o);
        const index_t bi = 1, bh = g.H - 1, bq = g.Lq / 2;
        q(bi, bq, bh, 3) = kNaN;
        const fast_result dirty = run_fast(q, k, v, o);
        for (index_t b = 0; b < B; ++b)
            for (index_t i = 0; i < g.Lq; ++i)
                for (index_t h = 0; h < g.H; ++h) {
                    const bool hit = b == bi && i == bq && h == bh;
                    for (index_t c = 0; c < D; ++c) {
                        const float x = dirty.out(b, i, h, c), y = clean.out(b, i, h, c);
                        if (hit) {
                            ASSERT_TRUE(std::isnan(x)) << c;
                        } else {
                            ASSERT_EQ(0, std::memcmp(&x, &y, sizeof x))
                                << b << " " << i << " " << h << " " << c;
                        }
                    }
                    if (hit) {
                        ASSERT_TRUE(std::isnan(dirty.lse(b, i, h)));
                    }
                }
    }
}

// A KV cache whose unused tail (j >= key_lengths[b]) holds NaN garbage: nothing reads it.
TEST(softmax_attention, nan_garbage_past_key_lengths_is_never_read) {
    struct cfg {
        index_t Lq, Lk, H, Hk;
        bool causal;
    };
    for (const cfg& g :
         {cfg{1, 300, 8, 2, false}, cfg{3, 300, 2, 1, true}, cfg{60, 300, 4, 2, true},
          cfg{1, 3000, 4, 1, false}, cfg{300, 300, 2, 2, false}}) {
        SCOPED_TRACE(::testing::Message()
                     << "Lq " << g.Lq << " Lk " << g.Lk << " H " << g.H << " Hk " << g.Hk);
        const index_t B = 2, D = 32;
        const tensor4<float> q = random_bshd(B, g.Lq, g.H, D, distribution::gaussian, 131);
        tensor4<float> k = random_bshd(B, g.Lk, g.Hk, D, distribution::gaussian, 132);
        tensor4<float> v = random_bshd(B, g.Lk, g.Hk, D, distribution::gaussian, 133);
        softmax_options o;
        o.causal = g.causal;
        o.key_lengths = {g.Lk / 2 + 1, 0};
        const fast_result clean = run_fast(q, k, v, o);
        for (index_t b = 0; b < B; ++b)
            for (index_t j = o.key_lengths[b]; j < g.Lk; ++j)
                for (index_t h = 0; h < g.Hk; ++h)
                    for (index_t d = 0; d < D; ++d) k(b, j, h, d) = v(b, j, h, d) = kNaN;
        const fast_result dirty = run_fast(q, k, v, o);
        EXPECT_TRUE(same_bytes(dirty.out, clean.out));
        EXPECT_TRUE(same_bytes(dirty.lse, clean.lse));
    }
}

TEST(softmax_attention, fully_masked_rows_give_zeros_and_minus_inf) {
    struct cfg {
        const char* what;
        index_t B, Lq, Lk, H, Hk, D;
        softmax_options o;
    };
    softmax_options kl0;
    kl0.key_lengths = {0, 50};
    softmax_options kl0_split;
    kl0_split.key_lengths = {0, 1000};
    softmax_options causal;
    causal.causal = true;
    softmax_options chunk_kl;  // rows past the first chunk see nothing below key_lengths = 5
    chunk_kl.chunk = 16;
    chunk_kl.key_lengths = {5};
    softmax_options window_kl;
    window_kl.causal = true;
    window_kl.window_left = 3;
    window_kl.key_lengths = {10, 70};
    cfg cases[] = {
        {"key_lengths 0, tile", 2, 70, 50, 4, 2, 32, kl0},
        {"key_lengths 0, row", 2, 2, 50, 4, 2, 32, kl0},
        {"key_lengths 0, split-KV", 2, 1, 2000, 4, 4, 32, kl0_split},
        {"Lq > Lk causal, tile", 2, 100, 40, 4, 2, 32, causal},
        {"Lq > Lk causal, row", 2, 5, 2, 2, 1, 16, causal},
        {"chunk past key_lengths", 1, 64, 64, 2, 2, 16, chunk_kl},
        {"window past key_lengths", 2, 70, 70, 4, 1, 16, window_kl},
    };
    for (cfg& g : cases) {
        SCOPED_TRACE(g.what);
        const tensor4<float> q = random_bshd(g.B, g.Lq, g.H, g.D, distribution::outliers, 111);
        const tensor4<float> k = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::outliers, 112);
        const tensor4<float> v = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::outliers, 113);
        for (bool with_sinks : {false, true}) {
            softmax_options o = g.o;
            if (with_sinks) o.sinks = random_sinks(g.H, 114);
            const fast_result got = run_fast(q, k, v, o);
            index_t empty_rows = 0;
            for (index_t b = 0; b < g.B; ++b) {
                const index_t len = o.key_lengths.empty() ? g.Lk : o.key_lengths[b];
                for (index_t i = 0; i < g.Lq; ++i) {
                    bool any = false;
                    for (index_t j = 0; j < g.Lk; ++j) any = any || sees(o, g.Lq, g.Lk, i, j, len);
                    if (any) continue;
                    for (index_t h = 0; h < g.H; ++h) {
                        ++empty_rows;
                        for (index_t c = 0; c < g.D; ++c)
                            ASSERT_EQ(0.0f, got.out(b, i, h, c)) << b << " " << i << " " << h;
                        // With a sink the row's only term is the sink: lse = sink (and zero
                        // output).
                        const float want_lse = with_sinks ? o.sinks[h] : kNegInfF;
                        ASSERT_EQ(want_lse, got.lse(b, i, h)) << b << " " << i << " " << h;
                    }
                }
            }
            EXPECT_GT(empty_rows, 0);
            for (index_t i = 0; i < got.out.size(); ++i)
                ASSERT_FALSE(std::isnan(got.out.data()[i]));
            for (index_t i = 0; i < got.lse.size(); ++i)
                ASSERT_FALSE(std::isnan(got.lse.data()[i]));
            const ref_result want = run_reference(q, k, v, o);
            EXPECT_TRUE(all_close(got.out, want.out, out_tolerance(q, k, v, o)));
            EXPECT_TRUE(all_close(got.lse, want.lse, lse_tolerance(q, k, o)));
        }
    }
}

// Inf in a key row: whatever the rows that see it get, the others equal the clean run bitwise.
TEST(softmax_attention, inf_in_a_key_row_leaves_other_rows_alone) {
    const index_t B = 1, L = 100, H = 2, D = 16;
    const tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 121);
    tensor4<float> k = random_bshd(B, L, 1, D, distribution::gaussian, 122);
    const tensor4<float> v = random_bshd(B, L, 1, D, distribution::gaussian, 123);
    softmax_options o;
    o.causal = true;
    const fast_result clean = run_fast(q, k, v, o);
    k(0, 50, 0, 3) = std::numeric_limits<float>::infinity();
    const fast_result dirty = run_fast(q, k, v, o);
    for (index_t i = 0; i < 50; ++i)
        for (index_t h = 0; h < H; ++h) {
            for (index_t c = 0; c < D; ++c)
                ASSERT_EQ(clean.out(0, i, h, c), dirty.out(0, i, h, c)) << i;
            ASSERT_EQ(clean.lse(0, i, h), dirty.lse(0, i, h)) << i;
        }
}

// A NaN value row of a key the row does see propagates even when that key's weight rounds to 0
// in float (its score far below the row's max): the reference computes 0 * NaN = NaN as well.
// Lq = 1 takes the row kernel, Lq = 40 the tile kernel (both partially masked and full panels).
TEST(softmax_attention, nan_value_of_a_visible_key_propagates_at_zero_weight) {
    for (index_t Lq : {1, 40}) {
        SCOPED_TRACE(::testing::Message() << "Lq " << Lq);
        const index_t Lk = 50, D = 4;
        tensor4<float> q = make_bshd<float>(1, Lq, 1, D, 0.0f);
        tensor4<float> k = make_bshd<float>(1, Lk, 1, D, 0.0f);
        tensor4<float> v = random_bshd(1, Lk, 1, D, distribution::uniform, 501);
        for (index_t i = 0; i < Lq; ++i) q(0, i, 0, 0) = 20.0f;
        k(0, 0, 0, 0) = -20.0f;  // key 0 scores -200 below the others: exp underflows in float
        v(0, 0, 0, 1) = kNaN;
        softmax_options o;
        o.causal = true;
        const fast_result f = run_fast(q, k, v, o);
        const ref_result r = run_reference(q, k, v, o);
        for (index_t i = 0; i < Lq; ++i) {
            EXPECT_TRUE(std::isnan(r.out(0, i, 0, 1))) << "reference, row " << i;
            EXPECT_TRUE(std::isnan(f.out(0, i, 0, 1))) << "row " << i << " sees key 0";
            EXPECT_FALSE(std::isnan(f.out(0, i, 0, 0))) << "row " << i << ", other columns stay finite";
        }
    }
}

// Windows and chunks longer than every position behave as "unlimited", whatever their value.
TEST(softmax_attention, huge_window_and_chunk_mean_unlimited) {
    const auto q = random_bshd(1, 9, 2, 8, distribution::gaussian, 511);
    const auto k = random_bshd(1, 5, 2, 8, distribution::gaussian, 512);
    const auto v = random_bshd(1, 5, 2, 8, distribution::gaussian, 513);
    softmax_options plain;
    const fast_result expected = run_fast(q, k, v, plain);
    softmax_options wide;
    wide.window_left = std::numeric_limits<std::int64_t>::max();
    const fast_result got = run_fast(q, k, v, wide);
    EXPECT_TRUE(all_close(got.out, expected.out, 0.0, 0.0));
    const ref_result ref = run_reference(q, k, v, wide);
    EXPECT_TRUE(all_close(got.out, ref.out, 1e-5, 1e-5));

    softmax_options causal;
    causal.causal = true;
    softmax_options chunked = causal;
    chunked.chunk = std::numeric_limits<std::int64_t>::max();
    EXPECT_TRUE(all_close(run_fast(q, k, v, chunked).out, run_fast(q, k, v, causal).out, 0.0, 0.0));
}

// Option values that pass a naive range check but would overflow inside the kernel.
TEST(softmax_attention, rejects_subnormal_softcap_and_huge_scale) {
    const auto q = random_bshd(1, 3, 1, 4, distribution::gaussian, 521);
    const auto k = random_bshd(1, 3, 1, 4, distribution::gaussian, 522);
    auto out = make_bshd<float>(1, 3, 1, 4, 7.0f);
    softmax_options o;
    o.softcap = 1e-40f;
    EXPECT_THROW(attnkit::softmax_attention(q, k, k, out, o), std::invalid_argument);
    o = {};
    o.scale = 3e38f;
    EXPECT_THROW(attnkit::softmax_attention(q, k, k, out, o), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(out, 7.0f));
}

}  // namespace
