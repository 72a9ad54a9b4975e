// The linear form of Taylor attention's backward: O((Lq H + Lk Hk) F Dv), no L x L matrix.
//
// With the feature map of features.hpp, w_ij = phi_q(q_i) . phi_k(k_j) on visible pairs, and
// (quadratic_backward.hpp) dL/dw_ij = inv_i (dP_ij - D_i) = u~_i . v~_j with u~_i = [inv_i dO_i,
// -inv_i D_i] and v~_j = [v_j, 1] (T = Dv + 1 columns). So
//   dL/dphi_q(q_i) = S_i u~_i,     S_i = sum_{j seen by i} phi_k(k_j) v~_j^T   (the forward's state)
//   dL/dphi_k(k_j) = R_j v~_j,     R_j = sum_{i that see j} phi_q(q_i) u~_i^T  (a reverse state)
//   d_v_j          = R_j[:, :Dv]^T phi_k(k_j)
// and d_q, d_k follow through the features (each feature is a product of two entries of the
// augmented vector [x, 1], so its gradient adds to those two entries). Causal (the visible set of
// a query is a key prefix): S runs forward over chunks of kBackwardChunk keys and R in reverse; the
// pairs inside a chunk (query and key in the same chunk) go through the engine's backward tile
// kernel (backward/tile_kernel.hpp with the quadratic form's row policy) on the chunk's diagonal
// block. Not causal: one S of all visible keys, one R of all queries.
//
// Every product is the GEMM (gemm.hpp, gemm_op::transpose reads the transposed operands in
// place), F walked in blocks of kFeatureBlock features so that a block of S or R and of the
// features stays in L2: per block and row panel
//   dPhi_Q^T = S_blk U^T,   S_blk += Phi_K^T V~            (forward over chunks)
//   dPhi_K^T = R_blk V~^T,  d_V += Phi_K R_blk[:, :Dv],  R_blk += Phi_Q^T U   (reverse)
// The row sums Z (in inv) come from quadratic_backward.hpp's running key sums: O(D^2) per row.
//
// Threads: a work item is one (batch, key/value head) with its G query heads; it owns every
// gradient element it writes and computes it in a fixed order, so results are bitwise identical
// for any thread count. Memory per running item: S and R (F x (Dv + 1) floats each), U and the
// item's gradient accumulators (O(L (D + Dv)) floats), one feature block of panels; kept per
// thread after the call (linear_backward_buffers).
//
// Unlike the linear forward, queries and keys are not rescaled for magnitudes past ~2^20: their
// gradients (products of up to four such entries) leave float there anyway.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/detail/backward/tile_kernel.hpp"
#include "attnkit/detail/gemm.hpp"
#include "attnkit/detail/gemm/pack.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/detail/taylor/features.hpp"
#include "attnkit/detail/taylor/linear.hpp"
#include "attnkit/detail/taylor/quadratic_backward.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {
namespace taylor {

// dx^T[a] += c_f g[f] x^T[b] and dx^T[b] += c_f g[f] x^T[a] for features f in [f0, f1): the
// gradient of phi(f) = c_f x_a x_b, feature-major g [f1 - f0][n] and transposed augmented tiles
// x, dx [D + 2][n] (n a multiple of the lane count).
template <class A>
inline void feature_chain(const feature_table& ft, index_t f0, index_t f1, const float* g, index_t n, bool with_coef,
                          const float* x, float* dx) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    for (index_t f = f0; f < f1; ++f) {
        const index_t a = ft.a[static_cast<std::size_t>(f)], b = ft.b[static_cast<std::size_t>(f)];
        const V c(with_coef ? ft.coef[static_cast<std::size_t>(f)] : 1.0f);
        const float* gf = g + (f - f0) * n;
        for (index_t t = 0; t < n; t += W) {
            const V gv = simd::loadu<A>(gf + t) * c;
            simd::storeu(dx + a * n + t, simd::fma(gv, simd::loadu<A>(x + b * n + t), simd::loadu<A>(dx + a * n + t)));
            simd::storeu(dx + b * n + t, simd::fma(gv, simd::loadu<A>(x + a * n + t), simd::loadu<A>(dx + b * n + t)));
        }
    }
}

// An item's buffers, kept per thread across items and calls (scratch.hpp's scratch_object):
// the accumulators alone are O(L (D + Dv)) floats, megabytes at long L, which allocated per item
// would come from fresh pages, faulted in and zeroed at every item (docs/benchmarks.md, "The
// linear backward's buffers kept per thread").
struct linear_backward_buffers {
    std::vector<float> S, U, last, inv, invd, dq, dk, dv, dvt, dots, xt, dxt, vt, phi, dphi, tq, tk, tv, sa, sb, buf;
    std::vector<index_t> lo, hi;
};

template <class A>
class linear_backward_item {
   public:
    static constexpr index_t kGroup = kBackwardChunk;  // rows (or keys) per panel
    static constexpr index_t W = simd::kLanes<A>;
    static constexpr index_t FB = chunk_buffers<A>::kFeatureBlock;

    linear_backward_item(const basic_attention_problem<float, float>& p, const view<const float, 4>& out,
                         const view<const float, 4>& d_out, const backward::gradient_outputs& go, float eps,
                         const feature_table& ft, linear_backward_buffers& w)
        : p_(p), out_(out), dout_(d_out), go_(go), eps_(eps), ft_(ft), w_(w) {}

    void run(index_t b, index_t hk) {
        const attention_shape& s = p_.s;
        b_ = b, hk_ = hk;
        G_ = s.group(), D_ = s.dim, Dv_ = s.dim_v, T_ = Dv_ + 1, len_ = visible_keys_len();
        const index_t rows = s.len_q * G_;
        const index_t ld = (kGroup + W - 1) / W * W;
        Fp_ = ft_.padded;
        w_.S.assign(static_cast<std::size_t>(Fp_ * T_), 0.0f);
        w_.U.assign(static_cast<std::size_t>(rows * T_), 0.0f);
        w_.inv.assign(static_cast<std::size_t>(rows), 0.0f);
        w_.invd.assign(static_cast<std::size_t>(rows), 0.0f);
        w_.dq.assign(static_cast<std::size_t>(rows * D_), 0.0f);
        w_.dk.assign(static_cast<std::size_t>(s.len_k * D_), 0.0f);
        w_.dv.assign(static_cast<std::size_t>(s.len_k * Dv_), 0.0f);
        w_.xt.assign(static_cast<std::size_t>((D_ + 2) * ld), 0.0f);
        w_.dxt.assign(w_.xt.size(), 0.0f);
        w_.vt.assign(static_cast<std::size_t>(ld * T_), 0.0f);
        w_.phi.assign(static_cast<std::size_t>(FB * ld), 0.0f);
        w_.last.assign(static_cast<std::size_t>(ld), 0.0f);
        w_.dphi.assign(w_.phi.size(), 0.0f);
        w_.dvt.assign(static_cast<std::size_t>(Dv_ * kGroup), 0.0f);
        w_.dots.assign(static_cast<std::size_t>(FB), 0.0f);

        // Statistics: inv = 1 / (Z + eps) (0 for a row that sees nothing), and U = [inv dO, -inv D].
        item_row_sums<A>(p_, b, hk, w_.inv.data());
        for (index_t r = 0; r < rows; ++r) {
            const index_t i = r / G_, h = hk * G_ + r % G_;
            const float a = visible_keys(p_, b, i) == 0 ? 0.0f : 1.0f / (w_.inv[static_cast<std::size_t>(r)] + eps_);
            const float* dO = dout_.ptr(b, i, h);
            w_.inv[static_cast<std::size_t>(r)] = a;
            w_.invd[static_cast<std::size_t>(r)] = a == 0.0f ? 0.0f : a * simd::dot<A>(dO, out_.ptr(b, i, h), Dv_);
            float* u = w_.U.data() + r * T_;
            if (a != 0.0f)
                for (index_t c = 0; c < Dv_; ++c) u[c] = a * dO[c];
            u[Dv_] = -w_.invd[static_cast<std::size_t>(r)];
        }

        // Causal: every chunk of positions (queries past key_lengths read the whole S); keys
        // past key_lengths never enter.
        const index_t n_chunks = ((p_.causal ? s.len_k : len_) + kBackwardChunk - 1) / kBackwardChunk;
        if (p_.causal) {
            // Forward: the queries of chunk c read the keys of chunks < c, then chunk c enters S.
            for (index_t c = 0; c < n_chunks; ++c) {
                index_t r0, r1;
                chunk_rows(c, r0, r1);
                for (index_t r = r0; r < r1; r += kGroup) queries_read(r, std::min(r1, r + kGroup));
                keys_enter(c);
            }
            // Reverse: the keys of chunk c read the queries of chunks > c, then chunk c's enter R.
            std::fill(w_.S.begin(), w_.S.end(), 0.0f);  // S is R from here on
            for (index_t c = n_chunks - 1; c >= 0; --c) {
                keys_read(c);
                index_t r0, r1;
                chunk_rows(c, r0, r1);
                for (index_t r = r0; r < r1; r += kGroup) queries_enter(r, std::min(r1, r + kGroup));
            }
            for (index_t c = 0; c < n_chunks; ++c) diagonal_block(c);
        } else if (len_ > 0) {
            for (index_t c = 0; c < n_chunks; ++c) keys_enter(c);
            for (index_t r = 0; r < rows; r += kGroup) queries_read(r, std::min(rows, r + kGroup));
            std::fill(w_.S.begin(), w_.S.end(), 0.0f);
            for (index_t r = 0; r < rows; r += kGroup) queries_enter(r, std::min(rows, r + kGroup));
            for (index_t c = 0; c < n_chunks; ++c) keys_read(c);
        }

        for (index_t r = 0; r < rows; ++r) {
            float* dqr = go_.d_q.ptr(b, r / G_, hk * G_ + r % G_);
            for (index_t d = 0; d < D_; ++d) dqr[d] = w_.dq[static_cast<std::size_t>(r * D_ + d)] * p_.q_scale;
        }
        for (index_t j = 0; j < s.len_k; ++j) {
            std::copy_n(w_.dk.data() + j * D_, D_, go_.d_k.ptr(b, j, hk));
            std::copy_n(w_.dv.data() + j * Dv_, Dv_, go_.d_v.ptr(b, j, hk));
        }
    }

   private:
    index_t visible_keys_len() const {
        return p_.key_lengths ? static_cast<index_t>(p_.key_lengths[b_]) : p_.s.len_k;
    }
    index_t offset() const { return p_.s.len_k - p_.s.len_q; }

    // Item rows of the queries whose positions fall in key chunk c (causal).
    void chunk_rows(index_t c, index_t& r0, index_t& r1) const {
        const index_t Lq = p_.s.len_q;
        const index_t i0 = std::min(std::max<index_t>(c * kBackwardChunk - offset(), 0), Lq);
        const index_t i1 = std::min(std::max<index_t>((c + 1) * kBackwardChunk - offset(), 0), Lq);
        r0 = i0 * G_, r1 = i1 * G_;
    }

    // Item rows [r0, r1) as the transposed augmented tile [q', 1, 0] in w_.xt (lanes: rows).
    // A whole chunk of rows one stride apart (keys; queries with one head per group) goes
    // through the transposing pack (gemm/pack.hpp rows_into_tiles: the tile is the chunk, its
    // lanes n = kGroup apart); other rows one float at a time.
    bool pack_transposed(const float* first, index_t stride, index_t count, index_t n) {
        if (n != kGroup || count != n) return false;
        rows_into_tiles<A, kGroup>(first, stride, count, D_, w_.xt.data(), D_ + 2, 0);
        std::fill_n(w_.xt.data() + D_ * n, n, 1.0f);
        std::fill_n(w_.xt.data() + (D_ + 1) * n, n, 0.0f);
        return true;
    }
    index_t pack_rows(index_t r0, index_t r1) {
        const index_t n = (r1 - r0 + W - 1) / W * W;
        if (G_ == 1 && pack_transposed(p_.q.row(b_, r0, hk_), p_.q.sl, r1 - r0, n)) {
            const simd::vfloat<A> sc(p_.q_scale);
            float* xt = w_.xt.data();
            for (index_t x = 0; x < D_ * n; x += W) simd::storeu(xt + x, simd::loadu<A>(xt + x) * sc);
            return n;
        }
        std::fill(w_.xt.begin(), w_.xt.begin() + (D_ + 2) * n, 0.0f);
        for (index_t r = r0; r < r1; ++r) {
            const float* qr = p_.q.row(b_, r / G_, hk_ * G_ + r % G_);
            for (index_t d = 0; d < D_; ++d) w_.xt[static_cast<std::size_t>(d * n + r - r0)] = qr[d] * p_.q_scale;
            w_.xt[static_cast<std::size_t>(D_ * n + r - r0)] = 1.0f;
        }
        return n;
    }
    // Keys of chunk c below len as [k, 1, 0] in w_.xt and V~ = [v, 1] rows in w_.vt; returns the count.
    index_t pack_keys(index_t c, index_t& n) {
        const index_t j0 = c * kBackwardChunk, nk = std::min(kBackwardChunk, len_ - j0);
        n = 0;
        if (nk <= 0) return 0;
        n = (nk + W - 1) / W * W;
        const bool packed = pack_transposed(p_.k.row(b_, j0, hk_), p_.k.sl, nk, n);
        if (!packed) std::fill(w_.xt.begin(), w_.xt.begin() + (D_ + 2) * n, 0.0f);
        for (index_t u = 0; u < nk; ++u) {
            const float* vr = p_.v.row(b_, j0 + u, hk_);
            if (!packed) {
                const float* kr = p_.k.row(b_, j0 + u, hk_);
                for (index_t d = 0; d < D_; ++d) w_.xt[static_cast<std::size_t>(d * n + u)] = kr[d];
                w_.xt[static_cast<std::size_t>(D_ * n + u)] = 1.0f;
            }
            std::copy_n(vr, Dv_, w_.vt.data() + u * T_);
            w_.vt[static_cast<std::size_t>(u * T_ + Dv_)] = 1.0f;
        }
        return nk;
    }

    matrix_ref<float> state_block(index_t f0, index_t f1) { return {w_.S.data() + f0 * T_, f1 - f0, T_, T_}; }
    matrix_ref<const float> u_rows(index_t r0, index_t r1) const { return {w_.U.data() + r0 * T_, r1 - r0, T_, T_}; }

    // d_q of rows [r0, r1) += through S (holding the keys they see outside their own chunk).
    void queries_read(index_t r0, index_t r1) {
        const index_t n = pack_rows(r0, r1), m = r1 - r0;
        std::fill(w_.dxt.begin(), w_.dxt.begin() + (D_ + 2) * n, 0.0f);
        for (index_t f0 = 0; f0 < Fp_; f0 += FB) {
            const index_t f1 = std::min(Fp_, f0 + FB);
            const matrix_ref<float> sb = state_block(f0, f1);
            gemm_on<A>({sb.data, sb.rows, sb.cols, sb.stride}, gemm_op::none, u_rows(r0, r1), gemm_op::transpose,
                       {w_.dphi.data(), f1 - f0, m, n});
            if (m < n)
                for (index_t f = 0; f < f1 - f0; ++f) std::fill_n(w_.dphi.data() + f * n + m, n - m, 0.0f);
            feature_chain<A>(ft_, f0, f1, w_.dphi.data(), n, true, w_.xt.data(), w_.dxt.data());
        }
        for (index_t r = r0; r < r1; ++r)
            for (index_t d = 0; d < D_; ++d)
                w_.dq[static_cast<std::size_t>(r * D_ + d)] += w_.dxt[static_cast<std::size_t>(d * n + r - r0)];
    }
    // The states grow by products with Dv columns, not T = Dv + 1: the last column (ones for the
    // keys, -inv D for the queries) would take a whole register tile of columns of its own (65
    // columns cost 96 on AVX-512, 72 on AVX2), so it is added beside the product, one dot per
    // feature, taken as the features are built. weights: n floats, zero past the chunk's count
    // (the features of padding lanes are zero, but a weight there must not be Inf or NaN).
    void add_last_column(index_t f0, index_t f1) {
        for (index_t f = f0; f < f1; ++f)
            w_.S[static_cast<std::size_t>(f * T_ + Dv_)] += w_.dots[static_cast<std::size_t>(f - f0)];
    }
    // R += Phi_Q^T U for rows [r0, r1).
    void queries_enter(index_t r0, index_t r1) {
        const index_t n = pack_rows(r0, r1), m = r1 - r0;
        std::fill(w_.last.begin(), w_.last.end(), 0.0f);
        for (index_t r = r0; r < r1; ++r)
            w_.last[static_cast<std::size_t>(r - r0)] = w_.U[static_cast<std::size_t>(r * T_ + Dv_)];
        for (index_t f0 = 0; f0 < Fp_; f0 += FB) {
            const index_t f1 = std::min(Fp_, f0 + FB);
            build_features<A>(w_.xt.data(), n, ft_, f0, f1, true, w_.phi.data(), w_.last.data(), w_.dots.data());
            gemm_on<A>({w_.phi.data(), f1 - f0, m, n}, gemm_op::none, u_rows(r0, r1).col_block(0, Dv_), gemm_op::none,
                       state_block(f0, f1).col_block(0, Dv_), gemm_mode::add);
            add_last_column(f0, f1);
        }
    }
    // S += Phi_K^T V~ for the keys of chunk c (summed from zero per chunk inside the GEMM's
    // register tiles, then added).
    void keys_enter(index_t c) {
        index_t n;
        const index_t nk = pack_keys(c, n);
        if (nk <= 0) return;
        std::fill(w_.last.begin(), w_.last.end(), 0.0f);
        std::fill_n(w_.last.data(), nk, 1.0f);
        for (index_t f0 = 0; f0 < Fp_; f0 += FB) {
            const index_t f1 = std::min(Fp_, f0 + FB);
            build_features<A>(w_.xt.data(), n, ft_, f0, f1, false, w_.phi.data(), w_.last.data(), w_.dots.data());
            gemm_on<A>({w_.phi.data(), f1 - f0, nk, n}, gemm_op::none, {w_.vt.data(), nk, Dv_, T_}, gemm_op::none,
                       state_block(f0, f1).col_block(0, Dv_), gemm_mode::add);
            add_last_column(f0, f1);
        }
    }
    // d_k, d_v of the keys of chunk c += through R (the queries that see them outside the chunk).
    void keys_read(index_t c) {
        index_t n;
        const index_t nk = pack_keys(c, n);
        if (nk <= 0) return;
        const index_t j0 = c * kBackwardChunk;
        std::fill(w_.dxt.begin(), w_.dxt.begin() + (D_ + 2) * n, 0.0f);
        for (index_t f0 = 0; f0 < Fp_; f0 += FB) {
            const index_t f1 = std::min(Fp_, f0 + FB);
            const matrix_ref<float> rb = state_block(f0, f1);
            const matrix_ref<const float> rc{rb.data, rb.rows, rb.cols, rb.stride};
            gemm_on<A>(rc, gemm_op::none, {w_.vt.data(), nk, T_, T_}, gemm_op::transpose,
                       {w_.dphi.data(), f1 - f0, nk, n});
            if (nk < n)
                for (index_t f = 0; f < f1 - f0; ++f) std::fill_n(w_.dphi.data() + f * n + nk, n - nk, 0.0f);
            feature_chain<A>(ft_, f0, f1, w_.dphi.data(), n, false, w_.xt.data(), w_.dxt.data());
            build_features<A>(w_.xt.data(), n, ft_, f0, f1, false, w_.phi.data());
            // d_V^T (Dv x nk) rather than d_V: the transposed operand is then R's Dv columns of the
            // block, not the block's features (half the floats through the transposing pack).
            gemm_on<A>(rc.col_block(0, Dv_), gemm_op::transpose, {w_.phi.data(), f1 - f0, nk, n}, gemm_op::none,
                       {w_.dvt.data(), Dv_, nk, nk}, f0 == 0 ? gemm_mode::assign : gemm_mode::add);
        }
        // The chunk's d_v rows hold nothing yet (the diagonal block adds to them later).
        for (index_t u = 0; u < nk; ++u)
            for (index_t d = 0; d < Dv_; ++d)
                w_.dv[static_cast<std::size_t>((j0 + u) * Dv_ + d)] = w_.dvt[static_cast<std::size_t>(d * nk + u)];
        for (index_t u = 0; u < nk; ++u)
            for (index_t d = 0; d < D_; ++d)
                w_.dk[static_cast<std::size_t>((j0 + u) * D_ + d)] += w_.dxt[static_cast<std::size_t>(d * n + u)];
    }

    // The pairs inside chunk c (causal): the backward tile kernel on the chunk's queries and keys,
    // gradients into scratch and then added to the item's.
    void diagonal_block(index_t c) {
        index_t r0, r1;
        chunk_rows(c, r0, r1);
        const index_t j0 = c * kBackwardChunk, nk = std::min(kBackwardChunk, len_ - j0);
        if (r0 == r1 || nk <= 0) return;
        const attention_shape& s = p_.s;
        const index_t i0 = r0 / G_, n_pos = (r1 - r0) / G_, n_rows = r1 - r0;
        basic_attention_problem<float, float> pc = p_;
        pc.s.len_q = n_pos;
        pc.s.len_k = nk;
        pc.q.data = p_.q.row(0, i0, 0);
        pc.k.data = p_.k.row(0, j0, 0);
        pc.v.data = p_.v.row(0, j0, 0);
        strided_rows_t<float> dout = rows_of(dout_);
        dout.data = dout_.ptr(0, i0, 0);
        const index_t H = s.heads, Hk = s.heads_k;
        // Not cleared: the tile kernel writes every gradient row of this item's heads, the only
        // rows read back below.
        w_.tq.resize(static_cast<std::size_t>(n_pos * H * D_));
        w_.tk.resize(static_cast<std::size_t>(nk * Hk * D_));
        w_.tv.resize(static_cast<std::size_t>(nk * Hk * Dv_));
        backward::gradient_outputs go;
        go.d_q = view<float, 4>(w_.tq.data(), {s.batch, n_pos, H, D_}, {0, H * D_, D_, 1});
        go.d_k = view<float, 4>(w_.tk.data(), {s.batch, nk, Hk, D_}, {0, Hk * D_, D_, 1});
        go.d_v = view<float, 4>(w_.tv.data(), {s.batch, nk, Hk, Dv_}, {0, Hk * Dv_, Dv_, 1});
        go.dq_scale = 1.0f;  // d_q is scaled once, when written
        go.dk_scale = 1.0f;
        constexpr index_t RB = backward::tiles<A>::kBlockRows;
        const index_t rows_pad = (n_rows + RB - 1) / RB * RB;
        w_.lo.assign(static_cast<std::size_t>(rows_pad), 0);
        w_.hi.assign(static_cast<std::size_t>(rows_pad), 0);
        w_.sa.assign(static_cast<std::size_t>(rows_pad), grad_rows::empty_row_a());
        w_.sb.assign(static_cast<std::size_t>(rows_pad), 0.0f);
        for (index_t r = 0; r < n_rows; ++r) {
            const index_t i = i0 + r / G_;
            w_.hi[static_cast<std::size_t>(r)] = std::max<index_t>(0, std::min(i + offset() + 1, len_) - j0);
            w_.sa[static_cast<std::size_t>(r)] = w_.inv[static_cast<std::size_t>(r0 + r)];
            w_.sb[static_cast<std::size_t>(r)] = w_.invd[static_cast<std::size_t>(r0 + r)];
        }
        backward::backward_item<A>(pc, grad_rows{}, b_, hk_, dout, backward::row_stats{w_.sa.data(), w_.sb.data()},
                                   w_.lo.data(), w_.hi.data(), go, w_.buf);
        for (index_t r = 0; r < n_rows; ++r) {
            const float* t = w_.tq.data() + (r / G_) * H * D_ + (hk_ * G_ + r % G_) * D_;
            for (index_t d = 0; d < D_; ++d) w_.dq[static_cast<std::size_t>((r0 + r) * D_ + d)] += t[d];
        }
        for (index_t u = 0; u < nk; ++u) {
            const float* tk = w_.tk.data() + u * Hk * D_ + hk_ * D_;
            const float* tv = w_.tv.data() + u * Hk * Dv_ + hk_ * Dv_;
            for (index_t d = 0; d < D_; ++d) w_.dk[static_cast<std::size_t>((j0 + u) * D_ + d)] += tk[d];
            for (index_t d = 0; d < Dv_; ++d) w_.dv[static_cast<std::size_t>((j0 + u) * Dv_ + d)] += tv[d];
        }
    }

    const basic_attention_problem<float, float>& p_;
    view<const float, 4> out_, dout_;
    backward::gradient_outputs go_;
    float eps_;
    const feature_table& ft_;
    index_t b_ = 0, hk_ = 0, G_ = 1, D_ = 0, Dv_ = 0, T_ = 1, len_ = 0, Fp_ = 0;
    linear_backward_buffers& w_;
};

// The linear-form backward of one call (arguments validated by the caller).
template <class A>
void linear_backward(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
                     const view<const float, 4>& out, const view<const float, 4>& d_out, const view<float, 4>& d_q,
                     const view<float, 4>& d_k, const view<float, 4>& d_v, const attention_shape& s,
                     const taylor_options& opts) {
    basic_attention_problem<float, float> p = make_base_problem(q, k, v, s, opts.causal, opts.key_lengths);
    p.q_scale = resolve_scale(opts.scale, s.dim);
    const feature_table ft(s.dim, tile_traits<A>::kMR);
    const backward::gradient_outputs go{d_q, d_k, d_v};
    parallel_for(opts.pool, s.batch * s.heads_k, [&](std::int64_t it) {
        const index_t b = it / s.heads_k, hk = it % s.heads_k;
        scratch_object<linear_backward_buffers> w;
        linear_backward_item<A> item(p, out, d_out, go, opts.eps, ft, w.get());
        item.run(b, hk);
    });
}

}  // namespace taylor
}  // namespace detail
}  // namespace attnkit
