// attnkit::softmax_attention_varlen against per-sequence calls of the reference: prompts of
// ragged lengths, chunked prefill (a chunk after its cached prefix), speculative decoding (a few
// tokens after a cache), decode steps, with causal, window, chunk, softcap, sinks and GQA; 16-bit
// and int8 K/V; lengths around the kernels' block edges (64-key row blocks, 96-key tiles, split-KV);
// empty sequences; thread counts bitwise; errors before anything is written.
#include "attnkit/varlen_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/reference/varlen_attention.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using namespace attnkit_test;
using attnkit::index_t;
using attnkit::softmax_options;

template <class T = float>
using packed = Eigen::Tensor<T, 3, Eigen::RowMajor>;
using lse2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;

template <class T>
packed<T> random_packed(index_t rows, index_t heads, index_t dim, std::uint64_t seed) {
    packed<T> x(rows, heads, dim);
    fill_random(x.data(), static_cast<std::size_t>(x.size()), distribution::uniform, seed);
    return x;
}

std::vector<std::int64_t> offsets(const std::vector<std::int64_t>& lengths) {
    std::vector<std::int64_t> cu(1, 0);
    for (const std::int64_t n : lengths) cu.push_back(cu.back() + n);
    return cu;
}

struct varlen_case {
    const char* name;
    std::vector<std::int64_t> q_len, k_len;
    index_t heads, heads_kv, dim;
    bool causal;
    std::int64_t window;
    std::int64_t chunk;
    float softcap;
    bool sinks;
};

std::ostream& operator<<(std::ostream& os, const varlen_case& c) { return os << c.name; }

class varlen : public ::testing::TestWithParam<varlen_case> {};

softmax_options options_of(const varlen_case& c) {
    softmax_options o;
    o.causal = c.causal;
    o.window_left = c.window;
    o.chunk = c.chunk;
    o.softcap = c.softcap;
    if (c.sinks)
        for (index_t h = 0; h < c.heads; ++h)
            o.sinks.push_back(0.25f * static_cast<float>(h) - 0.5f);
    return o;
}

// softmax_attention_varlen(q, k, v, ...) against its oracle in double within the bound of a
// score of at most `magnitude`; then on three threads, bitwise. k and v: packed tensors or int8_kv.
template <class K, class V>
void compare_with_reference(const varlen_case& c, const packed<float>& q, const K& k, const V& v, double magnitude) {
    const auto cu_q = offsets(c.q_len), cu_k = offsets(c.k_len);
    const index_t Tq = cu_q.back();
    const softmax_options o = options_of(c);
    packed<float> out(Tq, c.heads, c.dim);
    lse2 lse(Tq, c.heads);
    out.setConstant(7.0f);
    attnkit::softmax_attention_varlen(q, k, v, cu_q, cu_k, out, lse, o);
    packed<double> ro(Tq, c.heads, c.dim);
    Eigen::Tensor<double, 2, Eigen::RowMajor> rl(Tq, c.heads);
    attnkit::reference::softmax_attention_varlen(q, k, v, cu_q, cu_k, ro, rl, o);
    // The reference reads the same stored (16-bit or int8) values, so one tolerance serves every type.
    EXPECT_TRUE(all_close(out, ro, tolerance_for(64.0, magnitude)));
    EXPECT_TRUE(all_close(lse, rl, tolerance_for(64.0, magnitude), true));

    // One thread or three: the same bits.
    attnkit::thread_pool pool(3);
    softmax_options o3 = o;
    o3.pool = &pool;
    packed<float> out3(Tq, c.heads, c.dim);
    lse2 lse3(Tq, c.heads);
    attnkit::softmax_attention_varlen(q, k, v, cu_q, cu_k, out3, lse3, o3);
    EXPECT_EQ(0, std::memcmp(out.data(), out3.data(),
                             sizeof(float) * static_cast<std::size_t>(out.size())));
    EXPECT_EQ(0, std::memcmp(lse.data(), lse3.data(),
                             sizeof(float) * static_cast<std::size_t>(lse.size())));
}

template <class T>
void check_against_reference(const varlen_case& c) {
    const index_t Tq = offsets(c.q_len).back(), Tk = offsets(c.k_len).back();
    // |q|, |k| <= sqrt(D) for uniform [-1, 1] values: the attention_magnitude bound.
    compare_with_reference(c, random_packed<float>(Tq, c.heads, c.dim, 11), random_packed<T>(Tk, c.heads_kv, c.dim, 12),
                           random_packed<T>(Tk, c.heads_kv, c.dim, 13),
                           1.0 + static_cast<double>(c.dim) / std::sqrt(static_cast<double>(c.dim)));
}

// Packed int8 K/V: random values in [-127, 127] and row scales in [0.5, 1.5] / 127, so that the
// dequantised entries stay within [-1.5, 1.5].
void check_int8_against_reference(const varlen_case& c) {
    const index_t Tq = offsets(c.q_len).back(), Tk = offsets(c.k_len).back();
    packed<std::int8_t> kq(Tk, c.heads_kv, c.dim), vq(Tk, c.heads_kv, c.dim);
    Eigen::Tensor<float, 2, Eigen::RowMajor> ks(Tk, c.heads_kv), vs(Tk, c.heads_kv);
    const auto kr = random_packed<float>(Tk, c.heads_kv, c.dim, 12), vr = random_packed<float>(Tk, c.heads_kv, c.dim, 13);
    const auto sr = random_packed<float>(Tk, c.heads_kv, 2, 14);
    for (index_t j = 0; j < Tk; ++j)
        for (index_t h = 0; h < c.heads_kv; ++h) {
            ks(j, h) = (1.0f + 0.5f * sr(j, h, 0)) / 127.0f;
            vs(j, h) = (1.0f + 0.5f * sr(j, h, 1)) / 127.0f;
            for (index_t d = 0; d < c.dim; ++d) {
                kq(j, h, d) = static_cast<std::int8_t>(std::lround(127.0f * kr(j, h, d)));
                vq(j, h, d) = static_cast<std::int8_t>(std::lround(127.0f * vr(j, h, d)));
            }
        }
    compare_with_reference(c, random_packed<float>(Tq, c.heads, c.dim, 11), attnkit::int8_kv(kq, ks),
                           attnkit::int8_kv(vq, vs),
                           1.0 + 1.5 * static_cast<double>(c.dim) / std::sqrt(static_cast<double>(c.dim)));
}

TEST_P(varlen, float_matches_per_sequence_reference) { check_against_reference<float>(GetParam()); }
TEST_P(varlen, bfloat16_matches_per_sequence_reference) {
    check_against_reference<Eigen::bfloat16>(GetParam());
}
TEST_P(varlen, half_matches_per_sequence_reference) {
    check_against_reference<Eigen::half>(GetParam());
}
TEST_P(varlen, int8_matches_per_sequence_reference) { check_int8_against_reference(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    cases, varlen,
    ::testing::Values(
        varlen_case{"prompts",
                    {5, 64, 1, 97, 130},
                    {5, 64, 1, 97, 130},
                    4,
                    2,
                    32,
                    true,
                    -1,
                    0,
                    0.0f,
                    false},
        varlen_case{"not_causal", {7, 33, 65}, {9, 40, 200}, 2, 1, 16, false, -1, 0, 0.0f, false},
        varlen_case{
            "chunked_prefill", {64, 100, 31}, {300, 100, 500}, 4, 4, 24, true, -1, 0, 0.0f, false},
        varlen_case{
            "speculative", {4, 4, 3, 5}, {70, 1000, 129, 4}, 8, 2, 64, true, -1, 0, 0.0f, false},
        varlen_case{"decode",
                    {1, 1, 1, 1, 1, 1},
                    {1, 63, 64, 65, 777, 2049},
                    8,
                    2,
                    128,
                    true,
                    -1,
                    0,
                    0.0f,
                    false},
        varlen_case{
            "decode_window", {1, 1, 1}, {100, 3000, 50}, 4, 1, 40, true, 70, 0, 0.0f, false},
        varlen_case{"window", {90, 200}, {300, 200}, 2, 2, 8, true, 17, 0, 0.0f, false},
        varlen_case{"chunked_local", {150, 40}, {150, 300}, 2, 1, 20, false, -1, 32, 0.0f, false},
        varlen_case{"softcap_sinks", {3, 80}, {500, 80}, 4, 2, 48, true, -1, 0, 5.0f, true},
        varlen_case{"more_queries_than_keys", {10, 3}, {4, 0}, 2, 1, 8, true, -1, 0, 0.0f, false},
        varlen_case{"empty_sequences", {0, 5, 0}, {0, 5, 9}, 2, 1, 8, true, -1, 0, 0.0f, false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(varlen_batch, matches_padded_batch_with_key_lengths_when_lengths_align) {
    // Items with Lq = Lk: the packed call and a padded [B, L] call with key_lengths agree where
    // the padded call's bottom-right alignment is the items' own (full-length items).
    const index_t L = 100, H = 2, D = 16;
    const std::vector<std::int64_t> len = {L, L, L};
    const auto cu = offsets(len);
    const auto q = random_packed<float>(3 * L, H, D, 1), k = random_packed<float>(3 * L, H, D, 2),
               v = random_packed<float>(3 * L, H, D, 3);
    packed<float> out(3 * L, H, D);
    softmax_options o;
    o.causal = true;
    attnkit::softmax_attention_varlen(q, k, v, cu, cu, out, o);
    const attnkit::view<const float, 4> q4(q.data(), {3, L, H, D}), k4(k.data(), {3, L, H, D}),
        v4(v.data(), {3, L, H, D});
    tensor4<float> out4(3, L, H, D);
    attnkit::softmax_attention(q4, k4, v4, out4, o);
    EXPECT_EQ(0, std::memcmp(out.data(), out4.data(),
                             sizeof(float) * static_cast<std::size_t>(out.size())));
}

TEST(varlen_errors, rejected_before_anything_is_written) {
    const auto q = random_packed<float>(10, 2, 8, 1), k = random_packed<float>(12, 1, 8, 2),
               v = random_packed<float>(12, 1, 8, 3);
    packed<float> out(10, 2, 8);
    out.setConstant(5.0f);
    auto expect_rejected = [&](const std::vector<std::int64_t>& cq,
                               const std::vector<std::int64_t>& ck, const softmax_options& o,
                               const char* what) {
        expect_invalid([&] { attnkit::softmax_attention_varlen(q, k, v, cq, ck, out, o); }, what);
        EXPECT_TRUE(all_equal_to(out, 5.0f));
    };
    const softmax_options o;
    expect_rejected({}, {0, 12}, o, "cu_seqlens_q: expected B + 1 offsets");
    expect_rejected({1, 10}, {0, 12}, o, "cu_seqlens_q[0]: expected 0");
    expect_rejected({0, 6, 4, 10}, {0, 4, 8, 12}, o, "cu_seqlens_q: expected non-decreasing");
    expect_rejected({0, 9}, {0, 12}, o, "cu_seqlens_q: the last offset must be the row count of q");
    expect_rejected({0, 10}, {0, 11}, o,
                    "cu_seqlens_k: the last offset must be the row count of k");
    expect_rejected({0, 10}, {0, 6, 12}, o, "cu_seqlens_k: expected B + 1 = 2 offsets");
    softmax_options kl;
    kl.key_lengths = {3};
    expect_rejected({0, 10}, {0, 12}, kl, "opts.key_lengths: expected empty");
    softmax_options w;
    w.window_left = -2;
    expect_rejected({0, 10}, {0, 12}, w, "opts.window_left");
    // out overlapping k
    EXPECT_THROW(attnkit::softmax_attention_varlen(
                     q, k, v, {0, 10}, {0, 12},
                     attnkit::view<float, 3>(const_cast<float*>(k.data()), {10, 2, 8}), o),
                 std::invalid_argument);
}

// int8 K/V: a batched int8_kv (B > 1) is not a packed one; a non-finite scale, bad offsets and
// an lse over the scales are refused, and out is untouched.
TEST(varlen_errors, int8_rejected_before_anything_is_written) {
    const auto q = random_packed<float>(10, 2, 8, 1);
    packed<std::int8_t> kq(12, 1, 8), vq(12, 1, 8);
    kq.setConstant(3);
    vq.setConstant(-2);
    Eigen::Tensor<float, 2, Eigen::RowMajor> ks(12, 1), vs(12, 1);
    ks.setConstant(0.01f);
    vs.setConstant(0.02f);
    packed<float> out(10, 2, 8);
    out.setConstant(5.0f);
    const attnkit::int8_kv k8(kq, ks), v8(vq, vs);
    const softmax_options o;
    auto expect_rejected = [&](auto&& call, const char* what) {
        expect_invalid(call, what);
        EXPECT_TRUE(all_equal_to(out, 5.0f));
    };
    // Batched int8 K/V [2, 6, 1, 8] over the same memory.
    const attnkit::view<const std::int8_t, 4> kb(kq.data(), {2, 6, 1, 8});
    const attnkit::view<const float, 3> kbs(ks.data(), {2, 6, 1});
    const attnkit::int8_kv k_batched(kb, kbs);
    expect_rejected([&] { attnkit::softmax_attention_varlen(q, k_batched, v8, {0, 10}, {0, 12}, out, o); },
                    "k: softmax_attention_varlen takes packed int8 K/V");
    Eigen::Tensor<float, 2, Eigen::RowMajor> bad = ks;
    bad(7, 0) = std::nanf("");
    const attnkit::int8_kv k_nan(kq, bad);
    expect_rejected([&] { attnkit::softmax_attention_varlen(q, k_nan, v8, {0, 4, 10}, {0, 5, 12}, out, o); },
                    "k.scales");
    expect_rejected([&] { attnkit::softmax_attention_varlen(q, k8, v8, {0, 4, 10}, {0, 5, 11}, out, o); },
                    "cu_seqlens_k: the last offset must be the row count of k");
    lse2 lse_on_scales(12, 1);
    EXPECT_THROW(attnkit::softmax_attention_varlen(
                     q, k8, v8, {0, 10}, {0, 12}, out,
                     attnkit::view<float, 2>(const_cast<float*>(vs.data()), {10, 2}), o),
                 std::invalid_argument);
    EXPECT_TRUE(all_equal_to(out, 5.0f));
}

}  // namespace
