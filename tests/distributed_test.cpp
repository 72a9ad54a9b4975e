// attnkit/distributed.hpp against the single-process kernels on the same global tensors. Run
// under mpirun with 1..4 ranks (tests/CMakeLists.txt); every rank builds the same global
// tensors from one seed, takes its rows, and checks its part of the result.
#include <mpi.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attnkit/distributed.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/softmax_attention_backward.hpp"
#include "attnkit/thread_pool.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::distributed::row_range;
using attnkit::distributed::sequence_layout;
using namespace attnkit_test;

int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}
int world_size() {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

// The rows of `pieces` of a [B, L, ...] tensor, in order, as a dense tensor.
template <class T, int N>
Eigen::Tensor<T, N, Eigen::RowMajor> take_rows(const Eigen::Tensor<T, N, Eigen::RowMajor>& x,
                                               const std::vector<row_range>& pieces) {
    index_t n = 0;
    for (const row_range& p : pieces) n += p.size();
    std::array<Eigen::Index, N> dims;
    for (int i = 0; i < N; ++i) dims[i] = x.dimension(i);
    dims[1] = n;
    Eigen::Tensor<T, N, Eigen::RowMajor> out(dims);
    const index_t inner = x.size() / (x.dimension(0) * x.dimension(1));
    for (index_t b = 0; b < x.dimension(0); ++b) {
        index_t at = 0;
        for (const row_range& p : pieces)
            for (index_t l = p.begin; l < p.end; ++l, ++at)
                std::memcpy(out.data() + (b * n + at) * inner, x.data() + (b * x.dimension(1) + l) * inner,
                            sizeof(T) * static_cast<std::size_t>(inner));
    }
    return out;
}

// Bit-for-bit equality (a rank may hold no rows: empty tensors are equal).
template <class X>
bool same_bits(const X& a, const X& b) {
    return a.size() == b.size() &&
           (a.size() == 0 || std::memcmp(a.data(), b.data(), sizeof(*a.data()) * static_cast<std::size_t>(a.size())) == 0);
}

struct ring_case {
    std::string name;
    index_t B = 2, L = 37, H = 4, Hk = 2, D = 16, Dv = 8;
    attnkit::softmax_options opts;
};

std::vector<ring_case> ring_cases() {
    std::vector<ring_case> cs;
    auto add = [&](const std::string& name, auto&& set) {
        ring_case c;
        c.name = name;
        set(c);
        cs.push_back(c);
    };
    add("none", [](ring_case&) {});
    add("causal", [](ring_case& c) { c.opts.causal = true; });
    add("causal_mha", [](ring_case& c) {
        c.opts.causal = true;
        c.Hk = c.H;
    });
    add("causal_mqa", [](ring_case& c) {
        c.opts.causal = true;
        c.Hk = 1;
    });
    add("causal_window", [](ring_case& c) {
        c.opts.causal = true;
        c.opts.window_left = 6;
    });
    add("window_only", [](ring_case& c) { c.opts.window_left = 9; });
    add("chunk", [](ring_case& c) { c.opts.chunk = 7; });
    add("key_lengths", [](ring_case& c) {
        c.opts.causal = true;
        c.opts.key_lengths = {23, 0};
    });
    add("sinks_softcap", [](ring_case& c) {
        c.opts.causal = true;
        c.opts.sinks = {0.5f, -1.0f, 2.0f, -std::numeric_limits<float>::infinity()};
        c.opts.softcap = 5.0f;
        c.opts.scale = 0.4f;
    });
    add("short", [](ring_case& c) {  // L < 2P for P >= 3: empty zigzag chunks
        c.opts.causal = true;
        c.L = 5;
        c.D = 9;
        c.Dv = 17;
    });
    return cs;
}

template <class T>
struct global_inputs {
    tensor4<T> q, k, v;
    tensor4<float> d_out;
};

template <class T>
global_inputs<T> make_inputs(const ring_case& c, std::uint64_t seed) {
    global_inputs<T> g{make_bshd<T>(c.B, c.L, c.H, c.D), make_bshd<T>(c.B, c.L, c.Hk, c.D),
                       make_bshd<T>(c.B, c.L, c.Hk, c.Dv), make_bshd(c.B, c.L, c.H, c.Dv)};
    fill_random(g.q, distribution::gaussian, seed);
    fill_random(g.k, distribution::gaussian, seed + 1);
    fill_random(g.v, distribution::gaussian, seed + 2);
    fill_random(g.d_out, distribution::gaussian, seed + 3);
    return g;
}

// Differences of rounding only: merges in another order, exp of other block maxima.
constexpr double kTol = 64 * kEpsFloat;

template <class T>
void check_forward(const ring_case& c, sequence_layout layout) {
    SCOPED_TRACE(c.name + (layout == sequence_layout::zigzag ? " zigzag" : " contiguous"));
    const global_inputs<T> g = make_inputs<T>(c, 17);
    tensor4<float> out_ref = make_bshd(c.B, c.L, c.H, c.Dv);
    tensor3<float> lse_ref = make_lse(c.B, c.L, c.H);
    attnkit::softmax_attention(g.q, g.k, g.v, out_ref, lse_ref, c.opts);

    const auto pieces = attnkit::distributed::rank_rows(layout, c.L, world_size(), world_rank());
    const tensor4<T> q = take_rows(g.q, pieces), k = take_rows(g.k, pieces), v = take_rows(g.v, pieces);
    tensor4<float> out = make_bshd(c.B, q.dimension(1), c.H, c.Dv, 7.0f);
    tensor3<float> lse = make_lse(c.B, q.dimension(1), c.H, 7.0f);
    attnkit::distributed::ring_options ro;
    ro.attention = c.opts;
    ro.layout = layout;
    attnkit::distributed::ring_attention(q, k, v, out, lse, ro, MPI_COMM_WORLD);

    const double mag = attention_magnitude(g.q, g.k, g.v, 1.0);
    EXPECT_TRUE(all_close(out, take_rows(out_ref, pieces), tolerance_for(64, mag)));
    EXPECT_TRUE(all_close(lse, take_rows(lse_ref, pieces), tolerance_for(64, 1.0 + mag), true));

    // Same bits on a second run, and with a thread pool.
    tensor4<float> out2 = make_bshd(c.B, q.dimension(1), c.H, c.Dv);
    tensor3<float> lse2 = make_lse(c.B, q.dimension(1), c.H);
    attnkit::thread_pool pool(2);
    ro.attention.pool = &pool;
    attnkit::distributed::ring_attention(q, k, v, out2, lse2, ro, MPI_COMM_WORLD);
    EXPECT_TRUE(same_bits(out, out2));
    EXPECT_TRUE(same_bits(lse, lse2));
}

TEST(RingAttention, MatchesSingleProcess) {
    for (const ring_case& c : ring_cases())
        for (sequence_layout layout : {sequence_layout::zigzag, sequence_layout::contiguous})
            check_forward<float>(c, layout);
}

TEST(RingAttention, SixteenBitStorage) {
    for (const ring_case& c : ring_cases()) {
        if (c.name != "causal" && c.name != "key_lengths") continue;
        check_forward<Eigen::bfloat16>(c, sequence_layout::zigzag);
        check_forward<Eigen::half>(c, sequence_layout::contiguous);
    }
}

template <class T>
void check_backward(const ring_case& c, sequence_layout layout) {
    SCOPED_TRACE(c.name + (layout == sequence_layout::zigzag ? " zigzag" : " contiguous"));
    const global_inputs<T> g = make_inputs<T>(c, 29);
    tensor4<float> out_ref = make_bshd(c.B, c.L, c.H, c.Dv);
    tensor3<float> lse_ref = make_lse(c.B, c.L, c.H);
    attnkit::softmax_attention(g.q, g.k, g.v, out_ref, lse_ref, c.opts);
    tensor4<float> dq_ref = make_bshd(c.B, c.L, c.H, c.D), dk_ref = make_bshd(c.B, c.L, c.Hk, c.D),
                   dv_ref = make_bshd(c.B, c.L, c.Hk, c.Dv);
    attnkit::softmax_attention_backward(g.q, g.k, g.v, out_ref, lse_ref, g.d_out, dq_ref, dk_ref, dv_ref, c.opts);

    const auto pieces = attnkit::distributed::rank_rows(layout, c.L, world_size(), world_rank());
    const tensor4<T> q = take_rows(g.q, pieces), k = take_rows(g.k, pieces), v = take_rows(g.v, pieces);
    const tensor4<float> out = take_rows(out_ref, pieces), d_out = take_rows(g.d_out, pieces);
    const tensor3<float> lse = take_rows(lse_ref, pieces);
    const index_t n = q.dimension(1);
    tensor4<float> dq = make_bshd(c.B, n, c.H, c.D, 7.0f), dk = make_bshd(c.B, n, c.Hk, c.D, 7.0f),
                   dv = make_bshd(c.B, n, c.Hk, c.Dv, 7.0f);
    attnkit::distributed::ring_options ro;
    ro.attention = c.opts;
    ro.layout = layout;
    attnkit::distributed::ring_attention_backward(q, k, v, out, lse, d_out, dq, dk, dv, ro, MPI_COMM_WORLD);

    // Gradients are sums over many rows: tolerances scale with the largest of each.
    EXPECT_TRUE(all_close(dq, take_rows(dq_ref, pieces), tolerance_for(256, 1.0 + max_abs(dq_ref))));
    EXPECT_TRUE(all_close(dk, take_rows(dk_ref, pieces), tolerance_for(256, 1.0 + max_abs(dk_ref))));
    EXPECT_TRUE(all_close(dv, take_rows(dv_ref, pieces), tolerance_for(256, 1.0 + max_abs(dv_ref))));

    tensor4<float> dq2 = make_bshd(c.B, n, c.H, c.D), dk2 = make_bshd(c.B, n, c.Hk, c.D),
                   dv2 = make_bshd(c.B, n, c.Hk, c.Dv);
    attnkit::thread_pool pool(2);
    ro.attention.pool = &pool;
    attnkit::distributed::ring_attention_backward(q, k, v, out, lse, d_out, dq2, dk2, dv2, ro, MPI_COMM_WORLD);
    EXPECT_TRUE(same_bits(dq, dq2));
    EXPECT_TRUE(same_bits(dk, dk2));
    EXPECT_TRUE(same_bits(dv, dv2));
}

TEST(RingAttentionBackward, MatchesSingleProcess) {
    for (const ring_case& c : ring_cases())
        for (sequence_layout layout : {sequence_layout::zigzag, sequence_layout::contiguous})
            check_backward<float>(c, layout);
}

TEST(RingAttentionBackward, SixteenBitStorage) {
    for (const ring_case& c : ring_cases()) {
        if (c.name != "causal" && c.name != "sinks_softcap") continue;
        check_backward<Eigen::bfloat16>(c, sequence_layout::zigzag);
        check_backward<Eigen::half>(c, sequence_layout::contiguous);
    }
}

TEST(ShardedDecode, MatchesTheWholeCache) {
    for (const ring_case& base : ring_cases()) {
        for (index_t lq : {1, 3}) {
            ring_case c = base;
            if (c.opts.chunk > 0) continue;  // chunked attention is a prefill mask
            SCOPED_TRACE(c.name + " Lq " + std::to_string(lq));
            const global_inputs<float> g = make_inputs<float>(c, 41);
            const tensor4<float> q = sequence_rows(g.q, c.L - lq, lq);
            tensor4<float> out_ref = make_bshd(c.B, lq, c.H, c.Dv);
            tensor3<float> lse_ref = make_lse(c.B, lq, c.H);
            attnkit::softmax_attention(q, g.k, g.v, out_ref, lse_ref, c.opts);

            const row_range mine = attnkit::distributed::shard_rows(c.L, world_size(), world_rank());
            const tensor4<float> k = take_rows(g.k, {mine}), v = take_rows(g.v, {mine});
            tensor4<float> out = make_bshd(c.B, lq, c.H, c.Dv, 7.0f);
            tensor3<float> lse = make_lse(c.B, lq, c.H, 7.0f);
            attnkit::distributed::sharded_decode(q, k, v, out, lse, c.opts, MPI_COMM_WORLD);
            const double mag = attention_magnitude(q, g.k, g.v, 1.0);
            EXPECT_TRUE(all_close(out, out_ref, tolerance_for(64, mag)));
            EXPECT_TRUE(all_close(lse, lse_ref, tolerance_for(64, 1.0 + mag), true));
            tensor4<float> out2 = make_bshd(c.B, lq, c.H, c.Dv);
            attnkit::distributed::sharded_decode(q, k, v, out2, c.opts, MPI_COMM_WORLD);
            EXPECT_TRUE(same_bits(out, out2));
        }
    }
}

// Bad input on one rank: every rank throws the same error, nothing hangs, nothing is written.
TEST(RingAttention, BadInputOnOneRankFailsEveryRank) {
    const int P = world_size(), me = world_rank(), bad = P - 1;
    ring_case c;
    const global_inputs<float> g = make_inputs<float>(c, 5);
    const auto pieces = attnkit::distributed::rank_rows(sequence_layout::zigzag, c.L, P, me);
    const tensor4<float> q = take_rows(g.q, pieces), k = take_rows(g.k, pieces), v = take_rows(g.v, pieces);
    const index_t n = q.dimension(1);
    tensor4<float> out = make_bshd(c.B, n, c.H, me == bad ? c.Dv + 1 : c.Dv, 7.0f);
    tensor3<float> lse = make_lse(c.B, n, c.H, 7.0f);
    attnkit::distributed::ring_options ro;
    expect_invalid([&] { attnkit::distributed::ring_attention(q, k, v, out, lse, ro, MPI_COMM_WORLD); },
                   {"ring_attention: rank " + std::to_string(bad), "out"});
    EXPECT_TRUE(all_equal_to(out, 7.0f));
    EXPECT_TRUE(all_equal_to(lse, 7.0f));

    // Options that differ between ranks.
    tensor4<float> out_ok = make_bshd(c.B, n, c.H, c.Dv, 7.0f);
    ro.attention.causal = me == bad;
    if (P > 1)
        expect_invalid([&] { attnkit::distributed::ring_attention(q, k, v, out_ok, lse, ro, MPI_COMM_WORLD); },
                       "options");
    // A rank holding other rows than the layout gives it (the contiguous layout's, here).
    ro.attention.causal = false;
    ro.layout = sequence_layout::contiguous;
    if (P > 1 && c.L % P != 0)
        expect_invalid([&] { attnkit::distributed::ring_attention(q, k, v, out_ok, lse, ro, MPI_COMM_WORLD); },
                       "the layout");
    EXPECT_TRUE(all_equal_to(out_ok, 7.0f));

    // sharded_decode: shards that do not follow shard_rows (one key per rank, none on the last:
    // shard_rows puts the empty shard first).
    if (P > 1) {
        const tensor4<float> q1 = sequence_rows(g.q, c.L - 1, 1);
        const row_range held{0, me == bad ? 0 : 1};
        const tensor4<float> ks = take_rows(g.k, {held}), vs = take_rows(g.v, {held});
        tensor4<float> o1 = make_bshd(c.B, 1, c.H, c.Dv, 7.0f);
        expect_invalid([&] { attnkit::distributed::sharded_decode(q1, ks, vs, o1, c.opts, MPI_COMM_WORLD); },
                       {"sharded_decode: rank 0", "the shards"});
        EXPECT_TRUE(all_equal_to(o1, 7.0f));
    }
}

struct failure_printer : ::testing::EmptyTestEventListener {
    void OnTestPartResult(const ::testing::TestPartResult& r) override {
        if (r.failed())
            std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", world_rank(), r.file_name() ? r.file_name() : "?",
                         r.line_number(), r.summary());
    }
};

}  // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    ::testing::InitGoogleTest(&argc, argv);
    if (world_rank() != 0) {  // rank 0 reports; the others print only their failures
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new failure_printer);
    }
    const int rc = RUN_ALL_TESTS();
    int worst = 0;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return worst;
}
