// Bad arguments (docs/design.md "Errors"): every entry point throws std::invalid_argument naming the
// argument and its actual shape or value, and writes nothing to out or lse.
//
// The tests are typed over entry points. To run them against another implementation with the
// same signatures (e.g. the fast kernel), include its header and add it to entry_points:
//     ATTNKIT_ENTRY_POINT(fast, attnkit::softmax_attention)
//     using entry_points = ::testing::Types<reference, fast>;
#include "attnkit/embedding_qk.hpp"
#include "attnkit/model/cross_entropy.hpp"
#include "attnkit/model/rms_norm.hpp"
#include "attnkit/model/rope.hpp"
#include "attnkit/mta_attention.hpp"
#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/self_gating_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/static_qk_attention.hpp"
#include "attnkit/taylor_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::softmax_options;
using attnkit::view;
using namespace attnkit_test;

#define ATTNKIT_ENTRY_POINT(NAME, FUNCTION)         \
    struct NAME {                                   \
        static constexpr const char* kName = #NAME; \
        template <class... A>                       \
        void operator()(A&&... a) const {           \
            FUNCTION(std::forward<A>(a)...);        \
        }                                           \
    };

ATTNKIT_ENTRY_POINT(reference, attnkit::reference::softmax_attention)
ATTNKIT_ENTRY_POINT(fast, attnkit::softmax_attention)
using entry_points = ::testing::Types<reference, fast>;

class entry_point_names {
public:
    template <class T>
    static std::string GetName(int) {
        return T::kName;
    }
};

// A valid problem: B = 2, Lq = 3, Lk = 4, H = 4, Hk = 2, D = 5, Dv = 6.
constexpr index_t B = 2, Lq = 3, Lk = 4, H = 4, Hk = 2, D = 5, Dv = 6;
constexpr float kSentinel = 7.0f;

template <class F>
class check_test : public ::testing::Test {
protected:
    tensor4<float> q = make_bshd(B, Lq, H, D, 0.5f);
    tensor4<float> k = make_bshd(B, Lk, Hk, D, 0.25f);
    tensor4<float> v = make_bshd(B, Lk, Hk, Dv, 1.0f);
    tensor4<float> out = make_bshd(B, Lq, H, Dv, kSentinel);
    tensor3<float> lse = make_lse(B, Lq, H, kSentinel);
    softmax_options opts;
    F call;

    // Runs f, which must throw std::invalid_argument whose message contains every string of
    // `parts`; then out and lse must still hold the sentinel.
    void expect_rejected(const std::function<void()>& f, std::initializer_list<std::string> parts) {
        expect_invalid(f, parts);
        EXPECT_TRUE(all_equal_to(out, kSentinel)) << "out was written";
        EXPECT_TRUE(all_equal_to(lse, kSentinel)) << "lse was written";
    }

    // With lse, and (separately) without it.
    void expect_rejected_both(std::initializer_list<std::string> parts) {
        expect_rejected([&] { call(q, k, v, out, lse, opts); }, parts);
        expect_rejected([&] { call(q, k, v, out, opts); }, parts);
    }
};

TYPED_TEST_SUITE(check_test, entry_points, entry_point_names);

TYPED_TEST(check_test, valid_problem_runs) {
    this->call(this->q, this->k, this->v, this->out, this->lse, this->opts);
    EXPECT_FALSE(all_equal_to(this->out, kSentinel));
    EXPECT_TRUE(all_close(this->out, make_bshd(B, Lq, H, Dv, 1.0f), 1e-6, 1e-6));
}

// A rank mismatch (rank-3 q, rank-4 lse, ...) no longer compiles: tests/compile_fail/ holds it.

TYPED_TEST(check_test, k_shape_disagreements) {
    for (const auto& dims :
         {std::array<index_t, 4>{B + 1, Lk, Hk, D}, std::array<index_t, 4>{B, Lk, Hk, D + 1}}) {
        this->k = make_bshd(dims[0], dims[1], dims[2], dims[3]);
        this->expect_rejected_both(
            {"k:", attnkit::shape_string(as_view(this->k)), "[B, Lk, Hk, D]"});
    }
}

TYPED_TEST(check_test, v_shape_disagreements) {
    for (const auto& dims :
         {std::array<index_t, 4>{B + 1, Lk, Hk, Dv}, std::array<index_t, 4>{B, Lk + 1, Hk, Dv},
          std::array<index_t, 4>{B, Lk, Hk + 2, Dv}}) {
        this->v = make_bshd(dims[0], dims[1], dims[2], dims[3]);
        this->expect_rejected_both(
            {"v:", attnkit::shape_string(as_view(this->v)), "[B, Lk, Hk, Dv]"});
    }
}

TYPED_TEST(check_test, out_shape_disagreements) {
    for (const auto& dims :
         {std::array<index_t, 4>{B + 1, Lq, H, Dv}, std::array<index_t, 4>{B, Lq + 1, H, Dv},
          std::array<index_t, 4>{B, Lq, H + 1, Dv}, std::array<index_t, 4>{B, Lq, H, Dv - 1},
          std::array<index_t, 4>{B, Lq, H, D}}) {
        tensor4<float> bad = make_bshd(dims[0], dims[1], dims[2], dims[3], kSentinel);
        const std::string shape = attnkit::shape_string(as_view(bad));
        this->expect_rejected(
            [&] { this->call(this->q, this->k, this->v, bad, this->lse, this->opts); },
            {"out:", shape, "[2, 3, 4, 6]"});
        this->expect_rejected([&] { this->call(this->q, this->k, this->v, bad, this->opts); },
                              {"out:", shape});
        EXPECT_TRUE(all_equal_to(bad, kSentinel));
    }
}

TYPED_TEST(check_test, lse_shape_disagreements) {
    for (const auto& dims :
         {std::array<index_t, 3>{B + 1, Lq, H}, std::array<index_t, 3>{B, Lq - 1, H},
          std::array<index_t, 3>{B, Lq, Hk}}) {
        tensor3<float> bad = make_lse(dims[0], dims[1], dims[2], kSentinel);
        this->expect_rejected(
            [&] { this->call(this->q, this->k, this->v, this->out, bad, this->opts); },
            {"lse:", attnkit::shape_string(as_view(bad)), "[2, 3, 4]"});
        EXPECT_TRUE(all_equal_to(bad, kSentinel));
    }
}

TYPED_TEST(check_test, heads_not_a_multiple) {
    this->k = make_bshd(B, Lk, 3, D);
    this->v = make_bshd(B, Lk, 3, Dv);
    this->expect_rejected_both({"k:", "H = 4", "Hk = 3"});
}

TYPED_TEST(check_test, empty_heads_or_head_dims) {
    this->q = make_bshd(B, Lq, H, 0);
    this->k = make_bshd(B, Lk, Hk, 0);
    this->expect_rejected_both({"q:", "[2, 3, 4, 0]"});
    this->q = make_bshd(B, Lq, H, D);
    this->k = make_bshd(B, Lk, Hk, D);
    this->v = make_bshd(B, Lk, Hk, 0);
    this->expect_rejected([&] { this->call(this->q, this->k, this->v, this->out, this->opts); },
                          {"v:", "[2, 4, 2, 0]"});
}

TYPED_TEST(check_test, option_ranges) {
    const float nan = std::numeric_limits<float>::quiet_NaN(),
                inf = std::numeric_limits<float>::infinity();
    auto with = [&](auto set, std::initializer_list<std::string> parts) {
        this->opts = softmax_options{};
        set(this->opts);
        this->expect_rejected_both(parts);
    };
    with([](softmax_options& o) { o.window_left = -2; }, {"opts.window_left", "-2"});
    with([](softmax_options& o) { o.chunk = -1; }, {"opts.chunk", "-1"});
    with([&](softmax_options& o) { o.scale = nan; }, {"opts.scale", "nan"});
    with([&](softmax_options& o) { o.scale = inf; }, {"opts.scale", "inf"});
    with([](softmax_options& o) { o.scale = -0.5f; }, {"opts.scale", "-0.5"});
    with([&](softmax_options& o) { o.softcap = nan; }, {"opts.softcap", "NaN"});
    with([&](softmax_options& o) { o.softcap = inf; }, {"opts.softcap", "inf"});
    with([](softmax_options& o) { o.key_lengths = {4}; }, {"opts.key_lengths", "B = 2", "got 1"});
    with([](softmax_options& o) { o.key_lengths = {4, 4, 4}; }, {"opts.key_lengths", "got 3"});
    with([](softmax_options& o) { o.key_lengths = {4, -1}; }, {"opts.key_lengths[1]", "-1"});
    with(
        [](softmax_options& o) {
            o.key_lengths = {Lk + 1, 0};
        },
        {"opts.key_lengths[0]", "Lk = 4", "5"});
    with([](softmax_options& o) { o.sinks = {0.f, 0.f}; }, {"opts.sinks", "H = 4", "got 2"});
    with([&](softmax_options& o) { o.sinks = {0.f, 0.f, nan, 0.f}; }, {"opts.sinks[2]", "nan"});
    with([&](softmax_options& o) { o.sinks = {inf, 0.f, 0.f, 0.f}; }, {"opts.sinks[0]", "inf"});
}

TYPED_TEST(check_test, valid_option_edges_are_accepted) {
    softmax_options o;
    o.window_left = 0;
    o.chunk = 1;
    o.key_lengths = {0, Lk};
    o.sinks = {-std::numeric_limits<float>::infinity(), 0.f, 1.f, -1.f};
    o.softcap = -1.0f;  // <= 0 is off
    EXPECT_NO_THROW(this->call(this->q, this->k, this->v, this->out, this->lse, o));
}

TYPED_TEST(check_test, last_stride_not_one) {
    // Same dims as the valid arguments, over a buffer twice as large, every other element.
    std::vector<float> buf(1000, 1.0f);
    auto strided4 = [&](index_t d0, index_t d1, index_t d2, index_t d3) {
        return view<float, 4>(buf.data(), {d0, d1, d2, d3},
                              {d1 * d2 * d3 * 2, d2 * d3 * 2, d3 * 2, 2});
    };
    const view<const float, 4> qs = strided4(B, Lq, H, D), ks = strided4(B, Lk, Hk, D),
                               vs = strided4(B, Lk, Hk, Dv);
    this->expect_rejected(
        [&] { this->call(qs, this->k, this->v, this->out, this->lse, this->opts); },
        {"q:", "stride 2", "[2, 3, 4, 5]"});
    this->expect_rejected(
        [&] { this->call(this->q, ks, this->v, this->out, this->lse, this->opts); },
        {"k:", "stride 2"});
    this->expect_rejected(
        [&] { this->call(this->q, this->k, vs, this->out, this->lse, this->opts); },
        {"v:", "stride 2"});
    std::vector<float> obuf(2 * B * Lq * H * Dv, kSentinel);
    const view<float, 4> os(obuf.data(), {B, Lq, H, Dv}, {Lq * H * Dv * 2, H * Dv * 2, Dv * 2, 2});
    this->expect_rejected([&] { this->call(this->q, this->k, this->v, os, this->lse, this->opts); },
                          {"out:", "stride 2"});
    // lse takes any strides (lse_in_bhl_layout_through_strides).
    for (float x : obuf) ASSERT_EQ(kSentinel, x);
}

TYPED_TEST(check_test, negative_dims_and_null_data) {
    const view<const float, 4> neg(this->q.data(), {B, -1, H, D});
    this->expect_rejected(
        [&] { this->call(neg, this->k, this->v, this->out, this->lse, this->opts); },
        {"q:", "negative"});
    const view<const float, 4> null_k(nullptr, {B, Lk, Hk, D});
    this->expect_rejected(
        [&] { this->call(this->q, null_k, this->v, this->out, this->lse, this->opts); },
        {"k:", "null"});
}

// Error text prints floats in their shortest form: 1e-40 is "1e-40", not "0.000000", and 3e38
// is "3e+38", not a 39-digit integer.
TYPED_TEST(check_test, error_text_prints_floats_in_shortest_form) {
    this->opts.softcap = 1e-40f;  // subnormal: 1 / softcap overflows
    this->expect_rejected_both({"opts.softcap", "got 1e-40"});
    this->opts = softmax_options{};
    this->opts.scale = 3e38f;
    this->expect_rejected_both({"opts.scale", "got 3e+38"});
    this->opts.scale = -0.25f;
    this->expect_rejected_both({"opts.scale", "got -0.25"});
}

// softcap is folded into softcap * log2(e) inside the kernels, as scale is: a softcap whose
// scaled form overflows (above ~2.36e38) is rejected, not turned into NaN everywhere.
TYPED_TEST(check_test, softcap_whose_scaled_form_overflows) {
    for (float cap : {2.4e38f, 3e38f, std::numeric_limits<float>::max()}) {
        this->opts.softcap = cap;
        this->expect_rejected_both({"opts.softcap", "e+38"});
    }
    this->opts.softcap = 1e38f;  // still finite after scaling: accepted, and finite output
    this->call(this->q, this->k, this->v, this->out, this->lse, this->opts);
    for (index_t i = 0; i < this->out.size(); ++i) ASSERT_TRUE(std::isfinite(this->out.data()[i]));
}

// Dimensions whose element count, or whose largest offset, overflows int64 are rejected (the
// product used to wrap, here to 0, which made null data look valid).
TYPED_TEST(check_test, dims_or_strides_overflowing_int64) {
    const view<const float, 4> huge(nullptr, {index_t(1) << 32, 64, index_t(1) << 30, 1});
    this->expect_rejected(
        [&] { this->call(huge, this->k, this->v, this->out, this->lse, this->opts); },
        {"q:", "overflow", "[4294967296, 64, 1073741824, 1]"});
    const index_t big = index_t(1) << 62;
    const view<const float, 4> far(this->k.data(), {B, Lk, Hk, D}, {big, big, 1, 1});
    this->expect_rejected(
        [&] { this->call(this->q, far, this->v, this->out, this->lse, this->opts); },
        {"k:", "overflow"});
}

// lse is written element by element, so any strides that keep its elements apart are fine:
// FlashAttention's [B, H, Lq] layout through strides gives the same numbers as a dense lse.
TYPED_TEST(check_test, lse_in_bhl_layout_through_strides) {
    this->call(this->q, this->k, this->v, this->out, this->lse, this->opts);
    std::vector<float> bhl(static_cast<std::size_t>(B * H * Lq), kSentinel);
    const view<float, 3> lse_bhl(bhl.data(), {B, Lq, H}, {H * Lq, 1, Lq});
    tensor4<float> out2 = make_bshd(B, Lq, H, Dv, kSentinel);
    this->call(this->q, this->k, this->v, out2, lse_bhl, this->opts);
    EXPECT_TRUE(all_close(out2, this->out, 0.0, 0.0));
    for (index_t b = 0; b < B; ++b)
        for (index_t i = 0; i < Lq; ++i)
            for (index_t h = 0; h < H; ++h)
                ASSERT_EQ(this->lse(b, i, h), bhl[static_cast<std::size_t>((b * H + h) * Lq + i)]);
}

// Outputs must not share memory with the inputs or with each other; out == q (same memory,
// same shape and strides) is allowed: each query row is read before its output row is written.
TYPED_TEST(check_test, outputs_overlapping_inputs_or_each_other) {
    // out laid over k: shapes agree once Dv = D and Lk = Lq, H = Hk.
    tensor4<float> q = make_bshd(1, 4, 2, 3, 0.5f), kv = make_bshd(1, 4, 2, 3, 1.0f);
    tensor4<float> vv = make_bshd(1, 4, 2, 3, 2.0f);
    tensor3<float> lse = make_lse(1, 4, 2, kSentinel);
    auto rejected = [&](auto&& f, std::initializer_list<std::string> parts) {
        try {
            f();
            ADD_FAILURE() << "no exception; expected one mentioning " << *parts.begin();
        } catch (const std::invalid_argument& e) {
            const std::string what = e.what();
            for (const std::string& p : parts)
                EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
        }
    };
    rejected([&] { this->call(q, kv, vv, kv, lse, this->opts); }, {"out", "k", "overlap"});
    rejected([&] { this->call(q, kv, vv, vv, this->opts); }, {"out", "v", "overlap"});
    EXPECT_TRUE(all_equal_to(kv, 1.0f));
    EXPECT_TRUE(all_equal_to(vv, 2.0f));
    // Half-overlapping out and q: not the same view, so rejected.
    std::vector<float> buf(2 * 24, 0.5f);
    const view<float, 4> qa(buf.data(), {1, 4, 2, 3}), ob(buf.data() + 12, {1, 4, 2, 3});
    rejected([&] { this->call(qa, kv, vv, ob, this->opts); }, {"out", "q", "overlap"});
    // out with a zero stride writes several rows to one place.
    tensor4<float> o = make_bshd(1, 4, 2, 3, kSentinel);
    const view<float, 4> zero(o.data(), {1, 4, 2, 3}, {24, 0, 3, 1});
    rejected([&] { this->call(q, kv, vv, zero, this->opts); }, {"out:", "overlap", "strides"});
    // lse inside out, lse over q, lse with a zero stride.
    const view<float, 3> lse_in_out(o.data() + 5, {1, 4, 2});
    rejected([&] { this->call(q, kv, vv, o, lse_in_out, this->opts); }, {"lse", "out", "overlap"});
    const view<float, 3> lse_in_q(q.data(), {1, 4, 2});
    rejected([&] { this->call(q, kv, vv, o, lse_in_q, this->opts); }, {"lse", "q", "overlap"});
    const view<float, 3> lse_zero(lse.data(), {1, 4, 2}, {8, 2, 0});
    rejected([&] { this->call(q, kv, vv, o, lse_zero, this->opts); }, {"lse:", "overlap"});
    EXPECT_TRUE(all_equal_to(o, kSentinel));
    EXPECT_TRUE(all_equal_to(lse, kSentinel));
}

TYPED_TEST(check_test, out_equal_to_q_is_allowed_and_exact) {
    // Decode (row kernel) and prefill (tile kernel) shapes, GQA, with and without split-KV.
    for (index_t Lq : {1, 3, 70}) {
        for (index_t Lk : {5, 1100}) {
            SCOPED_TRACE(::testing::Message() << "Lq " << Lq << ", Lk " << Lk);
            tensor4<float> q = random_bshd(2, Lq, 4, 8, distribution::gaussian, 61);
            const tensor4<float> k = random_bshd(2, Lk, 2, 8, distribution::gaussian, 62),
                                 v = random_bshd(2, Lk, 2, 8, distribution::gaussian, 63);
            tensor4<float> expect(2, Lq, 4, 8);
            tensor3<float> lse_expect(2, Lq, 4), lse(2, Lq, 4);
            softmax_options o;
            o.causal = true;
            this->call(q, k, v, expect, lse_expect, o);
            this->call(q, k, v, q, lse, o);  // in place
            EXPECT_TRUE(all_close(q, expect, 0.0, 0.0));
            EXPECT_TRUE(all_close(lse, lse_expect, 0.0, 0.0));
        }
    }
}

// Inputs may share memory freely: a fused QKV buffer, or k and v the same tensor.
TYPED_TEST(check_test, inputs_may_overlap_each_other) {
    std::vector<float> buf(static_cast<std::size_t>(2 * 5 * 3 * 4 * 6), 0.25f);
    const qkv_views<float> f = fused_qkv_views(buf.data(), 2, 5, 4, 6);
    tensor4<float> o = make_bshd(2, 5, 4, 6, kSentinel);
    EXPECT_NO_THROW(this->call(f.q, f.k, f.v, o, this->opts));
    EXPECT_NO_THROW(this->call(f.q, f.k, f.k, o, this->opts));
    EXPECT_TRUE(all_close(o, make_bshd(2, 5, 4, 6, 0.25f), 1e-6, 1e-6));
    // ... and writing into the q slot of a fused buffer (element-wise apart from k and v).
    EXPECT_NO_THROW(this->call(f.q, f.k, f.v, f.q, this->opts));
}

// reference::softmax_attention_weights validates before resizing its weights.
TEST(check_test_reference, weights_untouched_on_error) {
    tensor4<float> q = make_bshd(B, Lq, H, D), k = make_bshd(B, Lk, Hk, D),
                   v = make_bshd(B, Lk, Hk, Dv);
    tensor4<float> out = make_bshd(B, Lq, H, Dv, kSentinel);
    tensor3<float> lse = make_lse(B, Lq, H, kSentinel);
    Eigen::Tensor<double, 4, Eigen::RowMajor> w(1, 1, 1, 1);
    w.setConstant(7.0);
    softmax_options o;
    o.window_left = -5;
    EXPECT_THROW(attnkit::reference::softmax_attention_weights(q, k, v, out, lse, w, o),
                 std::invalid_argument);
    EXPECT_EQ(1, w.size());
    EXPECT_EQ(7.0, w(0, 0, 0, 0));
    EXPECT_TRUE(all_equal_to(out, kSentinel));
    EXPECT_TRUE(all_equal_to(lse, kSentinel));
}

// Every decode state checks its sizes through one routine (detail::check_state_sizes): the
// message names the state and gives all five sizes, for each kind of mistake.
template <class Make>
void expect_state_rejected(Make make, const std::string& state, const std::string& sizes, const std::string& rule) {
    expect_invalid(make, {state + ":", sizes, rule});
}

TEST(check_test_state, state_sizes_name_the_state_and_every_size) {
    struct bad_sizes {
        index_t batch, heads, heads_kv, dim, dim_v;
        const char* sizes;
        const char* rule;
    };
    const bad_sizes cases[] = {
        {-1, 4, 2, 8, 8, "batch -1, heads 4, heads_kv 2, dim 8, dim_v 8", "batch >= 0"},
        {1, 0, 1, 8, 8, "batch 1, heads 0, heads_kv 1, dim 8, dim_v 8", "heads, heads_kv, dim, dim_v >= 1"},
        {1, 4, 0, 8, 8, "batch 1, heads 4, heads_kv 0, dim 8, dim_v 8", "heads, heads_kv, dim, dim_v >= 1"},
        {1, 4, 2, 0, 8, "batch 1, heads 4, heads_kv 2, dim 0, dim_v 8", "heads, heads_kv, dim, dim_v >= 1"},
        {1, 4, 2, 8, 0, "batch 1, heads 4, heads_kv 2, dim 8, dim_v 0", "heads, heads_kv, dim, dim_v >= 1"},
        {1, 4, 3, 8, 8, "batch 1, heads 4, heads_kv 3, dim 8, dim_v 8", "multiple of heads_kv"},
    };
    for (const bad_sizes& c : cases) {
        expect_state_rejected([&] { attnkit::taylor_state(c.batch, c.heads, c.heads_kv, c.dim, c.dim_v); },
                              "taylor_state", c.sizes, c.rule);
        expect_state_rejected(
            [&] { attnkit::self_gating_state(c.batch, c.heads, c.heads_kv, c.dim, c.dim_v); },
            "self_gating_state", c.sizes, c.rule);
        expect_state_rejected(
            [&] { attnkit::mta_state(c.batch, c.heads, c.heads_kv, c.dim, c.dim_v, attnkit::mta_options{}); },
            "mta_state", c.sizes, c.rule);
    }
    // key_lengths: the two states that take them in their options refuse them the same way.
    attnkit::taylor_options to;
    to.key_lengths = {3};
    expect_state_rejected([&] { attnkit::taylor_state(1, 2, 1, 8, 8, to); }, "taylor_state", "got 1 lengths",
                          "opts.key_lengths must be empty");
    attnkit::self_gating_options so;
    so.key_lengths = {3, 4};
    expect_state_rejected([&] { attnkit::self_gating_state(2, 2, 1, 8, 8, so); }, "self_gating_state",
                          "got 2 lengths", "opts.key_lengths must be empty");
}

// MTA's outputs share no memory with its inputs (detail/mta/check.hpp): not even out = q, since
// a query block re-reads the convolution halo rows of the block before it. mta_state::step
// allows exactly out = q (a token's query is copied before its output is written).
TEST(check_test_mta, out_overlapping_an_input_is_rejected) {
    const index_t b = 1, l = 5, h = 2, d = 4;
    tensor4<float> q = make_bshd(b, l, h, d, 0.5f), k = make_bshd(b, l, h, d, 0.25f), v = make_bshd(b, l, h, d, 1.0f);
    const attnkit::mta_options o;
    const auto expect_overlap = [](const std::function<void()>& f, const std::string& input) {
        expect_invalid(f, "out [1, 5, 2, 4] and " + input + " [1, 5, 2, 4] overlap in memory");
    };
    expect_overlap([&] { attnkit::mta_attention(q, k, v, q, o); }, "q");
    expect_overlap([&] { attnkit::mta_attention(q, k, v, k, o); }, "k");
    expect_overlap([&] { attnkit::mta_attention(q, k, v, v, o); }, "v");
    EXPECT_TRUE(all_equal_to(q, 0.5f));
    EXPECT_TRUE(all_equal_to(k, 0.25f));
    EXPECT_TRUE(all_equal_to(v, 1.0f));

    attnkit::mta_state st(b, h, h, d, d, o);
    expect_overlap([&] { st.step(q, k, v, k); }, "k");
    expect_overlap([&] { st.step(q, k, v, v); }, "v");
    EXPECT_EQ(0, st.length());
    EXPECT_TRUE(all_equal_to(k, 0.25f));
    EXPECT_TRUE(all_equal_to(v, 1.0f));
    // In place over q: v is constant, so every output is 1.
    st.step(q, k, v, q);
    EXPECT_EQ(l, st.length());
    EXPECT_TRUE(all_close(q, make_bshd(b, l, h, d, 1.0f), 1e-6, 1e-6));
}

// Sizes whose products overflow int64 are std::invalid_argument naming the argument before
// anything is allocated; they used to wrap (UBSan: signed overflow) and then reach bad_alloc,
// length_error or a message with a negative width.
TEST(check_test_overflow, state_sizes_whose_bytes_overflow_int64) {
    const index_t big = index_t(1) << 62;
    const std::string sizes = "batch " + std::to_string(big) + ", heads 1, heads_kv 1, dim 8, dim_v 8";
    expect_invalid([&] { attnkit::taylor_state(big, 1, 1, 8, 8); }, {"taylor_state:", sizes, "overflows int64"});
    expect_invalid([&] { attnkit::self_gating_state(big, 1, 1, 8, 8); },
                   {"self_gating_state:", sizes, "overflows int64"});
    expect_invalid([&] { attnkit::mta_state(big, 1, 1, 8, 8, attnkit::mta_options{}); },
                   {"mta_state:", sizes, "overflows int64"});
}

TEST(check_test_overflow, linear_taylor_state_of_a_huge_head_dim) {
    // The linear Taylor state holds D(D+1)/2 feature rows per item: D = 2^31 overflows there.
    attnkit::taylor_options lin;
    lin.form = attnkit::taylor_form::linear;
    expect_invalid([&] { attnkit::taylor_state(1, 1, 1, index_t(1) << 31, 8, lin); },
                   {"taylor_state:", "linear state", "overflows int64"});
}

TEST(check_test_overflow, static_map_of_a_long_zero_stride_stream) {
    const float one = 1.0f;
    const index_t L = index_t(1) << 32;  // L (L + 1) / 2 > 2^63
    const view<const float, 4> qf(&one, {1, L, 1, 1}, {0, 0, 1, 1});
    expect_invalid([&] { attnkit::static_attention_map m(qf, qf); },
                   {"q_fixed:", "Lmax = 4294967296", "overflows int64"});
    const view<const float, 4> qh(&one, {1, index_t(1) << 30, index_t(1) << 20, 1}, {0, 0, 0, 1});
    expect_invalid([&] { attnkit::static_attention_map m(qh, qh); }, {"q_fixed:", "H = 1048576", "overflows int64"});
}

TEST(check_test_overflow, embedding_layout_heads_plus_heads_kv) {
    const float one = 1.0f;
    const view<const float, 3> qk(&one, {1, 1, 1}, {1, 1, 1});
    const std::string too_large = "layout: layers * (heads + heads_kv) * dim is too large";
    const attnkit::embedding_qk_layout lay{1, index_t(1) << 62, index_t(1) << 62, 1};
    expect_invalid([&] { attnkit::embedding_q(qk, lay, 0); }, too_large);
    const attnkit::embedding_qk_layout wide{index_t(1) << 30, 4, 4, index_t(1) << 30};
    expect_invalid([&] { attnkit::embedding_k(qk, wide, 0); }, too_large);
}

// Every decode state checks a step through one routine (detail::check_state_step): the messages
// name the argument and the state.
TEST(check_test_state, step_checks_name_the_argument_and_the_state) {
    const tensor4<float> q = make_bshd(1, 2, 4, 8, 0.5f), k = make_bshd(1, 2, 2, 8, 0.5f);
    const tensor4<float> k_bad = make_bshd(1, 2, 2, 6, 0.5f), q0 = make_bshd(1, 0, 4, 8, 0.5f);
    tensor4<float> out = make_bshd(1, 2, 4, 8, kSentinel), out_bad = make_bshd(1, 2, 3, 8, kSentinel);
    attnkit::taylor_state ts(1, 4, 2, 8, 8);
    attnkit::self_gating_state gs(1, 4, 2, 8, 8);
    attnkit::mta_state ms(1, 4, 2, 8, 8, attnkit::mta_options{});
    expect_invalid([&] { ts.step(q, k_bad, k, out); }, "k: expected shape [B, T, Hk, D] of the taylor_state");
    expect_invalid([&] { gs.step(q, k_bad, k, out); }, "k: expected shape [B, T, Hk, D] of the self_gating_state");
    expect_invalid([&] { ms.step(q, k_bad, k, out); }, "k: expected shape [B, T, Hk, D] of the mta_state");
    expect_invalid([&] { ts.step(q, k, k, out_bad); }, "out: expected shape [B, T, H, Dv] of the taylor_state");
    expect_invalid([&] { gs.step(q, k, k, out_bad); }, "out: expected shape [B, T, H, Dv] of the self_gating_state");
    expect_invalid([&] { ms.step(q, k, k, out_bad); }, "out: expected shape [B, T, H, Dv] of the mta_state");
    expect_invalid([&] { ts.step(q0, k, k, out); }, "q: a taylor_state step appends T >= 1 tokens");
    expect_invalid([&] { gs.step(q0, k, k, out); }, "q: a self_gating_state step appends T >= 1 tokens");
    // out over k: rejected by every state (out over q itself, the same view, is allowed).
    tensor4<float> kv = make_bshd(1, 2, 4, 8, 0.5f);
    const view<const float, 4> kk(kv.data(), {1, 2, 2, 8}, {64, 32, 8, 1});
    expect_invalid([&] { ts.step(q, kk, kk, kv); }, "out");
    expect_invalid([&] { gs.step(q, kk, kk, kv); }, "out");
    expect_invalid([&] { ms.step(q, kk, kk, kv); }, "out");
    EXPECT_TRUE(all_equal_to(out, kSentinel));
    EXPECT_EQ(0, ts.length());
    EXPECT_EQ(0, gs.length());
    EXPECT_EQ(0, ms.length());
}

// Float options in messages print in shortest form (detail::number), never std::to_string's six
// fixed decimals ("-0.000000" for -1e-40).
TEST(check_test_numbers, float_options_print_in_shortest_form) {
    const tensor4<float> q = make_bshd(1, 3, 2, 4, 0.5f);
    tensor4<float> out = make_bshd(1, 3, 2, 4, kSentinel);
    attnkit::mta_options o;
    o.norm_eps = -1e-40f;
    expect_invalid([&] { attnkit::mta_attention(q, q, q, out, o); }, "opts.norm_eps: expected a finite value > 0, got -1e-40");
    attnkit::model::rope_options r;
    r.theta = 1e-40f;
    expect_invalid([&] { attnkit::model::rope(out, r); }, "opts.theta: expected a finite value > 1, got 1e-40");
    Eigen::Tensor<float, 2, Eigen::RowMajor> x(3, 4), y(3, 4);
    Eigen::Tensor<float, 1, Eigen::RowMajor> w(4);
    x.setConstant(1.0f), y.setConstant(kSentinel), w.setConstant(1.0f);
    expect_invalid([&] { attnkit::model::rms_norm(x, w, y, -1e-40f); }, "eps: expected a finite value > 0, got -1e-40");
    EXPECT_TRUE(all_equal_to(y, kSentinel));
    attnkit::taylor_options t;
    t.eps = -1e-40f;
    expect_invalid([&] { attnkit::taylor_attention(q, q, q, out, t); }, "opts.eps: expected a finite value >= 0, got -1e-40");
    EXPECT_TRUE(all_equal_to(out, kSentinel));
}

// The training pieces of the model (rms_norm_backward, rope_backward, cross_entropy): a bad
// argument is named with its shape, and nothing is written.
TEST(check_test_model, backward_pieces_reject_bad_shapes) {
    Eigen::Tensor<float, 2, Eigen::RowMajor> x(3, 4), g(3, 4), dx(3, 4);
    Eigen::Tensor<float, 1, Eigen::RowMajor> w(4), dw(5);
    x.setConstant(1.0f), g.setConstant(1.0f), w.setConstant(1.0f);
    dx.setConstant(kSentinel), dw.setConstant(kSentinel);
    expect_invalid([&] { attnkit::model::rms_norm_backward(x, w, g, dx, dw); },
                   "d_weight: expected shape [d] = [4] for x [3, 4], got [5]");
    EXPECT_TRUE(all_equal_to(dx, kSentinel));
    tensor4<float> d = make_bshd(1, 3, 2, 4, kSentinel);
    attnkit::model::rope_options r;
    r.rotary_dim = 6;
    expect_invalid([&] { attnkit::model::rope_backward(d, r); }, "opts.rotary_dim");
    EXPECT_TRUE(all_equal_to(d, kSentinel));
    expect_invalid([&] { attnkit::model::cross_entropy(x, std::vector<std::int32_t>{0, 4, 1}, dx); },
                   "targets: expected < V = 4");
    EXPECT_TRUE(all_equal_to(dx, kSentinel));
}

}  // namespace
