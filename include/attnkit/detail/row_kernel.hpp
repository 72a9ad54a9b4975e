// The row kernel for decode and short queries (a few rows per key/value head, long keys): the
// head dim is in lanes, each score is one dot product, and the row policy of row_transform.hpp
// (softmax_rows, taylor::quadratic_rows, ...) turns each block of a row's scores into weights.
// Its cost is streaming K and V once, which is what decode is bound by, so the walk serves that
// stream and is the same for every policy:
//  - K and V are read as kRowScoreKeys (kRowValueKeys) sequential streams per block: the keys
//    of a step are nk / 8 apart, and within a step the heads run in memory order, so each
//    stream walks its own run of rows front to back and every cache line is read once per call.
//    With 4 KiB pages the hardware prefetchers stop at every page edge, so what one core streams
//    is set by how many pages it reads at once: consecutive keys keep few pages in flight (and
//    read 16-bit pages out of order), eight streams keep eight. Software prefetch of those
//    streams adds nothing: it competes for the same miss buffers;
//  - where a tensor's heads lie further apart than its keys (head-major views, [B, Hk, L, D] as
//    PyTorch and Hugging Face caches hold K and V), its walk runs head by head over the block
//    instead of step by step: step by step, every step would touch eight rows of every head,
//    8 x Hk pages at once, each read a row at a time over the whole block; head by head keeps
//    one head's eight streams in flight and finishes its pages before the next head's. Each row
//    still sees its keys in the same order, so the results are the same bits in both layouts;
//  - head-major rows of at most kShortRowBytes (D 64 in 16 bits, int8 up to D 128) are too short
//    for eight streams of a row per step: a step takes eight consecutive keys (one stream per
//    head and tensor), and when both K and V are such rows the driver gives each call one
//    key/value head (short_head_major_rows), so that a call streams one head's K and V front to
//    back. Those rows sum their keys in another order than token-major ones, so the two layouts
//    agree to rounding there, not bit for bit (docs/benchmarks.md, section
//    `detail/row_kernel.hpp`);
//  - with several query rows per key/value head (GQA), or one (MHA) and 16-bit or int8 K/V, the
//    score walk of a block hints the block's V lines to L2 and the value walk the next block's K
//    lines, so that the one of K and V that is not being read is still being fetched
//    (prefetch_other; AVX-512 builds, where it was measured to pay);
//  - eight keys per step in both walks: eight independent FMA chains per score step, one load
//    of q per eight FMAs, and one load and store of each output vector per eight keys (the
//    value walk is store-bound otherwise);
//  - no horizontal sum per key: a step's dot products leave as vectors and are reduced together
//    by one transposing reduction (simd::hsum_each);
//  - K and V stored as bfloat16 or half are converted in the loads (simd/convert.hpp): half the
//    bytes, the same float arithmetic; with GQA each loaded (and converted) vector serves up to
//    four query rows of its key/value head (kGroupRows), so a head's K and V are read and
//    converted once per step, not once per query head;
//  - int8 K/V (attnkit/int8_kv.hpp) are widened in the loads as 16-bit ones are; a key row's
//    scale multiplies the block's scores of that key once per row, a value row's scale the
//    weights, so the inner loops never see a scale;
//  - keys a row does not see are skipped, never weighted by 0, so that a NaN or Inf in their
//    rows stays out of it (0 * Inf = NaN).
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attnkit/detail/attention_problem.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/detail/tile_traits.hpp"
#include "attnkit/simd/convert.hpp"

namespace attnkit {
namespace detail {

// Keys per step of both walks, nk / 8 apart (one per stream): the score walk reduces this many
// dot products together, the value walk loads and stores each output vector once per this many
// keys (store bandwidth bounds it otherwise).
constexpr index_t kRowValueKeys = 8;
constexpr index_t kRowScoreKeys = 8;

// bfloat16 K/V are read two vectors at a time in the pair order of simd::load_bf16_pairs (even
// elements, then odd ones, per 2W), one shift and one mask per 2W elements; the float operands
// they meet (the packed queries, the output rows) are kept in the same order over the first
// floor(n / 2W) * 2W elements of a row, natural order after that, and put back before emit.
template <class A, class T>
constexpr bool kPairOrder = std::is_same<T, Eigen::bfloat16>::value && !std::is_same<A, simd::scalar_arch>::value;

// (vdpbf16ps on the keys as stored, with the float queries split into three bfloat16 parts, is
// not used: on AVX-512 BF16 it made bfloat16 decode slower than the pair loads, 5-10% for MHA and
// 25-30% for GQA 32/8, where it also keeps each query row on its own; docs/benchmarks.md.)

// Where element c of an n-element row sits in pair order.
template <class A>
inline index_t pair_pos(index_t c, index_t n) {
    constexpr index_t W2 = 2 * simd::kLanes<A>;
    if (c >= n / W2 * W2) return c;
    const index_t i = c % W2;
    return c - i + (i % 2) * (W2 / 2) + i / 2;
}

// The row walk hints the other tensor's next lines to L2 (the header) in AVX-512 builds: for
// 16-bit and int8 K/V with one query row per key/value head, where the walk spends the most
// instructions per byte read and a second set of lines in flight pays, and for rows grouped by
// key/value head (GQA), whose arithmetic per byte leaves the loads waiting. Float MHA rows, where
// the walk's own streams come closest to the read bandwidth, lost with the hints on both AVX-512
// cores measured. On an AVX2 core (Zen 3) the hints made MHA 16-bit decode slower, with the K/V
// in the L3 as well as in DRAM. GQA rows: no gain beyond the noise on Sapphire Rapids, faster in
// every storage type on Zen 5 (docs/benchmarks.md, section `detail/row_kernel.hpp`). No VM had
// hardware counters to say why.
template <class A, class KT, class VT>
constexpr bool prefetch_other(index_t rows_per_kv_head) {
    return simd::kLanes<A> >= 16 &&
           (rows_per_kv_head > 1 || !std::is_same<KT, float>::value || !std::is_same<VT, float>::value);
}

// Head-major rows of at most this many bytes are read as one stream per head (the header).
constexpr index_t kShortRowBytes = 128;

// How a walk reads one tensor's rows of a block: n_steps steps of kKeys keys for each of n_heads
// heads. The i-th (step, head) pair is step-major, or head-major when the tensor's heads lie
// further apart than its keys (one loop over i serves both orders, so the walk's body is
// compiled once); the keys of step t are first(t) + u * gap(), u < kKeys, from the block's
// start: nk / kKeys apart (eight streams), or consecutive for short head-major rows.
struct walk_order {
    static constexpr index_t kKeys = 8;
    index_t n_steps, n_heads;
    bool heads_outer, consecutive;
    index_t size() const { return n_steps * n_heads; }
    index_t step(index_t i) const { return heads_outer ? i % n_steps : i / n_heads; }
    index_t head(index_t i) const { return heads_outer ? i / n_steps : i % n_heads; }
    index_t first(index_t t) const { return consecutive ? t * kKeys : t; }
    index_t gap() const { return consecutive ? 1 : n_steps; }
};

// Rows of T, dim elements each, sl apart per key and sh per head, of a tensor with heads_k heads
// (the walk takes n_heads of them). With one head the head stride means nothing: a [B, 1, L, D]
// view reads the same memory, at the same bits, whatever stride it gives that dimension.
template <class T>
walk_order make_walk(index_t n_steps, index_t n_heads, index_t heads_k, index_t sl, index_t sh, index_t dim) {
    const bool apart = heads_k > 1 && sh > sl;
    return walk_order{n_steps, n_heads, apart, apart && dim * index_t(sizeof(T)) <= kShortRowBytes};
}

// Both K and V short head-major rows: the driver runs the row kernel one key/value head at a time.
template <class Problem>
bool short_head_major_rows(const Problem& p) {
    using KT = std::remove_const_t<std::remove_pointer_t<decltype(p.k.data)>>;
    using VT = std::remove_const_t<std::remove_pointer_t<decltype(p.v.data)>>;
    return make_walk<KT>(1, 1, p.s.heads_k, p.k.sl, p.k.sh, p.s.dim).consecutive &&
           make_walk<VT>(1, 1, p.s.heads_k, p.v.sl, p.v.sh, p.s.dim_v).consecutive;
}

// Hints the n_rows rows x + u * stride, u < n_rows, of `bytes` each to L2.
template <class T>
ATTNKIT_ALWAYS_INLINE void prefetch_rows_l2(const T* x, index_t stride, index_t n_rows, index_t bytes) {
    for (index_t u = 0; u < n_rows; ++u) {
        const char* row = reinterpret_cast<const char*>(x + u * stride);
        for (index_t c = 0; c < bytes; c += 64) ATTNKIT_PREFETCH_L2(row + c);
    }
}

// out[u * out_stride] = <q, k_u> (k_u = k + u * k_stride) for kRowScoreKeys keys at once:
// independent accumulators hide FMA latency and one q load feeds them all.
template <class A, class T>
ATTNKIT_ALWAYS_INLINE void score_keys(const float* q, const T* k, index_t k_stride, index_t dim, float* out,
                                      index_t out_stride) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t KG = kRowScoreKeys;
    V acc[KG];
    ATTNKIT_UNROLL for (index_t u = 0; u < KG; ++u) acc[u] = V(0.0f);
    index_t d = 0;
    if constexpr (kPairOrder<A, T>) {
        for (; d + 2 * W <= dim; d += 2 * W) {
            const V qe = simd::loadu<A>(q + d), qo = simd::loadu<A>(q + d + W);
            ATTNKIT_UNROLL for (index_t u = 0; u < KG; ++u) {
                V e, o;
                simd::load_bf16_pairs<A>(k + u * k_stride + d, e, o);
                acc[u] = simd::fma(qo, o, simd::fma(qe, e, acc[u]));
            }
        }
    }
    for (; d + W <= dim; d += W) {
        const V qv = simd::loadu<A>(q + d);
        ATTNKIT_UNROLL for (index_t u = 0; u < KG; ++u) acc[u] = simd::fma(qv, simd::load_float<A>(k + u * k_stride + d), acc[u]);
    }
    if (d < dim) {
        const V qv = simd::loadu<A>(q + d);
        ATTNKIT_UNROLL for (index_t u = 0; u < KG; ++u)
            acc[u] = simd::fma(qv, simd::load_float_partial<A>(k + u * k_stride + d, dim - d), acc[u]);
    }
    // Transposing reductions, W sums at a time (zero vectors fill the lanes past KG).
    constexpr index_t NG = (KG + W - 1) / W;
    ATTNKIT_UNROLL for (index_t g = 0; g < NG; ++g) {
        V all[W];
        ATTNKIT_UNROLL for (index_t u = 0; u < W; ++u) all[u] = g * W + u < KG ? acc[g * W + u] : V(0.0f);
        alignas(64) float sums[W];
        simd::storeu(sums, simd::hsum_each(all));
        for (index_t u = 0; u < W && g * W + u < KG; ++u) out[(g * W + u) * out_stride] = sums[u];
    }
}

template <class A, class T>
ATTNKIT_ALWAYS_INLINE float score_key(const float* q, const T* k, index_t dim) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    V a(0.0f);
    index_t d = 0;
    if constexpr (kPairOrder<A, T>) {
        for (; d + 2 * W <= dim; d += 2 * W) {
            V e, o;
            simd::load_bf16_pairs<A>(k + d, e, o);
            a = simd::fma(simd::loadu<A>(q + d), e, a);
            a = simd::fma(simd::loadu<A>(q + d + W), o, a);
        }
    }
    for (; d + W <= dim; d += W) a = simd::fma(simd::loadu<A>(q + d), simd::load_float<A>(k + d), a);
    if (d < dim) a = simd::fma(simd::loadu<A>(q + d), simd::load_float_partial<A>(k + d, dim - d), a);
    return simd::hsum(a);
}

// o += sum_u p[u * p_stride] v_u over kRowValueKeys value rows v + u * v_stride.
template <class A, class T>
ATTNKIT_ALWAYS_INLINE void accumulate_keys(float* o, const float* p, index_t p_stride, const T* v, index_t v_stride,
                                           index_t dim_v) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t KU = kRowValueKeys;
    V pv[KU];
    ATTNKIT_UNROLL for (index_t u = 0; u < KU; ++u) pv[u] = V(p[u * p_stride]);
    index_t c = 0;
    if constexpr (kPairOrder<A, T>) {
        for (; c + 2 * W <= dim_v; c += 2 * W) {
            V ae = simd::loadu<A>(o + c), ao = simd::loadu<A>(o + c + W);
            ATTNKIT_UNROLL for (index_t u = 0; u < KU; ++u) {
                V e, od;
                simd::load_bf16_pairs<A>(v + u * v_stride + c, e, od);
                ae = simd::fma(pv[u], e, ae);
                ao = simd::fma(pv[u], od, ao);
            }
            simd::storeu(o + c, ae);
            simd::storeu(o + c + W, ao);
        }
    }
    for (; c + W <= dim_v; c += W) {
        V a = simd::loadu<A>(o + c);
        ATTNKIT_UNROLL for (index_t u = 0; u < KU; ++u) a = simd::fma(pv[u], simd::load_float<A>(v + u * v_stride + c), a);
        simd::storeu(o + c, a);
    }
    for (; c < dim_v; ++c) {
        float a = o[c];
        ATTNKIT_UNROLL for (index_t u = 0; u < KU; ++u) a += p[u * p_stride] * simd::to_float(v[u * v_stride + c]);
        o[c] = a;
    }
}

// GQA: the query rows of one key/value head share every K and V row they read, so the rows of a
// head are taken RB at a time against each loaded vector (kGroupRows). With 16-bit or int8 K/V
// that saves the conversion of each vector per row, which costs about as much as the FMAs it
// feeds; with float K/V it saves the reloads and the per-row reductions and output passes
// (measured in docs/benchmarks.md, "int8 K/V").
template <class A, class T>
constexpr bool kGroupRows = !std::is_same<A, simd::scalar_arch>::value;

// Vector registers the grouped row functions plan for: AVX-512 has 32, SSE and AVX2 16.
template <class A>
constexpr index_t kRowRegisters = simd::kLanes<A> >= 16 ? 32 : 16;

// The largest power of two <= n (n >= 1).
constexpr index_t floor_pow2(index_t n) { return n >= 2 ? 2 * floor_pow2(n / 2) : 1; }

// out[r * out_row + u * out_stride] = <q_r, k_u> (q_r = q + r * q_stride) for RB rows and
// kRowScoreKeys keys: the keys in passes of KS, so that the RB * KS accumulators of a pass
// fill whole transposing reductions (kRowScoreKeys, or the lane count W where that is more:
// GQA bf16, f16 and int8 decode 4-18% faster at 16 lanes than with half-empty reductions); each
// key vector is loaded and converted once per pass for all RB rows. Within a step of a pass, KQ
// keys' vectors are loaded into registers, then each row's query vector once for all of them:
// RB + KS loads per RB * KS FMAs (KQ = KS where the registers allow, else the rows' vectors
// are loaded once per KQ keys). Both kinds of vector are pinned in registers
// (simd::keep_in_register): left to itself GCC 12 folds one of them into every FMA as a memory
// operand, and the step runs bound by its loads. Sums in the same order as score_keys per (row,
// key).
// This and accumulate_keys_rows are functions of their own per (T, RB), not inlined into each
// row kernel instantiation (policy x query type): inlined and unrolled they made the row kernel
// several times as costly to compile at the same decode speed (docs/benchmarks.md).
template <class A, class T, index_t RB>
ATTNKIT_NOINLINE void score_keys_rows(const float* q, index_t q_stride, const T* k, index_t k_stride,
                                           index_t dim, float* out, index_t out_stride, index_t out_row) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t KG = kRowScoreKeys;
    // Accumulators per pass: kRowScoreKeys, or W where that is more, so that each transposing
    // reduction (simd::hsum_each: W vectors at a time) is full.
    constexpr index_t KS = std::max(KG, W) / RB;
    static_assert(KG % RB == 0 && KG % KS == 0, "passes must tile the step");
    constexpr bool kPairs = kPairOrder<A, T>;
    // Key vectors live at once: what the accumulators and one row's query vectors (two in pair
    // order) leave, less one spare; a bfloat16 key takes two vectors in pair order.
    constexpr index_t kFree = kRowRegisters<A> - RB * KS - (kPairs ? 2 : 1) - 1;
    constexpr index_t KQ = std::min(KS, floor_pow2(std::max<index_t>(1, kFree / (kPairs ? 2 : 1))));
    static_assert(KS % KQ == 0, "key groups must tile a pass");
    ATTNKIT_UNROLL for (index_t u0 = 0; u0 < KG; u0 += KS) {
        const T* kp = k + u0 * k_stride;
        V acc[RB * KS];
        ATTNKIT_UNROLL for (index_t i = 0; i < RB * KS; ++i) acc[i] = V(0.0f);
        index_t d = 0;
        if constexpr (kPairs) {
            for (; d + 2 * W <= dim; d += 2 * W) {
                ATTNKIT_UNROLL for (index_t g = 0; g < KS; g += KQ) {
                    V e[KQ], o[KQ];
                    ATTNKIT_UNROLL for (index_t u = 0; u < KQ; ++u) {
                        simd::load_bf16_pairs<A>(kp + (g + u) * k_stride + d, e[u], o[u]);
                        simd::keep_in_register(e[u]);
                        simd::keep_in_register(o[u]);
                    }
                    ATTNKIT_UNROLL for (index_t r = 0; r < RB; ++r) {
                        V qe = simd::loadu<A>(q + r * q_stride + d), qo = simd::loadu<A>(q + r * q_stride + d + W);
                        simd::keep_in_register(qe);
                        simd::keep_in_register(qo);
                        ATTNKIT_UNROLL for (index_t u = 0; u < KQ; ++u) {
                            V& a = acc[r * KS + g + u];
                            a = simd::fma(qo, o[u], simd::fma(qe, e[u], a));
                        }
                    }
                }
            }
        }
        // Whole vectors, then the last dim % W elements (zeros past the row in both operands).
        auto step = [&](index_t dd, auto load_key) {
            ATTNKIT_UNROLL for (index_t g = 0; g < KS; g += KQ) {
                V kv[KQ];
                ATTNKIT_UNROLL for (index_t u = 0; u < KQ; ++u) {
                    kv[u] = load_key(kp + (g + u) * k_stride + dd);
                    simd::keep_in_register(kv[u]);
                }
                ATTNKIT_UNROLL for (index_t r = 0; r < RB; ++r) {
                    V qv = simd::loadu<A>(q + r * q_stride + dd);
                    simd::keep_in_register(qv);
                    ATTNKIT_UNROLL for (index_t u = 0; u < KQ; ++u)
                        acc[r * KS + g + u] = simd::fma(qv, kv[u], acc[r * KS + g + u]);
                }
            }
        };
        for (; d + W <= dim; d += W) step(d, [](const T* x) { return simd::load_float<A>(x); });
        if (d < dim) {
            const index_t n = dim - d;
            step(d, [n](const T* x) { return simd::load_float_partial<A>(x, n); });
        }
        constexpr index_t N = RB * KS;
        constexpr index_t NG = (N + W - 1) / W;
        ATTNKIT_UNROLL for (index_t g = 0; g < NG; ++g) {
            V all[W];
            ATTNKIT_UNROLL for (index_t i = 0; i < W; ++i) all[i] = g * W + i < N ? acc[g * W + i] : V(0.0f);
            alignas(64) float sums[W];
            simd::storeu(sums, simd::hsum_each(all));
            for (index_t i = 0; i < W && g * W + i < N; ++i) {
                const index_t r = (g * W + i) / KS, u = (g * W + i) % KS;
                out[r * out_row + (u0 + u) * out_stride] = sums[i];
            }
        }
    }
}

// o_r += sum_u p_r[u * p_stride] v_u (o_r = o + r * o_row, p_r = p + r * p_row) for RB rows
// over kRowValueKeys value rows, each value vector loaded and converted once for all RB rows.
// The weights are first gathered into a small array, so that each broadcast in the loop is a
// load from a fixed offset (read through the strided pointers, the RB * kRowValueKeys addresses
// did not fit the general registers and were reloaded from the stack beside every FMA). The
// columns go CB vectors at a time: RB * CB accumulators stay in registers over the step's keys,
// each broadcast weight feeds CB FMAs and each value vector RB. Per row and column the same
// operations in the same order as accumulate_keys.
template <class A, class T, index_t RB>
ATTNKIT_NOINLINE void accumulate_keys_rows(float* o, index_t o_row, const float* p, index_t p_stride,
                                                index_t p_row, const T* v, index_t v_stride, index_t dim_v) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t KU = kRowValueKeys;
    // Half the registers hold accumulators: with the chunk's value vectors and a broadcast
    // weight that leaves a spare or more (16 registers: 8 + 2 + 1 at RB = 4, 8 + 4 + 1 at 2).
    constexpr index_t CB = std::max<index_t>(kPairOrder<A, T> ? 2 : 1, kRowRegisters<A> / 2 / RB);
    alignas(64) float w[KU * RB];
    ATTNKIT_UNROLL for (index_t u = 0; u < KU; ++u)
        ATTNKIT_UNROLL for (index_t r = 0; r < RB; ++r) w[u * RB + r] = p[r * p_row + u * p_stride];
    // One chunk of NV vectors of columns from c: in pair order (NV even, within the first
    // floor(dim_v / 2W) * 2W columns) each two vectors are one pair load (even elements, then odd
    // ones, as the output rows are kept there); single vectors past that are in natural order.
    auto chunk = [&](index_t c, auto nv) {
        constexpr index_t NV = decltype(nv)::value;
        V a[RB * NV];
        ATTNKIT_UNROLL for (index_t r = 0; r < RB; ++r)
            ATTNKIT_UNROLL for (index_t j = 0; j < NV; ++j) a[r * NV + j] = simd::loadu<A>(o + r * o_row + c + j * W);
        ATTNKIT_UNROLL for (index_t u = 0; u < KU; ++u) {
            V vv[NV];
            if constexpr (kPairOrder<A, T> && NV % 2 == 0) {
                ATTNKIT_UNROLL for (index_t j = 0; j < NV; j += 2)
                    simd::load_bf16_pairs<A>(v + u * v_stride + c + j * W, vv[j], vv[j + 1]);
            } else {
                ATTNKIT_UNROLL for (index_t j = 0; j < NV; ++j) vv[j] = simd::load_float<A>(v + u * v_stride + c + j * W);
            }
            ATTNKIT_UNROLL for (index_t j = 0; j < NV; ++j) simd::keep_in_register(vv[j]);
            ATTNKIT_UNROLL for (index_t r = 0; r < RB; ++r) {
                const V pv(w[u * RB + r]);
                ATTNKIT_UNROLL for (index_t j = 0; j < NV; ++j) a[r * NV + j] = simd::fma(pv, vv[j], a[r * NV + j]);
            }
        }
        ATTNKIT_UNROLL for (index_t r = 0; r < RB; ++r)
            ATTNKIT_UNROLL for (index_t j = 0; j < NV; ++j) simd::storeu(o + r * o_row + c + j * W, a[r * NV + j]);
    };
    constexpr index_t kUnit = kPairOrder<A, T> ? 2 : 1;  // vectors per load: a pair, or one
    index_t c = 0;
    for (; c + CB * W <= dim_v; c += CB * W) chunk(c, std::integral_constant<index_t, CB>{});
    for (; c + kUnit * W <= dim_v; c += kUnit * W) chunk(c, std::integral_constant<index_t, kUnit>{});
    if constexpr (kPairOrder<A, T>) {
        for (; c + W <= dim_v; c += W) chunk(c, std::integral_constant<index_t, 1>{});
    }
    for (; c < dim_v; ++c)
        ATTNKIT_UNROLL for (index_t r = 0; r < RB; ++r) {
            float a = o[r * o_row + c];
            ATTNKIT_UNROLL for (index_t u = 0; u < KU; ++u) a += w[u * RB + r] * simd::to_float(v[u * v_stride + c]);
            o[r * o_row + c] = a;
        }
}

// o += p v for one value row.
template <class A, class T>
ATTNKIT_ALWAYS_INLINE void axpy(float* o, float p, const T* v, index_t dim_v) {
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    const V pv(p);
    index_t c = 0;
    if constexpr (kPairOrder<A, T>) {
        for (; c + 2 * W <= dim_v; c += 2 * W) {
            V e, od;
            simd::load_bf16_pairs<A>(v + c, e, od);
            simd::storeu(o + c, simd::fma(pv, e, simd::loadu<A>(o + c)));
            simd::storeu(o + c + W, simd::fma(pv, od, simd::loadu<A>(o + c + W)));
        }
    }
    for (; c + W <= dim_v; c += W)
        simd::storeu(o + c, simd::fma(pv, simd::load_float<A>(v + c), simd::loadu<A>(o + c)));
    for (; c < dim_v; ++c) o[c] += p * simd::to_float(v[c]);
}

// int8 K or V: x[r * BK + j] *= scale of key row j0 + j, for the keys [j0, j0 + nk) that row r
// sees (lo[r] <= key < hi[r]); the scales of a head are gathered once (contiguous, so the
// multiplies vectorise) for all its rows. Scores or weights of keys a row does not see are
// never read, so they are left alone.
inline void scale_block(const strided_rows_t<float>& scales, const row_block& rb, index_t j0, index_t nk, float* x,
                 const std::vector<index_t>& lo, const std::vector<index_t>& hi, std::vector<float>& buf) {
    const index_t RH = rb.rows_per_kv_head();
    for (index_t h = 0; h < rb.n_hk; ++h) {
        const float* s = scales.row(rb.b, j0, rb.hk + h);
        for (index_t j = 0; j < nk; ++j) buf[static_cast<std::size_t>(j)] = s[j * scales.sl];
        for (index_t r = h * RH; r < (h + 1) * RH; ++r) {
            const index_t a = std::max(lo[r], j0) - j0, z = std::min(hi[r], j0 + nk) - j0;
            simd::multiply_into<simd::default_arch>(x + r * kRowBlockKeys + a, buf.data() + a, z - a);
        }
    }
}

// emit(r, o_row, summary) receives each row's output over keys [ks0, ks1), scaled by the
// policy's emit_scale, with the policy's summary (softmax: normalised, and its lse). buf is
// reused scratch (any contents; resized and cleared here). Problem is an attention problem whose
// q, k, v rows may be float, Eigen::bfloat16 or Eigen::half; one value set.
//
// A block of nk keys is walked twice in the same order: first K for the scores, then, after the
// policy has turned each row's scores into weights, V for the output. Step t takes the keys
// t + u * (nk / KG), u < KG (KU for V), and within them runs head by head, so each of the KG
// streams reads its rows front to back; the last nk % KG keys follow one at a time. Where a
// tensor's heads lie further apart than its keys, its walk takes the steps of one head after
// another instead, with consecutive keys per step for short rows (walk_order). Every line of K
// and V is read once.
template <class A, class Policy, class Problem, class Emit>
void row_kernel(const Problem& p, const Policy& pol, const row_block& rb, index_t ks0, index_t ks1,
                std::vector<float>& buf, Emit&& emit) {
    using KT = std::remove_const_t<std::remove_pointer_t<decltype(p.k.data)>>;
    using VT = std::remove_const_t<std::remove_pointer_t<decltype(p.v.data)>>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr index_t BK = kRowBlockKeys;
    constexpr index_t KU = kRowValueKeys;
    constexpr index_t KG = kRowScoreKeys;
    static_assert(BK % W == 0 && BK % KU == 0 && BK % KG == 0, "steps must tile the block");
    static_assert(KU == KG, "each walk hints the other's rows in the other's steps");
    static_assert(KG == walk_order::kKeys, "the walks take kRowScoreKeys keys per step");
    const index_t D = p.s.dim, Dv = p.s.dim_v, R = rb.rows(), RH = rb.rows_per_kv_head();
    const index_t Dp = (D + W - 1) / W * W;  // padded query rows: whole-vector loads

    // Zeroed by memset: GCC 12 at -O2 fills a vector<float> one element at a time.
    const std::size_t buf_floats = static_cast<std::size_t>(R * (Dp + Dv + BK + Policy::kStateArrays));
    buf.resize(buf_floats);
    std::memset(buf.data(), 0, buf_floats * sizeof(float));
    // Per-thread scratch (scratch.hpp): a decode step allocates nothing after the first.
    scratch_lease<index_t> lo_lease, hi_lease;
    std::vector<index_t>& lo = lo_lease.get();
    std::vector<index_t>& hi = hi_lease.get();
    lo.assign(static_cast<std::size_t>(R), 0);
    hi.assign(static_cast<std::size_t>(R), 0);
    float* qs = buf.data();
    float* o = qs + R * Dp;
    float* sc = o + R * Dv;  // scores, then weights, of the current block: [R][BK]
    float* state = sc + R * BK;  // the policy's row state: kStateArrays arrays of R
    pol.init(state, R);
    scratch_lease<> row_scales_lease;  // int8 K/V: one block's scales of a head
    std::vector<float>& row_scales = row_scales_lease.get();
    if (simd::kIsScaledStorage<KT> || simd::kIsScaledStorage<VT>) row_scales.resize(static_cast<std::size_t>(BK));

    const mask_params mp = p.mask(rb.b);
    index_t min_lo = ks1, max_hi = ks0;
    for (index_t r = 0; r < R; ++r) {
        const auto* qr = p.q.row(rb.b, rb.pos(r), rb.head(r));
        for (index_t d = 0; d < D; ++d) {
            const index_t at = kPairOrder<A, KT> ? pair_pos<A>(d, D) : d;
            qs[r * Dp + at] = simd::to_float(qr[d]) * p.q_scale;
        }
        row_interval(mp, rb.pos(r), ks0, ks1, lo[r], hi[r]);
        if (lo[r] < hi[r]) {
            min_lo = std::min(min_lo, lo[r]);
            max_hi = std::max(max_hi, hi[r]);
        }
    }

    const index_t ksl = p.k.sl, ksh = p.k.sh, vsl = p.v.sl, vsh = p.v.sh;
    // Blocks end on multiples of BK: a page of a paged cache holds whole blocks (page_rows is a
    // multiple of BK), so each block is one run of K and of V rows, addressed from its first row.
    for (index_t j0 = min_lo, j1; j0 < max_hi; j0 = j1) {
        j1 = std::min(max_hi, (j0 / BK + 1) * BK);
        const index_t nk = j1 - j0;
        const KT* kb = p.k.row(rb.b, j0, rb.hk);
        const VT* vb = p.v.row(rb.b, j0, rb.hk);
        auto active = [&](index_t r) { return j0 < hi[r] && j0 + nk > lo[r]; };
        // The other tensor's hints (prefetch_other): this block's V during its scores, the
        // next block's K (when it is a whole one) during its values, step by step in the
        // order the walks will read them.
        const bool hint = prefetch_other<A, KT, VT>(RH) && nk == BK;
        const KT* kn = hint && j1 + BK <= max_hi ? p.k.row(rb.b, j1, rb.hk) : nullptr;

        // Scores, KG keys at a time, head by head; K rows shared by a head's rows. The KG keys
        // of a step are sj apart: KG sequential streams through the block (see the header).
        const index_t sj = nk / KG;
        // Rows [r, r + n) of a head when any of them sees the block (a row that does not gets
        // scores nobody reads).
        auto any_active = [&](index_t r, index_t n) {
            for (index_t i = r; i < r + n; ++i)
                if (active(i)) return true;
            return false;
        };
        const walk_order k_walk = make_walk<KT>(sj, rb.n_hk, p.s.heads_k, ksl, ksh, D);
        const walk_order v_walk = make_walk<VT>(nk / KU, rb.n_hk, p.s.heads_k, vsl, vsh, Dv);
        const index_t kf = k_walk.gap();  // key distance within a step
        for (index_t w = 0; w < k_walk.size(); ++w) {
            const index_t t = k_walk.step(w), h = k_walk.head(w), j = k_walk.first(t);
            const KT* kr = kb + j * ksl + h * ksh;
            if (hint)
                prefetch_rows_l2(vb + v_walk.first(t) * vsl + h * vsh, v_walk.gap() * vsl, KG,
                                 Dv * index_t(sizeof(VT)));
            index_t r = h * RH;
            const index_t r_end = r + RH;
            if constexpr (kGroupRows<A, KT>) {
                for (; r + 4 <= r_end; r += 4)
                    if (any_active(r, 4))
                        score_keys_rows<A, KT, 4>(qs + r * Dp, Dp, kr, kf * ksl, D, sc + r * BK + j, kf, BK);
                for (; r + 2 <= r_end; r += 2)
                    if (any_active(r, 2))
                        score_keys_rows<A, KT, 2>(qs + r * Dp, Dp, kr, kf * ksl, D, sc + r * BK + j, kf, BK);
            }
            for (; r < r_end; ++r)
                if (active(r)) score_keys<A>(qs + r * Dp, kr, kf * ksl, D, sc + r * BK + j, kf);
        }
        for (index_t j = sj * KG; j < nk; ++j)
            for (index_t h = 0; h < rb.n_hk; ++h) {
                const KT* kr = kb + j * ksl + h * ksh;
                for (index_t r = h * RH; r < (h + 1) * RH; ++r)
                    if (active(r)) sc[r * BK + j] = score_key<A>(qs + r * Dp, kr, D);
            }
        if constexpr (simd::kIsScaledStorage<KT>) scale_block(p.k_scale, rb, j0, nk, sc, lo, hi, row_scales);

        // The policy per row over the block: weights of the visible keys [a, z), and the factor
        // for the output so far.
        for (index_t r = 0; r < R; ++r) {
            if (!active(r)) continue;
            const index_t a = std::max(lo[r], j0) - j0, z = std::min(hi[r], j0 + nk) - j0;
            const float alpha = pol.template row_weights<A>(sc + r * BK, nk, a, z, state + r, R);
            if (alpha != 1.0f) simd::scale_into<A>(o + r * Dv, alpha, Dv);
        }
        if constexpr (simd::kIsScaledStorage<VT>) scale_block(p.v_scale, rb, j0, nk, sc, lo, hi, row_scales);

        // Values, KU keys at a time (as for K: v_walk), head by head. Keys a row does not see
        // are skipped rather than weighted by 0, so that a NaN or Inf in their value rows
        // (0 * Inf = NaN) stays out of it; a visible key always contributes, even at weight 0.
        const index_t sv = nk / KU, vf = v_walk.gap();
        for (index_t w = 0; w < v_walk.size(); ++w) {
            const index_t t = v_walk.step(w), h = v_walk.head(w);
            const index_t key = j0 + v_walk.first(t), last = key + (KU - 1) * vf;
            auto sees_all = [&](index_t r) { return lo[r] <= key && hi[r] > last; };
            auto value_row = [&](index_t r, const VT* vr) {
                const float* pr = sc + r * BK + (key - j0);
                if (sees_all(r)) {
                    accumulate_keys<A>(o + r * Dv, pr, vf, vr, vf * vsl, Dv);
                } else {
                    for (index_t u = 0; u < KU; ++u)
                        if (key + u * vf >= lo[r] && key + u * vf < hi[r])
                            axpy<A>(o + r * Dv, pr[u * vf], vr + u * vf * vsl, Dv);
                }
            };
            // Rows [r, r + n) of a head together when each sees all KU keys of the step.
            auto all_see = [&](index_t r, index_t n) {
                for (index_t i = r; i < r + n; ++i)
                    if (!sees_all(i)) return false;
                return true;
            };
            const VT* vr = vb + (key - j0) * vsl + h * vsh;
            if (kn) prefetch_rows_l2(kn + k_walk.first(t) * ksl + h * ksh, kf * ksl, KG, D * index_t(sizeof(KT)));
            index_t r = h * RH;
            const index_t r_end = r + RH;
            if constexpr (kGroupRows<A, VT>) {
                for (; r + 4 <= r_end && all_see(r, 4); r += 4)
                    accumulate_keys_rows<A, VT, 4>(o + r * Dv, Dv, sc + r * BK + (key - j0), vf, BK, vr, vf * vsl, Dv);
                for (; r + 2 <= r_end && all_see(r, 2); r += 2)
                    accumulate_keys_rows<A, VT, 2>(o + r * Dv, Dv, sc + r * BK + (key - j0), vf, BK, vr, vf * vsl, Dv);
            }
            for (; r < r_end; ++r) value_row(r, vr);
        }
        for (index_t j = sv * KU; j < nk; ++j) {
            const index_t key = j0 + j;
            for (index_t h = 0; h < rb.n_hk; ++h) {
                const VT* vr = vb + (key - j0) * vsl + h * vsh;
                for (index_t r = h * RH; r < (h + 1) * RH; ++r)
                    if (key >= lo[r] && key < hi[r]) axpy<A>(o + r * Dv, sc[r * BK + j], vr, Dv);
            }
        }
    }

    scratch_lease<> natural_lease;
    std::vector<float>& natural = natural_lease.get();
    if (kPairOrder<A, VT>) natural.resize(static_cast<std::size_t>(Dv));
    for (index_t r = 0; r < R; ++r) {
        const float scale = pol.emit_scale(state + r, R);
        float* orow = o + r * Dv;
        simd::scale_into<A>(orow, scale, Dv);
        if constexpr (kPairOrder<A, VT>) {
            for (index_t c = 0; c < Dv; ++c) natural[static_cast<std::size_t>(c)] = orow[pair_pos<A>(c, Dv)];
            orow = natural.data();
        }
        emit(r, orow, pol.summary(state + r, R));
    }
}

}  // namespace detail
}  // namespace attnkit
