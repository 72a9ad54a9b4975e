// Mask probes for the oracles' tests (tests/reference_*_test.cpp). With q = 0 every visible key
// gets the same score, so in softmax and in its Taylor approximation alike a row weighs its n
// visible keys 1/n each; with v_j = j its output is the mean of the visible key indices. What a
// row sees is then readable from its weights and its output alone.
//
//   mask_probe p = mask_probe_inputs(B, Lq, Lk);   q = 0 [B,Lq,1,1], k = 1 [B,Lk,1,1], v_j = j (double)
//   expect_uniform_weights(w, b, i, keys, tol);    w[b, 0, i, j] == 1/n on `keys`, 0 elsewhere
//   mean_of(keys)                                  the expected output of such a row (0 if none)
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/tensor.hpp"

namespace attnkit_test {

struct mask_probe {
    tensor4<double> q, k, v;
};

inline mask_probe mask_probe_inputs(index_t B, index_t Lq, index_t Lk) {
    mask_probe p{make_bshd<double>(B, Lq, 1, 1, 0.0), make_bshd<double>(B, Lk, 1, 1, 1.0),
                 make_bshd<double>(B, Lk, 1, 1)};
    for (index_t b = 0; b < B; ++b)
        for (index_t j = 0; j < Lk; ++j) p.v(b, j, 0, 0) = static_cast<double>(j);
    return p;
}

inline double mean_of(const std::vector<index_t>& keys) {
    if (keys.empty()) return 0.0;
    return std::accumulate(keys.begin(), keys.end(), 0.0) / static_cast<double>(keys.size());
}

// Weights w [B, 1, Lq, Lk] of one head: row i of batch b puts 1/n on each of its n `keys`.
template <class W>
void expect_uniform_weights(const W& w, index_t b, index_t i, const std::vector<index_t>& keys, double tol) {
    const index_t Lk = w.dimension(3);
    const double n = static_cast<double>(keys.size());
    for (index_t j = 0; j < Lk; ++j) {
        const bool vis = std::find(keys.begin(), keys.end(), j) != keys.end();
        EXPECT_NEAR(vis ? 1.0 / n : 0.0, w(b, 0, i, j), tol) << "key " << j;
    }
}

}  // namespace attnkit_test
