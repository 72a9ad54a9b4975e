// Bad inputs of multi-token attention, shared by the kernel's and the oracle's tests
// (tests/mta_attention_test.cpp, tests/reference_mta_attention_test.cpp): both entry points
// validate through detail/mta/check.hpp, so both must reject every case below with
// std::invalid_argument naming `what`, before writing anything.
//
//   const mta_bad_inputs bad;   // valid q [1, 5, 4, 3], k [1, 5, 2, 3], v [1, 5, 2, 2], and the cases
//   bad.expect_all_rejected([](const auto& q, const auto& k, const auto& v, auto& out, const auto& o) {
//       attnkit::mta_attention(q, k, v, out, o);
//   });
//
// Each case is one option (a weight of the wrong shape, a value out of range) or one of q, k, v
// replaced by a tensor of the wrong shape. The options borrow the weights held here, so the
// object is neither copied nor moved.
#pragma once

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "attnkit/options.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace attnkit_test {

class mta_bad_inputs {
   public:
    static constexpr index_t kL = 5, kH = 4, kHk = 2, kD = 3, kDv = 2;
    static constexpr float kSentinel = 7.0f;

    struct bad_case {
        const tensor4<float>*q, *k, *v;
        attnkit::mta_options opts;
        std::string what;
    };

    tensor4<float> q = random_bshd(1, kL, kH, kD, distribution::uniform, 60);
    tensor4<float> k = random_bshd(1, kL, kHk, kD, distribution::uniform, 61);
    tensor4<float> v = random_bshd(1, kL, kHk, kDv, distribution::uniform, 62);
    std::vector<bad_case> cases;

    mta_bad_inputs() {
        const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
        // Convolution kernels [H, G, c_q, c_k]: H not the query heads, G not dividing H, even c_k,
        // no query or key taps.
        for (const tensor4<float>* t : {&wrong_heads_, &bad_group_, &even_ck_, &zero_cq_, &zero_ck_}) {
            attnkit::mta_options pre, post;
            pre.kq_pre = *t;
            post.kq_post = *t;
            add(pre, "opts.kq_pre");
            add(post, "opts.kq_post");
        }
        // Head mixing matrices [H, H].
        for (const tensor2_t* t : {&not_square_, &wrong_h_}) {
            attnkit::mta_options pre, post;
            pre.head_pre = *t;
            post.head_post = *t;
            add(pre, "opts.head_pre");
            add(post, "opts.head_post");
        }
        attnkit::mta_options nw, gw, layer;
        nw.norm_weight = wrong_dv_;
        gw.gate_weight = wrong_dv_;
        layer.norm_layer = -2;
        add(nw, "opts.norm_weight");
        add(gw, "opts.gate_weight");
        add(layer, "opts.norm_layer");
        for (float eps : {0.0f, -1e-5f, nan, inf}) {
            attnkit::mta_options o;
            o.norm_eps = eps;
            add(o, "opts.norm_eps");
        }
        for (float bias : {nan, inf}) {
            attnkit::mta_options o;
            o.gate_bias = bias;
            add(o, "opts.gate_bias");
        }
        for (float scale : {-1.0f, nan}) {
            attnkit::mta_options o;
            o.scale = scale;
            add(o, "opts.scale");
        }
        // Softmax's own checks: Lq != Lk, H % Hk, k's head dim, v's head dim against out.
        cases.push_back({&q, &k_long_, &v_long_, {}, "Lq == Lk"});
        cases.push_back({&q, &k_h3_, &v_h3_, {}, "multiple of key heads"});
        cases.push_back({&q, &k_d_, &v, {}, "k: expected shape"});
        cases.push_back({&q, &k, &v_dv_, {}, "out: expected shape"});
    }
    mta_bad_inputs(const mta_bad_inputs&) = delete;
    mta_bad_inputs& operator=(const mta_bad_inputs&) = delete;

    // call(q, k, v, out, opts) must throw for every case and leave out [1, L, H, Dv] untouched.
    template <class Call>
    void expect_all_rejected(Call&& call) const {
        for (const bad_case& c : cases) {
            tensor4<float> out = make_bshd<float>(1, kL, kH, kDv, kSentinel);
            expect_invalid([&] { call(*c.q, *c.k, *c.v, out, c.opts); }, c.what);
            EXPECT_TRUE(all_equal_to(out, kSentinel)) << c.what;
        }
    }

   private:
    using tensor2_t = Eigen::Tensor<float, 2, Eigen::RowMajor>;
    using tensor1_t = Eigen::Tensor<float, 1, Eigen::RowMajor>;

    static tensor4<float> zeros(index_t a, index_t b, index_t c, index_t d) { return make_bshd<float>(a, b, c, d); }
    static tensor2_t zeros2(index_t a, index_t b) {
        tensor2_t t(a, b);
        t.setZero();
        return t;
    }
    static tensor1_t zeros1(index_t a) {
        tensor1_t t(a);
        t.setZero();
        return t;
    }
    void add(const attnkit::mta_options& o, const char* what) { cases.push_back({&q, &k, &v, o, what}); }

    tensor4<float> wrong_heads_ = zeros(2, 1, 3, 3), bad_group_ = zeros(4, 3, 3, 3), even_ck_ = zeros(4, 1, 3, 4),
                   zero_cq_ = zeros(4, 1, 0, 3), zero_ck_ = zeros(4, 1, 1, 0);
    tensor2_t not_square_ = zeros2(4, 3), wrong_h_ = zeros2(3, 3);
    tensor1_t wrong_dv_ = zeros1(3);
    tensor4<float> k_long_ = random_bshd(1, kL + 1, kHk, kD, distribution::uniform, 63);
    tensor4<float> v_long_ = random_bshd(1, kL + 1, kHk, kDv, distribution::uniform, 64);
    tensor4<float> k_h3_ = random_bshd(1, kL, 3, kD, distribution::uniform, 65);
    tensor4<float> v_h3_ = random_bshd(1, kL, 3, kDv, distribution::uniform, 66);
    tensor4<float> k_d_ = random_bshd(1, kL, kHk, kD + 1, distribution::uniform, 68);
    tensor4<float> v_dv_ = random_bshd(1, kL, kHk, kDv + 1, distribution::uniform, 67);
};

}  // namespace attnkit_test
