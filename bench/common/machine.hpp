// attnkit benchmarks: what this machine can do, measured, so that every benchmark can say
// which fraction of it a kernel reaches.
//
//  - FP32 FMA peak of one thread: a register-bound loop of independent vector FMAs (12
//    accumulators of the widest float vector the build targets, enough to cover 2 FMA pipes x
//    4-5 cycles latency), so it measures the core as the compiler flags let kernels use it.
//    Without FMA (plain SSE2 / scalar builds) it is a multiply + add per lane, still 2 FLOPs.
//  - DRAM bandwidth: a read stream (vector sum) over a 256 MiB buffer, 1..n threads, and a
//    STREAM triad a = b + s*c over three ~85 MiB arrays (STREAM byte counting: 12 B per
//    element, write-allocate traffic not counted).
//
// machine_peak_flops() and dram_read_bandwidth() are measured once per process (median of a few
// short runs, memoised) for the peak_frac / bw_frac counters; fma_peak_run() / dram_read_run()
// are also timed by BM_fma_peak / BM_dram_read as benchmarks of their own.
// Threads are an attnkit::thread_pool (the one the kernels get), fed many small chunks so both
// workers stream concurrently whatever the pool's scheduling.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include <time.h>

#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "attnkit/config.hpp"
#include "attnkit/thread_pool.hpp"

namespace attnkit_bench {

// ---------------------------------------------------------------------------------------------
// Widest float vector of the build, with the few operations the probes need.
namespace simd {
#if defined(__AVX512F__)
using vf = __m512;
constexpr int lanes = 16;
constexpr const char* name = "AVX-512F FMA, 16 float lanes";
inline vf set1(float x) { return _mm512_set1_ps(x); }
inline vf load(const float* p) { return _mm512_load_ps(p); }
inline vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline float hsum(vf a) { return _mm512_reduce_add_ps(a); }
#elif defined(__AVX__)
using vf = __m256;
constexpr int lanes = 8;
#if defined(__FMA__)
constexpr const char* name = "AVX2 FMA, 8 float lanes";
inline vf fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
#else
constexpr const char* name = "AVX mul+add (no FMA), 8 float lanes";
inline vf fma(vf a, vf b, vf c) { return _mm256_add_ps(_mm256_mul_ps(a, b), c); }
#endif
inline vf set1(float x) { return _mm256_set1_ps(x); }
inline vf load(const float* p) { return _mm256_load_ps(p); }
inline vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
inline float hsum(vf a) {
    alignas(32) float t[8];
    _mm256_store_ps(t, a);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}
#elif defined(__SSE2__)
using vf = __m128;
constexpr int lanes = 4;
#if defined(__FMA__)
constexpr const char* name = "SSE FMA, 4 float lanes";
inline vf fma(vf a, vf b, vf c) { return _mm_fmadd_ps(a, b, c); }
#else
constexpr const char* name = "SSE2 mul+add (no FMA), 4 float lanes";
inline vf fma(vf a, vf b, vf c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
#endif
inline vf set1(float x) { return _mm_set1_ps(x); }
inline vf load(const float* p) { return _mm_load_ps(p); }
inline vf add(vf a, vf b) { return _mm_add_ps(a, b); }
inline float hsum(vf a) {
    alignas(16) float t[4];
    _mm_store_ps(t, a);
    return (t[0] + t[1]) + (t[2] + t[3]);
}
#else
using vf = float;
constexpr int lanes = 1;
constexpr const char* name = "scalar mul+add, 1 float lane";
inline vf set1(float x) { return x; }
inline vf load(const float* p) { return *p; }
inline vf add(vf a, vf b) { return a + b; }
inline vf fma(vf a, vf b, vf c) { return a * b + c; }
inline float hsum(vf a) { return a; }
#endif
}  // namespace simd

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

inline double median_of(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---------------------------------------------------------------------------------------------
// Thread pools shared by all benchmarks of the process (created once per thread count, so that
// pool start-up and the workers' thread_local scratch are not re-paid by every benchmark run).
// threads <= 1 gives nullptr: run on the calling thread, as attnkit's options mean it.
inline attnkit::thread_pool* shared_pool(int threads) {
    if (threads <= 1) return nullptr;
    static std::mutex mu;
    static std::map<int, std::unique_ptr<attnkit::thread_pool>> pools;
    std::lock_guard<std::mutex> lk(mu);
    auto& p = pools[threads];
    if (!p) p = std::make_unique<attnkit::thread_pool>(static_cast<std::size_t>(threads));
    return p.get();
}

// ---------------------------------------------------------------------------------------------
// FMA peak.
constexpr int fma_accumulators = 12;
constexpr double fma_flops_per_step = 2.0 * fma_accumulators * simd::lanes;

// Runs `steps` steps of 12 independent vector FMAs; returns a value the caller must consume.
// The multiplier and addend come through volatiles so nothing is folded at compile time; the
// recurrence converges to c / (1 - m) without overflow or denormals.
inline float fma_kernel(std::int64_t steps) {
    volatile float vm = 0.9999999f, vc = 1e-7f;
    const simd::vf m = simd::set1(vm), c = simd::set1(vc);
    simd::vf a0 = simd::set1(0.01f), a1 = simd::set1(0.02f), a2 = simd::set1(0.03f),
             a3 = simd::set1(0.04f), a4 = simd::set1(0.05f), a5 = simd::set1(0.06f),
             a6 = simd::set1(0.07f), a7 = simd::set1(0.08f), a8 = simd::set1(0.09f),
             a9 = simd::set1(0.10f), a10 = simd::set1(0.11f), a11 = simd::set1(0.12f);
    for (std::int64_t s = 0; s < steps; ++s) {
        a0 = simd::fma(a0, m, c);
        a1 = simd::fma(a1, m, c);
        a2 = simd::fma(a2, m, c);
        a3 = simd::fma(a3, m, c);
        a4 = simd::fma(a4, m, c);
        a5 = simd::fma(a5, m, c);
        a6 = simd::fma(a6, m, c);
        a7 = simd::fma(a7, m, c);
        a8 = simd::fma(a8, m, c);
        a9 = simd::fma(a9, m, c);
        a10 = simd::fma(a10, m, c);
        a11 = simd::fma(a11, m, c);
    }
    const simd::vf s = simd::add(
        simd::add(simd::add(simd::add(a0, a1), simd::add(a2, a3)),
                  simd::add(simd::add(a4, a5), simd::add(a6, a7))),
        simd::add(simd::add(a8, a9), simd::add(a10, a11)));
    return simd::hsum(s);
}

// One FMA-peak run: `steps` steps on each of `threads` threads (in 8 chunks per thread so the
// pool's dynamic scheduling keeps every worker busy). Returns the FLOPs executed.
inline double fma_peak_run(std::int64_t steps, int threads, float* sink) {
    const std::int64_t chunks = threads <= 1 ? 1 : 8 * static_cast<std::int64_t>(threads);
    const std::int64_t per = std::max<std::int64_t>(1, steps * std::max(threads, 1) / chunks);
    std::vector<float> part(static_cast<std::size_t>(chunks), 0.0f);
    attnkit::parallel_for(shared_pool(threads), chunks,
                          [&](std::int64_t i) { part[static_cast<std::size_t>(i)] = fma_kernel(per); });
    float s = 0;
    for (float x : part) s += x;
    *sink += s;
    return fma_flops_per_step * static_cast<double>(per) * static_cast<double>(chunks);
}

// CPU time of the calling thread in seconds (wall time where POSIX thread clocks are missing).
inline double thread_cpu_seconds() {
#if defined(CLOCK_THREAD_CPUTIME_ID)
    timespec ts{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0)
        return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
#endif
    return std::chrono::duration<double>(clock_type::now().time_since_epoch()).count();
}

struct fma_peak_info {
    double per_thread = 0;  // FLOP/s of one thread: the best of the runs
    double min = 0, max = 0;
    int runs = 0;
};

// Measured once: 7 runs of ~20 ms on the calling thread, the best one (a peak is what the core
// can do; taking the best keeps every peak_frac conservative). Each run is timed in thread
// CPU time, so that other processes on a shared machine (time slicing) do not lower the
// denominator of peak_frac: it is what a core does while it runs this thread. The BM_fma_peak
// benchmark times the same loop in wall time, like every other benchmark.
inline const fma_peak_info& fma_peak() {
    static const fma_peak_info info = [] {
        float sink = 0;
        fma_kernel(1 << 16);  // wake the vector unit / clocks up
        std::int64_t steps = 1 << 18;
        double t0 = thread_cpu_seconds();
        fma_peak_run(steps, 1, &sink);
        const double dt = std::max(thread_cpu_seconds() - t0, 1e-6);
        steps = std::max<std::int64_t>(1 << 16, static_cast<std::int64_t>(steps * 0.02 / dt));
        std::vector<double> rates;
        for (int r = 0; r < 7; ++r) {
            t0 = thread_cpu_seconds();
            const double flops = fma_peak_run(steps, 1, &sink);
            rates.push_back(flops / std::max(thread_cpu_seconds() - t0, 1e-9));
        }
        volatile float keep = sink;
        (void)keep;
        fma_peak_info i;
        i.per_thread = *std::max_element(rates.begin(), rates.end());
        i.min = *std::min_element(rates.begin(), rates.end());
        i.max = *std::max_element(rates.begin(), rates.end());
        i.runs = static_cast<int>(rates.size());
        return i;
    }();
    return info;
}

// Peak FLOP/s available to a kernel running on `threads` threads: per-thread peak x threads.
inline double machine_peak_flops(int threads) {
    return fma_peak().per_thread * std::max(threads, 1);
}

// ---------------------------------------------------------------------------------------------
// DRAM streams.
constexpr std::size_t stream_bytes = std::size_t(256) << 20;  // 256 MiB, >> any LLC here
constexpr std::size_t stream_chunk_floats = std::size_t(1) << 18;  // 1 MiB per pool task

struct aligned_free {
    void operator()(float* p) const { std::free(p); }
};
using float_buffer = std::unique_ptr<float[], aligned_free>;

// The 256 MiB stream buffer, allocated and touched on first use; release_stream_buffer() hands
// the memory back (the attention benchmarks call it before preparing their inputs).
inline float_buffer& stream_buffer_slot() {
    static float_buffer buf;
    return buf;
}
inline float* stream_buffer() {
    float_buffer& b = stream_buffer_slot();
    if (!b) {
        void* p = std::aligned_alloc(64, stream_bytes);
        if (!p) throw std::bad_alloc();
        b.reset(static_cast<float*>(p));
        const std::size_t n = stream_bytes / sizeof(float);
        for (std::size_t i = 0; i < n; ++i) b[i] = 1.0f + static_cast<float>(i & 7) * 0.125f;
    }
    return b.get();
}
inline void release_stream_buffer() { stream_buffer_slot().reset(); }

// Sum of n floats (n a multiple of kReadStreams vectors, p aligned to 64), read as kReadStreams
// interleaved sequential streams over equal segments of [p, p + n): each step loads one vector
// from every segment into its own accumulator. One stream per core leaves DRAM bandwidth
// unused: the prefetchers stop at 4 KiB page edges, so a core streams about as many pages
// at once as it reads streams (Zen 2, 1 MiB chunks, best of 5: 1 stream 11.5-14.9 GB/s,
// 4 streams 16.8-20.6, 8 streams 17.7-21.5, 16 streams of 64 KiB 10.6). The kernels that stream
// memory read several streams too (the decode row kernel: 8), so this is their ceiling.
constexpr std::size_t kReadStreams = 8;
inline float read_sum(const float* p, std::size_t n) {
    constexpr std::size_t w = simd::lanes;
    const std::size_t seg = n / kReadStreams;
    simd::vf acc[kReadStreams];
    for (auto& a : acc) a = simd::set1(0);
    for (std::size_t i = 0; i < seg; i += w)
        for (std::size_t j = 0; j < kReadStreams; ++j) acc[j] = simd::add(acc[j], simd::load(p + j * seg + i));
    for (std::size_t j = 1; j < kReadStreams; ++j) acc[0] = simd::add(acc[0], acc[j]);
    return simd::hsum(acc[0]);
}

// One read pass over the stream buffer on `threads` threads; returns the bytes read.
inline double dram_read_run(int threads, float* sink) {
    const float* p = stream_buffer();
    const std::size_t n = stream_bytes / sizeof(float);
    const std::int64_t chunks = static_cast<std::int64_t>(n / stream_chunk_floats);
    std::vector<float> part(static_cast<std::size_t>(chunks));
    attnkit::parallel_for(shared_pool(threads), chunks, [&](std::int64_t c) {
        part[static_cast<std::size_t>(c)] =
            read_sum(p + static_cast<std::size_t>(c) * stream_chunk_floats, stream_chunk_floats);
    });
    float s = 0;
    for (float x : part) s += x;
    *sink += s;
    return static_cast<double>(n) * sizeof(float);
}

// One triad pass a = b + s*c over the stream buffer cut in three; returns STREAM bytes (12 per
// element). The plain loop is vectorised by the compiler.
inline double dram_triad_run(int threads, float scalar) {
    float* base = stream_buffer();
    const std::size_t n_all = stream_bytes / sizeof(float);
    const std::size_t n = (n_all / 3) / stream_chunk_floats * stream_chunk_floats;
    float* a = base;
    const float* b = base + n;
    const float* c = base + 2 * n;
    const std::int64_t chunks = static_cast<std::int64_t>(n / stream_chunk_floats);
    attnkit::parallel_for(shared_pool(threads), chunks, [&](std::int64_t k) {
        const std::size_t o = static_cast<std::size_t>(k) * stream_chunk_floats;
        float* ATTNKIT_RESTRICT ap = a + o;
        const float* ATTNKIT_RESTRICT bp = b + o;
        const float* ATTNKIT_RESTRICT cp = c + o;
        for (std::size_t i = 0; i < stream_chunk_floats; ++i) ap[i] = bp[i] + scalar * cp[i];
    });
    return 3.0 * static_cast<double>(n) * sizeof(float);
}

// DRAM read bandwidth (bytes/s) with `threads` threads: the best of 5 passes after a warm-up
// pass (the best keeps bw_frac conservative), measured on first request per thread count and
// memoised.
inline double dram_read_bandwidth(int threads) {
    threads = std::max(threads, 1);
    static std::mutex mu;
    static std::map<int, double> cache;
    std::lock_guard<std::mutex> lk(mu);
    auto it = cache.find(threads);
    if (it != cache.end()) return it->second;
    float sink = 0;
    dram_read_run(threads, &sink);
    std::vector<double> rates;
    for (int r = 0; r < 5; ++r) {
        const auto t0 = clock_type::now();
        const double bytes = dram_read_run(threads, &sink);
        rates.push_back(bytes / seconds_since(t0));
    }
    volatile float keep = sink;
    (void)keep;
    return cache[threads] = *std::max_element(rates.begin(), rates.end());
}

// Last-level cache size in bytes (Linux sysfs; 32 MiB when unknown). Used to size working sets
// that must not fit in cache.
inline std::size_t llc_bytes() {
    for (const char* idx : {"index3", "index2"}) {
        std::ifstream f(std::string("/sys/devices/system/cpu/cpu0/cache/") + idx + "/size");
        std::string s;
        if (f >> s && !s.empty()) {
            std::size_t mult = 1;
            const char u = s.back();
            if (u == 'K' || u == 'k') mult = std::size_t(1) << 10;
            if (u == 'M' || u == 'm') mult = std::size_t(1) << 20;
            if (mult != 1) s.pop_back();
            const std::size_t v = static_cast<std::size_t>(std::strtoull(s.c_str(), nullptr, 10));
            if (v > 0) return v * mult;
        }
    }
    return std::size_t(32) << 20;
}

}  // namespace attnkit_bench
