// A [B, L, H, n] view copied into a dense double array, for the oracles' inner loops.
//
// An oracle reads each query row once per key and each key and value row once per query row;
// through a strided view of a 16-bit type every such read is an index computation and a
// conversion, which cost more than the product it feeds. Converted once, the reads are exact
// (float, bfloat16 and half are all exactly representable in double) and the oracle's sums run
// in the same order. Shared by the oracles only, never by a kernel.
#pragma once

#include <cstddef>
#include <vector>

#include "attnkit/config.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace reference {
namespace dense_impl {

class dense_bshd {
   public:
    template <class T>
    explicit dense_bshd(const view<const T, 4>& x)
        : L_(x.dims[1]), H_(x.dims[2]), n_(x.dims[3]),
          data_(static_cast<std::size_t>(x.dims[0] * x.dims[1] * x.dims[2] * x.dims[3])) {
        std::size_t at = 0;
        for (index_t b = 0; b < x.dims[0]; ++b)
            for (index_t l = 0; l < L_; ++l)
                for (index_t h = 0; h < H_; ++h)
                    for (index_t c = 0; c < n_; ++c) data_[at++] = static_cast<double>(x(b, l, h, c));
    }

    // Row (b, l, h): n contiguous doubles.
    const double* row(index_t b, index_t l, index_t h) const { return data_.data() + ((b * L_ + l) * H_ + h) * n_; }

   private:
    index_t L_, H_, n_;
    std::vector<double> data_;
};

}  // namespace dense_impl
}  // namespace reference
}  // namespace attnkit
