// attnkit::reference::static_qk_attention_backward and reference::static_attention_map_backward
// against central finite differences in double, with a random projection loss <out, R>.
#include "attnkit/reference/static_qk_attention_backward.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/finite_differences.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::static_qk_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;
using tensor3d = Eigen::Tensor<double, 3, Eigen::RowMajor>;

struct sq_case {
    index_t B, L, Lmax, H, Hk, D, Dv;
    float scale;
};

TEST(reference_static_qk_attention_backward, matches_central_finite_differences) {
    const sq_case cases[] = {{1, 4, 4, 2, 2, 3, 2, 0.0f}, {3, 5, 7, 4, 2, 3, 2, 0.0f}, {2, 6, 6, 3, 1, 4, 3, 1.3f}};
    std::uint64_t seed = 40;
    for (const sq_case& c : cases) {
        SCOPED_TRACE(c.B * 100 + c.L);
        tensor4<double> qf = random_bshd<double>(1, c.Lmax, c.H, c.D, distribution::gaussian, seed += 10);
        tensor4<double> kf = random_bshd<double>(1, c.Lmax, c.Hk, c.D, distribution::gaussian, seed + 1);
        tensor4<double> v = random_bshd<double>(c.B, c.L, c.Hk, c.Dv, distribution::gaussian, seed + 2);
        const tensor4<double> r = random_bshd<double>(c.B, c.L, c.H, c.Dv, distribution::gaussian, seed + 3);
        static_qk_options o;
        o.scale = c.scale;
        auto loss = [&] {
            tensor4<double> out(c.B, c.L, c.H, c.Dv);
            ref::static_qk_attention(qf, kf, v, out, o);
            return projection_loss(out, r);
        };
        tensor4<double> out(c.B, c.L, c.H, c.Dv), dq(1, c.Lmax, c.H, c.D), dk(1, c.Lmax, c.Hk, c.D),
            dv(c.B, c.L, c.Hk, c.Dv);
        ref::static_qk_attention(qf, kf, v, out, o);
        ref::static_qk_attention_backward(qf, kf, v, out, r, dq, dk, dv, o);
        expect_gradient_matches_fd(qf, dq, loss, "d_q_fixed");
        expect_gradient_matches_fd(kf, dk, loss, "d_k_fixed");
        expect_gradient_matches_fd(v, dv, loss, "d_v");
        for (index_t i = c.L; i < c.Lmax; ++i) EXPECT_EQ(0.0, dq(0, i, 0, 0));
    }
}

// out[b, i, h] = sum_{j <= i} w[h, i, j] v[b, j, h / G]: the map's definition, in double.
tensor4<double> map_forward(const tensor3d& w, const tensor4<double>& v) {
    const index_t B = v.dimension(0), L = v.dimension(1), Hk = v.dimension(2), Dv = v.dimension(3), H = w.dimension(0);
    tensor4<double> out(B, L, H, Dv);
    out.setZero();
    for (index_t b = 0; b < B; ++b)
        for (index_t i = 0; i < L; ++i)
            for (index_t h = 0; h < H; ++h)
                for (index_t j = 0; j <= i; ++j)
                    for (index_t c = 0; c < Dv; ++c) out(b, i, h, c) += w(h, i, j) * v(b, j, h / (H / Hk), c);
    return out;
}

TEST(reference_static_qk_attention_backward, map_weights_match_central_finite_differences) {
    const index_t B = 2, L = 5, Lmax = 6, H = 4, Hk = 2, Dv = 3;
    tensor3d w(H, Lmax, Lmax);
    const std::vector<double> wr = random_values(static_cast<std::size_t>(w.size()), distribution::gaussian, 77);
    std::copy(wr.begin(), wr.end(), w.data());
    tensor4<double> v = random_bshd<double>(B, L, Hk, Dv, distribution::gaussian, 78);
    const tensor4<double> r = random_bshd<double>(B, L, H, Dv, distribution::gaussian, 79);
    auto loss = [&] { return projection_loss(map_forward(w, v), r); };
    tensor3d dw(H, Lmax, Lmax);
    tensor4<double> dv(B, L, Hk, Dv);
    ref::static_attention_map_backward(w, v, r, dw, dv);
    expect_gradient_matches_fd(w, dw, loss, "d_w");
    expect_gradient_matches_fd(v, dv, loss, "d_v");
    EXPECT_EQ(0.0, dw(0, 1, 2));  // upper triangle
    EXPECT_EQ(0.0, dw(0, 5, 0));  // row >= L
    EXPECT_NE(0.0, dw(0, 4, 0));
}

TEST(reference_static_qk_attention_backward, rejects_bad_gradients_before_writing) {
    const tensor4<double> qf = random_bshd<double>(1, 5, 2, 3, distribution::gaussian, 1);
    const tensor4<double> kf = random_bshd<double>(1, 5, 1, 3, distribution::gaussian, 2);
    const tensor4<double> v = random_bshd<double>(2, 4, 1, 2, distribution::gaussian, 3);
    const tensor4<double> r = random_bshd<double>(2, 4, 2, 2, distribution::gaussian, 4);
    tensor4<double> out(2, 4, 2, 2), dq(1, 4, 2, 3), dk(1, 5, 1, 3), dv(2, 4, 1, 2);
    ref::static_qk_attention(qf, kf, v, out);
    dk.setConstant(3.0);
    expect_invalid([&] { ref::static_qk_attention_backward(qf, kf, v, out, r, dq, dk, dv); }, {"d_q_fixed", "[1, 5, 2, 3]"});
    EXPECT_EQ(3.0, dk(0, 0, 0, 0));
}

}  // namespace
