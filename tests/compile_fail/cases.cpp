// Compile-time argument checks: each ATTNKIT_CASE below must fail to compile with the message
// that tests/compile_fail/CMakeLists.txt expects for it, and ATTNKIT_CASE = 0 (every call
// written correctly) must compile, which shows that a case fails for the line it adds alone.
#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/softmax_attention.hpp"

#ifndef ATTNKIT_CASE
#define ATTNKIT_CASE 0
#endif

using t4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using t3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;

int main() {
    t4 q(1, 2, 2, 4), k(1, 3, 2, 4), v(1, 3, 2, 4), out(1, 2, 2, 4);
    t3 lse(1, 2, 2);
    q.setZero(), k.setZero(), v.setZero();
    attnkit::softmax_options opts;
    Eigen::Tensor<double, 4, Eigen::RowMajor> weights;
    (void)weights;

#if ATTNKIT_CASE == 0  // the correct spellings of everything the cases below get wrong
    attnkit::softmax_attention(q, k, v, out, opts);
    attnkit::softmax_attention(q, k, v, out, lse, opts);
    attnkit::reference::softmax_attention(q, k, v, out, lse, opts);
    attnkit::reference::softmax_attention_weights(q, k, v, out, weights, opts);
    attnkit::reference::softmax_attention_weights(q, k, v, out, lse, weights, opts);
    attnkit::merge_partials(out, lse, out, lse, out, lse);
    const Eigen::TensorMap<t4> out_map(out.data(), 1, 2, 2, 4);  // a const map of mutable data
    attnkit::softmax_attention(q, k, v, out_map, opts);
    const t4 q2 = q * 2.0f;
    attnkit::softmax_attention(q2, k, v, out, opts);
#elif ATTNKIT_CASE == 1  // rank-3 q
    t3 q3(1, 2, 8);
    attnkit::softmax_attention(q3, k, v, out, opts);
#elif ATTNKIT_CASE == 2  // rank-4 lse, in the reference
    t4 lse4(1, 2, 2, 1);
    attnkit::reference::softmax_attention(q, k, v, out, lse4, opts);
#elif ATTNKIT_CASE == 3  // the weights tensor where lse goes
    attnkit::reference::softmax_attention(q, k, v, out, weights, opts);
#elif ATTNKIT_CASE == 4  // a const Tensor as out
    const t4 out_c(1, 2, 2, 4);
    attnkit::softmax_attention(q, k, v, out_c, opts);
#elif ATTNKIT_CASE == 5  // a const Tensor as lse, in the reference
    const t3 lse_c(1, 2, 2);
    attnkit::reference::softmax_attention(q, k, v, out, lse_c, opts);
#elif ATTNKIT_CASE == 6  // an Eigen expression as q
    attnkit::softmax_attention(q * 2.0f, k, v, out, opts);
#elif ATTNKIT_CASE == 7  // .chip() as k
    Eigen::Tensor<float, 5, Eigen::RowMajor> k5(2, 1, 3, 2, 4);
    attnkit::softmax_attention(q, k5.chip(0, 0), v, out, opts);
#elif ATTNKIT_CASE == 8  // TensorRef as v
    Eigen::TensorRef<t4> v_ref(v);
    attnkit::softmax_attention(q, k, v_ref, out, opts);
#elif ATTNKIT_CASE == 9  // TensorFixedSize as q
    Eigen::TensorFixedSize<float, Eigen::Sizes<1, 2, 2, 4>, Eigen::RowMajor> q_fixed;
    attnkit::softmax_attention(q_fixed, k, v, out, opts);
#elif ATTNKIT_CASE == 10  // double q with float k, v in the fast kernel
    Eigen::Tensor<double, 4, Eigen::RowMajor> qd(1, 2, 2, 4);
    attnkit::softmax_attention(qd, k, v, out, opts);
#elif ATTNKIT_CASE == 11  // an Eigen expression as lse
    attnkit::softmax_attention(q, k, v, out, lse * 2.0f, opts);
#elif ATTNKIT_CASE == 12  // a column-major tensor
    Eigen::Tensor<float, 4> k_col(1, 3, 2, 4);
    attnkit::softmax_attention(q, k_col, v, out, opts);
#elif ATTNKIT_CASE == 13  // a map of const data as out
    const float* ro = out.data();
    Eigen::TensorMap<const t4> out_ro(ro, 1, 2, 2, 4);
    attnkit::softmax_attention(q, k, v, out_ro, opts);
#elif ATTNKIT_CASE == 14  // a const Tensor as merge_partials' out
    const t4 out_c(1, 2, 2, 4);
    attnkit::merge_partials(out, lse, out, lse, out_c, lse);
#endif
    return 0;
}
