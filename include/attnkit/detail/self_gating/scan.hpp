// The pieces of the self-gating scan (docs/variants.md section 3), per batch item on a range of
// key/value heads and a range of positions, all heads of the range per position (so q, k, v and
// out are read and written front to back, position-major, as BSHD lays them out).
//
// A running state per query head is (m, z, n[Dv]): m the largest gate so far, z = sum exp(g - m),
// n = sum exp(g - m) v. A new gate above m rescales z and n by exp(m_old - g) (n = n * alpha + v,
// one FMA per element, the same cost as the ordinary update n = p v + n); a gate below m adds
// p = exp(g - m) <= 1. Nothing is ever compared with one global maximum: gates reach 1e3, and
// exp(g - max_all) of an early prefix would underflow to 0 / 0.
//
// States stay (m, z) in float rather than an lse = m + log z: at |g| ~ 1e3 a float lse is off
// by ~6e-5, which would become a relative error of every weight; m itself is exact.
//
// Every function here is ATTNKIT_NOINLINE: each runs over many rows, and one copy of the
// machine code means that every caller in driver.hpp (whichever thread, whichever chunk)
// executes the very same float operations (no call-site-dependent FMA contraction), which is
// what makes results bitwise identical for any thread count.
#pragma once

#include <cmath>
#include <vector>

#include "attnkit/config.hpp"
#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/simd/simd.hpp"

namespace attnkit {
namespace detail {
namespace self_gating {

// One call on float views; row pointers from strides taken once.
struct problem {
    index_t batch = 0, len = 0, heads = 0, heads_kv = 0, group = 1, dim = 0, dim_v = 0;
    index_t dim_vp = 0;  // dim_v rounded up to the lane width: the stride of every n[] row
    strided_rows q, k, v;
    float* out = nullptr;
    index_t ob = 0, ol = 0, oh = 0;
    float scale = 1.0f;
    bool causal = false;
    bool stream = false;                // non-temporal stores of the final output rows
    std::vector<index_t> visible;       // per batch item: tokens [0, visible[b]) are unmasked

    float* out_row(index_t b, index_t l, index_t h) const { return out + b * ob + l * ol + h * oh; }
};

// Per-head states of a range of query heads: m[nh], z[nh], n[nh][dim_vp]. z == 0 means empty
// (a state that has seen a token has z >= 1: its max contributes exp(0)).
struct states {
    std::vector<float> m, z, n;
    void resize(index_t nh, index_t dvp) {
        m.assign(static_cast<std::size_t>(nh), -HUGE_VALF);
        z.assign(static_cast<std::size_t>(nh), 0.0f);
        n.assign(static_cast<std::size_t>(nh * dvp), 0.0f);
    }
    void clear() {
        std::fill(m.begin(), m.end(), -HUGE_VALF);
        std::fill(z.begin(), z.end(), 0.0f);
        std::fill(n.begin(), n.end(), 0.0f);
    }
};

// A state (or the states of a range of heads) held elsewhere: m[nh], z[nh], n[nh][dim_vp].
struct state_ref {
    float* m;
    float* z;
    float* n;
};
inline state_ref ref(states& st) { return {st.m.data(), st.z.data(), st.n.data()}; }

// A destination of rows: row l (relative to the first row of the call), head hh (relative to
// the first head of the range) at base + l * sl + hh * sh.
struct row_dest {
    float* base = nullptr;
    index_t sl = 0, sh = 0;
    float* row(index_t l, index_t hh) const { return base + l * sl + hh * sh; }
};

// Stores dim_v floats of x * s (x padded to the lane width) at dst; streamed when asked for
// and dst is vector-aligned, so that rows written once skip the read-for-ownership.
template <class A>
ATTNKIT_ALWAYS_INLINE void store_scaled(float* dst, const float* x, float s, index_t dim_v, bool stream) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const V sv(s);
    index_t c = 0;
    if (stream && simd::stream_aligned<A>(dst)) {
        for (; c + W <= dim_v; c += W) simd::stream_store(dst + c, simd::loadu<A>(x + c) * sv);
    } else {
        for (; c + W <= dim_v; c += W) simd::storeu(dst + c, simd::loadu<A>(x + c) * sv);
    }
    if (c < dim_v) simd::store_partial(dst + c, simd::loadu<A>(x + c) * sv, dim_v - c);
}

// Scans positions [l0, l1) of item b for key/value heads [hk0, hk1), continuing the states st
// (query heads hk0 * G .. hk1 * G). With a destination, row l of head h gets the local output
// n / z and mz[2 * ((l - l0) * nh + hh)] its (m, z); without, only the states advance.
template <class A>
ATTNKIT_NOINLINE void scan_rows(const problem& p, index_t b, index_t hk0, index_t hk1, index_t l0, index_t l1,
                                states& st, const row_dest* dst, float* mz, bool stream) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    // Positions prefetched ahead of the hardware streams (16: measured as good as none or 4 on
    // Zen 2, where the L2 streamer already follows four sequential streams; a hint elsewhere).
    constexpr index_t kAhead = 16;
    const index_t G = p.group, nh = (hk1 - hk0) * G, dv = p.dim_v, dvp = p.dim_vp, D = p.dim;
    const index_t h0 = hk0 * G;
    for (index_t l = l0; l < l1; ++l) {
        if (l + kAhead < l1) {
            for (index_t hk = hk0; hk < hk1; ++hk) {
                const float* kn = p.k.row(b, l + kAhead, hk);
                const float* vn = p.v.row(b, l + kAhead, hk);
                for (index_t c = 0; c < D; c += 16) ATTNKIT_PREFETCH(kn + c);
                for (index_t c = 0; c < dv; c += 16) ATTNKIT_PREFETCH(vn + c);
                for (index_t g = 0; g < G; ++g) {
                    const float* qn = p.q.row(b, l + kAhead, hk * G + g);
                    for (index_t c = 0; c < D; c += 16) ATTNKIT_PREFETCH(qn + c);
                }
            }
        }
        for (index_t hk = hk0; hk < hk1; ++hk) {
            const float* kr = p.k.row(b, l, hk);
            const float* vr = p.v.row(b, l, hk);
            for (index_t g = 0; g < G; ++g) {
                const index_t h = hk * G + g, hh = h - h0;
                const float gate = p.scale * simd::dot<A>(p.q.row(b, l, h), kr, D);
                float* n = st.n.data() + hh * dvp;
                float m = st.m[hh], z = st.z[hh];
                if (gate > m) {
                    // New maximum (also the first token: exp(-inf) = 0): n = alpha n + v.
                    const float alpha_s = std::exp(m - gate);
                    const V alpha(alpha_s);
                    index_t c = 0;
                    for (; c + W <= dv; c += W) simd::storeu(n + c, simd::fma(simd::loadu<A>(n + c), alpha, simd::loadu<A>(vr + c)));
                    if (c < dv) simd::storeu(n + c, simd::fma(simd::loadu<A>(n + c), alpha, simd::load_partial<A>(vr + c, dv - c)));
                    z = z * alpha_s + 1.0f;
                    m = gate;
                } else {
                    // Below the maximum, or NaN (propagates through p into z and n). A gate of
                    // -inf weighs 0 even while the state is empty (exp(-inf - -inf) is NaN).
                    const float pj = gate == -HUGE_VALF ? 0.0f : std::exp(gate - m);
                    const V pv(pj);
                    index_t c = 0;
                    for (; c + W <= dv; c += W) simd::storeu(n + c, simd::fma(pv, simd::loadu<A>(vr + c), simd::loadu<A>(n + c)));
                    if (c < dv) simd::storeu(n + c, simd::fma(pv, simd::load_partial<A>(vr + c, dv - c), simd::loadu<A>(n + c)));
                    z += pj;
                }
                st.m[hh] = m;
                st.z[hh] = z;
                if (dst) {
                    store_scaled<A>(dst->row(l - l0, hh), n, z == 0.0f ? 0.0f : 1.0f / z, dv, stream);
                    mz[2 * ((l - l0) * nh + hh)] = m;
                    mz[2 * ((l - l0) * nh + hh) + 1] = z;
                }
            }
        }
    }
}

// a := a (+) b, the exact combination of two states over disjoint token sets (b after a).
inline ATTNKIT_NOINLINE void merge_state(float& ma, float& za, float* na, float mb, float zb, const float* nb,
                                         index_t dvp) {
    if (zb == 0.0f) return;
    if (za == 0.0f) {
        ma = mb;
        za = zb;
        for (index_t c = 0; c < dvp; ++c) na[c] = nb[c];
        return;
    }
    const float mx = ma > mb ? ma : mb;
    const float ea = std::exp(ma - mx), eb = std::exp(mb - mx);
    for (index_t c = 0; c < dvp; ++c) na[c] = na[c] * ea + nb[c] * eb;
    za = za * ea + zb * eb;
    ma = mx;
}

// Final rows from local ones: row l of head h is (o_loc, m, z) of its chunk's tokens up to l
// (src, mz as scan_rows wrote them) combined with the prefix state pre of everything before
// the chunk: o = (z e^(m - M) o_loc + e^(m_pre - M) n_pre) / (z e^(m - M) + z_pre e^(m_pre - M)).
// Heads whose prefix is empty keep o_loc (copied when src != dst).
template <class A>
ATTNKIT_NOINLINE void fix_rows(const problem& p, index_t hk0, index_t hk1, index_t n_rows, const state_ref& pre,
                               const row_dest& src, const float* mz, const row_dest& dst, bool stream) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const index_t nh = (hk1 - hk0) * p.group, dv = p.dim_v, dvp = p.dim_vp;
    for (index_t r = 0; r < n_rows; ++r) {
        for (index_t hh = 0; hh < nh; ++hh) {
            const float* o = src.row(r, hh);
            float* d = dst.row(r, hh);
            const float zp = pre.z[hh];
            if (zp == 0.0f) {
                if (o != d)
                    for (index_t c = 0; c < dv; ++c) d[c] = o[c];
                continue;
            }
            const float m = mz[2 * (r * nh + hh)], z = mz[2 * (r * nh + hh) + 1], mp = pre.m[hh];
            const float mx = m > mp ? m : mp;
            const float el = z * std::exp(m - mx), ep = std::exp(mp - mx);
            const float inv = 1.0f / (el + zp * ep);
            const V a(el * inv), bp(ep * inv);
            const float* np = pre.n + hh * dvp;
            index_t c = 0;
            if (stream && simd::stream_aligned<A>(d)) {
                for (; c + W <= dv; c += W)
                    simd::stream_store(d + c, simd::fma(simd::loadu<A>(np + c), bp, simd::loadu<A>(o + c) * a));
            } else {
                for (; c + W <= dv; c += W)
                    simd::storeu(d + c, simd::fma(simd::loadu<A>(np + c), bp, simd::loadu<A>(o + c) * a));
            }
            if (c < dv)
                simd::store_partial(d + c, simd::fma(simd::loadu<A>(np + c), bp, simd::load_partial<A>(o + c, dv - c) * a),
                                    dv - c);
        }
    }
}

// Rows [l0, l1) of item b, heads of [hk0, hk1), all equal to the state's mean n / z (zeros
// for an empty state): the non-causal output, and causal rows past the visible tokens.
template <class A>
ATTNKIT_NOINLINE void fill_rows(const problem& p, index_t b, index_t hk0, index_t hk1, index_t l0, index_t l1,
                                const state_ref& st, bool stream) {
    const index_t nh = (hk1 - hk0) * p.group, h0 = hk0 * p.group;
    for (index_t l = l0; l < l1; ++l)
        for (index_t hh = 0; hh < nh; ++hh) {
            const float z = st.z[hh];
            store_scaled<A>(p.out_row(b, l, h0 + hh), st.n + hh * p.dim_vp, z == 0.0f ? 0.0f : 1.0f / z,
                            p.dim_v, stream);
        }
}

}  // namespace self_gating
}  // namespace detail
}  // namespace attnkit
