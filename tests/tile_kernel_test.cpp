// The tile engine's value-sets hook (detail/tile_kernel.hpp, attention_problem::n_sets): one
// score tile and row transform applied to n_sets value tensors, each with its own O^T and
// output rows, sharing the row state. Static QK attention runs one fixed batch-1 Q/K map over
// every batch item's V this way.
//
// What is covered, for both row policies (softmax_rows, taylor::quadratic_rows):
//   matches_reference   set t of a multi-set call equals the reference run on (q, k, v[t]),
//                       output (and lse for softmax), over shapes that straddle the panel
//                       (2W rows), key block (96) and split-KV (>= 512 keys, few items) edges,
//                       Lq != Lk, GQA, causal or not, 1 to 5 sets.
//   one_set_is_the_kernel  n_sets = 1 through the engine gives the public softmax kernel's bits.
//   sets_are_isolated   NaN in one set's V reaches that set's visible rows only; the other sets
//                       are bitwise those of a clean call.
//   threads             1, 2, 3 threads bitwise identical (split-KV included).
// Tolerances as softmax_attention_test: tolerance_for(16, attention_magnitude(q, k, v, scale)).
#include "attnkit/detail/attention_driver.hpp"
#include "attnkit/detail/taylor/quadratic.hpp"
#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/reference/taylor_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/thread_pool.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::view;
using namespace attnkit_test;
using A = attnkit::simd::default_arch;

constexpr double kOutEps = 16;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct sets_case {
    index_t n_sets, Lq, Lk, H, Hk, D, Dv;
    bool causal;
    distribution dist;
};

std::string name_of(const sets_case& c) {
    std::ostringstream os;
    os << "sets" << c.n_sets << "_Lq" << c.Lq << "_Lk" << c.Lk << "_H" << c.H << "_Hk" << c.Hk << "_D" << c.D
       << "_Dv" << c.Dv << (c.causal ? "_causal_" : "_full_") << c.dist;
    return os.str();
}

// Batch item t of a [S, L, H, D] tensor as a [1, L, H, D] view.
view<const float, 4> item(const tensor4<float>& x, index_t t) {
    return view<const float, 4>(x.data() + t * x.dimension(1) * x.dimension(2) * x.dimension(3),
                                {1, x.dimension(1), x.dimension(2), x.dimension(3)},
                                {x.dimension(1) * x.dimension(2) * x.dimension(3), x.dimension(2) * x.dimension(3),
                                 x.dimension(3), 1});
}

struct inputs {
    tensor4<float> q, k, v;  // q [1, Lq, H, D], k [1, Lk, Hk, D], v [S, Lk, Hk, Dv]
};

inputs make_inputs(const sets_case& c, std::uint64_t seed) {
    return {random_bshd(1, c.Lq, c.H, c.D, c.dist, seed), random_bshd(1, c.Lk, c.Hk, c.D, c.dist, seed + 1),
            random_bshd(c.n_sets, c.Lk, c.Hk, c.Dv, c.dist, seed + 2)};
}

// The engine over every value set of in.v: out [S, Lq, H, Dv], lse [S, Lq, H] (softmax only).
template <class Policy>
attention_outputs<float> run_sets(const inputs& in, bool causal, const Policy& pol, float q_scale,
                                  attnkit::thread_pool* pool = nullptr) {
    const index_t S = in.v.dimension(0);
    attention_outputs<float> r{make_bshd<float>(S, in.q.dimension(1), in.q.dimension(2), in.v.dimension(3), kNaN),
                               make_lse<float>(S, in.q.dimension(1), in.q.dimension(2), kNaN)};
    const auto qv = as_view(in.q);
    const auto kv = as_view(in.k);
    const auto v0 = item(in.v, 0);
    const attnkit::detail::attention_shape s = attnkit::detail::check_qkv(qv, kv, v0);
    auto p = attnkit::detail::make_base_problem(qv, kv, v0, s, causal, {});
    p.q_scale = q_scale;
    p.n_sets = S;
    p.v_set_stride = in.v.dimension(1) * in.v.dimension(2) * in.v.dimension(3);
    attnkit::detail::forward_outputs fo;
    fo.out = view<float, 4>(r.out.data(), {1, r.out.dimension(1), r.out.dimension(2), r.out.dimension(3)},
                            {0, r.out.dimension(2) * r.out.dimension(3), r.out.dimension(3), 1});
    fo.out_set_stride = r.out.dimension(1) * r.out.dimension(2) * r.out.dimension(3);
    if (std::is_same<Policy, attnkit::detail::softmax_rows>::value) {  // the softmax's lse, one per set
        fo.lse = view<float, 3>(r.lse.data(), {1, r.lse.dimension(1), r.lse.dimension(2)},
                                {0, r.lse.dimension(2), 1});
        fo.lse_set_stride = r.lse.dimension(1) * r.lse.dimension(2);
    }
    attnkit::detail::attention_forward<A>(p, pol, fo, pool);
    return r;
}

float default_scale(index_t D) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))); }

attention_outputs<float> run_softmax_sets(const inputs& in, bool causal, attnkit::thread_pool* pool = nullptr) {
    return run_sets(in, causal, attnkit::detail::softmax_rows{},
                    default_scale(in.q.dimension(3)) * attnkit::simd::kLog2e, pool);
}

attention_outputs<float> run_taylor_sets(const inputs& in, bool causal, attnkit::thread_pool* pool = nullptr) {
    return run_sets(in, causal, attnkit::detail::taylor::quadratic_rows{1e-6f}, default_scale(in.q.dimension(3)),
                    pool);
}

// Set t of a [S, ...] result as a [1, ...] view.
view<const float, 4> set_of(const tensor4<float>& x, index_t t) { return item(x, t); }
view<const float, 3> set_of(const tensor3<float>& x, index_t t) {
    return view<const float, 3>(x.data() + t * x.dimension(1) * x.dimension(2),
                                {1, x.dimension(1), x.dimension(2)}, {x.dimension(1) * x.dimension(2), x.dimension(2), 1});
}

std::vector<sets_case> sweep() {
    constexpr index_t W = attnkit::simd::kLanes<A>, RT = 2 * W;
    std::vector<sets_case> cs;
    int i = 0;
    auto add = [&](index_t S, index_t Lq, index_t Lk, index_t H, index_t Hk, index_t D, index_t Dv, bool causal) {
        cs.push_back({S, Lq, Lk, H, Hk, D, Dv, causal, kAllDistributions[i++ % 3]});
    };
    for (bool causal : {false, true}) {
        add(1, 1, 1, 1, 1, 1, 1, causal);
        add(2, RT - 1, RT + 1, 2, 1, W + 1, W - 1 > 0 ? W - 1 : 1, causal);
        add(3, 3 * W + 2, 97, 4, 2, 16, 24, causal);
        add(5, 37, 191, 3, 3, 13, 7, causal);     // Lq != Lk, two key blocks
        add(2, 131, 131, 2, 2, 32, 32, causal);   // several panels per block
        add(3, 23, 700, 1, 1, 17, 33, causal);    // few items, >= 512 keys: split-KV
        add(4, 300, 260, 4, 1, 8, 12, causal);    // Lq > Lk, MQA, two row blocks
    }
    return cs;
}

class value_sets : public ::testing::TestWithParam<sets_case> {};

TEST_P(value_sets, softmax_matches_reference) {
    const sets_case c = GetParam();
    const inputs in = make_inputs(c, 11);
    const auto got = run_softmax_sets(in, c.causal);
    attnkit::softmax_options o;
    o.causal = c.causal;
    for (index_t t = 0; t < c.n_sets; ++t) {
        auto want = outputs_for<double>(in.q, item(in.v, t), 0.0);
        attnkit::reference::softmax_attention(in.q, in.k, item(in.v, t), want.out, want.lse, o);
        const double mag = attention_magnitude(in.q, in.k, item(in.v, t), default_scale(c.D));
        EXPECT_TRUE(all_close(set_of(got.out, t), want.out, tolerance_for(kOutEps, mag))) << "set " << t;
        EXPECT_TRUE(all_close(set_of(got.lse, t), want.lse, tolerance_for(kOutEps, 1.0 + mag))) << "set " << t;
    }
}

TEST_P(value_sets, taylor_matches_reference) {
    const sets_case c = GetParam();
    const inputs in = make_inputs(c, 23);
    const auto got = run_taylor_sets(in, c.causal);
    attnkit::taylor_options o;
    o.causal = c.causal;
    o.form = attnkit::taylor_form::quadratic;
    for (index_t t = 0; t < c.n_sets; ++t) {
        auto want = outputs_for<double>(in.q, item(in.v, t), 0.0);
        attnkit::reference::taylor_attention(in.q, in.k, item(in.v, t), want.out, o);
        // w = 1 + s + s^2/2 moves by (1 + s) ds, at most 1.2 |ds| relative to w: the softmax's
        // error scale max|v| (1 + S) holds (S the Cauchy-Schwarz bound on the scores).
        const double mag = attention_magnitude(in.q, in.k, item(in.v, t), default_scale(c.D));
        EXPECT_TRUE(all_close(set_of(got.out, t), want.out, tolerance_for(kOutEps, mag))) << "set " << t;
    }
}

TEST_P(value_sets, threads_are_bitwise_identical) {
    const sets_case c = GetParam();
    const inputs in = make_inputs(c, 5);
    const auto one_s = run_softmax_sets(in, c.causal);
    const auto one_t = run_taylor_sets(in, c.causal);
    for (int n : {2, 3}) {
        attnkit::thread_pool pool(n);
        const auto s = run_softmax_sets(in, c.causal, &pool);
        const auto t = run_taylor_sets(in, c.causal, &pool);
        EXPECT_EQ(0, std::memcmp(s.out.data(), one_s.out.data(), sizeof(float) * s.out.size())) << n << " threads";
        EXPECT_EQ(0, std::memcmp(t.out.data(), one_t.out.data(), sizeof(float) * t.out.size())) << n << " threads";
    }
}

INSTANTIATE_TEST_SUITE_P(sweep, value_sets, ::testing::ValuesIn(sweep()),
                         [](const auto& info) { return std::to_string(info.index) + "_" + name_of(info.param); });

// n_sets = 1 is the kernel itself: the engine with the softmax policy gives the public
// softmax_attention's bits (tile path: more rows than the row kernel takes).
TEST(value_sets_single, one_set_is_the_kernel) {
    for (bool causal : {false, true}) {
        const inputs in = make_inputs({1, 70, 650, 2, 1, 20, 9, causal, distribution::gaussian}, 3);
        const auto got = run_softmax_sets(in, causal);
        auto want = outputs_for<float>(in.q, in.v, kNaN);
        attnkit::softmax_options o;
        o.causal = causal;
        attnkit::softmax_attention(in.q, in.k, in.v, want.out, want.lse, o);
        EXPECT_EQ(0, std::memcmp(got.out.data(), want.out.data(), sizeof(float) * got.out.size()));
        EXPECT_EQ(0, std::memcmp(got.lse.data(), want.lse.data(), sizeof(float) * got.lse.size()));
    }
}

// A NaN in one key's value of set 1 reaches set 1's rows that see that key, and nothing else.
TEST(value_sets_single, sets_are_isolated) {
    const sets_case c{3, 40, 200, 2, 1, 16, 10, true, distribution::uniform};
    inputs in = make_inputs(c, 9);
    const auto clean_s = run_softmax_sets(in, true);
    const auto clean_t = run_taylor_sets(in, true);
    const index_t bad_key = 150, offset = c.Lk - c.Lq;
    in.v(1, bad_key, 0, 3) = kNaN;
    const auto got_s = run_softmax_sets(in, true);
    const auto got_t = run_taylor_sets(in, true);
    for (int pol = 0; pol < 2; ++pol) {
        const tensor4<float>& got = pol == 0 ? got_s.out : got_t.out;
        const tensor4<float>& clean = pol == 0 ? clean_s.out : clean_t.out;
        for (index_t t = 0; t < c.n_sets; ++t)
            for (index_t i = 0; i < c.Lq; ++i)
                for (index_t h = 0; h < c.H; ++h)
                    for (index_t d = 0; d < c.Dv; ++d) {
                        const bool sees = t == 1 && i + offset >= bad_key;
                        const float g = got(t, i, h, d), w = clean(t, i, h, d);
                        if (sees && d == 3)
                            EXPECT_TRUE(std::isnan(g)) << "policy " << pol << " set " << t << " row " << i;
                        else
                            EXPECT_EQ(0, std::memcmp(&g, &w, sizeof(float)))
                                << "policy " << pol << " set " << t << " row " << i << " col " << d;
                    }
    }
}

}  // namespace
