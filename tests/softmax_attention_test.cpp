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
//   merge         two halves of the keys merged with merge_partials equal the whole call,
//                 also with a fully masked half (lse = -inf on one side or both).
//   threads       1, 2 and 3 threads (and no pool) are bitwise identical.
//   layouts       [B,H,L,D] views, fused QKV views, TensorMaps and misaligned pointers give
//                 bitwise the results of dense tensors.
//   extreme       logits of magnitude 1e4; NaN (or Inf) in one key, value or query row; NaN
//                 garbage past key_lengths; fully masked rows; empty sequences.
// Bad arguments are covered by check_test.cpp (typed over the reference and this kernel).
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
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::softmax_options;
using attnkit::view;
using namespace attnkit_test;

using map4 = Eigen::TensorMap<tensor4<float>>;
using map3 = Eigen::TensorMap<tensor3<float>>;
using cmap4 = Eigen::TensorMap<Eigen::Tensor<const float, 4, Eigen::RowMajor>>;

constexpr double kOutEps = 16;  // eps multiple for outputs (see the header comment)
constexpr double kLseEps = 16;  // eps multiple for lse
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInfF = -std::numeric_limits<float>::infinity();

// ---- helpers -------------------------------------------------------------------------------

using fast_result = attention_outputs<float>;
using ref_result = attention_outputs<double>;

template <class Q, class K, class V>
fast_result run_fast(const Q& q, const K& k, const V& v, const softmax_options& o) {
    // NaN sentinels: an element the kernel forgets to write fails every comparison.
    fast_result r = outputs_for<float>(q, v, kNaN);
    attnkit::softmax_attention(q, k, v, r.out, r.lse, o);
    return r;
}

template <class Q, class K, class V>
ref_result run_reference(const Q& q, const K& k, const V& v, const softmax_options& o) {
    ref_result r = outputs_for<double>(q, v, 0.0);
    attnkit::reference::softmax_attention(q, k, v, r.out, r.lse, o);
    return r;
}

float resolved_scale(const softmax_options& o, index_t D) {
    return attnkit::detail::resolve_scale(o.scale, D);
}

// Bound on |score| (Cauchy-Schwarz), capped by the softcap when it is on.
template <class Q, class K>
double score_bound(const Q& q, const K& k, const softmax_options& o) {
    double s = static_cast<double>(resolved_scale(o, as_view(q).dims[3])) * max_row_norm(q) *
               max_row_norm(k);
    if (o.softcap > 0.0f) s = std::min(s, static_cast<double>(o.softcap));
    return s;
}

template <class Q, class K, class V>
tolerance out_tolerance(const Q& q, const K& k, const V& v, const softmax_options& o,
                        double eps_multiple = kOutEps) {
    return tolerance_for(eps_multiple, max_abs(v) * (1.0 + score_bound(q, k, o)));
}

template <class Q, class K>
tolerance lse_tolerance(const Q& q, const K& k, const softmax_options& o,
                        double eps_multiple = kLseEps) {
    double sink = 0.0;
    for (float s : o.sinks)
        if (std::isfinite(s)) sink = std::max(sink, std::fabs(static_cast<double>(s)));
    return tolerance_for(eps_multiple, 1.0 + std::max(score_bound(q, k, o), sink));
}

// Bitwise equality of two float tensors of the same shape (strided views allowed).
template <class A, class E>
::testing::AssertionResult bitwise_equal(const A& actual, const E& expected) {
    constexpr int N = rank_of<A>;
    const auto av = as_view(actual);
    const auto ev = as_view(expected);
    if (av.dims != ev.dims) return ::testing::AssertionFailure() << "shape mismatch";
    index_t bad = 0;
    std::ostringstream details;
    for_each_index<N>(av.dims, [&](const std::array<index_t, N>& idx) {
        const float a = at(av, idx), e = at(ev, idx);
        if (std::memcmp(&a, &e, sizeof(float)) != 0) {
            if (bad < 4) details << "\n  at " << index_string(idx) << ": " << a << " vs " << e;
            ++bad;
        }
    });
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << bad << " of " << av.size() << " elements differ bitwise:" << details.str();
}

// memcmp of whole dense tensors.
template <class T, int N>
bool same_bytes(const Eigen::Tensor<T, N, Eigen::RowMajor>& a,
                const Eigen::Tensor<T, N, Eigen::RowMajor>& b) {
    return a.size() == b.size() &&
           std::memcmp(a.data(), b.data(), sizeof(T) * static_cast<std::size_t>(a.size())) == 0;
}

// Copies the elements of src into dst (same dims; any strides).
template <class D, class S>
void copy_into(D&& dst, const S& src) {
    auto dv = as_mutable_view(std::forward<D>(dst));
    const auto sv = as_view(src);
    using T = typename decltype(dv)::value_type;
    for_each_index<rank_of<S>>(sv.dims,
                               [&](const auto& idx) { at(dv, idx) = static_cast<T>(at(sv, idx)); });
}

// Independent restatement of the visibility rule (docs/design.md "Conventions"), for tests that
// need to know which rows see a given key.
bool sees(const softmax_options& o, index_t Lq, index_t Lk, index_t i, index_t j, index_t len) {
    const index_t p = i + (Lk - Lq);
    if (j >= len) return false;
    if ((o.causal || o.chunk > 0) && j > p) return false;
    if (o.window_left >= 0 && j < p - o.window_left) return false;
    if (o.chunk > 0) {
        const index_t c = o.chunk;
        const index_t start = (p >= 0 ? p / c : -((-p + c - 1) / c)) * c;
        if (j < start || j >= start + c) return false;
    }
    return true;
}

std::vector<float> random_sinks(index_t H, std::uint64_t seed) {
    random_source rs(seed);
    std::vector<float> s(static_cast<std::size_t>(H));
    for (auto& x : s) x = static_cast<float>(rs.uniform(-2.0, 4.0));
    if (H > 1) s[0] = kNegInfF;  // -inf: no sink for head 0
    return s;
}

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
        while (made < 150) {
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

// Element by element (Eigen's vectorised cast would pull its own AVX-512 conversion code into
// the test, with GCC 12's false -Wmaybe-uninitialized in it).
template <class T>
tensor4<T> stored_as(const tensor4<float>& x) {
    tensor4<T> y(x.dimensions());
    for (index_t i = 0; i < x.size(); ++i) y.data()[i] = T(x.data()[i]);
    return y;
}
template <class T>
tensor4<float> widened(const tensor4<T>& x) {
    tensor4<float> y(x.dimensions());
    for (index_t i = 0; i < x.size(); ++i) y.data()[i] = static_cast<float>(x.data()[i]);
    return y;
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

INSTANTIATE_TEST_SUITE_P(softmax_attention, sweep_storage,
                         ::testing::Combine(::testing::ValuesIn(all_cases()),
                                            ::testing::Values(storage::bf16_kv, storage::f16_kv,
                                                              storage::bf16_qkv)),
                         [](const ::testing::TestParamInfo<std::tuple<attn_case, storage>>& info) {
                             const attn_case& c = std::get<0>(info.param);
                             return std::string(storage_name(std::get<1>(info.param))) + "_" + c.sweep +
                                    "_" + std::to_string(info.index) + "_" + c.describe();
                         });

// Threads and layouts with 16-bit storage: views over a [B, H, L, D] half buffer equal the
// dense tensors bitwise, and 1, 2 and 3 threads agree bitwise (row kernel with split-KV, and
// the tile kernel).
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

// ---- merging partial results ---------------------------------------------------------------

// Keys [j0, j0 + n) of a [B, Lk, Hk, D] tensor as a view (no copy).
view<const float, 4> key_slice(const tensor4<float>& x, index_t j0, index_t n) {
    const index_t B = x.dimension(0), Lk = x.dimension(1), Hk = x.dimension(2), D = x.dimension(3);
    return view<const float, 4>(x.data() + j0 * Hk * D, {B, n, Hk, D}, {Lk * Hk * D, Hk * D, D, 1});
}

TEST(softmax_attention, merge_of_two_key_halves_equals_whole) {
    struct cfg {
        index_t B, Lq, Lk, H, Hk, D, Dv, split;
    };
    for (const cfg& g : {cfg{2, 65, 200, 4, 2, 64, 48, 97}, cfg{2, 1, 3000, 8, 2, 64, 64, 1500},
                         cfg{1, 3, 129, 4, 4, 16, 16, 1}, cfg{2, 257, 257, 2, 1, 32, 32, 200}}) {
        SCOPED_TRACE(::testing::Message()
                     << "Lq " << g.Lq << " Lk " << g.Lk << " split at " << g.split);
        const tensor4<float> q = random_bshd(g.B, g.Lq, g.H, g.D, distribution::outliers, 21);
        const tensor4<float> k = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::outliers, 22);
        const tensor4<float> v = random_bshd(g.B, g.Lk, g.Hk, g.Dv, distribution::outliers, 23);
        const softmax_options o;
        const fast_result whole = run_fast(q, k, v, o);
        // Halves: one as views into k and v, the other as copies.
        const fast_result a = run_fast(q, key_slice(k, 0, g.split), key_slice(v, 0, g.split), o);
        tensor4<float> kb = make_bshd<float>(g.B, g.Lk - g.split, g.Hk, g.D),
                       vb = make_bshd<float>(g.B, g.Lk - g.split, g.Hk, g.Dv);
        copy_into(kb, key_slice(k, g.split, g.Lk - g.split));
        copy_into(vb, key_slice(v, g.split, g.Lk - g.split));
        const fast_result b = run_fast(q, kb, vb, o);

        fast_result merged{make_bshd<float>(g.B, g.Lq, g.H, g.Dv, kNaN),
                           make_lse<float>(g.B, g.Lq, g.H, kNaN)};
        attnkit::merge_partials(a.out, a.lse, b.out, b.lse, merged.out, merged.lse);
        EXPECT_TRUE(all_close(merged.out, whole.out, out_tolerance(q, k, v, o)))
            << "out vs whole call";
        EXPECT_TRUE(all_close(merged.lse, whole.lse, lse_tolerance(q, k, o)))
            << "lse vs whole call";
        const ref_result want = run_reference(q, k, v, o);
        EXPECT_TRUE(all_close(merged.out, want.out, out_tolerance(q, k, v, o)))
            << "out vs reference";
        EXPECT_TRUE(all_close(merged.lse, want.lse, lse_tolerance(q, k, o))) << "lse vs reference";

        // Order does not matter up to rounding; in place (out aliasing out_a) gives the same bits.
        fast_result swapped{make_bshd<float>(g.B, g.Lq, g.H, g.Dv, kNaN),
                            make_lse<float>(g.B, g.Lq, g.H, kNaN)};
        attnkit::merge_partials(b.out, b.lse, a.out, a.lse, swapped.out, swapped.lse);
        EXPECT_TRUE(all_close(swapped.out, merged.out, out_tolerance(q, k, v, o)));
        fast_result in_place = a;
        attnkit::merge_partials(in_place.out, in_place.lse, b.out, b.lse, in_place.out,
                                in_place.lse);
        EXPECT_TRUE(same_bytes(in_place.out, merged.out));
        EXPECT_TRUE(same_bytes(in_place.lse, merged.lse));
    }
}

TEST(softmax_attention, merge_with_a_fully_masked_half) {
    const index_t B = 3, Lq = 20, Lk = 150, H = 4, Hk = 2, D = 32, split = 70;
    const tensor4<float> q = random_bshd(B, Lq, H, D, distribution::gaussian, 31);
    const tensor4<float> k = random_bshd(B, Lk, Hk, D, distribution::gaussian, 32);
    const tensor4<float> v = random_bshd(B, Lk, Hk, D, distribution::gaussian, 33);
    const auto ka = key_slice(k, 0, split), va = key_slice(v, 0, split);
    const auto kb = key_slice(k, split, Lk - split), vb = key_slice(v, split, Lk - split);

    // Batch 0: second half masked; batch 1: first half masked; batch 2: both masked.
    softmax_options oa, ob;
    oa.key_lengths = {split, 0, 0};
    ob.key_lengths = {0, Lk - split, 0};
    const fast_result a = run_fast(q, ka, va, oa);
    const fast_result b = run_fast(q, kb, vb, ob);
    fast_result merged{make_bshd<float>(B, Lq, H, D, kNaN), make_lse<float>(B, Lq, H, kNaN)};
    attnkit::merge_partials(a.out, a.lse, b.out, b.lse, merged.out, merged.lse);

    // Batch 0 must equal the first-half call exactly (the -inf side contributes nothing), batch 1
    // the second-half call, batch 2 zeros and -inf.
    for (index_t bi = 0; bi < B; ++bi)
        for (index_t i = 0; i < Lq; ++i)
            for (index_t h = 0; h < H; ++h) {
                const fast_result& src = bi == 0 ? a : b;
                for (index_t c = 0; c < D; ++c) {
                    const float want = bi == 2 ? 0.0f : src.out(bi, i, h, c);
                    ASSERT_EQ(want, merged.out(bi, i, h, c))
                        << bi << " " << i << " " << h << " " << c;
                }
                ASSERT_EQ(bi == 2 ? kNegInfF : src.lse(bi, i, h), merged.lse(bi, i, h));
            }
    for (index_t i = 0; i < Lq; ++i)
        for (index_t h = 0; h < H; ++h) ASSERT_EQ(kNegInfF, a.lse(1, i, h));

    // And the merge equals the whole call: batches 0 and 2 with key_lengths {split, -, 0}; batch
    // 1 sees keys [split, Lk) only, which key_lengths cannot express: the second-half call.
    softmax_options whole_o;
    whole_o.key_lengths = {split, Lk, 0};
    ref_result want = run_reference(q, k, v, whole_o);
    const ref_result want_b = run_reference(q, kb, vb, ob);
    for (index_t i = 0; i < Lq; ++i)
        for (index_t h = 0; h < H; ++h) {
            for (index_t c = 0; c < D; ++c) want.out(1, i, h, c) = want_b.out(1, i, h, c);
            want.lse(1, i, h) = want_b.lse(1, i, h);
        }
    EXPECT_TRUE(all_close(merged.out, want.out, out_tolerance(q, k, v, whole_o)));
    EXPECT_TRUE(all_close(merged.lse, want.lse, lse_tolerance(q, k, whole_o)));
    const fast_result whole = run_fast(q, k, v, whole_o);
    for (index_t i = 0; i < Lq; ++i)
        for (index_t h = 0; h < H; ++h)
            for (index_t c = 0; c < D; ++c) {
                ASSERT_NEAR(whole.out(0, i, h, c), merged.out(0, i, h, c),
                            out_tolerance(q, k, v, whole_o).atol);
                ASSERT_EQ(0.0f, whole.out(2, i, h, c));
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
        EXPECT_TRUE(bitwise_equal(ov, dense.out));
        EXPECT_TRUE(same_bytes(lse, dense.lse));
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

// ---- extreme inputs ------------------------------------------------------------------------

// Largest |scale * <q_i, k_j>| over every pair a query head and its key/value head form.
double max_abs_score(const tensor4<float>& q, const tensor4<float>& k, float scale) {
    const index_t B = q.dimension(0), Lq = q.dimension(1), H = q.dimension(2), D = q.dimension(3);
    const index_t Lk = k.dimension(1), Hk = k.dimension(2), G = H / Hk;
    double m = 0.0;
    for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < H; ++h)
            for (index_t i = 0; i < Lq; ++i)
                for (index_t j = 0; j < Lk; ++j) {
                    double s = 0.0;
                    for (index_t d = 0; d < D; ++d)
                        s += double(q(b, i, h, d)) * double(k(b, j, h / G, d));
                    m = std::max(m, std::fabs(scale * s));
                }
    return m;
}

TEST(softmax_attention, logits_of_magnitude_1e4) {
    struct cfg {
        index_t B, Lq, Lk, H, Hk, D;
        bool causal;
        float softcap;
    };
    for (const cfg& g :
         {cfg{2, 129, 129, 4, 2, 64, true, 0.0f}, cfg{2, 1, 300, 4, 2, 64, false, 0.0f},
          cfg{1, 1, 2000, 2, 1, 32, false, 0.0f}, cfg{1, 70, 70, 2, 2, 16, false, 0.0f},
          cfg{2, 65, 65, 4, 1, 48, true, 5000.0f}}) {
        SCOPED_TRACE(::testing::Message()
                     << "Lq " << g.Lq << " Lk " << g.Lk << " softcap " << g.softcap);
        tensor4<float> q = random_bshd(g.B, g.Lq, g.H, g.D, distribution::gaussian, 91);
        tensor4<float> k = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::gaussian, 92);
        const tensor4<float> v = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::gaussian, 93);
        softmax_options o;
        o.causal = g.causal;
        o.softcap = g.softcap;
        // Scale q and k together so that the largest |score| is 1e4.
        const double f = std::sqrt(1e4 / max_abs_score(q, k, resolved_scale(o, g.D)));
        q = q * static_cast<float>(f);
        k = k * static_cast<float>(f);
        const double smax = max_abs_score(q, k, resolved_scale(o, g.D));
        ASSERT_GT(smax, 0.9e4);
        ASSERT_LT(smax, 1.1e4);

        const fast_result got = run_fast(q, k, v, o);
        const ref_result want = run_reference(q, k, v, o);
        for (index_t i = 0; i < got.out.size(); ++i)
            ASSERT_TRUE(std::isfinite(got.out.data()[i])) << i;
        for (index_t i = 0; i < got.lse.size(); ++i)
            ASSERT_TRUE(std::isfinite(got.lse.data()[i])) << i;
        // A score of 1e4 rounds to float with an absolute error of ~1e-3, which moves the weights
        // by a relative ~1e-3: the tolerance scales with the logit magnitude.
        EXPECT_TRUE(all_close(got.out, want.out, out_tolerance(q, k, v, o))) << "out";
        EXPECT_TRUE(all_close(got.lse, want.lse, lse_tolerance(q, k, o))) << "lse";
        // ... and with the actual logit magnitude 1e4 instead of the Cauchy-Schwarz bound.
        EXPECT_TRUE(all_close(got.out, want.out, tolerance_for(kOutEps, max_abs(v) * (1.0 + smax))))
            << "out (1e4)";
        EXPECT_TRUE(all_close(got.lse, want.lse, tolerance_for(kLseEps, 1.0 + smax)))
            << "lse (1e4)";
    }
}

// Values near FLT_MAX: the output is a convex combination of them, representable, while the
// unnormalised sum over keys (weights up to 1 each) is not. Rows whose output overflowed are
// computed again with their weights scaled down by a power of two (exactly); the other rows keep
// their bits. Row kernel (Lq = 1), tile kernel (Lq = 40), split-KV (Lk = 3000), sinks.
TEST(softmax_attention, values_near_float_max_stay_finite) {
    struct cfg {
        index_t Lq, Lk, H;
        bool sinks;
    };
    const float big = std::numeric_limits<float>::max() / 2;
    for (const cfg& g : {cfg{1, 2, 1, false}, cfg{40, 2, 2, false}, cfg{1, 3000, 1, false}, cfg{3, 700, 2, true},
                         cfg{40, 300, 2, true}}) {
        SCOPED_TRACE(::testing::Message() << "Lq " << g.Lq << " Lk " << g.Lk << " sinks " << g.sinks);
        const index_t D = 8, Dv = 5;
        tensor4<float> q = random_bshd(1, g.Lq, g.H, D, distribution::gaussian, 95);
        tensor4<float> k = random_bshd(1, g.Lk, g.H, D, distribution::gaussian, 96);
        tensor4<float> v = random_bshd(1, g.Lk, g.H, Dv, distribution::uniform, 97);
        q = q * 0.01f;  // nearly equal weights: the sum over keys is ~Lk times the values
        for (index_t i = 0; i < v.size(); ++i) v.data()[i] = big * (1.5f + 0.25f * v.data()[i]);  // 1.25 .. 1.75 x
        softmax_options o;
        if (g.sinks) o.sinks.assign(static_cast<std::size_t>(g.H), -3.0f);
        const fast_result got = run_fast(q, k, v, o);
        const ref_result want = run_reference(q, k, v, o);
        for (index_t i = 0; i < got.out.size(); ++i) ASSERT_TRUE(std::isfinite(got.out.data()[i])) << i;
        EXPECT_TRUE(all_close(got.out, want.out, tolerance_for(kOutEps, max_abs(v)))) << "out";
        EXPECT_TRUE(all_close(got.lse, want.lse, lse_tolerance(q, k, o))) << "lse";
    }
}

TEST(softmax_attention, equal_logits_of_plus_and_minus_1e4) {
    // Every key is the same vector u, q = +-c u: a row's scores all equal +-1e4, so the weights
    // are exactly uniform and lse = +-1e4 + log(Lk). Checks exp underflow of exp(-1e4) handling.
    for (index_t Lq : {1, 3, 40}) {
        const index_t B = 1, Lk = 150, H = 2, D = 16;
        std::vector<double> u = random_values(D, distribution::gaussian, 95);
        double norm2 = 0.0;
        for (double x : u) norm2 += x * x;
        const double scale = 1.0 / 4.0;  // default for D = 16
        tensor4<float> q(B, Lq, H, D), k(B, Lk, 1, D);
        for (index_t j = 0; j < Lk; ++j)
            for (index_t d = 0; d < D; ++d) k(0, j, 0, d) = static_cast<float>(u[d]);
        for (index_t i = 0; i < Lq; ++i)
            for (index_t h = 0; h < H; ++h)
                for (index_t d = 0; d < D; ++d)
                    q(0, i, h, d) =
                        static_cast<float>((h == 0 ? 1.0 : -1.0) * 1e4 / (scale * norm2) * u[d]);
        const tensor4<float> v = random_bshd(B, Lk, 1, 8, distribution::uniform, 96);
        const fast_result got = run_fast(q, k, v, softmax_options{});
        const ref_result want = run_reference(q, k, v, softmax_options{});
        EXPECT_TRUE(all_close(got.out, want.out, tolerance_for(kOutEps, max_abs(v))));
        EXPECT_TRUE(all_close(got.lse, want.lse, tolerance_for(kLseEps, 1e4)));
        EXPECT_NEAR(1e4 + std::log(double(Lk)), got.lse(0, 0, 0), tolerance_for(kLseEps, 1e4).atol);
        EXPECT_NEAR(-1e4 + std::log(double(Lk)), got.lse(0, 0, 1),
                    tolerance_for(kLseEps, 1e4).atol);
    }
}

// A NaN in one key (or value) row of head hk, batch b: rows that cannot see it equal the clean
// run bitwise; rows that see it are NaN (at least not finite): every element and lse for a NaN
// key (the score is NaN), the poisoned column for a NaN value (scores and lse stay clean).
void check_nan_isolation(index_t B, index_t Lq, index_t Lk, index_t H, index_t Hk, index_t D,
                         softmax_options o, index_t bad_b, index_t bad_j, index_t bad_hk,
                         bool in_value, bool some_row_sees = true, float bad_value = kNaN) {
    SCOPED_TRACE(::testing::Message()
                 << bad_value << (in_value ? " in v" : " in k") << ": B " << B << " Lq " << Lq
                 << " Lk " << Lk << " H " << H << " Hk " << Hk << " key " << bad_j);
    const tensor4<float> q = random_bshd(B, Lq, H, D, distribution::gaussian, 101);
    tensor4<float> k = random_bshd(B, Lk, Hk, D, distribution::gaussian, 102);
    tensor4<float> v = random_bshd(B, Lk, Hk, D, distribution::gaussian, 103);
    const fast_result clean = run_fast(q, k, v, o);
    const index_t bad_c = D / 2;
    (in_value ? v : k)(bad_b, bad_j, bad_hk, bad_c) = bad_value;
    const fast_result dirty = run_fast(q, k, v, o);
    const ref_result want = run_reference(q, k, v, o);

    const index_t G = H / Hk;
    index_t n_seeing = 0, n_clean = 0, bad_rows = 0;
    for (index_t b = 0; b < B; ++b) {
        const index_t len = o.key_lengths.empty() ? Lk : o.key_lengths[b];
        for (index_t i = 0; i < Lq; ++i)
            for (index_t h = 0; h < H; ++h) {
                const bool hit = b == bad_b && h / G == bad_hk && sees(o, Lq, Lk, i, bad_j, len);
                bool ok = true;
                for (index_t c = 0; c < D; ++c) {
                    const bool poisoned = hit && (!in_value || c == bad_c);
                    const float x = dirty.out(b, i, h, c), y = clean.out(b, i, h, c);
                    if (poisoned)
                        ok = ok && !std::isfinite(x);
                    else if (!hit)
                        ok = ok && std::memcmp(&x, &y, sizeof x) == 0;
                    // The reference agrees on which elements are poisoned.
                    ok = ok && !std::isfinite(want.out(b, i, h, c)) == poisoned;
                }
                const float lx = dirty.lse(b, i, h), ly = clean.lse(b, i, h);
                if (hit && !in_value)
                    ok = ok && !std::isfinite(lx);
                else if (!hit)
                    ok = ok && std::memcmp(&lx, &ly, sizeof lx) == 0;
                if (!ok && ++bad_rows <= 5)
                    ADD_FAILURE() << "row b " << b << " i " << i << " h " << h
                                  << (hit ? " sees" : " does not see") << " the NaN; out[" << bad_c
                                  << "] " << dirty.out(b, i, h, bad_c) << " (clean "
                                  << clean.out(b, i, h, bad_c) << "), out[0] "
                                  << dirty.out(b, i, h, 0) << " (clean " << clean.out(b, i, h, 0)
                                  << "), lse " << lx << " (clean " << ly << ")";
                (hit ? n_seeing : n_clean)++;
            }
    }
    EXPECT_EQ(0, bad_rows) << "rows wrong";
    EXPECT_EQ(some_row_sees, n_seeing > 0);
    EXPECT_GT(n_clean, 0);
}

TEST(softmax_attention, nan_in_a_key_row_affects_only_rows_that_see_it) {
    softmax_options causal;
    causal.causal = true;
    check_nan_isolation(2, 129, 129, 4, 2, 32, causal, 1, 60, 1, false);    // tile kernel
    check_nan_isolation(2, 300, 300, 2, 1, 16, causal, 0, 5, 0, false);     // two query blocks
    check_nan_isolation(1, 4, 200, 4, 2, 16, causal, 0, 198, 0, false);     // row kernel
    check_nan_isolation(1, 4, 3000, 2, 1, 48, causal, 0, 2998, 0, false);   // row kernel, split-KV
    check_nan_isolation(1, 64, 1100, 1, 1, 32, causal, 0, 1060, 0, false);  // tile kernel, split-KV
    softmax_options window;
    window.window_left = 5;
    check_nan_isolation(2, 65, 65, 4, 4, 16, window, 0, 20, 3, false);
    softmax_options kl;
    kl.key_lengths = {30, 65};
    check_nan_isolation(2, 1, 65, 8, 1, 64, kl, 0, 40, 0, false, false);  // masked by key_lengths
    check_nan_isolation(2, 1, 65, 8, 1, 64, kl, 1, 40, 0, false);
}

// docs/design.md: "NaN or Inf in the inputs propagate to the affected rows only". A NaN (or Inf)
// value row must not leak into rows whose weight for that key is 0 because of the mask.
//
//
// The tile kernel multiplies a whole V tile by every row's probabilities, so a row that the mask
// excludes from key j would compute 0 * NaN = NaN; it guards zeros in partially masked panels
// over tiles with non-finite values. Reproducer of the original bug: B = H = Hk = D = Dv = 1,
// Lq = Lk = 9, causal, q = k = 0, v = 3 except v[0, 8, 0, 0] = NaN: queries 0..7 must give 3.
// Cases marked "row / tile" take the tile kernel on SSE2 and scalar builds only.
TEST(softmax_attention, nan_in_a_value_row_affects_only_rows_that_see_it) {
    softmax_options causal;
    causal.causal = true;
    softmax_options window;
    window.window_left = 5;
    const float inf = std::numeric_limits<float>::infinity();
    check_nan_isolation(2, 129, 129, 4, 2, 32, causal, 1, 60, 1, true);             // tile
    check_nan_isolation(2, 65, 65, 4, 4, 16, window, 0, 20, 3, true);               // tile
    check_nan_isolation(2, 100, 100, 2, 1, 16, causal, 0, 70, 0, true, true, inf);  // tile
    check_nan_isolation(1, 4, 200, 4, 2, 16, causal, 0, 198, 0, true);              // row / tile
    check_nan_isolation(1, 4, 3000, 2, 1, 48, causal, 0, 2998, 0, true);  // row / tile, split-KV
    check_nan_isolation(1, 4, 200, 4, 2, 16, causal, 0, 198, 0, true, true, inf);  // row / tile
    // One row per item (Lq = G = 1, the row kernel on every build): the key outside the window
    // is never even loaded; the last case checks that a seen NaN does reach the split-KV merge.
    softmax_options w100;
    w100.window_left = 100;
    check_nan_isolation(2, 1, 200, 2, 2, 16, w100, 0, 60, 1, true, false);          // row
    check_nan_isolation(2, 1, 3000, 2, 2, 16, w100, 1, 2880, 0, true, false);       // row, split-KV
    check_nan_isolation(2, 1, 3000, 2, 2, 16, w100, 1, 2880, 0, true, false, inf);  // row, split-KV
    check_nan_isolation(2, 1, 3000, 2, 2, 16, w100, 1, 2950, 0, true);  // row, split-KV, seen
}

// A NaN in one query row poisons that row only (rows share K/V loads and score tiles).
TEST(softmax_attention, nan_in_a_query_row_affects_only_that_row) {
    struct cfg {
        index_t Lq, Lk, H, Hk;
    };
    for (const cfg& g :
         {cfg{40, 100, 4, 2}, cfg{2, 300, 4, 1}, cfg{1, 2000, 8, 2}, cfg{300, 300, 1, 1}}) {
        SCOPED_TRACE(::testing::Message()
                     << "Lq " << g.Lq << " Lk " << g.Lk << " H " << g.H << " Hk " << g.Hk);
        const index_t B = 2, D = 32;
        tensor4<float> q = random_bshd(B, g.Lq, g.H, D, distribution::gaussian, 151);
        const tensor4<float> k = random_bshd(B, g.Lk, g.Hk, D, distribution::gaussian, 152);
        const tensor4<float> v = random_bshd(B, g.Lk, g.Hk, D, distribution::gaussian, 153);
        softmax_options o;
        o.causal = true;
        const fast_result clean = run_fast(q, k, v, o);
        const index_t bi = 1, bh = g.H - 1, bq = g.Lq / 2;
        q(bi, bq, bh, 3) = kNaN;
        const fast_result dirty = run_fast(q, k, v, o);
        for (index_t b = 0; b < B; ++b)
            for (index_t i = 0; i < g.Lq; ++i)
                for (index_t h = 0; h < g.H; ++h) {
                    const bool hit = b == bi && i == bq && h == bh;
                    for (index_t c = 0; c < D; ++c) {
                        const float x = dirty.out(b, i, h, c), y = clean.out(b, i, h, c);
                        if (hit) {
                            ASSERT_TRUE(std::isnan(x)) << c;
                        } else {
                            ASSERT_EQ(0, std::memcmp(&x, &y, sizeof x))
                                << b << " " << i << " " << h << " " << c;
                        }
                    }
                    if (hit) {
                        ASSERT_TRUE(std::isnan(dirty.lse(b, i, h)));
                    }
                }
    }
}

// A KV cache whose unused tail (j >= key_lengths[b]) holds NaN garbage: nothing reads it.
TEST(softmax_attention, nan_garbage_past_key_lengths_is_never_read) {
    struct cfg {
        index_t Lq, Lk, H, Hk;
        bool causal;
    };
    for (const cfg& g :
         {cfg{1, 300, 8, 2, false}, cfg{3, 300, 2, 1, true}, cfg{60, 300, 4, 2, true},
          cfg{1, 3000, 4, 1, false}, cfg{300, 300, 2, 2, false}}) {
        SCOPED_TRACE(::testing::Message()
                     << "Lq " << g.Lq << " Lk " << g.Lk << " H " << g.H << " Hk " << g.Hk);
        const index_t B = 2, D = 32;
        const tensor4<float> q = random_bshd(B, g.Lq, g.H, D, distribution::gaussian, 131);
        tensor4<float> k = random_bshd(B, g.Lk, g.Hk, D, distribution::gaussian, 132);
        tensor4<float> v = random_bshd(B, g.Lk, g.Hk, D, distribution::gaussian, 133);
        softmax_options o;
        o.causal = g.causal;
        o.key_lengths = {g.Lk / 2 + 1, 0};
        const fast_result clean = run_fast(q, k, v, o);
        for (index_t b = 0; b < B; ++b)
            for (index_t j = o.key_lengths[b]; j < g.Lk; ++j)
                for (index_t h = 0; h < g.Hk; ++h)
                    for (index_t d = 0; d < D; ++d) k(b, j, h, d) = v(b, j, h, d) = kNaN;
        const fast_result dirty = run_fast(q, k, v, o);
        EXPECT_TRUE(same_bytes(dirty.out, clean.out));
        EXPECT_TRUE(same_bytes(dirty.lse, clean.lse));
    }
}

TEST(softmax_attention, fully_masked_rows_give_zeros_and_minus_inf) {
    struct cfg {
        const char* what;
        index_t B, Lq, Lk, H, Hk, D;
        softmax_options o;
    };
    softmax_options kl0;
    kl0.key_lengths = {0, 50};
    softmax_options kl0_split;
    kl0_split.key_lengths = {0, 1000};
    softmax_options causal;
    causal.causal = true;
    softmax_options chunk_kl;  // rows past the first chunk see nothing below key_lengths = 5
    chunk_kl.chunk = 16;
    chunk_kl.key_lengths = {5};
    softmax_options window_kl;
    window_kl.causal = true;
    window_kl.window_left = 3;
    window_kl.key_lengths = {10, 70};
    cfg cases[] = {
        {"key_lengths 0, tile", 2, 70, 50, 4, 2, 32, kl0},
        {"key_lengths 0, row", 2, 2, 50, 4, 2, 32, kl0},
        {"key_lengths 0, split-KV", 2, 1, 2000, 4, 4, 32, kl0_split},
        {"Lq > Lk causal, tile", 2, 100, 40, 4, 2, 32, causal},
        {"Lq > Lk causal, row", 2, 5, 2, 2, 1, 16, causal},
        {"chunk past key_lengths", 1, 64, 64, 2, 2, 16, chunk_kl},
        {"window past key_lengths", 2, 70, 70, 4, 1, 16, window_kl},
    };
    for (cfg& g : cases) {
        SCOPED_TRACE(g.what);
        const tensor4<float> q = random_bshd(g.B, g.Lq, g.H, g.D, distribution::outliers, 111);
        const tensor4<float> k = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::outliers, 112);
        const tensor4<float> v = random_bshd(g.B, g.Lk, g.Hk, g.D, distribution::outliers, 113);
        for (bool with_sinks : {false, true}) {
            softmax_options o = g.o;
            if (with_sinks) o.sinks = random_sinks(g.H, 114);
            const fast_result got = run_fast(q, k, v, o);
            index_t empty_rows = 0;
            for (index_t b = 0; b < g.B; ++b) {
                const index_t len = o.key_lengths.empty() ? g.Lk : o.key_lengths[b];
                for (index_t i = 0; i < g.Lq; ++i) {
                    bool any = false;
                    for (index_t j = 0; j < g.Lk; ++j) any = any || sees(o, g.Lq, g.Lk, i, j, len);
                    if (any) continue;
                    for (index_t h = 0; h < g.H; ++h) {
                        ++empty_rows;
                        for (index_t c = 0; c < g.D; ++c)
                            ASSERT_EQ(0.0f, got.out(b, i, h, c)) << b << " " << i << " " << h;
                        // With a sink the row's only term is the sink: lse = sink (and zero
                        // output).
                        const float want_lse = with_sinks ? o.sinks[h] : kNegInfF;
                        ASSERT_EQ(want_lse, got.lse(b, i, h)) << b << " " << i << " " << h;
                    }
                }
            }
            EXPECT_GT(empty_rows, 0);
            for (index_t i = 0; i < got.out.size(); ++i)
                ASSERT_FALSE(std::isnan(got.out.data()[i]));
            for (index_t i = 0; i < got.lse.size(); ++i)
                ASSERT_FALSE(std::isnan(got.lse.data()[i]));
            const ref_result want = run_reference(q, k, v, o);
            EXPECT_TRUE(all_close(got.out, want.out, out_tolerance(q, k, v, o)));
            EXPECT_TRUE(all_close(got.lse, want.lse, lse_tolerance(q, k, o)));
        }
    }
}

// Inf in a key row: whatever the rows that see it get, the others equal the clean run bitwise.
TEST(softmax_attention, inf_in_a_key_row_leaves_other_rows_alone) {
    const index_t B = 1, L = 100, H = 2, D = 16;
    const tensor4<float> q = random_bshd(B, L, H, D, distribution::gaussian, 121);
    tensor4<float> k = random_bshd(B, L, 1, D, distribution::gaussian, 122);
    const tensor4<float> v = random_bshd(B, L, 1, D, distribution::gaussian, 123);
    softmax_options o;
    o.causal = true;
    const fast_result clean = run_fast(q, k, v, o);
    k(0, 50, 0, 3) = std::numeric_limits<float>::infinity();
    const fast_result dirty = run_fast(q, k, v, o);
    for (index_t i = 0; i < 50; ++i)
        for (index_t h = 0; h < H; ++h) {
            for (index_t c = 0; c < D; ++c)
                ASSERT_EQ(clean.out(0, i, h, c), dirty.out(0, i, h, c)) << i;
            ASSERT_EQ(clean.lse(0, i, h), dirty.lse(0, i, h)) << i;
        }
}

// A NaN value row of a key the row does see propagates even when that key's weight rounds to 0
// in float (its score far below the row's max): the reference computes 0 * NaN = NaN as well.
// Lq = 1 takes the row kernel, Lq = 40 the tile kernel (both partially masked and full panels).
TEST(softmax_attention, nan_value_of_a_visible_key_propagates_at_zero_weight) {
    for (index_t Lq : {1, 40}) {
        SCOPED_TRACE(::testing::Message() << "Lq " << Lq);
        const index_t Lk = 50, D = 4;
        tensor4<float> q = make_bshd<float>(1, Lq, 1, D, 0.0f);
        tensor4<float> k = make_bshd<float>(1, Lk, 1, D, 0.0f);
        tensor4<float> v = random_bshd(1, Lk, 1, D, distribution::uniform, 501);
        for (index_t i = 0; i < Lq; ++i) q(0, i, 0, 0) = 20.0f;
        k(0, 0, 0, 0) = -20.0f;  // key 0 scores -200 below the others: exp underflows in float
        v(0, 0, 0, 1) = kNaN;
        softmax_options o;
        o.causal = true;
        const fast_result f = run_fast(q, k, v, o);
        const ref_result r = run_reference(q, k, v, o);
        for (index_t i = 0; i < Lq; ++i) {
            EXPECT_TRUE(std::isnan(r.out(0, i, 0, 1))) << "reference, row " << i;
            EXPECT_TRUE(std::isnan(f.out(0, i, 0, 1))) << "row " << i << " sees key 0";
            EXPECT_FALSE(std::isnan(f.out(0, i, 0, 0))) << "row " << i << ", other columns stay finite";
        }
    }
}

// Windows and chunks longer than every position behave as "unlimited", whatever their value.
TEST(softmax_attention, huge_window_and_chunk_mean_unlimited) {
    const auto q = random_bshd(1, 9, 2, 8, distribution::gaussian, 511);
    const auto k = random_bshd(1, 5, 2, 8, distribution::gaussian, 512);
    const auto v = random_bshd(1, 5, 2, 8, distribution::gaussian, 513);
    softmax_options plain;
    const fast_result expected = run_fast(q, k, v, plain);
    softmax_options wide;
    wide.window_left = std::numeric_limits<std::int64_t>::max();
    const fast_result got = run_fast(q, k, v, wide);
    EXPECT_TRUE(all_close(got.out, expected.out, 0.0, 0.0));
    const ref_result ref = run_reference(q, k, v, wide);
    EXPECT_TRUE(all_close(got.out, ref.out, 1e-5, 1e-5));

    softmax_options causal;
    causal.causal = true;
    softmax_options chunked = causal;
    chunked.chunk = std::numeric_limits<std::int64_t>::max();
    EXPECT_TRUE(all_close(run_fast(q, k, v, chunked).out, run_fast(q, k, v, causal).out, 0.0, 0.0));
}

// Option values that pass a naive range check but would overflow inside the kernel.
TEST(softmax_attention, rejects_subnormal_softcap_and_huge_scale) {
    const auto q = random_bshd(1, 3, 1, 4, distribution::gaussian, 521);
    const auto k = random_bshd(1, 3, 1, 4, distribution::gaussian, 522);
    auto out = make_bshd<float>(1, 3, 1, 4, 7.0f);
    softmax_options o;
    o.softcap = 1e-40f;
    EXPECT_THROW(attnkit::softmax_attention(q, k, k, out, o), std::invalid_argument);
    o = {};
    o.scale = 3e38f;
    EXPECT_THROW(attnkit::softmax_attention(q, k, k, out, o), std::invalid_argument);
    EXPECT_TRUE(all_equal_to(out, 7.0f));
}

}  // namespace
