// StaticEmbQK (docs/variants.md section 5): the one-GEMM projection against plain loops
// (attnkit::reference::embedding_qk_projection and the per-layer products of the unstacked
// weights), the per-layer views (contents, strides, data inside qk), softmax_attention on the
// views equal to the same attention on copies, thread determinism, and bad layouts / widths /
// layers rejected before anything is written.
#include <gtest/gtest.h>

#include <attnkit/attnkit.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::embedding_qk_layout;
using attnkit::index_t;
using attnkit_test::distribution;
using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;

constexpr double kEps = std::numeric_limits<float>::epsilon();

index_t width_of(const embedding_qk_layout& l) { return l.layers * (l.heads + l.heads_kv) * l.dim; }

// |qk - e w| <= (d + 2) eps sum_k |e_k w_kc| element by element (the worst case of a float dot
// product in any order): never fails for a correct product, fails for any wrong element.
::testing::AssertionResult projection_matches(const tensor3& e, const tensor2& w, const tensor3& qk) {
    const index_t B = e.dimension(0), L = e.dimension(1), d = e.dimension(2), n = w.dimension(1);
    for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < L; ++t)
            for (index_t c = 0; c < n; ++c) {
                double s = 0, mag = 0;
                for (index_t k = 0; k < d; ++k) {
                    s += double(e(b, t, k)) * w(k, c);
                    mag += std::fabs(double(e(b, t, k)) * w(k, c));
                }
                if (!(std::fabs(qk(b, t, c) - s) <= (d + 2) * kEps * mag))
                    return ::testing::AssertionFailure() << "qk(" << b << ", " << t << ", " << c << ") = " << qk(b, t, c)
                                                         << ", expected " << s;
            }
    return ::testing::AssertionSuccess();
}

struct problem {
    index_t B, L, d;
    embedding_qk_layout layout;
};

// Single rows and layers, GQA, more than one 256-row block, more than one 2048-column block.
const problem kProblems[] = {{1, 1, 1, {1, 1, 1, 1}},    {2, 7, 5, {3, 2, 1, 3}},   {3, 33, 17, {2, 4, 2, 8}},
                             {1, 300, 64, {4, 2, 2, 16}}, {2, 9, 8, {3, 12, 12, 64}}, {1, 600, 13, {1, 1, 1, 5}}};

TEST(embedding_qk, projection_matches_plain_loops) {
    std::uint64_t seed = 1;
    for (const problem& p : kProblems)
        for (distribution dist : attnkit_test::kAllDistributions) {
            tensor3 e(p.B, p.L, p.d), qk(p.B, p.L, width_of(p.layout)), ref(p.B, p.L, width_of(p.layout));
            tensor2 w(p.d, width_of(p.layout));
            attnkit_test::fill_random(e, dist, seed++);
            attnkit_test::fill_random(w, dist, seed++);
            qk.setConstant(std::numeric_limits<float>::quiet_NaN());
            attnkit::embedding_qk_projection(e, w, qk, p.layout);
            ASSERT_TRUE(projection_matches(e, w, qk)) << "L " << p.L << " width " << width_of(p.layout);
            attnkit::reference::embedding_qk_projection(e, w, ref, p.layout);
            ASSERT_TRUE(projection_matches(e, w, ref));
        }
}

TEST(embedding_qk, stacked_weights_give_each_layers_own_projection) {
    const index_t B = 2, L = 11, d = 10;
    const embedding_qk_layout lay{3, 4, 2, 5};
    std::vector<tensor2> wq, wk;
    for (index_t l = 0; l < lay.layers; ++l) {
        wq.emplace_back(d, lay.heads * lay.dim);
        wk.emplace_back(d, lay.heads_kv * lay.dim);
        attnkit_test::fill_random(wq.back(), distribution::gaussian, 10 + 2 * l);
        attnkit_test::fill_random(wk.back(), distribution::gaussian, 11 + 2 * l);
    }
    tensor2 w(d, width_of(lay));
    attnkit::stack_embedding_qk_weights(wq, wk, w);
    tensor3 e(B, L, d), qk(B, L, width_of(lay));
    attnkit_test::fill_random(e, distribution::uniform, 3);
    attnkit::embedding_qk_projection(e, w, qk, lay);
    for (index_t l = 0; l < lay.layers; ++l) {
        const attnkit::view<const float, 4> q = attnkit::embedding_q(qk, lay, l), k = attnkit::embedding_k(qk, lay, l);
        for (index_t b = 0; b < B; ++b)
            for (index_t t = 0; t < L; ++t) {
                for (index_t c = 0; c < lay.heads * lay.dim; ++c) {
                    double s = 0, mag = 0;
                    for (index_t i = 0; i < d; ++i) s += double(e(b, t, i)) * wq[l](i, c), mag += std::fabs(double(e(b, t, i)) * wq[l](i, c));
                    ASSERT_NEAR(q(b, t, c / lay.dim, c % lay.dim), s, (d + 2) * kEps * mag) << "layer " << l;
                }
                for (index_t c = 0; c < lay.heads_kv * lay.dim; ++c) {
                    double s = 0, mag = 0;
                    for (index_t i = 0; i < d; ++i) s += double(e(b, t, i)) * wk[l](i, c), mag += std::fabs(double(e(b, t, i)) * wk[l](i, c));
                    ASSERT_NEAR(k(b, t, c / lay.dim, c % lay.dim), s, (d + 2) * kEps * mag) << "layer " << l;
                }
            }
    }
}

TEST(embedding_qk, views_point_into_qk_without_copies) {
    const embedding_qk_layout lay{4, 6, 3, 7};
    const index_t B = 2, L = 5, W = width_of(lay);
    tensor3 qk(B, L, W);
    for (index_t i = 0; i < qk.size(); ++i) qk.data()[i] = static_cast<float>(i);
    for (index_t l = 0; l < lay.layers; ++l) {
        const auto q = attnkit::embedding_q(qk, lay, l);
        const auto k = attnkit::embedding_k(qk, lay, l);
        EXPECT_EQ(q.dims, (std::array<index_t, 4>{B, L, lay.heads, lay.dim}));
        EXPECT_EQ(k.dims, (std::array<index_t, 4>{B, L, lay.heads_kv, lay.dim}));
        EXPECT_EQ(q.strides, (std::array<index_t, 4>{L * W, W, lay.dim, 1}));
        EXPECT_EQ(k.strides, q.strides);
        const index_t base = l * (lay.heads + lay.heads_kv) * lay.dim;
        for (index_t b = 0; b < B; ++b)
            for (index_t t = 0; t < L; ++t) {
                for (index_t h = 0; h < lay.heads; ++h)
                    for (index_t x = 0; x < lay.dim; ++x) {
                        const float* p = &q(b, t, h, x);
                        ASSERT_GE(p, qk.data());
                        ASSERT_LT(p, qk.data() + qk.size());
                        ASSERT_EQ(p, &qk(b, t, base + h * lay.dim + x));
                    }
                for (index_t h = 0; h < lay.heads_kv; ++h)
                    for (index_t x = 0; x < lay.dim; ++x)
                        ASSERT_EQ(&k(b, t, h, x), &qk(b, t, base + (lay.heads + h) * lay.dim + x));
            }
    }
    // A const TensorMap and a mutable view of qk give the same views.
    const Eigen::TensorMap<const tensor3> cm(qk.data(), B, L, W);
    EXPECT_EQ(attnkit::embedding_k(cm, lay, 2).data, attnkit::embedding_k(qk, lay, 2).data);
    const attnkit::view<float, 3> mv(qk.data(), {B, L, W});
    EXPECT_EQ(attnkit::embedding_q(mv, lay, 3).data, attnkit::embedding_q(qk, lay, 3).data);
}

tensor4 copy_of(const attnkit::view<const float, 4>& v) {
    tensor4 t(v.dims[0], v.dims[1], v.dims[2], v.dims[3]);
    for (index_t a = 0; a < v.dims[0]; ++a)
        for (index_t b = 0; b < v.dims[1]; ++b)
            for (index_t c = 0; c < v.dims[2]; ++c)
                for (index_t d = 0; d < v.dims[3]; ++d) t(a, b, c, d) = v(a, b, c, d);
    return t;
}

TEST(embedding_qk, views_through_softmax_attention_equal_attention_on_copies) {
    const index_t B = 2, L = 37, d = 24;
    for (const embedding_qk_layout& lay : {embedding_qk_layout{3, 4, 4, 16}, embedding_qk_layout{2, 8, 2, 9}}) {
        tensor3 e(B, L, d), qk(B, L, width_of(lay));
        tensor2 w(d, width_of(lay));
        attnkit_test::fill_random(e, distribution::gaussian, 21);
        attnkit_test::fill_random(w, distribution::gaussian, 22);
        w = w * (1.0f / std::sqrt(static_cast<float>(d)));
        attnkit::embedding_qk_projection(e, w, qk, lay);
        for (index_t l = 0; l < lay.layers; ++l) {
            const tensor4 v = attnkit_test::random_bshd(B, L, lay.heads_kv, 11, distribution::gaussian, 30 + l);
            for (bool causal : {false, true}) {
                attnkit::softmax_options o;
                o.causal = causal;
                tensor4 out(B, L, lay.heads, 11), out_copy(B, L, lay.heads, 11);
                attnkit::softmax_attention(attnkit::embedding_q(qk, lay, l), attnkit::embedding_k(qk, lay, l), v, out, o);
                const tensor4 q = copy_of(attnkit::embedding_q(qk, lay, l)), k = copy_of(attnkit::embedding_k(qk, lay, l));
                attnkit::softmax_attention(q, k, v, out_copy, o);
                EXPECT_EQ(0, std::memcmp(out.data(), out_copy.data(), sizeof(float) * out.size()))
                    << "layer " << l << " causal " << causal;
            }
        }
    }
}

TEST(embedding_qk, projection_threads_and_strided_batches_are_bitwise_identical) {
    const index_t B = 3, L = 270, d = 19;
    const embedding_qk_layout lay{3, 14, 14, 32};  // 2688 columns: two column blocks
    tensor3 e(B, L, d), serial(B, L, width_of(lay));
    tensor2 w(d, width_of(lay));
    attnkit_test::fill_random(e, distribution::outliers, 41);
    attnkit_test::fill_random(w, distribution::gaussian, 42);
    attnkit::embedding_qk_projection(e, w, serial, lay);
    for (std::size_t n : {1, 2, 3}) {
        attnkit::thread_pool pool(n);
        tensor3 qk(B, L, width_of(lay));
        attnkit::embedding_qk_projection(e, w, qk, lay, &pool);
        EXPECT_EQ(0, std::memcmp(qk.data(), serial.data(), sizeof(float) * qk.size())) << n << " threads";
    }
    // e and qk with padded batch items: one product per batch item, still the same numbers.
    std::vector<float> ebuf(static_cast<std::size_t>(B * (L + 2) * d)), qbuf(static_cast<std::size_t>(B * (L + 1) * width_of(lay)));
    const attnkit::view<float, 3> ev(ebuf.data(), {B, L, d}, {(L + 2) * d, d, 1});
    const attnkit::view<float, 3> qv(qbuf.data(), {B, L, width_of(lay)}, {(L + 1) * width_of(lay), width_of(lay), 1});
    for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < L; ++t)
            for (index_t k = 0; k < d; ++k) ev(b, t, k) = e(b, t, k);
    attnkit::thread_pool pool(2);
    attnkit::embedding_qk_projection(attnkit::view<const float, 3>(ev), w, qv, lay, &pool);
    tensor3 got(B, L, width_of(lay));
    for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < L; ++t)
            for (index_t c = 0; c < width_of(lay); ++c) got(b, t, c) = qv(b, t, c);
    EXPECT_TRUE(projection_matches(e, w, got));
}

template <class F>
void expect_invalid(F&& f, const std::vector<std::string>& words) {
    try {
        f();
        ADD_FAILURE() << "no exception for " << words[0];
    } catch (const std::invalid_argument& e) {
        for (const std::string& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
}

TEST(embedding_qk, bad_layouts_widths_and_layers_are_rejected_before_any_write) {
    const embedding_qk_layout lay{2, 4, 2, 3};
    const index_t B = 2, L = 3, d = 5, W = width_of(lay);  // W = 36
    tensor3 e(B, L, d), qk(B, L, W);
    tensor2 w(d, W);
    attnkit_test::fill_random(e, distribution::uniform, 1);
    attnkit_test::fill_random(w, distribution::uniform, 2);
    qk.setConstant(4.0f);
    auto untouched = [&] { return attnkit_test::all_equal_to(qk, 4.0f); };
    expect_invalid([&] { attnkit::embedding_qk_projection(e, w, qk, {0, 4, 2, 3}); }, {"layout", "layers 0"});
    expect_invalid([&] { attnkit::embedding_qk_projection(e, w, qk, {2, 4, 3, 3}); }, {"layout", "multiple"});
    expect_invalid([&] { attnkit::embedding_qk_projection(e, w, qk, {2, 4, 2, -1}); }, {"layout", "dim -1"});
    expect_invalid([&] { attnkit::embedding_qk_projection(e, w, qk, {3, 4, 2, 3}); }, {"w", "[5, 54]", "[5, 36]"});
    tensor2 w_rows(d + 1, W);
    w_rows.setZero();
    expect_invalid([&] { attnkit::embedding_qk_projection(e, w_rows, qk, lay); }, {"w", "[6, 36]"});
    tensor3 qk_narrow(B, L, W - 1);
    qk_narrow.setConstant(4.0f);
    expect_invalid([&] { attnkit::embedding_qk_projection(e, w, qk_narrow, lay); }, {"qk", "[2, 3, 35]", "[2, 3, 36]"});
    EXPECT_TRUE(attnkit_test::all_equal_to(qk_narrow, 4.0f));
    tensor3 qk_short(B, L + 1, W);
    expect_invalid([&] { attnkit::embedding_qk_projection(e, w, qk_short, lay); }, {"qk", "[2, 4, 36]"});
    // qk over e's memory.
    std::vector<float> shared(static_cast<std::size_t>(B * L * W), 1.0f);
    const attnkit::view<float, 3> qk_over(shared.data(), {B, L, W});
    const attnkit::view<const float, 3> e_over(shared.data() + 3, {B, L, d});
    expect_invalid([&] { attnkit::embedding_qk_projection(e_over, w, qk_over, lay); }, {"qk", "and e", "overlap"});
    EXPECT_EQ(shared[0], 1.0f);
    EXPECT_TRUE(untouched());
    // Views: layer out of range, layout that disagrees with qk's width.
    expect_invalid([&] { attnkit::embedding_q(qk, lay, 2); }, {"layer", "< layers = 2", "got 2"});
    expect_invalid([&] { attnkit::embedding_k(qk, lay, -1); }, {"layer", "got -1"});
    expect_invalid([&] { attnkit::embedding_k(qk, {2, 4, 4, 3}, 0); }, {"qk", "48", "[2, 3, 36]"});
    expect_invalid([&] { attnkit::embedding_q(qk, {2, 0, 2, 3}, 0); }, {"layout"});
    // Stacking: mismatched lists and shapes.
    std::vector<tensor2> wq(2, tensor2(d, 12)), wk(2, tensor2(d, 6)), wk_bad(2, tensor2(d, 7)), one(1, tensor2(d, 6));
    for (auto& t : wq) t.setZero();
    for (auto& t : wk) t.setZero();
    w.setConstant(8.0f);
    expect_invalid([&] { attnkit::stack_embedding_qk_weights(wq, one, w); }, {"wk", "2 W_Q", "1 W_K"});
    expect_invalid([&] { attnkit::stack_embedding_qk_weights(wq, wk_bad, w); }, {"w", "[5, 38]", "[5, 36]"});
    wk_bad[1] = tensor2(d + 1, 7);
    expect_invalid([&] { attnkit::stack_embedding_qk_weights(wq, wk_bad, w); }, {"wk[1]", "[6, 7]"});
    tensor2 w_wide(d, W + 1);
    expect_invalid([&] { attnkit::stack_embedding_qk_weights(wq, wk, w_wide); }, {"w", "[5, 37]"});
    EXPECT_TRUE(attnkit_test::all_equal_to(w, 8.0f));
}

}  // namespace
