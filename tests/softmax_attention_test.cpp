// attnkit::softmax_attention (the fast kernel) against attnkit::reference::softmax_attention.
//
// The fast kernel has three paths chosen by shape (SIMD width W: 8 for AVX2, 4 for SSE2, 1 for
// the scalar build): a row kernel when Lq * G <= W (G = H / Hk); a tile kernel on panels of 2W
// rows, blocks of ~256 rows (G heads x positions) and key blocks of 96; and split-KV (keys cut
// into pieces of a multiple of 96, merged with their lse) when there are fewer than 64 work
// items and Lk >= 1024. The sweeps below straddle those edges; sweep_reaches_every_kernel_path
// checks, with the kernel's own plan, that each path is reached on the build at hand.
//
// What is covered:
//   sweep.matches_reference/<sweep>_<n>_<shape and options>
//                 output and lse against the reference, over cases built from one-dimensional
//                 sweeps (length, len_x_dim, lq_ne_lk, dim, d_ne_dv, decode, gqa, mask, cap_sink,
//                 split) plus a seeded random sample of combinations (random). Cases rotate
//                 through the three input distributions. Also: the overload without lse writes
//                 the same bits.
//   decode        the last row of a causal prefill equals a decode step over the same cache.
//   threads       1, 2 and 3 threads (and no pool) are bitwise identical.
//   layouts       [B,H,L,D] views, fused QKV views, TensorMaps and misaligned pointers give
//                 bitwise the results of dense tensors.
//   empty         empty sequences.
// Elsewhere: extreme inputs (logits of magnitude 1e4; NaN or Inf in one key, value or query row;
// NaN garbage past key_lengths; fully masked rows) in softmax_attention_extremes_test.cpp; two
// halves of the keys merged with merge_partials in merge_partials_test.cpp; bad arguments in
// check_test.cpp (typed over the reference and this kernel). The helpers and tolerances below
// are tests/common/softmax_checks.hpp's.
//
// Tolerances (docs/design.md "Quality bar"; compare.hpp): output tolerance_for(kOutEps, max|v| *
// (1 + S)), lse tolerance_for(kLseEps, 1 + max(S, max finite |sink|)), with S the Cauchy-Schwarz
// bound scale * max|q_i| * max|k_j| on the scores (capped by the softcap when it is on), i.e.
// attention_magnitude(q, k, v, scale) for the output. kOutEps = kLseEps = 16: a few float
// roundings per term of reductions of up to a few thousand terms. The magnitudes are bounds,
// not estimates; the worst error measured over this file (AVX2, SSE2 and scalar builds) is
// below 4 eps * magnitude, so 16 leaves a 4x margin.
#include "attnkit/softmax_attention.hpp"

#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/softmax_checks.hpp"
#include "common/sweep.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::softmax_options;
using attnkit::view;
using namespace attnkit_test;

// ---- the parameterised sweep ---------------------------------------------------------------

struct attn_case {
    std::string sweep;
    index_t B = 2, Lq = 17, Lk = 17, H = 4, Hk = 2, D = 16, Dv = 16;
    distribution dist = distribution::gaussian;
    float scale = 0.0f;
    bool causal = false;
    index_t window = -1, chunk = 0;
    std::vector<std::int64_t> key_lengths;
    float softcap = 0.0f;
    bool sinks = false;
    std::uint64_t seed = 1;

    softmax_options options() const {
        softmax_options o;
        o.scale = scale;
        o.causal = causal;
        o.window_left = window;
        o.chunk = chunk;
        o.key_lengths = key_lengths;
        o.softcap = softcap;
        if (sinks) o.sinks = random_sinks(H, seed * 7 + 5);
        return o;
    }

    std::string describe() const {
        std::ostringstream s;
        s << "B" << B << "_Lq" << Lq << "_Lk" << Lk << "_H" << H << "_Hk" << Hk << "_D" << D
          << "_Dv" << Dv << "_" << name(dist);
        if (scale != 0.0f) s << "_scaled";
        if (causal) s << "_causal";
        if (window >= 0) s << "_w" << window;
        if (chunk > 0) s << "_chunk" << chunk;
        if (!key_lengths.empty()) {
            s << "_kl";
            for (auto l : key_lengths) s << "_" << l;
        }
        if (softcap > 0.0f) s << "_cap" << static_cast<int>(softcap);
        if (sinks) s << "_sinks";
        return s.str();
    }
};

void PrintTo(const attn_case& c, std::ostream* os) { *os << c.sweep << ": " << c.describe(); }

// Key lengths for B items that include 0 and Lk (and something in between when B >= 3).
std::vector<std::int64_t> edge_key_lengths(index_t B, index_t Lk) {
    std::vector<std::int64_t> kl(static_cast<std::size_t>(B));
    for (index_t b = 0; b < B; ++b) kl[b] = b % 3 == 0 ? 0 : b % 3 == 1 ? Lk : Lk / 3 + 1;
    return kl;
}

class case_list {
public:
    // Rotates the input distribution so that every sweep sees all three.
    attn_case& add(attn_case c) {
        c.dist = kAllDistributions[cases_.size() % 3];
        c.seed = 1000 + cases_.size();
        cases_.push_back(std::move(c));
        return cases_.back();
    }
    std::vector<attn_case> take() { return std::move(cases_); }

private:
    std::vector<attn_case> cases_;
};

attn_case shape(const char* sweep, index_t B, index_t Lq, index_t Lk, index_t H, index_t Hk,
                index_t D, index_t Dv) {
    attn_case c;
    c.sweep = sweep;
    c.B = B, c.Lq = Lq, c.Lk = Lk, c.H = H, c.Hk = Hk, c.D = D, c.Dv = Dv;
    return c;
}

const index_t kLengths[] = {1, 2, 15, 16, 17, 63, 64, 65, 127, 129, 257, 1000};
const index_t kDims[] = {1, 3, 16, 48, 64, 80, 96, 128, 256};

std::vector<attn_case> build_cases() {
    case_list cl;

    // Lengths, Lq = Lk, with and without causal. L = 1000 with one key/value head and small D.
    for (index_t L : kLengths)
        for (bool causal : {false, true}) {
            attn_case c = L == 1000 ? shape("length", 1, L, L, 2, 1, 16, 16)
                                    : shape("length", 2, L, L, 4, 2, 64, 64);
            c.causal = causal;
            cl.add(c);
        }

    // Lq != Lk both ways (causal is bottom-right aligned: Lq > Lk leaves the first rows empty).
    const std::pair<index_t, index_t> lqlk[] = {{1, 1000},  {2, 129},  {15, 64},  {17, 257},
                                                {64, 17},   {129, 16}, {257, 65}, {65, 1000},
                                                {1000, 65}, {16, 1},   {3, 127},  {127, 3}};
    for (const auto& p : lqlk)
        for (bool causal : {false, true}) {
            attn_case c = shape("lq_ne_lk", 2, p.first, p.second, 4, 1, 32, 32);
            if (p.first == 1000 || p.second == 1000) c.B = 1;
            c.causal = causal;
            cl.add(c);
        }

    // Lengths x head dims (every pair below 1000), one key/value head shared by two query heads.
    for (index_t L : kLengths)
        for (index_t D : kDims) {
            if (L == 1000) continue;
            attn_case c = shape("len_x_dim", 1, L, L, 2, 1, D, D);
            c.causal = (L + D) % 2 == 1;
            cl.add(c);
        }

    // Head dims: D = Dv on prefill (tile kernel) and decode (row kernel), then D != Dv.
    for (index_t D : kDims) {
        attn_case c = shape("dim", 2, 65, 65, 4, 2, D, D);
        c.causal = true;
        cl.add(c);
        cl.add(shape("dim", 1, 1, 129, 4, 2, D, D));
        cl.add(shape("dim", 1, 17, 33, 2, 2, D, D));
    }
    const std::pair<index_t, index_t> d_dv[] = {{1, 256},  {256, 1},  {3, 80},  {80, 3},  {16, 96},
                                                {128, 48}, {48, 128}, {96, 64}, {64, 16}, {1, 3}};
    for (const auto& p : d_dv) {
        attn_case c = shape("d_ne_dv", 2, 33, 65, 4, 2, p.first, p.second);
        c.causal = true;
        cl.add(c);
        cl.add(shape("d_ne_dv", 1, 2, 100, 4, 2, p.first, p.second));
    }

    // Decode, one query head per key/value head (Lq * G = 1: the row kernel on every build,
    // also the scalar one), over every length and past the split-KV threshold, with masks.
    {
        int m = 0;
        for (index_t Lk :
             {1, 2, 15, 16, 17, 63, 64, 65, 127, 129, 257, 1000, 1024, 1500, 3000, 5000}) {
            attn_case c = Lk > 1000 ? shape("decode", 1, 1, Lk, 2, 2, 32, 32)
                                    : shape("decode", 2, 1, Lk, 4, 4, 64, 64);
            switch (m++ % 5) {
                case 1:
                    c.window = 37;
                    break;
                case 2:
                    c.key_lengths = edge_key_lengths(c.B, Lk);
                    break;
                case 3:
                    c.sinks = true;
                    break;
                case 4:
                    c.softcap = 5.0f, c.causal = true;
                    break;
                default:
                    break;
            }
            cl.add(c);
        }
    }

    // GQA ratios, on the row kernel (Lq * G <= 8 or just above it) and the tile kernel.
    for (index_t H : {4, 8})
        for (index_t ratio : {1, 2, 4, 0}) {
            const index_t Hk = ratio == 0 ? 1 : H / ratio;
            for (index_t Lq : {1, 2, 3, 33}) {
                attn_case c = shape("gqa", 2, Lq, 100, H, Hk, 48, 48);
                c.causal = Lq > 1;
                cl.add(c);
            }
        }

    // Masks alone and combined, on tile-kernel and row-kernel shapes.
    struct mask_spec {
        bool causal;
        index_t window, chunk;
        bool kl;
    };
    const mask_spec masks[] = {
        {true, -1, 0, false},    {false, 0, 0, false},  {false, 1, 0, false},
        {false, 37, 0, false},   {false, -1, 1, false}, {false, -1, 16, false},
        {false, -1, 100, false}, {false, -1, 0, true},  {true, 0, 0, false},
        {true, 1, 0, false},     {true, 37, 0, false},  {false, 1, 16, false},
        {false, 37, 100, false}, {false, 0, 1, false},  {true, 37, 0, true},
        {true, 0, 0, true},      {false, 37, 16, true},
    };
    const attn_case mask_shapes[] = {
        shape("mask", 3, 129, 129, 4, 2, 16, 16), shape("mask", 3, 65, 257, 4, 2, 16, 16),
        shape("mask", 3, 257, 65, 4, 2, 16, 16),  shape("mask", 3, 1, 300, 4, 2, 16, 16),
        shape("mask", 3, 3, 200, 4, 2, 16, 16),   shape("mask", 3, 40, 40, 8, 1, 16, 16)};
    for (const attn_case& s : mask_shapes)
        for (const mask_spec& m : masks) {
            attn_case c = s;
            c.causal = m.causal;
            c.window = m.window;
            c.chunk = m.chunk;
            if (m.kl) c.key_lengths = edge_key_lengths(c.B, c.Lk);
            cl.add(c);
        }

    // Softcap and sinks, alone, with masks and together.
    for (const attn_case& s :
         {shape("cap_sink", 2, 129, 129, 4, 2, 64, 64), shape("cap_sink", 3, 1, 300, 8, 2, 64, 64),
          shape("cap_sink", 3, 2, 130, 4, 4, 80, 80), shape("cap_sink", 3, 70, 40, 4, 2, 64, 64)}) {
        for (float cap : {1.0f, 30.0f}) {
            attn_case c = s;
            c.softcap = cap;
            cl.add(c);
            c.causal = true;
            cl.add(c);
        }
        attn_case c = s;
        c.sinks = true;
        cl.add(c);
        c.causal = true;
        c.window = 37;
        cl.add(c);
        c = s;
        c.sinks = true;
        c.key_lengths = edge_key_lengths(c.B, c.Lk);
        cl.add(c);
        c.softcap = 5.0f;
        c.causal = true;
        cl.add(c);
        c = s;
        c.scale = 0.5f;
        c.causal = true;
        cl.add(c);
    }

    // Split-KV: decode and short prefill against long caches, with masks that empty whole pieces.
    {
        cl.add(shape("split", 1, 1, 1500, 8, 8, 64, 64));
        cl.add(shape("split", 1, 1, 5000, 8, 2, 128, 128));
        attn_case c = shape("split", 2, 1, 2000, 4, 1, 64, 64);
        c.window = 700;
        cl.add(c);
        c.key_lengths = {1200, 0};
        c.window = -1;
        cl.add(c);
        c.key_lengths = {2000, 97};
        c.sinks = true;
        cl.add(c);
        for (const attn_case& t : {shape("split", 1, 20, 1500, 4, 1, 32, 32),
                                   shape("split", 1, 10, 2500, 8, 2, 64, 48)}) {
            c = t;  // tile kernel (Lq * G > 8), one query block, split; with masks, sinks, softcap
            c.causal = true;
            c.window = 200;
            cl.add(c);
            c = t;
            c.key_lengths = {700};
            cl.add(c);
            c = t;
            c.sinks = true;
            c.softcap = 10.0f;
            cl.add(c);
        }
        c = shape("split", 1, 4, 3000, 2, 1, 48, 48);  // row kernel, several rows, split
        c.causal = true;
        c.window = 1000;
        cl.add(c);
        c = shape("split", 1, 40, 1100, 2, 1, 64, 64);  // tile kernel, one query block, split
        c.causal = true;
        cl.add(c);
        c = shape("split", 1, 300, 1024, 1, 1, 32, 32);  // two query blocks, split in two
        c.causal = true;
        cl.add(c);
        for (index_t Lk :
             {1023, 1024, 1025, 1151, 1152, 1153}) {  // the split threshold and piece edges
            c = shape("split", 1, 1, Lk, 2, 1, 32, 32);
            c.window = Lk % 3 == 0 ? 600 : -1;
            cl.add(c);
        }
        c = shape("split", 1, 1, 4000, 4, 4, 16, 16);
        c.chunk = 1000;
        c.softcap = 20.0f;
        cl.add(c);
    }

    // A seeded random sample of combinations, within a cost budget for the reference.
    {
        random_source rs(20240611);
        auto pick = [&](const auto& arr) { return arr[rs.below(std::size(arr))]; };
        const index_t Bs[] = {1, 2, 3};
        const index_t Hs[] = {4, 8};
        const index_t windows[] = {0, 1, 37};
        const index_t chunks[] = {1, 16, 100};
        int made = 0;
        // The reduced builds (common/sweep.hpp) take the first third of the sample, the sanitizer
        // builds the first sixth: the structured shapes above reach every kernel path.
        const int sample = kSanitizerSweep ? 25 : kReducedSweep ? 50 : 150;
        while (made < sample) {
            attn_case c;
            c.sweep = "random";
            c.B = pick(Bs);
            c.Lq = pick(kLengths);
            c.Lk = rs.below(3) == 0 ? c.Lq : pick(kLengths);
            c.H = pick(Hs);
            const index_t ratio = rs.below(4);
            c.Hk = ratio == 3 ? 1 : c.H >> ratio;
            c.D = pick(kDims);
            c.Dv = rs.below(2) == 0 ? c.D : pick(kDims);
            const double cost = double(c.B) * c.H * c.Lq * c.Lk * (c.D + c.Dv);
            if (cost > 2.5e7) continue;
            switch (rs.below(8)) {
                case 0:
                    break;
                case 1:
                    c.causal = true;
                    break;
                case 2:
                    c.window = pick(windows);
                    break;
                case 3:
                    c.chunk = pick(chunks);
                    break;
                case 4:
                    c.causal = true, c.window = pick(windows);
                    break;
                case 5:
                    c.chunk = pick(chunks), c.window = pick(windows);
                    break;
                case 6:
                    c.causal = true, c.window = pick(windows), c.key_lengths = {0};
                    break;
                default:
                    c.key_lengths = {0};
                    break;
            }
            if (!c.key_lengths.empty()) {
                c.key_lengths.resize(static_cast<std::size_t>(c.B));
                for (auto& l : c.key_lengths)
                    l = static_cast<std::int64_t>(rs.below(static_cast<std::uint64_t>(c.Lk + 1)));
                c.key_lengths[rs.below(c.key_lengths.size())] = rs.below(2) ? 0 : c.Lk;
            }
            if (rs.below(4) == 0) c.softcap = rs.below(2) ? 2.0f : 20.0f;
            c.sinks = rs.below(4) == 0;
            if (rs.below(10) == 0) c.scale = 0.5f;
            cl.add(c).dist = kAllDistributions[rs.below(3)];
            ++made;
        }
    }
    return cl.take();
}

const std::vector<attn_case>& all_cases() {
    static const std::vector<attn_case> cases = build_cases();
    return cases;
}

class sweep : public ::testing::TestWithParam<attn_case> {};

TEST_P(sweep, matches_reference) {
    const attn_case& c = GetParam();
    const tensor4<float> q = random_bshd(c.B, c.Lq, c.H, c.D, c.dist, c.seed * 3 + 0);
    const tensor4<float> k = random_bshd(c.B, c.Lk, c.Hk, c.D, c.dist, c.seed * 3 + 1);
    const tensor4<float> v = random_bshd(c.B, c.Lk, c.Hk, c.Dv, c.dist, c.seed * 3 + 2);
    const softmax_options o = c.options();

    const fast_result got = run_fast(q, k, v, o);
    const ref_result want = run_reference(q, k, v, o);
    EXPECT_TRUE(all_close(got.out, want.out, out_tolerance(q, k, v, o))) << "out";
    EXPECT_TRUE(all_close(got.lse, want.lse, lse_tolerance(q, k, o))) << "lse";

    // The overload without lse writes the same output.
    tensor4<float> out2 = make_bshd<float>(c.B, c.Lq, c.H, c.Dv, kNaN);
    attnkit::softmax_attention(q, k, v, out2, o);
    EXPECT_TRUE(same_bytes(out2, got.out)) << "output without lse differs from output with lse";
}

INSTANTIATE_TEST_SUITE_P(softmax_attention, sweep, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<attn_case>& info) {
                             return info.param.sweep + "_" + std::to_string(info.index) + "_" +
                                    info.param.describe();
                         });

// ---- bfloat16 / half storage -----------------------------------------------------------------
// Every sweep case again with K and V (and, for bfloat16, also Q) stored in 16 bits. The
// reference reads the same stored values (widened to double exactly), so the kernel is held to
// the float tolerances: conversion in the loads is exact, and compute is float either way.
enum class storage { bf16_kv, f16_kv, bf16_qkv };

const char* storage_name(storage st) {
    switch (st) {
        case storage::bf16_kv: return "bf16_kv";
        case storage::f16_kv: return "f16_kv";
        case storage::bf16_qkv: return "bf16_qkv";
    }
    return "?";
}

// The kernel on (q, k, v) of storage st against the reference on the same stored values.
template <class T>
void check_storage(const tensor4<float>& q32, const tensor4<float>& k32, const tensor4<float>& v32,
                   const softmax_options& o, bool q_too) {
    const tensor4<T> k = stored_as<T>(k32), v = stored_as<T>(v32), qt = stored_as<T>(q32);
    const tensor4<float> kf = widened(k), vf = widened(v), qf = q_too ? widened(qt) : q32;
    fast_result got = outputs_for<float>(q32, v32, kNaN);
    ref_result want = outputs_for<double>(q32, v32, 0.0);
    if (q_too) {
        attnkit::softmax_attention(qt, k, v, got.out, got.lse, o);
        attnkit::reference::softmax_attention(qt, k, v, want.out, want.lse, o);
    } else {
        attnkit::softmax_attention(q32, k, v, got.out, got.lse, o);
        attnkit::reference::softmax_attention(q32, k, v, want.out, want.lse, o);
    }
    EXPECT_TRUE(all_close(got.out, want.out, out_tolerance(qf, kf, vf, o))) << "out";
    EXPECT_TRUE(all_close(got.lse, want.lse, lse_tolerance(qf, kf, o))) << "lse";
    // The same values in float storage give the same result to within rounding of the order of
    // summation only: the conversion itself is exact.
    const fast_result as_float = run_fast(qf, kf, vf, o);
    EXPECT_TRUE(all_close(got.out, as_float.out, out_tolerance(qf, kf, vf, o))) << "out vs float storage";
}

class sweep_storage : public ::testing::TestWithParam<std::tuple<attn_case, storage>> {};

TEST_P(sweep_storage, matches_reference_on_stored_values) {
    const attn_case& c = std::get<0>(GetParam());
    const storage st = std::get<1>(GetParam());
    const tensor4<float> q = random_bshd(c.B, c.Lq, c.H, c.D, c.dist, c.seed * 3 + 0);
    const tensor4<float> k = random_bshd(c.B, c.Lk, c.Hk, c.D, c.dist, c.seed * 3 + 1);
    const tensor4<float> v = random_bshd(c.B, c.Lk, c.Hk, c.Dv, c.dist, c.seed * 3 + 2);
    const softmax_options o = c.options();
    if (st == storage::f16_kv)
        check_storage<Eigen::half>(q, k, v, o, false);
    else
        check_storage<Eigen::bfloat16>(q, k, v, o, st == storage::bf16_qkv);
}

// Every case in every storage (the reduced builds of common/sweep.hpp: each case in one, in
// rotation; the sanitizer builds: every other group of three cases, since the conversions in
// the loads are the same code at every shape, and the float sweep above runs every case).
std::vector<std::tuple<attn_case, storage>> storage_cases() {
    const storage all[] = {storage::bf16_kv, storage::f16_kv, storage::bf16_qkv};
    std::vector<std::tuple<attn_case, storage>> out;
    for (std::size_t i = 0; i < all_cases().size(); ++i)
        for (std::size_t s = 0; s < 3; ++s)
            if (sweep_takes(i, s, 3) && (!kSanitizerSweep || i / 3 % 2 == 0)) out.emplace_back(all_cases()[i], all[s]);
    return out;
}

INSTANTIATE_TEST_SUITE_P(softmax_attention, sweep_storage, ::testing::ValuesIn(storage_cases()),
                         [](const ::testing::TestParamInfo<std::tuple<attn_case, storage>>& info) {
                             const attn_case& c = std::get<0>(info.param);
                             return std::string(storage_name(std::get<1>(info.param))) + "_" + c.sweep +
                                    "_" + std::to_string(info.index) + "_" + c.describe();
                         });

// Threads and layouts with 16-bit storage: 1, 2 and 3 threads agree bitwise (row kernel with
// split-KV, and the tile kernel), and views over a [B, H, L, D] half buffer agree with the dense
// tensors: to rounding, since rows of 48 bytes are the row kernel's short head-major rows, read
// and summed in consecutive key order (detail/row_kernel.hpp), bitwise on the tile kernel.
TEST(softmax_attention, half_storage_views_and_threads_are_bitwise_stable) {
    for (index_t Lq : {1, 40}) {
        const index_t B = 2, Lk = 1500, H = 4, Hk = 2, D = 24;
        const tensor4<float> q = random_bshd(B, Lq, H, D, distribution::gaussian, 11);
        const tensor4<Eigen::half> k = stored_as<Eigen::half>(random_bshd(B, Lk, Hk, D, distribution::gaussian, 12));
        const tensor4<Eigen::half> v = stored_as<Eigen::half>(random_bshd(B, Lk, Hk, D, distribution::gaussian, 13));
        softmax_options o;
        o.causal = true;
        tensor4<float> base = make_bshd<float>(B, Lq, H, D, kNaN);
        attnkit::softmax_attention(q, k, v, base, o);
        for (int t : {1, 2, 3}) {
            attnkit::thread_pool pool(static_cast<std::size_t>(t));
            o.pool = &pool;
            tensor4<float> out = make_bshd<float>(B, Lq, H, D, kNaN);
            attnkit::softmax_attention(q, k, v, out, o);
            EXPECT_TRUE(bitwise_equal(out, base)) << "threads " << t << ", Lq " << Lq;
        }
        o.pool = nullptr;
        // [B, H, L, D] storage seen through a view.
        Eigen::Tensor<Eigen::half, 4, Eigen::RowMajor> kb(B, Hk, Lk, D), vb(B, Hk, Lk, D);
        for (index_t b = 0; b < B; ++b)
            for (index_t j = 0; j < Lk; ++j)
                for (index_t h = 0; h < Hk; ++h)
                    for (index_t d = 0; d < D; ++d) kb(b, h, j, d) = k(b, j, h, d), vb(b, h, j, d) = v(b, j, h, d);
        const view<const Eigen::half, 4> kv(kb.data(), {B, Lk, Hk, D}, {Hk * Lk * D, D, Lk * D, 1});
        const view<const Eigen::half, 4> vv(vb.data(), {B, Lk, Hk, D}, {Hk * Lk * D, D, Lk * D, 1});
        tensor4<float> out = make_bshd<float>(B, Lq, H, D, kNaN);
        attnkit::softmax_attention(q, kv, vv, out, o);
        if (Lq == 1)
            EXPECT_TRUE(all_close(out, base, out_tolerance(q, k, v, o))) << "bhld view, Lq " << Lq;
        else
            EXPECT_TRUE(bitwise_equal(out, base)) << "bhld view, Lq " << Lq;
    }
}

// White-box guard on the sweep itself: with this build's SIMD width it must reach the row
// kernel and the tile kernel, each with and without split-KV, several query blocks and several
// panels per block (attnkit::detail::make_plan is what the kernel uses to choose).
TEST(softmax_attention, sweep_reaches_every_kernel_path) {
    using A = attnkit::simd::default_arch;
    constexpr index_t kTileRows = attnkit::detail::tile_traits<A>::kTileRows;
    int row = 0, row_split = 0, tile = 0, tile_split = 0, multi_block = 0, multi_panel = 0,
        multi_key_block = 0;
    for (const attn_case& c : all_cases()) {
        const attnkit::detail::attention_shape s{c.B, c.Lq, c.Lk, c.H, c.Hk, c.D, c.Dv};
        const auto plan = attnkit::detail::make_plan<A>(s);
        (plan.row_path ? (plan.n_split > 1 ? row_split : row)
                       : (plan.n_split > 1 ? tile_split : tile))++;
        multi_block += !plan.row_path && plan.n_qblocks > 1;
        multi_panel += !plan.row_path && plan.n_pos * s.group() > kTileRows;
        multi_key_block += c.Lk > attnkit::detail::tile_traits<A>::kBlockKeys;
    }
    RecordProperty("row", row);
    RecordProperty("row_split", row_split);
    RecordProperty("tile", tile);
    RecordProperty("tile_split", tile_split);
    EXPECT_GE(row, 10);
    EXPECT_GE(row_split, 5);
    EXPECT_GE(tile, 10);
    EXPECT_GE(tile_split, 5);
    EXPECT_GE(multi_block, 5);
    EXPECT_GE(multi_panel, 5);
    EXPECT_GE(multi_key_block, 10);
}

// Empty sequences: no keys (an empty cache) gives zeros and lse = -inf (or the sink); no
// queries or no batch items is a no-op.
TEST(softmax_attention, empty_sequences) {
    for (index_t Lq : {1, 5, 40}) {
        SCOPED_TRACE(::testing::Message() << "Lk 0, Lq " << Lq);
        const tensor4<float> q = random_bshd(2, Lq, 4, 16, distribution::gaussian, 141);
        const tensor4<float> k = make_bshd<float>(2, 0, 2, 16), v = make_bshd<float>(2, 0, 2, 8);
        softmax_options o;
        o.causal = true;
        const fast_result got = run_fast(q, k, v, o);
        EXPECT_TRUE(all_equal_to(got.out, 0.0f));
        EXPECT_TRUE(all_equal_to(got.lse, kNegInfF));
        o.sinks = {kNegInfF, 1.0f, -3.0f, 0.5f};
        const fast_result with_sinks = run_fast(q, k, v, o);
        EXPECT_TRUE(all_equal_to(with_sinks.out, 0.0f));
        for (index_t h = 0; h < 4; ++h) EXPECT_EQ(o.sinks[h], with_sinks.lse(1, Lq - 1, h));
    }
    const tensor4<float> k = random_bshd(2, 10, 2, 16, distribution::gaussian, 142);
    const tensor4<float> v = random_bshd(2, 10, 2, 8, distribution::gaussian, 143);
    tensor4<float> out0 = make_bshd<float>(2, 0, 4, 8);
    tensor3<float> lse0 = make_lse<float>(2, 0, 4);
    EXPECT_NO_THROW(attnkit::softmax_attention(make_bshd<float>(2, 0, 4, 16), k, v, out0, lse0));
    tensor4<float> outb = make_bshd<float>(0, 3, 4, 8);
    EXPECT_NO_THROW(attnkit::softmax_attention(make_bshd<float>(0, 3, 4, 16),
                                               make_bshd<float>(0, 10, 2, 16),
                                               make_bshd<float>(0, 10, 2, 8), outb));
}

// ---- decode equals the last row of prefill -------------------------------------------------

TEST(softmax_attention, last_row_of_causal_prefill_equals_decode) {
    struct cfg {
        index_t B, L, H, Hk, D;
        index_t window;
    };
    for (const cfg& g :
         {cfg{2, 17, 4, 4, 64, -1}, cfg{2, 129, 8, 2, 128, -1}, cfg{1, 1000, 4, 1, 80, -1},
          cfg{1, 1100, 4, 4, 64, -1}, cfg{2, 300, 4, 2, 48, 37}, cfg{1, 3, 8, 1, 3, -1}}) {
        SCOPED_TRACE(::testing::Message() << "B " << g.B << " L " << g.L << " H " << g.H << " Hk "
                                          << g.Hk << " D " << g.D << " window " << g.window);
        const tensor4<float> q = random_bshd(g.B, g.L, g.H, g.D, distribution::gaussian, 11);
        const tensor4<float> k = random_bshd(g.B, g.L, g.Hk, g.D, distribution::gaussian, 12);
        const tensor4<float> v = random_bshd(g.B, g.L, g.Hk, g.D, distribution::gaussian, 13);
        softmax_options o;
        o.causal = true;
        o.window_left = g.window;
        const fast_result prefill = run_fast(q, k, v, o);

        // Decode: the last query alone against the whole cache (a strided view of q).
        const view<const float, 4> q_last(q.data() + (g.L - 1) * g.H * g.D, {g.B, 1, g.H, g.D},
                                          {g.L * g.H * g.D, g.H * g.D, g.D, 1});
        const fast_result decode = run_fast(q_last, k, v, o);
        const view<const float, 4> prefill_last(prefill.out.data() + (g.L - 1) * g.H * g.D,
                                                {g.B, 1, g.H, g.D},
                                                {g.L * g.H * g.D, g.H * g.D, g.D, 1});
        const view<const float, 3> prefill_lse_last(prefill.lse.data() + (g.L - 1) * g.H,
                                                    {g.B, 1, g.H}, {g.L * g.H, g.H, 1});
        // Tight: 4 eps against the output magnitude (the two paths sum in different orders).
        EXPECT_TRUE(all_close(decode.out, prefill_last, tolerance_for(4, max_abs(v)))) << "out";
        EXPECT_TRUE(
            all_close(decode.lse, prefill_lse_last, tolerance_for(4, 1.0 + score_bound(q, k, o))))
            << "lse";
        const ref_result want = run_reference(q_last, k, v, o);
        EXPECT_TRUE(all_close(decode.out, want.out, out_tolerance(q_last, k, v, o)));
    }
}

// ---- threads -------------------------------------------------------------------------------

TEST(softmax_attention, thread_count_gives_bitwise_identical_results) {
    attnkit::thread_pool p1(1), p2(2), p3(3);
    struct cfg {
        const char* what;
        index_t B, Lq, Lk, H, Hk, D;
        bool causal;
        index_t window;
        bool kl;
    };
    for (const cfg& g : {cfg{"prefill", 2, 300, 300, 4, 4, 64, true, -1, false},
                         cfg{"gqa", 2, 200, 333, 8, 2, 80, true, 37, false},
                         cfg{"decode split-KV", 1, 1, 5000, 8, 8, 64, false, -1, false},
                         cfg{"decode split-KV GQA", 2, 1, 5000, 8, 2, 128, false, -1, true},
                         cfg{"row kernel split-KV", 1, 4, 3000, 2, 1, 48, true, 1000, false},
                         cfg{"tile split-KV", 1, 64, 2000, 1, 1, 32, true, -1, false}}) {
        SCOPED_TRACE(g.what);
        const tensor4<float> q = random_bshd(g.B, g.Lq, g.H, g.D, distribution::outliers, 41);
        const tensor4<float> k = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::outliers, 42);
        const tensor4<float> v = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::outliers, 43);
        softmax_options o;
        o.causal = g.causal;
        o.window_left = g.window;
        if (g.kl) o.key_lengths = {g.Lk - 7, 1100};
        const fast_result base = run_fast(q, k, v, o);
        for (attnkit::thread_pool* pool : {&p1, &p2, &p3}) {
            o.pool = pool;
            const fast_result r = run_fast(q, k, v, o);
            EXPECT_TRUE(same_bytes(r.out, base.out))
                << pool->size() << " threads: out differs from no pool";
            EXPECT_TRUE(same_bytes(r.lse, base.lse))
                << pool->size() << " threads: lse differs from no pool";
        }
        o.pool = nullptr;
        EXPECT_TRUE(all_close(base.out, run_reference(q, k, v, o).out, out_tolerance(q, k, v, o)));
    }
}

// ---- layouts -------------------------------------------------------------------------------

// One key/value head: the head stride of a [B, L, 1, D] view means nothing, so a view that gives
// that dimension the stride of a [B, 1, L, D] buffer reads the same memory at the same bits as the
// dense tensor (short rows, where head-major views take another walk, included).
TEST(softmax_attention, one_kv_head_views_read_as_dense_whatever_their_head_stride) {
    const index_t B = 2, Lk = 300, H = 8, Hk = 1;
    for (index_t D : {32, 64, 128}) {
        const tensor4<float> q = random_bshd(B, 1, H, D, distribution::gaussian, 61);
        const tensor4<Eigen::bfloat16> k = stored_as<Eigen::bfloat16>(random_bshd(B, Lk, Hk, D, distribution::gaussian, 62));
        const tensor4<Eigen::bfloat16> v = stored_as<Eigen::bfloat16>(random_bshd(B, Lk, Hk, D, distribution::gaussian, 63));
        softmax_options o;
        o.causal = true;
        tensor4<float> dense = make_bshd<float>(B, 1, H, D, kNaN), viewed = make_bshd<float>(B, 1, H, D, kNaN);
        attnkit::softmax_attention(q, k, v, dense, o);
        const view<const Eigen::bfloat16, 4> kv(k.data(), {B, Lk, Hk, D}, {Lk * D, D, Lk * D, 1});
        const view<const Eigen::bfloat16, 4> vv(v.data(), {B, Lk, Hk, D}, {Lk * D, D, Lk * D, 1});
        attnkit::softmax_attention(q, kv, vv, viewed, o);
        EXPECT_TRUE(bitwise_equal(viewed, dense)) << "D " << D;
    }
}

// Bitwise, except where the row kernel reads short head-major value rows (at most 128 bytes) in
// consecutive key order (detail/row_kernel.hpp): those sum their keys in another order than
// token-major rows and agree to rounding.
TEST(softmax_attention, bhld_views_equal_dense_tensors) {
    for (const auto& g : {std::array<index_t, 7>{2, 70, 90, 4, 2, 48, 80},
                          std::array<index_t, 7>{2, 1, 300, 8, 2, 64, 64},
                          std::array<index_t, 7>{1, 2, 1500, 4, 1, 16, 3}}) {
        const index_t B = g[0], Lq = g[1], Lk = g[2], H = g[3], Hk = g[4], D = g[5], Dv = g[6];
        SCOPED_TRACE(::testing::Message() << "Lq " << Lq << " Lk " << Lk);
        const tensor4<float> q = random_bshd(B, Lq, H, D, distribution::gaussian, 51);
        const tensor4<float> k = random_bshd(B, Lk, Hk, D, distribution::gaussian, 52);
        const tensor4<float> v = random_bshd(B, Lk, Hk, Dv, distribution::gaussian, 53);
        softmax_options o;
        o.causal = true;
        const fast_result dense = run_fast(q, k, v, o);

        std::vector<float> qb(q.size()), kb(k.size()), vb(v.size()),
            ob(static_cast<std::size_t>(B * Lq * H * Dv), kNaN);
        copy_into(bhld_as_bshd(qb.data(), B, H, Lq, D), q);
        copy_into(bhld_as_bshd(kb.data(), B, Hk, Lk, D), k);
        copy_into(bhld_as_bshd(vb.data(), B, Hk, Lk, Dv), v);
        const view<const float, 4> qv = bhld_as_bshd<const float>(qb.data(), B, H, Lq, D);
        const view<const float, 4> kv = bhld_as_bshd<const float>(kb.data(), B, Hk, Lk, D);
        const view<const float, 4> vv = bhld_as_bshd<const float>(vb.data(), B, Hk, Lk, Dv);
        const view<float, 4> ov = bhld_as_bshd(ob.data(), B, H, Lq, Dv);
        tensor3<float> lse = make_lse<float>(B, Lq, H, kNaN);
        attnkit::softmax_attention(qv, kv, vv, ov, lse, o);
        if (Dv * index_t(sizeof(float)) <= 128) {  // short rows: to rounding on the row kernel
            EXPECT_TRUE(all_close(ov, dense.out, out_tolerance(q, k, v, o)));
            EXPECT_TRUE(all_close(lse, dense.lse, lse_tolerance(q, k, o)));
        } else {
            EXPECT_TRUE(bitwise_equal(ov, dense.out));
            EXPECT_TRUE(same_bytes(lse, dense.lse));
        }
    }
}

TEST(softmax_attention, fused_qkv_views_equal_dense_tensors) {
    for (const auto& g :
         {std::array<index_t, 5>{2, 70, 4, 4, 64}, std::array<index_t, 5>{2, 100, 8, 2, 48},
          std::array<index_t, 5>{1, 3, 2, 1, 80}}) {
        const index_t B = g[0], L = g[1], H = g[2], Hk = g[3], D = g[4];
        SCOPED_TRACE(::testing::Message() << "L " << L << " H " << H << " Hk " << Hk);
        std::vector<float> buf(static_cast<std::size_t>(B * L * (H + 2 * Hk) * D));
        fill_random(buf.data(), buf.size(), distribution::gaussian, 61);
        const qkv_views<float> f = H == Hk ? fused_qkv_views(buf.data(), B, L, H, D)
                                           : fused_qkv_views(buf.data(), B, L, H, Hk, D);
        tensor4<float> q = make_bshd<float>(B, L, H, D), k = make_bshd<float>(B, L, Hk, D),
                       v = make_bshd<float>(B, L, Hk, D);
        copy_into(q, f.q);
        copy_into(k, f.k);
        copy_into(v, f.v);
        softmax_options o;
        o.causal = true;
        const fast_result dense = run_fast(q, k, v, o);
        const fast_result fused = run_fast(view<const float, 4>(f.q), view<const float, 4>(f.k),
                                           view<const float, 4>(f.v), o);
        EXPECT_TRUE(same_bytes(fused.out, dense.out));
        EXPECT_TRUE(same_bytes(fused.lse, dense.lse));
        // Mutable views are accepted for inputs too.
        const fast_result fused_mut = run_fast(f.q, f.k, f.v, o);
        EXPECT_TRUE(same_bytes(fused_mut.out, dense.out));
    }
}

TEST(softmax_attention, tensor_maps_equal_tensors) {
    const index_t B = 2, Lq = 40, Lk = 90, H = 4, Hk = 1, D = 32;
    tensor4<float> q = random_bshd(B, Lq, H, D, distribution::uniform, 71);
    tensor4<float> k = random_bshd(B, Lk, Hk, D, distribution::uniform, 72);
    tensor4<float> v = random_bshd(B, Lk, Hk, D, distribution::uniform, 73);
    softmax_options o;
    o.window_left = 10;
    const fast_result dense = run_fast(q, k, v, o);

    std::vector<float> ob(static_cast<std::size_t>(B * Lq * H * D), kNaN),
        lb(static_cast<std::size_t>(B * Lq * H), kNaN);
    map4 out(ob.data(), B, Lq, H, D);
    map3 lse(lb.data(), B, Lq, H);
    attnkit::softmax_attention(map4(q.data(), B, Lq, H, D), cmap4(k.data(), B, Lk, Hk, D),
                               cmap4(v.data(), B, Lk, Hk, D), out, lse, o);
    EXPECT_TRUE(bitwise_equal(out, dense.out));
    EXPECT_TRUE(bitwise_equal(lse, dense.lse));
    // Temporaries of maps as outputs (rvalues), without lse.
    std::fill(ob.begin(), ob.end(), kNaN);
    attnkit::softmax_attention(cmap4(q.data(), B, Lq, H, D), k, v, map4(ob.data(), B, Lq, H, D), o);
    EXPECT_TRUE(bitwise_equal(out, dense.out));
}

TEST(softmax_attention, misaligned_base_pointers) {
    struct cfg {
        index_t B, Lq, Lk, H, Hk, D, Dv;
    };
    for (const cfg& g : {cfg{2, 33, 65, 4, 2, 64, 48}, cfg{1, 1, 1500, 4, 4, 96, 96},
                         cfg{2, 17, 17, 2, 1, 3, 17}}) {
        SCOPED_TRACE(::testing::Message() << "Lq " << g.Lq << " Lk " << g.Lk << " D " << g.D);
        const tensor4<float> q = random_bshd(g.B, g.Lq, g.H, g.D, distribution::gaussian, 81);
        const tensor4<float> k = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::gaussian, 82);
        const tensor4<float> v = random_bshd(g.B, g.Lk, g.Hk, g.Dv, distribution::gaussian, 83);
        softmax_options o;
        o.causal = true;
        const fast_result dense = run_fast(q, k, v, o);

        // Each buffer one float past a 64-byte boundary.
        auto shifted = [](const tensor4<float>& t) {
            auto buf =
                std::make_unique<std::vector<float>>(static_cast<std::size_t>(t.size()) + 32);
            float* base = buf->data();
            while (reinterpret_cast<std::uintptr_t>(base) % 64 != 0) ++base;
            std::copy(t.data(), t.data() + t.size(), base + 1);
            return std::make_pair(std::move(buf), base + 1);
        };
        auto qs = shifted(q), ks = shifted(k), vs = shifted(v);
        tensor4<float> out_proto = make_bshd<float>(g.B, g.Lq, g.H, g.Dv, kNaN);
        auto os = shifted(out_proto);
        std::vector<float> lbuf(static_cast<std::size_t>(g.B * g.Lq * g.H) + 1, kNaN);
        ASSERT_NE(0u, reinterpret_cast<std::uintptr_t>(qs.second) % 16);
        attnkit::softmax_attention(cmap4(qs.second, g.B, g.Lq, g.H, g.D),
                                   cmap4(ks.second, g.B, g.Lk, g.Hk, g.D),
                                   view<const float, 4>(vs.second, {g.B, g.Lk, g.Hk, g.Dv}),
                                   view<float, 4>(os.second, {g.B, g.Lq, g.H, g.Dv}),
                                   view<float, 3>(lbuf.data() + 1, {g.B, g.Lq, g.H}), o);
        EXPECT_TRUE(
            bitwise_equal(view<const float, 4>(os.second, {g.B, g.Lq, g.H, g.Dv}), dense.out));
        EXPECT_TRUE(
            bitwise_equal(view<const float, 3>(lbuf.data() + 1, {g.B, g.Lq, g.H}), dense.lse));
        EXPECT_TRUE(all_close(dense.out, run_reference(q, k, v, o).out, out_tolerance(q, k, v, o)));
    }
}

}  // namespace
