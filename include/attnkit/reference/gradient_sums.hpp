// The oracles' gradient accumulators (reference/*_backward.hpp): d_q [B, Lq, H, D], d_k
// [B, Lk, Hk, D] and d_v [B, Lk, Hk, Dv] summed in double over the materialised matrices, then
// stored into the caller's tensors. Shared by the oracles only, never by a kernel.
#pragma once

#include <cstddef>
#include <vector>

#include "attnkit/config.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace backward_impl {

class gradient_sums {
   public:
    gradient_sums(index_t B, index_t Lq, index_t Lk, index_t H, index_t Hk, index_t D, index_t Dv)
        : B_(B), Lq_(Lq), Lk_(Lk), H_(H), Hk_(Hk), D_(D), Dv_(Dv),
          q_(static_cast<std::size_t>(B * Lq * H * D), 0.0),
          k_(static_cast<std::size_t>(B * Lk * Hk * D), 0.0),
          v_(static_cast<std::size_t>(B * Lk * Hk * Dv), 0.0) {}

    // One (query row i of head h, key j of key/value head kvh) pair of item b, whose score
    // s = scale <q_i, k_j> has gradient ds and whose weight on v_j is p:
    //   d_q_i += scale ds k_j,   d_k_j += scale ds q_i,   d_v_j += p d_out_i
    template <class TQ, class TK, class TD>
    void add_pair(const view<const TQ, 4>& q, const view<const TK, 4>& k, const view<const TD, 4>& d_out, index_t b,
                  index_t i, index_t h, index_t j, index_t kvh, double scale, double ds, double p) {
        for (index_t d = 0; d < D_; ++d) {
            q_[at_q(b, i, h, d)] += scale * ds * static_cast<double>(k(b, j, kvh, d));
            k_[at_k(b, j, kvh, d)] += scale * ds * static_cast<double>(q(b, i, h, d));
        }
        for (index_t c = 0; c < Dv_; ++c) v_[at_v(b, j, kvh, c)] += p * static_cast<double>(d_out(b, i, h, c));
    }

    template <class TG>
    void store(const view<TG, 4>& d_q, const view<TG, 4>& d_k, const view<TG, 4>& d_v) const {
        for (index_t b = 0; b < B_; ++b) {
            for (index_t i = 0; i < Lq_; ++i)
                for (index_t h = 0; h < H_; ++h)
                    for (index_t d = 0; d < D_; ++d) d_q(b, i, h, d) = static_cast<TG>(q_[at_q(b, i, h, d)]);
            for (index_t j = 0; j < Lk_; ++j)
                for (index_t h = 0; h < Hk_; ++h) {
                    for (index_t d = 0; d < D_; ++d) d_k(b, j, h, d) = static_cast<TG>(k_[at_k(b, j, h, d)]);
                    for (index_t c = 0; c < Dv_; ++c) d_v(b, j, h, c) = static_cast<TG>(v_[at_v(b, j, h, c)]);
                }
        }
    }

   private:
    std::size_t at_q(index_t b, index_t i, index_t h, index_t d) const {
        return static_cast<std::size_t>(((b * Lq_ + i) * H_ + h) * D_ + d);
    }
    std::size_t at_k(index_t b, index_t j, index_t h, index_t d) const {
        return static_cast<std::size_t>(((b * Lk_ + j) * Hk_ + h) * D_ + d);
    }
    std::size_t at_v(index_t b, index_t j, index_t h, index_t c) const {
        return static_cast<std::size_t>(((b * Lk_ + j) * Hk_ + h) * Dv_ + c);
    }

    index_t B_, Lq_, Lk_, H_, Hk_, D_, Dv_;
    std::vector<double> q_, k_, v_;
};

}  // namespace backward_impl
}  // namespace reference
}  // namespace attnkit
