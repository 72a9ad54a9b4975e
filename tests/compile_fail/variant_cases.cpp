// Compile-time element-type checks of every variant's entry points: each ATTNKIT_CASE below
// passes a double tensor where the fast kernels take float (with the other arguments float) and
// must fail with that entry point's static_assert and nothing else (expect_one_error.cmake counts
// the compiler's "error:" lines). ATTNKIT_CASE = 0, every call written correctly, must compile.
#include "attnkit/eigen.hpp"  // the tensors below (variant headers leave the Tensor module to the user)
#include "attnkit/gated_mlp.hpp"
#include "attnkit/mta_attention.hpp"
#include "attnkit/self_gating_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/static_qk_attention.hpp"
#include "attnkit/taylor_attention.hpp"

#ifndef ATTNKIT_CASE
#define ATTNKIT_CASE 0
#endif

using t4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using d4 = Eigen::Tensor<double, 4, Eigen::RowMajor>;
using t2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;
using d2 = Eigen::Tensor<double, 2, Eigen::RowMajor>;

int main() {
    t4 q(1, 3, 2, 4), k(1, 3, 2, 4), v(1, 3, 2, 4), out(1, 3, 2, 4);
    d4 qd(1, 3, 2, 4), vd(1, 3, 2, 4), outd(1, 3, 2, 4);
    q.setZero(), k.setZero(), v.setZero(), qd.setZero(), vd.setZero();
    t2 x(3, 4), wg(4, 8), wu(4, 8), wd(8, 4), xo(3, 4);
    d2 xd(3, 4);
    Eigen::Tensor<float, 3, Eigen::RowMajor> l3(1, 3, 2);
    Eigen::Tensor<double, 3, Eigen::RowMajor> l3d(1, 3, 2);
    l3.setZero(), l3d.setZero();
    x.setZero(), wg.setZero(), wu.setZero(), wd.setZero(), xd.setZero();
    (void)qd, (void)vd, (void)outd, (void)xd, (void)l3d;

#if ATTNKIT_CASE == 0  // the correct spellings of everything the cases below get wrong
    attnkit::softmax_attention(q, k, v, out);
    attnkit::taylor_attention(q, k, v, out);
    attnkit::taylor_state ts(1, 2, 2, 4, 4);
    ts.step(q, k, v, out);
    attnkit::self_gating_attention(q, k, v, out);
    attnkit::self_gating_state ss(1, 2, 2, 4, 4);
    ss.step(q, k, v, out);
    attnkit::mta_attention(q, k, v, out);
    attnkit::mta_state ms(1, 2, 2, 4, 4, attnkit::mta_options{});
    ms.step(q, k, v, out);
    attnkit::static_qk_attention(q, k, v, out);
    attnkit::static_attention_map map(q, k);
    map.apply(v, out);
    attnkit::gated_mlp(x, wg, wu, wd, xo);
    attnkit::merge_partials(out, l3, out, l3, out, l3);
#elif ATTNKIT_CASE == 1  // softmax: float q and k, double v
    attnkit::softmax_attention(q, k, vd, out);
#elif ATTNKIT_CASE == 2  // softmax: double out
    attnkit::softmax_attention(q, k, v, outd);
#elif ATTNKIT_CASE == 3  // taylor: double q
    attnkit::taylor_attention(qd, k, v, out);
#elif ATTNKIT_CASE == 4  // taylor_state::step: double v
    attnkit::taylor_state ts(1, 2, 2, 4, 4);
    ts.step(q, k, vd, out);
#elif ATTNKIT_CASE == 5  // self-gating: double q
    attnkit::self_gating_attention(qd, k, v, out);
#elif ATTNKIT_CASE == 6  // self_gating_state::step: double v
    attnkit::self_gating_state ss(1, 2, 2, 4, 4);
    ss.step(q, k, vd, out);
#elif ATTNKIT_CASE == 7  // MTA: double q
    attnkit::mta_attention(qd, k, v, out);
#elif ATTNKIT_CASE == 8  // mta_state::step: double v
    attnkit::mta_state ms(1, 2, 2, 4, 4, attnkit::mta_options{});
    ms.step(q, k, vd, out);
#elif ATTNKIT_CASE == 9  // static QK: double v
    attnkit::static_qk_attention(q, k, vd, out);
#elif ATTNKIT_CASE == 10  // static_attention_map: double q_fixed
    attnkit::static_attention_map map(qd, k);
#elif ATTNKIT_CASE == 11  // static_attention_map::apply: double v
    attnkit::static_attention_map map(q, k);
    map.apply(vd, out);
#elif ATTNKIT_CASE == 12  // gated MLP: double x
    attnkit::gated_mlp(xd, wg, wu, wd, xo);
#elif ATTNKIT_CASE == 13  // merge_partials: double lse_a
    attnkit::merge_partials(out, l3d, out, l3, out, l3);
#endif
    return 0;
}
