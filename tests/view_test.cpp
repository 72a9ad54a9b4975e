// attnkit::view and the argument conversions: Tensor, const Tensor, TensorMap (also of const
// float), explicit strided views over [B, H, L, D] and fused QKV buffers, rank checks.
#include "attnkit/view.hpp"
#include "attnkit/detail/check.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
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

// Rank mismatches, const Tensors as outputs, Eigen expressions and column-major tensors are
// compile errors now, each with one static_assert message: tests/compile_fail/ checks them.

TEST(view, numbers_in_messages_use_the_shortest_form) {
    using attnkit::detail::number;
    EXPECT_EQ("1e-40", number(1e-40f));
    EXPECT_EQ("3e+38", number(3e38f));
    EXPECT_EQ("0.1", number(0.1f));  // the float's shortest form, not the double's 0.100000001
    EXPECT_EQ("-0.5", number(-0.5f));
    EXPECT_EQ("1.5", number(1.5));
    EXPECT_EQ("nan", number(std::nanf("")));
    EXPECT_EQ("inf", number(std::numeric_limits<float>::infinity()));
    EXPECT_EQ("-inf", number(-std::numeric_limits<double>::infinity()));
    EXPECT_EQ("-7", number(index_t(-7)));
    EXPECT_EQ("18446744073709551615", number(~std::size_t(0)));
}

TEST(view, extent_check_rejects_int64_overflow) {
    using attnkit::detail::check_extent;
    // The element count wraps: 2^32 * 64 * 2^30 = 2^68.
    const view<const float, 4> count(nullptr, {index_t(1) << 32, 64, index_t(1) << 30, 1});
    EXPECT_THROW(check_extent("q", count), std::invalid_argument);
    EXPECT_EQ(std::numeric_limits<index_t>::max(), count.size());  // saturates, no UB
    // The count fits, the byte offset of the last element does not.
    std::vector<float> buf(4);
    const view<const float, 2> reach(buf.data(), {2, 2}, {index_t(1) << 62, 1});
    EXPECT_THROW(check_extent("k", reach), std::invalid_argument);
    const view<const float, 2> neg(buf.data(), {2, 2}, {std::numeric_limits<index_t>::min(), 1});
    EXPECT_THROW(check_extent("k", neg), std::invalid_argument);
    // Large but representable, and empty views with null data, pass.
    const view<const float, 2> big(buf.data(), {2, 2}, {index_t(1) << 58, 1});
    EXPECT_NO_THROW(check_extent("k", big));
    const view<const float, 4> empty(nullptr, {index_t(1) << 40, 0, index_t(1) << 40, 8});
    EXPECT_NO_THROW(check_extent("v", empty));
}

TEST(memory_overlap, dense_disjoint_and_overlapping_views) {
    using attnkit::detail::region_of;
    using attnkit::detail::regions_overlap;
    std::vector<float> buf(100);
    const view<float, 2> a(buf.data(), {4, 5}), b(buf.data() + 20, {4, 5}), c(buf.data() + 19, {4, 5});
    EXPECT_FALSE(regions_overlap(region_of("a", a), region_of("b", b)));
    EXPECT_TRUE(regions_overlap(region_of("a", a), region_of("c", c)));  // one shared element
    EXPECT_TRUE(regions_overlap(region_of("a", a), region_of("a", a)));
    // Empty views overlap nothing.
    const view<float, 2> none(buf.data(), {0, 5});
    EXPECT_FALSE(regions_overlap(region_of("a", a), region_of("none", none)));
    // A negative stride covers the same elements as the positive one.
    const view<float, 2> rev(buf.data() + 15, {4, 5}, {-5, 1});
    EXPECT_TRUE(regions_overlap(region_of("rev", rev), region_of("a", a)));
    EXPECT_FALSE(regions_overlap(region_of("rev", rev), region_of("b", b)));
}

TEST(memory_overlap, interleaved_slots_are_apart_element_by_element) {
    using attnkit::detail::region_of;
    using attnkit::detail::regions_overlap;
    // The q, k, v slots of a fused [B, L, 3, H, D] buffer span nearly the same address range but
    // never share an element; likewise every other column of a matrix.
    const index_t B = 3, L = 50, H = 4, D = 8;
    std::vector<float> buf(static_cast<std::size_t>(B * L * 3 * H * D));
    const qkv_views<float> f = fused_qkv_views(buf.data(), B, L, H, D);
    EXPECT_FALSE(regions_overlap(region_of("q", f.q), region_of("k", f.k)));
    EXPECT_FALSE(regions_overlap(region_of("k", f.v), region_of("v", f.k)));
    const view<float, 4> q_and_k(buf.data(), {B, L, 2 * H, D}, f.q.strides);  // q and k slots together
    EXPECT_TRUE(regions_overlap(region_of("qk", q_and_k), region_of("k", f.k)));
    EXPECT_FALSE(regions_overlap(region_of("qk", q_and_k), region_of("v", f.v)));
    const view<float, 2> even(buf.data(), {10, 1}, {2, 1}), odd(buf.data() + 1, {10, 1}, {2, 1});
    EXPECT_FALSE(regions_overlap(region_of("even", even), region_of("odd", odd)));
    const view<float, 2> odd_pairs(buf.data() + 1, {9, 2}, {2, 1});  // [1,2], [3,4], ...
    EXPECT_TRUE(regions_overlap(region_of("even", even), region_of("pairs", odd_pairs)));
    // A [B, H, L] lse layout beside a [B, L, H] one over distinct halves of a buffer.
    const view<float, 3> bhl(buf.data(), {2, 7, 3}, {21, 1, 7}), blh(buf.data() + 42, {2, 7, 3});
    EXPECT_FALSE(regions_overlap(region_of("bhl", bhl), region_of("blh", blh)));
}

TEST(memory_overlap, self_overlap_and_in_place_rules) {
    using attnkit::detail::check_outputs_apart;
    using attnkit::detail::in_place;
    using attnkit::detail::region_of;
    std::vector<float> buf(64), other(64);
    const view<float, 2> out(buf.data(), {4, 4}), in(other.data(), {4, 4});
    EXPECT_NO_THROW(check_outputs_apart({region_of("out", out)}, {region_of("in", in)}));
    // Zero stride, or rows closer than their length: elements coincide.
    const view<float, 2> zero(buf.data(), {4, 4}, {0, 1}), tight(buf.data(), {4, 4}, {3, 1});
    EXPECT_THROW(check_outputs_apart({region_of("out", zero)}, {}), std::invalid_argument);
    EXPECT_THROW(check_outputs_apart({region_of("out", tight)}, {}), std::invalid_argument);
    // Zero strides in an input (a broadcast) are fine.
    const view<float, 2> bcast(other.data(), {4, 4}, {0, 1});
    EXPECT_NO_THROW(check_outputs_apart({region_of("out", out)}, {region_of("in", bcast)}));
    // The same view in place only with a shared in_place bit; a shifted view never.
    EXPECT_THROW(check_outputs_apart({region_of("out", out)}, {region_of("q", out)}), std::invalid_argument);
    EXPECT_NO_THROW(check_outputs_apart({in_place(region_of("out", out), 1)}, {in_place(region_of("q", out), 1)}));
    EXPECT_THROW(check_outputs_apart({in_place(region_of("out", out), 1)}, {in_place(region_of("q", out), 2)}),
                 std::invalid_argument);
    const view<float, 2> shifted(buf.data() + 1, {4, 4});
    EXPECT_THROW(check_outputs_apart({in_place(region_of("out", out), 1)}, {in_place(region_of("q", shifted), 1)}),
                 std::invalid_argument);
    // Two outputs over each other; the message names both.
    const view<float, 1> lse(buf.data() + 5, {3});
    try {
        check_outputs_apart({region_of("out", out), region_of("lse", lse)}, {});
        FAIL() << "no exception";
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("out [4, 4] and lse [3] overlap"), std::string::npos) << what;
    }
}

TEST(memory_overlap, large_fused_buffer_is_checked_quickly_and_exactly) {
    // 8 x 4096 rows of interleaved slots: the check splits only where ranges meet.
    const index_t B = 8, L = 4096, H = 2, D = 4;
    std::vector<float> buf(static_cast<std::size_t>(B * L * 3 * H * D));
    const qkv_views<float> f = fused_qkv_views(buf.data(), B, L, H, D);
    EXPECT_FALSE(attnkit::detail::regions_overlap(attnkit::detail::region_of("q", f.q),
                                                  attnkit::detail::region_of("v", f.v)));
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
