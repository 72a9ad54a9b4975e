// One work item of multi-token attention: a block of query rows of one batch item, all heads
// together (head mixing couples them). Per key block (blocks above the causal diagonal skipped):
//
//   build_y      X = Mask0(scores) on the micro-kernels, for the block's rows plus the c_q - 1
//                halo rows and (c_k - 1) / 2 halo keys each side; Y = KQConv(X); Y = HeadMix(Y)
//   pass_a       online softmax of Y per head; with values (one pass) or only the row statistics
//   pass_b       rebuilds Y for c_q - 1 more halo rows and keys, P = 2^(Y - lse), post
//                convolution + Mask0, head mixing (when it cannot move to the outputs), P V
//   epilogue     normalisation, head mixing of the outputs, group norm, depth scale, gate
//
// The L x L matrices never exist: a work item holds a few tiles of [heads, rows, keys].
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attnkit/detail/micro_kernels.hpp"
#include "attnkit/detail/mta/epilogue.hpp"
#include "attnkit/detail/mta/plan.hpp"
#include "attnkit/detail/mta/tile_ops.hpp"

namespace attnkit {
namespace detail {
namespace mta {

template <class A>
class block_kernel {
    using TT = tile_traits<A>;
    using V = simd::vfloat<A>;
    static constexpr index_t RT = TT::kTileRows;
    static constexpr int kNR = TT::kNR;

   public:
    block_kernel(const plan& pl, const problem& pr, float* buf)
        : p_(pl), pr_(pr), buf_(buf), yh_(pl.H), spare_(pl.H), in_(pl.H) {}

    // Rows [i0, i1) of batch item b.
    void run(index_t b, index_t i0, index_t i1, bool stats_only) {
        if (stats_only || !p_.two_pass)
            pass_a(b, i0, i1, stats_only);
        else
            pass_b(b, i0, i1);
    }

   private:
    const plan& p_;
    const problem& pr_;
    float* buf_;
    std::vector<float*> yh_;        // per head: the current Y (or P, Z) tile
    std::vector<float*> spare_;     // per head: the other tile set, for head mixing
    std::vector<const float*> in_;  // per head (or group member): inputs of a mix or convolution
    bool in_mixed_ = false;
    bool v_finite_ = true;
    index_t k_loaded_ = -1, v_loaded_ = -1, v_key0_ = -1;

    float* at(index_t off) const { return buf_ + off; }

    // Q^T panels of every head for rows [r0, r0 + np * RT), scaled; rows outside [0, L) are 0.
    void pack_q(index_t b, index_t r0, index_t np) {
        float* qt = at(p_.at.q_transposed);
        for (index_t h = 0; h < p_.H; ++h)
            for (index_t r = 0; r < np * RT; ++r) {
                float* dst = qt + (h * np + r / RT) * p_.D * RT + r % RT;
                const index_t i = r0 + r;
                if (i < 0 || i >= p_.L) {
                    for (index_t d = 0; d < p_.D; ++d) dst[d * RT] = 0.0f;
                } else {
                    const float* src = pr_.q.row(b, i, h);
                    for (index_t d = 0; d < p_.D; ++d) dst[d * RT] = src[d] * p_.q_scale;
                }
            }
    }

    // Scores of head h for keys [kv0, kv0 + nv) against Q^T panel px of np_q panels, into st.
    void scores(index_t b, index_t h, index_t kv0, index_t nv, index_t np_q, index_t px, float* st) {
        const index_t kvh = h / p_.group;
        float* kp = at(p_.at.k_tile);
        if (k_loaded_ != kvh) {  // one key range per build_y: the K tile is reused across its heads
            copy_rows(pr_.k.row(b, kv0, kvh), pr_.k.sl, nv, p_.D, p_.D, kp);
            k_loaded_ = kvh;
        }
        V mx[kNR];
        for (auto& x : mx) x = V(kNegInf);
        scores_panel<A>(kp, nv, at(p_.at.q_transposed) + (h * np_q + px) * p_.D * RT, p_.D, st, mx);
    }

    // Y for rows [yr0, yr0 + y_panels * RT) and keys [ka, ka + nk) of every head, in panel layout
    // (key stride y_keys); leaves yh_ pointing at it. Keys outside [0, L) and above every row
    // are left unset (every consumer masks them).
    void build_y(index_t b, index_t yr0, index_t y_panels, index_t x_panels, index_t ka, index_t nk) {
        const index_t H = p_.H, y_keys = p_.at.y_keys;
        const index_t kend = std::min(p_.L, yr0 + y_panels * RT);
        for (index_t h = 0; h < H; ++h) yh_[h] = at(p_.at.y) + h * y_panels * y_keys * RT;
        in_mixed_ = false;
        k_loaded_ = -1;
        if (p_.pre.on()) {
            const index_t G = p_.pre.groups, cq = p_.pre.c_q, ck = p_.pre.c_k;
            const index_t kx0 = ka - p_.pre_halo_keys, nx = round_up(nk, kConvKeys<A>) + ck - 1;
            const index_t xr0 = yr0 - p_.pre_halo_rows, rs = x_panels * RT;
            const index_t v0 = std::max<index_t>(kx0, 0), v1 = std::min(kx0 + nx, kend), nv = v1 - v0;
            const float** in = in_.data();
            for (index_t g0 = 0; g0 < H; g0 += G) {
                for (index_t m = 0; m < G; ++m) {
                    float* xw = at(p_.at.x_wide) + m * p_.at.x_keys * p_.at.x_wide_stride;
                    in[m] = xw;
                    const index_t z0 = std::min(nx, std::max<index_t>(v0 - kx0, 0));
                    std::fill(xw, xw + z0 * rs, 0.0f);
                    if (nv <= 0) {
                        std::fill(xw, xw + nx * rs, 0.0f);
                        continue;
                    }
                    std::fill(xw + (v1 - kx0) * rs, xw + nx * rs, 0.0f);
                    float* st = at(p_.at.score_panel);
                    for (index_t px = 0; px < x_panels; ++px) {
                        scores(b, g0 + m, v0, nv, x_panels, px, st);
                        scatter_mask0<A>(st, nv, v0, xr0 + px * RT, xw + (v0 - kx0) * rs, rs, px * RT);
                    }
                }
                for (index_t m = 0; m < G; ++m) {
                    const index_t h = g0 + m;
                    conv_panels<A>(in, rs, p_.w->kq_pre.data() + h * G * cq * ck,
                                   p_.kq_pre_packed.data() + h * p_.kq_pre_packed_head, G, cq, ck, nk, y_panels, ka,
                                   yr0, false, yh_[h], y_keys);
                }
            }
        } else {
            const index_t v0 = std::max<index_t>(ka, 0), v1 = std::min(ka + nk, kend), nv = v1 - v0;
            if (nv > 0)
                for (index_t h = 0; h < H; ++h)
                    for (index_t px = 0; px < y_panels; ++px)
                        scores(b, h, v0, nv, y_panels, px, yh_[h] + px * y_keys * RT + (v0 - ka) * RT);
        }
        if (p_.head_pre) mix(p_.w->head_pre.data(), y_panels, nk);
    }

    // Head mixing from the current tile set into the other one (same per-head offsets), over the
    // first nk keys of each of np panels.
    void mix(const float* w, index_t np, index_t nk) {
        float* cur = at(in_mixed_ ? p_.at.y_mixed : p_.at.y);
        float* other = at(in_mixed_ ? p_.at.y : p_.at.y_mixed);
        const index_t n = nk * RT;
        for (index_t pnl = 0; pnl < np; ++pnl) {
            const index_t off = pnl * p_.at.y_keys * RT;
            for (index_t h = 0; h < p_.H; ++h) {
                in_[h] = yh_[h] + off;
                spare_[h] = other + (yh_[h] - cur) + off;
            }
            head_mix<A>(in_.data(), spare_.data(), w, p_.H, n);
        }
        for (index_t h = 0; h < p_.H; ++h) yh_[h] = other + (yh_[h] - cur);
        in_mixed_ = !in_mixed_;
    }

    // The V tile of key/value head kvh for keys [j0, j0 + n), and whether it is all finite.
    const float* v_tile(index_t b, index_t kvh, index_t j0, index_t n) {
        float* vp = at(p_.at.v_tile);
        if (v_loaded_ != kvh || v_key0_ != j0) {
            copy_rows(pr_.v.row(b, j0, kvh), pr_.v.sl, n, p_.Dv, p_.at.dv_pad, vp);
            v_finite_ = all_finite<A>(vp, n * p_.at.dv_pad);
            v_loaded_ = kvh;
            v_key0_ = j0;
        }
        return vp;
    }

    // O^T panel of head h, rows row0 .. row0 + RT, += the weights pt [n][RT] of keys j0 .. j0 + n
    // times V (alpha: the factor for what it holds so far). A key a row does not see carries the
    // weight 0, and 0 * Inf = NaN: when some row of the panel does not see every key and the V
    // tile holds a non-finite value, the guarded product skips each row's unseen keys, so that
    // the value stays in the rows that see it. Finite tiles (the common case) take the plain one.
    void add_values(index_t b, index_t h, index_t j0, index_t nk, index_t n, index_t row0, const float* pt,
                    const V* alpha, float* ot_panel) {
        const float* vp = v_tile(b, h / p_.group, j0, nk);
        if (j0 + n - 1 > row0 && !v_finite_) {
            alignas(64) float lo[RT], hi[RT];
            for (index_t r = 0; r < RT; ++r) lo[r] = static_cast<float>(j0), hi[r] = static_cast<float>(row0 + r + 1);
            values_panel<A, true>(vp, p_.at.dv_pad, n, pt, alpha, ot_panel, j0, lo, hi);
        } else {
            values_panel<A>(vp, p_.at.dv_pad, n, pt, alpha, ot_panel);
        }
    }

    void zero_outputs() {
        float* o = at(p_.at.out_transposed);
        std::fill(o, o + p_.H * p_.at.out_panels * RT * p_.at.dv_pad, 0.0f);
    }

    float* ot(index_t h, index_t pnl) const {
        return at(p_.at.out_transposed) + (h * p_.at.out_panels + pnl) * p_.at.dv_pad * RT;
    }

    void pass_a(index_t b, index_t i0, index_t i1, bool stats_only) {
        const index_t R = i1 - i0, out_panels = (R + RT - 1) / RT;
        const index_t x_panels = p_.pre.on() ? (out_panels * RT + p_.pre_halo_rows + RT - 1) / RT : out_panels;
        pack_q(b, i0 - p_.pre_halo_rows * (p_.pre.on() ? 1 : 0), x_panels);
        float* m = at(p_.at.row_max);
        float* l = at(p_.at.row_sum);
        std::fill(m, m + p_.H * p_.at.out_panels * RT, kNegInf);
        std::fill(l, l + p_.H * p_.at.out_panels * RT, 0.0f);
        zero_outputs();
        for (index_t j0 = 0; j0 < i1; j0 += p_.block_keys) {
            const index_t nk = std::min(p_.block_keys, i1 - j0);
            build_y(b, i0, out_panels, x_panels, j0, nk);
            v_key0_ = -1;
            for (index_t h = 0; h < p_.H; ++h)
                for (index_t pnl = 0; pnl < out_panels; ++pnl) {
                    const index_t row0 = i0 + pnl * RT, n = std::min(nk, row0 + RT - j0);
                    if (n <= 0) continue;
                    V alpha[kNR];
                    float* y = yh_[h] + pnl * p_.at.y_keys * RT;
                    const index_t so = (h * p_.at.out_panels + pnl) * RT;
                    online_softmax<A>(y, n, j0, row0, m + so, l + so, alpha);
                    if (!stats_only) add_values(b, h, j0, nk, n, row0, y, alpha, ot(h, pnl));
                }
        }
        if (stats_only) {
            for (index_t r = 0; r < R; ++r)
                for (index_t h = 0; h < p_.H; ++h) {
                    const index_t so = h * p_.at.out_panels * RT + r;
                    pr_.stats[(b * p_.L + i0 + r) * p_.H + h] = m[so] + std::log2(l[so]);
                }
            return;
        }
        epilogue(b, i0, R, l);
    }

    void pass_b(index_t b, index_t i0, index_t i1) {
        const index_t R = i1 - i0, out_panels = (R + RT - 1) / RT, yr0 = i0 - p_.post_halo_rows;
        const index_t y_panels = (out_panels * RT + p_.post_halo_rows + RT - 1) / RT;
        const index_t x_panels = p_.pre.on() ? (y_panels * RT + p_.pre_halo_rows + RT - 1) / RT : y_panels;
        pack_q(b, yr0 - (p_.pre.on() ? p_.pre_halo_rows : 0), x_panels);
        float* lse = at(p_.at.row_lse);
        for (index_t h = 0; h < p_.H; ++h)
            for (index_t r = 0; r < y_panels * RT; ++r) {
                const index_t i = yr0 + r;
                lse[h * y_panels * RT + r] = (i >= 0 && i < i1) ? pr_.stats[(b * p_.L + i) * p_.H + h] : 0.0f;
            }
        zero_outputs();
        V one[kNR];
        for (auto& x : one) x = V(1.0f);
        for (index_t j0 = 0; j0 < i1; j0 += p_.block_keys) {
            const index_t nk = std::min(p_.block_keys, i1 - j0);
            if (p_.post.on()) {
                const index_t G = p_.post.groups, cq = p_.post.c_q, ck = p_.post.c_k;
                const index_t ka = j0 - p_.post_halo_keys, ny = round_up(nk, kConvKeys<A>) + ck - 1;
                build_y(b, yr0, y_panels, x_panels, ka, ny);
                const float** in = in_.data();
                for (index_t g0 = 0; g0 < p_.H; g0 += G) {
                    for (index_t mm = 0; mm < G; ++mm) {
                        const index_t hh = g0 + mm;
                        float* pw = at(p_.at.p_wide) + mm * p_.at.y_keys * p_.at.p_wide_stride;
                        in[mm] = pw;
                        for (index_t pnl = 0; pnl < y_panels; ++pnl)
                            probabilities<A>(yh_[hh] + pnl * p_.at.y_keys * RT, ny, ka, yr0 + pnl * RT,
                                             lse + hh * y_panels * RT + pnl * RT, pw + pnl * RT, y_panels * RT);
                    }
                    for (index_t mm = 0; mm < G; ++mm) {
                        const index_t h = g0 + mm;
                        conv_panels<A>(in, y_panels * RT, p_.w->kq_post.data() + h * G * cq * ck,
                                       p_.kq_post_packed.data() + h * p_.kq_post_packed_head, G, cq, ck, nk,
                                       out_panels, j0, i0, true, yh_[h], p_.at.y_keys);
                    }
                }
            } else {
                build_y(b, i0, out_panels, x_panels, j0, nk);
                for (index_t h = 0; h < p_.H; ++h)
                    for (index_t pnl = 0; pnl < out_panels; ++pnl) {
                        float* y = yh_[h] + pnl * p_.at.y_keys * RT;
                        probabilities<A>(y, nk, j0, i0 + pnl * RT, lse + h * y_panels * RT + pnl * RT, y, RT);
                    }
            }
            if (p_.head_post && !p_.mix_outputs) mix(p_.w->head_post.data(), out_panels, nk);
            v_key0_ = -1;
            for (index_t h = 0; h < p_.H; ++h)
                for (index_t pnl = 0; pnl < out_panels; ++pnl) {
                    const index_t row0 = i0 + pnl * RT, n = std::min(nk, row0 + RT - j0);
                    if (n <= 0) continue;
                    add_values(b, h, j0, nk, n, row0, yh_[h] + pnl * p_.at.y_keys * RT, one, ot(h, pnl));
                }
        }
        epilogue(b, i0, R, nullptr);
    }

    void epilogue(index_t b, index_t i0, index_t R, const float* l) {
        write_rows<RT>(p_, pr_, b, i0, R, at(p_.at.out_transposed), l, at(p_.at.out_rows));
    }
};

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
