// The tokens a quadratic taylor_state holds (taylor_state.hpp): K [cap][D] and V [cap][Dv] per
// (batch item, key/value head), row-major, so one item's keys are one contiguous run (the tile
// engine's K tiles and the row kernel's streams read it front to back) and a fold reads whole chunks.
// Capacity doubles (amortised O(1) copy per token) up to a limit; the new buffers are filled
// before they replace the old ones, so a failed allocation leaves the cache as it was.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

class token_cache {
   public:
    token_cache(index_t batch, index_t heads_kv, index_t dim, index_t dim_v)
        : batch_(batch), heads_kv_(heads_kv), dim_(dim), dim_v_(dim_v) {}

    index_t capacity() const { return cap_; }
    std::size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }
    const float* k(index_t item) const { return k_.data() + item * cap_ * dim_; }
    const float* v(index_t item) const { return v_.data() + item * cap_ * dim_v_; }
    strided_rows k_rows() const { return {k_.data(), heads_kv_ * cap_ * dim_, dim_, cap_ * dim_}; }
    strided_rows v_rows() const { return {v_.data(), heads_kv_ * cap_ * dim_v_, dim_v_, cap_ * dim_v_}; }

    // Room for n tokens, keeping the first `kept` of each item: max(n, 2 capacity, min_cap),
    // at most max(limit, n).
    void reserve(index_t n, index_t kept, index_t min_cap, index_t limit) {
        if (n <= cap_) return;
        const index_t cap = std::min(std::max({n, 2 * cap_, min_cap}), std::max(limit, n));
        const index_t items = batch_ * heads_kv_;
        std::vector<float> nk(static_cast<std::size_t>(items * cap * dim_));
        std::vector<float> nv(static_cast<std::size_t>(items * cap * dim_v_));
        for (index_t item = 0; item < items; ++item) {
            std::copy_n(k(item), kept * dim_, nk.data() + item * cap * dim_);
            std::copy_n(v(item), kept * dim_v_, nv.data() + item * cap * dim_v_);
        }
        k_.swap(nk);
        v_.swap(nv);
        cap_ = cap;
    }

    // Tokens [0, T) of the step's k [B,T,Hk,D] and v [B,T,Hk,Dv] at positions [at, at + T).
    void append(const view<const float, 4>& k, const view<const float, 4>& v, index_t at) {
        const index_t T = k.dims[1];
        for (index_t b = 0; b < batch_; ++b)
            for (index_t hk = 0; hk < heads_kv_; ++hk) {
                float* ck = k_.data() + ((b * heads_kv_ + hk) * cap_ + at) * dim_;
                float* cv = v_.data() + ((b * heads_kv_ + hk) * cap_ + at) * dim_v_;
                for (index_t t = 0; t < T; ++t) {
                    std::copy_n(k.ptr(b, t, hk), dim_, ck + t * dim_);
                    std::copy_n(v.ptr(b, t, hk), dim_v_, cv + t * dim_v_);
                }
            }
    }

    void release() {
        std::vector<float>().swap(k_);
        std::vector<float>().swap(v_);
        cap_ = 0;
    }

   private:
    index_t batch_, heads_kv_, dim_, dim_v_;
    index_t cap_ = 0;
    std::vector<float> k_, v_;
};

}  // namespace taylor
}  // namespace detail
}  // namespace attnkit
