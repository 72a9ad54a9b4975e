// attnkit::self_gating_attention and self_gating_state against the oracle
// (attnkit::reference::self_gating_attention) and against a plain double prefix scan written
// here (for lengths where the oracle's L x L matrix is too slow).
//
// Tolerances (docs/design.md "Quality bar"; compare.hpp): tolerance_for(kOutEps, max|v| * (1 + S)),
// S = scale * max|q_j| * max|k_j| bounding |g_j| (Cauchy-Schwarz). A float gate carries an
// absolute error of a few eps * S, which becomes a relative error of its weight, so the bound
// grows with the gates (~1e3 with inputs scaled by 8 and 16) as it must. kOutEps = 16.
#include "attnkit/self_gating_attention.hpp"

#include "attnkit/reference/self_gating_attention.hpp"
#include "attnkit/thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::self_gating_options;
using namespace attnkit_test;

constexpr double kOutEps = 16;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr index_t W = attnkit::simd::kLanes<attnkit::simd::default_arch>;

tensor4<float> scaled(tensor4<float> t, float f) {
    for (index_t i = 0; i < t.size(); ++i) t.data()[i] *= f;
    return t;
}

template <class Q, class K, class V>
tolerance out_tol(const Q& q, const K& k, const V& v, const self_gating_options& o, double eps = kOutEps) {
    const double scale = attnkit::detail::resolve_scale(o.scale, as_view(q).dims[3]);
    return tolerance_for(eps, max_abs(v) * (1.0 + scale * max_row_norm(q) * max_row_norm(k)));
}

// lse = M + log z, M the largest gate a row sees (|M| <= S) and 1 <= z <= L: the gates'
// rounding (eps S each), log's and the sum's (eps log L).
template <class Q, class K>
tolerance lse_tol(const Q& q, const K& k, const self_gating_options& o) {
    const auto qv = as_view(q);
    const double scale = attnkit::detail::resolve_scale(o.scale, qv.dims[3]);
    return tolerance_for(kOutEps, 1.0 + scale * max_row_norm(q) * max_row_norm(k) + std::log(double(qv.dims[1]) + 1.0));
}

template <class Q, class K, class V>
tensor4<float> run_fast(const Q& q, const K& k, const V& v, const self_gating_options& o) {
    const auto qv = as_view(q), vv = as_view(v);
    tensor4<float> out = make_bshd<float>(qv.dims[0], qv.dims[1], qv.dims[2], vv.dims[3], kNaN);
    attnkit::self_gating_attention(q, k, v, out, o);
    return out;
}

template <class Q, class K, class V>
tensor4<double> run_reference(const Q& q, const K& k, const V& v, const self_gating_options& o) {
    const auto qv = as_view(q), vv = as_view(v);
    tensor4<double> out = make_bshd<double>(qv.dims[0], qv.dims[1], qv.dims[2], vv.dims[3]);
    attnkit::reference::self_gating_attention(q, k, v, out, o);
    return out;
}

// Double oracle for lengths where the L x L matrix is too slow: gates, the exact maximum of
// each row's visible gates, weighted sums. Independent of the kernel: no running rescale. Rows
// visible counts n only grow, so the sums of a row extend the previous row's while the row's
// maximum stays the same, and are recomputed from scratch under the new maximum when it grows
// (a few times on random data: O(L (D + Dv)) in practice, O(L^2 Dv) for monotone gates).
tensor4<double> prefix_oracle(const tensor4<float>& q, const tensor4<float>& k, const tensor4<float>& v,
                              const self_gating_options& o) {
    const index_t B = q.dimension(0), L = q.dimension(1), H = q.dimension(2), D = q.dimension(3);
    const index_t Hk = k.dimension(2), Dv = v.dimension(3), G = H / Hk;
    const double scale = attnkit::detail::resolve_scale(o.scale, D);
    tensor4<double> out = make_bshd<double>(B, L, H, Dv);
    for (index_t b = 0; b < B; ++b) {
        const index_t len = o.key_lengths.empty() ? L : o.key_lengths[b];
        for (index_t h = 0; h < H; ++h) {
            std::vector<double> g(L), prefmax(L);
            for (index_t j = 0; j < L; ++j) {
                double s = 0;
                for (index_t d = 0; d < D; ++d) s += double(q(b, j, h, d)) * double(k(b, j, h / G, d));
                g[j] = scale * s;
            }
            // prefmax[n - 1]: the max of the first n visible gates, the max of a row seeing n keys.
            double m = -HUGE_VAL;
            for (index_t j = 0; j < L; ++j) prefmax[j] = m = std::max(m, j < len ? g[j] : -HUGE_VAL);
            std::vector<double> acc(Dv, 0.0);
            double z = 0, mx = -HUGE_VAL;
            index_t summed = 0;  // acc and z hold keys [0, summed) weighted by exp(g - mx)
            for (index_t i = 0; i < L; ++i) {
                const index_t n = std::min(len, o.causal ? i + 1 : L);
                if (n == 0) continue;
                if (prefmax[n - 1] != mx) {  // a new maximum: start the sums again under it
                    mx = prefmax[n - 1];
                    std::fill(acc.begin(), acc.end(), 0.0);
                    z = 0;
                    summed = 0;
                }
                for (index_t j = summed; j < n; ++j) {
                    const double w = std::exp(g[j] - mx);
                    z += w;
                    for (index_t d = 0; d < Dv; ++d) acc[d] += w * v(b, j, h / G, d);
                }
                summed = n;
                for (index_t d = 0; d < Dv; ++d) out(b, i, h, d) = acc[d] / z;
            }
        }
    }
    return out;
}

::testing::AssertionResult bitwise_equal(const tensor4<float>& a, const tensor4<float>& b) {
    if (a.size() != b.size()) return ::testing::AssertionFailure() << "size mismatch";
    for (index_t i = 0; i < a.size(); ++i)
        if (std::memcmp(a.data() + i, b.data() + i, sizeof(float)) != 0)
            return ::testing::AssertionFailure() << "element " << i << ": " << a.data()[i] << " vs " << b.data()[i];
    return ::testing::AssertionSuccess();
}

// ---- the parameterised sweep ----------------------------------------------------------------

struct sg_case {
    std::string sweep;
    index_t B = 2, L = 17, H = 4, Hk = 2, D = 16, Dv = 16;
    distribution dist = distribution::gaussian;
    bool causal = false;
    float gain = 1.0f;  // inputs times gain: gates ~ gain^2 sqrt(D)
    std::vector<std::int64_t> key_lengths;
    std::uint64_t seed = 1;

    std::string describe() const {
        std::ostringstream s;
        s << sweep << "_B" << B << "_L" << L << "_H" << H << "_Hk" << Hk << "_D" << D << "_Dv" << Dv << "_"
          << name(dist) << (causal ? "_causal" : "") << "_x" << gain;
        for (auto l : key_lengths) s << "_kl" << l;
        return s.str();
    }
};

void PrintTo(const sg_case& c, std::ostream* os) { *os << c.describe(); }

sg_case make_case(const char* sweep, index_t B, index_t L, index_t H, index_t Hk, index_t D, index_t Dv, bool causal,
                  float gain = 1.0f) {
    sg_case c;
    c.sweep = sweep;
    c.B = B, c.L = L, c.H = H, c.Hk = Hk, c.D = D, c.Dv = Dv, c.causal = causal, c.gain = gain;
    return c;
}

std::vector<sg_case> build_cases() {
    std::vector<sg_case> cases;
    auto add = [&](sg_case c) {
        c.dist = kAllDistributions[cases.size() % 3];
        c.seed = 500 + cases.size();
        cases.push_back(c);
    };
    const index_t sizes[] = {1, W - 1, W, W + 1, 3 * W + 2, 13, 31};
    for (index_t L : {index_t(1), W - 1, W, W + 1, 3 * W + 2, index_t(17), index_t(97), index_t(331)})
        for (bool causal : {false, true}) add(make_case("length", 2, L, 4, 2, 24, 24, causal));
    for (index_t D : sizes)
        for (index_t Dv : {index_t(1), W + 1, index_t(13), 3 * W + 2}) add(make_case("dims", 1, 41, 2, 1, D, Dv, (D + Dv) % 2 == 0));
    for (index_t Hk : {1, 2, 3, 6})
        for (bool causal : {false, true}) add(make_case("gqa", 2, 53, 6, Hk, 16, 16, causal));
    for (float gain : {8.0f, 16.0f})
        for (bool causal : {false, true})
            for (index_t L : {index_t(37), index_t(200)}) add(make_case("gates_1e3", 1, L, 2, 2, 32, 32, causal, gain));
    for (bool causal : {false, true}) {
        sg_case c = make_case("key_lengths", 4, 70, 2, 1, 16, 16, causal);
        c.key_lengths = {0, 70, 23, 1};
        add(c);
        c.L = 1;
        c.key_lengths = {0, 1, 1, 0};
        add(c);
    }
    return cases;
}

class SelfGatingSweep : public ::testing::TestWithParam<sg_case> {};

TEST_P(SelfGatingSweep, MatchesReference) {
    const sg_case& c = GetParam();
    for (distribution d : kAllDistributions) {
        const tensor4<float> q = scaled(random_bshd(c.B, c.L, c.H, c.D, d, c.seed), c.gain);
        const tensor4<float> k = scaled(random_bshd(c.B, c.L, c.Hk, c.D, d, c.seed + 1), c.gain);
        const tensor4<float> v = random_bshd(c.B, c.L, c.Hk, c.Dv, d, c.seed + 2);
        self_gating_options o;
        o.causal = c.causal;
        o.key_lengths = c.key_lengths;
        const tensor4<float> out = run_fast(q, k, v, o);
        EXPECT_TRUE(all_close(out, run_reference(q, k, v, o), out_tol(q, k, v, o))) << name(d);
        // The lse overload: the same output bits, and lse within the rounding of its gates.
        tensor4<float> out_l = make_bshd<float>(c.B, c.L, c.H, c.Dv, kNaN);
        tensor3<float> lse = make_lse<float>(c.B, c.L, c.H, kNaN);
        attnkit::self_gating_attention(q, k, v, out_l, lse, o);
        EXPECT_TRUE(bitwise_equal(out_l, out)) << name(d) << ": output with lse";
        tensor4<double> out_d = make_bshd<double>(c.B, c.L, c.H, c.Dv);
        tensor3<double> lse_d = make_lse<double>(c.B, c.L, c.H);
        attnkit::reference::self_gating_attention(q, k, v, out_d, lse_d, o);
        EXPECT_TRUE(all_close(lse, lse_d, lse_tol(q, k, o))) << name(d) << ": lse";
    }
}

INSTANTIATE_TEST_SUITE_P(Sweep, SelfGatingSweep, ::testing::ValuesIn(build_cases()),
                         [](const ::testing::TestParamInfo<sg_case>& i) {
                             return std::to_string(i.index) + "_" + i.param.describe();
                         });

// ---- semantics --------------------------------------------------------------------------------

TEST(SelfGating, NonCausalRowsAreOneMean) {
    const tensor4<float> q = random_bshd(1, 29, 3, 8, distribution::gaussian, 1);
    const tensor4<float> k = random_bshd(1, 29, 3, 8, distribution::gaussian, 2);
    const tensor4<float> v = random_bshd(1, 29, 3, 5, distribution::gaussian, 3);
    const tensor4<float> out = run_fast(q, k, v, {});
    for (index_t i = 1; i < 29; ++i)
        for (index_t h = 0; h < 3; ++h)
            for (index_t d = 0; d < 5; ++d) EXPECT_EQ(out(0, i, h, d), out(0, 0, h, d));
}

// Monotone gates of +-1e3 per step: each token a new maximum (rescale every step), or each
// below the first (exp(-1e3 j) underflows to 0 for all but the first token).
TEST(SelfGating, ExtremeMonotoneGates) {
    const index_t L = 50, D = 4;
    for (float sign : {1.0f, -1.0f}) {
        tensor4<float> q = make_bshd<float>(1, L, 1, D), k = make_bshd<float>(1, L, 1, D, 1.0f);
        const tensor4<float> v = random_bshd(1, L, 1, 3, distribution::uniform, 9);
        for (index_t j = 0; j < L; ++j) q(0, j, 0, 0) = sign * 1000.0f * static_cast<float>(j + 1);
        self_gating_options o;
        o.causal = true;
        o.scale = 1.0f;
        const tensor4<float> out = run_fast(q, k, v, o);
        for (index_t i = 0; i < L; ++i)
            for (index_t d = 0; d < 3; ++d) EXPECT_FLOAT_EQ(out(0, i, 0, d), v(0, sign > 0 ? i : 0, 0, d)) << i;
    }
}

TEST(SelfGating, NaNStaysInItsRowsAndHead) {
    tensor4<float> q = random_bshd(1, 300, 2, 8, distribution::gaussian, 4);
    const tensor4<float> k = random_bshd(1, 300, 2, 8, distribution::gaussian, 5);
    tensor4<float> v = random_bshd(1, 300, 2, 8, distribution::gaussian, 6);
    v(0, 150, 1, 3) = kNaN;
    self_gating_options o;
    o.causal = true;
    const tensor4<float> out = run_fast(q, k, v, o);
    for (index_t i = 0; i < 300; ++i)
        for (index_t d = 0; d < 8; ++d) {
            EXPECT_TRUE(std::isfinite(out(0, i, 0, d)));
            EXPECT_EQ(std::isnan(out(0, i, 1, d)), i >= 150 && d == 3) << i;  // one value element
        }
}

// Other layouts ([B, H, L, D] buffers) go through strided views, without copies.
TEST(SelfGating, StridedViews) {
    const index_t B = 2, L = 45, H = 4, D = 12;
    std::vector<float> qb(B * H * L * D), kb(qb.size()), vb(qb.size()), ob(qb.size(), kNaN);
    fill_random(qb.data(), qb.size(), distribution::gaussian, 7);
    fill_random(kb.data(), kb.size(), distribution::gaussian, 8);
    fill_random(vb.data(), vb.size(), distribution::gaussian, 9);
    const auto q = bhld_as_bshd<const float>(qb.data(), B, H, L, D), k = bhld_as_bshd<const float>(kb.data(), B, H, L, D),
               v = bhld_as_bshd<const float>(vb.data(), B, H, L, D);
    self_gating_options o;
    o.causal = true;
    attnkit::self_gating_attention(q, k, v, bhld_as_bshd(ob.data(), B, H, L, D), o);
    EXPECT_TRUE(all_close(bhld_as_bshd<const float>(ob.data(), B, H, L, D), run_reference(q, k, v, o), out_tol(q, k, v, o)));
}

// Outputs above kStreamBytes take the non-temporal store path; a misaligned output view must
// fall back to plain stores. Checked against the O(L) oracle (the L x L one is too slow here).
TEST(SelfGating, LongSequenceStreamedAndMisaligned) {
    const index_t L = 2100, H = 4, D = 2 * W + 3, Dv = 128;
    const tensor4<float> q = random_bshd(1, L, H, D, distribution::outliers, 10);
    const tensor4<float> k = random_bshd(1, L, 2, D, distribution::outliers, 11);
    const tensor4<float> v = random_bshd(1, L, 2, Dv, distribution::gaussian, 12);
    for (bool causal : {false, true}) {
        self_gating_options o;
        o.causal = causal;
        o.key_lengths = {1900};
        const tensor4<double> want = prefix_oracle(q, k, v, o);
        EXPECT_TRUE(all_close(run_fast(q, k, v, o), want, out_tol(q, k, v, o)));
        std::vector<float> buf(static_cast<std::size_t>(L * H * Dv + 1), kNaN);
        attnkit::view<float, 4> mis(buf.data() + 1, {1, L, H, Dv});
        attnkit::self_gating_attention(q, k, v, mis, o);
        EXPECT_TRUE(all_close(mis, want, out_tol(q, k, v, o)));
    }
}

// ---- threads: bitwise identical for 1, 2, 3 threads, in both schedules ------------------------

TEST(SelfGatingThreads, BitwiseDeterministic) {
    attnkit::thread_pool p2(2), p3(3);
    struct shape { index_t B, L, H, Hk; };
    // Many heads, one key/value head (the threads share one chain of chunks), several items
    // with key_lengths (one item empty), and a single chunk.
    for (const shape s : {shape{1, 1000, 8, 8}, shape{1, 777, 4, 1}, shape{3, 301, 2, 2}, shape{1, 5, 1, 1}})
        for (bool causal : {false, true}) {
            const tensor4<float> q = scaled(random_bshd(s.B, s.L, s.H, 24, distribution::outliers, 20), 4.0f);
            const tensor4<float> k = scaled(random_bshd(s.B, s.L, s.Hk, 24, distribution::outliers, 21), 4.0f);
            const tensor4<float> v = random_bshd(s.B, s.L, s.Hk, 20, distribution::gaussian, 22);
            self_gating_options o;
            o.causal = causal;
            if (s.B == 3) o.key_lengths = {301, 0, 150};
            const tensor4<float> one = run_fast(q, k, v, o);
            o.pool = &p2;
            EXPECT_TRUE(bitwise_equal(run_fast(q, k, v, o), one)) << s.L << " 2 threads";
            o.pool = &p3;
            EXPECT_TRUE(bitwise_equal(run_fast(q, k, v, o), one)) << s.L << " 3 threads";
            o.pool = nullptr;
            EXPECT_TRUE(all_close(one, prefix_oracle(q, k, v, o), out_tol(q, k, v, o)));
            // lse: the same bits for any thread count (rows made during the scan, from the
            // buffer of a chunk that waited, and filled past key_lengths).
            tensor3<float> lse_one = make_lse<float>(s.B, s.L, s.H, kNaN);
            tensor4<float> out_l = make_bshd<float>(s.B, s.L, s.H, 20, kNaN);
            attnkit::self_gating_attention(q, k, v, out_l, lse_one, o);
            for (attnkit::thread_pool* pool : {&p2, &p3}) {
                o.pool = pool;
                tensor3<float> lse_n = make_lse<float>(s.B, s.L, s.H, kNaN);
                attnkit::self_gating_attention(q, k, v, out_l, lse_n, o);
                EXPECT_EQ(std::memcmp(lse_n.data(), lse_one.data(), sizeof(float) * std::size_t(lse_n.size())), 0)
                    << s.L << " lse, " << pool->size() << " threads";
            }
        }
}

// Two callers sharing one pool at once (and a call nested in a pool task): chunks wait only on
// chunks already claimed by running threads, so sharing never deadlocks, and the bits stay.
TEST(SelfGatingThreads, SharedPoolConcurrentAndNestedCalls) {
    attnkit::thread_pool pool(3);
    const tensor4<float> q = random_bshd(1, 900, 2, 16, distribution::gaussian, 60);
    const tensor4<float> k = random_bshd(1, 900, 1, 16, distribution::gaussian, 61);
    const tensor4<float> v = random_bshd(1, 900, 1, 16, distribution::gaussian, 62);
    self_gating_options o;
    o.causal = true;
    const tensor4<float> want = run_fast(q, k, v, o);
    o.pool = &pool;
    std::vector<tensor4<float>> outs(6);
    std::vector<std::thread> callers;
    for (int t = 0; t < 2; ++t)
        callers.emplace_back([&, t] {
            for (int r = 0; r < 3; ++r) outs[static_cast<std::size_t>(3 * t + r)] = run_fast(q, k, v, o);
        });
    for (auto& c : callers) c.join();
    for (const auto& out : outs) EXPECT_TRUE(bitwise_equal(out, want));
    std::vector<tensor4<float>> nested(4);
    pool.parallel_for(4, [&](std::int64_t i) { nested[static_cast<std::size_t>(i)] = run_fast(q, k, v, o); });
    for (const auto& out : nested) EXPECT_TRUE(bitwise_equal(out, want));
}

// ---- decode state --------------------------------------------------------------------------

TEST(SelfGatingState, UnevenStepsMatchTheCausalCall) {
    const index_t B = 2, L = 120, H = 4, Hk = 2, D = W + 1, Dv = 3 * W + 2;
    const tensor4<float> q = scaled(random_bshd(B, L, H, D, distribution::gaussian, 30), 8.0f);
    const tensor4<float> k = scaled(random_bshd(B, L, Hk, D, distribution::gaussian, 31), 8.0f);
    const tensor4<float> v = random_bshd(B, L, Hk, Dv, distribution::uniform, 32);
    attnkit::thread_pool pool(2);
    {
        self_gating_options o;  // no key_lengths: a state rejects them (RejectsKeyLengths)
        o.causal = true;
        const tensor4<double> want = run_reference(q, k, v, o);
        const tensor4<float> call = run_fast(q, k, v, o);
        for (attnkit::thread_pool* tp : {static_cast<attnkit::thread_pool*>(nullptr), &pool}) {
            o.pool = tp;
            attnkit::self_gating_state st(B, H, Hk, D, Dv, o);
            // Prefill in one step: the causal call's schedule, bit for bit.
            tensor4<float> out = make_bshd<float>(B, L, H, Dv, kNaN);
            st.step(q, k, v, out);
            EXPECT_EQ(st.length(), L);
            EXPECT_TRUE(bitwise_equal(out, call));
            st.reset();
            EXPECT_EQ(st.length(), 0);
            index_t at = 0;
            for (index_t T : {13, 1, 1, 7, 40, 1, 57}) {
                tensor4<float> o_t = make_bshd<float>(B, T, H, Dv, kNaN);
                st.step(sequence_rows(q, at, T), sequence_rows(k, at, T), sequence_rows(v, at, T), o_t);
                EXPECT_TRUE(all_close(o_t, sequence_rows(want, at, T), out_tol(q, k, v, o))) << "step at " << at;
                at += T;
            }
            EXPECT_EQ(at, L);
            EXPECT_EQ(st.length(), L);
        }
    }
}

TEST(SelfGatingState, BadStepThrowsAndChangesNothing) {
    const index_t B = 1, H = 2, Hk = 1, D = 8, Dv = 4;
    const tensor4<float> q = random_bshd(B, 20, H, D, distribution::gaussian, 40);
    const tensor4<float> k = random_bshd(B, 20, Hk, D, distribution::gaussian, 41);
    const tensor4<float> v = random_bshd(B, 20, Hk, Dv, distribution::gaussian, 42);
    attnkit::self_gating_state st(B, H, Hk, D, Dv), fresh(B, H, Hk, D, Dv);
    tensor4<float> out = make_bshd<float>(B, 10, H, Dv, 7.0f);
    st.step(sequence_rows(q, 0, 10), sequence_rows(k, 0, 10), sequence_rows(v, 0, 10), out);
    fresh.step(sequence_rows(q, 0, 10), sequence_rows(k, 0, 10), sequence_rows(v, 0, 10), out);
    tensor4<float> bad_out = make_bshd<float>(B, 1, H, Dv, 7.0f);
    EXPECT_THROW(
        st.step(sequence_rows(q, 10, 1), random_bshd(B, 1, 2, D, distribution::gaussian, 1),
                sequence_rows(v, 10, 1), bad_out),
        std::invalid_argument);
    EXPECT_THROW(st.step(random_bshd(B, 1, H, D + 1, distribution::gaussian, 1),
                         sequence_rows(k, 10, 1), sequence_rows(v, 10, 1), bad_out),
                 std::invalid_argument);
    EXPECT_THROW(
        st.step(sequence_rows(q, 10, 2), sequence_rows(k, 10, 1), sequence_rows(v, 10, 1), bad_out),
        std::invalid_argument);
    tensor4<float> wrong_out = make_bshd<float>(B, 1, H, Dv + 1, 7.0f);
    EXPECT_THROW(st.step(sequence_rows(q, 10, 1), sequence_rows(k, 10, 1), sequence_rows(v, 10, 1),
                         wrong_out),
                 std::invalid_argument);
    EXPECT_TRUE(all_equal_to(bad_out, 7.0f));
    EXPECT_TRUE(all_equal_to(wrong_out, 7.0f));
    EXPECT_EQ(st.length(), 10);
    tensor4<float> a = make_bshd<float>(B, 10, H, Dv), b = make_bshd<float>(B, 10, H, Dv);
    st.step(sequence_rows(q, 10, 10), sequence_rows(k, 10, 10), sequence_rows(v, 10, 10), a);
    fresh.step(sequence_rows(q, 10, 10), sequence_rows(k, 10, 10), sequence_rows(v, 10, 10), b);
    EXPECT_TRUE(bitwise_equal(a, b));
    EXPECT_THROW(attnkit::self_gating_state(1, 3, 2, 8, 8), std::invalid_argument);
    EXPECT_THROW(attnkit::self_gating_state(1, 2, 1, 0, 8), std::invalid_argument);
    self_gating_options kl;
    kl.key_lengths = {1, 2};
    EXPECT_THROW(attnkit::self_gating_state(1, 2, 1, 8, 8, kl), std::invalid_argument);
}

// ---- bad input ------------------------------------------------------------------------------

TEST(SelfGating, BadInputThrowsBeforeWriting) {
    const tensor4<float> q = random_bshd(2, 9, 4, 8, distribution::gaussian, 50);
    const tensor4<float> k = random_bshd(2, 9, 2, 8, distribution::gaussian, 51);
    const tensor4<float> v = random_bshd(2, 9, 2, 6, distribution::gaussian, 52);
    tensor4<float> out = make_bshd<float>(2, 9, 4, 6, 7.0f);
    auto expect_bad = [&](const auto& qq, const auto& kk, const auto& vv, auto&& oo, const self_gating_options& o,
                          const char* what) {
        try {
            attnkit::self_gating_attention(qq, kk, vv, oo, o);
            ADD_FAILURE() << "no throw: " << what;
        } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    const self_gating_options none;
    expect_bad(q, random_bshd(2, 10, 2, 8, distribution::gaussian, 1), random_bshd(2, 10, 2, 6, distribution::gaussian, 1),
               out, none, "Lq == Lk");
    expect_bad(q, random_bshd(2, 9, 3, 8, distribution::gaussian, 1), random_bshd(2, 9, 3, 6, distribution::gaussian, 1),
               out, none, "multiple");
    expect_bad(q, random_bshd(2, 9, 2, 7, distribution::gaussian, 1), v, out, none, "k:");
    expect_bad(q, k, random_bshd(2, 8, 2, 6, distribution::gaussian, 1), out, none, "v:");
    tensor4<float> small = make_bshd<float>(2, 9, 4, 5, 7.0f);
    expect_bad(q, k, v, small, none, "out:");
    self_gating_options o;
    o.key_lengths = {1};
    expect_bad(q, k, v, out, o, "key_lengths");
    o.key_lengths = {1, 10};
    expect_bad(q, k, v, out, o, "key_lengths[1]");
    o.key_lengths = {-1, 3};
    expect_bad(q, k, v, out, o, "key_lengths[0]");
    o = {};
    o.scale = kNaN;
    expect_bad(q, k, v, out, o, "opts.scale");
    o.scale = -1.0f;
    expect_bad(q, k, v, out, o, "opts.scale");
    std::vector<float> buf(static_cast<std::size_t>(2 * 9 * 4 * 12));
    attnkit::view<float, 4> strided_out(buf.data(), {2, 9, 4, 6}, {9 * 4 * 12, 4 * 12, 12, 2});
    expect_bad(q, k, v, strided_out, none, "contiguous");
    // lse of the wrong shape, or over out: nothing written to either.
    tensor3<float> lse_bad = make_lse<float>(2, 9, 3, 7.0f);
    try {
        attnkit::self_gating_attention(q, k, v, out, lse_bad, none);
        ADD_FAILURE() << "no throw: lse [2, 9, 3]";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("lse"), std::string::npos) << e.what();
    }
    try {
        attnkit::self_gating_attention(q, k, v, out, attnkit::view<float, 3>(out.data(), {2, 9, 4}), none);
        ADD_FAILURE() << "no throw: lse over out";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("lse"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(all_equal_to(out, 7.0f));
    EXPECT_TRUE(all_equal_to(small, 7.0f));
    EXPECT_TRUE(all_equal_to(lse_bad, 7.0f));
}

}  // namespace

// ---- memory: outputs over inputs (docs/design.md "Errors"; everything softmax rejects) -------------

namespace {

// out laid over k one position further on: row l of out would overwrite k row l + 1 before
// the scan reads it. Also out over v, and an out that addresses one row many times (stride 0).
// All must throw before anything is written; out = q (the same view) is allowed, in place.
TEST(SelfGating, OutputOverlappingAnInputThrowsBeforeWriting) {
    const index_t B = 1, L = 40, H = 2, D = 8;
    const tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 70);
    const tensor4<float> v = random_bshd(B, L, H, D, distribution::gaussian, 71);
    std::vector<float> kb(static_cast<std::size_t>((L + 1) * H * D));
    fill_random(kb.data(), kb.size(), distribution::gaussian, 72);
    const std::vector<float> kb0 = kb;
    const attnkit::view<const float, 4> k(kb.data(), {B, L, H, D});
    const attnkit::view<float, 4> out_over_k(kb.data() + H * D, {B, L, H, D});
    tensor4<float> vcopy = v;
    for (bool causal : {false, true}) {
        self_gating_options o;
        o.causal = causal;
        EXPECT_THROW(attnkit::self_gating_attention(q, k, v, out_over_k, o), std::invalid_argument);
        EXPECT_TRUE(kb == kb0);
        EXPECT_THROW(attnkit::self_gating_attention(q, k, vcopy, vcopy, o), std::invalid_argument);
        EXPECT_TRUE(bitwise_equal(vcopy, v));
        tensor4<float> one_row = make_bshd<float>(B, 1, H, D, 7.0f);
        const attnkit::view<float, 4> repeated(one_row.data(), {B, L, H, D}, {L * H * D, 0, D, 1});
        EXPECT_THROW(attnkit::self_gating_attention(q, k, v, repeated, o), std::invalid_argument);
        EXPECT_TRUE(all_equal_to(one_row, 7.0f));
        EXPECT_THROW(attnkit::reference::self_gating_attention(q, k, v, out_over_k, o), std::invalid_argument);
        EXPECT_TRUE(kb == kb0);
    }
}

// Option sets of the sweeps below: causal off and on, each run inline and on `pool`.
std::vector<self_gating_options> causal_inline_and_pooled(attnkit::thread_pool* pool) {
    std::vector<self_gating_options> r;
    for (bool causal : {false, true})
        for (attnkit::thread_pool* tp : {static_cast<attnkit::thread_pool*>(nullptr), pool}) {
            self_gating_options o;
            o.causal = causal;
            o.pool = tp;
            r.push_back(o);
        }
    return r;
}

TEST(SelfGating, OutEqualToQInPlaceMatches) {
    const index_t B = 2, L = 333, H = 4, Hk = 2, D = 2 * W + 1;
    const tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 73);
    const tensor4<float> k = random_bshd(B, L, Hk, D, distribution::gaussian, 74);
    const tensor4<float> v = random_bshd(B, L, Hk, D, distribution::gaussian, 75);
    attnkit::thread_pool pool(3);
    for (const self_gating_options& o : causal_inline_and_pooled(&pool)) {
        const bool causal = o.causal;
        const tensor4<float> want = run_fast(q, k, v, o);
        tensor4<float> x = q;
        attnkit::self_gating_attention(x, k, v, x, o);
        EXPECT_TRUE(bitwise_equal(x, want)) << causal;
        attnkit::self_gating_state st(B, H, Hk, D, D, o);
        tensor4<float> y = q;
        if (causal) {
            st.step(y, k, v, y);
            EXPECT_TRUE(bitwise_equal(y, want));
        }
    }
}

// Where out sits just above v modulo 4 KiB, rows are made in two loops instead of one (see
// update_head in detail/self_gating/head_ops.hpp, 4 KiB aliasing): the same operations in
// another order, so the bits must not depend on where out lies. The rows are large enough
// (L * H * Dv floats >= 4 MiB) to be streamed, the path the placement is about.
TEST(SelfGating, OutPlacementModulo4KiBKeepsTheBits) {
    const index_t L = 4096, H = 8, D = 64;
    const tensor4<float> q = random_bshd(1, L, H, D, distribution::gaussian, 79);
    const tensor4<float> k = random_bshd(1, L, H, D, distribution::gaussian, 80);
    const tensor4<float> v = random_bshd(1, L, H, D, distribution::gaussian, 81);
    self_gating_options o;
    o.causal = true;
    const tensor4<float> want = run_fast(q, k, v, o);
    std::vector<float> buf(static_cast<std::size_t>(L * H * D + 2048));
    const auto v_mod = reinterpret_cast<std::uintptr_t>(v.data()) & 4095u;
    for (std::uintptr_t gap : {0u, 32u, 64u, 160u, 256u, 4064u}) {
        // The first float of buf at or after offset 0 whose address is v + gap modulo 4 KiB.
        const auto b_mod = reinterpret_cast<std::uintptr_t>(buf.data()) & 4095u;
        const std::uintptr_t shift = (v_mod + gap - b_mod) & 4095u;
        ASSERT_EQ(shift % sizeof(float), 0u);
        float* at = buf.data() + shift / sizeof(float);
        Eigen::TensorMap<tensor4<float>> out(at, 1, L, H, D);
        attnkit::self_gating_attention(q, k, v, out, o);
        tensor4<float> got = out;
        EXPECT_TRUE(bitwise_equal(got, want)) << "out - v = " << gap << " mod 4096";
    }
}

TEST(SelfGatingState, StepWithOutputOverAnInputThrowsAndChangesNothing) {
    const index_t B = 1, T = 5, H = 2, D = 8;
    const tensor4<float> q = random_bshd(B, 2 * T, H, D, distribution::gaussian, 76);
    const tensor4<float> k = random_bshd(B, 2 * T, H, D, distribution::gaussian, 77);
    tensor4<float> v = random_bshd(B, 2 * T, H, D, distribution::gaussian, 78);
    attnkit::self_gating_state st(B, H, H, D, D), fresh(B, H, H, D, D);
    tensor4<float> o1 = make_bshd<float>(B, T, H, D), o2 = o1;
    st.step(sequence_rows(q, 0, T), sequence_rows(k, 0, T), sequence_rows(v, 0, T), o1);
    fresh.step(sequence_rows(q, 0, T), sequence_rows(k, 0, T), sequence_rows(v, 0, T), o2);
    tensor4<float> vt = sequence_rows(v, T, T);
    const tensor4<float> vt0 = vt;
    EXPECT_THROW(st.step(sequence_rows(q, T, T), sequence_rows(k, T, T), vt, vt), std::invalid_argument);
    EXPECT_TRUE(bitwise_equal(vt, vt0));
    EXPECT_EQ(st.length(), T);
    st.step(sequence_rows(q, T, T), sequence_rows(k, T, T), vt, o1);
    fresh.step(sequence_rows(q, T, T), sequence_rows(k, T, T), vt, o2);
    EXPECT_TRUE(bitwise_equal(o1, o2));
}

// A state holds exactly the tokens appended to it, and each new query sees all of them (the
// taylor_state contract, docs/design.md): key_lengths, an absolute-position cut, would silently mask
// every decode token of a right-padded item, so a state rejects them, as taylor_state does.
TEST(SelfGatingState, RejectsKeyLengths) {
    self_gating_options o;
    o.causal = true;
    o.key_lengths = {3, 4};
    try {
        attnkit::self_gating_state st(2, 2, 1, 8, 8, o);
        ADD_FAILURE() << "no throw";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("key_lengths"), std::string::npos) << e.what();
    }
}

}  // namespace

namespace {

// Sizes whose state (B * H * Dv floats) does not fit in int64 are argument errors, not an
// overflowed allocation size.
TEST(SelfGatingState, HugeSizesAreArgumentErrors) {
    const index_t big = std::numeric_limits<index_t>::max() / 4;
    EXPECT_THROW(attnkit::self_gating_state(big, 8, 8, 8, 8), std::invalid_argument);
    EXPECT_THROW(attnkit::self_gating_state(2, big, 1, 8, 8), std::invalid_argument);
    EXPECT_THROW(attnkit::self_gating_state(1, 2, 1, 8, big), std::invalid_argument);
}

}  // namespace

namespace {

// The O(L) oracle agrees with the materialising one (both double) to ~1e-12, gates ~1e3
// included, so the long-sequence tests check against the same semantics.
TEST(SelfGating, PrefixOracleMatchesTheMaterialisingOracle) {
    const tensor4<float> q = scaled(random_bshd(2, 97, 2, 8, distribution::outliers, 80), 8.0f);
    const tensor4<float> k = scaled(random_bshd(2, 97, 1, 8, distribution::outliers, 81), 8.0f);
    const tensor4<float> v = random_bshd(2, 97, 1, 5, distribution::gaussian, 82);
    for (bool causal : {false, true}) {
        self_gating_options o;
        o.causal = causal;
        o.key_lengths = {60, 0};
        const tensor4<double> a = prefix_oracle(q, k, v, o), b = run_reference(q, k, v, o);
        for (index_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a.data()[i], b.data()[i], 1e-12) << i << " " << causal;
    }
}

}  // namespace

namespace {

// A gate of -inf (an infinite key) weighs exp(-inf) = 0, as the oracle and softmax treat an
// -inf score: that token drops out of every row, other tokens and heads keep finite results,
// a row that sees only it outputs zeros. Also when it is the first token (the state is empty).
TEST(SelfGating, MinusInfGateWeighsZero) {
    const index_t L = 70, H = 2, D = 8, Dv = 5;
    tensor4<float> q = random_bshd(1, L, H, D, distribution::gaussian, 90);
    tensor4<float> k = random_bshd(1, L, H, D, distribution::gaussian, 91);
    const tensor4<float> v = random_bshd(1, L, H, Dv, distribution::gaussian, 92);
    for (index_t j : {index_t(0), index_t(33)}) {
        for (index_t d = 0; d < D; ++d) k(0, j, 0, d) = 0.0f;
        q(0, j, 0, 0) = 1.0f;
        k(0, j, 0, 0) = -std::numeric_limits<float>::infinity();
    }
    attnkit::thread_pool pool(3);
    for (const self_gating_options& o : causal_inline_and_pooled(&pool)) {
        const bool causal = o.causal;
        const tensor4<double> want = run_reference(q, k, v, o);
        const tensor4<float> got = run_fast(q, k, v, o);
        for (index_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(got.data()[i])) << i << " " << causal;
        EXPECT_TRUE(all_close(got, want, 1e-5, 1e-6)) << causal;
        if (causal) {
            attnkit::self_gating_state st(1, H, H, D, Dv, o);
            tensor4<float> a = make_bshd<float>(1, 1, H, Dv, kNaN), rest = make_bshd<float>(1, L - 1, H, Dv, kNaN);
            st.step(sequence_rows(q, 0, 1), sequence_rows(k, 0, 1), sequence_rows(v, 0, 1), a);
            st.step(sequence_rows(q, 1, L - 1), sequence_rows(k, 1, L - 1), sequence_rows(v, 1, L - 1), rest);
            EXPECT_TRUE(all_close(a, sequence_rows(want, 0, 1), 1e-5, 1e-6));
            EXPECT_TRUE(all_close(rest, sequence_rows(want, 1, L - 1), 1e-5, 1e-6));
        }
    }
}

}  // namespace
