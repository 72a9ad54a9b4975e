// detail::taylor::linear_forward (the chunked linear form) against the quadratic oracle.
//
// Sweep (docs/design.md quality bar): lengths around the lane width W and the chunk size (64),
// Lq != Lk both ways (bottom-right causal), GQA ratios 1, 2, 4, causal and not, key_lengths
// including 0, three input distributions. Tolerance per output row: the float error of a sum
// of feature products is eps times the sum of their magnitudes, which for row i is
// max|v| * mean over its visible keys of (1 + (|q~_i|·|k~_j|)^2) with |q~| = [scale |q|, 1]
// (element-wise absolute values), times a small multiple for the reduction lengths.
#include "attnkit/detail/taylor/linear.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attnkit/detail/taylor/check.hpp"
#include "attnkit/reference/taylor_attention.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::taylor_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;
using arch = attnkit::simd::default_arch;

tensor4<float> run_linear(const tensor4<float>& q, const tensor4<float>& k, const tensor4<float>& v,
                          const taylor_options& o, float fill_value = 7.0f) {
    tensor4<float> out = make_bshd<float>(q.dimension(0), q.dimension(1), q.dimension(2), v.dimension(3), fill_value);
    const attnkit::view<const float, 4> qv(q), kv(k), vv(v);
    const attnkit::view<float, 4> ov(out);
    attnkit::detail::taylor::check_call(qv, kv, vv, ov, o);  // the public entry point's job
    attnkit::detail::taylor::linear_forward<arch>(qv, kv, vv, ov, o);
    return out;
}

// Checks every element of out against expected (double) with the per-row tolerance above.
// expected covers the last expected.dim(1) rows of out (a bottom-right slice).
::testing::AssertionResult rows_close(const tensor4<float>& out, const tensor4<double>& expected, const tensor4<float>& q,
                                      const tensor4<float>& k, const tensor4<float>& v, const taylor_options& o,
                                      double eps_multiple) {
    const index_t B = out.dimension(0), Lq = q.dimension(1), Lk = k.dimension(1), H = q.dimension(2);
    const index_t Hk = k.dimension(2), D = q.dimension(3), Dv = v.dimension(3), n_rows = expected.dimension(1);
    const double scale = static_cast<double>(attnkit::detail::resolve_scale(o.scale, D));
    const double vmax = max_abs(v);
    index_t bad = 0;
    double worst = 0.0;
    std::string first;
    for (index_t b = 0; b < B; ++b) {
        const index_t len = o.key_lengths.empty() ? Lk : o.key_lengths[static_cast<std::size_t>(b)];
        for (index_t r = 0; r < n_rows; ++r) {
            const index_t i = Lq - n_rows + r, pos = i + Lk - Lq;
            const index_t n = std::max<index_t>(0, o.causal ? std::min(pos + 1, len) : len);
            for (index_t h = 0; h < H; ++h) {
                const index_t kvh = h / (H / Hk);
                double mag = 0.0;
                for (index_t j = 0; j < n; ++j) {
                    double dot = 1.0;
                    for (index_t d = 0; d < D; ++d) dot += scale * std::fabs(q(b, i, h, d)) * std::fabs(k(b, j, kvh, d));
                    mag += 1.0 + dot * dot;
                }
                mag = n > 0 ? vmax * mag / static_cast<double>(n) : 0.0;
                const double tol = eps_multiple * kEpsFloat * mag;
                for (index_t d = 0; d < Dv; ++d) {
                    const double a = out(b, i, h, d), e = expected(b, r, h, d), err = std::fabs(a - e);
                    if (n == 0 ? a != 0.0 : !(err <= tol)) {
                        if (bad++ == 0)
                            first = "at [" + std::to_string(b) + ", " + std::to_string(i) + ", " + std::to_string(h) +
                                    ", " + std::to_string(d) + "]: got " + std::to_string(a) + ", expected " +
                                    std::to_string(e) + ", allowed " + std::to_string(tol);
                    }
                    if (tol > 0.0) worst = std::max(worst, err / tol);
                }
            }
        }
    }
    if (bad == 0) return ::testing::AssertionSuccess() << "worst error / tolerance " << worst;
    return ::testing::AssertionFailure() << bad << " elements differ; first " << first << "; worst error / tolerance "
                                         << worst;
}

struct shape {
    index_t B, Lq, Lk, H, Hk, D, Dv;
};

void check_case(const shape& c, distribution dist, bool causal, std::vector<std::int64_t> key_lengths,
                float scale = 0.0f) {
    SCOPED_TRACE(::testing::Message() << dist << " B " << c.B << " Lq " << c.Lq << " Lk " << c.Lk << " H " << c.H
                                      << " Hk " << c.Hk << " D " << c.D << " Dv " << c.Dv
                                      << (causal ? " causal" : "") << (key_lengths.empty() ? "" : " key_lengths"));
    const std::uint64_t seed = static_cast<std::uint64_t>(c.Lq * 131 + c.Lk * 7 + c.D * 3 + c.Dv);
    const auto q = random_bshd<float>(c.B, c.Lq, c.H, c.D, dist, seed);
    const auto k = random_bshd<float>(c.B, c.Lk, c.Hk, c.D, dist, seed + 1);
    const auto v = random_bshd<float>(c.B, c.Lk, c.Hk, c.Dv, dist, seed + 2);
    taylor_options o;
    o.causal = causal;
    o.key_lengths = std::move(key_lengths);
    o.scale = scale;
    const tensor4<float> out = run_linear(q, k, v, o);
    tensor4<double> expected = make_bshd<double>(c.B, c.Lq, c.H, c.Dv);
    ref::taylor_attention(q, k, v, expected, o);
    EXPECT_TRUE(rows_close(out, expected, q, k, v, o, 16));
}

TEST(taylor_linear, sweep_lengths_dims_masks) {
    const index_t lengths[] = {1, 7, 8, 9, 17, 63, 64, 65, 129, 197};
    for (const distribution dist : kAllDistributions)
        for (const index_t L : lengths)
            for (const bool causal : {false, true}) {
                check_case({1, L, L, 2, 1, 8, 9}, dist, causal, {});
                check_case({2, L, L, 4, 4, 17, 8}, dist, causal, {L, L / 2});
            }
}

TEST(taylor_linear, sweep_dims_around_lanes) {
    const index_t dims[] = {1, 3, 7, 8, 9, 16, 17, 33, 64};
    for (const index_t D : dims)
        for (const index_t Dv : {index_t(1), D, index_t(34)})
            for (const bool causal : {false, true}) check_case({1, 70, 70, 2, 2, D, Dv}, distribution::gaussian, causal, {});
}

TEST(taylor_linear, lq_differs_from_lk_and_gqa) {
    for (const distribution dist : kAllDistributions)
        for (const bool causal : {false, true}) {
            check_case({1, 5, 200, 4, 1, 16, 16}, dist, causal, {});    // chunked prefill against a cache
            check_case({1, 1, 131, 4, 2, 16, 16}, dist, causal, {});    // decode
            check_case({2, 150, 70, 4, 4, 8, 5}, dist, causal, {});     // Lq > Lk: early rows see nothing
            check_case({2, 67, 133, 8, 2, 9, 12}, dist, causal, {0, 100});  // key_lengths 0: zeros
            check_case({1, 66, 66, 3, 1, 12, 7}, dist, causal, {}, 0.7f);
        }
}

// Extreme but finite scores: w = 1 + s + s^2/2 reaches 1e7; still finite and accurate.
TEST(taylor_linear, large_scores) {
    auto q = random_bshd<float>(1, 40, 1, 8, distribution::gaussian, 5);
    auto k = random_bshd<float>(1, 40, 1, 8, distribution::gaussian, 6);
    const auto v = random_bshd<float>(1, 40, 1, 8, distribution::gaussian, 7);
    taylor_options o;
    o.causal = true;
    o.scale = 1000.0f;
    const tensor4<float> out = run_linear(q, k, v, o);
    tensor4<double> expected = make_bshd<double>(1, 40, 1, 8);
    ref::taylor_attention(q, k, v, expected, o);
    EXPECT_TRUE(rows_close(out, expected, q, k, v, o, 16));
}

// Many chunks and several segments (B = 1, Hk = 1): the form that multi-threading splits.
TEST(taylor_linear, equals_quadratic_reference_at_4096) {
    const index_t L = 4096, D = 64;
    const auto q = random_bshd<float>(1, L, 1, D, distribution::gaussian, 21);
    const auto k = random_bshd<float>(1, L, 1, D, distribution::gaussian, 22);
    const auto v = random_bshd<float>(1, L, 1, D, distribution::gaussian, 23);
    taylor_options o;
    o.causal = true;
    const tensor4<float> out = run_linear(q, k, v, o);
    tensor4<double> expected = make_bshd<double>(1, L, 1, D);
    ref::taylor_attention(q, k, v, expected, o);
    EXPECT_TRUE(rows_close(out, expected, q, k, v, o, 16));
}

// At L = 16384 the last rows have the longest state accumulation; the oracle computes just those
// (bottom-right causal: a q of the last 24 rows against all keys).
TEST(taylor_linear, accumulation_stays_accurate_at_16384) {
    const index_t L = 16384, D = 64, n_rows = 24;
    for (const bool causal : {true, false}) {
        const auto q = random_bshd<float>(1, L, 1, D, distribution::uniform, 31);
        const auto k = random_bshd<float>(1, L, 1, D, distribution::uniform, 32);
        const auto v = random_bshd<float>(1, L, 1, D, distribution::uniform, 33);
        taylor_options o;
        o.causal = causal;
        const tensor4<float> out = run_linear(q, k, v, o);
        tensor4<float> q_last(1, n_rows, 1, D);
        for (index_t r = 0; r < n_rows; ++r)
            for (index_t d = 0; d < D; ++d) q_last(0, r, 0, d) = q(0, L - n_rows + r, 0, d);
        tensor4<double> expected = make_bshd<double>(1, n_rows, 1, D);
        ref::taylor_attention(q_last, k, v, expected, o);
        EXPECT_TRUE(rows_close(out, expected, q, k, v, o, 16)) << (causal ? "causal" : "not causal");
    }
}

// Bitwise identical results for 1, 2 and 3 threads, with segments (one head) and without.
TEST(taylor_linear, thread_count_determinism) {
    for (const shape c : {shape{1, 700, 700, 1, 1, 16, 16}, shape{2, 300, 333, 6, 3, 8, 9}})
        for (const bool causal : {false, true}) {
            const auto q = random_bshd<float>(c.B, c.Lq, c.H, c.D, distribution::gaussian, 41);
            const auto k = random_bshd<float>(c.B, c.Lk, c.Hk, c.D, distribution::gaussian, 42);
            const auto v = random_bshd<float>(c.B, c.Lk, c.Hk, c.Dv, distribution::gaussian, 43);
            taylor_options o;
            o.causal = causal;
            const tensor4<float> one = run_linear(q, k, v, o);
            for (std::size_t n : {2u, 3u}) {
                attnkit::thread_pool pool(n);
                o.pool = &pool;
                const tensor4<float> many = run_linear(q, k, v, o);
                EXPECT_EQ(0, std::memcmp(one.data(), many.data(), sizeof(float) * static_cast<std::size_t>(one.size())))
                    << n << " threads, " << (causal ? "causal" : "not causal");
            }
        }
}

// [B, H, L, D] buffers seen as BSHD through strided views: same bits as dense tensors.
TEST(taylor_linear, strided_views) {
    const index_t B = 2, L = 90, H = 4, Hk = 2, D = 12;
    for (const bool causal : {false, true}) {
        const auto q = random_bshd<float>(B, L, H, D, distribution::gaussian, 61);
        const auto k = random_bshd<float>(B, L, Hk, D, distribution::gaussian, 62);
        const auto v = random_bshd<float>(B, L, Hk, D, distribution::gaussian, 63);
        std::vector<float> qb(static_cast<std::size_t>(q.size())), kb(static_cast<std::size_t>(k.size())),
            vb(static_cast<std::size_t>(v.size())), ob(static_cast<std::size_t>(q.size()), 7.0f);
        const auto qs = bhld_as_bshd(qb.data(), B, H, L, D), ks = bhld_as_bshd(kb.data(), B, Hk, L, D);
        const auto vs = bhld_as_bshd(vb.data(), B, Hk, L, D), os = bhld_as_bshd(ob.data(), B, H, L, D);
        for_each_index<4>(qs.dims, [&](const std::array<index_t, 4>& i) { at(qs, i) = q(i[0], i[1], i[2], i[3]); });
        for_each_index<4>(ks.dims, [&](const std::array<index_t, 4>& i) {
            at(ks, i) = k(i[0], i[1], i[2], i[3]);
            at(vs, i) = v(i[0], i[1], i[2], i[3]);
        });
        taylor_options o;
        o.causal = causal;
        const tensor4<float> dense = run_linear(q, k, v, o);
        attnkit::detail::taylor::linear_forward<arch>(qs, ks, vs, os, o);
        index_t differ = 0;
        for_each_index<4>(os.dims, [&](const std::array<index_t, 4>& i) {
            differ += !(at(os, i) == dense(i[0], i[1], i[2], i[3]));
        });
        EXPECT_EQ(0, differ) << (causal ? "causal" : "not causal");
    }
}

// NaN in a key propagates to the rows that see it only (causal: that position and later).
TEST(taylor_linear, nan_key_reaches_only_rows_that_see_it) {
    auto q = random_bshd<float>(1, 150, 1, 8, distribution::uniform, 51);
    auto k = random_bshd<float>(1, 150, 1, 8, distribution::uniform, 52);
    const auto v = random_bshd<float>(1, 150, 1, 8, distribution::uniform, 53);
    k(0, 100, 0, 3) = std::nanf("");
    taylor_options o;
    o.causal = true;
    const tensor4<float> out = run_linear(q, k, v, o);
    for (index_t i = 0; i < 150; ++i) EXPECT_EQ(i >= 100, std::isnan(out(0, i, 0, 0))) << "row " << i;
}

}  // namespace
