// The fused backward pass of multi-token attention (attnkit::mta_attention_backward).
//
// Recompute, do not store. Per batch item, blocks of query rows [i0, i1) for all heads (head
// mixing couples them) in order; each block recomputes the forward for the rows its gradients
// need and reverses it stage by stage. The convolutions' query taps look back (row i reads rows
// i - (c_q - 1) .. i), so their transposes look forward: dX of rows [i0, i1) needs dY of the pre
// convolution for rows up to i1 + hp (hp = c_q,pre - 1), which needs dP for rows up to i1 + hp,
// which needs the post convolution's dC for rows up to e2 = i1 + hp + hq (hq = c_q,post - 1), and
// those need P for hq rows before i0 and the scores for hp more:
//
//   rows      [x0, e2)   X = Mask0(scale q k^T)        x0 = i0 - hq - hp (clipped at 0)
//             [p0, e2)   Y = conv, mix, P = softmax    p0 = i0 - hq
//             [i0, e2)   P1 = Mask0(conv(P)), P2 = mix, O = P2 V, row stages; dO, dP2 = dO V^T,
//                        dP1 = mix^T, dC = dP1
//             [i0, e1)   dP = conv^T(dC), dY = softmax^T, dY1 = mix^T   e1 = i1 + hp
//             [i0, i1)   dX = conv^T(dY1), dS = scale Mask0(dX); d_q = dS K, d_k += dS^T Q,
//                        d_v += P2^T dO, and every weight gradient's share: only the block's
//                        own rows [i0, i1) add to an accumulated gradient, the halo rows are
//                        recomputed by the next block and added there, so nothing is counted
//                        twice.
//
// Each array is dense [H][rows][keys] floats for the block (detail/mta/backward_ops.hpp's clean
// rows): O(block rows x L x H) scratch, with the block height chosen so that the arrays fit
// kBackwardScratchBytes, kept by the calling thread for its next call; the [H, L, L] tensors never
// exist. The products with q, k, v and d_out are the engine's GEMM (detail/gemm.hpp, transposed
// operands read in place); the head mixings are detail/mta/tile_ops.hpp's head_mix.
//
// Most stages read only their own head's rows (a grouped convolution its group's, d_k and d_v a
// key/value head's query heads): between two stages that read across heads (the mixings, the
// row stages), a block runs those stages one unit of heads after the other (per_head), so that a
// unit's rows of the arrays stay in the caches between stages.
//
// Threads: the blocks run in order and each stage of a block is split over heads (key/value heads
// for d_k and d_v, rows for the head mixing, fixed chunks of rows for its weight gradient), every
// output element and every accumulator written by one task in a fixed order; the weight
// gradients are summed in double per head (the mixings': per chunk of rows, the chunks added in
// order), block by block. So the results are the same bits for any thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "attnkit/detail/gemm.hpp"
#include "attnkit/detail/micro_kernels.hpp"
#include "attnkit/detail/mta/backward_ops.hpp"
#include "attnkit/detail/mta/params.hpp"
#include "attnkit/detail/mta/tile_ops.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {
namespace mta {

#ifndef ATTNKIT_MTA_BACKWARD_BLOCK_ROWS
#define ATTNKIT_MTA_BACKWARD_BLOCK_ROWS 64
#endif
#ifndef ATTNKIT_MTA_BACKWARD_SCRATCH_MIB
#define ATTNKIT_MTA_BACKWARD_SCRATCH_MIB 96
#endif
constexpr index_t kBackwardBlockRows = ATTNKIT_MTA_BACKWARD_BLOCK_ROWS;
constexpr index_t kBackwardScratchBytes = index_t(ATTNKIT_MTA_BACKWARD_SCRATCH_MIB) << 20;
// The most [H][rows][keys] arrays alive at once (all stages on): X, Y1, P, P1, P2 and dP2.
constexpr index_t kBackwardArrays = 6;

struct backward_args {
    view<const float, 4> q, k, v, d_out;
    view<float, 4> d_q, d_k, d_v;
    mta_weight_grads dw;
};

template <class A>
class backward_runner {
    using V = simd::vfloat<A>;
    static constexpr index_t RT = tile_traits<A>::kTileRows;
    // The clean width's multiple: the convolution's key blocks and kTileRows divide it.
    static constexpr index_t kKeyAlign = 128;
    // L * H below which the stages run serially (docs/benchmarks.md, "Training": at L = 56, H = 4
    // the dispatches cost more than the work).
    static constexpr index_t kSerialStageWork = 2048;

   public:
    // block_rows > 0 overrides the budgeted block height (tests: many blocks on short sequences;
    // the benchmark's materialised baseline: one block of the whole sequence).
    backward_runner(const backward_args& g, const shape& ms, const params& w, thread_pool* pool, index_t block_rows = 0)
        : g_(g), w_(w), pool_(pool) {
        const attention_shape& s = ms.s;
        B_ = s.batch, L_ = s.len_q, H_ = s.heads, Hk_ = s.heads_k, grp_ = s.group(), D_ = s.dim, Dv_ = s.dim_v;
        scale_ = resolve_scale(w.scale, D_);
        hp_ = w.pre.on() ? w.pre.c_q - 1 : 0;
        hq_ = w.post.on() ? w.post.c_q - 1 : 0;
        const index_t hk = std::max(w.pre.on() ? w.pre.key_halo() : 0, w.post.on() ? w.post.key_halo() : 0);
        pad_ = round_up(std::max<index_t>(hk, 1), 16);
        ls_ = pad_ + round_up(std::max<index_t>(L_, 1), kKeyAlign) + pad_;
        const index_t halo = 2 * (hp_ + hq_);
        const index_t fit = kBackwardScratchBytes / (kBackwardArrays * H_ * ls_ * index_t(sizeof(float))) - halo;
        block_ = std::max<index_t>(8, std::min(kBackwardBlockRows, fit));
        if (block_rows > 0) block_ = block_rows;
        block_ = std::min(block_, std::max<index_t>(L_, 1));
        nr_ = block_ + halo;
        // Each stage below is one dispatch over the pool (heads or rows of a block). On short
        // sequences a stage is a few microseconds of work, less than waking the pool's threads
        // and waiting for them: run those on the calling thread. Every index of a stage writes
        // its own outputs, so where it runs changes no bit.
        if (L_ * H_ < kSerialStageWork) pool_ = nullptr;
        unit_ = std::lcm(std::lcm(w.pre.on() ? w.pre.groups : 1, w.post.on() ? w.post.groups : 1), grp_);
        // Chained while there are units enough for the threads (the bits are the same either way).
        chain_ = H_ / unit_ >= (pool_ ? static_cast<index_t>(pool_->size()) : 1);
        if (w.pre.on()) flip_pre_ = flipped(w.kq_pre, w.pre);
        if (w.post.on()) flip_post_ = flipped(w.kq_post, w.post);
        if (w.head_pre_on()) wt_pre_ = transposed(w.head_pre);
        if (w.head_post_on()) wt_post_ = transposed(w.head_post);
        acc_kq_pre_.assign(w.kq_pre.size(), 0.0);
        acc_kq_post_.assign(w.kq_post.size(), 0.0);
        acc_head_pre_.assign(w.head_pre.size(), 0.0);
        acc_head_post_.assign(w.head_post.size(), 0.0);
        acc_norm_.assign(w.norm_weight.size(), 0.0);
        acc_gate_.assign(w.gate_weight.size(), 0.0);
        zero_row_.assign(static_cast<std::size_t>(ls_), 0.0f);
        if (o_.size() < static_cast<std::size_t>(nr_ * H_ * Dv_)) o_.resize(static_cast<std::size_t>(nr_ * H_ * Dv_));
        if (do_.size() < o_.size()) do_.resize(o_.size());
    }

    void run() {
        zero(g_.d_k);
        zero(g_.d_v);
        for (index_t b = 0; b < B_; ++b)
            for (index_t i0 = 0; i0 < L_; i0 += block_) block(b, i0, std::min(L_, i0 + block_));
        store(acc_kq_pre_, g_.dw.kq_pre);
        store(acc_head_pre_, g_.dw.head_pre);
        store(acc_kq_post_, g_.dw.kq_post);
        store(acc_head_post_, g_.dw.head_post);
        store(acc_norm_, g_.dw.norm_weight);
        store(acc_gate_, g_.dw.gate_weight);
        if (g_.dw.gate_bias) *g_.dw.gate_bias = static_cast<float>(acc_bias_);
    }

   private:
    const backward_args& g_;
    const params& w_;
    thread_pool* pool_;
    index_t B_ = 0, L_ = 0, H_ = 0, Hk_ = 0, grp_ = 1, D_ = 0, Dv_ = 0;
    float scale_ = 1.0f;
    index_t hp_ = 0, hq_ = 0, pad_ = 16, ls_ = 0, block_ = 1, nr_ = 1;
    std::vector<float> flip_pre_, flip_post_, wt_pre_, wt_post_;
    std::vector<double> acc_kq_pre_, acc_kq_post_, acc_head_pre_, acc_head_post_, acc_norm_, acc_gate_;
    std::vector<double> mix_part_;  // mix_grad's per-chunk sums
    double acc_bias_ = 0.0;
    // The block arrays and o_, do_, kept by the calling thread across calls (detail/scratch.hpp):
    // tens of MiB, which allocated per call came from fresh pages, every one faulted in and zeroed
    // on every call (docs/benchmarks.md, "The block arrays kept across calls").
    struct slot_pool {
        std::vector<std::vector<float>> slots;
        std::vector<float> o, d_o;
    };
    scratch_object<slot_pool> pool_lease_;
    std::vector<float> zero_row_;  // keys 0 .. ls_ of a row of zeros
    // [rows from i0][H][Dv]: P V before the row stages, and its gradient; every row a block reads
    // is written first in the block.
    std::vector<float>& o_ = pool_lease_.get().o;
    std::vector<float>& do_ = pool_lease_.get().d_o;
    std::vector<std::vector<float>>& slots_ = pool_lease_.get().slots;
    std::vector<bool> busy_;  // the slots this call has taken, and which of them are in use
    // per_head(): the heads a chained task runs (a convolution group, a key/value head's query
    // heads: every head a head's stages read), and whether stages are chained.
    index_t unit_ = 1;
    bool chain_ = false;
    std::vector<std::function<void(index_t)>> chained_;
    index_t x0_ = 0, clean_ = 0;  // the block's first array row and clean end (keys)

    // The transpose of a convolution as a convolution: kernel [n][m'][a'][c'] for input head n,
    // its group's output heads g0 + m' read with row offset +a' and key offset c' - hk, is the
    // forward kernel theta[g0 + m'][n - g0][c_q - 1 - a'][c_k - 1 - c'].
    std::vector<float> flipped(const std::vector<float>& th, const conv_shape& cs) const {
        const index_t G = cs.groups, cq = cs.c_q, ck = cs.c_k;
        std::vector<float> f(th.size());
        for (index_t n = 0; n < H_; ++n)
            for (index_t m = 0; m < G; ++m)
                for (index_t a = 0; a < cq; ++a)
                    for (index_t c = 0; c < ck; ++c) {
                        const index_t h = (n / G) * G + m;
                        f[static_cast<std::size_t>(((n * G + m) * cq + a) * ck + c)] =
                            th[static_cast<std::size_t>(((h * G + n % G) * cq + (cq - 1 - a)) * ck + (ck - 1 - c))];
                    }
        return f;
    }
    std::vector<float> transposed(const std::vector<float>& w) const {
        std::vector<float> t(w.size());
        for (index_t h = 0; h < H_; ++h)
            for (index_t g = 0; g < H_; ++g)
                t[static_cast<std::size_t>(g * H_ + h)] = w[static_cast<std::size_t>(h * H_ + g)];
        return t;
    }

    static void zero(const view<float, 4>& x) {
        for (index_t a = 0; a < x.dims[0]; ++a)
            for (index_t b = 0; b < x.dims[1]; ++b)
                for (index_t c = 0; c < x.dims[2]; ++c) std::fill_n(&x(a, b, c, 0), x.dims[3], 0.0f);
    }
    template <int N>
    static void store(const std::vector<double>& src, const view<float, N>& dst) {
        if (dst.data == nullptr) return;
        for (index_t e = 0; e < dst.size(); ++e)
            dst.data[element_offset(dst, e)] = static_cast<float>(src[static_cast<std::size_t>(e)]);
    }

    int take() {
        for (std::size_t s = 0; s < busy_.size(); ++s)
            if (!busy_[s]) {
                busy_[s] = true;
                return static_cast<int>(s);
            }
        // A slot of an earlier call holds its values, at that call's row layout. Every stage writes
        // the keys it produces up to the block's clean end; the padding before key 0, which the
        // convolutions read as zeros, is never written, so it is zeroed here, once per call.
        const std::size_t s = busy_.size();
        if (s == slots_.size()) slots_.emplace_back();
        std::vector<float>& buf = slots_[s];
        const std::size_t n = static_cast<std::size_t>(H_ * nr_ * ls_);
        if (buf.size() < n) buf.resize(n);
        for (index_t r = 0; r < H_ * nr_; ++r) std::fill_n(buf.data() + r * ls_, pad_, 0.0f);
        busy_.push_back(true);
        return static_cast<int>(s);
    }
    void give(int s) { busy_[static_cast<std::size_t>(s)] = false; }

    // Key 0 of absolute row i of head h in slot s.
    float* row(int s, index_t h, index_t i) {
        return slots_[static_cast<std::size_t>(s)].data() + (h * nr_ + (i - x0_)) * ls_ + pad_;
    }
    matrix_ref<const float> q_rows(index_t b, index_t h, index_t r0, index_t r1) const {
        return {g_.q.data + b * g_.q.strides[0] + r0 * g_.q.strides[1] + h * g_.q.strides[2], r1 - r0, D_,
                g_.q.strides[1]};
    }
    matrix_ref<const float> k_rows(index_t b, index_t kvh, index_t n) const {
        return {g_.k.data + b * g_.k.strides[0] + kvh * g_.k.strides[2], n, D_, g_.k.strides[1]};
    }
    matrix_ref<const float> v_rows(index_t b, index_t kvh, index_t n) const {
        return {g_.v.data + b * g_.v.strides[0] + kvh * g_.v.strides[2], n, Dv_, g_.v.strides[1]};
    }
    // Rows [r0, r1) of head h of an array, keys [0, n).
    matrix_ref<float> rows_of_slot(int s, index_t h, index_t r0, index_t r1, index_t n) {
        return {row(s, h, r0), r1 - r0, n, ls_};
    }
    static matrix_ref<const float> in(const matrix_ref<float>& m) { return {m.data, m.rows, m.cols, m.stride}; }
    // o_ / do_ rows from i0 of head h.
    matrix_ref<float> head_rows(std::vector<float>& x, index_t h, index_t n) {
        return {x.data() + h * Dv_, n, Dv_, H_ * Dv_};
    }

    // Whether rows of a matrix hold only finite values.
    static bool finite_rows(const matrix_ref<const float>& m) {
        for (index_t r = 0; r < m.rows; ++r)
            if (!all_finite<A>(m.data + r * m.stride, m.cols)) return false;
        return true;
    }

    // The products whose causal zeros meet another operand's rows past the diagonal: a weight of
    // 0 times a NaN or Inf there would be NaN, where the exact product never reads that row. With
    // every such row finite (the common case) the GEMM runs; otherwise each row takes only the
    // rows it sees, so that a non-finite value stays in the rows that depend on it.
    //   c = a b over row i's keys 0 .. i       (a: rows [r0, r0 + c.rows) of an array)
    void causal_product(const matrix_ref<const float>& a, index_t r0, const matrix_ref<const float>& b,
                        const matrix_ref<float>& c) {
        if (finite_rows(b)) return gemm_on<A>(a, gemm_op::none, b, gemm_op::none, c);
        for (index_t t = 0; t < c.rows; ++t) {
            float* cr = c.data + t * c.stride;
            std::fill(cr, cr + c.cols, 0.0f);
            const float* ar = a.data + t * a.stride;
            for (index_t j = 0; j <= r0 + t && j < a.cols; ++j)
                for (index_t d = 0; d < c.cols; ++d) cr[d] += ar[j] * b.data[j * b.stride + d];
        }
    }
    //   c += a^T b where key j takes the rows i >= j only (a: rows [r0, r0 + a.rows), b the same rows)
    void causal_product_transposed(const matrix_ref<const float>& a, index_t r0, const matrix_ref<const float>& b,
                                   const matrix_ref<float>& c) {
        if (finite_rows(b)) return gemm_on<A>(a, gemm_op::transpose, b, gemm_op::none, c, gemm_mode::add);
        for (index_t j = 0; j < c.rows; ++j) {
            float* cr = c.data + j * c.stride;
            for (index_t t = std::max<index_t>(0, j - r0); t < a.rows; ++t) {
                const float w = a.data[t * a.stride + j];
                for (index_t d = 0; d < c.cols; ++d) cr[d] += w * b.data[t * b.stride + d];
            }
        }
    }

    template <class F>
    void over(index_t n, F&& f) {
        parallel_for(pool_, n, [&](std::int64_t t) { f(static_cast<index_t>(t)); });
    }

    // A stage of a block that works on each head alone (reading at most the other heads of its
    // unit: a grouped convolution's group). Staged, it runs at once for every head; chained
    // (chain_), it is kept, and run_chained() runs the kept stages unit by unit, a task per unit
    // of heads (unit_: the convolutions' groups and a key/value head's query heads), every stage
    // for the unit before the next unit. A stage that reads across units (the head mixings and
    // the row stages read every head of a row) runs the kept stages first. Each head's arithmetic
    // is the same either way, so are the bits; what changes is that a unit's rows of the block
    // arrays ([rows][L] floats, 0.7 MiB per head at L 2048) stay in the caches from one stage to
    // the next, where the arrays of all heads (tens of MiB) stream through them at every stage.
    // Chained stages capture by value: block()'s slot variables change after a stage is kept.
    template <class F>
    void per_head(F&& f) {
        if (!chain_) return over(H_, f);
        chained_.emplace_back([f = std::forward<F>(f), n = unit_](index_t u) {
            for (index_t h = u * n; h < (u + 1) * n; ++h) f(h);
        });
    }
    // The same for a stage over key/value heads (d_k, d_v: each sums its query heads' rows).
    template <class F>
    void per_kv_head(F&& f) {
        if (!chain_) return over(Hk_, f);
        chained_.emplace_back([f = std::forward<F>(f), n = unit_ / grp_](index_t u) {
            for (index_t kvh = u * n; kvh < (u + 1) * n; ++kvh) f(kvh);
        });
    }
    void run_chained() {
        if (chained_.empty()) return;
        over(H_ / unit_, [&](index_t u) {
            for (const auto& f : chained_) f(u);
        });
        chained_.clear();
    }

    // dst rows [r0, r1) = mix(src) with w [H][H] as [out][in].
    void mix_rows(const float* w, int src, int dst, index_t r0, index_t r1) {
        run_chained();
        over(r1 - r0, [&](index_t t) {
            const index_t i = r0 + t, n = round_up(i + 1, RT);
            std::vector<const float*> from(static_cast<std::size_t>(H_));
            std::vector<float*> out(static_cast<std::size_t>(H_));
            for (index_t h = 0; h < H_; ++h) from[h] = row(src, h, i), out[h] = row(dst, h, i);
            head_mix<A>(from.data(), out.data(), w, H_, n);
            for (index_t h = 0; h < H_; ++h) std::fill(out[h] + n, out[h] + clean_, 0.0f);
        });
    }

    // dw[h][g] += sum over rows [i0, i1) of <dy[h] row, x[g] row> (keys 0 .. row). The rows go in
    // fixed chunks of kMixRows, a task per chunk, all H^2 pairs of a row together: blocks of
    // kMixH x kMixG pairs share their loads (backward_ops.hpp's dots_block), heads left over by
    // the blocks take a dot per pair. Within a row each x row is read H / kMixH times and each dy
    // row H / kMixG times, from L2 while the row's 2 H rows (8 H L bytes) fit there; from beyond
    // it once. A task per dy head, before, read every x row H times from beyond L2. Each pair's
    // float dots are summed in double per chunk, rows in order, and the chunks' sums added to dw
    // in chunk order: the same sums for any thread count.
    static constexpr int kMixH = 2, kMixG = 4;
    static constexpr index_t kMixRows = 8;
    void mix_grad(std::vector<double>& dw, int dy, int x, index_t i0, index_t i1) {
        run_chained();
        const index_t nc = (i1 - i0 + kMixRows - 1) / kMixRows, HH = H_ * H_;
        mix_part_.assign(static_cast<std::size_t>(nc * HH), 0.0);
        over(nc, [&](index_t c) {
            double* s = mix_part_.data() + c * HH;
            const index_t r0 = i0 + c * kMixRows, r1 = std::min(i1, r0 + kMixRows);
            for (index_t i = r0; i < r1; ++i)
                for (index_t h0 = 0; h0 < H_; h0 += kMixH)
                    for (index_t g0 = 0; g0 < H_; g0 += kMixG) {
                        const index_t nh = std::min<index_t>(kMixH, H_ - h0), ng = std::min<index_t>(kMixG, H_ - g0);
                        if (nh == kMixH && ng == kMixG) {
                            const float* ya[kMixH];
                            const float* xb[kMixG];
                            for (int a = 0; a < kMixH; ++a) ya[a] = row(dy, h0 + a, i);
                            for (int b = 0; b < kMixG; ++b) xb[b] = row(x, g0 + b, i);
                            float d[kMixH][kMixG];
                            dots_block<A, kMixH, kMixG>(ya, xb, i + 1, d);
                            for (int a = 0; a < kMixH; ++a)
                                for (int b = 0; b < kMixG; ++b) s[(h0 + a) * H_ + g0 + b] += static_cast<double>(d[a][b]);
                        } else {
                            for (index_t a = 0; a < nh; ++a)
                                for (index_t b = 0; b < ng; ++b)
                                    s[(h0 + a) * H_ + g0 + b] +=
                                        static_cast<double>(simd::dot<A>(row(dy, h0 + a, i), row(x, g0 + b, i), i + 1));
                        }
                    }
        });
        for (index_t c = 0; c < nc; ++c)
            for (index_t t = 0; t < HH; ++t) dw[static_cast<std::size_t>(t)] += mix_part_[static_cast<std::size_t>(c * HH + t)];
    }

    // Output rows [r0, r1) of slot dst = the convolution (kernel k [H][G][c_q][c_k] per output
    // head) of slot src, whose rows [lo, hi) exist; output head h reads the G heads of its group.
    void conv_rows(int dst, int src, const float* k, const conv_shape& cs, index_t row_off, index_t r0, index_t r1,
                   index_t lo, index_t hi) {
        const index_t G = cs.groups, cq = cs.c_q, ck = cs.c_k;
        per_head([ATTNKIT_COPY_CAPTURE](index_t h) {
            std::vector<const float*> from(static_cast<std::size_t>(G));
            const index_t g0 = h / G * G;
            for (index_t m = 0; m < G; ++m) from[m] = row(src, g0 + m, x0_);
            const conv_source cs_src{from.data(), x0_, lo, hi, ls_};
            std::vector<float*> outs(static_cast<std::size_t>(r1 - r0));
            for (index_t i = r0; i < r1; ++i) outs[static_cast<std::size_t>(i - r0)] = row(dst, h, i);
            conv_rows_range<A>(outs.data(), cs_src, G, k + h * G * cq * ck, cq, ck, row_off, r0, r1, clean_);
        });
    }

    // dk[h] += the kernel gradient of output rows [i0, i1) of dy against the source src.
    void conv_grad(std::vector<double>& dk, int dy, int src, const conv_shape& cs, index_t row_off, index_t i0,
                   index_t i1, index_t lo, index_t hi) {
        const index_t G = cs.groups, cq = cs.c_q, ck = cs.c_k;
        double* const dkp = dk.data();
        per_head([ATTNKIT_COPY_CAPTURE](index_t h) {
            std::vector<const float*> from(static_cast<std::size_t>(G));
            const index_t g0 = h / G * G;
            for (index_t m = 0; m < G; ++m) from[m] = row(src, g0 + m, x0_);
            const conv_source cs_src{from.data(), x0_, lo, hi, ls_};
            for (index_t i = i0; i < i1; i += kConvGradRows) {
                // Rows past the block's own are the next block's: a zero row stands in for them,
                // and the keys end with the last real row's (past it, the source rows' keys plus
                // the key halo could reach beyond what this block wrote, left from an earlier
                // block or call: 0 times a NaN there would be NaN).
                const float* rows[kConvGradRows];
                for (index_t r = 0; r < kConvGradRows; ++r) rows[r] = i + r < i1 ? row(dy, h, i + r) : zero_row_.data();
                conv_grad_rows<A>(dkp + h * G * cq * ck, rows, cs_src, G, cq, ck, row_off, i,
                                  round_up(std::min(i + kConvGradRows, i1), simd::kLanes<A>));
            }
        });
    }

    // The row stages (group norm, depth scale, gate) of rows [i0, e2), reversed: do_ from d_out
    // and o_ (read only with the norm or the gate: block() forms it only then), in double (a few
    // flops per output element); the norm's and gate's gradients from the block's own rows
    // [i0, i1), summed in row and head order.
    void row_stages_backward(index_t b, index_t i0, index_t i1, index_t e2) {
        run_chained();
        const bool norm = !w_.norm_weight.empty(), gate = !w_.gate_weight.empty();
        const double depth = static_cast<double>(w_.depth);
        std::vector<double> n(static_cast<std::size_t>(Dv_)), dn(static_cast<std::size_t>(Dv_));
        for (index_t i = i0; i < e2; ++i)
            for (index_t h = 0; h < H_; ++h) {
                const float* o = o_.data() + ((i - i0) * H_ + h) * Dv_;
                float* d = do_.data() + ((i - i0) * H_ + h) * Dv_;
                const float* dout = &g_.d_out(b, i, h, 0);
                const bool own = i < i1;
                double r = 1.0;
                if (norm) {
                    double ss = 0.0;
                    for (index_t c = 0; c < Dv_; ++c) ss += double(o[c]) * o[c];
                    r = 1.0 / std::sqrt(ss / static_cast<double>(Dv_) + static_cast<double>(w_.norm_eps));
                    for (index_t c = 0; c < Dv_; ++c) n[c] = o[c] * r * w_.norm_weight[static_cast<std::size_t>(c)];
                } else if (gate) {
                    for (index_t c = 0; c < Dv_; ++c) n[c] = o[c];
                }
                double s = 1.0;
                if (gate) {
                    double t = static_cast<double>(w_.gate_bias);
                    for (index_t c = 0; c < Dv_; ++c) t += n[c] * depth * w_.gate_weight[static_cast<std::size_t>(c)];
                    s = 1.0 / (1.0 + std::exp(-t));
                    double dot = 0.0;
                    for (index_t c = 0; c < Dv_; ++c) dot += double(dout[c]) * n[c] * depth;
                    const double ds = dot * s * (1.0 - s);
                    for (index_t c = 0; c < Dv_; ++c)
                        dn[c] = (dout[c] * s + ds * w_.gate_weight[static_cast<std::size_t>(c)]) * depth;
                    if (own) {
                        for (index_t c = 0; c < Dv_; ++c) acc_gate_[static_cast<std::size_t>(c)] += ds * n[c] * depth;
                        acc_bias_ += ds;
                    }
                } else {
                    for (index_t c = 0; c < Dv_; ++c) dn[c] = dout[c] * depth;
                }
                if (norm) {
                    double e = 0.0;
                    for (index_t c = 0; c < Dv_; ++c) e += dn[c] * w_.norm_weight[static_cast<std::size_t>(c)] * o[c];
                    const double r3 = r * r * r / static_cast<double>(Dv_);
                    for (index_t c = 0; c < Dv_; ++c) {
                        if (own) acc_norm_[static_cast<std::size_t>(c)] += dn[c] * o[c] * r;
                        const double wc = w_.norm_weight[static_cast<std::size_t>(c)];
                        d[c] = static_cast<float>(r * wc * dn[c] - r3 * o[c] * e);
                    }
                } else {
                    for (index_t c = 0; c < Dv_; ++c) d[c] = static_cast<float>(dn[c]);
                }
            }
    }

    void block(index_t b, index_t i0, index_t i1) {
        const bool pre = w_.pre.on(), post = w_.post.on(), mpre = w_.head_pre_on(), mpost = w_.head_post_on();
        const index_t e1 = std::min(L_, i1 + hp_), e2 = std::min(L_, e1 + hq_);
        const index_t p0 = std::max<index_t>(0, i0 - hq_), x0 = std::max<index_t>(0, p0 - hp_);
        const index_t R = i1 - i0, R2 = e2 - i0;
        x0_ = x0;
        clean_ = round_up(e2, kKeyAlign) + pad_;

        // ---- forward, recomputed ----
        const int sX = take();
        per_head([ATTNKIT_COPY_CAPTURE](index_t h) {
            gemm_on<A>(q_rows(b, h, x0, e2), gemm_op::none, k_rows(b, h / grp_, e2), gemm_op::transpose,
                       rows_of_slot(sX, h, x0, e2, e2));
            const V sc(scale_);
            for (index_t i = x0; i < e2; ++i) {
                float* x = row(sX, h, i);
                const index_t n = i + 1, nv = n / simd::kLanes<A> * simd::kLanes<A>;
                for (index_t j = 0; j < nv; j += simd::kLanes<A>) simd::storeu(x + j, simd::loadu<A>(x + j) * sc);
                for (index_t j = nv; j < n; ++j) x[j] *= scale_;
                std::fill(x + n, x + clean_, 0.0f);
            }
        });
        int sY1 = sX, sY2;
        if (pre) {
            sY1 = take();
            conv_rows(sY1, sX, w_.kq_pre.data(), w_.pre, -hp_, p0, e2, x0, e2);
        }
        sY2 = sY1;
        if (mpre) {
            sY2 = take();
            mix_rows(w_.head_pre.data(), sY1, sY2, p0, e2);
        }
        const int sP = take();
        per_head([ATTNKIT_COPY_CAPTURE](index_t h) {
            for (index_t i = p0; i < e2; ++i) softmax_row<A>(row(sY2, h, i), row(sP, h, i), i, clean_);
        });
        // Kept: X for the pre kernel's gradient, Y1 for the pre mixing's.
        if (mpre) give(sY2);
        if (pre && !mpre) give(sY1);
        if (!pre && !mpre) give(sX);
        int sP1 = sP, sP2;
        if (post) {
            sP1 = take();
            conv_rows(sP1, sP, w_.kq_post.data(), w_.post, -hq_, i0, e2, p0, e2);
        }
        sP2 = sP1;
        if (mpost) {
            sP2 = take();
            mix_rows(w_.head_post.data(), sP1, sP2, i0, e2);
        }
        // O = P V only feeds the row stages' gradients (the norm's statistics, the gate's input):
        // without either, d_out passes to dO unchanged but for the depth scale, and O is not formed.
        if (!w_.norm_weight.empty() || !w_.gate_weight.empty())
            per_head([ATTNKIT_COPY_CAPTURE](index_t h) {
                causal_product(in(rows_of_slot(sP2, h, i0, e2, e2)), i0, v_rows(b, h / grp_, e2),
                               head_rows(o_, h, R2));
            });

        // ---- backward ----
        row_stages_backward(b, i0, i1, e2);
        const int sdP2 = take();
        per_head([ATTNKIT_COPY_CAPTURE](index_t h) {
            gemm_on<A>(in(head_rows(do_, h, R2)), gemm_op::none, v_rows(b, h / grp_, e2), gemm_op::transpose,
                       rows_of_slot(sdP2, h, i0, e2, e2));
            for (index_t i = i0; i < e2; ++i) {
                float* x = row(sdP2, h, i);
                std::fill(x + i + 1, x + clean_, 0.0f);
            }
        });
        per_kv_head([ATTNKIT_COPY_CAPTURE](index_t kvh) {
            const matrix_ref<float> dv{g_.d_v.data + b * g_.d_v.strides[0] + kvh * g_.d_v.strides[2], i1, Dv_,
                                       g_.d_v.strides[1]};
            for (index_t h = kvh * grp_; h < (kvh + 1) * grp_; ++h)
                causal_product_transposed(in(rows_of_slot(sP2, h, i0, i1, i1)), i0, in(head_rows(do_, h, R)), dv);
        });
        if (mpost) give(sP2);
        if (post && !mpost) give(sP1);
        int sdP1 = sdP2;
        if (mpost) {
            mix_grad(acc_head_post_, sdP2, sP1, i0, i1);
            sdP1 = take();
            mix_rows(wt_post_.data(), sdP2, sdP1, i0, e2);
            give(sdP2);
            if (post) give(sP1);
        }
        int sdP = sdP1;
        if (post) {
            conv_grad(acc_kq_post_, sdP1, sP, w_.post, -hq_, i0, i1, p0, e2);
            sdP = take();
            conv_rows(sdP, sdP1, flip_post_.data(), w_.post, 0, i0, e1, i0, e2);
            give(sdP1);
        }
        per_head([ATTNKIT_COPY_CAPTURE](index_t h) {
            for (index_t i = i0; i < e1; ++i) softmax_grad_row<A>(row(sP, h, i), row(sdP, h, i), i, clean_);
        });
        give(sP);
        int sdY1 = sdP;
        if (mpre) {
            mix_grad(acc_head_pre_, sdP, sY1, i0, i1);
            sdY1 = take();
            mix_rows(wt_pre_.data(), sdP, sdY1, i0, e1);
            give(sdP);
            give(sY1);  // Y1, or X itself without a pre convolution
        }
        int sdX = sdY1;
        if (pre) {
            conv_grad(acc_kq_pre_, sdY1, sX, w_.pre, -hp_, i0, i1, x0, e2);
            sdX = take();
            conv_rows(sdX, sdY1, flip_pre_.data(), w_.pre, 0, i0, i1, i0, e1);
            give(sdY1);
            give(sX);
        }
        // dS = scale Mask0(dX) (clean rows are 0 after the diagonal), then the products.
        per_head([ATTNKIT_COPY_CAPTURE](index_t h) {
            const V sc(scale_);
            for (index_t i = i0; i < i1; ++i) {
                float* x = row(sdX, h, i);
                const index_t n = round_up(i + 1, simd::kLanes<A>);
                for (index_t j = 0; j < n; j += simd::kLanes<A>) simd::storeu(x + j, simd::loadu<A>(x + j) * sc);
            }
            const view<float, 4>& gq = g_.d_q;
            const matrix_ref<float> dq{gq.data + b * gq.strides[0] + i0 * gq.strides[1] + h * gq.strides[2], R, D_,
                                       gq.strides[1]};
            causal_product(in(rows_of_slot(sdX, h, i0, i1, i1)), i0, k_rows(b, h / grp_, i1), dq);
        });
        per_kv_head([ATTNKIT_COPY_CAPTURE](index_t kvh) {
            const matrix_ref<float> dk{g_.d_k.data + b * g_.d_k.strides[0] + kvh * g_.d_k.strides[2], i1, D_,
                                       g_.d_k.strides[1]};
            for (index_t h = kvh * grp_; h < (kvh + 1) * grp_; ++h)
                causal_product_transposed(in(rows_of_slot(sdX, h, i0, i1, i1)), i0, q_rows(b, h, i0, i1), dk);
        });
        give(sdX);
        run_chained();
    }
};

template <class A>
void run_backward(const backward_args& g, const shape& ms, const params& w, thread_pool* pool,
                  index_t block_rows = 0) {
    backward_runner<A>(g, ms, w, pool, block_rows).run();
}

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
