// Sequence parallelism with attnkit::distributed: a causal self-attention layer whose sequence is
// split over MPI ranks (ring attention), forward and backward, and a decode step against a KV
// cache sharded over the same ranks. Every rank builds the same global tensors from one seed
// and keeps only its rows, so that rank 0 can check the result against one process.
//
//   mpirun -np 2 ./ring_attention                       # this machine
//   mpirun -np 16 --hostfile hosts ./ring_attention     # a cluster: one line per host in hosts,
//                                                       # "node01 slots=8" (docs/distributed.md)
//
// Build: link attnkit::distributed (find_package(attnkit) provides it where MPI was found).
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <attnkit/attnkit.hpp>
#include <attnkit/distributed.hpp>

using attnkit::index_t;
namespace dist = attnkit::distributed;
using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;

// The rows `pieces` of a [B, L, H, D] tensor, in order.
tensor4 take_rows(const tensor4& x, const std::vector<dist::row_range>& pieces) {
    index_t n = 0;
    for (const auto& p : pieces) n += p.size();
    tensor4 out(x.dimension(0), n, x.dimension(2), x.dimension(3));
    for (index_t b = 0; b < x.dimension(0); ++b) {
        index_t at = 0;
        for (const auto& p : pieces)
            for (index_t l = p.begin; l < p.end; ++l, ++at)
                for (index_t h = 0; h < x.dimension(2); ++h)
                    for (index_t d = 0; d < x.dimension(3); ++d) out(b, at, h, d) = x(b, l, h, d);
    }
    return out;
}

tensor4 random_tensor(index_t B, index_t L, index_t H, index_t D, unsigned seed) {
    tensor4 t(B, L, H, D);
    std::mt19937 g(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (index_t i = 0; i < t.size(); ++i) t.data()[i] = n(g);
    return t;
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);

    // A GQA layer: 8 query heads over 2 key/value heads, a sequence of 1000 tokens.
    const index_t B = 1, L = 1000, H = 8, Hk = 2, D = 64;
    const tensor4 q_all = random_tensor(B, L, H, D, 1), k_all = random_tensor(B, L, Hk, D, 2),
                  v_all = random_tensor(B, L, Hk, D, 3), d_out_all = random_tensor(B, L, H, D, 4);

    // 1. Forward: this rank's rows of q, k, v in, its rows of out and lse out.
    dist::ring_options ro;
    ro.attention.causal = true;
    ro.attention.window_left = 511;  // masks mean what they mean in the whole sequence
    const auto mine = dist::rank_rows(ro.layout, L, ranks, rank);  // zigzag: two pieces
    const tensor4 q = take_rows(q_all, mine), k = take_rows(k_all, mine), v = take_rows(v_all, mine);
    const index_t n = q.dimension(1);
    tensor4 out(B, n, H, D);
    tensor3 lse(B, n, H);
    dist::ring_stats stats;
    ro.stats = &stats;
    dist::ring_attention(q, k, v, out, lse, ro, MPI_COMM_WORLD);

    // 2. Backward: gradients of this rank's rows.
    const tensor4 d_out = take_rows(d_out_all, mine);
    tensor4 d_q(B, n, H, D), d_k(B, n, Hk, D), d_v(B, n, Hk, D);
    dist::ring_attention_backward(q, k, v, out, lse, d_out, d_q, d_k, d_v, ro, MPI_COMM_WORLD);

    // 3. Decode: the next token's query, the same on every rank, against a cache sharded by position.
    const tensor4 q_next = random_tensor(B, 1, H, D, 5);
    const auto shard = dist::shard_rows(L, ranks, rank);
    tensor4 next_out(B, 1, H, D);
    attnkit::softmax_options decode_opts;
    decode_opts.window_left = 511;
    dist::sharded_decode(q_next, take_rows(k_all, {shard}), take_rows(v_all, {shard}), next_out, decode_opts,
                         MPI_COMM_WORLD);

    // The same on one process, on the global tensors: how far are this rank's rows from it?
    tensor4 out_ref(B, L, H, D), dq_ref(B, L, H, D), dk_ref(B, L, Hk, D), dv_ref(B, L, Hk, D), next_ref(B, 1, H, D);
    tensor3 lse_ref(B, L, H);
    attnkit::softmax_attention(q_all, k_all, v_all, out_ref, lse_ref, ro.attention);
    attnkit::softmax_attention_backward(q_all, k_all, v_all, out_ref, lse_ref, d_out_all, dq_ref, dk_ref, dv_ref,
                                        ro.attention);
    attnkit::softmax_attention(q_next, k_all, v_all, next_ref, decode_opts);
    auto max_diff = [](const tensor4& a, const tensor4& b) {
        float m = 0.0f;
        for (index_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a.data()[i] - b.data()[i]));
        return m;
    };
    float diff[5] = {max_diff(out, take_rows(out_ref, mine)), max_diff(d_q, take_rows(dq_ref, mine)),
                     max_diff(d_k, take_rows(dk_ref, mine)), max_diff(d_v, take_rows(dv_ref, mine)),
                     max_diff(next_out, next_ref)};
    float worst[5];
    MPI_Reduce(diff, worst, 5, MPI_FLOAT, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        std::printf("ring attention over %d rank(s), L = %lld, zigzag layout (rank 0 holds rows [%lld, %lld) and "
                    "[%lld, %lld))\n",
                    ranks, static_cast<long long>(L), static_cast<long long>(mine[0].begin),
                    static_cast<long long>(mine[0].end), static_cast<long long>(mine[1].begin),
                    static_cast<long long>(mine[1].end));
        std::printf("largest difference from one process: out %.2e, d_q %.2e, d_k %.2e, d_v %.2e, decode %.2e\n",
                    worst[0], worst[1], worst[2], worst[3], worst[4]);
        std::printf("rank 0's forward: %.1f ms computing, %.2f ms waiting for K/V\n", 1e3 * stats.compute_seconds,
                    1e3 * stats.wait_seconds);
    }
    const bool ok = worst[0] < 1e-4f && worst[1] < 1e-3f && worst[2] < 1e-3f && worst[3] < 1e-3f && worst[4] < 1e-4f;
    int all_ok = rank == 0 ? (ok ? 1 : 0) : 1;
    MPI_Bcast(&all_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return all_ok ? 0 : 1;
}
