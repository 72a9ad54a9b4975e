// attnkit::view and the argument conversions: Tensor, const Tensor, TensorMap (also of const
// float), explicit strided views over [B, H, L, D] and fused QKV buffers, rank checks.
#include "attnkit/view.hpp"
#include "attnkit/detail/check.hpp"

#include <gtest/gtest.h>

#include <array>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::view;
using namespace attnkit_test;

// Element (b, l, h, d) through the view equals the tensor's.
template <class T, class Tensorish>
void expect_same_elements(const view<T, 4>& v, const Tensorish& t) {
    ASSERT_EQ(v.dims[0], t.dimension(0));
    ASSERT_EQ(v.dims[1], t.dimension(1));
    ASSERT_EQ(v.dims[2], t.dimension(2));
    ASSERT_EQ(v.dims[3], t.dimension(3));
    for (index_t b = 0; b < v.dims[0]; ++b)
        for (index_t l = 0; l < v.dims[1]; ++l)
            for (index_t h = 0; h < v.dims[2]; ++h)
                for (index_t d = 0; d < v.dims[3]; ++d) ASSERT_EQ(v(b, l, h, d), t(b, l, h, d));
}

TEST(view, from_tensor_is_dense_row_major) {
    tensor4<float> t = random_bshd(2, 3, 4, 5, distribution::uniform, 1);
    view<float, 4> v = t;
    EXPECT_EQ(v.data, t.data());
    EXPECT_EQ((std::array<index_t, 4>{2, 3, 4, 5}), v.dims);
    EXPECT_EQ((std::array<index_t, 4>{60, 20, 5, 1}), v.strides);
    EXPECT_EQ(120, v.size());
    expect_same_elements(v, t);
    v(1, 2, 3, 4) = 42.0f;  // writes through
    EXPECT_EQ(42.0f, t(1, 2, 3, 4));
    EXPECT_EQ(v.ptr(1, 2), t.data() + 60 + 40);
}

TEST(view, from_const_tensor_and_mutable_view) {
    const tensor4<double> t = random_bshd<double>(1, 2, 3, 4, distribution::gaussian, 2);
    view<const double, 4> v = t;
    static_assert(!std::is_constructible<view<double, 4>, const tensor4<double>&>::value,
                  "a const tensor must not give a mutable view");
    expect_same_elements(v, t);

    tensor4<double> m = t;
    view<double, 4> mv = m;
    view<const double, 4> cv = mv;  // mutable -> const
    EXPECT_EQ(cv.data, m.data());
    EXPECT_EQ(cv.strides, mv.strides);
}

TEST(view, from_tensor_map_and_map_of_const) {
    std::vector<float> buf(2 * 3 * 2 * 4);
    fill_random(buf.data(), buf.size(), distribution::uniform, 3);
    Eigen::TensorMap<tensor4<float>> map(buf.data(), 2, 3, 2, 4);
    view<float, 4> v = map;
    EXPECT_EQ(v.data, buf.data());
    expect_same_elements(v, map);

    const std::vector<float>& cbuf = buf;
    Eigen::TensorMap<Eigen::Tensor<const float, 4, Eigen::RowMajor>> cmap(cbuf.data(), 2, 3, 2, 4);
    view<const float, 4> cv = cmap;
    static_assert(!std::is_constructible<view<float, 4>, decltype(cmap)>::value,
                  "a map of const float must not give a mutable view");
    EXPECT_EQ(cv.data, buf.data());
    expect_same_elements(cv, cmap);

    // The entry-point conversions accept the same arguments.
    const auto iv = attnkit::detail::input_view<4>("q", cmap, "[B, Lq, H, D]");
    EXPECT_EQ(iv.data, buf.data());
    const auto ov = attnkit::detail::output_view<4>("out", map, "[B, Lq, H, Dv]");
    EXPECT_EQ(ov.data, buf.data());
    EXPECT_EQ(v.strides, ov.strides);
}

TEST(view, from_map_of_const_tensor) {
    tensor4<float> t(2, 3, 4, 5);
    std::iota(t.data(), t.data() + t.size(), 0.0f);
    const Eigen::TensorMap<const tensor4<float>> map(t.data(), 2, 3, 4, 5);
    const auto v = attnkit::detail::input_view<4>("q", map, "[B, Lq, H, D]");
    EXPECT_EQ(v.data, t.data());
    EXPECT_EQ(v(1, 2, 3, 4), t(1, 2, 3, 4));
    EXPECT_EQ(v.strides[0], 3 * 4 * 5);
}

TEST(view, bhld_buffer_seen_as_bshd) {
    const index_t B = 2, H = 3, L = 5, D = 4;
    std::vector<float> buf(static_cast<std::size_t>(B * H * L * D));
    std::iota(buf.begin(), buf.end(), 0.0f);
    const view<float, 4> v = bhld_as_bshd(buf.data(), B, H, L, D);
    EXPECT_EQ((std::array<index_t, 4>{B, L, H, D}), v.dims);
    EXPECT_NO_THROW(attnkit::detail::check_layout("q", v));
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < H; ++h)
                for (index_t d = 0; d < D; ++d)
                    ASSERT_EQ(v(b, l, h, d),
                              buf[static_cast<std::size_t>(((b * H + h) * L + l) * D + d)]);

    // Same thing through an explicit pointer + dims + strides, as a user would write it.
    view<const float, 4> explicit_view(buf.data(), {B, L, H, D}, {H * L * D, D, L * D, 1});
    EXPECT_EQ(v.strides, explicit_view.strides);
    EXPECT_EQ(&v(1, 4, 2, 3), &explicit_view(1, 4, 2, 3));
}

TEST(view, fused_qkv_buffer_as_three_views) {
    const index_t B = 2, L = 3, H = 4, D = 5;
    std::vector<float> buf(static_cast<std::size_t>(B * L * 3 * H * D));
    std::iota(buf.begin(), buf.end(), 0.0f);
    const qkv_views<float> f = fused_qkv_views(buf.data(), B, L, H, D);
    auto flat = [&](index_t b, index_t l, index_t which, index_t h, index_t d) {
        return buf[static_cast<std::size_t>((((b * L + l) * 3 + which) * H + h) * D + d)];
    };
    for (const auto* v : {&f.q, &f.k, &f.v})
        EXPECT_EQ((std::array<index_t, 4>{B, L, H, D}), v->dims);
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < H; ++h)
                for (index_t d = 0; d < D; ++d) {
                    ASSERT_EQ(f.q(b, l, h, d), flat(b, l, 0, h, d));
                    ASSERT_EQ(f.k(b, l, h, d), flat(b, l, 1, h, d));
                    ASSERT_EQ(f.v(b, l, h, d), flat(b, l, 2, h, d));
                }
    // A GQA packing [B, L, H + 2*Hk, D].
    const index_t Hk = 2;
    std::vector<float> gbuf(static_cast<std::size_t>(B * L * (H + 2 * Hk) * D));
    std::iota(gbuf.begin(), gbuf.end(), 0.0f);
    const qkv_views<float> g = fused_qkv_views(gbuf.data(), B, L, H, Hk, D);
    EXPECT_EQ((std::array<index_t, 4>{B, L, Hk, D}), g.k.dims);
    const index_t row = (H + 2 * Hk) * D;
    EXPECT_EQ(g.q(1, 2, 3, 4), gbuf[static_cast<std::size_t>((1 * L + 2) * row + 3 * D + 4)]);
    EXPECT_EQ(g.k(1, 2, 1, 4), gbuf[static_cast<std::size_t>((1 * L + 2) * row + (H + 1) * D + 4)]);
    EXPECT_EQ(g.v(1, 2, 1, 4),
              gbuf[static_cast<std::size_t>((1 * L + 2) * row + (H + Hk + 1) * D + 4)]);
}

TEST(view, rank_mismatch_names_the_argument) {
    Eigen::Tensor<float, 3, Eigen::RowMajor> t3(2, 3, 4);
    try {
        (void)attnkit::detail::input_view<4>("q", t3, "[B, Lq, H, D]");
        FAIL() << "no exception";
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("q"), std::string::npos) << what;
        EXPECT_NE(what.find("rank 4"), std::string::npos) << what;
        EXPECT_NE(what.find("rank 3"), std::string::npos) << what;
        EXPECT_NE(what.find("[B, Lq, H, D]"), std::string::npos) << what;
        EXPECT_NE(what.find("[2, 3, 4]"), std::string::npos) << what;  // the actual shape
    }
    tensor4<float> t4(1, 1, 1, 1);
    EXPECT_THROW((void)attnkit::detail::output_view<3>("lse", t4, "[B, Lq, H]"),
                 std::invalid_argument);
}

TEST(view, shape_string_and_layout_check) {
    tensor4<float> t(2, 7, 4, 64);
    EXPECT_EQ("[2, 7, 4, 64]", attnkit::shape_string(view<float, 4>(t)));
    // Last dimension not contiguous: rejected with the name and the stride.
    view<float, 4> bad(t.data(), {2, 7, 4, 32}, {7 * 4 * 64, 4 * 64, 64, 2});
    try {
        attnkit::detail::check_layout("k", bad);
        FAIL() << "no exception";
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("k:"), std::string::npos) << what;
        EXPECT_NE(what.find("stride 2"), std::string::npos) << what;
    }
}

TEST(harness, all_close_reports_index_and_errors) {
    tensor3<float> a = make_lse(2, 2, 2, 1.0f);
    tensor3<double> e = make_lse<double>(2, 2, 2, 1.0);
    EXPECT_TRUE(all_close(a, e, 0.0, 0.0));
    a(1, 0, 1) = 1.5f;
    const auto r = all_close(a, e, 1e-6, 1e-6);
    ASSERT_FALSE(r);
    const std::string msg = r.message();
    EXPECT_NE(msg.find("[1, 0, 1]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 of 8"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max abs error 0.5"), std::string::npos) << msg;

    // Matching infinities are equal; NaN vs number differs; NaN vs NaN only with equal_nan.
    a.setConstant(-std::numeric_limits<float>::infinity());
    e.setConstant(-std::numeric_limits<double>::infinity());
    EXPECT_TRUE(all_close(a, e, 0.0, 0.0));
    e(0, 0, 0) = 0.0;
    EXPECT_FALSE(all_close(a, e, 1.0, 1.0));
    a.setConstant(std::nanf(""));
    e.setConstant(0.0);
    EXPECT_FALSE(all_close(a, e, 1.0, 1.0));
    e.setConstant(std::nan(""));
    EXPECT_FALSE(all_close(a, e, 1.0, 1.0));
    EXPECT_TRUE(all_close(a, e, 1.0, 1.0, /*equal_nan=*/true));

    // Shapes must agree; strided views compare by element.
    EXPECT_FALSE(all_close(make_lse(2, 2, 3), make_lse(2, 3, 2), 1.0, 1.0));
    std::vector<float> bhld(2 * 3 * 4 * 5);
    fill_random(bhld.data(), bhld.size(), distribution::gaussian, 9);
    const view<float, 4> sv = bhld_as_bshd(bhld.data(), 2, 3, 4, 5);
    tensor4<float> dense = make_bshd(2, 4, 3, 5);
    for_each_index<4>(sv.dims, [&](const std::array<index_t, 4>& i) {
        dense(i[0], i[1], i[2], i[3]) = at(sv, i);
    });
    EXPECT_TRUE(all_close(sv, dense, 0.0, 0.0));
    EXPECT_TRUE(all_close(to_double(sv), dense, 0.0, 0.0));

    const tolerance tol = tolerance_for(4, 10.0);
    EXPECT_DOUBLE_EQ(4 * kEpsFloat, tol.rtol);
    EXPECT_DOUBLE_EQ(40 * kEpsFloat, tol.atol);
}

TEST(harness, random_is_deterministic_and_distributed) {
    for (distribution d : kAllDistributions) {
        SCOPED_TRACE(name(d));
        const std::vector<double> a = random_values(20000, d, 7), b = random_values(20000, d, 7),
                                  c = random_values(20000, d, 8);
        EXPECT_EQ(a, b);
        EXPECT_NE(a, c);
        double mean = 0.0, var = 0.0, mx = 0.0;
        for (double x : a) mean += x;
        mean /= static_cast<double>(a.size());
        for (double x : a) var += (x - mean) * (x - mean), mx = std::max(mx, std::fabs(x));
        var /= static_cast<double>(a.size());
        EXPECT_NEAR(0.0, mean, 0.05);
        if (d == distribution::uniform) {
            EXPECT_LE(mx, 1.0);
            EXPECT_NEAR(1.0 / 3.0, var, 0.02);
        } else if (d == distribution::gaussian) {
            EXPECT_NEAR(1.0, var, 0.05);
            EXPECT_LT(mx, 6.0);
        } else {
            // 1% times 20: variance 0.99 + 0.01 * 400 = 4.99; 200 values are outliers.
            EXPECT_NEAR(4.99, var, 0.6);
            EXPECT_GT(mx, 10.0);
        }
    }
    EXPECT_STREQ("outliers", name(distribution::outliers));
    // A strided view gets the same values, in row-major index order, as a dense tensor.
    std::vector<float> bhld(2 * 3 * 4 * 5);
    const view<float, 4> sv = bhld_as_bshd(bhld.data(), 2, 3, 4, 5);
    fill_random(sv, distribution::outliers, 11);
    const tensor4<float> dense = random_bshd(2, 4, 3, 5, distribution::outliers, 11);
    EXPECT_TRUE(all_close(sv, dense, 0.0, 0.0));
    // Tiny tensors still get an outlier.
    const std::vector<double> tiny = random_values(10, distribution::outliers, 3);
    double tmx = 0.0;
    for (double x : tiny) tmx = std::max(tmx, std::fabs(x));
    EXPECT_GT(tmx, 1.0);
}

}  // namespace
