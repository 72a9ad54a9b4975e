// The options of attnkit/distributed.hpp and which rows of a sequence each rank holds. No MPI
// here, so that code which only slices tensors for the ranks (data loaders, tests) or fills in
// options needs no MPI to build:
//
//   auto pieces = attnkit::distributed::rank_rows(sequence_layout::zigzag, L, ranks, rank);
//   // the rank's q, k, v are rows pieces[0], then pieces[1], of the global [B, L, H, D] tensors
//
// Every rank computes every other rank's rows from the global length alone, so nothing about
// the layout travels.
#pragma once

#include <vector>

#include "attnkit/config.hpp"
#include "attnkit/options.hpp"

namespace attnkit {
namespace distributed {

enum class sequence_layout {
    zigzag,     // 2P chunks; rank r holds chunk r, then chunk 2P - 1 - r (causal load balance)
    contiguous  // rank r holds rows [floor(r L / P), floor((r + 1) L / P))
};

// Rows [begin, end) of the global sequence.
struct row_range {
    index_t begin = 0, end = 0;
    index_t size() const { return end - begin; }
};

// The pieces of the global sequence that rank `rank` of `ranks` holds, in the order its local
// tensors hold them (one piece for contiguous, two for zigzag; a piece may be empty when L < 2P).
inline std::vector<row_range> rank_rows(sequence_layout layout, index_t length, int ranks, int rank) {
    const index_t P = ranks, r = rank, L = length;
    auto cut = [&](index_t c, index_t n) { return row_range{c * L / n, (c + 1) * L / n}; };
    if (layout == sequence_layout::contiguous) return {cut(r, P)};
    return {cut(r, 2 * P), cut(2 * P - 1 - r, 2 * P)};
}

// Rows a rank holds in all (the first dimension of its local tensors).
inline index_t rank_length(sequence_layout layout, index_t length, int ranks, int rank) {
    index_t n = 0;
    for (const row_range& c : rank_rows(layout, length, ranks, rank)) n += c.size();
    return n;
}

// The key positions rank `rank` holds in sharded_decode: rows [floor(r Lk / P), floor((r + 1) Lk / P)).
inline row_range shard_rows(index_t length, int ranks, int rank) {
    return rank_rows(sequence_layout::contiguous, length, ranks, rank).front();
}

// Where a ring call's time went on this rank (ring_options::stats).
struct ring_stats {
    double compute_seconds = 0.0;  // local block calls and merges
    double wait_seconds = 0.0;     // blocked on transfers that the local work did not hide
    int steps = 0;                 // ring steps (the rank count)
};

// attention: the softmax options, with their meaning in the whole sequence (positions 0..L-1,
// key_lengths of the whole sequence); the same on every rank.
struct ring_options {
    softmax_options attention;
    sequence_layout layout = sequence_layout::zigzag;
    ring_stats* stats = nullptr;  // null: not measured
};

}  // namespace distributed
}  // namespace attnkit
