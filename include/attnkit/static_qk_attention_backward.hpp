// The backward pass of static QK attention (RndEmbQK / FixedSeqQK), and of a learned causal
// mixing matrix (static_attention_map::from_weights).
//
//   attnkit::static_qk_attention(q_fixed, k_fixed, v, out, opts);           // forward, keep out
//   attnkit::static_qk_attention_backward(q_fixed, k_fixed, v, out, d_out,
//                                         d_q_fixed, d_k_fixed, d_v, opts);
//
//   auto mix = attnkit::static_attention_map::from_weights(w);              // w [H, Lmax, Lmax]
//   mix.apply(v, out);                                                      // out [B, L, H, Dv]
//   attnkit::static_attention_map_backward(w, v, d_out, d_w, d_v, pool);    // d_w [H, Lmax, Lmax]
//
// static_qk_attention_backward: the options are the forward's (scale, pool). d_q_fixed
// [1, Lmax, H, D] and d_k_fixed [1, Lmax, Hk, D] are summed over the batch (every item uses the
// same stream), rows >= L zero; d_v [B, L, Hk, Dv] per item, summed over the query heads of a
// key/value head. All float, overwritten. The map is one per head for all B items, and so is
// its gradient: with D_r = sum_b <dO_b,r, O_b,r>, dS = P (sum_b dO_b V_b^T - D) and d_v_b =
// P^T dO_b, i.e. softmax attention's backward with the items' values side by side as one value
// row of B Dv columns. It runs on the softmax backward's tile kernel (detail/backward/, value
// sets): each score tile S, its P and dS, and the dK and dQ products are computed once for all
// B items, where B separate softmax backward calls would compute them B times; only dP and dV
// grow with B. The rows' log-sum-exp comes from one pass of the forward's tile engine with a
// one-column zero value (scores only), since the forward keeps none. No L x L matrix; extra
// memory O(L G B Dv) per thread (the packed d_out rows of a key/value head). Bitwise identical
// for any thread count.
//
// static_attention_map_backward(w, v, d_out, d_w, d_v, pool): out = from_weights(w).apply(v, out)
// over all L rows of v [B, L, Hk, Dv] (Hk any divisor of H, as apply takes it); d_w [H, Lmax,
// Lmax] gets d_w[h, i, j] = sum_b <d_out[b, i, h], v[b, j, h / (H / Hk)]> for j <= i < L and 0
// everywhere else (the upper triangle and rows >= L are not used by the map); d_v [B, L, Hk,
// Dv] = W^T d_out per item (only W's lower triangle read). Both are block products on the GEMM
// engine (detail/gemm.hpp) over 64 x 64 blocks of the triangle; float, overwritten, bitwise
// identical for any pool.
//
// Bad input (shapes that do not match the forward's, gradients that overlap each other or an
// input) throws std::invalid_argument naming the argument, before anything is written. NaN or
// Inf stays in the gradients that depend on it.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/attention_driver.hpp"
#include "attnkit/detail/backward/tile_kernel.hpp"
#include "attnkit/detail/gemm.hpp"
#include "attnkit/detail/static_qk/check.hpp"
#include "attnkit/static_attention_map.hpp"
#include "attnkit/static_qk_attention.hpp"

namespace attnkit {
namespace detail {
namespace static_qk {

// Rows [r0, rows) of a [1, rows, heads, dim] view set to zero.
inline void zero_rows(const view<float, 4>& x, index_t r0) {
    for (index_t i = r0; i < x.dims[1]; ++i)
        for (index_t h = 0; h < x.dims[2]; ++h) std::fill_n(x.ptr(0, i, h), x.dims[3], 0.0f);
}

template <class A>
void backward(const view<const float, 4>& qf, const view<const float, 4>& kf, const view<const float, 4>& v,
              const view<const float, 4>& out, const view<const float, 4>& d_out, const view<float, 4>& d_qf,
              const view<float, 4>& d_kf, const view<float, 4>& d_v, const static_qk_options& opts) {
    stream_shape st{};
    const values_shape s = check_backward(qf, kf, v, out, d_out, d_qf, d_kf, d_v, opts, st);
    check_max_keys("v", s.len, "positions per call", "L", v);
    const index_t L = s.batch == 0 ? 0 : s.len, H = st.heads, Hk = st.heads_k, G = st.group(), Dv = s.dim_v;
    zero_rows(d_qf, L);
    zero_rows(d_kf, L);
    if (L == 0) return;

    const view<const float, 4> q(qf.data, {1, L, H, st.dim}, qf.strides);
    const view<const float, 4> k(kf.data, {1, L, Hk, st.dim}, kf.strides);
    const attention_shape as{1, L, L, H, Hk, st.dim, Dv};
    static const std::vector<std::int64_t> kNoKeyLengths;
    const float scale = resolve_scale(opts.scale, st.dim);
    const float q_scale = scale * simd::kLog2e;

    // The rows' log-sum-exp: the forward engine on one zero value column (every value row at the
    // same float), so that the pass costs the scores alone.
    std::vector<float> lse(static_cast<std::size_t>(L * H)), sink(static_cast<std::size_t>(L * H));
    {
        static const float kZero = 0.0f;
        const view<const float, 4> zv(&kZero, {1, L, Hk, 1}, {0, 0, 0, 1});
        const attention_shape ls{1, L, L, H, Hk, st.dim, 1};
        attention_problem lp = make_base_problem(q, k, zv, ls, true, kNoKeyLengths);
        lp.q_scale = q_scale;
        forward_outputs fo;
        fo.out = view<float, 4>(sink.data(), {1, L, H, 1}, {L * H, H, 1, 1});
        fo.lse = view<float, 3>(lse.data(), {1, L, H}, {L * H, H, 1});
        attention_forward<A>(lp, fo, opts.pool);
    }

    attention_problem p = make_base_problem(q, k, view<const float, 4>(v.data, {1, L, Hk, Dv}, v.strides), as, true,
                                            kNoKeyLengths);
    p.q_scale = q_scale;
    p.n_sets = s.batch;  // batch item t is value set t
    p.v_set_stride = v.strides[0];
    backward::softmax_grad_rows pol;
    backward::gradient_outputs go{view<float, 4>(d_qf.data, {1, L, H, st.dim}, d_qf.strides),
                                  view<float, 4>(d_kf.data, {1, L, Hk, st.dim}, d_kf.strides), d_v};
    go.dq_scale = scale;
    go.dk_scale = scale / q_scale;
    // Row statistics of (key/value head hk): lse in log2 units, D_r summed over the items.
    auto stats = [&](index_t, index_t hk, float* a, float* dr) {
        for (index_t i = 0; i < L; ++i)
            for (index_t g = 0; g < G; ++g) {
                const index_t r = i * G + g, h = hk * G + g;
                const float l = lse[static_cast<std::size_t>(i * H + h)];
                a[r] = l == -std::numeric_limits<float>::infinity() ? std::numeric_limits<float>::infinity()
                                                                     : l * simd::kLog2e;
                float acc = 0.0f;
                for (index_t t = 0; t < s.batch; ++t) {
                    const float* o = out.ptr(t, i, h);
                    const float* d = d_out.ptr(t, i, h);
                    for (index_t c = 0; c < Dv; ++c) acc += d[c] * o[c];
                }
                dr[r] = acc;
            }
    };
    backward::attention_backward<A>(p, pol, rows_of(d_out), stats, go, opts.pool);
}

// The backward of a from_weights map (static_attention_map_backward), in blocks of kMapBlock
// rows or columns of the triangle. d_w: one owner per (head, row block), whose rows are
// sum_b dO_b V_b^T over the columns up to the block's end (one GEMM per item, added in item
// order), the strict upper triangle and rows >= L zeroed. d_v: one owner per (item, key/value
// head, column block J), the sum over its query heads of W[rows >= J's, J]^T dO in a fixed order;
// the diagonal block goes through a copy of W's lower triangle (zeros above), since the map never
// reads W's upper triangle and neither may its gradient.
constexpr index_t kMapBlock = 64;

template <class A>
void map_backward(const view<const float, 3>& w, const view<const float, 4>& v, const view<const float, 4>& d_out,
                  const view<float, 3>& d_w, const view<float, 4>& d_v, thread_pool* pool) {
    const values_shape s = check_map_backward(w, v, d_out, d_w, d_v);
    const index_t B = s.batch, L = s.batch == 0 ? 0 : s.len, H = s.heads, Hk = s.heads_k, G = H / Hk, Dv = s.dim_v;
    const index_t Lmax = w.dims[1], nb = (Lmax + kMapBlock - 1) / kMapBlock;
    parallel_for(pool, H * nb, [&](std::int64_t it) {
        const index_t h = it / nb, r0 = (it % nb) * kMapBlock, r1 = std::min(r0 + kMapBlock, Lmax);
        for (index_t i = r0; i < r1; ++i) std::fill_n(d_w.ptr(h, i), Lmax, 0.0f);
        const index_t re = std::min(r1, L);
        if (r0 >= re) return;
        const matrix_ref<float> c{d_w.ptr(h, r0), re - r0, re, d_w.strides[1]};
        for (index_t b = 0; b < B; ++b) {
            const matrix_ref<const float> dob{d_out.ptr(b, r0, h), re - r0, Dv, d_out.strides[1]};
            const matrix_ref<const float> vb{v.ptr(b, 0, h / G), re, Dv, v.strides[1]};
            gemm_on<A>(dob, gemm_op::none, vb, gemm_op::transpose, c, gemm_mode::add);
        }
        for (index_t i = r0; i < re; ++i) std::fill(d_w.ptr(h, i) + i + 1, d_w.ptr(h, i) + re, 0.0f);
    });
    const index_t nc = (L + kMapBlock - 1) / kMapBlock;
    parallel_for(pool, B * Hk * nc, [&](std::int64_t it) {
        const index_t b = it / (Hk * nc), hk = (it / nc) % Hk, c0 = (it % nc) * kMapBlock;
        const index_t c1 = std::min(c0 + kMapBlock, L), n = c1 - c0;
        std::vector<float> tri(static_cast<std::size_t>(n * n));
        const matrix_ref<float> out{d_v.ptr(b, c0, hk), n, Dv, d_v.strides[1]};
        for (index_t g = 0; g < G; ++g) {
            const index_t h = hk * G + g;
            for (index_t i = 0; i < n; ++i)
                for (index_t j = 0; j < n; ++j) tri[static_cast<std::size_t>(i * n + j)] = j <= i ? *w.ptr(h, c0 + i, c0 + j) : 0.0f;
            const matrix_ref<const float> diag{tri.data(), n, n, n};
            const matrix_ref<const float> dod{d_out.ptr(b, c0, h), n, Dv, d_out.strides[1]};
            gemm_on<A>(diag, gemm_op::transpose, dod, gemm_op::none, out, g == 0 ? gemm_mode::assign : gemm_mode::add);
            if (c1 < L) {
                const matrix_ref<const float> below{w.ptr(h, c1, c0), L - c1, n, w.strides[1]};
                const matrix_ref<const float> dob{d_out.ptr(b, c1, h), L - c1, Dv, d_out.strides[1]};
                gemm_on<A>(below, gemm_op::transpose, dob, gemm_op::none, out, gemm_mode::add);
            }
        }
    });
}

}  // namespace static_qk
}  // namespace detail

// Gradients of a loss through out = static_qk_attention(q_fixed, k_fixed, v, opts), given d_out =
// dloss / dout [B, L, H, Dv]: d_q_fixed [1, Lmax, H, D] and d_k_fixed [1, Lmax, Hk, D] summed over
// the batch (rows >= L zero), d_v [B, L, Hk, Dv]; float, overwritten.
template <class QF, class KF, class V, class O, class DO, class GQ, class GK, class GV>
void static_qk_attention_backward(const QF& q_fixed, const KF& k_fixed, const V& v, const O& out, const DO& d_out,
                                  GQ&& d_q_fixed, GK&& d_k_fixed, GV&& d_v, const static_qk_options& opts = {}) {
    namespace sq = detail::static_qk;
    const auto qv = sq::q_fixed_view(q_fixed);
    const auto kv = sq::k_fixed_view(k_fixed);
    const auto vv = sq::v_view(v);
    const auto ov = detail::input_view<4>("out", out, "[B, L, H, Dv]");
    const auto dov = detail::input_view<4>("d_out", d_out, "[B, L, H, Dv]");
    const auto gq = detail::output_view<4>("d_q_fixed", std::forward<GQ>(d_q_fixed), "[1, Lmax, H, D]");
    const auto gk = detail::output_view<4>("d_k_fixed", std::forward<GK>(d_k_fixed), "[1, Lmax, Hk, D]");
    const auto gv = detail::output_view<4>("d_v", std::forward<GV>(d_v), "[B, L, Hk, Dv]");
    ATTNKIT_IF_FLOAT("attnkit::static_qk_attention_backward: float storage (every argument a float tensor)", qv, kv,
                     vv, ov, dov, gq, gk, gv)
        sq::backward<simd::default_arch>(qv, kv, vv, ov, dov, gq, gk, gv, opts);
}

// Gradients of a loss through out = static_attention_map::from_weights(w).apply(v, out) over all L
// rows of v [B, L, Hk, Dv]: d_w [H, Lmax, Lmax] (the lower triangle of the first L rows; 0 elsewhere)
// and d_v [B, L, Hk, Dv]; float, overwritten; on `pool` when given, bitwise identical for any pool.
template <class W, class V, class DO, class GW, class GV>
void static_attention_map_backward(const W& w, const V& v, const DO& d_out, GW&& d_w, GV&& d_v,
                                   thread_pool* pool = nullptr) {
    namespace sq = detail::static_qk;
    const auto wv = sq::weights_view(w);
    const auto vv = sq::v_view(v);
    const auto dov = detail::input_view<4>("d_out", d_out, "[B, L, H, Dv]");
    const auto gw = detail::output_view<3>("d_w", std::forward<GW>(d_w), "[H, Lmax, Lmax]");
    const auto gv = detail::output_view<4>("d_v", std::forward<GV>(d_v), "[B, L, Hk, Dv]");
    ATTNKIT_IF_FLOAT("attnkit::static_attention_map_backward: float storage (w, v, d_out and the gradients float)", wv,
                     vv, dov, gw, gv)
        sq::map_backward<simd::default_arch>(wv, vv, dov, gw, gv, pool);
}

}  // namespace attnkit
