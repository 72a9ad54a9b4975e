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
// Every function here is ATTNKIT_NOINLINE (the always-inline pieces of head_ops.hpp are inlined
// into them only): each runs over many rows, and one copy of the machine code means that every
// caller in driver.hpp (whichever thread, whichever chunk) executes the very same float
// operations (no call-site-dependent FMA contraction), which is what makes results bitwise
// identical for any thread count. A row made during the scan and a row fixed later from a
// buffer go through the same operations on the same values (update_head, fix_weights).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnkit/config.hpp"
#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/detail/self_gating/head_ops.hpp"
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
    const index_t* visible = nullptr;   // per batch item: tokens [0, visible[b]) are unmasked
    float* lse = nullptr;               // optional [B, L, H], any strides: log sum exp(g) of each row
    index_t lb = 0, ll = 0, lh = 0;

    float* out_row(index_t b, index_t l, index_t h) const { return out + b * ob + l * ol + h * oh; }
};

// lse[b, l, h0 + hh] of the nh heads of a final row made from a state (m, z) alone (a fill):
// log-sum-exp of the gates it sees, -inf where it sees none (z = 0). Rows combined with a
// prefix get theirs from fix_weights, which combines them; each way has one function, so a row
// has the same bits whichever thread made it.
inline ATTNKIT_NOINLINE void store_lse(const problem& p, index_t b, index_t l, index_t h0, index_t nh, const float* m,
                                       const float* z) {
    for (index_t hh = 0; hh < nh; ++hh)
        p.lse[b * p.lb + l * p.ll + (h0 + hh) * p.lh] = z[hh] == 0.0f ? -HUGE_VALF : m[hh] + std::log(z[hh]);
}

inline float* lse_row(const problem& p, index_t b, index_t l, index_t h0) {
    return p.lse ? p.lse + b * p.lb + l * p.ll + h0 * p.lh : nullptr;
}

// Per-head states of a range of query heads: m[nh], z[nh], n[nh][dim_vp]. z == 0 means empty
// (a state that has seen a token has z >= 1: its max contributes exp(0)). The other arrays are
// per-position scratch of scan_rows, one float per head: the gates, the exponential of the
// update, whether it raised the max, 1 / z, and the weights of a fixed row.
struct states {
    std::vector<float> m, z, n;
    std::vector<float> gate, e, up, inv_z, wa, wb;
    std::vector<index_t> kv_head;  // of each query head of the range: integer division once per scan
    void resize(index_t nh, index_t dvp) {
        kv_head.assign(static_cast<std::size_t>(nh), 0);
        m.assign(static_cast<std::size_t>(nh), -HUGE_VALF);
        z.assign(static_cast<std::size_t>(nh), 0.0f);
        n.assign(static_cast<std::size_t>(nh * dvp), 0.0f);
        for (std::vector<float>* a : {&gate, &e, &up, &inv_z, &wa, &wb}) a->assign(static_cast<std::size_t>(nh), 0.0f);
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

// gate[hh] = scale <q, k> of the nh heads from h0 at position l: W heads at a time, one
// accumulator each, reduced together (hsum_each) instead of one horizontal sum per head.
template <class A>
ATTNKIT_ALWAYS_INLINE void gates_at(const problem& p, index_t b, index_t l, index_t h0, index_t nh,
                                    const index_t* kv_head, float* gate) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const index_t D = p.dim;
    for (index_t hh = 0; hh < nh; hh += W) {
        const index_t cnt = std::min(W, nh - hh);
        const float* qr[W];
        const float* kr[W];
#pragma GCC unroll 16
        for (index_t j = 0; j < W; ++j) {
            const index_t jj = hh + std::min(j, cnt - 1);  // spare lanes repeat the last head
            qr[j] = p.q.row(b, l, h0 + jj);
            kr[j] = p.k.row(b, l, kv_head[jj]);
        }
        // W accumulators held in registers (the loops over j fully unrolled).
        V acc[W];
#pragma GCC unroll 16
        for (index_t j = 0; j < W; ++j) acc[j] = V(0.0f);
        // Two chains per head, so that one head's FMA latency does not serialise its dot.
#pragma GCC unroll 16
        for (index_t j = 0; j < W; ++j) {
            V acc1(0.0f);
            index_t c = 0;
            for (; c + 2 * W <= D; c += 2 * W) {
                acc[j] = simd::fma(simd::loadu<A>(qr[j] + c), simd::loadu<A>(kr[j] + c), acc[j]);
                acc1 = simd::fma(simd::loadu<A>(qr[j] + c + W), simd::loadu<A>(kr[j] + c + W), acc1);
            }
            for (; c + W <= D; c += W) acc[j] = simd::fma(simd::loadu<A>(qr[j] + c), simd::loadu<A>(kr[j] + c), acc[j]);
            if (c < D)
                acc[j] = simd::fma(simd::load_partial<A>(qr[j] + c, D - c), simd::load_partial<A>(kr[j] + c, D - c), acc[j]);
            acc[j] = acc[j] + acc1;
        }
        store_heads<A>(gate + hh, simd::hsum_each(acc) * V(p.scale), cnt);
    }
}

// Whether the last row a position stores (its last head) shares low 12 address bits with the
// first q or k row that the next position's gates load. Those loads come right after the
// stores, and a load that 4 KiB-aliases a pending streamed store waits for it: with q 128 bytes
// above that row's 4 KiB offset a call took 1.05 ms instead of 0.6 (Zen 2, L = 2048, D = 64,
// H = 8); make_problem then stores the rows through the cache (0.79 ms there; loading the
// gates in the other head order helped that placement but made others worse). Checked at
// position 0 of item 0: the offsets repeat at every position when out, q and k advance by the
// same bytes per position modulo 4 KiB.
inline bool last_row_meets_next_gates(const problem& p) {
    if (p.len < 2 || p.heads == 0) return false;
    const auto at = [](const float* x) { return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(x) & 4095u); };
    const std::int64_t row = at(p.out_row(0, 0, p.heads - 1));
    const std::int64_t store_bytes = 4 * p.dim_v, load_bytes = 4 * p.dim;
    for (const float* next : {p.q.row(0, 1, 0), p.k.row(0, 1, 0)}) {
        const std::int64_t d = ((row - at(next)) % 4096 + 4096) % 4096;  // the stores start d above the loads
        if (d < load_bytes || d > 4096 - store_bytes) return true;      // [d, d + store) meets [0, load) mod 4 KiB
    }
    return false;
}

// Scans positions [l0, l1) of item b for key/value heads [hk0, hk1), continuing the states st
// (query heads hk0 * G .. hk1 * G). Without a destination only the states advance. With one
// and no prefix (the buffered rows of a chunk whose prefix is not known yet), row l of head hh
// gets the raw n and mz the row's m[nh] then z[nh] at mz + 2 nh (l - l0). With a prefix state
// pre as well (every token before l0, already known) the rows are final, n combined with pre
// on the spot exactly as fix_rows would combine it later: the output is written once,
// interleaved with the reads of q, k and v (no buffer, no mz).
template <class A>
ATTNKIT_NOINLINE void scan_rows(const problem& p, index_t b, index_t hk0, index_t hk1, index_t l0, index_t l1,
                                states& st, const row_dest* dst, float* mz, bool stream,
                                const state_ref* pre = nullptr) {
    constexpr index_t kAhead = 1;
    const index_t G = p.group, nh = (hk1 - hk0) * G, dv = p.dim_v, dvp = p.dim_vp;
    const index_t h0 = hk0 * G;
    float *const m = st.m.data(), *const z = st.z.data(), *const e = st.e.data(), *const up = st.up.data();
    index_t* const kv_head = st.kv_head.data();
    for (index_t hh = 0; hh < nh; ++hh) kv_head[hh] = (h0 + hh) / G;
    for (index_t l = l0; l < l1; ++l) {
        // The next position's q, k and v, one hint per line, issued once this position's gates
        // have their q and k: each position's rows start new 4 KiB pages, where the hardware
        // streams stop. Measured on Zen 2 (L = 32768, D = 128, H = 8, 1 thread), per position:
        // 0.86 us with the hints here, 0.97 before the gates, 0.93 after the rows, 1.03 without
        // any, 1.07 with every other line only; 2, 4, 16 or 32 positions ahead no better.
        gates_at<A>(p, b, l, h0, nh, kv_head, st.gate.data());
        if (l + kAhead < l1) {
            for (index_t hk = hk0; hk < hk1; ++hk) {
                const float* kn = p.k.row(b, l + kAhead, hk);
                const float* vn = p.v.row(b, l + kAhead, hk);
                for (index_t c = 0; c < p.dim; c += 16) ATTNKIT_PREFETCH(kn + c);
                for (index_t c = 0; c < dv; c += 16) ATTNKIT_PREFETCH(vn + c);
                for (index_t g = 0; g < G; ++g) {
                    const float* qn = p.q.row(b, l + kAhead, hk * G + g);
                    for (index_t c = 0; c < p.dim; c += 16) ATTNKIT_PREFETCH(qn + c);
                }
            }
        }
        // The state scalars of every head at once (advance_states); then n = n e + v where the
        // gate raised the max, n += e v elsewhere.
        advance_states<A>(st.gate.data(), m, z, e, up, nh);
        if (dst && !pre) {
            float* mzr = mz + 2 * nh * (l - l0);
            std::copy(m, m + nh, mzr);
            std::copy(z, z + nh, mzr + nh);
        } else if (dst) {
            inverse_sums<A>(z, nh, st.inv_z.data());
            fix_weights<A>(m, z, pre->m, pre->z, nh, st.wa.data(), st.wb.data(), lse_row(p, b, l, h0), p.lh);
        }
        for (index_t hh = 0; hh < nh; ++hh) {
            const float* vr = p.v.row(b, l, kv_head[hh]);
            float* n = st.n.data() + hh * dvp;
            const bool raise = up[hh] != 0.0f;
            if (!dst) {
                update_head<A, row_kind::none>(raise, n, vr, e[hh], dv, nullptr, 0.0f, nullptr, 0.0f, false);
                continue;
            }
            float* d = dst->row(l - l0, hh);
            if (!pre)
                update_head<A, row_kind::raw>(raise, n, vr, e[hh], dv, d, 0.0f, nullptr, 0.0f, false);
            else if (pre->z[hh] == 0.0f)
                update_head<A, row_kind::scaled>(raise, n, vr, e[hh], dv, d, st.inv_z[hh], nullptr, 0.0f, stream);
            else
                update_head<A, row_kind::fixed>(raise, n, vr, e[hh], dv, d, st.wa[hh], pre->n + hh * dvp, st.wb[hh],
                                                stream);
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

// Final rows from buffered ones: row r of head hh is the raw n of its chunk's tokens up to
// that row, with its m and z in mz (as scan_rows wrote them), combined with the prefix state
// pre of everything before the chunk (fix_weights). Heads whose prefix is empty get n / z.
// st provides the per-head scratch; the rows are positions l0 + r of item b (for lse).
template <class A>
ATTNKIT_NOINLINE void fix_rows(const problem& p, index_t b, index_t l0, index_t hk0, index_t hk1, index_t n_rows,
                               const state_ref& pre, const row_dest& src, const float* mz, const row_dest& dst,
                               states& st, bool stream) {
    const index_t nh = (hk1 - hk0) * p.group, dv = p.dim_v, dvp = p.dim_vp;
    for (index_t r = 0; r < n_rows; ++r) {
        const float* m = mz + 2 * nh * r;
        const float* z = m + nh;
        inverse_sums<A>(z, nh, st.inv_z.data());
        fix_weights<A>(m, z, pre.m, pre.z, nh, st.wa.data(), st.wb.data(), lse_row(p, b, l0 + r, hk0 * p.group), p.lh);
        for (index_t hh = 0; hh < nh; ++hh) {
            if (pre.z[hh] == 0.0f)
                store_row<A, row_kind::scaled>(dst.row(r, hh), src.row(r, hh), st.inv_z[hh], nullptr, 0.0f, dv, stream);
            else
                store_row<A, row_kind::fixed>(dst.row(r, hh), src.row(r, hh), st.wa[hh], pre.n + hh * dvp, st.wb[hh], dv,
                                              stream);
        }
    }
}

// Rows [l0, l1) of item b, heads of [hk0, hk1), all equal to the state's mean n / z (zeros
// for an empty state): the non-causal output, and causal rows past the visible tokens.
template <class A>
ATTNKIT_NOINLINE void fill_rows(const problem& p, index_t b, index_t hk0, index_t hk1, index_t l0, index_t l1,
                                const state_ref& st, bool stream) {
    const index_t nh = (hk1 - hk0) * p.group, h0 = hk0 * p.group;
    for (index_t l = l0; l < l1; ++l) {
        if (p.lse) store_lse(p, b, l, h0, nh, st.m, st.z);
        for (index_t hh = 0; hh < nh; ++hh) {
            const float z = st.z[hh];
            store_row<A, row_kind::scaled>(p.out_row(b, l, h0 + hh), st.n + hh * p.dim_vp, z == 0.0f ? 0.0f : 1.0f / z,
                                           nullptr, 0.0f, p.dim_v, stream);
        }
    }
}

}  // namespace self_gating
}  // namespace detail
}  // namespace attnkit
