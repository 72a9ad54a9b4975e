// The backward pass of the self-gating scan (docs/variants.md section 3, the maths of
// reference/self_gating_attention_backward.hpp without the L x L matrix).
//
// Per batch item and query head, row i's weights are w_ij = exp(g_j) / Z_i over the tokens j it
// sees, Z_i = exp(M_i) z_i with the forward's running state (M_i, z_i) at row i. With
// a_i = 1 / z_i and, causal, the suffix sums over the rows that see token j,
//   S_j = sum_{i >= j} exp(M_j - M_i) a_i dO_i        (a vector of Dv)
//   r_j = sum_{i >= j} exp(M_j - M_i) a_i <dO_i, O_i>
// the gradients are, with e_j = exp(g_j - M_j):
//   d_v_j = e_j S_j,   dg_j = e_j (<v_j, S_j> - r_j),   d_q_j = scale dg_j k_j,   d_k_j = scale dg_j q_j
// (d_k and d_v summed over the query heads of a key/value head). Everything is in the forward's
// max-shifted form: M is non-decreasing in i, so every exponential above is <= 1 and gates of
// 1e3 neither overflow nor leave 0 / 0 (exp(g_j) / Z_i is never formed). Without the causal mask
// every row sees every visible token: S and r are the sums over all rows, the same for every j.
//
// Two passes over the sequence. Pass 1 reads q and k: the gates (scan.hpp's gates_at) and each
// row's (M, a) through the forward's own state update (head_ops.hpp's advance_states), kept as
// three floats per row and head. Pass 2 runs from the last position to the first and reads q,
// k, v, out and d_out once, writing d_q, d_k and d_v once (streamed when large).
//
// Given the forward's lse (lse_i = M_i + log z_i), pass 1 is skipped: the same sums are taken at
// the reference lse instead of M, with a = 1 (exp(lse_j - lse_i) a_i dO_i, lse non-decreasing
// in i, so every exponential is still <= 1 and e_j = exp(g_j - lse_j) <= 1), and pass 2
// computes each token's gates from the q and k rows it reads anyway. That is a fifth less
// traffic (q and k are read once, not twice); the price is lse's float rounding, a relative
// error of about eps |lse| in every weight (6e-5 at gates of 1e3) where pass 1's M is exact.
//
// Pass 2 of a causal call takes each visible token's row in position_step / head_step: the
// local suffix, its combination with the later chunks and the token's gradients in three passes
// over a query head's rows, where suffix_step, fix_suffix and token_grads (kept for the
// non-causal form and the state-only scan) take six and go through buffers in between. Same
// operations on the same operands, so the same bits, and faster (docs/benchmarks.md).
//
// Threads in pass 2 (causal): the forward's chunks of chunk_len() positions, taken from the
// right, and its decoupled look-back (driver.hpp's prefix_table, here holding suffix states: slot
// t of an item is the state of its last t chunks, at the reference M of the first row it covers).
// A chunk always scans its own rows from zero (S_loc) and combines each row with the suffix of
// the chunks after it, S_j = S_loc_j + exp(M_j - M_next) S_next (fix_suffix); so the arithmetic
// is fixed by the shapes, and results are bitwise identical for any thread count.
// With one worker every chunk finds its successor's state published: it computes its gradients
// in one scan and publishes at the end. With several, every chunk first scans d_out and out
// alone (2 of the 5 streams) to publish its own state as soon as the successor's arrives, then
// does the full scan (those rows then come from the cache). A chunk that did the full scan
// first, because its successor happened to be ready, would publish only at its end and leave the
// next chunk's thread waiting for most of a chunk (docs/benchmarks.md).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "attnkit/detail/self_gating/driver.hpp"
#include "attnkit/detail/self_gating/scan.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit {
namespace detail {
namespace self_gating {

// Destination rows of a gradient: base + b sb + l sl + h sh.
struct grad_rows {
    float* base = nullptr;
    index_t sb = 0, sl = 0, sh = 0;
    float* row(index_t b, index_t l, index_t h) const { return base + b * sb + l * sl + h * sh; }
};

// One backward call: the forward's problem (q, k, v rows, shapes, scale, visible tokens; its out
// fields unused), out and d_out, the gradients and the row statistics of pass 1.
struct grad_problem {
    problem fw;
    strided_rows o, dout;
    grad_rows dq, dk, dv;
    index_t dim_p = 0;   // D rounded up to the lane width: the d_k accumulator's length
    bool stream = false;  // non-temporal stores of the gradient rows
    // The forward's lse [B, L, H] (any strides), or null: then pass 1 computes the statistics.
    const float* lse = nullptr;
    index_t lb = 0, ll = 0, lh = 0;
    // Pass 1, [B][L][H] each: the gate, the max M and a = 1 / z of the forward's state at the row.
    // The calling thread's scratch (scratch.hpp): megabytes at long L, which allocated per call
    // would be faulted in and zeroed again each time.
    scratch_lease<> gate_lease, mx_lease, inv_lease;
    std::vector<float>& gate = gate_lease.get();
    std::vector<float>& mx = mx_lease.get();
    std::vector<float>& inv = inv_lease.get();

    const float* at(const std::vector<float>& x, index_t b, index_t l) const {
        return x.data() + (b * fw.len + l) * fw.heads;
    }
};

// The streaming stores of one gradient tensor in the causal scan, which writes every row from
// its top down (walk_down). Where rows start 32 bytes into a 64-byte line (a view 32 bytes past
// a line, where Eigen places a large tensor with AVX), each row shares its lowest line with the
// top of the row below it, which the scan writes next: the row's last half-line is held back
// and streamed right after its partner, so that the line leaves the write-combining buffer
// whole: two half-lines streamed apart made the scan markedly slower on a Zen 3 core
// (docs/benchmarks.md). A held vector is written at the tensor's next store through the joiner
// (a row's first or last full vector: put_row_down), and by flush() at the end of a chunk.
struct line_joiner {
    float* dst = nullptr;
    float x[8];  // one 32-byte vector: only those split a line in halves
};

// Per-worker state of pass 2: the chunk-local suffix (sl, rl), the combined one of the current
// row (s, r), per-head scalars, and the accumulators of one key/value head's d_k and d_v rows.
struct grad_states {
    std::vector<float> sl, rl, s, r, rho, w, e, acc_k, acc_v;
    line_joiner jq, jk, jv;
    void resize(const grad_problem& g) {
        const std::size_t nh = static_cast<std::size_t>(g.fw.heads), dvp = static_cast<std::size_t>(g.fw.dim_vp);
        sl.assign(nh * dvp, 0.0f);
        s.assign(nh * dvp, 0.0f);
        for (std::vector<float>* x : {&rl, &r, &rho, &w, &e}) x->assign(nh, 0.0f);
        acc_k.assign(static_cast<std::size_t>(g.dim_p), 0.0f);
        acc_v.assign(dvp, 0.0f);
    }
    void clear() {
        std::fill(sl.begin(), sl.end(), 0.0f);
        std::fill(rl.begin(), rl.end(), 0.0f);
    }
};

// exp(a - b) for a <= b (a row's max against a later row's): 0 where either is -inf (a state
// that has seen no weighted token yet, or an empty suffix), so that -inf - -inf never makes NaN.
template <class A>
ATTNKIT_ALWAYS_INLINE simd::vfloat<A> shift(const simd::vfloat<A>& a, const simd::vfloat<A>& b) {
    using V = simd::vfloat<A>;
    const V ninf(-HUGE_VALF);
    return simd::select((a == ninf) || (b == ninf), V(0.0f), simd::exp(a - b));
}

// Pass 1 over positions [l0, l1) of item b: gate[b][l][h] for every head.
template <class A>
ATTNKIT_NOINLINE void gate_rows(grad_problem& g, index_t b, index_t l0, index_t l1, const index_t* kv_head) {
    const problem& p = g.fw;
    for (index_t l = l0; l < l1; ++l) {
        gates_at<A>(p, b, l, 0, p.heads, kv_head, g.gate.data() + (b * p.len + l) * p.heads);
        if (l + 1 < l1)
            for (index_t h = 0; h < p.heads; ++h) {
                const float* qn = p.q.row(b, l + 1, h);
                for (index_t c = 0; c < p.dim; c += 16) ATTNKIT_PREFETCH(qn + c);
                if (h % p.group == 0) {
                    const float* kn = p.k.row(b, l + 1, h / p.group);
                    for (index_t c = 0; c < p.dim; c += 16) ATTNKIT_PREFETCH(kn + c);
                }
            }
    }
}

// Pass 1, the row statistics of item b from its gates: the forward's state after each visible
// token (advance_states, as the forward scan advances it). Causal rows past the visible tokens,
// and every row without the causal mask, see all visible tokens: they get the last state.
template <class A>
ATTNKIT_NOINLINE void row_stats(grad_problem& g, index_t b, states& st) {
    const problem& p = g.fw;
    const index_t H = p.heads, L = p.len, nv = p.visible[static_cast<std::size_t>(b)];
    st.clear();
    for (index_t l = 0; l < nv; ++l) {
        const float* gt = g.at(g.gate, b, l);
        advance_states<A>(gt, st.m.data(), st.z.data(), st.e.data(), st.up.data(), H);
        if (p.causal) {
            std::copy(st.m.begin(), st.m.end(), g.mx.begin() + (b * L + l) * H);
            inverse_sums<A>(st.z.data(), H, g.inv.data() + (b * L + l) * H);
        }
    }
    inverse_sums<A>(st.z.data(), H, st.inv_z.data());
    for (index_t l = p.causal ? nv : 0; l < L; ++l) {
        std::copy(st.m.begin(), st.m.end(), g.mx.begin() + (b * L + l) * H);
        std::copy(st.inv_z.begin(), st.inv_z.end(), g.inv.begin() + (b * L + l) * H);
    }
}

// Visits the W-lane vectors of a row of n floats from the top down: the vectors past the last
// whole pair first (single(c, lanes), highest first), then the pairs (pair(c, edge) for c,
// c + W), highest first; `edge` is std::true_type for the top pair and the pair at 0 (where a
// gradient row's stores meet its neighbours', put_row_down) and std::false_type between.
// Pass 2 runs from the last position to the first, and a row is stored after the next
// position's rows in memory; walking each position's rows (and its heads) downwards as
// well makes every tensor one descending stream, which the hardware prefetchers follow across
// rows, where rows read upwards inside a descending scan restart them at every row
// (docs/benchmarks.md, "Self-gating and static QK backward"). Every dot of a row (suffix_step's
// and head_step's) takes this one order, so the two paths give the same bits.
template <index_t W, class Pair, class Single>
ATTNKIT_ALWAYS_INLINE void walk_down(index_t n, Pair&& pair, Single&& single) {
    const index_t pe = n - n % (2 * W);
    if (n > pe)
        for (index_t c = pe + (n - pe - 1) / W * W; c >= pe; c -= W) single(c, std::min(W, n - c));
    index_t c = pe - 2 * W;
    if (c < 0) return;
    pair(c, std::true_type{});
    for (c -= 2 * W; c > 0; c -= 2 * W) pair(c, std::false_type{});
    if (c == 0) pair(c, std::true_type{});
}

// The local suffix of row l of item b: sl = sl exp(M_l - M_{l+1}) + a_l dO_l and likewise rl
// with <dO_l, O_l>; `first`: the first row of a local scan (nothing to carry). rho is scratch.
template <class A>
ATTNKIT_NOINLINE void suffix_step(const grad_problem& g, index_t b, index_t l, bool first, grad_states& st) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const problem& p = g.fw;
    const index_t nh = p.heads, dv = p.dim_v, dvp = p.dim_vp;
    const float* M = g.at(g.mx, b, l);
    const float* a = g.at(g.inv, b, l);
    for (index_t hh = 0; hh < nh; hh += W) {
        const index_t cnt = std::min(W, nh - hh);
        const V rho = first ? V(0.0f) : shift<A>(load_heads<A>(M + hh, cnt), load_heads<A>(g.at(g.mx, b, l + 1) + hh, cnt));
        store_heads<A>(st.rho.data() + hh, rho, cnt);
    }
    for (index_t h = nh - 1; h >= 0; --h) {
        const float* d = g.dout.row(b, l, h);
        const float* o = g.o.row(b, l, h);
        float* S = st.sl.data() + h * dvp;
        const V av(a[h]), rv(st.rho[static_cast<std::size_t>(h)]);
        V acc0(0.0f), acc1(0.0f);
        walk_down<W>(
            dv,
            [&](index_t c, auto) ATTNKIT_INLINE_LAMBDA {
                const V d1 = simd::loadu<A>(d + c + W), d0 = simd::loadu<A>(d + c);
                simd::storeu(S + c + W, simd::fma(simd::loadu<A>(S + c + W), rv, d1 * av));
                simd::storeu(S + c, simd::fma(simd::loadu<A>(S + c), rv, d0 * av));
                acc1 = simd::fma(d1, simd::loadu<A>(o + c + W), acc1);
                acc0 = simd::fma(d0, simd::loadu<A>(o + c), acc0);
            },
            [&](index_t c, index_t n) ATTNKIT_INLINE_LAMBDA {
                const V d0 = simd::load_partial<A>(d + c, n);
                simd::storeu(S + c, simd::fma(simd::loadu<A>(S + c), rv, d0 * av));
                acc0 = simd::fma(d0, simd::load_partial<A>(o + c, n), acc0);
            });
        const float dot = simd::hsum(acc0 + acc1);
        float& rl = st.rl[static_cast<std::size_t>(h)];
        rl = std::fma(rl, st.rho[static_cast<std::size_t>(h)], a[h] * dot);
    }
}

// The suffix of row l (at the reference M_l): the local one combined with the suffix `next` of
// the chunks after it (next.m its reference, next.z its r, next.n its S; an empty one has
// m = -inf and weighs 0). Written to (s, r), and m = M_l where given: the one combination of
// every row and of every published state.
template <class A>
ATTNKIT_NOINLINE void fix_suffix(const grad_problem& g, index_t b, index_t l, grad_states& st, const state_ref& next,
                                 float* s, float* r, float* m) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const index_t nh = g.fw.heads, dvp = g.fw.dim_vp;
    const float* M = g.at(g.mx, b, l);
    for (index_t hh = 0; hh < nh; hh += W) {
        const index_t cnt = std::min(W, nh - hh);
        const V w = shift<A>(load_heads<A>(M + hh, cnt), load_heads<A>(next.m + hh, cnt));
        store_heads<A>(st.w.data() + hh, w, cnt);
        store_heads<A>(r + hh, simd::fma(load_heads<A>(next.z + hh, cnt), w, load_heads<A>(st.rl.data() + hh, cnt)), cnt);
        if (m) std::copy(M + hh, M + hh + cnt, m + hh);
    }
    for (index_t h = 0; h < nh; ++h) {
        const V w(st.w[static_cast<std::size_t>(h)]);
        const float* sn = next.n + h * dvp;
        const float* sl = st.sl.data() + h * dvp;
        float* so = s + h * dvp;
        for (index_t c = 0; c < dvp; c += W) simd::storeu(so + c, simd::fma(simd::loadu<A>(sn + c), w, simd::loadu<A>(sl + c)));
    }
}

// Stores n floats of x at dst (x padded to the lane width), streamed where asked and aligned.
template <class A>
ATTNKIT_ALWAYS_INLINE void store_grad(float* dst, const float* x, index_t n, bool stream) {
    constexpr index_t W = simd::kLanes<A>;
    index_t c = 0;
    if (stream && simd::stream_aligned<A>(dst))
        for (; c + W <= n; c += W) simd::stream_store(dst + c, simd::loadu<A>(x + c));
    else
        for (; c + W <= n; c += W) simd::storeu(dst + c, simd::loadu<A>(x + c));
    if (c < n) simd::store_partial(dst + c, simd::loadu<A>(x + c), n - c);
}

// A full vector of a gradient row at dst through the tensor's joiner: streamed where `stream`
// (the row's pointer passed stream_aligned), stored otherwise. `row_end`: the row's last store
// in the downward walk, held back when it is the upper half of a line.
template <class A>
ATTNKIT_ALWAYS_INLINE void joined_put(line_joiner& j, float* dst, const simd::vfloat<A>& x, bool stream, bool row_end) {
    constexpr index_t W = simd::kLanes<A>;
    if (!stream) {
        simd::storeu(dst, x);
        return;
    }
    if constexpr (W == 8) {
        if (j.dst) {
            float* held = j.dst;
            j.dst = nullptr;
            if (held == dst + W) {  // its partner: the lower half of the same line
                simd::stream_store(dst, x);
                simd::stream_store(held, simd::loadu<A>(j.x));
                return;
            }
            simd::stream_store(held, simd::loadu<A>(j.x));
        }
        if (row_end && (reinterpret_cast<std::uintptr_t>(dst) & 63) == 32) {
            simd::storeu(j.x, x);
            j.dst = dst;
            return;
        }
    }
    simd::stream_store(dst, x);
}

template <class A>
ATTNKIT_ALWAYS_INLINE void flush(line_joiner& j) {
    if constexpr (simd::kLanes<A> == 8)
        if (j.dst) simd::stream_store(j.dst, simd::loadu<A>(j.x));
    j.dst = nullptr;
}

// The full vectors of a gradient row from `top` down to 0, value(c) giving the one at dst + c:
// streamed where `stream` (the row passed stream_aligned), stored otherwise. Only the row's two
// ends go through the joiner: a held half-line can only be the partner of the row's first store,
// and only its last store can be held, so the stores between stream straight, without the
// joiner's test (docs/benchmarks.md, the scan's instruction count).
template <class A, class F>
ATTNKIT_ALWAYS_INLINE void put_row_down(line_joiner& j, float* dst, index_t top, bool stream, F&& value) {
    constexpr index_t W = simd::kLanes<A>;
    if (top < 0) return;
    if (!stream) {
        for (index_t c = top; c >= 0; c -= W) simd::storeu(dst + c, value(c));
        return;
    }
    joined_put<A>(j, dst + top, value(top), true, top == 0);
    index_t c = top - W;
    for (; c > W; c -= 2 * W) {  // two a step: fewer loop instructions per store
        simd::stream_store(dst + c, value(c));
        simd::stream_store(dst + c - W, value(c - W));
    }
    if (c == W) {
        simd::stream_store(dst + c, value(c));
        c = 0;
    }
    if (c == 0) joined_put<A>(j, dst, value(0), true, true);
}

// store_grad's downward form for the causal scan: n floats of x at dst, through the joiner.
template <class A>
ATTNKIT_ALWAYS_INLINE void store_grad_down(line_joiner& j, float* dst, const float* x, index_t n, bool stream) {
    constexpr index_t W = simd::kLanes<A>;
    const index_t c = n - n % W;
    if (c < n) simd::store_partial(dst + c, simd::loadu<A>(x + c), n - c);
    put_row_down<A>(j, dst, c - W, stream && simd::stream_aligned<A>(dst),
                    [&](index_t i) ATTNKIT_INLINE_LAMBDA { return simd::loadu<A>(x + i); });
}

// A token's weight e = exp(gate - m) given its gate (0 for a gate of -inf, which weighs
// nothing), by the vector exponential on one lane, as the forward's and position_step's: libm's
// expf is a call, around which the live vectors are saved and the upper halves cleared
// (vzeroupper). It differs from expf by rounding, and is 0 below e^-87 where expf is subnormal.
template <class A>
ATTNKIT_ALWAYS_INLINE float gate_weight(float gate, float m) {
    float ex[simd::kLanes<A>];
    simd::storeu(ex, simd::exp(simd::vfloat<A>(gate - m)));
    return gate == -HUGE_VALF ? 0.0f : ex[0];
}

// Zero gradients of token l of item b (masked: no row sees it).
template <class A>
ATTNKIT_NOINLINE void zero_token(const grad_problem& g, index_t b, index_t l, grad_states& st) {
    const problem& p = g.fw;
    std::fill(st.acc_k.begin(), st.acc_k.end(), 0.0f);
    std::fill(st.acc_v.begin(), st.acc_v.end(), 0.0f);
    for (index_t h = 0; h < p.heads; ++h) store_grad<A>(g.dq.row(b, l, h), st.acc_k.data(), p.dim, g.stream);
    for (index_t hk = 0; hk < p.heads_kv; ++hk) {
        store_grad<A>(g.dk.row(b, l, hk), st.acc_k.data(), p.dim, g.stream);
        store_grad<A>(g.dv.row(b, l, hk), st.acc_v.data(), p.dim_v, g.stream);
    }
}

// acc[0, W) = s x for the first query head of a key/value head's group, acc + s x for the
// others, in order: d_k and d_v of a group are summed this way on both paths (token_grads,
// head_step), so the paths give the same bits.
template <class A>
ATTNKIT_ALWAYS_INLINE void group_sum(float* acc, const simd::vfloat<A>& s, const simd::vfloat<A>& x, bool first) {
    simd::storeu(acc, first ? s * x : simd::fma(s, x, simd::loadu<A>(acc)));
}

// The gradients of token l of item b from its suffix (s, r) (fix_suffix): e = exp(g - M) (0 for a
// gate of -inf, which weighs nothing), then per key/value head the d_q rows of its query heads
// and its d_k and d_v rows, the query heads summed in order.
template <class A>
ATTNKIT_NOINLINE void token_grads(const grad_problem& g, index_t b, index_t l, grad_states& st) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const problem& p = g.fw;
    const index_t nh = p.heads, G = p.group, D = p.dim, dv = p.dim_v, dvp = p.dim_vp;
    const float* M = g.at(g.mx, b, l);
    if (!g.lse) {
        const float* gt = g.at(g.gate, b, l);
        for (index_t hh = 0; hh < nh; hh += W) {
            const index_t cnt = std::min(W, nh - hh);
            const V gv = load_heads<A>(gt + hh, cnt);
            const V e = simd::select(gv == V(-HUGE_VALF), V(0.0f), simd::exp(gv - load_heads<A>(M + hh, cnt)));
            store_heads<A>(st.e.data() + hh, e, cnt);
        }
    }
    float* sum_k = st.acc_k.data();
    float* sum_v = st.acc_v.data();
    for (index_t hk = 0; hk < p.heads_kv; ++hk) {
        const float* kr = p.k.row(b, l, hk);
        const float* vr = p.v.row(b, l, hk);
        for (index_t gi = 0; gi < G; ++gi) {
            const index_t h = hk * G + gi;
            const float* S = st.s.data() + h * dvp;
            // <v, S>: S is zero past dv, v is loaded partially there.
            V t0(0.0f), t1(0.0f);
            index_t c = 0;
            for (; c + 2 * W <= dv; c += 2 * W) {
                t0 = simd::fma(simd::loadu<A>(vr + c), simd::loadu<A>(S + c), t0);
                t1 = simd::fma(simd::loadu<A>(vr + c + W), simd::loadu<A>(S + c + W), t1);
            }
            for (; c < dv; c += W) t0 = simd::fma(simd::load_partial<A>(vr + c, std::min(W, dv - c)), simd::loadu<A>(S + c), t0);
            const float* qr = p.q.row(b, l, h);
            float e = st.e[static_cast<std::size_t>(h)];
            if (g.lse) {
                // No pass 1: the gate from the head's q and k rows, head by head where they are
                // used. All gates of the position first (scan.hpp's gates_at) would wait on
                // every q and k row of the position before any other work (docs/benchmarks.md,
                // "The backward from the forward's lse").
                const float gate = simd::dot<A>(qr, kr, D) * p.scale;
                e = gate_weight<A>(gate, M[h]);
            }
            const float sd = p.scale * (e * (simd::hsum(t0 + t1) - st.r[static_cast<std::size_t>(h)]));
            const V ev(e), sv(sd);
            for (c = 0; c < dvp; c += W)
                group_sum<A>(sum_v + c, ev, simd::loadu<A>(S + c), gi == 0);
            float* dq = g.dq.row(b, l, h);
            const bool st_q = g.stream && simd::stream_aligned<A>(dq);
            for (c = 0; c + W <= D; c += W) {
                const V qv = simd::loadu<A>(qr + c);
                group_sum<A>(sum_k + c, sv, qv, gi == 0);
                const V dqv = sv * simd::loadu<A>(kr + c);
                if (st_q)
                    simd::stream_store(dq + c, dqv);
                else
                    simd::storeu(dq + c, dqv);
            }
            if (c < D) {
                const V qv = simd::load_partial<A>(qr + c, D - c);
                group_sum<A>(sum_k + c, sv, qv, gi == 0);
                simd::store_partial(dq + c, sv * simd::load_partial<A>(kr + c, D - c), D - c);
            }
        }
        store_grad<A>(g.dk.row(b, l, hk), sum_k, D, g.stream);
        store_grad<A>(g.dv.row(b, l, hk), sum_v, dv, g.stream);
    }
}

// The rows of one position at head 0 (a head's rows are its index times the head stride past
// them, paged or not), and its rows' statistics: computed once for all heads.
struct position_rows {
    const float *q, *k, *v, *d, *o;
    float *dq, *dk, *dv;
    const float *m, *a;
};

// One query head's gradients at a position, in three passes over its rows instead of
// suffix_step, fix_suffix and token_grads' six: the gate from q and k; the local suffix of the
// row, its combination with the chunks after it, <v, S> and e S in one pass over d_out, out, v
// and the suffixes; then d_k and d_q. Every row is walked downwards (walk_down). The local
// suffix is the same operation on the same operands as suffix_step's, in the same order, so the
// look-back's scan (suffix_step) publishes the same bits. A key/value head's group is summed
// into d_k and d_v from its last query head down to its first (`first`: the first one summed,
// `last`: the last one, after which the sums are stored); with one query head per key/value head
// (Direct, its own instance) d_k and d_v go straight to their rows.
template <class A, bool Direct>
ATTNKIT_ALWAYS_INLINE void head_step(const grad_problem& g, const position_rows& pr, index_t h, bool first, bool last,
                                     grad_states& st, const state_ref& next) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const problem& p = g.fw;
    const index_t D = p.dim, dv = p.dim_v, dvp = p.dim_vp, hk = h / p.group;
    constexpr bool direct = Direct;  // first && last: one query head per key/value head
    const std::size_t hs = static_cast<std::size_t>(h);
    const float* qr = pr.q + h * p.q.sh;
    const float* kr = pr.k + hk * p.k.sh;
    const float* vr = pr.v + hk * p.v.sh;
    const float* d = pr.d + h * g.dout.sh;
    const float* o = pr.o + h * g.o.sh;
    float* sl = st.sl.data() + h * dvp;
    const float* sn = next.n + h * dvp;
    float* sum_k = st.acc_k.data();
    float* sum_v = st.acc_v.data();
    float e = st.e[hs];
    if (g.lse) {
        // The gate, its rows read downwards like every other row here (four chains: this dot
        // heads each head's work, and two chains of a D = 128 dot wait on the FMA latency).
        const float gate = simd::dot_down<A>(qr, kr, D) * p.scale;
        e = gate_weight<A>(gate, pr.m[h]);
    }
    const float a = pr.a[h];
    const V av(a), rv(st.rho[hs]), wv(st.w[hs]), ev(e);
    float* dvr = pr.dv + hk * g.dv.sh;
    const bool st_v = g.stream && simd::stream_aligned<A>(dvr);
    V acc0(0.0f), acc1(0.0f), t0(0.0f), t1(0.0f);
    walk_down<W>(
        dv,
        [&](index_t c, auto edge) ATTNKIT_INLINE_LAMBDA {
            const V d1 = simd::loadu<A>(d + c + W), d0 = simd::loadu<A>(d + c);
            const V l1 = simd::fma(simd::loadu<A>(sl + c + W), rv, d1 * av), l0 = simd::fma(simd::loadu<A>(sl + c), rv, d0 * av);
            simd::storeu(sl + c + W, l1);
            simd::storeu(sl + c, l0);
            acc1 = simd::fma(d1, simd::loadu<A>(o + c + W), acc1);
            acc0 = simd::fma(d0, simd::loadu<A>(o + c), acc0);
            const V s1 = simd::fma(simd::loadu<A>(sn + c + W), wv, l1), s0 = simd::fma(simd::loadu<A>(sn + c), wv, l0);
            t1 = simd::fma(simd::loadu<A>(vr + c + W), s1, t1);
            t0 = simd::fma(simd::loadu<A>(vr + c), s0, t0);
            // e S into d_v's row (one query head) or into the group's sum (several); the row's
            // stores go through its joiner at its ends only (walk_down's edge, as put_row_down).
            if constexpr (!direct) {
                group_sum<A>(sum_v + c + W, ev, s1, first);
                group_sum<A>(sum_v + c, ev, s0, first);
            } else if constexpr (decltype(edge)::value) {
                joined_put<A>(st.jv, dvr + c + W, ev * s1, st_v, false);
                joined_put<A>(st.jv, dvr + c, ev * s0, st_v, c == 0);
            } else if (st_v) {
                simd::stream_store(dvr + c + W, ev * s1);
                simd::stream_store(dvr + c, ev * s0);
            } else {
                simd::storeu(dvr + c + W, ev * s1);
                simd::storeu(dvr + c, ev * s0);
            }
        },
        [&](index_t c, index_t n) ATTNKIT_INLINE_LAMBDA {
            const V d0 = simd::load_partial<A>(d + c, n);
            const V l0 = simd::fma(simd::loadu<A>(sl + c), rv, d0 * av);
            simd::storeu(sl + c, l0);
            acc0 = simd::fma(d0, simd::load_partial<A>(o + c, n), acc0);
            const V s0 = simd::fma(simd::loadu<A>(sn + c), wv, l0);
            t0 = simd::fma(simd::load_partial<A>(vr + c, n), s0, t0);
            if constexpr (!direct)
                group_sum<A>(sum_v + c, ev, s0, first);
            else if (n == W)
                joined_put<A>(st.jv, dvr + c, ev * s0, st_v, c == 0);
            else
                simd::store_partial(dvr + c, ev * s0, n);
        });
    float& rl = st.rl[hs];
    rl = std::fma(rl, st.rho[hs], a * simd::hsum(acc0 + acc1));
    const float r = std::fma(next.z[h], st.w[hs], rl);
    const float sd = p.scale * (e * (simd::hsum(t0 + t1) - r));
    const V sv(sd);
    float* dq = pr.dq + h * g.dq.sh;
    float* dk = pr.dk + hk * g.dk.sh;
    const bool st_q = g.stream && simd::stream_aligned<A>(dq), st_k = g.stream && simd::stream_aligned<A>(dk);
    // One row after the other: streaming stores to two rows in turn keep two write-combining
    // buffers open at once, which made the whole call slower on a Zen 3 core
    // (docs/benchmarks.md).
    index_t c = D - D % W;
    if (c < D) {
        const V qv = simd::load_partial<A>(qr + c, D - c);
        if constexpr (direct)
            simd::store_partial(dk + c, sv * qv, D - c);
        else
            group_sum<A>(sum_k + c, sv, qv, first);
    }
    if constexpr (direct)
        put_row_down<A>(st.jk, dk, c - W, st_k,
                        [&](index_t i) ATTNKIT_INLINE_LAMBDA { return sv * simd::loadu<A>(qr + i); });
    else
        for (c -= W; c >= 0; c -= W) group_sum<A>(sum_k + c, sv, simd::loadu<A>(qr + c), first);
    c = D - D % W;
    if (c < D) simd::store_partial(dq + c, sv * simd::load_partial<A>(kr + c, D - c), D - c);
    put_row_down<A>(st.jq, dq, c - W, st_q,
                    [&](index_t i) ATTNKIT_INLINE_LAMBDA { return sv * simd::loadu<A>(kr + i); });
    if (!direct && last) {
        store_grad_down<A>(st.jk, dk, sum_k, D, g.stream);
        store_grad_down<A>(st.jv, dvr, sum_v, dv, g.stream);
    }
}

// Position l of item b in the causal gradient scan: the per-head factors (rho of the local
// suffix, w of the combination with `next`, e of the gates of pass 1) as vectors over the heads,
// then head_step for each query head from the last down (walk_down's order), a key/value
// head's group summed from its last query head to its first.
template <class A>
ATTNKIT_NOINLINE void position_step(const grad_problem& g, index_t b, index_t l, bool first, grad_states& st,
                                    const state_ref& next) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const problem& p = g.fw;
    const index_t nh = p.heads, G = p.group;
    const float* M = g.at(g.mx, b, l);
    for (index_t hh = 0; hh < nh; hh += W) {
        const index_t cnt = std::min(W, nh - hh);
        const V m = load_heads<A>(M + hh, cnt);
        store_heads<A>(st.rho.data() + hh, first ? V(0.0f) : shift<A>(m, load_heads<A>(g.at(g.mx, b, l + 1) + hh, cnt)), cnt);
        store_heads<A>(st.w.data() + hh, shift<A>(m, load_heads<A>(next.m + hh, cnt)), cnt);
        if (!g.lse) {
            const V gv = load_heads<A>(g.at(g.gate, b, l) + hh, cnt);
            store_heads<A>(st.e.data() + hh, simd::select(gv == V(-HUGE_VALF), V(0.0f), simd::exp(gv - m)), cnt);
        }
    }
    const position_rows pr{p.q.row(b, l, 0),    p.k.row(b, l, 0),    p.v.row(b, l, 0),    g.dout.row(b, l, 0),
                           g.o.row(b, l, 0),    g.dq.row(b, l, 0),   g.dk.row(b, l, 0),   g.dv.row(b, l, 0),
                           M,                   g.at(g.inv, b, l)};
    if (G == 1)  // one query head per key/value head: its own instance, without the group sums
        for (index_t h = nh - 1; h >= 0; --h) head_step<A, true>(g, pr, h, true, true, st, next);
    else
        for (index_t h = nh - 1; h >= 0; --h) head_step<A, false>(g, pr, h, h % G == G - 1, h % G == 0, st, next);
}

// Hints for the rows of position l (the next one a descending scan reads): each position's rows
// start new 4 KiB pages, where the hardware prefetchers stop (as in the forward scan).
inline void prefetch_position(const grad_problem& g, index_t b, index_t l, bool all) {
    const problem& p = g.fw;
    for (index_t h = 0; h < p.heads; ++h) {
        const float* d = g.dout.row(b, l, h);
        const float* o = g.o.row(b, l, h);
        for (index_t c = 0; c < p.dim_v; c += 16) {
            ATTNKIT_PREFETCH(d + c);
            ATTNKIT_PREFETCH(o + c);
        }
        if (!all) continue;
        const float* q = p.q.row(b, l, h);
        for (index_t c = 0; c < p.dim; c += 16) ATTNKIT_PREFETCH(q + c);
        if (h % p.group == 0) {
            const float* k = p.k.row(b, l, h / p.group);
            const float* v = p.v.row(b, l, h / p.group);
            for (index_t c = 0; c < p.dim; c += 16) ATTNKIT_PREFETCH(k + c);
            for (index_t c = 0; c < p.dim_v; c += 16) ATTNKIT_PREFETCH(v + c);
        }
    }
}

// Pass 1 on the pool: gates by (item, chunk), then the row statistics by item.
template <class A>
void run_stats(grad_problem& g, thread_pool* pool, index_t C, index_t nc) {
    const problem& p = g.fw;
    const std::size_t n = static_cast<std::size_t>(p.batch * p.len * p.heads);
    g.gate.assign(n, 0.0f);
    g.mx.assign(n, -HUGE_VALF);
    g.inv.assign(n, 0.0f);
    parallel_for(pool, p.batch * nc, [&](std::int64_t it) {
        const index_t b = it / nc, c0 = (it % nc) * C, c1 = std::min(c0 + C, p.visible[static_cast<std::size_t>(b)]);
        if (c0 >= c1) return;
        std::vector<index_t> kv_head(static_cast<std::size_t>(p.heads));
        for (index_t h = 0; h < p.heads; ++h) kv_head[static_cast<std::size_t>(h)] = h / p.group;
        gate_rows<A>(g, b, c0, c1, kv_head.data());
    });
    parallel_for(pool, p.batch, [&](std::int64_t b) {
        states st;
        st.resize(p.heads, p.dim_vp);
        row_stats<A>(g, b, st);
    });
}

// The row statistics from the forward's lse: M = lse, a = 1 (the gates come in pass 2).
inline void lse_stats(grad_problem& g) {
    const problem& p = g.fw;
    const std::size_t n = static_cast<std::size_t>(p.batch * p.len * p.heads);
    g.mx.resize(n);
    g.inv.assign(n, 1.0f);
    for (index_t b = 0; b < p.batch; ++b)
        for (index_t l = 0; l < p.len; ++l)
            for (index_t h = 0; h < p.heads; ++h)
                g.mx[static_cast<std::size_t>((b * p.len + l) * p.heads + h)] = g.lse[b * g.lb + l * g.ll + h * g.lh];
}

// Pass 2 of a causal call, chunk t from the right of item b: the chunk's gradients, and its suffix
// state into `suf` (slot t + 1) for the chunk before it. `direct`: the successor's state is
// there already (this worker computed it), so one scan does it all; otherwise the chunk scans
// d_out and out first, waits for its successor, publishes, then does the full scan (the
// look-back of the header).
template <class A>
void scan_chunk(grad_problem& g, prefix_table& suf, index_t b, index_t t, index_t C, grad_states& st, bool direct) {
    const problem& p = g.fw;
    const index_t c = suf.nc - 1 - t, c0 = c * C, c1 = std::min(c0 + C, p.len);
    const index_t nv = p.visible[static_cast<std::size_t>(b)];
    const state_ref sn = suf.at(b, t), sp = suf.at(b, t + 1);
    auto scan = [&](bool grads) {
        st.clear();
        for (index_t l = c1 - 1; l >= c0; --l) {
            if (grads && l < nv) {
                // No hints here: the rows are one descending stream per tensor, which the
                // hardware prefetchers follow; hints of the next position, in one burst or
                // spread over the heads, measured the same or slower (docs/benchmarks.md).
                position_step<A>(g, b, l, l == c1 - 1, st, sn);
                continue;
            }
            suffix_step<A>(g, b, l, l == c1 - 1, st);
            if (l > c0) prefetch_position(g, b, l - 1, grads);
            if (grads) zero_token<A>(g, b, l, st);  // l >= nv: no row sees token l
        }
        for (line_joiner* j : {&st.jq, &st.jk, &st.jv}) flush<A>(*j);
    };
    if (nv == 0) {  // nothing visible: zero gradients, an empty suffix
        for (index_t l = c0; l < c1; ++l) zero_token<A>(g, b, l, st);
        if (!direct) suf.wait(b, t);
        suf.publish(b, t + 1);
        return;
    }
    if (direct) {
        scan(true);
    } else {
        scan(false);
        suf.wait(b, t);
    }
    // st.sl, st.rl: the local suffix at c0 (both scans end there).
    fix_suffix<A>(g, b, c0, st, sn, sp.n, sp.z, sp.m);
    suf.publish(b, t + 1);
    if (!direct) scan(true);
}

// Pass 2 of a causal call: chunks claimed in order from the right, with the decoupled look-back
// of the header (a lone worker always finds its successor's state and scans once).
template <class A>
void run_backward_causal(grad_problem& g, thread_pool* pool, index_t C, index_t nc) {
    const problem& p = g.fw;
    const index_t B = p.batch, H = p.heads, dvp = p.dim_vp, total = B * nc;
    prefix_table suf(B, H, dvp, nc, nullptr);
    const index_t T = pool ? static_cast<index_t>(pool->size()) : 1;
    std::atomic<index_t> next{0};
    const index_t workers = std::min(T, total);
    parallel_for(pool, workers, [&](std::int64_t) {
        // Allocated before the first claim: an exception after a claim would leave the chunk's
        // predecessors (to its left) waiting.
        grad_states st;
        st.resize(g);
        for (index_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < total;)
            scan_chunk<A>(g, suf, it / nc, it % nc, C, st, workers == 1);
        simd::store_fence();
    });
}

// Without the causal mask every row sees all visible tokens: S and r are sums over all rows
// (chunk sums in parallel, combined from the last chunk to the first), then each token's
// gradients from those.
template <class A>
void run_backward_noncausal(grad_problem& g, thread_pool* pool, index_t C, index_t nc) {
    const problem& p = g.fw;
    const index_t B = p.batch, L = p.len, H = p.heads, dvp = p.dim_vp;
    prefix_table part(B * nc, H, dvp, 1, nullptr);  // slot 1 of item b * nc + c: chunk c's own sums
    prefix_table tot(B, H, dvp, 1, nullptr);        // slot 1 of item b: the sums over all rows
    parallel_for(pool, B * nc, [&](std::int64_t it) {
        const index_t b = it / nc, c0 = (it % nc) * C, c1 = std::min(c0 + C, L);
        if (p.visible[static_cast<std::size_t>(b)] == 0) return;
        grad_states st;
        st.resize(g);
        for (index_t l = c1 - 1; l >= c0; --l) suffix_step<A>(g, b, l, l == c1 - 1, st);
        const state_ref d = part.at(it, 1);
        fix_suffix<A>(g, b, c0, st, part.at(it, 0), d.n, d.z, d.m);
    });
    parallel_for(pool, B, [&](std::int64_t b) {
        if (p.visible[static_cast<std::size_t>(b)] == 0) return;
        grad_states st;
        st.resize(g);
        const state_ref acc = tot.at(b, 1);
        for (index_t c = nc - 1; c >= 0; --c) {
            const state_ref own = part.at(b * nc + c, 1);
            std::copy(own.n, own.n + H * dvp, st.sl.begin());
            std::copy(own.z, own.z + H, st.rl.begin());
            // Every row has the same M, so the combination weighs 1: acc = own + acc.
            fix_suffix<A>(g, b, c * C, st, acc, acc.n, acc.z, acc.m);
        }
    });
    parallel_for(pool, B * nc, [&](std::int64_t it) {
        const index_t b = it / nc, c0 = (it % nc) * C, c1 = std::min(c0 + C, L);
        const index_t nv = p.visible[static_cast<std::size_t>(b)];
        grad_states st;
        st.resize(g);
        st.clear();
        for (index_t l = c0; l < c1; ++l) {
            if (l < nv) {
                fix_suffix<A>(g, b, l, st, tot.at(b, 1), st.s.data(), st.r.data(), nullptr);
                token_grads<A>(g, b, l, st);
            } else {
                zero_token<A>(g, b, l, st);
            }
        }
        simd::store_fence();
    });
}

template <class A>
ATTNKIT_NOINLINE void run_backward(grad_problem& g, thread_pool* pool) {
    const problem& p = g.fw;
    if (p.batch == 0 || p.len == 0) return;
    const index_t C = chunk_len(p), nc = (p.len + C - 1) / C;
    if (g.lse)
        lse_stats(g);
    else
        run_stats<A>(g, pool, C, nc);
    if (p.causal)
        run_backward_causal<A>(g, pool, C, nc);
    else
        run_backward_noncausal<A>(g, pool, C, nc);
}

#ifdef ATTNKIT_KERNEL_INSTANCE  // compiled kernels (config.hpp)
ATTNKIT_KERNEL_INSTANCE void run_backward<simd::default_arch>(grad_problem&, thread_pool*);
#endif

}  // namespace self_gating
}  // namespace detail
}  // namespace attnkit
