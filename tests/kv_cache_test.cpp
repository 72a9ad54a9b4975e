// attnkit::kv_cache against a dense model of the same sequences (a std::vector of rows per
// sequence, each value rounded to the storage type once): append over steps of ragged sizes
// (prompt chunks, decode steps, speculative tokens), truncate, release and reuse of pages, every
// storage type; RoPE on append equal to rotating in float and rounding once; attention over the
// cache against the reference on the dense rows; errors (a full cache, unknown or repeated
// sequences, a stale step, wrong shapes) leave the cache as it was.
#include "attnkit/kv_cache.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/reference/model/rope.hpp"
#include "attnkit/reference/varlen_attention.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using namespace attnkit_test;
using attnkit::index_t;
using attnkit::kv_cache;
using attnkit::kv_cache_config;
using attnkit::kv_step;

template <class T = float>
using packed = Eigen::Tensor<T, 3, Eigen::RowMajor>;

constexpr index_t kHk = 2, kD = 24, kDv = 16, kH = 4;

kv_cache_config small_config(index_t pages) {
    kv_cache_config c;
    c.layers = 2;
    c.heads_kv = kHk;
    c.dim = kD;
    c.dim_v = kDv;
    c.pages = pages;
    c.page_rows = 64;
    return c;
}

// The dense model: per layer and sequence, its K and V rows as stored (rounded to T).
template <class T>
struct dense_model {
    std::map<index_t, std::vector<std::vector<double>>> k[2], v[2];
};

template <class T>
double stored(float x) {
    return static_cast<double>(static_cast<float>(T(x)));
}

// A row of n values as the cache stores it: each element rounded to T, or (int8) the row
// quantised by attnkit::quantize_kv and dequantised in double.
template <class T>
void append_stored(const float* x, index_t n, std::vector<double>& row) {
    if constexpr (std::is_same<T, std::int8_t>::value) {
        Eigen::Tensor<std::int8_t, 4, Eigen::RowMajor> q(1, 1, 1, n);
        Eigen::Tensor<float, 3, Eigen::RowMajor> s(1, 1, 1);
        attnkit::quantize_kv(attnkit::view<const float, 4>(x, {1, 1, 1, n}), q, s);
        for (index_t d = 0; d < n; ++d) row.push_back(static_cast<double>(s(0, 0, 0)) * q(0, 0, 0, d));
    } else {
        for (index_t d = 0; d < n; ++d) row.push_back(stored<T>(x[d]));
    }
}

// Element (pg, r, h, d) of a layer's pages as a double.
template <class P>
double page_value(const P& pages, index_t pg, index_t r, index_t h, index_t d) {
    if constexpr (std::is_same<P, attnkit::int8_kv>::value)
        return static_cast<double>(pages.scales()(pg, r, h)) * pages.values()(pg, r, h, d);
    else
        return static_cast<double>(static_cast<float>(*pages.ptr(pg, r, h, d)));
}

// Appends the step's rows (random float, seeded by the step) to the cache and to the model.
template <class T>
void append_step(kv_cache<T>& cache, dense_model<T>& m, const kv_step& st, std::uint64_t seed,
                 const attnkit::model::rope_options* rope = nullptr) {
    const index_t Tq = st.tokens();
    for (index_t layer = 0; layer < 2; ++layer) {
        packed<float> kn(Tq, kHk, kD), vn(Tq, kHk, kDv);
        fill_random(kn.data(), static_cast<std::size_t>(kn.size()), distribution::uniform,
                    seed + 10 * layer);
        fill_random(vn.data(), static_cast<std::size_t>(vn.size()), distribution::uniform,
                    seed + 10 * layer + 1);
        packed<float> rotated = kn;
        if (rope) {
            cache.append(layer, st, kn, vn, *rope);
            attnkit::model::rope(attnkit::view<float, 4>(rotated.data(), {1, Tq, kHk, kD}),
                                 st.positions_tensor(), *rope);
        } else {
            cache.append(layer, st, kn, vn);
        }
        index_t t = 0;
        for (std::size_t i = 0; i < st.seqs.size(); ++i) {
            auto& ks = m.k[layer][st.seqs[i]];
            auto& vs = m.v[layer][st.seqs[i]];
            for (std::int64_t j = st.kv.cu_seqlens_q[i]; j < st.kv.cu_seqlens_q[i + 1]; ++j, ++t) {
                std::vector<double> kr, vr;
                for (index_t h = 0; h < kHk; ++h) {
                    append_stored<T>(&rotated(t, h, 0), kD, kr);
                    append_stored<T>(&vn(t, h, 0), kDv, vr);
                }
                ks.push_back(kr);
                vs.push_back(vr);
            }
        }
    }
}

// Every live sequence's rows in the cache equal the model's, bit for bit.
template <class T>
::testing::AssertionResult same_contents(const kv_cache<T>& cache, const dense_model<T>& m) {
    for (index_t layer = 0; layer < 2; ++layer) {
        const auto kp = cache.k_pages(layer), vp = cache.v_pages(layer);
        for (const auto& entry : m.k[layer]) {
            const index_t id = entry.first;
            const auto& rows = entry.second;
            if (cache.length(id) != static_cast<index_t>(rows.size()))
                return ::testing::AssertionFailure()
                       << "sequence " << id << ": length " << cache.length(id) << ", model "
                       << rows.size();
            const auto& pages = cache.pages_of(id);
            for (index_t j = 0; j < cache.length(id); ++j) {
                const index_t pg = pages[static_cast<std::size_t>(j / 64)], r = j % 64;
                for (index_t h = 0; h < kHk; ++h) {
                    for (index_t d = 0; d < kD; ++d)
                        if (page_value(kp, pg, r, h, d) != rows[j][h * kD + d])
                            return ::testing::AssertionFailure()
                                   << "K of sequence " << id << " row " << j;
                    for (index_t d = 0; d < kDv; ++d)
                        if (page_value(vp, pg, r, h, d) != m.v[layer].at(id)[j][h * kDv + d])
                            return ::testing::AssertionFailure()
                                   << "V of sequence " << id << " row " << j;
                }
            }
        }
    }
    return ::testing::AssertionSuccess();
}

// Attention of a step's queries over the cache against the reference on the model's rows.
template <class T>
void expect_attention_matches(const kv_cache<T>& cache, const dense_model<T>& m, const kv_step& st,
                              index_t layer) {
    const index_t Tq = st.tokens();
    packed<float> q(Tq, kH, kD), out(Tq, kH, kDv);
    fill_random(q.data(), static_cast<std::size_t>(q.size()), distribution::uniform, 99);
    attnkit::softmax_options o;
    o.causal = true;
    cache.attention(layer, st, q, out, o);
    std::vector<std::int64_t> cu_k(1, 0);
    for (const index_t id : st.seqs)
        cu_k.push_back(cu_k.back() + static_cast<std::int64_t>(m.k[layer].at(id).size()));
    packed<double> k(cu_k.back(), kHk, kD), v(cu_k.back(), kHk, kDv), ro(Tq, kH, kDv);
    for (std::size_t i = 0; i < st.seqs.size(); ++i) {
        const auto& ks = m.k[layer].at(st.seqs[i]);
        const auto& vs = m.v[layer].at(st.seqs[i]);
        for (std::size_t j = 0; j < ks.size(); ++j)
            for (index_t h = 0; h < kHk; ++h) {
                for (index_t d = 0; d < kD; ++d)
                    k(cu_k[i] + static_cast<index_t>(j), h, d) = ks[j][h * kD + d];
                for (index_t d = 0; d < kDv; ++d)
                    v(cu_k[i] + static_cast<index_t>(j), h, d) = vs[j][h * kDv + d];
            }
    }
    attnkit::reference::softmax_attention_varlen(q, k, v, st.kv.cu_seqlens_q, cu_k, ro, o);
    EXPECT_TRUE(all_close(out, ro, tolerance_for(64.0, 1.0 + std::sqrt(static_cast<double>(kD)))));
}

template <class T>
void lifecycle() {
    kv_cache<T> cache(small_config(40));
    dense_model<T> m;
    const index_t a = cache.add_sequence(), b = cache.add_sequence(), c = cache.add_sequence();
    kv_step st = cache.begin_step({a, b, c}, {130, 1, 64});  // a prompt chunk, one token, a page
    append_step(cache, m, st, 1);
    EXPECT_TRUE(same_contents(cache, m));
    expect_attention_matches(cache, m, st, 0);
    EXPECT_EQ(cache.free_pages(), 40 - 3 - 1 - 1);

    st = cache.begin_step({b, a}, {200, 70});  // b's prompt after its first token; a's next chunk
    append_step(cache, m, st, 2);
    expect_attention_matches(cache, m, st, 1);
    for (int step = 0; step < 3; ++step) {  // decode steps, c speculating 4 tokens
        st = cache.begin_step({a, b, c}, {1, 1, 4});
        append_step(cache, m, st, 3 + static_cast<std::uint64_t>(step));
        expect_attention_matches(cache, m, st, step % 2);
    }
    EXPECT_TRUE(same_contents(cache, m));

    // c rejects 3 of its last 4 tokens; a finishes and its pages go to a new sequence d.
    cache.truncate(c, cache.length(c) - 3);
    for (auto& layer : m.k) layer[c].resize(static_cast<std::size_t>(cache.length(c)));
    for (auto& layer : m.v) layer[c].resize(static_cast<std::size_t>(cache.length(c)));
    const index_t free_before = cache.free_pages();
    const index_t a_pages = static_cast<index_t>(cache.pages_of(a).size());
    cache.release(a);
    for (auto& layer : m.k) layer.erase(a);
    for (auto& layer : m.v) layer.erase(a);
    EXPECT_EQ(cache.free_pages(), free_before + a_pages);
    const index_t d = cache.add_sequence();
    EXPECT_EQ(d, a);  // the released id is given out again
    st = cache.begin_step({c, d, b}, {1, 300, 1});
    append_step(cache, m, st, 40);
    EXPECT_TRUE(same_contents(cache, m));
    expect_attention_matches(cache, m, st, 0);
    cache.truncate(b, 0);
    for (auto& layer : m.k) layer[b].clear();
    for (auto& layer : m.v) layer[b].clear();
    EXPECT_TRUE(cache.pages_of(b).empty());
    EXPECT_TRUE(same_contents(cache, m));
}

TEST(kv_cache, lifecycle_float) { lifecycle<float>(); }
TEST(kv_cache, lifecycle_bfloat16) { lifecycle<Eigen::bfloat16>(); }
TEST(kv_cache, lifecycle_half) { lifecycle<Eigen::half>(); }
TEST(kv_cache, lifecycle_int8) { lifecycle<std::int8_t>(); }

// K rotated on the way in equals model::rope on the float rows, rounded to T, bit for bit: the
// interleaved form over the whole head, and rotate-half over a partial rotary dim (16 of 24; the
// rest passes through) with Llama 3.1 scaling.
attnkit::model::rope_options interleaved_rope() {
    attnkit::model::rope_options ro;
    ro.theta = 10000.0f;
    ro.style = attnkit::model::rope_style::interleaved;
    return ro;
}

attnkit::model::rope_options partial_llama3_rope() {
    attnkit::model::rope_options ro;
    ro.theta = 500000.0f;
    ro.rotary_dim = 16;
    ro.scaling.type = attnkit::model::rope_scaling_type::llama3;
    ro.scaling.factor = 8;
    ro.scaling.low_freq_factor = 1;
    ro.scaling.high_freq_factor = 4;
    ro.scaling.original_max_position_embeddings = 64;
    return ro;
}

template <class T>
void rope_on_append(const attnkit::model::rope_options& ro) {
    kv_cache<T> cache(small_config(8));
    dense_model<T> m;
    const index_t a = cache.add_sequence(), b = cache.add_sequence();
    kv_step st = cache.begin_step({a, b}, {70, 3});
    append_step(cache, m, st, 5, &ro);
    st = cache.begin_step({b, a}, {1, 1});
    append_step(cache, m, st, 6, &ro);
    EXPECT_TRUE(same_contents(cache, m));
    EXPECT_EQ(st.positions, (std::vector<std::int64_t>{3, 70}));
}

TEST(kv_cache, rope_on_append_float) { rope_on_append<float>(interleaved_rope()); }
TEST(kv_cache, rope_on_append_bfloat16) { rope_on_append<Eigen::bfloat16>(interleaved_rope()); }
TEST(kv_cache, rope_on_append_half) { rope_on_append<Eigen::half>(interleaved_rope()); }
TEST(kv_cache, rope_on_append_int8) { rope_on_append<std::int8_t>(interleaved_rope()); }
TEST(kv_cache, partial_rope_on_append_float) { rope_on_append<float>(partial_llama3_rope()); }
TEST(kv_cache, partial_rope_on_append_bfloat16) { rope_on_append<Eigen::bfloat16>(partial_llama3_rope()); }
TEST(kv_cache, partial_rope_on_append_int8) { rope_on_append<std::int8_t>(partial_llama3_rope()); }

// A prefill chunk long enough for the pool (Tq Hk D >= 65536 elements: 1500 tokens here) splits
// its tokens over three threads: the same rows as the serial reference, bit for bit.
template <class T>
void rope_on_long_append() {
    kv_cache<T> cache(small_config(32));
    dense_model<T> m;
    attnkit::thread_pool pool(3);
    attnkit::model::rope_options ro = partial_llama3_rope();
    ro.pool = &pool;
    const index_t a = cache.add_sequence(), b = cache.add_sequence();
    const kv_step st = cache.begin_step({a, b}, {1500, 9});
    append_step(cache, m, st, 11, &ro);
    EXPECT_TRUE(same_contents(cache, m));
}

TEST(kv_cache, rope_on_long_append_float) { rope_on_long_append<float>(); }
TEST(kv_cache, rope_on_long_append_bfloat16) { rope_on_long_append<Eigen::bfloat16>(); }
TEST(kv_cache, rope_on_long_append_int8) { rope_on_long_append<std::int8_t>(); }

// k_new in the cache's own 16-bit type: rotated from those values in float and rounded once,
// as model::rope does to a 16-bit tensor in place.
template <class T>
void rope_on_append_from_storage_type() {
    kv_cache<T> cache(small_config(4));
    dense_model<T> m;
    const index_t a = cache.add_sequence();
    const kv_step st = cache.begin_step({a}, {67});
    const index_t Tq = st.tokens();
    packed<float> kf(Tq, kHk, kD), vn(Tq, kHk, kDv);
    packed<T> kt(Tq, kHk, kD);
    fill_random(kf.data(), static_cast<std::size_t>(kf.size()), distribution::uniform, 21);
    fill_random(vn.data(), static_cast<std::size_t>(vn.size()), distribution::uniform, 22);
    for (index_t i = 0; i < kf.size(); ++i) {
        kt.data()[i] = T(kf.data()[i]);
        kf.data()[i] = static_cast<float>(kt.data()[i]);  // the 16-bit values, exactly
    }
    const attnkit::model::rope_options ro = partial_llama3_rope();
    cache.append(0, st, kt, vn, ro);
    // Independently of the kernels: the oracle's rotation in double, which the stored rows meet
    // to within T's rounding (half an ulp, relative) and float's arithmetic.
    Eigen::Tensor<double, 4, Eigen::RowMajor> want(1, Tq, kHk, kD);
    attnkit::reference::model::rope(attnkit::view<const float, 4>(kf.data(), {1, Tq, kHk, kD}), want,
                                    st.positions_tensor(), ro);
    attnkit::model::rope(attnkit::view<float, 4>(kf.data(), {1, Tq, kHk, kD}), st.positions_tensor(), ro);
    for (index_t t = 0; t < Tq; ++t) {
        std::vector<double> kr, vr;
        for (index_t h = 0; h < kHk; ++h) {
            append_stored<T>(&kf(t, h, 0), kD, kr);
            append_stored<T>(&vn(t, h, 0), kDv, vr);
        }
        m.k[0][a].push_back(kr);
        m.v[0][a].push_back(vr);
    }
    EXPECT_TRUE(same_contents(cache, m));
    const double half_ulp = std::is_same<T, Eigen::bfloat16>::value ? 0x1p-8 : 0x1p-11;
    for (index_t t = 0; t < Tq; ++t)  // the model's rows, which the cache holds bit for bit
        for (index_t h = 0; h < kHk; ++h)
            for (index_t d = 0; d < kD; ++d) {
                const double w = want(0, t, h, d), got = m.k[0][a][static_cast<std::size_t>(t)][h * kD + d];
                ASSERT_LE(std::fabs(got - w), half_ulp * std::fabs(w) + 1e-6) << t << " " << h << " " << d;
            }
}

TEST(kv_cache, rope_on_append_from_bfloat16) { rope_on_append_from_storage_type<Eigen::bfloat16>(); }
TEST(kv_cache, rope_on_append_from_half) { rope_on_append_from_storage_type<Eigen::half>(); }

// RoPE options the rows cannot take are refused before any row of the step is written.
TEST(kv_cache_errors, bad_rope_options_leave_the_step_unwritten) {
    kv_cache<Eigen::bfloat16> cache(small_config(4));
    const index_t a = cache.add_sequence();
    const kv_step st = cache.begin_step({a}, {3});
    packed<float> kn(3, kHk, kD), vn(3, kHk, kDv);
    kn.setConstant(1.0f);
    vn.setConstant(1.0f);
    auto raw = [&] {
        std::vector<unsigned char> bytes;
        for (index_t layer = 0; layer < 2; ++layer)
            for (const auto& p : {cache.k_pages(layer), cache.v_pages(layer)}) {
                const auto* b = reinterpret_cast<const unsigned char*>(p.data);
                const index_t n = p.dims[0] * p.dims[1] * p.dims[2] * p.dims[3];
                bytes.insert(bytes.end(), b, b + n * static_cast<index_t>(sizeof(Eigen::bfloat16)));
            }
        return bytes;
    };
    const std::vector<unsigned char> before = raw();
    attnkit::model::rope_options offset = interleaved_rope(), odd = interleaved_rope(), wide = interleaved_rope();
    offset.position_offset = 5;
    odd.rotary_dim = 7;
    wide.rotary_dim = 26;
    expect_invalid([&] { cache.append(0, st, kn, vn, offset); }, "opts.position_offset: expected 0 with a positions tensor");
    expect_invalid([&] { cache.append(0, st, kn, vn, odd); }, "opts.rotary_dim: the rotary dim must be even and >= 2");
    expect_invalid([&] { cache.append(1, st, kn, vn, wide); }, {"opts.rotary_dim", "k_new [1, 3, 2, 24]"});
    EXPECT_TRUE(raw() == before);
}

// An int8 cache cannot hold Inf or NaN: such a row is refused, the cache unchanged.
TEST(kv_cache_errors, int8_refuses_rows_that_are_not_finite) {
    kv_cache<std::int8_t> cache(small_config(4));
    dense_model<std::int8_t> m;
    const index_t a = cache.add_sequence();
    kv_step st = cache.begin_step({a}, {3});
    append_step(cache, m, st, 7);
    for (int which = 0; which < 2; ++which) {
        packed<float> kn(3, kHk, kD), vn(3, kHk, kDv);
        fill_random(kn.data(), static_cast<std::size_t>(kn.size()), distribution::uniform, 8);
        fill_random(vn.data(), static_cast<std::size_t>(vn.size()), distribution::uniform, 9);
        if (which)
            vn(2, 1, 5) = std::numeric_limits<float>::quiet_NaN();
        else
            kn(1, 0, 3) = std::numeric_limits<float>::infinity();
        expect_invalid([&] { cache.append(0, st, kn, vn); },
                       {which ? "v_new: row (2, 1)" : "k_new: row (1, 0)", "not finite"});
        EXPECT_TRUE(same_contents(cache, m));
    }
}

TEST(kv_cache_errors, leave_the_cache_unchanged) {
    kv_cache<float> cache(small_config(4));
    dense_model<float> m;
    const index_t a = cache.add_sequence(), b = cache.add_sequence();
    kv_step st = cache.begin_step({a, b}, {100, 10});
    append_step(cache, m, st, 7);
    const index_t free = cache.free_pages();
    auto unchanged = [&] {
        EXPECT_EQ(cache.free_pages(), free);
        EXPECT_EQ(cache.length(a), 100);
        EXPECT_EQ(cache.length(b), 10);
        EXPECT_TRUE(same_contents(cache, m));
    };
    expect_invalid(
        [&] {
            cache.begin_step({a, b}, {200, 1});
        },
        "the step needs 3 more pages of 64 tokens, 1 are free");
    unchanged();
    expect_invalid(
        [&] {
            cache.begin_step({a, a}, {1, 1});
        },
        "seqs[1]: sequence 0 is also seqs[0]");
    expect_invalid([&] { cache.begin_step({a, 7}, {1, 1}); }, "seqs[1]: no live sequence 7");
    expect_invalid([&] { cache.begin_step({a}, {-1}); }, "new_tokens[0]: expected 0 <= n");
    expect_invalid(
        [&] {
            cache.begin_step({a}, {1, 2});
        },
        "new_tokens: expected one count per sequence");
    expect_invalid([&] { cache.truncate(b, 11); },
                   "length: expected 0 <= length <= the sequence's length 10");
    unchanged();

    const kv_step step = cache.begin_step({b}, {1});  // b: 11 tokens
    packed<float> kn(1, kHk, kD), vn(1, kHk, kDv), wrong(2, kHk, kD);
    kn.setConstant(1.0f);
    vn.setConstant(1.0f);
    expect_invalid([&] { cache.append(0, step, wrong, vn); },
                   "k_new: expected shape [Tq, Hk, D] = [1, 2, 24]");
    expect_invalid([&] { cache.append(2, step, kn, vn); }, "layer: expected 0 <= layer < 2");
    expect_invalid([&] { cache.append(0, st, kn, vn); }, "step: not the cache's current step");
    packed<float> q(1, kH, kD), out(1, kH, kDv);
    q.setConstant(0.1f);
    out.setConstant(2.0f);
    expect_invalid([&] { cache.attention(0, st, q, out); }, "step: not the cache's current step");
    EXPECT_TRUE(all_equal_to(out, 2.0f));
    cache.release(a);
    expect_invalid([&] { cache.length(a); }, "seq: no live sequence 0");

    kv_cache_config bad = small_config(4);
    bad.page_rows = 48;
    expect_invalid([&] { kv_cache<float> c(bad); },
                   "config.page_rows: expected a positive multiple of 64");
    bad = small_config(1 << 20);
    bad.heads_kv = std::int64_t(1) << 40;
    expect_invalid([&] { kv_cache<float> c(bad); }, "overflows int64 bytes");
}

}  // namespace
