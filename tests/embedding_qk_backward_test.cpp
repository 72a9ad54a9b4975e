// attnkit::embedding_qk_projection_backward against its double oracle, and the oracle against
// central finite differences of reference::embedding_qk_projection in double with a random
// projection loss <qk, R>.
//
// Tolerances: |fast - oracle| <= (K + 2) eps sum_k |terms| would be the worst-case bound of a
// float dot product of length K; with U[-1, 1] inputs the error grows like sqrt(K), so the test
// uses kEpsMultiple eps sqrt(K) max|oracle| (K = the width for d_e, the tokens for d_w).
#include "attnkit/embedding_qk_backward.hpp"

#include "attnkit/reference/embedding_qk_backward.hpp"
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

using attnkit::embedding_qk_layout;
using attnkit::index_t;
using namespace attnkit_test;
namespace ref = attnkit::reference;
template <class T, int N>
using tensor = Eigen::Tensor<T, N, Eigen::RowMajor>;

constexpr double kEpsMultiple = 16;

template <class T, int N>
tensor<T, N> random_tensor(const std::array<index_t, N>& dims, std::uint64_t seed) {
    tensor<T, N> t(dims);
    fill_random(t.data(), static_cast<std::size_t>(t.size()), distribution::uniform, seed);
    return t;
}

index_t width(const embedding_qk_layout& l) { return l.layers * (l.heads + l.heads_kv) * l.dim; }

TEST(reference_embedding_qk_backward, matches_central_finite_differences) {
    const embedding_qk_layout lay{2, 2, 1, 3};
    const index_t B = 2, L = 3, d = 4, W = width(lay);
    tensor<double, 3> e = random_tensor<double, 3>({B, L, d}, 1), r = random_tensor<double, 3>({B, L, W}, 3);
    tensor<double, 2> w = random_tensor<double, 2>({d, W}, 2);
    auto loss = [&] {
        tensor<double, 3> qk(B, L, W);
        ref::embedding_qk_projection(e, w, qk, lay);
        double l = 0.0;
        for (index_t i = 0; i < qk.size(); ++i) l += qk.data()[i] * r.data()[i];
        return l;
    };
    tensor<double, 3> de(B, L, d);
    tensor<double, 2> dw(d, W);
    ref::embedding_qk_projection_backward(e, w, r, de, dw, lay);
    expect_matches_finite_differences(e, de, loss, "d_e", 1e-8);
    expect_matches_finite_differences(w, dw, loss, "d_w", 1e-8);
}

struct result {
    tensor<float, 3> de;
    tensor<float, 2> dw;
};

result run_fast(const tensor<float, 3>& e, const tensor<float, 2>& w, const tensor<float, 3>& g,
                const embedding_qk_layout& lay, attnkit::thread_pool* pool = nullptr) {
    result r{tensor<float, 3>(e.dimensions()), tensor<float, 2>(w.dimensions())};
    r.de.setConstant(std::numeric_limits<float>::quiet_NaN());
    r.dw.setConstant(std::numeric_limits<float>::quiet_NaN());
    attnkit::embedding_qk_projection_backward(e, w, g, r.de, r.dw, lay, pool);
    return r;
}

TEST(embedding_qk_backward, matches_oracle) {
    std::uint64_t seed = 10;
    for (const embedding_qk_layout lay : {embedding_qk_layout{1, 1, 1, 1}, embedding_qk_layout{2, 3, 1, 5},
                                          embedding_qk_layout{3, 2, 2, 16}})
        for (index_t B : {1, 2})
            for (index_t L : {1, 7, 70})
                for (index_t d : {1, 6, 17}) {
                    SCOPED_TRACE(::testing::Message() << "layers " << lay.layers << " B " << B << " L " << L << " d " << d);
                    const index_t W = width(lay);
                    const auto e = random_tensor<float, 3>({B, L, d}, seed++);
                    const auto w = random_tensor<float, 2>({d, W}, seed++);
                    const auto g = random_tensor<float, 3>({B, L, W}, seed++);
                    const result got = run_fast(e, w, g, lay);
                    tensor<double, 3> de(B, L, d);
                    tensor<double, 2> dw(d, W);
                    ref::embedding_qk_projection_backward(tensor<double, 3>(e.cast<double>()), tensor<double, 2>(w.cast<double>()),
                                                          tensor<double, 3>(g.cast<double>()), de, dw, lay);
                    EXPECT_TRUE(all_close(got.de, de, tolerance_for(kEpsMultiple * std::sqrt(double(W)), max_abs(de))))
                        << "d_e";
                    EXPECT_TRUE(all_close(got.dw, dw, tolerance_for(kEpsMultiple * std::sqrt(double(B * L)), max_abs(dw))))
                        << "d_w";
                }
}

TEST(embedding_qk_backward, thread_count_gives_bitwise_identical_results) {
    const embedding_qk_layout lay{4, 3, 1, 32};
    const auto e = random_tensor<float, 3>({2, 300, 40}, 1);
    const auto w = random_tensor<float, 2>({40, width(lay)}, 2);
    const auto g = random_tensor<float, 3>({2, 300, width(lay)}, 3);
    const result one = run_fast(e, w, g, lay);
    for (int n : {2, 3}) {
        attnkit::thread_pool pool(n);
        const result many = run_fast(e, w, g, lay, &pool);
        EXPECT_EQ(0, std::memcmp(one.de.data(), many.de.data(), sizeof(float) * static_cast<std::size_t>(one.de.size())));
        EXPECT_EQ(0, std::memcmp(one.dw.data(), many.dw.data(), sizeof(float) * static_cast<std::size_t>(one.dw.size())));
    }
}

TEST(embedding_qk_backward, empty_batch_gives_zero_weight_gradient) {
    const embedding_qk_layout lay{1, 2, 1, 4};
    const auto e = random_tensor<float, 3>({2, 0, 5}, 1);
    const auto w = random_tensor<float, 2>({5, width(lay)}, 2);
    const auto g = random_tensor<float, 3>({2, 0, width(lay)}, 3);
    const result r = run_fast(e, w, g, lay);
    EXPECT_TRUE(all_equal_to(r.dw, 0.0f));
}

TEST(embedding_qk_backward, bad_input_rejected_before_writing) {
    const embedding_qk_layout lay{2, 2, 1, 4};
    const index_t W = width(lay);
    const auto e = random_tensor<float, 3>({1, 5, 6}, 1);
    const auto w = random_tensor<float, 2>({6, W}, 2);
    const auto g = random_tensor<float, 3>({1, 5, W}, 3);
    tensor<float, 3> de(1, 5, 6);
    tensor<float, 2> dw(6, W);
    de.setConstant(2.0f);
    dw.setConstant(2.0f);
    tensor<float, 3> bad_g(1, 5, W + 1), bad_de(1, 4, 6);
    tensor<float, 2> bad_dw(6, W - 1);
    expect_invalid([&] { attnkit::embedding_qk_projection_backward(e, w, bad_g, de, dw, lay); }, "d_qk");
    expect_invalid([&] { attnkit::embedding_qk_projection_backward(e, w, g, bad_de, dw, lay); }, {"d_e", "[1, 4, 6]"});
    expect_invalid([&] { attnkit::embedding_qk_projection_backward(e, w, g, de, bad_dw, lay); }, "d_w");
    tensor<float, 3> e_copy = e;
    expect_invalid([&] { attnkit::embedding_qk_projection_backward(e_copy, w, g, e_copy, dw, lay); }, "d_e");
    EXPECT_TRUE(all_equal_to(de, 2.0f));
    EXPECT_TRUE(all_equal_to(dw, 2.0f));
}

}  // namespace
