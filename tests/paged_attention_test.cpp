// attnkit::paged_attention: bitwise equal to softmax_attention_varlen on the same keys packed
// contiguously (decode batches on the row kernel, prefill chunks on the tile kernel, speculative
// steps, split-KV lengths, pages in scrambled order, 64 and 128 rows a page, every storage type),
// against the reference on the gathered keys, thread counts bitwise; errors (a block table
// entry outside the pages, lengths past a table row, page_rows not a multiple of 64, offsets
// not increasing) before anything is written.
#include "attnkit/paged_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnkit/reference/varlen_attention.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/varlen_attention.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using namespace attnkit_test;
using attnkit::index_t;
using attnkit::paged_kv;
using attnkit::softmax_options;

template <class T = float>
using packed = Eigen::Tensor<T, 3, Eigen::RowMajor>;
using lse2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;

std::vector<std::int64_t> offsets(const std::vector<std::int64_t>& lengths) {
    std::vector<std::int64_t> cu(1, 0);
    for (const std::int64_t n : lengths) cu.push_back(cu.back() + n);
    return cu;
}

// Packed K or V [Tk, Hk, D] and the same rows in pages taken in a scrambled order, with unused
// pages (filled with NaN: a kernel that read them would show it) between.
template <class T>
struct paged_copy {
    packed<T> dense;
    tensor4<T> pages;
};

struct layout {
    paged_kv kv;
    index_t n_pages = 0;
};

layout make_layout(const std::vector<std::int64_t>& q_len, const std::vector<std::int64_t>& k_len,
                   index_t page_rows, std::uint32_t seed) {
    layout l;
    l.kv.cu_seqlens_q = offsets(q_len);
    l.kv.seq_lengths = k_len;
    index_t most = 0, total = 0;
    for (const std::int64_t n : k_len) {
        most = std::max<index_t>(most, (n + page_rows - 1) / page_rows);
        total += (n + page_rows - 1) / page_rows;
    }
    l.kv.pages_per_seq = most + 1;  // one spare entry per row: never read
    l.n_pages = 2 * total + 3;
    std::vector<std::int32_t> order(static_cast<std::size_t>(l.n_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    l.kv.block_table.assign(k_len.size() * static_cast<std::size_t>(l.kv.pages_per_seq), -1);
    std::size_t next = 0;
    for (std::size_t b = 0; b < k_len.size(); ++b)
        for (index_t pg = 0; pg * page_rows < k_len[b]; ++pg)
            l.kv.block_table[b * static_cast<std::size_t>(l.kv.pages_per_seq) +
                             static_cast<std::size_t>(pg)] = order[2 * next++];
    return l;
}

template <class T>
paged_copy<T> make_paged(const layout& l, const std::vector<std::int64_t>& k_len, index_t page_rows,
                         index_t heads, index_t dim, std::uint64_t seed) {
    paged_copy<T> c;
    const auto cu = offsets(k_len);
    c.dense = packed<T>(cu.back(), heads, dim);
    fill_random(c.dense.data(), static_cast<std::size_t>(c.dense.size()), distribution::uniform,
                seed);
    c.pages = tensor4<T>(l.n_pages, page_rows, heads, dim);
    c.pages.setConstant(T(std::nanf("")));
    for (std::size_t b = 0; b < k_len.size(); ++b)
        for (index_t j = 0; j < k_len[b]; ++j) {
            const index_t pg = l.kv.block_table[b * static_cast<std::size_t>(l.kv.pages_per_seq) +
                                                static_cast<std::size_t>(j / page_rows)];
            for (index_t h = 0; h < heads; ++h)
                for (index_t d = 0; d < dim; ++d)
                    c.pages(pg, j % page_rows, h, d) = c.dense(cu[b] + j, h, d);
        }
    return c;
}

struct paged_case {
    const char* name;
    std::vector<std::int64_t> q_len, k_len;
    index_t heads, heads_kv, dim, page_rows;
    std::int64_t window;
};

std::ostream& operator<<(std::ostream& os, const paged_case& c) { return os << c.name; }

class paged : public ::testing::TestWithParam<paged_case> {};

bool same_bits(const float* a, const float* b, index_t n) {
    return std::memcmp(a, b, sizeof(float) * static_cast<std::size_t>(n)) == 0;
}

template <class T>
void check_paged(const paged_case& c) {
    const layout l = make_layout(c.q_len, c.k_len, c.page_rows, 5);
    const auto k = make_paged<T>(l, c.k_len, c.page_rows, c.heads_kv, c.dim, 21);
    const auto v = make_paged<T>(l, c.k_len, c.page_rows, c.heads_kv, c.dim, 22);
    const index_t Tq = l.kv.cu_seqlens_q.back();
    packed<float> q(Tq, c.heads, c.dim);
    fill_random(q.data(), static_cast<std::size_t>(q.size()), distribution::uniform, 23);
    softmax_options o;
    o.causal = true;
    o.window_left = c.window;

    packed<float> out(Tq, c.heads, c.dim), want(Tq, c.heads, c.dim);
    lse2 lse(Tq, c.heads), want_lse(Tq, c.heads);
    attnkit::paged_attention(q, k.pages, v.pages, l.kv, out, lse, o);
    attnkit::softmax_attention_varlen(q, k.dense, v.dense, l.kv.cu_seqlens_q, offsets(c.k_len),
                                      want, want_lse, o);
    EXPECT_TRUE(same_bits(out.data(), want.data(), out.size())) << "paged differs from packed";
    EXPECT_TRUE(same_bits(lse.data(), want_lse.data(), lse.size()));

    packed<double> ro(Tq, c.heads, c.dim);
    attnkit::reference::paged_attention(q, k.pages, v.pages, l.kv, ro, o);
    const double magnitude = 1.0 + std::sqrt(static_cast<double>(c.dim));
    EXPECT_TRUE(all_close(out, ro, tolerance_for(64.0, magnitude)));

    attnkit::thread_pool pool(2);
    softmax_options o2 = o;
    o2.pool = &pool;
    packed<float> out2(Tq, c.heads, c.dim);
    attnkit::paged_attention(q, k.pages, v.pages, l.kv, out2, o2);
    EXPECT_TRUE(same_bits(out.data(), out2.data(), out.size())) << "thread count changed the bits";
}

TEST_P(paged, float_equals_packed) { check_paged<float>(GetParam()); }
TEST_P(paged, bfloat16_equals_packed) { check_paged<Eigen::bfloat16>(GetParam()); }
TEST_P(paged, half_equals_packed) { check_paged<Eigen::half>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    cases, paged,
    ::testing::Values(
        paged_case{"decode", {1, 1, 1, 1, 1}, {1, 64, 65, 700, 3000}, 8, 2, 64, 64, -1},
        paged_case{"decode_128_rows", {1, 1, 1}, {127, 128, 1500}, 4, 4, 32, 128, -1},
        paged_case{"decode_window", {1, 1}, {1000, 200}, 4, 1, 48, 64, 100},
        paged_case{"speculative", {4, 3, 5}, {900, 67, 5}, 4, 2, 64, 64, -1},
        paged_case{"prefill_and_decode", {200, 1, 64, 1}, {200, 513, 300, 9}, 4, 2, 32, 64, -1},
        paged_case{"prefill_window", {150, 90}, {400, 90}, 2, 1, 24, 64, 33}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(paged_errors, rejected_before_anything_is_written) {
    const std::vector<std::int64_t> q_len = {1, 1}, k_len = {100, 64};
    const layout l = make_layout(q_len, k_len, 64, 3);
    const auto k = make_paged<float>(l, k_len, 64, 1, 8, 1);
    const auto v = make_paged<float>(l, k_len, 64, 1, 8, 2);
    packed<float> q(2, 2, 8), out(2, 2, 8);
    q.setConstant(0.5f);
    out.setConstant(3.0f);
    auto expect_rejected = [&](const paged_kv& kv, const char* what) {
        expect_invalid([&] { attnkit::paged_attention(q, k.pages, v.pages, kv, out); }, what);
        EXPECT_TRUE(all_equal_to(out, 3.0f));
    };
    paged_kv bad = l.kv;
    bad.block_table[0] = static_cast<std::int32_t>(l.n_pages);
    expect_rejected(bad, "kv.block_table[0 * pages_per_seq + 0]: expected a page in [0, ");
    bad = l.kv;
    bad.block_table[1] = -1;  // sequence 0's second page (keys 64..99)
    expect_rejected(bad, "kv.block_table[0 * pages_per_seq + 1]");
    bad = l.kv;
    bad.seq_lengths[1] = l.kv.pages_per_seq * 64 + 1;
    expect_rejected(bad, "kv.seq_lengths[1]: expected 0 <= length <= pages_per_seq * page_rows");
    bad = l.kv;
    bad.seq_lengths = {100};
    expect_rejected(bad, "kv.seq_lengths: expected one per sequence");
    bad = l.kv;
    bad.block_table.pop_back();
    expect_rejected(bad, "kv.block_table: expected B * pages_per_seq");
    bad = l.kv;
    bad.cu_seqlens_q = {0, 2, 1, 2};
    expect_rejected(bad, "kv.cu_seqlens_q: expected non-decreasing");
    // An unread table entry (past a sequence's keys) may hold anything.
    paged_kv spare = l.kv;
    spare.block_table.back() = 1 << 30;
    EXPECT_NO_THROW(attnkit::paged_attention(q, k.pages, v.pages, spare, out));

    tensor4<float> odd(4, 48, 1, 8);
    odd.setZero();
    paged_kv one;
    one.cu_seqlens_q = {0, 2};
    one.seq_lengths = {10};
    one.pages_per_seq = 1;
    one.block_table = {0};
    packed<float> out1(2, 2, 8);
    out1.setConstant(3.0f);
    expect_invalid([&] { attnkit::paged_attention(q, odd, odd, one, out1); },
                   "k_pages: page_rows (dimension 1) must be a positive multiple of 64");
    EXPECT_TRUE(all_equal_to(out1, 3.0f));
}

}  // namespace
