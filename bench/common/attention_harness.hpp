// attnkit benchmarks: the attention harness shared by every attention family.
//
// A *family* is one way of computing attention (reference, materialised, attnkit, ...): a name
// and a callable with attnkit's own signature
//
//     void(const tensor4& q, const tensor4& k, const tensor4& v, tensor4& out,
//          const attnkit::softmax_options& opts)
//
// where opts carries the case's mask and `opts.pool` = the thread pool of the case (nullptr
// for threads:1; pool->size() is the thread count). A *case* is one shape + mask + thread
// count. register_attention_benchmarks(cases) registers one Google Benchmark per (case, family)
// that applies, case-major so that the console groups the families of a shape together:
//
//     <family>/L:1024/D:64/H:8/causal:1/threads:1            prefill, Lq = Lk = L
//     <family>/L:2048/D:128/H:32/Hk:8/causal:1/threads:2     GQA (Hk shown when != H)
//     <family>/decode/Lk:4096/D:128/H:8/threads:1            Lq = 1 against a KV cache
//     <family>/kv:bf16/decode/B:4/kl:mixed/Lk:16384/...       bfloat16 (kv:f16: half) K/V, and
//                                                             key_lengths of different lengths
//     <family>/decode/layout:head_major/Lk:16384/...          K/V in [B, Hk, L, D] memory, as
//                                                             PyTorch and Hugging Face caches
//                                                             hold them, passed as strided views
//
// 16-bit K/V cases run only families added with add_typed_family (a generic callable); their
// float copies of K/V hold the same rounded values, so the output check is unchanged, and GB/s
// counts the bytes actually stored (2 per element). Head-major cases run only those families
// too: the callable gets attnkit::view K/V (int8: an attnkit::int8_kv of views).
//
// Adding a family is one line:
//
//     attnkit_bench::add_family("attnkit", [](auto& q, auto& k, auto& v, auto& out, auto& opts) {
//         attnkit::softmax_attention(q, k, v, out, opts);
//     });
//
// What the harness does around the call (none of it timed):
//  - inputs: gaussian N(0,1) q, k, v, deterministic per shape (own xoshiro256** + Box-Muller,
//    identical on every standard library), cached across families and thread counts of a shape.
//    Decode cases get several copies of K/V, cycled per iteration, so the KV cache streamed per
//    cycle is >= 4x the last-level cache: the cache is cold as in a real decoder with many
//    layers, not resident in L3 from the previous iteration.
//  - out is filled with NaN before the loop, so a family that skips rows fails the check.
//  - after the loop: every output value must be finite, and rows spread over (b, i, h) must match
//    a double-precision recomputation within the family's tolerance; otherwise
//    state.SkipWithError. An exception from the family is also reported that way.
//  - counters: FLOP/s (useful FLOPs, common/flops.hpp, kIsIterationInvariantRate), peak_frac
//    (FLOP/s over machine_peak_flops(threads)); decode also GB/s (K/V bytes per second, in
//    GB/s, rate counter) and bw_frac (over the measured DRAM read bandwidth with as many
//    threads).
//  - timing: real (wall) time, ms; the minimum time comes from --benchmark_min_time (the
//    program's main sets a default), or a family's fixed `iterations`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include "attnkit/eigen.hpp"  // Eigen, with GCC 12's false AVX-512 warnings silenced

#include "attnkit/int8_kv.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"
#include "flops.hpp"
#include "bench_main.hpp"
#include "machine.hpp"

namespace attnkit_bench {

using tensor4 = Eigen::Tensor<float, 4, Eigen::RowMajor>;

using attention_fn = std::function<void(const tensor4& q, const tensor4& k, const tensor4& v,
                                        tensor4& out, const attnkit::softmax_options& opts)>;

// K/V storage of a case: float, 16-bit, or int8 with a float scale per row (attnkit::int8_kv);
// q, out and lse stay float. A family runs the 16-bit cases only when it was added with
// add_typed_family (its callable takes every storage), the int8 ones when also asked for.
enum class kv_storage { f32, bf16, f16, i8 };
using tensor4_i8 = Eigen::Tensor<std::int8_t, 4, Eigen::RowMajor>;
using tensor3 = Eigen::Tensor<float, 3, Eigen::RowMajor>;
using tensor4_bf16 = Eigen::Tensor<Eigen::bfloat16, 4, Eigen::RowMajor>;
using tensor4_f16 = Eigen::Tensor<Eigen::half, 4, Eigen::RowMajor>;
using attention_fn_bf16 = std::function<void(const tensor4& q, const tensor4_bf16& k, const tensor4_bf16& v,
                                             tensor4& out, const attnkit::softmax_options& opts)>;
using attention_fn_f16 = std::function<void(const tensor4& q, const tensor4_f16& k, const tensor4_f16& v,
                                            tensor4& out, const attnkit::softmax_options& opts)>;
using attention_fn_i8 = std::function<void(const tensor4& q, const attnkit::int8_kv& k, const attnkit::int8_kv& v,
                                           tensor4& out, const attnkit::softmax_options& opts)>;

inline const char* storage_name(kv_storage st) {
    return st == kv_storage::bf16 ? "bf16" : st == kv_storage::f16 ? "f16" : st == kv_storage::i8 ? "i8" : "f32";
}
// Bytes per element of K and V (int8: the values; kv_stream_bytes adds the scales).
inline std::size_t storage_bytes(kv_storage st) {
    return st == kv_storage::f32 ? 4 : st == kv_storage::i8 ? 1 : 2;
}

// ---------------------------------------------------------------------------------------------
// Cases.
struct attn_case {
    attn_dims dims;
    bool causal = false;
    bool decode = false;  // Lq = 1 against a KV cache: named by Lk, reports GB/s and bw_frac
    int threads = 1;
    kv_storage kv = kv_storage::f32;         // "kv:bf16" / "kv:f16" in the name when not float
    std::vector<std::int64_t> key_lengths;  // batched decode with padding: "kl:mixed" in the name
    // Decode with K/V in head-major memory ([B, Hk, L, D], each head's keys contiguous) seen as
    // [B, L, Hk, D] through strides: "layout:head_major" in the name.
    bool head_major = false;

    attnkit::softmax_options options() const {
        attnkit::softmax_options o;
        o.causal = causal;
        o.key_lengths = key_lengths;
        return o;
    }
    bool gqa() const { return dims.H != dims.Hk; }

    // Name without the family: the part of the benchmark name after "<family>/".
    std::string name() const {
        std::ostringstream s;
        if (kv != kv_storage::f32) s << "kv:" << storage_name(kv) << '/';
        if (decode) {
            s << "decode/";
            if (dims.B != 1) s << "B:" << dims.B << '/';
            if (!key_lengths.empty()) s << "kl:mixed/";
            if (head_major) s << "layout:head_major/";
            if (dims.Lq != 1) s << "Lq:" << dims.Lq << '/';
            s << "Lk:" << dims.Lk;
        } else {
            if (dims.B != 1) s << "B:" << dims.B << '/';
            if (dims.Lq == dims.Lk) s << "L:" << dims.Lq;
            else s << "Lq:" << dims.Lq << "/Lk:" << dims.Lk;
        }
        s << "/D:" << dims.D;
        if (dims.Dv != dims.D) s << "/Dv:" << dims.Dv;
        s << "/H:" << dims.H;
        if (dims.Hk != dims.H) s << "/Hk:" << dims.Hk;
        if (!decode) s << "/causal:" << (causal ? 1 : 0);
        s << "/threads:" << threads;
        return s.str();
    }
};

inline attn_case prefill_case(std::int64_t L, std::int64_t D, std::int64_t H, std::int64_t Hk,
                              bool causal, int threads, std::int64_t B = 1) {
    attn_case c;
    c.dims = attn_dims{B, L, L, H, Hk, D, D};
    c.causal = causal;
    c.threads = threads;
    return c;
}

inline attn_case decode_case(std::int64_t Lk, std::int64_t D, std::int64_t H, std::int64_t Hk,
                             int threads, std::int64_t B = 1) {
    attn_case c;
    c.dims = attn_dims{B, 1, Lk, H, Hk, D, D};
    c.causal = true;  // bottom-right: the one query sees the whole cache either way
    c.decode = true;
    c.threads = threads;
    return c;
}

// The decode sweep of the softmax bench and the ggml comparison: for each storage type and Lk,
// D 64 and 128, MHA H = 8 and GQA 32/8 over Hk = 8, K/V token-major and head-major, threads 1
// and 2.
inline std::vector<attn_case> decode_sweep(std::initializer_list<kv_storage> storages,
                                           const std::vector<std::int64_t>& key_lengths) {
    std::vector<attn_case> cases;
    for (kv_storage st : storages)
        for (std::int64_t Lk : key_lengths)
            for (std::int64_t D : {64, 128})
                for (std::int64_t H : {8, 32})
                    for (bool head_major : {false, true})
                        for (int t : kThreadCounts) {
                            attn_case c = decode_case(Lk, D, H, 8, t);
                            c.kv = st;
                            c.head_major = head_major;
                            cases.push_back(c);
                        }
    return cases;
}

// ---------------------------------------------------------------------------------------------
// Families.
struct family_options {
    // Which cases the family runs on; empty: all of them.
    std::function<bool(const attn_case&)> applies;
    // > 0: exactly this many iterations per repetition (slow baselines); else --benchmark_min_time.
    std::int64_t iterations = 0;
    // > 0: at most this many repetitions, whatever ATTNKIT_BENCH_REPETITIONS asks for.
    int max_repetitions = 0;
    // Spot check: |out - ref| <= tolerance * (1 + |ref|), ref in double.
    double tolerance = 2e-3;
};

// One copy of a head-major case's K and V as stored: [B, Hk, Lk, D] values (int8: and
// [B, Hk, Lk] scales), seen by head_major_view as the [B, Lk, Hk, D] attention takes.
struct head_major_kv {
    kv_storage storage = kv_storage::f32;
    attn_dims dims;
    const void* k = nullptr;
    const void* v = nullptr;
    const float* k_scales = nullptr;  // int8 only
    const float* v_scales = nullptr;
};
using attention_fn_head_major =
    std::function<void(const tensor4& q, const head_major_kv& kv, tensor4& out, const attnkit::softmax_options& opts)>;

template <class T>
attnkit::view<const T, 4> head_major_view(const void* p, const attn_dims& d, std::int64_t dim) {
    return attnkit::view<const T, 4>(static_cast<const T*>(p), {d.B, d.Lk, d.Hk, dim},
                                     {d.Hk * d.Lk * dim, dim, d.Lk * dim, 1});
}
inline attnkit::view<const float, 3> head_major_scales(const float* p, const attn_dims& d) {
    return attnkit::view<const float, 3>(p, {d.B, d.Lk, d.Hk}, {d.Hk * d.Lk, 1, d.Lk});
}

struct family {
    std::string name;
    attention_fn fn;
    family_options options;
    attention_fn_bf16 fn_bf16;  // empty: the family skips bf16 cases
    attention_fn_f16 fn_f16;    // empty: the family skips f16 cases
    attention_fn_i8 fn_i8;      // empty: the family skips int8 cases
    attention_fn_head_major fn_head_major;  // empty: the family skips head-major cases

    bool runs(const attn_case& c) const {
        if (c.head_major && !fn_head_major) return false;
        switch (c.kv) {
            case kv_storage::f32: return static_cast<bool>(fn);
            case kv_storage::bf16: return static_cast<bool>(fn_bf16);
            case kv_storage::f16: return static_cast<bool>(fn_f16);
            case kv_storage::i8: return static_cast<bool>(fn_i8);
        }
        return false;
    }
};

inline std::vector<family>& families() {
    static std::vector<family> f;
    return f;
}

inline void add_family(std::string name, attention_fn fn, family_options options = {}) {
    families().push_back(family{std::move(name), std::move(fn), std::move(options), {}, {}, {}, {}});
}

// A family that also takes bfloat16 / half K/V: f is a generic callable (auto& arguments);
// kInt8: also attnkit::int8_kv K/V.
template <bool kInt8 = false, class F>
void add_typed_family(std::string name, F f, family_options options = {}) {
    attention_fn_i8 fi8;
    if constexpr (kInt8) fi8 = attention_fn_i8(f);
    attention_fn_head_major fhm = [f](const tensor4& q, const head_major_kv& kv, tensor4& out,
                                      const attnkit::softmax_options& opts) {
        auto run = [&](auto tag) {
            using T = decltype(tag);
            const auto k = head_major_view<T>(kv.k, kv.dims, kv.dims.D);
            const auto v = head_major_view<T>(kv.v, kv.dims, kv.dims.Dv);
            f(q, k, v, out, opts);
        };
        switch (kv.storage) {
            case kv_storage::f32: run(float{}); break;
            case kv_storage::bf16: run(Eigen::bfloat16{}); break;
            case kv_storage::f16: run(Eigen::half{}); break;
            case kv_storage::i8:
                if constexpr (kInt8) {
                    const attnkit::int8_kv k(head_major_view<std::int8_t>(kv.k, kv.dims, kv.dims.D),
                                             head_major_scales(kv.k_scales, kv.dims));
                    const attnkit::int8_kv v(head_major_view<std::int8_t>(kv.v, kv.dims, kv.dims.Dv),
                                             head_major_scales(kv.v_scales, kv.dims));
                    f(q, k, v, out, opts);
                }
                break;
        }
    };
    families().push_back(family{std::move(name), attention_fn(f), std::move(options), attention_fn_bf16(f),
                                attention_fn_f16(f), std::move(fi8), std::move(fhm)});
}

// ---------------------------------------------------------------------------------------------
// Inputs.
class gaussian_rng {  // xoshiro256** seeded by splitmix64; Box-Muller on 53-bit uniforms
   public:
    explicit gaussian_rng(std::uint64_t seed) {
        for (auto& w : s_) {
            seed += 0x9e3779b97f4a7c15ULL;
            std::uint64_t z = seed;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
            w = z ^ (z >> 31);
        }
    }
    double next() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        const double two_pi = 6.283185307179586476925286766559;
        const double u1 = (static_cast<double>(bits() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
        const double u2 = static_cast<double>(bits() >> 11) * 0x1.0p-53;
        const double r = std::sqrt(-2.0 * std::log(u1));
        spare_ = r * std::sin(two_pi * u2);
        has_spare_ = true;
        return r * std::cos(two_pi * u2);
    }

   private:
    static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    std::uint64_t bits() {
        const std::uint64_t r = rotl(s_[1] * 5, 7) * 9;
        const std::uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return r;
    }
    std::uint64_t s_[4];
    double spare_ = 0;
    bool has_spare_ = false;
};

inline tensor4 random_tensor(std::int64_t d0, std::int64_t d1, std::int64_t d2, std::int64_t d3,
                             std::uint64_t seed) {
    tensor4 t(d0, d1, d2, d3);
    gaussian_rng g(seed);
    float* p = t.data();
    for (std::int64_t i = 0, n = t.size(); i < n; ++i) p[i] = static_cast<float>(g.next());
    return t;
}

struct attn_inputs {
    attn_dims dims;
    bool decode = false;
    bool head_major = false;
    kv_storage kv = kv_storage::f32;
    tensor4 q, out;
    std::vector<tensor4> k, v;  // identical copies; the harness cycles through them
    // 16-bit cases: the copies in their storage type; k and v above then hold the same rounded
    // values in float (for the output check), one copy.
    std::vector<tensor4_bf16> kb, vb;
    std::vector<tensor4_f16> kh, vh;
    // int8 cases: values and scales of each copy (attnkit::quantize_kv); k and v above hold the
    // dequantised values in float (for the output check), one copy.
    std::vector<tensor4_i8> ki, vi;
    std::vector<tensor3> ks, vs;
    // Head-major float cases: the copies in [B, Hk, L, D] memory (k and v above: one token-major
    // copy for the output check). Head-major 16-bit and int8 cases hold kb ... vs in that order.
    std::vector<tensor4> k_hm, v_hm;
    std::size_t copies() const {
        return kv == kv_storage::bf16 ? kb.size()
               : kv == kv_storage::f16 ? kh.size()
               : kv == kv_storage::i8  ? ki.size()
               : head_major            ? k_hm.size()
                                       : k.size();
    }
    head_major_kv head_major_copy(std::size_t i) const {
        head_major_kv c;
        c.storage = kv;
        c.dims = dims;
        switch (kv) {
            case kv_storage::f32: c.k = k_hm[i].data(), c.v = v_hm[i].data(); break;
            case kv_storage::bf16: c.k = kb[i].data(), c.v = vb[i].data(); break;
            case kv_storage::f16: c.k = kh[i].data(), c.v = vh[i].data(); break;
            case kv_storage::i8:
                c.k = ki[i].data(), c.v = vi[i].data();
                c.k_scales = ks[i].data(), c.v_scales = vs[i].data();
                break;
        }
        return c;
    }
};

// x [B, L, Hk, D] (or scales [B, L, Hk]) laid out as [B, Hk, L, D] ([B, Hk, L]).
template <class T>
Eigen::Tensor<T, 4, Eigen::RowMajor> head_major_copy_of(const Eigen::Tensor<T, 4, Eigen::RowMajor>& x) {
    return x.shuffle(Eigen::array<int, 4>{{0, 2, 1, 3}});
}
inline tensor3 head_major_copy_of(const tensor3& x) { return x.shuffle(Eigen::array<int, 3>{{0, 2, 1}}); }
template <class T>
void to_head_major(std::vector<T>& copies) {
    for (T& x : copies) x = head_major_copy_of(x);
}

template <class T>
Eigen::Tensor<T, 4, Eigen::RowMajor> stored_as(const tensor4& x) {
    Eigen::Tensor<T, 4, Eigen::RowMajor> y(x.dimensions());
    for (std::int64_t i = 0, n = x.size(); i < n; ++i) y.data()[i] = T(x.data()[i]);
    return y;
}
template <class T>
void round_through(tensor4& x) {
    for (std::int64_t i = 0, n = x.size(); i < n; ++i) x.data()[i] = static_cast<float>(T(x.data()[i]));
}

inline std::uint64_t dims_seed(const attn_dims& d) {
    std::uint64_t h = 0x243f6a8885a308d3ULL;
    for (std::int64_t x : {d.B, d.Lq, d.Lk, d.H, d.Hk, d.D, d.Dv})
        h = (h ^ static_cast<std::uint64_t>(x)) * 0x100000001b3ULL;
    return h;
}

// Inputs of a case, kept until a case of another shape asks (benchmarks run case-major, so each
// shape is generated once). Also frees the DRAM probes' stream buffer.
inline attn_inputs& inputs_for(const attn_case& c) {
    static attn_inputs cur;
    static bool valid = false;
    const attn_dims& d = c.dims;
    const attn_dims& o = cur.dims;
    const bool same = valid && cur.decode == c.decode && cur.head_major == c.head_major && cur.kv == c.kv &&
                      o.B == d.B && o.Lq == d.Lq &&
                      o.Lk == d.Lk && o.H == d.H && o.Hk == d.Hk && o.D == d.D && o.Dv == d.Dv;
    if (same) return cur;
    release_stream_buffer();
    cur = attn_inputs{};
    valid = false;
    cur.dims = d;
    cur.decode = c.decode;
    cur.head_major = c.head_major;
    cur.kv = c.kv;
    const std::uint64_t seed = dims_seed(d);
    cur.q = random_tensor(d.B, d.Lq, d.H, d.D, seed + 1);
    cur.k.push_back(random_tensor(d.B, d.Lk, d.Hk, d.D, seed + 2));
    cur.v.push_back(random_tensor(d.B, d.Lk, d.Hk, d.Dv, seed + 3));
    int copies = 1;
    if (c.decode) {
        const double one =
            static_cast<double>(d.B * d.Lk * d.Hk * (d.D + d.Dv)) * static_cast<double>(storage_bytes(c.kv));
        const double want = 4.0 * static_cast<double>(llc_bytes());
        copies = std::min(16, std::max(1, static_cast<int>(std::ceil(want / one))));
    }
    if (c.kv == kv_storage::bf16) {
        round_through<Eigen::bfloat16>(cur.k[0]);
        round_through<Eigen::bfloat16>(cur.v[0]);
        cur.kb.assign(static_cast<std::size_t>(copies), stored_as<Eigen::bfloat16>(cur.k[0]));
        cur.vb.assign(static_cast<std::size_t>(copies), stored_as<Eigen::bfloat16>(cur.v[0]));
    } else if (c.kv == kv_storage::f16) {
        round_through<Eigen::half>(cur.k[0]);
        round_through<Eigen::half>(cur.v[0]);
        cur.kh.assign(static_cast<std::size_t>(copies), stored_as<Eigen::half>(cur.k[0]));
        cur.vh.assign(static_cast<std::size_t>(copies), stored_as<Eigen::half>(cur.v[0]));
    } else if (c.kv == kv_storage::i8) {
        auto quantise = [&](tensor4& x, std::vector<tensor4_i8>& values, std::vector<tensor3>& scales) {
            tensor4_i8 q(x.dimensions());
            tensor3 s(x.dimension(0), x.dimension(1), x.dimension(2));
            attnkit::quantize_kv(x, q, s);
            for (std::int64_t i = 0, n = x.size(); i < n; ++i)
                x.data()[i] = s.data()[i / x.dimension(3)] * static_cast<float>(q.data()[i]);
            values.assign(static_cast<std::size_t>(copies), q);
            scales.assign(static_cast<std::size_t>(copies), s);
        };
        quantise(cur.k[0], cur.ki, cur.ks);
        quantise(cur.v[0], cur.vi, cur.vs);
    } else if (c.head_major) {
        cur.k_hm.assign(static_cast<std::size_t>(copies), head_major_copy_of(cur.k[0]));
        cur.v_hm.assign(static_cast<std::size_t>(copies), head_major_copy_of(cur.v[0]));
    } else {
        for (int i = 1; i < copies; ++i) {
            cur.k.push_back(cur.k[0]);
            cur.v.push_back(cur.v[0]);
        }
    }
    if (c.head_major) {
        to_head_major(cur.kb), to_head_major(cur.vb), to_head_major(cur.kh), to_head_major(cur.vh);
        to_head_major(cur.ki), to_head_major(cur.vi), to_head_major(cur.ks), to_head_major(cur.vs);
    }
    cur.out = tensor4(d.B, d.Lq, d.H, d.Dv);
    valid = true;
    return cur;
}

// ---------------------------------------------------------------------------------------------
// Output checks. Returns an empty string when the output is fine, else what is wrong.
inline std::string check_output(const attn_inputs& in, const attnkit::softmax_options& opts,
                                double tolerance) {
    const attn_dims& d = in.dims;
    const float* out = in.out.data();
    for (std::int64_t i = 0, n = in.out.size(); i < n; ++i)
        if (!std::isfinite(out[i])) {
            std::ostringstream s;
            s << "output not finite at flat index " << i << " (value " << out[i] << ")";
            return s.str();
        }
    // Rows to recompute: first/middle/last batch item, query and head, plus one odd query.
    auto pick = [](std::int64_t n) {
        std::vector<std::int64_t> v{0, n / 2, n - 1, (n * 2) / 3 | 1};
        std::sort(v.begin(), v.end());
        v.erase(std::unique(v.begin(), v.end()), v.end());
        v.erase(std::remove_if(v.begin(), v.end(), [n](std::int64_t x) { return x < 0 || x >= n; }),
                v.end());
        return v;
    };
    const double scale = opts.scale > 0 ? opts.scale : 1.0 / std::sqrt(static_cast<double>(d.D));
    const tensor4& q = in.q;
    const tensor4& k = in.k[0];
    const tensor4& v = in.v[0];
    std::vector<double> s(static_cast<std::size_t>(d.Lk)), o(static_cast<std::size_t>(d.Dv));
    for (std::int64_t b : pick(d.B))
        for (std::int64_t i : pick(d.Lq))
            for (std::int64_t h : pick(d.H)) {
                const std::int64_t kh = h / (d.H / d.Hk);
                std::int64_t lo, hi;
                detail::visible_range(d, opts, b, i, lo, hi);
                std::fill(o.begin(), o.end(), 0.0);
                if (hi >= lo) {
                    double m = -std::numeric_limits<double>::infinity();
                    for (std::int64_t j = lo; j <= hi; ++j) {
                        double acc = 0;
                        for (std::int64_t c = 0; c < d.D; ++c)
                            acc += static_cast<double>(q(b, i, h, c)) * k(b, j, kh, c);
                        s[static_cast<std::size_t>(j)] = acc * scale;
                        m = std::max(m, acc * scale);
                    }
                    double z = 0;
                    for (std::int64_t j = lo; j <= hi; ++j) {
                        const double p = std::exp(s[static_cast<std::size_t>(j)] - m);
                        z += p;
                        for (std::int64_t c = 0; c < d.Dv; ++c)
                            o[static_cast<std::size_t>(c)] += p * v(b, j, kh, c);
                    }
                    for (double& x : o) x /= z;
                }
                for (std::int64_t c = 0; c < d.Dv; ++c) {
                    const double ref = o[static_cast<std::size_t>(c)];
                    const double got = in.out(b, i, h, c);
                    if (!(std::abs(got - ref) <= tolerance * (1.0 + std::abs(ref)))) {
                        std::ostringstream e;
                        e << "output mismatch at (b=" << b << ", i=" << i << ", h=" << h
                          << ", d=" << c << "): got " << got << ", double recomputation " << ref;
                        return e.str();
                    }
                }
            }
    return {};
}

// ---------------------------------------------------------------------------------------------
// The benchmark body.
inline void run_attention(benchmark::State& state, const family& f, const attn_case& c) {
    attn_inputs& in = inputs_for(c);
    attnkit::softmax_options opts = c.options();
    opts.pool = shared_pool(c.threads);
    std::fill_n(in.out.data(), in.out.size(), std::numeric_limits<float>::quiet_NaN());

    const double flops = attention_flops(c.dims, opts);
    const std::size_t copies = in.copies();
    std::size_t slot = 0;
    bool failed = false;
    const auto t0 = clock_type::now();
    for (auto _ : state) {
        try {
            if (c.head_major)
                f.fn_head_major(in.q, in.head_major_copy(slot), in.out, opts);
            else if (c.kv == kv_storage::bf16)
                f.fn_bf16(in.q, in.kb[slot], in.vb[slot], in.out, opts);
            else if (c.kv == kv_storage::f16)
                f.fn_f16(in.q, in.kh[slot], in.vh[slot], in.out, opts);
            else if (c.kv == kv_storage::i8)
                f.fn_i8(in.q, attnkit::int8_kv(in.ki[slot], in.ks[slot]), attnkit::int8_kv(in.vi[slot], in.vs[slot]),
                        in.out, opts);
            else
                f.fn(in.q, in.k[slot], in.v[slot], in.out, opts);
        } catch (const std::exception& e) {
            state.SkipWithError((std::string("exception: ") + e.what()).c_str());
            failed = true;
            break;
        }
        if (++slot == copies) slot = 0;
        benchmark::ClobberMemory();
    }
    const double seconds = seconds_since(t0);
    if (failed) return;

    const std::string err = check_output(in, opts, f.options.tolerance);
    if (!err.empty()) {
        state.SkipWithError(err.c_str());
        return;
    }
    const double iters = static_cast<double>(state.iterations());
    state.counters["FLOP/s"] = benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["peak_frac"] = flops * iters / seconds / machine_peak_flops(c.threads);
    if (c.decode) {
        double bytes = kv_bytes(c.dims, opts, storage_bytes(c.kv), storage_bytes(c.kv));
        if (c.kv == kv_storage::i8) {  // and one float scale per K row and per V row
            attn_dims one = c.dims;
            one.D = one.Dv = 1;
            bytes += kv_bytes(one, opts, sizeof(float), sizeof(float));
        }
        state.counters["GB/s"] =
            benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
        state.counters["bw_frac"] = bytes * iters / seconds / dram_read_bandwidth(c.threads);
    }
}

// ---------------------------------------------------------------------------------------------
// Registration.


// Cases whose one call is at least this many useful FLOPs get at most heavy_max_repetitions
// repetitions, whatever ATTNKIT_BENCH_REPETITIONS says (a few seconds each for the baselines).
constexpr double heavy_case_flops = 2e10;
constexpr int heavy_max_repetitions = 3;

// One benchmark per (case, family that applies), case-major, after the families are added.
// Also records the family order in the JSON context ("attnkit_families") for bench_report.
inline void register_attention_benchmarks(const std::vector<attn_case>& cases) {
    const int reps = bench_repetitions_env();
    std::string names;
    for (const family& f : families()) names += (names.empty() ? "" : ",") + f.name;
    benchmark::AddCustomContext("attnkit_families", names);
    for (const attn_case& c : cases) {
        const double flops = attention_flops(c.dims, c.options());
        for (std::size_t fi = 0; fi < families().size(); ++fi) {
            const family& f = families()[fi];
            if (f.options.applies && !f.options.applies(c)) continue;
            if (!f.runs(c)) continue;
            const std::string name = f.name + "/" + c.name();
            auto* b = benchmark::RegisterBenchmark(name.c_str(), [fi, c](benchmark::State& st) {
                run_attention(st, families()[fi], c);
            });
            b->UseRealTime()->Unit(benchmark::kMillisecond);
            if (f.options.iterations > 0) b->Iterations(f.options.iterations);
            int cap = f.options.max_repetitions;
            if (flops >= heavy_case_flops)
                cap = cap > 0 ? std::min(cap, heavy_max_repetitions) : heavy_max_repetitions;
            if (reps > 0 && cap > 0 && reps > cap) b->Repetitions(cap);
        }
    }
}

}  // namespace attnkit_bench
