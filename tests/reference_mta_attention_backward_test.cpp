// attnkit::reference::mta_attention_backward against central finite differences of the forward,
// all in double, with a random projection loss <out, R> (sum(out) would hide a gradient landing
// on the wrong element, head or row).
//
//   matches_forward            the oracle's double-weight forward equals reference::mta_attention
//   finite_differences         every stage alone and all together (G = 1 and G > 1, GQA): d_q,
//                              d_k, d_v and every weight gradient, gate bias included
//   identity_is_softmax        identity kernels and W = I: the gradients of q, k, v equal
//                              reference::softmax_attention_backward's (causal)
//   public_entry_point         the float-weight entry point writes what the double core computes,
//                              leaves null gradients alone, and overwrites
//   rejects_bad_gradients      shapes, gradients for stages that are off; nothing written
#include "attnkit/reference/mta_attention_backward.hpp"

#include "attnkit/reference/mta_attention.hpp"
#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/reference/softmax_attention_backward.hpp"

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
using attnkit::mta_options;
using namespace attnkit_test;
namespace ref = attnkit::reference;
namespace mb = attnkit::reference::mta_backward_impl;
using vec_map = Eigen::TensorMap<Eigen::Tensor<double, 1, Eigen::RowMajor>>;
using cvec_map = Eigen::TensorMap<const Eigen::Tensor<double, 1, Eigen::RowMajor>>;

enum stage : unsigned { kPreConv = 1, kPreMix = 2, kPostConv = 4, kPostMix = 8, kNorm = 16, kDepth = 32, kGate = 64,
                        kAll = 127 };

struct config {
    index_t B = 1, L = 6, H = 2, Hk = 2, D = 3, Dv = 3;
    index_t G = 1, cq = 2, ck = 3;
    unsigned stages = kAll;
};

std::vector<double> gaussian(std::size_t n, std::uint64_t seed) {
    std::vector<double> x(n);
    fill_random(x.data(), n, distribution::gaussian, seed);
    return x;
}

// Weights near identity (as trained models start) plus noise, so every tap and entry matters.
mb::dweights make_weights(const config& c, std::uint64_t seed) {
    mb::dweights w;
    auto conv = [&](std::uint64_t s) {
        mb::dconv k;
        k.G = c.G, k.cq = c.cq, k.ck = c.ck;
        k.w = gaussian(static_cast<std::size_t>(c.H * c.G * c.cq * c.ck), s);
        for (double& x : k.w) x *= 0.3;
        for (index_t h = 0; h < c.H; ++h)
            k.w[static_cast<std::size_t>(((h * c.G + h % c.G) * c.cq + c.cq - 1) * c.ck + (c.ck - 1) / 2)] += 1.0;
        return k;
    };
    auto matrix = [&](std::uint64_t s) {
        std::vector<double> m = gaussian(static_cast<std::size_t>(c.H * c.H), s);
        for (double& x : m) x *= 0.3;
        for (index_t h = 0; h < c.H; ++h) m[static_cast<std::size_t>(h * c.H + h)] += 1.0;
        return m;
    };
    if (c.stages & kPreConv) w.pre = conv(seed);
    if (c.stages & kPreMix) w.head_pre = matrix(seed + 1);
    if (c.stages & kPostConv) w.post = conv(seed + 2);
    if (c.stages & kPostMix) w.head_post = matrix(seed + 3);
    if (c.stages & kNorm) {
        w.norm_w = gaussian(static_cast<std::size_t>(c.Dv), seed + 4);
        for (double& x : w.norm_w) x = 1.0 + 0.3 * x;
    }
    if (c.stages & kDepth) w.depth = 0.2 + 0.6 * std::exp(-0.3 * 2.0);
    if (c.stages & kGate) {
        w.gate_w = gaussian(static_cast<std::size_t>(c.Dv), seed + 5);
        w.gate_bias = 0.3;
    }
    return w;
}

struct fd_problem_mta {
    config c;
    tensor4<double> q, k, v, r;
    mb::dweights w;

    fd_problem_mta(const config& cf, std::uint64_t seed)
        : c(cf),
          q(random_bshd<double>(c.B, c.L, c.H, c.D, distribution::gaussian, seed)),
          k(random_bshd<double>(c.B, c.L, c.Hk, c.D, distribution::gaussian, seed + 1)),
          v(random_bshd<double>(c.B, c.L, c.Hk, c.Dv, distribution::gaussian, seed + 2)),
          r(random_bshd<double>(c.B, c.L, c.H, c.Dv, distribution::gaussian, seed + 3)),
          w(make_weights(c, seed + 4)) {}

    double loss() const {
        const std::vector<double> out = mb::forward(as_view(q), as_view(k), as_view(v), w);
        double l = 0.0;
        for (index_t i = 0; i < r.size(); ++i) l += out[static_cast<std::size_t>(i)] * r.data()[i];
        return l;
    }
    mb::dgrads grads() const { return mb::backward(as_view(q), as_view(k), as_view(v), as_view(r), w); }
};

std::string describe(const config& c) {
    return "B" + std::to_string(c.B) + " L" + std::to_string(c.L) + " H" + std::to_string(c.H) + "/" +
           std::to_string(c.Hk) + " G" + std::to_string(c.G) + " " + std::to_string(c.cq) + "x" + std::to_string(c.ck) +
           " stages " + std::to_string(c.stages);
}

void check_vector(std::vector<double>& x, const std::vector<double>& g, const fd_problem_mta& p, const char* name) {
    ASSERT_EQ(x.size(), g.size()) << name;
    if (x.empty()) return;
    vec_map xm(x.data(), static_cast<index_t>(x.size()));
    cvec_map gm(g.data(), static_cast<index_t>(g.size()));
    expect_gradient_matches_fd(xm, gm, [&] { return p.loss(); }, name);
}

void check_all(fd_problem_mta& p) {
    const mb::dgrads g = p.grads();
    auto as4 = [&](const std::vector<double>& x, const tensor4<double>& like) {
        tensor4<double> t(like.dimensions());
        std::copy(x.begin(), x.end(), t.data());
        return t;
    };
    const tensor4<double> dq = as4(g.dq, p.q), dk = as4(g.dk, p.k), dv = as4(g.dv, p.v);
    auto loss = [&] { return p.loss(); };
    expect_gradient_matches_fd(p.q, dq, loss, "d_q");
    expect_gradient_matches_fd(p.k, dk, loss, "d_k");
    expect_gradient_matches_fd(p.v, dv, loss, "d_v");
    check_vector(p.w.pre.w, g.kq_pre, p, "d_kq_pre");
    check_vector(p.w.head_pre, g.head_pre, p, "d_head_pre");
    check_vector(p.w.post.w, g.kq_post, p, "d_kq_post");
    check_vector(p.w.head_post, g.head_post, p, "d_head_post");
    check_vector(p.w.norm_w, g.norm_w, p, "d_norm_weight");
    check_vector(p.w.gate_w, g.gate_w, p, "d_gate_weight");
    if (!p.w.gate_w.empty()) {
        std::vector<double> b{p.w.gate_bias}, gb{g.gate_bias};
        vec_map bm(b.data(), 1);
        cvec_map gm(gb.data(), 1);
        expect_gradient_matches_fd(bm, gm, [&] { p.w.gate_bias = b[0]; const double l = p.loss(); return l; },
                                   "d_gate_bias");
        p.w.gate_bias = b[0];
    }
}

// A float-weight option set and its tensors, for the public entry points.
struct float_weights {
    tensor4<float> kq_pre, kq_post;
    Eigen::Tensor<float, 2, Eigen::RowMajor> head_pre, head_post;
    Eigen::Tensor<float, 1, Eigen::RowMajor> norm_w, gate_w;
    mta_options o;
    float_weights(const config& c, std::uint64_t seed) {
        const mb::dweights w = make_weights(c, seed);
        auto f4 = [&](const mb::dconv& k, tensor4<float>& t) {
            t = tensor4<float>(c.H, c.G, c.cq, c.ck);
            for (index_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(k.w[static_cast<std::size_t>(i)]);
        };
        if (w.pre.on()) f4(w.pre, kq_pre), o.kq_pre = kq_pre;
        if (w.post.on()) f4(w.post, kq_post), o.kq_post = kq_post;
        auto f2 = [&](const std::vector<double>& m, Eigen::Tensor<float, 2, Eigen::RowMajor>& t) {
            t = Eigen::Tensor<float, 2, Eigen::RowMajor>(c.H, c.H);
            for (index_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(m[static_cast<std::size_t>(i)]);
        };
        if (!w.head_pre.empty()) f2(w.head_pre, head_pre), o.head_pre = head_pre;
        if (!w.head_post.empty()) f2(w.head_post, head_post), o.head_post = head_post;
        auto f1 = [&](const std::vector<double>& m, Eigen::Tensor<float, 1, Eigen::RowMajor>& t) {
            t = Eigen::Tensor<float, 1, Eigen::RowMajor>(c.Dv);
            for (index_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(m[static_cast<std::size_t>(i)]);
        };
        if (!w.norm_w.empty()) f1(w.norm_w, norm_w), o.norm_weight = norm_w;
        if (!w.gate_w.empty()) f1(w.gate_w, gate_w), o.gate_weight = gate_w, o.gate_bias = 0.3f;
        if (c.stages & kDepth) o.norm_layer = 2;
    }
};

TEST(reference_mta_attention_backward, matches_forward) {
    for (unsigned st : {0u, unsigned(kAll)}) {
        config c;
        c.B = 2, c.L = 7, c.H = 4, c.Hk = 2, c.G = 2, c.cq = 3, c.ck = 3, c.stages = st;
        const float_weights fw(c, 11);
        const tensor4<double> q = random_bshd<double>(c.B, c.L, c.H, c.D, distribution::gaussian, 1),
                              k = random_bshd<double>(c.B, c.L, c.Hk, c.D, distribution::gaussian, 2),
                              v = random_bshd<double>(c.B, c.L, c.Hk, c.Dv, distribution::gaussian, 3);
        tensor4<double> want(c.B, c.L, c.H, c.Dv);
        ref::mta_attention(q, k, v, want, fw.o);
        const std::vector<double> got = mb::forward(as_view(q), as_view(k), as_view(v), mb::weights_of(fw.o));
        for (index_t i = 0; i < want.size(); ++i)
            EXPECT_NEAR(want.data()[i], got[static_cast<std::size_t>(i)], 1e-12 * (1.0 + std::fabs(want.data()[i])));
    }
}

TEST(reference_mta_attention_backward, finite_differences) {
    std::vector<config> cs;
    for (unsigned st : {0u, unsigned(kPreConv), unsigned(kPreMix), unsigned(kPostConv), unsigned(kPostMix),
                        unsigned(kNorm), unsigned(kDepth), unsigned(kGate), unsigned(kNorm | kDepth), unsigned(kAll)}) {
        config c;
        c.stages = st;
        cs.push_back(c);
    }
    {  // G > 1, GQA, wider kernels, two items
        config c;
        c.B = 2, c.L = 7, c.H = 4, c.Hk = 2, c.G = 2, c.cq = 3, c.ck = 5, c.D = 2, c.Dv = 2;
        cs.push_back(c);
        c.stages = kPreConv;
        cs.push_back(c);
        c.stages = kPostConv;
        cs.push_back(c);
    }
    {  // MQA, c_q = 1, c_k = 1
        config c;
        c.L = 5, c.H = 3, c.Hk = 1, c.cq = 1, c.ck = 1;
        cs.push_back(c);
    }
    std::uint64_t seed = 900;
    for (const config& c : cs) {
        SCOPED_TRACE(describe(c));
        fd_problem_mta p(c, seed += 10);
        check_all(p);
    }
}

// Identity kernels (G = 1 and G > 1) and W = I reduce MTA to causal softmax attention.
TEST(reference_mta_attention_backward, identity_is_softmax) {
    for (index_t G : {1, 2}) {
        config c;
        c.B = 2, c.L = 9, c.H = 4, c.Hk = 2, c.G = G, c.cq = 3, c.ck = 5, c.stages = kPreConv | kPreMix | kPostConv | kPostMix;
        SCOPED_TRACE(describe(c));
        mb::dweights w = make_weights(c, 5);
        for (auto* k : {&w.pre, &w.post}) {
            std::fill(k->w.begin(), k->w.end(), 0.0);
            for (index_t h = 0; h < c.H; ++h)
                k->w[static_cast<std::size_t>(((h * c.G + h % c.G) * c.cq + c.cq - 1) * c.ck + (c.ck - 1) / 2)] = 1.0;
        }
        for (auto* m : {&w.head_pre, &w.head_post})
            for (index_t h = 0; h < c.H; ++h)
                for (index_t g = 0; g < c.H; ++g) (*m)[static_cast<std::size_t>(h * c.H + g)] = h == g ? 1.0 : 0.0;
        fd_problem_mta p(c, 77);
        p.w = w;
        const mb::dgrads g = p.grads();
        tensor4<double> out(c.B, c.L, c.H, c.Dv), dq(c.B, c.L, c.H, c.D), dk(c.B, c.L, c.Hk, c.D), dv(c.B, c.L, c.Hk, c.Dv);
        Eigen::Tensor<double, 3, Eigen::RowMajor> lse(c.B, c.L, c.H);
        attnkit::softmax_options so;
        so.causal = true;
        ref::softmax_attention(p.q, p.k, p.v, out, lse, so);
        ref::softmax_attention_backward(p.q, p.k, p.v, out, lse, p.r, dq, dk, dv, so);
        for (index_t i = 0; i < dq.size(); ++i) EXPECT_NEAR(dq.data()[i], g.dq[static_cast<std::size_t>(i)], 1e-12);
        for (index_t i = 0; i < dk.size(); ++i) EXPECT_NEAR(dk.data()[i], g.dk[static_cast<std::size_t>(i)], 1e-12);
        for (index_t i = 0; i < dv.size(); ++i) EXPECT_NEAR(dv.data()[i], g.dv[static_cast<std::size_t>(i)], 1e-12);
    }
}

TEST(reference_mta_attention_backward, public_entry_point) {
    config c;
    c.B = 1, c.L = 6, c.H = 4, c.Hk = 2, c.G = 2, c.cq = 2, c.ck = 3;
    const float_weights fw(c, 31);
    const tensor4<float> q = random_bshd(c.B, c.L, c.H, c.D, distribution::gaussian, 1),
                         k = random_bshd(c.B, c.L, c.Hk, c.D, distribution::gaussian, 2),
                         v = random_bshd(c.B, c.L, c.Hk, c.Dv, distribution::gaussian, 3),
                         r = random_bshd(c.B, c.L, c.H, c.Dv, distribution::gaussian, 4);
    tensor4<float> out(c.B, c.L, c.H, c.Dv);
    ref::mta_attention(q, k, v, out, fw.o);
    tensor4<float> dq = make_bshd<float>(c.B, c.L, c.H, c.D, 7.f), dk = make_bshd<float>(c.B, c.L, c.Hk, c.D, 7.f),
                   dv = make_bshd<float>(c.B, c.L, c.Hk, c.Dv, 7.f), dkq(c.H, c.G, c.cq, c.ck);
    Eigen::Tensor<float, 2, Eigen::RowMajor> dhp(c.H, c.H);
    dkq.setConstant(7.f);
    dhp.setConstant(7.f);
    float db = 7.f;
    attnkit::mta_weight_grads dw;
    dw.kq_post = dkq;
    dw.head_pre = dhp;
    dw.gate_bias = &db;
    ref::mta_attention_backward(q, k, v, out, r, dq, dk, dv, dw, fw.o);
    const mb::dgrads g = mb::backward(as_view(q), as_view(k), as_view(v), as_view(r), mb::weights_of(fw.o));
    for (index_t i = 0; i < dq.size(); ++i) EXPECT_EQ(dq.data()[i], static_cast<float>(g.dq[static_cast<std::size_t>(i)]));
    for (index_t i = 0; i < dk.size(); ++i) EXPECT_EQ(dk.data()[i], static_cast<float>(g.dk[static_cast<std::size_t>(i)]));
    for (index_t i = 0; i < dv.size(); ++i) EXPECT_EQ(dv.data()[i], static_cast<float>(g.dv[static_cast<std::size_t>(i)]));
    for (index_t i = 0; i < dkq.size(); ++i)
        EXPECT_EQ(dkq.data()[i], static_cast<float>(g.kq_post[static_cast<std::size_t>(i)]));
    for (index_t i = 0; i < dhp.size(); ++i)
        EXPECT_EQ(dhp.data()[i], static_cast<float>(g.head_pre[static_cast<std::size_t>(i)]));
    EXPECT_EQ(db, static_cast<float>(g.gate_bias));
}

TEST(reference_mta_attention_backward, rejects_bad_gradients) {
    config c;
    c.stages = kPreConv;
    const float_weights fw(c, 3);
    const tensor4<float> q = random_bshd(c.B, c.L, c.H, c.D, distribution::gaussian, 1),
                         k = random_bshd(c.B, c.L, c.Hk, c.D, distribution::gaussian, 2),
                         v = random_bshd(c.B, c.L, c.Hk, c.Dv, distribution::gaussian, 3),
                         r = random_bshd(c.B, c.L, c.H, c.Dv, distribution::gaussian, 4);
    tensor4<float> out(c.B, c.L, c.H, c.Dv), dq = make_bshd<float>(c.B, c.L, c.H, c.D, 7.f),
                                             dk = make_bshd<float>(c.B, c.L, c.Hk, c.D, 7.f),
                                             dv = make_bshd<float>(c.B, c.L, c.Hk, c.Dv, 7.f),
                                             bad_dv = make_bshd<float>(c.B, c.L, c.Hk, c.Dv + 1, 7.f),
                                             bad_kq(c.H, c.G, c.cq + 1, c.ck);
    Eigen::Tensor<float, 2, Eigen::RowMajor> dhp(c.H, c.H);
    ref::mta_attention(q, k, v, out, fw.o);
    expect_invalid([&] { ref::mta_attention_backward(q, k, v, out, r, dq, dk, bad_dv, {}, fw.o); }, "d_v");
    attnkit::mta_weight_grads wrong;
    wrong.kq_pre = bad_kq;
    expect_invalid([&] { ref::mta_attention_backward(q, k, v, out, r, dq, dk, dv, wrong, fw.o); }, "d_weights.kq_pre");
    attnkit::mta_weight_grads off;
    off.head_post = dhp;
    expect_invalid([&] { ref::mta_attention_backward(q, k, v, out, r, dq, dk, dv, off, fw.o); },
                   {"d_weights.head_post", "opts.head_post"});
    float db = 0;
    attnkit::mta_weight_grads no_gate;
    no_gate.gate_bias = &db;
    expect_invalid([&] { ref::mta_attention_backward(q, k, v, out, r, dq, dk, dv, no_gate, fw.o); },
                   "d_weights.gate_bias");
    EXPECT_EQ(7.f, dq(0, 0, 0, 0));
    EXPECT_EQ(7.f, dk(0, 0, 0, 0));
    EXPECT_EQ(7.f, dv(0, 0, 0, 0));
}

}  // namespace
