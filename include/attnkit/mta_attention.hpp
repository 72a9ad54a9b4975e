// Multi-token attention (Golovneva et al.; docs/variants.md section 7), the fused kernel.
//
//   attnkit::mta_attention(q, k, v, out, opts);    q [B,L,H,D], k [B,L,Hk,D], v [B,L,Hk,Dv], out [B,L,H,Dv]
//   attnkit::mta_head_kernel_to_matrix(kernel, w); grouped head kernel [H/c_h, c_h, c_h] -> w [H, H]
//   attnkit::mta_state st(batch, heads, heads_kv, dim, dim_v, opts); st.step(q, k, v, out);   decode
//                                                  (attnkit/mta_state.hpp, included here)
//
// Always causal, Lq = Lk. Stages (each optional, see mta_options): key-query convolution and head
// mixing of the scores, causal softmax, key-query convolution and head mixing of the
// probabilities, P V, group norm, depth scale, gate.
//
// How it runs (detail/mta/block_kernel.hpp): work items are (batch item, block of query rows),
// all heads together, because head mixing couples the heads of a row. Without post-softmax
// stages one pass does online softmax over key blocks, recomputing the c_q - 1 halo rows and
// (c_k - 1) / 2 halo keys each side of the convolution rather than exchanging them between work
// items. A post-softmax convolution (or a head mixing that crosses value heads) needs final
// probabilities: a row-statistics pass stores each row's lse ([B, L, H] floats), and a second
// pass rebuilds the tiles with c_q - 1 more halo rows, forms the probabilities, convolves, mixes
// and multiplies by V. Post-softmax head mixing among heads that read the same value head
// (within GQA groups; MHA heads each have their own V) commutes with P V and is applied to the
// outputs instead, which saves the second pass. The [H, L, L] tensors never exist; scratch is a
// few tiles per thread. Results are bitwise identical for any thread count (fixed partition,
// every item computed by one thread).
//
// Non-finite inputs stay in the rows that see them: a NaN or Inf at token j reaches rows >= j
// only, as in softmax_attention.
#pragma once

#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/mta/check.hpp"
#include "attnkit/detail/mta/forward.hpp"
#include "attnkit/mta_state.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {

template <class Q, class K, class V, class O>
void mta_attention(const Q& q, const K& k, const V& v, O&& out, const mta_options& opts = {}) {
    const auto qv = detail::q_view(q);
    const auto kv = detail::k_view(k);
    const auto vv = detail::v_view(v);
    const auto ov = detail::out_view(std::forward<O>(out));
    ATTNKIT_IF_FLOAT("attnkit::mta_attention: float storage", qv, kv, vv, ov)
        detail::mta::forward<simd::default_arch>(qv, kv, vv, ov, opts);
}

// The block-diagonal [H, H] head_post matrix of a grouped head convolution kernel
// [H / c_h, c_h, c_h] as [group, in, out]: block g is kernel[g]^T, i.e.
// w[g c_h + o, g c_h + i] = kernel[g, i, o], 0 outside the blocks. w must not share memory with
// the kernel (std::invalid_argument, nothing written).
template <class Kern, class W>
void mta_head_kernel_to_matrix(const Kern& kernel, W&& w) {
    const auto kv = detail::input_view<3>("kernel", kernel, "[H / c_h, c_h, c_h]");
    const auto wv = detail::output_view<2>("w", std::forward<W>(w), "[H, H]");
    detail::mta::check_head_kernel(kv, wv);
    const index_t n = kv.dims[0], c = kv.dims[1];
    for (index_t r = 0; r < n * c; ++r)
        for (index_t col = 0; col < n * c; ++col) wv(r, col) = 0.0f;
    for (index_t g = 0; g < n; ++g)
        for (index_t i = 0; i < c; ++i)
            for (index_t o = 0; o < c; ++o) wv(g * c + o, g * c + i) = static_cast<float>(kv(g, i, o));
}

}  // namespace attnkit
