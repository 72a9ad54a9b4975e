// attnkit::mta_attention_backward (the fused kernel) against
// attnkit::reference::mta_attention_backward (double, materialised).
//
// The kernel runs blocks of 64 query rows (all heads; fewer when the scratch budget bounds them)
// and recomputes c_q - 1 halo rows per convolution on each side of a block; the sweeps straddle
// the block edge (63, 64, 65, 129) and the SIMD widths (lengths 1 .. 17 around 4, 8, 16):
//   stages        each stage alone and all together, over the lengths
//   kernel_sizes  G in {1, 2} x c_q in {1, 3, 6, 9} x c_k in {1, 5, 11, 13} (13: the generic tap loop;
//                 c_q 6 and 9: more query taps than one register window of the convolution holds
//                 with AVX2 and AVX-512, backward_ops.hpp's kConvTapWindow)
//   block_heights blocks of 1, 3, 5, 16 rows (shorter than the halos) and the whole sequence
//   heads         MHA, GQA, MQA with every stage on
//   identity      identity kernels and W = I: the gradients equal softmax_attention_backward's
//   strided       strided input and gradient views give the same bits as dense ones
//   threads       1, 2, 3 threads and no pool give the same bits
//   non_finite    a NaN at the last token changes no other item and no d_q row it cannot reach
//   bad_input     every rejected argument, nothing written
//
// Tolerance: the kernel computes in float what the oracle computes in double, through up to
// seven linear stages, a softmax and the group norm; each gradient tensor is compared with
// |got - want| <= kRtol (max|want| + |want|), relative to the tensor's largest element (a
// gradient is a sum of many terms of both signs, so its small elements carry the absolute error
// of the large ones); weight gradients at least relative to a tenth of the call's largest
// gradient (where the group norm makes the output nearly invariant to a weight, its exact
// gradient cancels far below its terms). kRtol = 2e-5: the worst error measured over the file is
// 0.21 of the tolerance (AVX2); a key tap of the transposed convolution left unflipped makes it
// 9e4, a post-convolution halo one row short 4e3. zz_margin prints the worst ratio.
#include "attnkit/mta_attention_backward.hpp"

#include "attnkit/reference/mta_attention.hpp"
#include "attnkit/reference/mta_attention_backward.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/softmax_attention_backward.hpp"
#include "attnkit/thread_pool.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/sweep.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::mta_options;
using namespace attnkit_test;
namespace mb = attnkit::reference::mta_backward_impl;

using tensor1 = Eigen::Tensor<float, 1, Eigen::RowMajor>;
using tensor2 = Eigen::Tensor<float, 2, Eigen::RowMajor>;

constexpr double kRtol = 2e-5;

enum stage : unsigned { kPreConv = 1, kPreMix = 2, kPostConv = 4, kPostMix = 8, kNorm = 16, kDepth = 32, kGate = 64,
                        kAll = 127 };

struct config {
    index_t B = 1, L = 65, H = 4, Hk = 2, D = 7, Dv = 5;
    index_t G = 1, cq = 3, ck = 5;
    unsigned stages = kAll;
    bool identity = false;
    std::uint64_t seed = 1;
};

std::string describe(const config& c) {
    return "B" + std::to_string(c.B) + " L" + std::to_string(c.L) + " H" + std::to_string(c.H) + "/" +
           std::to_string(c.Hk) + " G" + std::to_string(c.G) + " " + std::to_string(c.cq) + "x" + std::to_string(c.ck) +
           " stages " + std::to_string(c.stages);
}

// The gradients of one call, every weight gradient of the stages that are on.
struct grads {
    tensor4<float> dq, dk, dv, kq_pre, kq_post;
    tensor2 head_pre, head_post;
    tensor1 norm_w, gate_w;
    float bias = 0.0f;
    attnkit::mta_weight_grads dw;
};

struct problem {
    config c;
    tensor4<float> q, k, v, dout, out, th_pre, th_post;
    tensor2 w_pre, w_post;
    tensor1 norm_w, gate_w;
    mta_options o;

    explicit problem(const config& cf) : c(cf) {
        q = random_bshd(c.B, c.L, c.H, c.D, distribution::gaussian, c.seed);
        k = random_bshd(c.B, c.L, c.Hk, c.D, distribution::gaussian, c.seed + 1);
        v = random_bshd(c.B, c.L, c.Hk, c.Dv, distribution::gaussian, c.seed + 2);
        dout = random_bshd(c.B, c.L, c.H, c.Dv, distribution::gaussian, c.seed + 3);
        th_pre = kernel(c.seed + 4);
        th_post = kernel(c.seed + 5);
        w_pre = matrix(c.seed + 6);
        w_post = matrix(c.seed + 7);
        norm_w = tensor1(c.Dv);
        gate_w = tensor1(c.Dv);
        fill_random(norm_w, distribution::uniform, c.seed + 8);
        fill_random(gate_w, distribution::gaussian, c.seed + 9);
        for (index_t i = 0; i < c.Dv; ++i) norm_w(i) += 1.0f;
        if (c.stages & kPreConv) o.kq_pre = th_pre;
        if (c.stages & kPreMix) o.head_pre = w_pre;
        if (c.stages & kPostConv) o.kq_post = th_post;
        if (c.stages & kPostMix) o.head_post = w_post;
        if (c.stages & kNorm) o.norm_weight = norm_w;
        if (c.stages & kDepth) o.norm_layer = 3;
        if (c.stages & kGate) o.gate_weight = gate_w, o.gate_bias = 0.25f;
        out = tensor4<float>(c.B, c.L, c.H, c.Dv);
        attnkit::mta_attention(q, k, v, out, o);
    }
    tensor4<float> kernel(std::uint64_t seed) const {
        tensor4<float> t(c.H, c.G, c.cq, c.ck);
        fill_random(t, distribution::gaussian, seed);
        const float noise = 0.5f / std::sqrt(static_cast<float>(c.G * c.cq * c.ck));
        for (index_t i = 0; i < t.size(); ++i) t.data()[i] = c.identity ? 0.0f : noise * t.data()[i];
        for (index_t h = 0; h < c.H; ++h) t(h, h % c.G, c.cq - 1, (c.ck - 1) / 2) += 1.0f;
        return t;
    }
    tensor2 matrix(std::uint64_t seed) const {
        tensor2 w(c.H, c.H);
        fill_random(w, distribution::gaussian, seed);
        for (index_t h = 0; h < c.H; ++h)
            for (index_t g = 0; g < c.H; ++g) {
                float& x = w(h, g);
                x = c.identity ? 0.0f : 0.5f / std::sqrt(static_cast<float>(c.H)) * x;
                if (h == g) x += 1.0f;
            }
        return w;
    }

    // Gradient tensors filled with a sentinel, every weight gradient wanted.
    grads make_grads() const {
        grads g;
        g.dq = make_bshd<float>(c.B, c.L, c.H, c.D, 7.0f);
        g.dk = make_bshd<float>(c.B, c.L, c.Hk, c.D, 7.0f);
        g.dv = make_bshd<float>(c.B, c.L, c.Hk, c.Dv, 7.0f);
        g.kq_pre = tensor4<float>(th_pre.dimensions());
        g.kq_post = tensor4<float>(th_post.dimensions());
        g.head_pre = tensor2(c.H, c.H);
        g.head_post = tensor2(c.H, c.H);
        g.norm_w = tensor1(c.Dv);
        g.gate_w = tensor1(c.Dv);
        for (auto* t : {&g.kq_pre, &g.kq_post}) t->setConstant(7.0f);
        for (auto* t : {&g.head_pre, &g.head_post}) t->setConstant(7.0f);
        for (auto* t : {&g.norm_w, &g.gate_w}) t->setConstant(7.0f);
        g.bias = 7.0f;
        return g;
    }
    void want_all(grads& g) const {
        if (c.stages & kPreConv) g.dw.kq_pre = g.kq_pre;
        if (c.stages & kPreMix) g.dw.head_pre = g.head_pre;
        if (c.stages & kPostConv) g.dw.kq_post = g.kq_post;
        if (c.stages & kPostMix) g.dw.head_post = g.head_post;
        if (c.stages & kNorm) g.dw.norm_weight = g.norm_w;
        if (c.stages & kGate) g.dw.gate_weight = g.gate_w, g.dw.gate_bias = &g.bias;
    }
    grads run(attnkit::thread_pool* pool = nullptr) const {
        grads g = make_grads();
        want_all(g);
        mta_options oo = o;
        oo.pool = pool;
        attnkit::mta_attention_backward(q, k, v, out, dout, g.dq, g.dk, g.dv, g.dw, oo);
        return g;
    }
};

double g_worst = 0;

double max_abs(const std::vector<double>& x) {
    double m = 0;
    for (double w : x) m = std::max(m, std::fabs(w));
    return m;
}

// floor: a magnitude below which a tensor's elements are compared absolutely (see the top).
template <class X>
void expect_close(const X& got, const std::vector<double>& want, const char* name, double floor = 0) {
    const auto gv = as_view(got);
    ASSERT_EQ(static_cast<std::size_t>(gv.size()), want.size()) << name;
    const double mx = std::max(max_abs(want), floor);
    int bad = 0;
    for (index_t i = 0; i < gv.size(); ++i) {
        const double g = gv.data[i], w = want[static_cast<std::size_t>(i)];
        const double tol = kRtol * (mx + std::fabs(w)) + 1e-30;
        const double r = std::fabs(g - w) / tol;
        if (!(r <= 1.0) && bad++ < 3) ADD_FAILURE() << name << " element " << i << ": got " << g << ", want " << w;
        if (r > g_worst) g_worst = r;
    }
}

void expect_matches_oracle(const problem& p, const grads& g) {
    const mb::dgrads want = mb::backward(as_view(p.q), as_view(p.k), as_view(p.v), as_view(p.dout), mb::weights_of(p.o));
    expect_close(g.dq, want.dq, "d_q");
    expect_close(g.dk, want.dk, "d_k");
    expect_close(g.dv, want.dv, "d_v");
    // A weight gradient sums a whole sequence of products; where the group norm makes the output
    // (nearly) invariant to it, the exact sum cancels to far below its terms and float keeps only
    // their rounding. Its elements are compared relative to a tenth of the largest gradient of the
    // call at least.
    double floor = 0;
    for (const auto* x : {&want.dq, &want.dk, &want.dv, &want.kq_pre, &want.kq_post, &want.head_pre, &want.head_post,
                          &want.norm_w, &want.gate_w})
        floor = std::max(floor, 0.1 * max_abs(*x));
    const unsigned s = p.c.stages;
    if (s & kPreConv) expect_close(g.kq_pre, want.kq_pre, "d_kq_pre", floor);
    if (s & kPreMix) expect_close(g.head_pre, want.head_pre, "d_head_pre", floor);
    if (s & kPostConv) expect_close(g.kq_post, want.kq_post, "d_kq_post", floor);
    if (s & kPostMix) expect_close(g.head_post, want.head_post, "d_head_post", floor);
    if (s & kNorm) expect_close(g.norm_w, want.norm_w, "d_norm_weight", floor);
    if (s & kGate) {
        expect_close(g.gate_w, want.gate_w, "d_gate_weight", floor);
        const double mx = std::max({std::fabs(want.gate_bias), max_abs(want.gate_w), floor});
        EXPECT_NEAR(g.bias, want.gate_bias, kRtol * mx) << "d_gate_bias";
    }
    // Weight gradients of stages that are off are not written.
    if (!(s & kPreConv)) {
        EXPECT_EQ(7.0f, g.kq_pre.data()[0]);
    }
    if (!(s & kGate)) {
        EXPECT_EQ(7.0f, g.bias);
    }
}

void check(const config& c) {
    SCOPED_TRACE(describe(c));
    const problem p(c);
    expect_matches_oracle(p, p.run());
}

TEST(mta_attention_backward, stages) {
    const unsigned sets[] = {0u, kPreConv, kPreMix, kPostConv, kPostMix, kNorm, kDepth, kGate, kNorm | kDepth | kGate,
                             kPreConv | kPostConv, kAll};
    const index_t lengths[] = {1, 2, 3, 4, 5, 8, 9, 16, 17, 63, 64, 65, 129};
    std::size_t n = 0;
    for (unsigned s : sets)
        for (index_t L : lengths) {
            if (!sweep_takes(n++, 0, 3)) continue;
            config c;
            c.L = L, c.stages = s, c.seed = 10 + static_cast<std::uint64_t>(L);
            check(c);
        }
}

TEST(mta_attention_backward, kernel_sizes) {
    std::size_t n = 0;
    for (index_t G : {1, 2})
        for (index_t cq : {1, 3, 6, 9})
            for (index_t ck : {1, 5, 11, 13}) {
                if (!sweep_takes(n++, 0, 2)) continue;
                config c;
                c.L = 70, c.G = G, c.cq = cq, c.ck = ck, c.D = 5, c.Dv = 4, c.seed = 100 + static_cast<std::uint64_t>(n);
                check(c);
            }
}

// Blocks shorter than the halos (1, 3, 5 rows with c_q = 6: the halo rows reach across several
// blocks) and one block of the whole sequence, through the internal entry point's block override.
TEST(mta_attention_backward, block_heights) {
    for (index_t rows : {1, 3, 5, 16, 50}) {
        config c;
        c.L = 50, c.cq = 6, c.ck = 5, c.G = 2, c.seed = 300 + static_cast<std::uint64_t>(rows);
        SCOPED_TRACE(describe(c) + " block rows " + std::to_string(rows));
        const problem p(c);
        grads g = p.make_grads();
        p.want_all(g);
        attnkit::detail::mta::attention_backward_impl<attnkit::simd::default_arch>(
            attnkit::detail::q_view(p.q), attnkit::detail::k_view(p.k), attnkit::detail::v_view(p.v),
            attnkit::view<const float, 4>(p.out), attnkit::view<const float, 4>(p.dout), attnkit::view<float, 4>(g.dq),
            attnkit::view<float, 4>(g.dk), attnkit::view<float, 4>(g.dv), g.dw, p.o, rows);
        expect_matches_oracle(p, g);
    }
}

TEST(mta_attention_backward, heads) {
    for (auto [H, Hk] : {std::pair<index_t, index_t>{1, 1}, {4, 4}, {4, 2}, {6, 1}, {8, 2}}) {
        config c;
        c.B = 2, c.L = 33, c.H = H, c.Hk = Hk, c.G = H % 2 == 0 ? 2 : 1, c.seed = 200 + static_cast<std::uint64_t>(H);
        check(c);
    }
}

// With one query head per key/value head and no stage that reads across heads (mixing, norm,
// gate), a block runs all its stages one head after the other (backward_runner::per_head); a
// grouped convolution (G > 1) still reads the other heads of its group, which must be ready.
// Long enough (L * H above kSerialStageWork) for the pool to split the heads.
TEST(mta_attention_backward, head_by_head_blocks) {
    for (index_t G : {1, 2})
        for (unsigned s : {unsigned(kPreConv), unsigned(kPostConv | kDepth), unsigned(kPreConv | kPostConv)}) {
            config c;
            c.L = 260, c.H = 8, c.Hk = 8, c.G = G, c.cq = 3, c.ck = 5, c.stages = s, c.seed = 400 + s + G;
            if (kReducedSweep && s != unsigned(kPreConv | kPostConv)) continue;
            SCOPED_TRACE(describe(c));
            const problem p(c);
            const grads one = p.run();
            expect_matches_oracle(p, one);
            for (int n : {2, 3}) {
                attnkit::thread_pool pool(n);
                const grads more = p.run(&pool);
                EXPECT_TRUE(all_close(more.dq, one.dq, 0.0, 0.0)) << n << " threads";
                EXPECT_TRUE(all_close(more.dk, one.dk, 0.0, 0.0)) << n << " threads";
                EXPECT_TRUE(all_close(more.dv, one.dv, 0.0, 0.0)) << n << " threads";
                if (s & kPreConv) {
                    EXPECT_TRUE(all_close(more.kq_pre, one.kq_pre, 0.0, 0.0)) << n << " threads";
                }
                if (s & kPostConv) {
                    EXPECT_TRUE(all_close(more.kq_post, one.kq_post, 0.0, 0.0)) << n << " threads";
                }
            }
        }
}

// Identity kernels and W = I: MTA is causal softmax attention, and so are its gradients.
TEST(mta_attention_backward, identity_equals_softmax_backward) {
    for (index_t G : {1, 2}) {
        config c;
        c.L = 70, c.G = G, c.identity = true, c.stages = kPreConv | kPreMix | kPostConv | kPostMix;
        SCOPED_TRACE(describe(c));
        const problem p(c);
        const grads g = p.run();
        tensor4<float> out(c.B, c.L, c.H, c.Dv), dq(c.B, c.L, c.H, c.D), dk(c.B, c.L, c.Hk, c.D), dv(c.B, c.L, c.Hk, c.Dv);
        Eigen::Tensor<float, 3, Eigen::RowMajor> lse(c.B, c.L, c.H);
        attnkit::softmax_options so;
        so.causal = true;
        attnkit::softmax_attention(p.q, p.k, p.v, out, lse, so);
        attnkit::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.dout, dq, dk, dv, so);
        auto to_vec = [](const tensor4<float>& t) { return std::vector<double>(t.data(), t.data() + t.size()); };
        expect_close(g.dq, to_vec(dq), "d_q");
        expect_close(g.dk, to_vec(dk), "d_k");
        expect_close(g.dv, to_vec(dv), "d_v");
    }
}

// Inputs and gradients as strided views ([B, H, L, D] buffers seen as BSHD, q a slice of a wider
// tensor) give the same bits as dense tensors.
TEST(mta_attention_backward, strided_views_equal_dense) {
    config c;
    c.B = 2, c.L = 20;
    const problem p(c);
    const grads dense = p.run();
    tensor4<float> wide(c.B, c.L, c.H, c.D + 3);
    wide.setConstant(std::numeric_limits<float>::quiet_NaN());
    for (index_t b = 0; b < c.B; ++b)
        for (index_t l = 0; l < c.L; ++l)
            for (index_t h = 0; h < c.H; ++h)
                for (index_t d = 0; d < c.D; ++d) wide(b, l, h, d + 1) = p.q(b, l, h, d);
    const attnkit::view<const float, 4> qs(wide.data() + 1, {c.B, c.L, c.H, c.D},
                                           {c.L * c.H * (c.D + 3), c.H * (c.D + 3), c.D + 3, 1});
    std::vector<float> bq(static_cast<std::size_t>(c.B * c.H * c.L * c.D), 7.f),
        bk(static_cast<std::size_t>(c.B * c.Hk * c.L * c.D), 7.f), bv(static_cast<std::size_t>(c.B * c.Hk * c.L * c.Dv), 7.f);
    const auto dq = bhld_as_bshd(bq.data(), c.B, c.H, c.L, c.D);
    const auto dk = bhld_as_bshd(bk.data(), c.B, c.Hk, c.L, c.D);
    const auto dv = bhld_as_bshd(bv.data(), c.B, c.Hk, c.L, c.Dv);
    grads g = p.make_grads();
    p.want_all(g);
    attnkit::mta_attention_backward(qs, p.k, p.v, p.out, p.dout, dq, dk, dv, g.dw, p.o);
    EXPECT_TRUE(all_close(dq, dense.dq, 0.0, 0.0)) << "d_q";
    EXPECT_TRUE(all_close(dk, dense.dk, 0.0, 0.0)) << "d_k";
    EXPECT_TRUE(all_close(dv, dense.dv, 0.0, 0.0)) << "d_v";
    EXPECT_TRUE(all_close(g.kq_pre, dense.kq_pre, 0.0, 0.0)) << "d_kq_pre";
    EXPECT_TRUE(all_close(g.head_post, dense.head_post, 0.0, 0.0)) << "d_head_post";
}

TEST(mta_attention_backward, bitwise_identical_for_any_thread_count) {
    for (unsigned s : {unsigned(kAll), unsigned(kPreConv | kNorm)}) {
        config c;
        // L * H = 2160: above the size below which the stages run on the calling thread
        // (backward_runner::kSerialStageWork), so the pool's split is what is compared.
        c.B = 2, c.L = 360, c.H = 6, c.Hk = 3, c.G = 2;
        c.stages = s;
        const problem p(c);
        const grads one = p.run();
        for (int n : {1, 2, 3}) {
            if (kReducedSweep && n == 3) continue;
            attnkit::thread_pool pool(n);
            const grads more = p.run(&pool);
            EXPECT_TRUE(all_close(more.dq, one.dq, 0.0, 0.0)) << n << " threads";
            EXPECT_TRUE(all_close(more.dk, one.dk, 0.0, 0.0)) << n << " threads";
            EXPECT_TRUE(all_close(more.dv, one.dv, 0.0, 0.0)) << n << " threads";
            EXPECT_TRUE(all_close(more.kq_pre, one.kq_pre, 0.0, 0.0)) << n << " threads";
            EXPECT_TRUE(all_close(more.norm_w, one.norm_w, 0.0, 0.0)) << n << " threads";
            if (s == kAll) {
                EXPECT_TRUE(all_close(more.kq_post, one.kq_post, 0.0, 0.0)) << n << " threads";
                EXPECT_TRUE(all_close(more.head_pre, one.head_pre, 0.0, 0.0)) << n << " threads";
                EXPECT_TRUE(all_close(more.head_post, one.head_post, 0.0, 0.0)) << n << " threads";
                EXPECT_TRUE(all_close(more.gate_w, one.gate_w, 0.0, 0.0)) << n << " threads";
                EXPECT_EQ(more.bias, one.bias) << n << " threads";
            }
        }
    }
}

// A NaN at the last token of item 0's q, k or v (all stages on): item 1's gradients stay finite,
// and so do item 0's d_q rows that no path connects to that token (rows before the last
// c_q,pre - 1 + c_q,post - 1 + 1: the transposed convolutions look that far ahead).
TEST(mta_attention_backward, non_finite_stays_in_the_rows_that_see_it) {
    for (int which = 0; which < 3; ++which) {
        config c;
        c.B = 2, c.L = 70, c.cq = 3, c.ck = 5;
        problem p(c);
        tensor4<float>& x = which == 0 ? p.q : which == 1 ? p.k : p.v;
        x(0, c.L - 1, 0, 0) = std::numeric_limits<float>::quiet_NaN();
        const grads g = p.run();
        const index_t last_clean = c.L - 1 - 2 * (c.cq - 1);
        for (index_t i = 0; i < c.L; ++i)
            for (index_t h = 0; h < c.H; ++h)
                for (index_t d = 0; d < c.D; ++d) {
                    EXPECT_TRUE(std::isfinite(g.dq(1, i, h, d))) << which << " item 1 row " << i;
                    if (i < last_clean) {
                        EXPECT_TRUE(std::isfinite(g.dq(0, i, h, d))) << which << " item 0 row " << i;
                    }
                }
        for (index_t i = 0; i < c.L; ++i)
            for (index_t h = 0; h < c.Hk; ++h) {
                for (index_t d = 0; d < c.D; ++d) EXPECT_TRUE(std::isfinite(g.dk(1, i, h, d))) << which;
                for (index_t d = 0; d < c.Dv; ++d) EXPECT_TRUE(std::isfinite(g.dv(1, i, h, d))) << which;
            }
        EXPECT_TRUE(std::isnan(g.dq(0, c.L - 1, 0, 0))) << which;
    }
}

// The block arrays are kept by the calling thread from one call to the next, dirty. A call must
// read only what it wrote (and the zeroed padding): here a first call fills them with NaN, then a
// finite call of the same shape must give finite gradients. The shape puts a block's last rows
// at the edge where a kernel-gradient group reads keys past what the block wrote: pre
// convolution only (c_q 3, so the arrays end 2 rows past the block), blocks of 21 rows (one ends
// at row 126, its arrays at row 128, a multiple of the key alignment, with one row in its last
// group of four), and a key halo of 13 (c_k 27), so that the reach is past the written keys at
// every lane width.
// Every stage on, the same with the row stages' buffers (o, do) in play.
TEST(mta_attention_backward, earlier_calls_arrays_are_not_read) {
    for (unsigned stages : {unsigned(kPreConv), unsigned(kAll)}) {
        config c;
        c.L = 200, c.H = 2, c.Hk = 2, c.cq = 3, c.ck = 27, c.stages = stages;
        SCOPED_TRACE(describe(c));
        problem p(c);
        auto call = [&](const problem& pr) {
            grads g = pr.make_grads();
            pr.want_all(g);
            attnkit::detail::mta::attention_backward_impl<attnkit::simd::default_arch>(
                attnkit::detail::q_view(pr.q), attnkit::detail::k_view(pr.k), attnkit::detail::v_view(pr.v),
                attnkit::view<const float, 4>(pr.out), attnkit::view<const float, 4>(pr.dout),
                attnkit::view<float, 4>(g.dq), attnkit::view<float, 4>(g.dk), attnkit::view<float, 4>(g.dv), g.dw,
                pr.o, 21);
            return g;
        };
        problem nan = p;
        nan.q.setConstant(std::numeric_limits<float>::quiet_NaN());
        nan.dout.setConstant(std::numeric_limits<float>::quiet_NaN());
        (void)call(nan);
        const grads g = call(p);
        for (index_t e = 0; e < g.kq_pre.size(); ++e)
            EXPECT_TRUE(std::isfinite(g.kq_pre.data()[e])) << "d_kq_pre " << e;
        for (index_t e = 0; e < g.dq.size(); ++e) EXPECT_TRUE(std::isfinite(g.dq.data()[e])) << "d_q " << e;
        expect_matches_oracle(p, g);
    }
}

TEST(mta_attention_backward, empty_sequence_writes_zero_weight_gradients) {
    config c;
    c.L = 0;
    const problem p(c);
    const grads g = p.run();
    for (index_t i = 0; i < g.kq_pre.size(); ++i) EXPECT_EQ(0.0f, g.kq_pre.data()[i]);
    for (index_t i = 0; i < g.norm_w.size(); ++i) EXPECT_EQ(0.0f, g.norm_w.data()[i]);
    EXPECT_EQ(0.0f, g.bias);
}

TEST(mta_attention_backward, bad_input_rejected_before_writing) {
    config c;
    c.L = 6, c.stages = kPreConv | kNorm;
    const problem p(c);
    auto untouched = [](const grads& g) {
        for (const tensor4<float>* t : {&g.dq, &g.dk, &g.dv, &g.kq_pre})
            for (index_t i = 0; i < t->size(); ++i) EXPECT_EQ(7.0f, t->data()[i]);
        for (index_t i = 0; i < g.norm_w.size(); ++i) EXPECT_EQ(7.0f, g.norm_w.data()[i]);
    };
    auto call = [&](grads& g, const tensor4<float>& dout, const mta_options& o) {
        attnkit::mta_attention_backward(p.q, p.k, p.v, p.out, dout, g.dq, g.dk, g.dv, g.dw, o);
    };
    {  // a gradient of the wrong shape
        grads g = p.make_grads();
        p.want_all(g);
        g.dv = make_bshd<float>(c.B, c.L, c.Hk, c.Dv + 1, 7.0f);
        expect_invalid([&] { call(g, p.dout, p.o); }, "d_v");
        g.dv = make_bshd<float>(c.B, c.L, c.Hk, c.Dv, 7.0f);
        untouched(g);
    }
    {  // d_out of the wrong shape
        grads g = p.make_grads();
        p.want_all(g);
        const tensor4<float> bad = make_bshd<float>(c.B, c.L + 1, c.H, c.Dv, 1.0f);
        expect_invalid([&] { call(g, bad, p.o); }, "d_out");
        untouched(g);
    }
    {  // a weight gradient of the wrong shape
        grads g = p.make_grads();
        p.want_all(g);
        tensor4<float> wrong(c.H, c.G, c.cq, c.ck + 2);
        g.dw.kq_pre = wrong;
        expect_invalid([&] { call(g, p.dout, p.o); }, {"d_weights.kq_pre", "opts.kq_pre"});
        untouched(g);
    }
    {  // a weight gradient for a stage that is off
        grads g = p.make_grads();
        p.want_all(g);
        g.dw.head_post = g.head_post;
        expect_invalid([&] { call(g, p.dout, p.o); }, {"d_weights.head_post", "opts.head_post"});
        untouched(g);
        g.dw.head_post = {};
        g.dw.gate_bias = &g.bias;
        expect_invalid([&] { call(g, p.dout, p.o); }, "d_weights.gate_bias");
        untouched(g);
    }
    {  // a gradient laid over an input
        grads g = p.make_grads();
        p.want_all(g);
        tensor4<float> qcopy = p.q;
        expect_invalid([&] {
            attnkit::mta_attention_backward(qcopy, p.k, p.v, p.out, p.dout, qcopy, g.dk, g.dv, g.dw, p.o);
        }, "overlap");
        untouched(g);
    }
    {  // the forward's checks: a bad option
        grads g = p.make_grads();
        p.want_all(g);
        mta_options o = p.o;
        o.norm_eps = 0.0f;
        expect_invalid([&] { call(g, p.dout, o); }, "opts.norm_eps");
        untouched(g);
    }
}

TEST(zz_margin, report) {
    std::printf("worst error over the file: %.3g of the tolerance (kRtol %.1e)\n", g_worst, kRtol);
}

}  // namespace
