// What the backward tests (tests/*_backward_test.cpp) share: the gradient triples, the marking
// of non-finite elements in the NaN tests, the column sums of the attention weights that scale
// the d_k and d_v tolerances, and the sweep's case shape, its deterministic picker and its
// structured part (sizes around the lane widths, the micro-tiles, the key tiles and blocks).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "common/random.hpp"
#include "common/tensor.hpp"

namespace attnkit_test {

using attnkit::index_t;

// Gradients of q, k and v as the kernel writes them and as the oracle does.
struct grads {
    tensor4<float> dq, dk, dv;
};
struct grads_d {
    tensor4<double> dq, dk, dv;
};

// Inf and NaN both mark an element that depends on a non-finite input, and which of the two
// comes out depends on the order of operations: the NaN tests compare with every non-finite
// element made NaN (all_close's equal_nan).
template <class T>
void nan_if_not_finite(tensor4<T>& t) {
    for (index_t i = 0; i < t.size(); ++i)
        if (!std::isfinite(t.data()[i])) t.data()[i] = std::numeric_limits<T>::quiet_NaN();
}
template <class G>
void nan_if_not_finite_all(G& g) {
    nan_if_not_finite(g.dq), nan_if_not_finite(g.dk), nan_if_not_finite(g.dv);
}

// The largest weight one key gets from all query rows of its key/value head (w [B, H, Lq, Lk],
// Hk key/value heads): d_k and d_v are sums over those rows, so their magnitude grows with it.
inline double max_column_sum(const tensor4<double>& w, index_t heads_kv) {
    const index_t B = w.dimension(0), H = w.dimension(1), Lq = w.dimension(2), Lk = w.dimension(3);
    const index_t G = H / heads_kv;
    double best = 0.0;
    for (index_t b = 0; b < B; ++b)
        for (index_t hk = 0; hk < heads_kv; ++hk)
            for (index_t j = 0; j < Lk; ++j) {
                double c = 0.0;
                for (index_t h = hk * G; h < (hk + 1) * G; ++h)
                    for (index_t i = 0; i < Lq; ++i) c += w(b, h, i, j);
                best = std::max(best, c);
            }
    return best;
}

// A small deterministic generator for the random part of a sweep.
struct picker {
    std::uint64_t state;
    std::uint64_t below(std::uint64_t n) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return (state >> 33) % n;
    }
    template <class T, std::size_t N>
    T pick(const T (&a)[N]) {
        return a[below(N)];
    }
};

// The shape of a sweep case; a test's case adds its options (and their part of the name).
struct backward_shape {
    index_t B = 1, Lq = 5, Lk = 5, H = 2, Hk = 1, D = 4, Dv = 4;
    distribution dist = distribution::gaussian;
    std::uint64_t seed = 1;

    std::string shape_name() const {
        return "B" + std::to_string(B) + "_Lq" + std::to_string(Lq) + "_Lk" + std::to_string(Lk) + "_H" +
               std::to_string(H) + "_Hk" + std::to_string(Hk) + "_D" + std::to_string(D) + "_Dv" + std::to_string(Dv);
    }
};

// q, k, v and d_out of a case, from its seed.
struct backward_inputs {
    tensor4<float> q, k, v, dout;
};
inline backward_inputs make_backward_inputs(const backward_shape& c) {
    return {random_bshd(c.B, c.Lq, c.H, c.D, c.dist, c.seed * 5 + 0),
            random_bshd(c.B, c.Lk, c.Hk, c.D, c.dist, c.seed * 5 + 1),
            random_bshd(c.B, c.Lk, c.Hk, c.Dv, c.dist, c.seed * 5 + 2),
            random_bshd(c.B, c.Lq, c.H, c.Dv, c.dist, c.seed * 5 + 3)};
}

// The structured part of a sweep of cases C (a backward_shape with an options member o that has
// `causal`), seeds numbered from `seed` on: head dims around the lane widths (4, 8, 16) and the
// micro-tile heights at L = 23 (causal); lengths around the key tiles, the 64-key block (and
// chunk) and the 96-row query block; GQA ratios with Lq != Lk both ways.
template <class C>
void add_structured_cases(std::vector<C>& cs, std::uint64_t& seed, std::initializer_list<index_t> dims) {
    auto add = [&](C c) {
        c.seed = seed++;
        cs.push_back(c);
    };
    for (index_t D : dims) {
        C c;
        c.D = D;
        c.Dv = D == 1 ? 5 : D;
        c.Lq = c.Lk = 23;
        c.o.causal = true;
        add(c);
    }
    for (index_t L : {1, 2, 15, 16, 17, 63, 64, 65, 95, 96, 97, 130}) {
        C c;
        c.Lq = c.Lk = L;
        c.H = 2;
        c.Hk = 2;
        c.D = 8;
        c.Dv = 12;
        c.o.causal = L % 2 == 1;
        add(c);
    }
    for (index_t Hk : {1, 2, 4}) {
        C c;
        c.H = 4;
        c.Hk = Hk;
        c.Lq = 40;
        c.Lk = 70;
        c.D = 12;
        c.Dv = 6;
        c.o.causal = true;
        add(c);
        c.Lq = 70;
        c.Lk = 33;
        add(c);
    }
}

}  // namespace attnkit_test
