// detail/gemm.hpp: the packed GEMM against plain double loops on sizes around the register
// tile's edges (kMR rows x kNR columns of the arch under test: 6 x 16 on AVX2, 12 x 32 on
// AVX-512, 6 x 8 on SSE2) and the cache blocks (K pieces of <= 256, M slices of <= 144 and N
// slices of <= 4096 up to 16 columns per tile; K pieces of 128 and M slices of 288 on AVX-512),
// the few-row paths (1 to kMR rows read B unpacked), on the default arch and on the portable
// scalar path; strided operands (row strides > cols, column slices), the accumulate mode, an
// empty inner dimension, non-finite values staying in their own rows and columns (edge tiles
// compute padded rows and columns that must never leak), and the block grid: bitwise identical
// for any thread count, any pool and any grid.
#include <gtest/gtest.h>

#include <attnkit/detail/gemm.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/random.hpp"

namespace {

using attnkit::index_t;
using attnkit::detail::gemm_mode;
using attnkit::detail::gemm_traits;
using Arch = attnkit::simd::default_arch;
constexpr index_t kMR = gemm_traits<Arch>::kMR, kNR = gemm_traits<Arch>::kNR;
using attnkit::detail::matrix_ref;
using attnkit_test::distribution;

constexpr double kEps = std::numeric_limits<float>::epsilon();

// A row-major matrix in a buffer with `pad` spare columns per row, and a sentinel in the pads.
struct padded {
    index_t rows, cols, stride;
    std::vector<float> buf;
    padded(index_t r, index_t c, index_t pad, distribution d, std::uint64_t seed)
        : rows(r), cols(c), stride(c + pad), buf(static_cast<std::size_t>(r * (c + pad)), -777.0f) {
        const auto v = attnkit_test::random_values(static_cast<std::size_t>(r * c), d, seed);
        for (index_t i = 0; i < r; ++i)
            for (index_t j = 0; j < c; ++j) at(i, j) = static_cast<float>(v[static_cast<std::size_t>(i * c + j)]);
    }
    float& at(index_t i, index_t j) { return buf[static_cast<std::size_t>(i * stride + j)]; }
    float at(index_t i, index_t j) const { return buf[static_cast<std::size_t>(i * stride + j)]; }
    matrix_ref<const float> cref() const { return {buf.data(), rows, cols, stride}; }
    matrix_ref<float> ref() { return {buf.data(), rows, cols, stride}; }
};

// |C - (C0 + A B)| <= (K + 2) eps sum_k |a_ik b_kj| + eps |c0|: the worst-case bound of a float
// dot product of length K in any summation order, so it cannot fail for a correct product and
// fails for any wrong element.
::testing::AssertionResult matches_product(const padded& a, const padded& b, const padded& c, const padded* c0) {
    const index_t M = a.rows, K = a.cols, N = b.cols;
    for (index_t i = 0; i < M; ++i)
        for (index_t j = 0; j < N; ++j) {
            double s = c0 ? c0->at(i, j) : 0.0, mag = 0.0;
            for (index_t k = 0; k < K; ++k) {
                s += static_cast<double>(a.at(i, k)) * b.at(k, j);
                mag += std::fabs(static_cast<double>(a.at(i, k)) * b.at(k, j));
            }
            const double bound = (K + 2) * kEps * mag + 2 * kEps * (c0 ? std::fabs(c0->at(i, j)) : 0.0);
            if (!(std::fabs(c.at(i, j) - s) <= bound))
                return ::testing::AssertionFailure() << "C(" << i << ", " << j << ") = " << c.at(i, j) << ", expected "
                                                     << s << " +- " << bound << " (M " << M << " K " << K << " N " << N
                                                     << ")";
        }
    // The pads of C are never written.
    for (index_t i = 0; i < c.rows; ++i)
        for (index_t j = c.cols; j < c.stride; ++j)
            if (c.at(i, j) != -777.0f) return ::testing::AssertionFailure() << "pad of C written at row " << i;
    return ::testing::AssertionSuccess();
}

// Around 4/8/16 lanes and the register tiles of every arch (6 x 8, 6 x 16, 12 x 32), odd primes.
const index_t kSizes[] = {1, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 15, 16, 17, 23, 25, 31, 32, 33, 53};

TEST(gemm, assign_matches_plain_loops_on_edge_sizes) {
    std::uint64_t seed = 1;
    for (index_t M : kSizes)
        for (index_t K : {index_t(1), index_t(8), index_t(17), index_t(67)})
            for (index_t N : kSizes) {
                const padded a(M, K, 3, distribution::gaussian, seed++), b(K, N, 5, distribution::uniform, seed++);
                padded c(M, N, 2, distribution::gaussian, seed++);  // garbage to be overwritten
                attnkit::detail::gemm(a.cref(), b.cref(), c.ref());
                ASSERT_TRUE(matches_product(a, b, c, nullptr));
            }
}

// The same sweep, exactly at and one past the active arch's tile, and on the scalar path.
TEST(gemm, tile_edges_of_the_active_arch_and_the_scalar_path) {
    std::uint64_t seed = 500;
    for (index_t M : {index_t(1), index_t(2), kMR - 1, kMR, kMR + 1, 3 * kMR + 2})
        for (index_t N : {kNR - 1, kNR, kNR + 1, 3 * kNR + 2})
            for (index_t K : {index_t(1), index_t(5), index_t(256), index_t(257)}) {
                const padded a(M, K, 2, distribution::gaussian, seed++), b(K, N, 3, distribution::gaussian, seed++);
                padded c(M, N, 1, distribution::uniform, seed++);
                attnkit::detail::gemm(a.cref(), b.cref(), c.ref());
                ASSERT_TRUE(matches_product(a, b, c, nullptr));
                padded s(M, N, 1, distribution::uniform, seed++);
                attnkit::detail::gemm_on<attnkit::simd::scalar_arch>(a.cref(), b.cref(), s.ref());
                ASSERT_TRUE(matches_product(a, b, s, nullptr));
            }
}

// An A stored without padding whose rows are one K piece long is read in place as the packed
// panels (gemm/kernel.hpp) where every micro-panel is whole: the same bits as the same A with a
// row stride past K (packed), for assign and add, whole and partial last micro-panels, and K
// around the largest piece (one piece in place, two packed).
TEST(gemm, unpadded_a_read_in_place_gives_the_bits_of_packed_a) {
    std::uint64_t seed = 900;
    const index_t kc_max = gemm_traits<Arch>::kMaxKc;
    for (index_t M : {kMR, 2 * kMR, 3 * kMR + 1, 7 * kMR})
        for (index_t K : {index_t(1), index_t(17), index_t(64), kc_max, kc_max + 1})
            for (index_t N : {index_t(5), kNR, 2 * kNR + 3})
                for (bool add : {false, true}) {
                    const padded a0(M, K, 0, distribution::gaussian, seed), a1(M, K, 3, distribution::gaussian, seed);
                    ++seed;
                    const padded b(K, N, 1, distribution::uniform, seed++);
                    const padded c0(M, N, 2, distribution::gaussian, seed++);
                    padded c_in = c0, c_packed = c0;
                    const gemm_mode mode = add ? gemm_mode::add : gemm_mode::assign;
                    attnkit::detail::gemm(a0.cref(), b.cref(), c_in.ref(), mode);
                    attnkit::detail::gemm(a1.cref(), b.cref(), c_packed.ref(), mode);
                    ASSERT_TRUE(matches_product(a0, b, c_in, add ? &c0 : nullptr)) << "M " << M << " K " << K;
                    ASSERT_EQ(c_in.buf, c_packed.buf) << "M " << M << " K " << K << " N " << N << " add " << add;
                }
}

// Several K pieces, M slices and N slices of the cache blocking, with edge tiles in each.
TEST(gemm, across_cache_blocks) {
    {
        const padded a(301, 613, 1, distribution::outliers, 41), b(613, 97, 2, distribution::gaussian, 42);
        padded c(301, 97, 3, distribution::gaussian, 43);
        attnkit::detail::gemm(a.cref(), b.cref(), c.ref());
        ASSERT_TRUE(matches_product(a, b, c, nullptr));
        const padded c0 = c;
        attnkit::detail::gemm(a.cref(), b.cref(), c.ref(), gemm_mode::add);
        ASSERT_TRUE(matches_product(a, b, c, &c0));
    }
    {  // N past one 4096-column slice
        const padded a(7, 3, 0, distribution::gaussian, 44), b(3, 4099, 1, distribution::gaussian, 45);
        padded c(7, 4099, 0, distribution::gaussian, 46);
        attnkit::detail::gemm(a.cref(), b.cref(), c.ref());
        ASSERT_TRUE(matches_product(a, b, c, nullptr));
    }
}

// An inf or NaN in row i of A reaches only row i of C, one in column j of B only column j: the
// zero rows and columns that pad edge tiles meet them (0 * inf = NaN) but are never stored.
TEST(gemm, non_finite_values_stay_in_their_row_and_column) {
    for (index_t M : {kMR + 1, index_t(7)})
        for (index_t N : {kNR + 3, index_t(5)}) {
            const index_t K = 19;
            padded a(M, K, 0, distribution::gaussian, 61), b(K, N, 0, distribution::gaussian, 62);
            const index_t bad_row = M - 1, bad_col = N - 1;
            a.at(bad_row, 4) = std::numeric_limits<float>::quiet_NaN();
            b.at(9, bad_col) = std::numeric_limits<float>::infinity();
            padded c(M, N, 0, distribution::gaussian, 63);
            attnkit::detail::gemm(a.cref(), b.cref(), c.ref());
            for (index_t i = 0; i < M; ++i)
                for (index_t j = 0; j < N; ++j) {
                    if (i == bad_row)
                        ASSERT_TRUE(std::isnan(c.at(i, j))) << i << ", " << j;
                    else if (j == bad_col)
                        ASSERT_FALSE(std::isfinite(c.at(i, j))) << i << ", " << j;
                    else
                        ASSERT_TRUE(std::isfinite(c.at(i, j))) << i << ", " << j;
                }
        }
}

TEST(gemm, add_accumulates_into_c) {
    std::uint64_t seed = 100;
    for (index_t M : {1, 9, 31})
        for (index_t K : {1, 33, 300})
            for (index_t N : {1, 8, 25}) {
                const padded a(M, K, 1, distribution::outliers, seed++), b(K, N, 0, distribution::gaussian, seed++);
                padded c(M, N, 4, distribution::gaussian, seed++);
                const padded c0 = c;
                attnkit::detail::gemm(a.cref(), b.cref(), c.ref(), gemm_mode::add);
                ASSERT_TRUE(matches_product(a, b, c, &c0));
            }
}

TEST(gemm, column_and_row_slices) {
    // B as columns [5, 5 + 19) of a wider matrix, C as a block inside a bigger one.
    const padded a(37, 29, 0, distribution::gaussian, 7), wide(29, 40, 0, distribution::gaussian, 8);
    padded big(50, 60, 0, distribution::gaussian, 9);
    const auto b = wide.cref().col_block(5, 24);
    attnkit::detail::gemm(a.cref(), b, big.ref().row_block(3, 40).col_block(11, 30));
    padded bs(29, 19, 0, distribution::gaussian, 0), cs(37, 19, 0, distribution::gaussian, 0);
    for (index_t i = 0; i < 29; ++i)
        for (index_t j = 0; j < 19; ++j) bs.at(i, j) = wide.at(i, 5 + j);
    for (index_t i = 0; i < 37; ++i)
        for (index_t j = 0; j < 19; ++j) cs.at(i, j) = big.at(3 + i, 11 + j);
    EXPECT_TRUE(matches_product(a, bs, cs, nullptr));
    const padded fresh(50, 60, 0, distribution::gaussian, 9);  // everything outside the block kept
    for (index_t i = 0; i < 50; ++i)
        for (index_t j = 0; j < 60; ++j) {
            if (i < 3 || i >= 40 || j < 11 || j >= 30) {
                ASSERT_EQ(big.at(i, j), fresh.at(i, j)) << i << ", " << j;
            }
        }
}

TEST(gemm, empty_inner_dimension_gives_zero_or_keeps_c) {
    const padded a(5, 0, 2, distribution::gaussian, 1), b(0, 7, 0, distribution::gaussian, 2);
    padded c(5, 7, 1, distribution::gaussian, 3);
    const padded c0 = c;
    attnkit::detail::gemm(a.cref(), b.cref(), c.ref(), gemm_mode::add);
    EXPECT_EQ(c.buf, c0.buf);
    attnkit::detail::gemm(a.cref(), b.cref(), c.ref());
    for (index_t i = 0; i < 5; ++i)
        for (index_t j = 0; j < 7; ++j) ASSERT_EQ(c.at(i, j), 0.0f);
    for (index_t i = 0; i < 5; ++i) ASSERT_EQ(c.at(i, 7), -777.0f);  // pads untouched
}

TEST(gemm, block_grid_is_bitwise_identical_for_any_pool) {
    const padded a(613, 45, 1, distribution::gaussian, 11), b(45, 301, 0, distribution::gaussian, 12);
    padded serial(613, 301, 0, distribution::uniform, 0);
    attnkit::detail::gemm_blocks(a.cref(), b.cref(), serial.ref(), nullptr, 64, 96);
    ASSERT_TRUE(matches_product(a, b, serial, nullptr));
    for (std::size_t n : {1, 2, 3}) {
        attnkit::thread_pool pool(n);
        padded c(613, 301, 0, distribution::uniform, n);
        attnkit::detail::gemm_blocks(a.cref(), b.cref(), c.ref(), &pool, 64, 96);
        EXPECT_EQ(0, std::memcmp(c.buf.data(), serial.buf.data(), c.buf.size() * sizeof(float))) << n << " threads";
        padded r(613, 301, 0, distribution::uniform, n);
        attnkit::detail::gemm_rows(a.cref(), b.cref(), r.ref(), &pool, 100);
        EXPECT_TRUE(matches_product(a, b, r, nullptr)) << n << " threads";
    }
}

// Each element is the same chain of FMAs wherever its tile sits (K pieces depend on K alone),
// so any grid gives the bits of one whole-matrix product: the row blocks of gemm_rows (the
// gated MLP's blocks) and the 256 x 2048 blocks of the StaticEmbQK projection agree with it.
TEST(gemm, any_block_grid_gives_the_bits_of_one_product) {
    const padded a(257, 600, 0, distribution::gaussian, 71), b(600, 203, 3, distribution::gaussian, 72);
    padded whole(257, 203, 0, distribution::uniform, 0);
    attnkit::detail::gemm(a.cref(), b.cref(), whole.ref());
    ASSERT_TRUE(matches_product(a, b, whole, nullptr));
    attnkit::thread_pool pool(2);
    for (index_t br : {index_t(1), index_t(7), kMR + 1, index_t(100)})
        for (index_t bc : {index_t(5), kNR - 1, index_t(64), index_t(1000)}) {
            padded c(257, 203, 0, distribution::uniform, 1);
            attnkit::detail::gemm_blocks(a.cref(), b.cref(), c.ref(), &pool, br, bc);
            ASSERT_EQ(0, std::memcmp(c.buf.data(), whole.buf.data(), c.buf.size() * sizeof(float)))
                << br << " x " << bc << " blocks";
        }
}

}  // namespace

namespace {

// The transpose of a padded matrix, in a padded matrix of its own.
padded transposed(const padded& x, index_t pad) {
    padded t(x.cols, x.rows, pad, distribution::uniform, 1);
    for (index_t i = 0; i < x.rows; ++i)
        for (index_t j = 0; j < x.cols; ++j) t.at(j, i) = x.at(i, j);
    return t;
}

// op(A) op(B) with A and B given as stored transposes: the same bound as the plain product, on
// the row and tile edges and across the cache blocks, assign and add, default and scalar arch.
TEST(gemm, transposed_operands_match_plain_loops) {
    using attnkit::detail::gemm_op;
    std::uint64_t seed = 9000;
    for (index_t M : {index_t(1), index_t(2), kMR - 1, kMR, kMR + 1, 3 * kMR + 2, index_t(150)})
        for (index_t N : {index_t(1), kNR - 1, kNR, kNR + 1, 3 * kNR + 2})
            for (index_t K : {index_t(1), index_t(7), index_t(257)}) {
                const padded a(M, K, 2, distribution::gaussian, seed++), b(K, N, 3, distribution::gaussian, seed++);
                const padded at = transposed(a, 1), bt = transposed(b, 4);
                for (int ops = 1; ops < 4; ++ops) {
                    const bool ta = ops & 1, tb = ops & 2;
                    const auto ar = ta ? at.cref() : a.cref();
                    const auto br = tb ? bt.cref() : b.cref();
                    const gemm_op oa = ta ? gemm_op::transpose : gemm_op::none;
                    const gemm_op ob = tb ? gemm_op::transpose : gemm_op::none;
                    padded c(M, N, 1, distribution::uniform, seed++);
                    attnkit::detail::gemm(ar, oa, br, ob, c.ref());
                    ASSERT_TRUE(matches_product(a, b, c, nullptr)) << "ta " << ta << " tb " << tb;
                    const padded c0(M, N, 1, distribution::gaussian, seed++);
                    padded ca = c0;
                    attnkit::detail::gemm(ar, oa, br, ob, ca.ref(), gemm_mode::add);
                    ASSERT_TRUE(matches_product(a, b, ca, &c0)) << "add, ta " << ta << " tb " << tb;
                    padded s(M, N, 1, distribution::uniform, seed++);
                    attnkit::detail::gemm_on<attnkit::simd::scalar_arch>(ar, oa, br, ob, s.ref());
                    ASSERT_TRUE(matches_product(a, b, s, nullptr)) << "scalar, ta " << ta << " tb " << tb;
                }
            }
}

}  // namespace
