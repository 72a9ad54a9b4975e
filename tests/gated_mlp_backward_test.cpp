// attnkit::gated_mlp_backward against the double oracle, and the oracle
// (reference::gated_mlp_backward) against central finite differences of the reference forward
// in double with a random projection loss <out, R> (sum(out) would weigh every output alike).
//
// Tolerances: |fast - oracle| <= kEpsMultiple eps max|oracle| per gradient tensor. Inputs are
// U[-1, 1], so the sums over tokens (the weight gradients) and over the hidden width (d_x) grow
// like the square root of their length, as their rounding errors do; 64 leaves a wide margin
// over the measured worst case (AVX2, SSE2).
#include "attnkit/gated_mlp_backward.hpp"

#include "attnkit/reference/gated_mlp_backward.hpp"
#include "attnkit/thread_pool.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/finite_differences.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using namespace attnkit_test;
namespace ref = attnkit::reference;
template <class T = float>
using mat = Eigen::Tensor<T, 2, Eigen::RowMajor>;

constexpr double kEpsMultiple = 64;

template <class T>
mat<T> random_mat(index_t r, index_t c, std::uint64_t seed) {
    mat<T> m(r, c);
    fill_random(m.data(), static_cast<std::size_t>(m.size()), distribution::uniform, seed);
    return m;
}

struct mlp_problem {
    mat<float> x, wg, wu, wd, dout;
};

mlp_problem make(index_t N, index_t d, index_t m, std::uint64_t seed) {
    return {random_mat<float>(N, d, seed), random_mat<float>(d, m, seed + 1), random_mat<float>(d, m, seed + 2),
            random_mat<float>(m, d, seed + 3), random_mat<float>(N, d, seed + 4)};
}

struct grads {
    mat<float> dx, dwg, dwu, dwd;
};

grads run_fast(const mlp_problem& p, attnkit::thread_pool* pool = nullptr) {
    const index_t N = p.x.dimension(0), d = p.x.dimension(1), m = p.wg.dimension(1);
    grads g{mat<float>(N, d), mat<float>(d, m), mat<float>(d, m), mat<float>(m, d)};
    for (auto* t : {&g.dx, &g.dwg, &g.dwu, &g.dwd}) t->setConstant(std::numeric_limits<float>::quiet_NaN());
    attnkit::gated_mlp_options o;
    o.pool = pool;
    attnkit::gated_mlp_backward(p.x, p.wg, p.wu, p.wd, p.dout, g.dx, g.dwg, g.dwu, g.dwd, o);
    return g;
}

void expect_matches_oracle(const mlp_problem& p) {
    const index_t N = p.x.dimension(0), d = p.x.dimension(1), m = p.wg.dimension(1);
    const grads got = run_fast(p);
    mat<double> dx(N, d), dwg(d, m), dwu(d, m), dwd(m, d);
    const mat<double> x = p.x.cast<double>(), wg = p.wg.cast<double>(), wu = p.wu.cast<double>(),
                      wd = p.wd.cast<double>(), dout = p.dout.cast<double>();
    ref::gated_mlp_backward(x, wg, wu, wd, dout, dx, dwg, dwu, dwd);
    EXPECT_TRUE(all_close(got.dx, dx, tolerance_for(kEpsMultiple, max_abs(dx)))) << "d_x";
    EXPECT_TRUE(all_close(got.dwg, dwg, tolerance_for(kEpsMultiple, max_abs(dwg)))) << "d_w_gate";
    EXPECT_TRUE(all_close(got.dwu, dwu, tolerance_for(kEpsMultiple, max_abs(dwu)))) << "d_w_up";
    EXPECT_TRUE(all_close(got.dwd, dwd, tolerance_for(kEpsMultiple, max_abs(dwd)))) << "d_w_down";
}

// ---- the oracle against finite differences -------------------------------------------------

TEST(reference_gated_mlp_backward, matches_central_finite_differences) {
    const index_t N = 4, d = 5, m = 7;
    mat<double> x = random_mat<double>(N, d, 11), wg = random_mat<double>(d, m, 12), wu = random_mat<double>(d, m, 13),
                wd = random_mat<double>(m, d, 14), r = random_mat<double>(N, d, 15);
    // Scale the gate inputs into SiLU's curved range.
    for (index_t i = 0; i < wg.size(); ++i) wg.data()[i] *= 2.0;
    auto loss = [&] {
        mat<double> out(N, d);
        ref::gated_mlp(x, wg, wu, wd, out);
        double l = 0.0;
        for (index_t i = 0; i < out.size(); ++i) l += out.data()[i] * r.data()[i];
        return l;
    };
    mat<double> dx(N, d), dwg(d, m), dwu(d, m), dwd(m, d);
    ref::gated_mlp_backward(x, wg, wu, wd, r, dx, dwg, dwu, dwd);
    expect_matches_finite_differences(x, dx, loss, "d_x");
    expect_matches_finite_differences(wg, dwg, loss, "d_w_gate");
    expect_matches_finite_differences(wu, dwu, loss, "d_w_up");
    expect_matches_finite_differences(wd, dwd, loss, "d_w_down");
}

// ---- the fast backward against the oracle ----------------------------------------------------

// Tokens around the register tile (6 or 12 rows) and the 2048-row block; widths around the
// lanes and the 256-column slice.
TEST(gated_mlp_backward, matches_oracle_on_edge_sizes) {
    std::uint64_t seed = 100;
    for (index_t N : {1, 5, 6, 7, 13, 130})
        for (index_t d : {1, 7, 16, 33})
            for (index_t m : {1, 15, 16, 17, 40}) {
                SCOPED_TRACE(::testing::Message() << "N " << N << " d " << d << " m " << m);
                expect_matches_oracle(make(N, d, m, seed += 10));
            }
    // Row blocks (kMlpBackwardRows, and output blocks of kMlpBackwardBlockRows within one) and
    // slices of the hidden width (kMlpBackwardSlice) around their edges.
    constexpr index_t S = attnkit::detail::kMlpBackwardSlice;
    for (auto [N, d, m] : {std::array<index_t, 3>{2100, 24, 20}, {50, 24, S - 1}, {50, 24, S}, {70, 24, S + 1},
                           {40, 20, 2 * S + 37}}) {
        SCOPED_TRACE(::testing::Message() << "N " << N << " d " << d << " m " << m);
        expect_matches_oracle(make(N, d, m, seed += 10));
    }
}

// [B, L, d] whose batch items do not fold into one matrix (a strided view over a wider buffer)
// give the same gradients as the dense [B L, d] problem.
TEST(gated_mlp_backward, rank_three_views_equal_dense_rows) {
    const index_t B = 3, L = 9, d = 10, m = 21;
    const mlp_problem p = make(B * L, d, m, 300);
    const grads dense = run_fast(p);
    std::vector<float> xb(static_cast<std::size_t>(B * (L + 2) * d)), db(xb.size()), gb(xb.size(), -1.0f);
    const attnkit::view<float, 3> xv(xb.data(), {B, L, d}, {(L + 2) * d, d, 1});
    const attnkit::view<float, 3> dv(db.data(), {B, L, d}, {(L + 2) * d, d, 1});
    const attnkit::view<float, 3> gv(gb.data(), {B, L, d}, {(L + 2) * d, d, 1});
    for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < L; ++t)
            for (index_t k = 0; k < d; ++k) {
                xv(b, t, k) = p.x(b * L + t, k);
                dv(b, t, k) = p.dout(b * L + t, k);
            }
    mat<float> dwg(d, m), dwu(d, m), dwd(m, d);
    attnkit::gated_mlp_backward(attnkit::view<const float, 3>(xv), p.wg, p.wu, p.wd, attnkit::view<const float, 3>(dv),
                                gv, dwg, dwu, dwd);
    for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < L; ++t)
            for (index_t k = 0; k < d; ++k) EXPECT_EQ(dense.dx(b * L + t, k), gv(b, t, k));
    EXPECT_TRUE(all_close(dwg, dense.dwg, tolerance_for(8, max_abs(dense.dwg)))) << "d_w_gate";
    EXPECT_TRUE(all_close(dwd, dense.dwd, tolerance_for(8, max_abs(dense.dwd)))) << "d_w_down";
}

TEST(gated_mlp_backward, thread_count_gives_bitwise_identical_results) {
    const mlp_problem p = make(700, 40, 300, 400);
    const grads one = run_fast(p);
    for (int n : {2, 3}) {
        attnkit::thread_pool pool(n);
        const grads many = run_fast(p, &pool);
        for (auto [a, b] : {std::pair<const mat<float>*, const mat<float>*>{&one.dx, &many.dx}, {&one.dwg, &many.dwg},
                            {&one.dwu, &many.dwu}, {&one.dwd, &many.dwd}})
            EXPECT_EQ(0, std::memcmp(a->data(), b->data(), sizeof(float) * static_cast<std::size_t>(a->size())))
                << n << " threads";
    }
}

// A NaN in one token's input reaches that token's d_x and the weight gradients (sums over
// tokens), never another token's d_x.
TEST(gated_mlp_backward, nan_in_a_token_stays_in_its_row_of_d_x) {
    mlp_problem p = make(30, 12, 20, 500);
    p.x(7, 3) = std::numeric_limits<float>::quiet_NaN();
    const grads g = run_fast(p);
    for (index_t i = 0; i < 30; ++i)
        for (index_t k = 0; k < 12; ++k) EXPECT_EQ(i == 7, std::isnan(g.dx(i, k))) << "token " << i;
}

TEST(gated_mlp_backward, empty_inputs_give_zero_gradients) {
    const mlp_problem p = make(0, 6, 5, 600);
    const grads g = run_fast(p);
    EXPECT_TRUE(all_equal_to(g.dwg, 0.0f));
    EXPECT_TRUE(all_equal_to(g.dwu, 0.0f));
    EXPECT_TRUE(all_equal_to(g.dwd, 0.0f));
}

TEST(gated_mlp_backward, bad_input_rejected_before_writing) {
    const mlp_problem p = make(8, 6, 5, 700);
    mat<float> dx(8, 6), dwg(6, 5), dwu(6, 5), dwd(5, 6);
    for (auto* t : {&dx, &dwg, &dwu, &dwd}) t->setConstant(3.0f);
    mat<float> bad_dout(8, 7), bad_dwd(6, 5), bad_wu(6, 4);
    expect_invalid([&] { attnkit::gated_mlp_backward(p.x, p.wg, p.wu, p.wd, bad_dout, dx, dwg, dwu, dwd); }, "d_out");
    expect_invalid([&] { attnkit::gated_mlp_backward(p.x, p.wg, p.wu, p.wd, p.dout, dx, dwg, dwu, bad_dwd); },
                   {"d_w_down", "[6, 5]"});
    expect_invalid([&] { attnkit::gated_mlp_backward(p.x, p.wg, bad_wu, p.wd, p.dout, dx, dwg, dwu, dwd); }, "w_up");
    mat<float> x_copy = p.x;
    expect_invalid([&] { attnkit::gated_mlp_backward(x_copy, p.wg, p.wu, p.wd, p.dout, x_copy, dwg, dwu, dwd); }, "d_x");
    expect_invalid([&] { attnkit::gated_mlp_backward(p.x, p.wg, p.wu, p.wd, p.dout, dx, dwg, dwg, dwd); }, "d_w_up");
    for (auto* t : {&dx, &dwg, &dwu, &dwd}) EXPECT_TRUE(all_equal_to(*t, 3.0f));
}

}  // namespace
