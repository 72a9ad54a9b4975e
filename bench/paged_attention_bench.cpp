// attnkit benchmarks: the serving entry points, paged_attention (paged_attention.hpp),
// softmax_attention_varlen (varlen_attention.hpp) and kv_cache::append with RoPE (kv_cache.hpp).
//
// Families (names "<family>/<dtype>/.../H:../Hk:../D:128/threads:N"; H:32/Hk:8 is GQA, H:8/Hk:8
// MHA; threads 1 and 2):
//   paged_decode       one decode token for each of a ragged batch of 16 sequences, lengths
//                      1024 m - 13 b for b = 0..15 and m = 1, 15, 29, ..., 31 (an odd multiplier
//                      per sequence, 1K .. 32K keys, 260K in all, last pages partly filled):
//                      attnkit::paged_attention over pages of 64 rows taken in a scrambled order
//                      (one unused page per sequence among them, NaN-filled: a kernel that read one
//                      would fail the check), block table rows padded with -1
//   contiguous_decode  the same batch with each sequence's K/V rows contiguous, packed one
//                      sequence after another, through attnkit::softmax_attention_varlen
//                      (cu_seqlens_k = the packed offsets, cu_seqlens_q = 0..16). The two families
//                      have identical names after the family, so the report pairs them; they run
//                      one after the other on the same inputs
//   paged_over_contiguous  both, in one benchmark of 15 iterations: each a paged and a
//                      contiguous call in alternating order, timed one by one; counters paged_ms,
//                      contiguous_ms (medians), ratio (the median of the 15 per-pair ratios: the
//                      serving issue's "within 10%" on a host whose speed drifts between
//                      benchmarks) and each layout's bw_frac
//   varlen_prefill     a packed batch of 8 causal prompts, lengths 256, 512, 1024, 2048, 4096,
//                      384, 768, 1536 (10624 rows), f32, one softmax_attention_varlen call
//   per_sequence_prefill  the same prompts as 8 softmax_attention calls (B = 1 each, on views of
//                      the packed rows) in one timed iteration
//   kv_append_rope     kv_cache<T>::append of one decode step's k_new, v_new [16, 8, 128] (float)
//                      with RoPE (Llama 3.1: theta 500000, interleaved pairs, llama3 scaling) into
//                      a cache of page_rows 64 holding the 16 sequences above (filled in rounds of
//                      1024 tokens, so their pages interleave); the step is begun once, outside
//                      the timed loop, and appended again each iteration (it writes the same rows)
//   kv_append_rope_cached  the same with a model::rope_cache: the case of every append after the
//                      first of a step in a decoder whose layers share one cache
// dtype (the K/V storage) f32, bf16 or f16, and for the decode families i8 (int8_kv: values and a
// float scale per row, packed [Tk, Hk] and paged [P, 64, Hk]; unowned rows' scales 1e30); q, out,
// k_new, v_new are float.
// Counters: decode GB/s = K + V bytes of every sequence read per second (as stored, int8 with its
// scales), bw_frac =
// that over the 8-stream DRAM read bandwidth measured in the same run with as many threads
// (common/bench_main.hpp); the K/V (260K keys x 8 heads x 128 x 2: 2 GiB in float) is far larger
// than the last-level cache, so every call streams it from DRAM. Prefill FLOP/s, peak_frac,
// cpu_peak_frac (set_flop_counters) of the causal FLOPs 4 D H sum_b L_b (L_b + 1) / 2. Append GB/s
// = k_new and v_new read plus the K and V rows written (as stored), bw_frac as above; those
// 192-256 KiB stay in cache between iterations, so the rate measures the call's fixed costs (RoPE
// angles and table, checks, page lookups) against a memory-speed pass.
// Checks after each timed loop (SkipWithError on a mismatch): decode, one call's first two
// sequences against reference::paged_attention / reference::softmax_attention_varlen (double;
// int8, the varlen oracle on the packed values and scales for both layouts),
// and paged_decode's whole output bitwise against one softmax_attention_varlen call on the
// packed copy (paged_attention.hpp promises that); prefill, the first two prompts' query heads of
// KV head 0 against reference::softmax_attention_varlen; append, every written K row against the
// double RoPE oracle rounded once to the storage type and every V row exactly.
// ATTNKIT_BENCH_QUICK=1: 4 sequences (prompts) and lengths / 8.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced

#include "attnkit/kv_cache.hpp"
#include "attnkit/model/rope.hpp"
#include "attnkit/paged_attention.hpp"
#include "attnkit/reference/model/rope.hpp"
#include "attnkit/reference/varlen_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/varlen_attention.hpp"
#include "common/bench_main.hpp"
#include "common/machine.hpp"

namespace attnkit_bench {
namespace {

using attnkit::index_t;
template <class T>
using tensor3 = Eigen::Tensor<T, 3, Eigen::RowMajor>;
template <class T>
using tensor4 = Eigen::Tensor<T, 4, Eigen::RowMajor>;

constexpr index_t kD = 128, kHk = 8, kPageRows = 64;
// Pairs per paged_over_contiguous benchmark: enough for a median that one slow call cannot move
// (a pair takes 50-450 ms here, so a row takes a few seconds).
constexpr int kPairedIterations = 15;

struct head_config {
    index_t H, Hk;
};
constexpr head_config kHeadConfigs[] = {{32, 8}, {8, 8}};

template <class T>
const char* dtype_name() {
    return std::is_same<T, float>::value             ? "f32"
           : std::is_same<T, Eigen::bfloat16>::value ? "bf16"
           : std::is_same<T, std::int8_t>::value     ? "i8"
                                                     : "f16";
}
template <class T>
constexpr bool kInt8 = std::is_same<T, std::int8_t>::value;
template <class T>
using tensor2 = Eigen::Tensor<T, 2, Eigen::RowMajor>;

// ---------------------------------------------------------------------------------------------
// Shapes.
std::vector<std::int64_t> decode_lengths() {
    const bool quick = bench_quick();
    const std::int64_t n = quick ? 4 : 16;
    std::vector<std::int64_t> l;
    for (std::int64_t b = 0; b < n; ++b) {
        const std::int64_t m = 2 * ((7 * b) % 16) + 1;  // 1, 15, 29, 11, ...: each odd 1..31 once
        const std::int64_t len = 1024 * m - 13 * b;
        l.push_back(quick ? len / 8 : len);
    }
    return l;
}

std::vector<std::int64_t> prefill_lengths() {
    std::vector<std::int64_t> l{256, 512, 1024, 2048, 4096, 384, 768, 1536};
    if (bench_quick()) {
        l.resize(4);
        for (auto& x : l) x /= 8;
    }
    return l;
}

std::vector<std::int64_t> offsets(const std::vector<std::int64_t>& lengths) {
    std::vector<std::int64_t> cu(1, 0);
    for (const std::int64_t n : lengths) cu.push_back(cu.back() + n);
    return cu;
}

std::int64_t total(const std::vector<std::int64_t>& lengths) {
    return std::accumulate(lengths.begin(), lengths.end(), std::int64_t(0));
}

// ---------------------------------------------------------------------------------------------
// Inputs: uniform in [-1, 1) from a splitmix64 stream (identical on every standard library).
class uniform_rng {
   public:
    explicit uniform_rng(std::uint64_t seed) : s_(seed) {}
    std::uint64_t bits() {
        std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    float next() { return static_cast<float>(static_cast<double>(bits() >> 11) * 0x1.0p-52 - 1.0); }

   private:
    std::uint64_t s_;
};

template <class T>
void fill_uniform(T* p, index_t n, std::uint64_t seed) {
    uniform_rng g(seed);
    for (index_t i = 0; i < n; ++i) p[i] = T(g.next());
}
// int8 values: the whole range [-127, 127] (with row scales of about 1/127, entries in [-1, 1]
// as the float inputs).
template <>
void fill_uniform<std::int8_t>(std::int8_t* p, index_t n, std::uint64_t seed) {
    uniform_rng g(seed);
    for (index_t i = 0; i < n; ++i) p[i] = static_cast<std::int8_t>(std::lround(127.0f * g.next()));
}
// Row scales of int8 K/V: (1 + u / 2) / 127, u uniform in [-1, 1).
void fill_scales(float* p, index_t n, std::uint64_t seed) {
    uniform_rng g(seed);
    for (index_t i = 0; i < n; ++i) p[i] = (1.0f + 0.5f * g.next()) / 127.0f;
}

// The benchmarks' large inputs live in one slot: building another releases the previous one
// (decode K/V are 1-2 GiB per layout) and the DRAM probes' stream buffer.
struct fixture {
    virtual ~fixture() = default;
};
std::unique_ptr<fixture>& fixture_slot() {
    static std::unique_ptr<fixture> f;
    return f;
}
std::string& fixture_key() {
    static std::string k;
    return k;
}
template <class F, class Build>
F& fixture_for(const std::string& key, Build build) {
    if (!fixture_slot() || fixture_key() != key) {
        fixture_slot().reset();
        fixture_key().clear();
        release_stream_buffer();
        fixture_slot() = build();
        fixture_key() = key;
    }
    return static_cast<F&>(*fixture_slot());
}

// The decode batch in both layouts: packed [Tk, Hk, D] and pages [P, 64, Hk, D] in a scrambled
// order, with the same values; int8 K/V also their row scales, packed [Tk, Hk] and paged
// [P, 64, Hk] (empty for the other types).
template <class T>
struct decode_batch : fixture {
    std::vector<std::int64_t> lengths, cu_k, cu_q;
    tensor3<T> k, v;
    tensor4<T> k_pages, v_pages;
    tensor2<float> k_scales, v_scales;
    tensor3<float> k_scale_pages, v_scale_pages;
    attnkit::paged_kv kv;
};

template <class T>
std::unique_ptr<fixture> make_decode_batch() {
    auto d = std::make_unique<decode_batch<T>>();
    d->lengths = decode_lengths();
    const std::size_t B = d->lengths.size();
    d->cu_k = offsets(d->lengths);
    d->cu_q.resize(B + 1);
    std::iota(d->cu_q.begin(), d->cu_q.end(), std::int64_t(0));
    const index_t Tk = d->cu_k.back();
    d->k = tensor3<T>(Tk, kHk, kD);
    d->v = tensor3<T>(Tk, kHk, kD);
    fill_uniform(d->k.data(), d->k.size(), 11);
    fill_uniform(d->v.data(), d->v.size(), 12);
    if (kInt8<T>) {
        d->k_scales = tensor2<float>(Tk, kHk);
        d->v_scales = tensor2<float>(Tk, kHk);
        fill_scales(d->k_scales.data(), d->k_scales.size(), 14);
        fill_scales(d->v_scales.data(), d->v_scales.size(), 15);
    }

    index_t used = 0, most = 0;
    for (const std::int64_t n : d->lengths) {
        used += (n + kPageRows - 1) / kPageRows;
        most = std::max<index_t>(most, (n + kPageRows - 1) / kPageRows);
    }
    const index_t P = used + static_cast<index_t>(B);  // one unused page per sequence
    std::vector<std::int32_t> order(static_cast<std::size_t>(P));
    std::iota(order.begin(), order.end(), 0);
    uniform_rng g(13);
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[g.bits() % i]);  // Fisher-Yates

    d->kv.cu_seqlens_q = d->cu_q;
    d->kv.seq_lengths = d->lengths;
    d->kv.pages_per_seq = most + 1;  // a spare entry per row, never read
    d->kv.block_table.assign(B * static_cast<std::size_t>(d->kv.pages_per_seq), -1);
    d->k_pages = tensor4<T>(P, kPageRows, kHk, kD);
    d->v_pages = tensor4<T>(P, kPageRows, kHk, kD);
    const index_t row = kHk * kD, page = kPageRows * row;
    // Rows no sequence owns are NaN, so a kernel that read one would fail the check. int8 values
    // have no NaN and the scales must be finite (checked): their scales are 1e30 instead, which
    // overflows any score or output that reads them.
    const T nan = kInt8<T> ? T(127) : T(std::numeric_limits<float>::quiet_NaN());
    const float nan_scale = 1e30f;
    const index_t srow = kHk, spage = kPageRows * srow;
    if (kInt8<T>) {
        d->k_scale_pages = tensor3<float>(P, kPageRows, kHk);
        d->v_scale_pages = tensor3<float>(P, kPageRows, kHk);
    }
    auto scales_into = [&](index_t at, index_t src_row, index_t rows) {
        if (!kInt8<T>) return;
        std::copy_n(d->k_scales.data() + src_row * srow, rows * srow, d->k_scale_pages.data() + at * spage);
        std::copy_n(d->v_scales.data() + src_row * srow, rows * srow, d->v_scale_pages.data() + at * spage);
        std::fill_n(d->k_scale_pages.data() + at * spage + rows * srow, (kPageRows - rows) * srow, nan_scale);
        std::fill_n(d->v_scale_pages.data() + at * spage + rows * srow, (kPageRows - rows) * srow, nan_scale);
    };
    std::size_t next = 0;
    for (std::size_t b = 0; b < B; ++b)
        for (index_t pg = 0; pg * kPageRows < d->lengths[b]; ++pg) {
            const std::int32_t at = order[next++];
            d->kv.block_table[b * static_cast<std::size_t>(d->kv.pages_per_seq) + static_cast<std::size_t>(pg)] = at;
            const index_t rows = std::min<index_t>(kPageRows, d->lengths[b] - pg * kPageRows);
            const index_t src = (d->cu_k[b] + pg * kPageRows) * row;
            std::copy_n(d->k.data() + src, rows * row, d->k_pages.data() + at * page);
            std::copy_n(d->v.data() + src, rows * row, d->v_pages.data() + at * page);
            std::fill_n(d->k_pages.data() + at * page + rows * row, (kPageRows - rows) * row, nan);
            std::fill_n(d->v_pages.data() + at * page + rows * row, (kPageRows - rows) * row, nan);
            scales_into(at, d->cu_k[b] + pg * kPageRows, rows);
        }
    for (; next < order.size(); ++next) {
        std::fill_n(d->k_pages.data() + order[next] * page, page, nan);
        std::fill_n(d->v_pages.data() + order[next] * page, page, nan);
        scales_into(order[next], 0, 0);
    }
    return d;
}

// ---------------------------------------------------------------------------------------------
// Checks. Empty string: fine.
std::string compare(const attnkit::view<const float, 3>& got, const tensor3<double>& ref, double tolerance,
                    const char* what) {
    for (index_t i = 0; i < got.dims[0]; ++i)
        for (index_t h = 0; h < got.dims[1]; ++h)
            for (index_t c = 0; c < got.dims[2]; ++c) {
                const double r = ref(i, h, c), x = got(i, h, c);
                if (!(std::fabs(x - r) <= tolerance * (1.0 + std::fabs(r))))
                    return std::string(what) + ": row " + std::to_string(i) + ", head " + std::to_string(h) +
                           ", d " + std::to_string(c) + ": got " + std::to_string(x) + ", the double oracle " +
                           std::to_string(r);
            }
    return {};
}

// First two sequences of the decode batch against the oracle (every head).
template <class T>
std::string check_decode(const decode_batch<T>& d, const tensor3<float>& q, const tensor3<float>& out, bool paged,
                         const attnkit::softmax_options& opts) {
    const index_t n = std::min<index_t>(2, static_cast<index_t>(d.lengths.size())), H = q.dimension(1);
    const attnkit::view<const float, 3> q2(q.data(), {n, H, kD});
    tensor3<double> ref(n, H, kD);
    attnkit::softmax_options o = opts;
    o.pool = nullptr;
    std::vector<std::int64_t> cu_q(d.cu_q.begin(), d.cu_q.begin() + n + 1);
    if constexpr (kInt8<T>) {
        // One oracle for both layouts: the pages hold the packed rows' values and scales.
        std::vector<std::int64_t> cu_k(d.cu_k.begin(), d.cu_k.begin() + n + 1);
        const attnkit::view<const T, 3> k2(d.k.data(), {cu_k.back(), kHk, kD}), v2(d.v.data(), {cu_k.back(), kHk, kD});
        const attnkit::view<const float, 2> ks2(d.k_scales.data(), {cu_k.back(), kHk}),
            vs2(d.v_scales.data(), {cu_k.back(), kHk});
        attnkit::reference::softmax_attention_varlen(q2, attnkit::int8_kv(k2, ks2), attnkit::int8_kv(v2, vs2), cu_q,
                                                     cu_k, ref, o);
    } else if (paged) {
        attnkit::paged_kv sub;
        sub.cu_seqlens_q = cu_q;
        sub.seq_lengths.assign(d.lengths.begin(), d.lengths.begin() + n);
        sub.pages_per_seq = d.kv.pages_per_seq;
        sub.block_table.assign(d.kv.block_table.begin(),
                               d.kv.block_table.begin() + n * static_cast<std::ptrdiff_t>(d.kv.pages_per_seq));
        attnkit::reference::paged_attention(q2, d.k_pages, d.v_pages, sub, ref, o);
    } else {
        std::vector<std::int64_t> cu_k(d.cu_k.begin(), d.cu_k.begin() + n + 1);
        const attnkit::view<const T, 3> k2(d.k.data(), {cu_k.back(), kHk, kD}), v2(d.v.data(), {cu_k.back(), kHk, kD});
        attnkit::reference::softmax_attention_varlen(q2, k2, v2, cu_q, cu_k, ref, o);
    }
    return compare(attnkit::view<const float, 3>(out.data(), {n, H, kD}), ref, 1e-4,
                   paged ? "paged_attention vs reference::paged_attention"
                         : "softmax_attention_varlen vs reference::softmax_attention_varlen");
}

// ---------------------------------------------------------------------------------------------
// Decode.

// One decode call of the batch through either layout, on the same queries and options.
template <class T>
struct decode_calls {
    const decode_batch<T>& d;
    tensor3<float> q;
    attnkit::softmax_options opts;

    decode_calls(const decode_batch<T>& batch, head_config hc, int threads)
        : d(batch), q(static_cast<index_t>(batch.lengths.size()), hc.H, kD) {
        fill_uniform(q.data(), q.size(), 21 + static_cast<std::uint64_t>(hc.H));
        opts.causal = true;  // bottom-right: the step's one query sees its whole sequence either way
        opts.pool = shared_pool(threads);
    }
    tensor3<float> make_out() const {
        tensor3<float> o(q.dimension(0), q.dimension(1), kD);
        o.setConstant(std::numeric_limits<float>::quiet_NaN());
        return o;
    }
    void packed(tensor3<float>& o) const {
        if constexpr (kInt8<T>)
            attnkit::softmax_attention_varlen(q, attnkit::int8_kv(d.k, d.k_scales), attnkit::int8_kv(d.v, d.v_scales),
                                              d.cu_q, d.cu_k, o, opts);
        else
            attnkit::softmax_attention_varlen(q, d.k, d.v, d.cu_q, d.cu_k, o, opts);
    }
    void paged(tensor3<float>& o) const {
        if constexpr (kInt8<T>)
            attnkit::paged_attention(q, attnkit::int8_kv(d.k_pages, d.k_scale_pages),
                                     attnkit::int8_kv(d.v_pages, d.v_scale_pages), d.kv, o, opts);
        else
            attnkit::paged_attention(q, d.k_pages, d.v_pages, d.kv, o, opts);
    }
    // Empty when out (of the paged call when is_paged) passes the oracle check and, for the paged
    // call, equals the packed call bitwise.
    std::string check(const tensor3<float>& out, bool is_paged) const {
        std::string why = check_decode(d, q, out, is_paged, opts);
        if (why.empty() && is_paged) {
            tensor3<float> ref = make_out();
            packed(ref);
            if (std::memcmp(ref.data(), out.data(), sizeof(float) * static_cast<std::size_t>(out.size())) != 0)
                why = "paged_attention is not bitwise softmax_attention_varlen on the packed keys";
        }
        return why;
    }
    // K + V bytes of one call, as stored: int8 rows also read their float scale.
    double bytes() const {
        const double row_bytes = static_cast<double>(kD * sizeof(T) + (kInt8<T> ? sizeof(float) : 0));
        return 2.0 * static_cast<double>(total(d.lengths) * kHk) * row_bytes;
    }
};

template <class T>
void BM_decode(benchmark::State& state, bool paged, head_config hc, int threads) {
    auto& d = fixture_for<decode_batch<T>>(std::string("decode/") + dtype_name<T>(), make_decode_batch<T>);
    try {
        const decode_calls<T> calls(d, hc, threads);
        tensor3<float> out = calls.make_out();
        const auto t0 = clock_type::now();
        for (auto _ : state) {
            if (paged)
                calls.paged(out);
            else
                calls.packed(out);
            benchmark::ClobberMemory();
        }
        const double seconds = seconds_since(t0);
        const std::string why = calls.check(out, paged);
        if (!why.empty()) return state.SkipWithError(why.c_str());
        const double iters = static_cast<double>(state.iterations());
        state.counters["GB/s"] = benchmark::Counter(calls.bytes() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
        state.counters["bw_frac"] = calls.bytes() * iters / seconds / dram_read_bandwidth(threads);
    } catch (const std::exception& e) {
        state.SkipWithError((std::string("exception: ") + e.what()).c_str());
    }
}

// The two layouts in one benchmark: each iteration is a paged call and a contiguous call, in
// alternating order, each timed on its own. On a shared host whose speed drifts by tens of
// percent between one benchmark and the next, the pairs see the same host, so the median of
// their ratios measures the layout and not the moment (the two families above are kept for their
// absolute rates). Counters: paged_ms and contiguous_ms (medians over the pairs), ratio (the
// median of paged / contiguous per pair), paged and contiguous bw_frac (from those medians).
template <class T>
void BM_decode_paired(benchmark::State& state, head_config hc, int threads) {
    auto& d = fixture_for<decode_batch<T>>(std::string("decode/") + dtype_name<T>(), make_decode_batch<T>);
    try {
        const decode_calls<T> calls(d, hc, threads);
        tensor3<float> out_paged = calls.make_out(), out_packed = calls.make_out();
        std::vector<double> t_paged, t_packed, ratio;
        bool paged_first = true;
        for (auto _ : state) {
            double t[2];
            for (int i = 0; i < 2; ++i) {
                const bool paged = (i == 0) == paged_first;
                const auto t0 = clock_type::now();
                if (paged)
                    calls.paged(out_paged);
                else
                    calls.packed(out_packed);
                benchmark::ClobberMemory();
                t[paged ? 0 : 1] = seconds_since(t0);
            }
            paged_first = !paged_first;
            t_paged.push_back(t[0]);
            t_packed.push_back(t[1]);
            ratio.push_back(t[0] / t[1]);
        }
        std::string why = calls.check(out_paged, true);
        if (why.empty()) why = calls.check(out_packed, false);
        if (!why.empty()) return state.SkipWithError(why.c_str());
        const double mp = median_of(t_paged), mc = median_of(t_packed), bw = dram_read_bandwidth(threads);
        state.counters["paged_ms"] = 1e3 * mp;
        state.counters["contiguous_ms"] = 1e3 * mc;
        state.counters["ratio"] = median_of(ratio);
        state.counters["paged_bw_frac"] = calls.bytes() / mp / bw;
        state.counters["contiguous_bw_frac"] = calls.bytes() / mc / bw;
    } catch (const std::exception& e) {
        state.SkipWithError((std::string("exception: ") + e.what()).c_str());
    }
}

// ---------------------------------------------------------------------------------------------
// Prefill (float).
struct prefill_batch : fixture {
    std::vector<std::int64_t> lengths, cu;
    tensor3<float> q, k, v;
};

std::unique_ptr<fixture> make_prefill_batch(head_config hc) {
    auto p = std::make_unique<prefill_batch>();
    p->lengths = prefill_lengths();
    p->cu = offsets(p->lengths);
    const index_t T = p->cu.back();
    p->q = tensor3<float>(T, hc.H, kD);
    p->k = tensor3<float>(T, hc.Hk, kD);
    p->v = tensor3<float>(T, hc.Hk, kD);
    fill_uniform(p->q.data(), p->q.size(), 31);
    fill_uniform(p->k.data(), p->k.size(), 32);
    fill_uniform(p->v.data(), p->v.size(), 33);
    return p;
}

// The first two prompts, the query heads of KV head 0 (strided views), against the oracle.
std::string check_prefill(const prefill_batch& p, const tensor3<float>& out, head_config hc,
                          const attnkit::softmax_options& opts) {
    const std::size_t n = std::min<std::size_t>(2, p.lengths.size());
    const index_t rows = p.cu[n], g = hc.H / hc.Hk;
    const attnkit::view<const float, 3> q(p.q.data(), {rows, g, kD}, {hc.H * kD, kD, 1});
    const attnkit::view<const float, 3> k(p.k.data(), {rows, 1, kD}, {hc.Hk * kD, kD, 1});
    const attnkit::view<const float, 3> v(p.v.data(), {rows, 1, kD}, {hc.Hk * kD, kD, 1});
    const std::vector<std::int64_t> cu(p.cu.begin(), p.cu.begin() + static_cast<std::ptrdiff_t>(n) + 1);
    tensor3<double> ref(rows, g, kD);
    attnkit::softmax_options o = opts;
    o.pool = nullptr;
    attnkit::reference::softmax_attention_varlen(q, k, v, cu, cu, ref, o);
    return compare(attnkit::view<const float, 3>(out.data(), {rows, g, kD}, {hc.H * kD, kD, 1}), ref, 1e-4,
                   "prefill vs reference::softmax_attention_varlen");
}

void BM_prefill(benchmark::State& state, bool varlen, head_config hc, int threads) {
    auto& p = fixture_for<prefill_batch>("prefill/H:" + std::to_string(hc.H), [hc] { return make_prefill_batch(hc); });
    const index_t T = p.cu.back();
    tensor3<float> out(T, hc.H, kD);
    out.setConstant(std::numeric_limits<float>::quiet_NaN());
    attnkit::softmax_options opts;
    opts.causal = true;
    opts.pool = shared_pool(threads);
    // Each prompt as [1, L_b, H, D] views of the packed rows.
    std::vector<attnkit::view<const float, 4>> qs, ks, vs;
    std::vector<attnkit::view<float, 4>> outs;
    for (std::size_t b = 0; b < p.lengths.size(); ++b) {
        const index_t r = p.cu[b], L = p.lengths[b];
        qs.emplace_back(p.q.data() + r * hc.H * kD, std::array<index_t, 4>{1, L, hc.H, kD});
        ks.emplace_back(p.k.data() + r * hc.Hk * kD, std::array<index_t, 4>{1, L, hc.Hk, kD});
        vs.emplace_back(p.v.data() + r * hc.Hk * kD, std::array<index_t, 4>{1, L, hc.Hk, kD});
        outs.emplace_back(out.data() + r * hc.H * kD, std::array<index_t, 4>{1, L, hc.H, kD});
    }
    try {
        const double cpu0 = process_cpu_seconds();
        const auto t0 = clock_type::now();
        for (auto _ : state) {
            if (varlen) {
                attnkit::softmax_attention_varlen(p.q, p.k, p.v, p.cu, p.cu, out, opts);
            } else {
                for (std::size_t b = 0; b < qs.size(); ++b) attnkit::softmax_attention(qs[b], ks[b], vs[b], outs[b], opts);
            }
            benchmark::ClobberMemory();
        }
        const double seconds = seconds_since(t0), cpu_seconds = process_cpu_seconds() - cpu0;
        const std::string why = check_prefill(p, out, hc, opts);
        if (!why.empty()) return state.SkipWithError(why.c_str());
        double pairs = 0;
        for (const std::int64_t L : p.lengths) pairs += 0.5 * static_cast<double>(L) * static_cast<double>(L + 1);
        set_flop_counters(state, 4.0 * kD * static_cast<double>(hc.H) * pairs, seconds, cpu_seconds, threads);
    } catch (const std::exception& e) {
        state.SkipWithError((std::string("exception: ") + e.what()).c_str());
    }
}

// ---------------------------------------------------------------------------------------------
// Append with RoPE.
attnkit::model::rope_options llama31_rope(int threads) {
    attnkit::model::rope_options o;
    o.pool = shared_pool(threads);
    o.theta = 500000.0f;
    o.style = attnkit::model::rope_style::interleaved;
    o.scaling.type = attnkit::model::rope_scaling_type::llama3;
    o.scaling.factor = 8.0;
    o.scaling.low_freq_factor = 1.0;
    o.scaling.high_freq_factor = 4.0;
    o.scaling.original_max_position_embeddings = 8192;
    return o;
}

template <class T>
struct append_state : fixture {
    std::unique_ptr<attnkit::kv_cache<T>> cache;
    std::vector<index_t> ids;
    attnkit::kv_step step;
    tensor3<float> k_new, v_new;
};

// The 16 sequences filled to their decode lengths minus one in rounds of 1024 tokens (pages of
// different sequences interleave, as under continuous batching), then the decode step begun.
template <class T>
std::unique_ptr<fixture> make_append_state() {
    auto a = std::make_unique<append_state<T>>();
    const std::vector<std::int64_t> lengths = decode_lengths();
    attnkit::kv_cache_config cfg;
    cfg.layers = 1;
    cfg.heads_kv = kHk;
    cfg.dim = kD;
    cfg.page_rows = kPageRows;
    for (const std::int64_t n : lengths) cfg.pages += (n + kPageRows - 1) / kPageRows;
    a->cache = std::make_unique<attnkit::kv_cache<T>>(cfg);
    for (std::size_t b = 0; b < lengths.size(); ++b) a->ids.push_back(a->cache->add_sequence());
    for (std::int64_t done = 0;; done += 1024) {
        std::vector<index_t> chunk;
        bool any = false;
        for (const std::int64_t n : lengths) {
            chunk.push_back(std::max<std::int64_t>(0, std::min<std::int64_t>(1024, n - 1 - done)));
            any = any || chunk.back() > 0;
        }
        if (!any) break;
        a->cache->begin_step(a->ids, chunk);
    }
    a->step = a->cache->begin_step(a->ids, std::vector<index_t>(lengths.size(), 1));
    const index_t B = static_cast<index_t>(lengths.size());
    a->k_new = tensor3<float>(B, kHk, kD);
    a->v_new = tensor3<float>(B, kHk, kD);
    fill_uniform(a->k_new.data(), a->k_new.size(), 41);
    fill_uniform(a->v_new.data(), a->v_new.size(), 42);
    return a;
}

// Every appended row read back from the pages: K against the double oracle rotated in double
// (storage types: within half an ulp of the stored type, relative), V exactly T(v_new).
template <class T>
std::string check_append(const append_state<T>& a, const attnkit::model::rope_options& o) {
    const index_t B = a.k_new.dimension(0);
    tensor4<double> ref(1, B, kHk, kD);
    attnkit::model::rope_options ro = o;
    ro.pool = nullptr;
    ro.cache = nullptr;
    attnkit::reference::model::rope(attnkit::view<const float, 4>(a.k_new.data(), {1, B, kHk, kD}), ref,
                                    a.step.positions_tensor(), ro);
    const double rel = std::is_same<T, float>::value ? 0.0 : std::is_same<T, Eigen::bfloat16>::value ? 0x1p-8 : 0x1p-11;
    const auto kp = a.cache->k_pages(0), vp = a.cache->v_pages(0);
    for (index_t t = 0; t < B; ++t) {
        const index_t pos = a.step.positions[static_cast<std::size_t>(t)];
        const std::int32_t page = a.cache->pages_of(a.step.seqs[static_cast<std::size_t>(t)])[static_cast<std::size_t>(pos / kPageRows)];
        for (index_t h = 0; h < kHk; ++h)
            for (index_t c = 0; c < kD; ++c) {
                const double got = static_cast<double>(static_cast<float>(kp(page, pos % kPageRows, h, c)));
                const double r = ref(0, t, h, c);
                if (!(std::fabs(got - r) <= 2e-6 + rel * std::fabs(r)))
                    return "K row of token " + std::to_string(t) + ", head " + std::to_string(h) + ", d " +
                           std::to_string(c) + ": stored " + std::to_string(got) + ", double RoPE " + std::to_string(r);
                const float vs = static_cast<float>(vp(page, pos % kPageRows, h, c));
                const float ve = static_cast<float>(T(a.v_new(t, h, c)));
                if (std::memcmp(&vs, &ve, sizeof vs) != 0)
                    return "V row of token " + std::to_string(t) + ", head " + std::to_string(h) + " differs from v_new";
            }
    }
    return {};
}

template <class T>
void BM_append(benchmark::State& state, bool cached, int threads) {
    auto& a = fixture_for<append_state<T>>(std::string("append/") + dtype_name<T>(), make_append_state<T>);
    attnkit::model::rope_options o = llama31_rope(threads);
    attnkit::model::rope_cache cache;
    if (cached) o.cache = &cache;
    try {
        const auto t0 = clock_type::now();
        for (auto _ : state) {
            a.cache->append(0, a.step, a.k_new, a.v_new, o);
            benchmark::ClobberMemory();
        }
        const double seconds = seconds_since(t0);
        const std::string why = check_append(a, o);
        if (!why.empty()) return state.SkipWithError(why.c_str());
        if (cached && cache.misses() != 1) return state.SkipWithError("the rope cache missed more than once");
        const double elems = static_cast<double>(a.k_new.size() + a.v_new.size());
        const double bytes = elems * (sizeof(float) + sizeof(T));
        const double iters = static_cast<double>(state.iterations());
        state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
        state.counters["bw_frac"] = bytes * iters / seconds / dram_read_bandwidth(threads);
    } catch (const std::exception& e) {
        state.SkipWithError((std::string("exception: ") + e.what()).c_str());
    }
}

// ---------------------------------------------------------------------------------------------
// Registration: decode per dtype (both layouts of one dtype alive at a time), paged and
// contiguous back to back per shape and thread count; then prefill; then append.
std::string heads_name(head_config hc) {
    return "H:" + std::to_string(hc.H) + "/Hk:" + std::to_string(hc.Hk) + "/D:" + std::to_string(kD);
}

template <class T>
void register_decode() {
    const std::vector<std::int64_t> lengths = decode_lengths();
    const std::string shape = std::string(dtype_name<T>()) + "/decode/B:" + std::to_string(lengths.size()) +
                              "/keys:" + std::to_string(total(lengths)) + "/";
    for (head_config hc : kHeadConfigs)
        for (int t : kThreadCounts)
            for (bool paged : {true, false}) {
                const std::string name = std::string(paged ? "paged_decode/" : "contiguous_decode/") + shape +
                                         heads_name(hc) + "/threads:" + std::to_string(t);
                benchmark::RegisterBenchmark(name.c_str(), BM_decode<T>, paged, hc, t)
                    ->UseRealTime()
                    ->Unit(benchmark::kMillisecond);
            }
    for (head_config hc : kHeadConfigs)
        for (int t : kThreadCounts) {
            const std::string name = "paged_over_contiguous/" + shape + heads_name(hc) + "/threads:" + std::to_string(t);
            benchmark::RegisterBenchmark(name.c_str(), BM_decode_paired<T>, hc, t)
                ->Iterations(kPairedIterations)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        }
}

template <class T>
void register_append() {
    const std::vector<std::int64_t> lengths = decode_lengths();
    for (bool cached : {false, true})
        for (int t : kThreadCounts) {
            const std::string name = std::string(cached ? "kv_append_rope_cached/" : "kv_append_rope/") +
                                     dtype_name<T>() + "/B:" + std::to_string(lengths.size()) + "/Hk:" +
                                     std::to_string(kHk) + "/D:" + std::to_string(kD) + "/threads:" +
                                     std::to_string(t);
            benchmark::RegisterBenchmark(name.c_str(), BM_append<T>, cached, t)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
        }
}

void register_all() {
    register_decode<float>();
    register_decode<Eigen::bfloat16>();
    register_decode<Eigen::half>();
    register_decode<std::int8_t>();
    const std::vector<std::int64_t> lengths = prefill_lengths();
    for (head_config hc : kHeadConfigs)
        for (int t : kThreadCounts)
            for (bool varlen : {true, false}) {
                const std::string name = std::string(varlen ? "varlen_prefill/" : "per_sequence_prefill/") +
                                         "f32/B:" + std::to_string(lengths.size()) + "/rows:" +
                                         std::to_string(total(lengths)) + "/causal:1/" + heads_name(hc) +
                                         "/threads:" + std::to_string(t);
                benchmark::RegisterBenchmark(name.c_str(), BM_prefill, varlen, hc, t)
                    ->UseRealTime()
                    ->Unit(benchmark::kMillisecond);
            }
    register_append<float>();
    register_append<Eigen::bfloat16>();
    register_append<Eigen::half>();
}

}  // namespace
}  // namespace attnkit_bench

int main(int argc, char** argv) { return attnkit_bench::bench_main(argc, argv, [] { attnkit_bench::register_all(); }); }
