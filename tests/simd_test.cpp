// Tests of the SIMD layer (attnkit/simd/simd.hpp, convert.hpp, xsimd_compat.hpp, and through them
// the per-ISA kernels in attnkit/simd/arch/).
//
// Every test is a typed test over the architecture tag: simd::default_arch (whatever the compile
// flags select: SSE2, AVX2, AVX-512, NEON, or scalar under ATTNKIT_SIMD_SCALAR) and
// simd::scalar_arch (the portable one-lane path). Nothing assumes a particular width: sizes are
// derived from W = kLanes<A>, so the same file holds for -march=x86-64, haswell, skylake-avx512,
// native and the scalar build.
#include "attnkit/simd/simd.hpp"
#include "attnkit/simd/convert.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#define ATTNKIT_TEST_HAVE_MMAP 1
#endif

namespace {

namespace simd = attnkit::simd;
using attnkit::index_t;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kEps = std::numeric_limits<float>::epsilon();

// ---- tolerances ----------------------------------------------------------------------------

// exp2/exp: the documented bound for exp2 is 2.5e-7 relative (about 2 ulp of float); 3e-7
// leaves a little room for the reference itself and for unfused multiply-adds on SSE2.
constexpr double kExpRelTol = 3e-7;
// tanh: xsimd's tanh (and tanhf) are accurate to a few ulp of the result, |tanh| <= 1, so an
// absolute bound of ~3.5 ulp(1) covers it; the max(1, |x|) factor allows for the argument's
// own rounding in range reduction at large |x| (where tanh is flat anyway).
constexpr double kTanhAbsTol = 2e-7;
// hsum: any summation order of W floats has error <= (W - 1) * u * sum|x| with u = eps / 2;
// W * eps * sum|x| is that bound with slack, and it scales with width and magnitude.
// (Expressed in the test as kHsumTolPerLane * W * eps * sum|x|.)
constexpr double kHsumTolPerLane = 1.0;
// fma: without FMA hardware (SSE2) xsimd evaluates a*b + c with two roundings, each at most
// u = eps / 2 relative; eps * (|a*b| + |a*b + c|) bounds both. Where the target has FMA (and on
// the scalar path, std::fma) the result must be the correctly rounded fused value.
constexpr double kUnfusedFmaTol = 1.0;  // times eps * (|a*b| + |a*b + c|)

// Sentinel written around buffers; any change means an out-of-bounds write, and a lane equal
// to it after a partial load means an out-of-bounds read.
constexpr float kGuard = -7.5e33f;

// ---- architecture tags ---------------------------------------------------------------------

using Arches = ::testing::Types<simd::default_arch, simd::scalar_arch>;

struct ArchName {
    template <class A>
    static std::string GetName(int i) {
        std::string s = std::string(i == 0 ? "default_" : "") + A::name();
        for (char& c : s)
            if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
        return s;
    }
};

template <class A>
class Simd : public ::testing::Test {};
TYPED_TEST_SUITE(Simd, Arches, ArchName);

// ---- helpers -------------------------------------------------------------------------------

template <class A>
constexpr index_t W = simd::kLanes<A>;

template <class A>
std::vector<float> lanes_of(const simd::vfloat<A>& v) {
    std::vector<float> out(static_cast<std::size_t>(W<A>));
    simd::storeu(out.data(), v);
    return out;
}

template <class A>
simd::vfloat<A> make(const std::vector<float>& x) {
    return simd::loadu<A>(x.data());
}

bool same_bits(float a, float b) {
    std::uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    return ua == ub;
}

float float_from_bits(std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Applies f (a function of one vector) to every element of xs, W lanes at a time; the tail is
// padded with copies of the last element so that no lane sees an unintended value.
template <class A, class F>
std::vector<float> map_lanes(const std::vector<float>& xs, F f) {
    const std::size_t w = static_cast<std::size_t>(W<A>);
    std::vector<float> in(xs);
    const std::size_t n = xs.size();
    while (in.size() % w != 0) in.push_back(xs.empty() ? 0.0f : xs.back());
    std::vector<float> out(in.size());
    for (std::size_t i = 0; i < in.size(); i += w) simd::storeu(out.data() + i, f(simd::loadu<A>(in.data() + i)));
    out.resize(n);
    return out;
}

// A 64-byte aligned buffer of floats filled with kGuard, with room for kPad guard floats on
// either side of any payload placed at offset off (0 <= off < 64).
struct GuardedBuffer {
    static constexpr std::size_t kPad = 32;
    static constexpr std::size_t kCap = 256;
    alignas(64) std::array<float, kCap> raw;
    GuardedBuffer() { raw.fill(kGuard); }
    float* at(std::size_t off) { return raw.data() + kPad + off; }
    // True if every float outside [kPad + off, kPad + off + n) still holds the guard.
    ::testing::AssertionResult guards_intact(std::size_t off, std::size_t n) const {
        for (std::size_t i = 0; i < kCap; ++i) {
            if (i >= kPad + off && i < kPad + off + n) continue;
            if (!same_bits(raw[i], kGuard))
                return ::testing::AssertionFailure()
                       << "guard overwritten at buffer index " << static_cast<long>(i) - static_cast<long>(kPad + off)
                       << " relative to the payload (payload length " << n << ")";
        }
        return ::testing::AssertionSuccess();
    }
};

// ---- width and broadcast -------------------------------------------------------------------

TEST(SimdArch, DefaultArchMatchesCompileFlags) {
    EXPECT_EQ(simd::kLanes<simd::scalar_arch>, 1);
#if defined(ATTNKIT_SIMD_SCALAR)
    EXPECT_TRUE((std::is_same<simd::default_arch, simd::scalar_arch>::value));
    EXPECT_EQ(simd::kLanes<simd::default_arch>, 1);
#elif defined(__AVX512F__)
    EXPECT_EQ(simd::kLanes<simd::default_arch>, 16) << simd::default_arch::name();
#elif defined(__AVX__)
    EXPECT_EQ(simd::kLanes<simd::default_arch>, 8) << simd::default_arch::name();
#elif defined(__SSE2__) || defined(__ARM_NEON)
    EXPECT_EQ(simd::kLanes<simd::default_arch>, 4) << simd::default_arch::name();
#endif
}

TYPED_TEST(Simd, LanesMatchVectorSize) {
    using A = TypeParam;
    EXPECT_EQ(W<A>, static_cast<index_t>(simd::vfloat<A>::size));
    EXPECT_GE(W<A>, 1);
}

TYPED_TEST(Simd, Set1BroadcastsToEveryLane) {
    using A = TypeParam;
    for (float x : {0.0f, -0.0f, 1.5f, -3.25e7f, kInf, -kInf}) {
        for (float y : lanes_of<A>(simd::set1<A>(x))) EXPECT_TRUE(same_bits(y, x)) << x;
    }
    for (float y : lanes_of<A>(simd::set1<A>(kNaN))) EXPECT_TRUE(std::isnan(y));
}

// ---- loads and stores ----------------------------------------------------------------------

TYPED_TEST(Simd, LoaduStoreuAnyOffset) {
    using A = TypeParam;
    const std::size_t w = static_cast<std::size_t>(W<A>);
    for (std::size_t off = 0; off < w; ++off) {
        SCOPED_TRACE("offset " + std::to_string(off));
        GuardedBuffer src, dst;
        for (std::size_t i = 0; i < w; ++i) src.at(off)[i] = 10.0f + static_cast<float>(i);
        const auto v = simd::loadu<A>(src.at(off));
        const auto got = lanes_of<A>(v);
        for (std::size_t i = 0; i < w; ++i) EXPECT_EQ(got[i], 10.0f + static_cast<float>(i)) << "lane " << i;
        simd::storeu(dst.at(off), v);
        for (std::size_t i = 0; i < w; ++i) EXPECT_EQ(dst.at(off)[i], 10.0f + static_cast<float>(i)) << "lane " << i;
        EXPECT_TRUE(dst.guards_intact(off, w));
        EXPECT_TRUE(src.guards_intact(off, w));  // loads never write
    }
}

TYPED_TEST(Simd, LoadPartialZeroesUnusedLanesAndStaysInBounds) {
    using A = TypeParam;
    const std::size_t w = static_cast<std::size_t>(W<A>);
    for (std::size_t off = 0; off < w; ++off) {
        for (std::size_t n = 0; n < w; ++n) {  // documented range: n < lanes
            SCOPED_TRACE("offset " + std::to_string(off) + " n " + std::to_string(n));
            GuardedBuffer src;
            for (std::size_t i = 0; i < n; ++i) src.at(off)[i] = 1.0f + static_cast<float>(i);
            const auto got = lanes_of<A>(simd::load_partial<A>(src.at(off), static_cast<index_t>(n)));
            for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(got[i], 1.0f + static_cast<float>(i)) << "lane " << i;
            // A lane past n equal to kGuard would mean a read past p + n; it must be 0.
            for (std::size_t i = n; i < w; ++i) EXPECT_EQ(got[i], 0.0f) << "unused lane " << i;
            EXPECT_TRUE(src.guards_intact(off, n));
        }
    }
}

TYPED_TEST(Simd, StorePartialWritesExactlyNFloats) {
    using A = TypeParam;
    const std::size_t w = static_cast<std::size_t>(W<A>);
    std::vector<float> vals(w);
    for (std::size_t i = 0; i < w; ++i) vals[i] = 100.0f + static_cast<float>(i);
    const auto v = make<A>(vals);
    for (std::size_t off = 0; off < w; ++off) {
        for (std::size_t n = 0; n < w; ++n) {
            SCOPED_TRACE("offset " + std::to_string(off) + " n " + std::to_string(n));
            GuardedBuffer dst;
            simd::store_partial(dst.at(off), v, static_cast<index_t>(n));
            for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(dst.at(off)[i], vals[i]) << "lane " << i;
            EXPECT_TRUE(dst.guards_intact(off, n));
        }
    }
}

// The way kernels walk a row: full vectors with loadu/storeu, then one load_partial /
// store_partial tail. Lengths 1..3W+2 at every misalignment 0..W-1.
TYPED_TEST(Simd, RowWalkWithPartialTail) {
    using A = TypeParam;
    using V = simd::vfloat<A>;
    const index_t w = W<A>;
    for (index_t n = 1; n <= 3 * w + 2; ++n) {
        for (index_t off = 0; off < w; ++off) {
            SCOPED_TRACE("n " + std::to_string(n) + " offset " + std::to_string(off));
            GuardedBuffer src, dst;
            float* s = src.at(static_cast<std::size_t>(off));
            float* d = dst.at(static_cast<std::size_t>(off));
            for (index_t i = 0; i < n; ++i) s[i] = static_cast<float>(i + 1);
            V acc = simd::set1<A>(0.0f);
            index_t i = 0;
            for (; i + w <= n; i += w) {
                const V x = simd::loadu<A>(s + i);
                simd::storeu(d + i, x * simd::set1<A>(2.0f));
                acc += x;
            }
            if (i < n) {
                const V x = simd::load_partial<A>(s + i, n - i);
                simd::store_partial(d + i, x * simd::set1<A>(2.0f), n - i);
                acc += x;
            }
            for (index_t k = 0; k < n; ++k) EXPECT_EQ(d[k], 2.0f * static_cast<float>(k + 1)) << "index " << k;
            EXPECT_TRUE(dst.guards_intact(static_cast<std::size_t>(off), static_cast<std::size_t>(n)));
            EXPECT_TRUE(src.guards_intact(static_cast<std::size_t>(off), static_cast<std::size_t>(n)));
            // Small integers sum exactly; a nonzero unused lane (a read past the end) would show.
            EXPECT_EQ(simd::hsum(acc), static_cast<float>(n * (n + 1) / 2));
        }
    }
}

#if defined(ATTNKIT_TEST_HAVE_MMAP)
// Payloads that end exactly at (or start exactly at) an inaccessible page: an out-of-bounds
// access by any load or store crashes the test instead of passing unnoticed.
class GuardPages {
public:
    GuardPages() {
        page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        void* p = mmap(nullptr, 3 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return;
        base_ = static_cast<char*>(p);
        if (mprotect(base_, page_, PROT_NONE) != 0 || mprotect(base_ + 2 * page_, page_, PROT_NONE) != 0) {
            munmap(base_, 3 * page_);
            base_ = nullptr;
        }
    }
    ~GuardPages() {
        if (base_) munmap(base_, 3 * page_);
    }
    GuardPages(const GuardPages&) = delete;
    GuardPages& operator=(const GuardPages&) = delete;
    bool ok() const { return base_ != nullptr; }
    float* begin() const { return reinterpret_cast<float*>(base_ + page_); }
    float* end() const { return reinterpret_cast<float*>(base_ + 2 * page_); }

private:
    std::size_t page_ = 0;
    char* base_ = nullptr;
};

TYPED_TEST(Simd, PartialAccessAtPageBoundaries) {
    using A = TypeParam;
    const index_t w = W<A>;
    GuardPages pages;
    if (!pages.ok()) GTEST_SKIP() << "mmap/mprotect unavailable";
    for (index_t n = 0; n < w; ++n) {
        SCOPED_TRACE("n " + std::to_string(n));
        // Ends at the page end.
        float* p = pages.end() - n;
        for (index_t i = 0; i < n; ++i) p[i] = static_cast<float>(i + 1);
        auto got = lanes_of<A>(simd::load_partial<A>(p, n));
        for (index_t i = 0; i < w; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], i < n ? static_cast<float>(i + 1) : 0.0f);
        simd::store_partial(p, simd::set1<A>(-1.0f), n);
        for (index_t i = 0; i < n; ++i) EXPECT_EQ(p[i], -1.0f);
        // Starts at the page start.
        float* q = pages.begin();
        for (index_t i = 0; i < n; ++i) q[i] = static_cast<float>(i + 1);
        got = lanes_of<A>(simd::load_partial<A>(q, n));
        for (index_t i = 0; i < w; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], i < n ? static_cast<float>(i + 1) : 0.0f);
        simd::store_partial(q, simd::set1<A>(-2.0f), n);
        for (index_t i = 0; i < n; ++i) EXPECT_EQ(q[i], -2.0f);
    }
    // Full vectors flush against both boundaries.
    float* p = pages.end() - w;
    simd::storeu(p, simd::set1<A>(3.0f));
    for (float y : lanes_of<A>(simd::loadu<A>(p))) EXPECT_EQ(y, 3.0f);
    simd::storeu(pages.begin(), simd::set1<A>(4.0f));
    for (float y : lanes_of<A>(simd::loadu<A>(pages.begin()))) EXPECT_EQ(y, 4.0f);
}
#endif

// ---- arithmetic ----------------------------------------------------------------------------

TYPED_TEST(Simd, FmaMatchesFusedOrTwoRoundings) {
    using A = TypeParam;
    const std::size_t w = static_cast<std::size_t>(W<A>);
#if defined(__FMA__) || defined(__AVX512F__) || defined(__ARM_FEATURE_FMA)
    constexpr bool kFused = true;
#else
    const bool kFused = std::is_same<A, simd::scalar_arch>::value;  // std::fma
#endif
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> dist(-10.0f, 10.0f);
    for (int rep = 0; rep < 2000; ++rep) {
        std::vector<float> a(w), b(w), c(w);
        for (std::size_t i = 0; i < w; ++i) {
            a[i] = dist(rng);
            b[i] = dist(rng);
            c[i] = dist(rng);
        }
        const auto r = lanes_of<A>(simd::fma(make<A>(a), make<A>(b), make<A>(c)));
        for (std::size_t i = 0; i < w; ++i) {
            const double ab = static_cast<double>(a[i]) * b[i];  // exact
            const double exact = ab + c[i];
            if (kFused) {
                ASSERT_EQ(r[i], std::fma(a[i], b[i], c[i])) << a[i] << " * " << b[i] << " + " << c[i];
            } else {
                ASSERT_NEAR(r[i], exact, kUnfusedFmaTol * kEps * (std::fabs(ab) + std::fabs(exact)))
                    << a[i] << " * " << b[i] << " + " << c[i];
            }
        }
    }
    // Exactly representable products and sums are exact either way, lane by lane.
    std::vector<float> a(w), b(w), c(w);
    for (std::size_t i = 0; i < w; ++i) {
        a[i] = static_cast<float>(i) + 1.0f;
        b[i] = -0.5f * static_cast<float>(i) + 3.0f;
        c[i] = 7.0f - static_cast<float>(i);
    }
    const auto r = lanes_of<A>(simd::fma(make<A>(a), make<A>(b), make<A>(c)));
    for (std::size_t i = 0; i < w; ++i) EXPECT_EQ(r[i], a[i] * b[i] + c[i]) << "lane " << i;
    // Infinities and NaN propagate.
    for (float y : lanes_of<A>(simd::fma(simd::set1<A>(kInf), simd::set1<A>(2.0f), simd::set1<A>(1.0f)))) EXPECT_EQ(y, kInf);
    for (float y : lanes_of<A>(simd::fma(simd::set1<A>(kNaN), simd::set1<A>(2.0f), simd::set1<A>(1.0f)))) EXPECT_TRUE(std::isnan(y));
    for (float y : lanes_of<A>(simd::fma(simd::set1<A>(1.0f), simd::set1<A>(2.0f), simd::set1<A>(kNaN)))) EXPECT_TRUE(std::isnan(y));
}

TYPED_TEST(Simd, MaxMinLanewise) {
    using A = TypeParam;
    const std::size_t w = static_cast<std::size_t>(W<A>);
    std::mt19937 rng(99);
    std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
    for (int rep = 0; rep < 500; ++rep) {
        std::vector<float> a(w), b(w);
        for (std::size_t i = 0; i < w; ++i) {
            a[i] = dist(rng);
            b[i] = dist(rng);
        }
        if (rep % 5 == 0) a[static_cast<std::size_t>(rep) % w] = -kInf;
        if (rep % 7 == 0) b[static_cast<std::size_t>(rep) % w] = kInf;
        const auto mx = lanes_of<A>(simd::max(make<A>(a), make<A>(b)));
        const auto mn = lanes_of<A>(simd::min(make<A>(a), make<A>(b)));
        for (std::size_t i = 0; i < w; ++i) {
            ASSERT_EQ(mx[i], std::max(a[i], b[i])) << "lane " << i;
            ASSERT_EQ(mn[i], std::min(a[i], b[i])) << "lane " << i;
        }
    }
}

// Documented: max/min return their second operand when either operand is NaN, lane by lane.
TYPED_TEST(Simd, MaxMinNaNReturnsSecondOperand) {
    using A = TypeParam;
    const std::size_t w = static_cast<std::size_t>(W<A>);
    for (std::size_t nan_lane = 0; nan_lane < w; ++nan_lane) {
        SCOPED_TRACE("NaN in lane " + std::to_string(nan_lane));
        std::vector<float> x(w), y(w);
        for (std::size_t i = 0; i < w; ++i) {
            x[i] = 1.0f + static_cast<float>(i);
            y[i] = -2.0f * static_cast<float>(i) + 3.0f;
        }
        x[nan_lane] = kNaN;
        const auto X = make<A>(x);
        const auto Y = make<A>(y);
        // NaN first: the second operand (a number) comes back in that lane.
        auto mx = lanes_of<A>(simd::max(X, Y));
        auto mn = lanes_of<A>(simd::min(X, Y));
        // NaN second: the NaN comes back.
        auto mx2 = lanes_of<A>(simd::max(Y, X));
        auto mn2 = lanes_of<A>(simd::min(Y, X));
        for (std::size_t i = 0; i < w; ++i) {
            if (i == nan_lane) {
                EXPECT_EQ(mx[i], y[i]);
                EXPECT_EQ(mn[i], y[i]);
                EXPECT_TRUE(std::isnan(mx2[i]));
                EXPECT_TRUE(std::isnan(mn2[i]));
            } else {
                EXPECT_EQ(mx[i], std::max(x[i], y[i])) << "lane " << i;
                EXPECT_EQ(mn[i], std::min(x[i], y[i])) << "lane " << i;
                EXPECT_EQ(mx2[i], std::max(x[i], y[i])) << "lane " << i;
                EXPECT_EQ(mn2[i], std::min(x[i], y[i])) << "lane " << i;
            }
        }
    }
    // Both NaN: NaN. NaN against infinities: the second operand.
    for (float v : lanes_of<A>(simd::max(simd::set1<A>(kNaN), simd::set1<A>(kNaN)))) EXPECT_TRUE(std::isnan(v));
    for (float v : lanes_of<A>(simd::max(simd::set1<A>(kNaN), simd::set1<A>(-kInf)))) EXPECT_EQ(v, -kInf);
    for (float v : lanes_of<A>(simd::min(simd::set1<A>(kNaN), simd::set1<A>(kInf)))) EXPECT_EQ(v, kInf);
    for (float v : lanes_of<A>(simd::max(simd::set1<A>(kInf), simd::set1<A>(kNaN)))) EXPECT_TRUE(std::isnan(v));
    for (float v : lanes_of<A>(simd::min(simd::set1<A>(-kInf), simd::set1<A>(kNaN)))) EXPECT_TRUE(std::isnan(v));
}

TYPED_TEST(Simd, SelectPicksLaneByLane) {
    using A = TypeParam;
    const std::size_t w = static_cast<std::size_t>(W<A>);
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int rep = 0; rep < 200; ++rep) {
        std::vector<float> x(w), y(w), a(w), b(w);
        for (std::size_t i = 0; i < w; ++i) x[i] = dist(rng), y[i] = dist(rng), a[i] = dist(rng), b[i] = dist(rng);
        if (rep % 3 == 0) a[static_cast<std::size_t>(rep) % w] = kNaN;  // selected values pass through untouched
        const auto r = lanes_of<A>(simd::select(make<A>(x) < make<A>(y), make<A>(a), make<A>(b)));
        for (std::size_t i = 0; i < w; ++i) ASSERT_TRUE(same_bits(r[i], x[i] < y[i] ? a[i] : b[i])) << "lane " << i;
    }
}

TYPED_TEST(Simd, HsumMatchesDoubleSum) {
    using A = TypeParam;
    const std::size_t w = static_cast<std::size_t>(W<A>);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::uniform_int_distribution<int> expo(-30, 30);
    for (int rep = 0; rep < 3000; ++rep) {
        std::vector<float> x(w);
        for (std::size_t i = 0; i < w; ++i) {
            switch (rep % 3) {
                case 0: x[i] = uni(rng); break;
                case 1: x[i] = gauss(rng) * (rng() % 100 == 0 ? 20.0f : 1.0f); break;
                default: x[i] = std::ldexp(uni(rng), expo(rng)); break;  // wide dynamic range
            }
        }
        double sum = 0, abs_sum = 0;
        for (float v : x) {
            sum += v;
            abs_sum += std::fabs(v);
        }
        const float got = simd::hsum(make<A>(x));
        ASSERT_NEAR(got, sum, kHsumTolPerLane * static_cast<double>(w) * kEps * abs_sum) << "rep " << rep;
    }
    // Exact cases.
    EXPECT_EQ(simd::hsum(simd::set1<A>(1.0f)), static_cast<float>(w));
    EXPECT_EQ(simd::hsum(simd::set1<A>(0.0f)), 0.0f);
    std::vector<float> ramp(w);
    for (std::size_t i = 0; i < w; ++i) ramp[i] = static_cast<float>(i + 1);
    EXPECT_EQ(simd::hsum(make<A>(ramp)), static_cast<float>(w * (w + 1) / 2));
    // One lane decides: each lane contributes (catches a reduction that drops lanes).
    for (std::size_t k = 0; k < w; ++k) {
        std::vector<float> e(w, 0.0f);
        e[k] = 5.0f;
        EXPECT_EQ(simd::hsum(make<A>(e)), 5.0f) << "lane " << k;
        e[k] = kInf;
        EXPECT_EQ(simd::hsum(make<A>(e)), kInf) << "lane " << k;
        e[k] = kNaN;
        EXPECT_TRUE(std::isnan(simd::hsum(make<A>(e)))) << "lane " << k;
    }
}

TYPED_TEST(Simd, HmaxFiniteAndInfiniteLanes) {
    using A = TypeParam;
    const std::size_t w = static_cast<std::size_t>(W<A>);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-1e4f, 1e4f);
    for (int rep = 0; rep < 2000; ++rep) {
        std::vector<float> x(w);
        for (float& v : x) v = dist(rng);
        // Sprinkle -inf lanes (masked scores), never all of them here.
        for (std::size_t i = 0; i < w; ++i)
            if (rng() % 3 == 0) x[i] = -kInf;
        if (rep % 4 == 0) x[static_cast<std::size_t>(rep) % w] = dist(rng);
        const float expect = *std::max_element(x.begin(), x.end());
        ASSERT_EQ(simd::hmax(make<A>(x)), expect) << "rep " << rep;
    }
    // The maximum in each lane position is found.
    for (std::size_t k = 0; k < w; ++k) {
        std::vector<float> x(w, -5.0f);
        x[k] = 2.5f;
        EXPECT_EQ(simd::hmax(make<A>(x)), 2.5f) << "lane " << k;
        x[k] = kInf;
        EXPECT_EQ(simd::hmax(make<A>(x)), kInf) << "lane " << k;
    }
    // All lanes -inf (a fully masked block): -inf.
    EXPECT_EQ(simd::hmax(simd::set1<A>(-kInf)), -kInf);
    // Only one finite lane among -inf.
    for (std::size_t k = 0; k < w; ++k) {
        std::vector<float> x(w, -kInf);
        x[k] = -1e30f;
        EXPECT_EQ(simd::hmax(make<A>(x)), -1e30f) << "lane " << k;
    }
}

// Documented: NaN lanes are skipped unless all lanes are NaN (then NaN); -inf if all lanes are
// -inf. Checked with the NaN in every lane position, lane 0 included.
TYPED_TEST(Simd, HmaxNaNLanes) {
    using A = TypeParam;
    const std::size_t w = static_cast<std::size_t>(W<A>);
    EXPECT_TRUE(std::isnan(simd::hmax(simd::set1<A>(kNaN))));
    for (std::size_t k = 0; k < w; ++k) {
        SCOPED_TRACE("NaN in lane " + std::to_string(k));
        std::vector<float> x(w);
        for (std::size_t i = 0; i < w; ++i) x[i] = static_cast<float>((i * 7) % 5) - 2.0f;
        x[k] = kNaN;
        if (w == 1) {
            EXPECT_TRUE(std::isnan(simd::hmax(make<A>(x))));  // all (one) lanes NaN
            continue;
        }
        float expect = -kInf;
        for (std::size_t i = 0; i < w; ++i)
            if (i != k) expect = std::max(expect, x[i]);
        EXPECT_EQ(simd::hmax(make<A>(x)), expect);
        // NaN among -inf lanes: -inf (the NaN is skipped).
        std::vector<float> y(w, -kInf);
        y[k] = kNaN;
        EXPECT_EQ(simd::hmax(make<A>(y)), -kInf);
        // Only one number among NaN lanes: that number.
        std::vector<float> z(w, kNaN);
        z[k] = -3.0f;
        EXPECT_EQ(simd::hmax(make<A>(z)), -3.0f);
    }
}

// ---- exp2 / exp ----------------------------------------------------------------------------

// Dense sweep of [lo, hi]: n evenly spaced points plus both ends, as floats.
std::vector<float> sweep(double lo, double hi, std::size_t n) {
    std::vector<float> xs;
    xs.reserve(n + 2);
    for (std::size_t i = 0; i < n; ++i) {
        float x = static_cast<float>(lo + (hi - lo) * static_cast<double>(i) / static_cast<double>(n - 1));
        xs.push_back(std::min(std::max(x, static_cast<float>(lo)), static_cast<float>(hi)));
    }
    return xs;
}

// Adds the floats within `k` ulps of each c in centers (where a range reduction switches).
void add_neighbourhoods(std::vector<float>& xs, const std::vector<float>& centers, int k) {
    for (float c : centers) {
        float lo = c, hi = c;
        for (int i = 0; i < k; ++i) {
            lo = std::nextafter(lo, -kInf);
            hi = std::nextafter(hi, kInf);
            xs.push_back(lo);
            xs.push_back(hi);
        }
        xs.push_back(c);
    }
}

template <class A, class F, class Ref>
double max_rel_error(const std::vector<float>& xs, F f, Ref ref, float* worst_x) {
    const auto ys = map_lanes<A>(xs, f);
    double worst = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
        const long double r = ref(static_cast<long double>(xs[i]));
        const double e = static_cast<double>(std::fabs((static_cast<long double>(ys[i]) - r) / r));
        if (!(e <= worst)) {  // also catches NaN
            worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
            *worst_x = xs[i];
        }
    }
    return worst;
}

template <class A>
struct Exp2Fn {
    simd::vfloat<A> operator()(const simd::vfloat<A>& x) const { return simd::exp2(x); }
};
template <class A>
struct ExpFn {
    simd::vfloat<A> operator()(const simd::vfloat<A>& x) const { return simd::exp(x); }
};
template <class A>
struct TanhFn {
    simd::vfloat<A> operator()(const simd::vfloat<A>& x) const { return simd::tanh(x); }
};

template <class A, class F>
float eval1(F f, float x) {
    return lanes_of<A>(f(simd::set1<A>(x)))[0];
}

// Checks f on special inputs, broadcast to every lane and also placed in each single lane
// among ordinary values (so a lane-mixing bug cannot hide behind a uniform vector).
template <class A, class F>
void expect_special(F f, float x, float expect, float filler) {
    const std::size_t w = static_cast<std::size_t>(W<A>);
    auto check = [&](float got, const char* where, std::size_t lane) {
        if (std::isnan(expect))
            EXPECT_TRUE(std::isnan(got)) << where << " lane " << lane << ": f(" << x << ") = " << got;
        else
            EXPECT_TRUE(same_bits(got, expect))
                << where << " lane " << lane << ": f(" << x << ") = " << got << ", expected " << expect;
    };
    const auto all = lanes_of<A>(f(simd::set1<A>(x)));
    for (std::size_t i = 0; i < w; ++i) check(all[i], "broadcast", i);
    const float fill_out = eval1<A>(f, filler);
    for (std::size_t k = 0; k < w; ++k) {
        std::vector<float> in(w, filler);
        in[k] = x;
        const auto out = lanes_of<A>(f(make<A>(in)));
        check(out[k], "single", k);
        for (std::size_t i = 0; i < w; ++i)
            if (i != k) {
                EXPECT_TRUE(same_bits(out[i], fill_out)) << "neighbour lane " << i << " disturbed";
            }
    }
}

// NaNs with payloads (as produced by bit casts, or propagated from such inputs) must stay NaN.
std::vector<float> nan_inputs() {
    return {kNaN, -kNaN, float_from_bits(0x7fc00001u), float_from_bits(0x7fc00123u), float_from_bits(0xffc0ffffu),
            float_from_bits(0x7fffffffu), float_from_bits(0x7fa00000u) /* signalling */};
}

TYPED_TEST(Simd, Exp2RelativeErrorDenseSweep) {
    using A = TypeParam;
    std::vector<float> xs = sweep(-126.0, 127.0, std::size_t{1} << 21);
    // Where the rounding to n switches (half-integers) and at integers.
    std::vector<float> centers;
    for (int k = -126; k <= 126; ++k) {
        centers.push_back(static_cast<float>(k) + 0.5f);
        centers.push_back(static_cast<float>(k));
    }
    add_neighbourhoods(xs, centers, 8);
    xs.erase(std::remove_if(xs.begin(), xs.end(), [](float x) { return x < -126.0f || x > 127.0f; }), xs.end());
    float worst_x = 0;
    const double err = max_rel_error<A>(xs, Exp2Fn<A>{}, [](long double x) { return std::exp2(x); }, &worst_x);
    EXPECT_LT(err, kExpRelTol) << "worst at x = " << worst_x;
    std::printf("[ info     ] %s exp2 max rel error %.3g at x = %.9g\n", A::name(), err, worst_x);
}

TYPED_TEST(Simd, ExpRelativeErrorDenseSweep) {
    using A = TypeParam;
    std::vector<float> xs = sweep(-87.0, 88.0, std::size_t{1} << 21);
    std::vector<float> centers;
    for (int k = -125; k <= 126; ++k) centers.push_back((static_cast<float>(k) + 0.5f) * simd::kLn2);
    add_neighbourhoods(xs, centers, 8);
    xs.erase(std::remove_if(xs.begin(), xs.end(), [](float x) { return x < -87.0f || x > 88.0f; }), xs.end());
    float worst_x = 0;
    const double err = max_rel_error<A>(xs, ExpFn<A>{}, [](long double x) { return std::exp(x); }, &worst_x);
    EXPECT_LT(err, kExpRelTol) << "worst at x = " << worst_x;
    std::printf("[ info     ] %s exp max rel error %.3g at x = %.9g\n", A::name(), err, worst_x);
}

TYPED_TEST(Simd, Exp2ExactAtIntegers) {
    using A = TypeParam;
    std::vector<float> xs;
    for (int k = -126; k <= 127; ++k) xs.push_back(static_cast<float>(k));
    const auto ys = map_lanes<A>(xs, Exp2Fn<A>{});
    for (std::size_t i = 0; i < xs.size(); ++i)
        EXPECT_EQ(ys[i], std::ldexp(1.0f, static_cast<int>(xs[i]))) << "exp2(" << xs[i] << ")";
    EXPECT_EQ(eval1<A>(Exp2Fn<A>{}, 0.0f), 1.0f);
    EXPECT_EQ(eval1<A>(Exp2Fn<A>{}, -0.0f), 1.0f);
    EXPECT_EQ(eval1<A>(ExpFn<A>{}, 0.0f), 1.0f);
}

TYPED_TEST(Simd, Exp2SpecialValues) {
    using A = TypeParam;
    const Exp2Fn<A> f;
    const float below = std::nextafter(-126.0f, -kInf);
    const float above = std::nextafter(127.0f, kInf);
    // Exactly +0 below -126 (underflow flushes; masked scores = -inf give 0).
    for (float x : {below, -126.25f, -126.5f, -127.0f, -127.5f, -128.0f, -149.0f, -150.0f, -1000.0f, -1e30f,
                    -std::numeric_limits<float>::max(), -kInf})
        expect_special<A>(f, x, 0.0f, 0.5f);
    // +inf above 127.
    for (float x : {above, 127.25f, 127.5f, 127.99f, 128.0f, 129.0f, 1000.0f, 1e30f, std::numeric_limits<float>::max(), kInf})
        expect_special<A>(f, x, kInf, 0.5f);
    // The range ends themselves are finite and exact.
    expect_special<A>(f, -126.0f, std::numeric_limits<float>::min(), 0.5f);
    expect_special<A>(f, 127.0f, std::ldexp(1.0f, 127), 0.5f);
    // NaN in, NaN out (whatever its sign or payload).
    for (float x : nan_inputs()) expect_special<A>(f, x, kNaN, 0.5f);
}

TYPED_TEST(Simd, ExpSpecialValues) {
    using A = TypeParam;
    const ExpFn<A> f;
    // exp(x) = exp2(x * log2 e): 0 once x * log2 e < -126 (x < about -87.34), +inf once it is
    // above 127 (x > about 88.03). Points clearly past those thresholds:
    for (float x : {-87.5f, -88.0f, -100.0f, -104.0f, -1e4f, -1e30f, -std::numeric_limits<float>::max(), -kInf})
        expect_special<A>(f, x, 0.0f, 0.5f);
    for (float x : {88.1f, 88.5f, 89.0f, 100.0f, 1e4f, 1e30f, std::numeric_limits<float>::max(), kInf})
        expect_special<A>(f, x, kInf, 0.5f);
    for (float x : nan_inputs()) expect_special<A>(f, x, kNaN, 0.5f);
}

// Monotone (non-decreasing) over every float i * 2^-24 in [-2^-8, 2^-8], where consecutive
// results differ by less than one ulp, so any wobble of the polynomial would show.
TYPED_TEST(Simd, Exp2AndExpMonotoneNearZero) {
    using A = TypeParam;
    std::vector<float> xs;
    for (int i = -(1 << 16); i <= (1 << 16); ++i) xs.push_back(std::ldexp(static_cast<float>(i), -24));
    const auto y2 = map_lanes<A>(xs, Exp2Fn<A>{});
    const auto ye = map_lanes<A>(xs, ExpFn<A>{});
    for (std::size_t i = 1; i < xs.size(); ++i) {
        ASSERT_LE(y2[i - 1], y2[i]) << "exp2 decreases between " << xs[i - 1] << " and " << xs[i];
        ASSERT_LE(ye[i - 1], ye[i]) << "exp decreases between " << xs[i - 1] << " and " << xs[i];
    }
    EXPECT_LT(y2.front(), 1.0f);
    EXPECT_GT(y2.back(), 1.0f);
}

template <class A>
struct Exp2NonpositiveFn {
    simd::vfloat<A> operator()(const simd::vfloat<A>& x) const { return simd::exp2_nonpositive(x); }
};

// exp2_nonpositive is exp2 without the overflow handling: for every x <= 0 (and NaN) it must give
// exp2's bits, so it inherits exp2's accuracy, its 0 below -126 and its NaN rule.
TYPED_TEST(Simd, Exp2NonpositiveIsExp2ForNonpositiveX) {
    using A = TypeParam;
    std::vector<float> xs = sweep(-130.0, 0.0, std::size_t{1} << 20);
    std::vector<float> centers;
    for (int k = -128; k <= 0; ++k) {
        centers.push_back(static_cast<float>(k));
        centers.push_back(static_cast<float>(k) + 0.5f);
    }
    add_neighbourhoods(xs, centers, 4);
    xs.erase(std::remove_if(xs.begin(), xs.end(), [](float x) { return !(x <= 0.0f); }), xs.end());
    for (float x : {-0.0f, -1e-30f, -1e-40f /* subnormal */, -149.0f, -1000.0f, -std::numeric_limits<float>::max(), -kInf})
        xs.push_back(x);
    const auto want = map_lanes<A>(xs, Exp2Fn<A>{});
    const auto got = map_lanes<A>(xs, Exp2NonpositiveFn<A>{});
    for (std::size_t i = 0; i < xs.size(); ++i)
        ASSERT_TRUE(same_bits(got[i], want[i])) << "exp2_nonpositive(" << xs[i] << ") = " << got[i] << ", exp2 " << want[i];
    const Exp2NonpositiveFn<A> f;
    expect_special<A>(f, -kInf, 0.0f, -0.5f);
    expect_special<A>(f, 0.0f, 1.0f, -0.5f);
    for (float x : nan_inputs()) expect_special<A>(f, x, kNaN, -0.5f);
}

// ---- tanh ----------------------------------------------------------------------------------

TYPED_TEST(Simd, TanhAbsoluteErrorSweep) {
    using A = TypeParam;
    std::vector<float> xs = sweep(-20.0, 20.0, std::size_t{1} << 20);
    const std::vector<float> fine = sweep(-1.0, 1.0, std::size_t{1} << 18);  // where tanh bends
    xs.insert(xs.end(), fine.begin(), fine.end());
    add_neighbourhoods(xs, {0.625f, -0.625f, 0.5f, -0.5f, 1.0f, -1.0f, 9.0f, -9.0f}, 64);  // branch points
    for (float x : {1e-30f, -1e-30f, 1e-40f /* subnormal */, 1e-6f, -1e-6f, 30.0f, -30.0f, 1e4f, -1e4f, 1e30f, -1e30f})
        xs.push_back(x);
    const auto ys = map_lanes<A>(xs, TanhFn<A>{});
    double worst = 0;
    float worst_x = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
        const double ref = static_cast<double>(std::tanh(static_cast<long double>(xs[i])));
        const double err = std::fabs(static_cast<double>(ys[i]) - ref);
        const double tol = kTanhAbsTol * std::max(1.0, std::fabs(static_cast<double>(xs[i])));
        ASSERT_LE(err, tol) << "tanh(" << xs[i] << ") = " << ys[i] << ", reference " << ref;
        if (err > worst) {
            worst = err;
            worst_x = xs[i];
        }
    }
    std::printf("[ info     ] %s tanh max abs error %.3g at x = %.9g\n", A::name(), worst, worst_x);
}

TYPED_TEST(Simd, TanhSpecialValues) {
    using A = TypeParam;
    const TanhFn<A> f;
    expect_special<A>(f, 0.0f, 0.0f, 0.5f);
    expect_special<A>(f, kInf, 1.0f, 0.5f);
    expect_special<A>(f, -kInf, -1.0f, 0.5f);
    expect_special<A>(f, kNaN, kNaN, 0.5f);
    // Odd symmetry over a sweep.
    const std::vector<float> xs = sweep(0.0, 12.0, 4096);
    std::vector<float> neg(xs.size());
    std::transform(xs.begin(), xs.end(), neg.begin(), [](float x) { return -x; });
    const auto yp = map_lanes<A>(xs, f);
    const auto yn = map_lanes<A>(neg, f);
    for (std::size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(yp[i], -yn[i]) << "x = " << xs[i];
}

// ---- 16-bit storage loads (attnkit/simd/convert.hpp) ---------------------------------------
// Every one of the 65536 bit patterns of bfloat16 and of half, through the vector loads at every
// lane position, the partial loads and convert_row, against conversions written here from the
// formats' definitions (sign, exponent, fraction; in double). Both formats are subsets of float,
// so every result must be exact: compared bitwise, NaN as NaN.

double bf16_bits_to_double(std::uint16_t h) {
    const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;  // bfloat16 is float's top half
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return static_cast<double>(f);
}
double half_bits_to_double(std::uint16_t h) {
    const int sign = (h >> 15) & 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double x;
    if (e == 0) x = std::ldexp(static_cast<double>(m), -24);  // zero, subnormal
    else if (e == 31) x = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else x = std::ldexp(static_cast<double>(m + 1024), e - 25);
    return sign ? -x : x;
}

template <class T>
double bits_to_double(std::uint16_t h) {
    return std::is_same<T, Eigen::half>::value ? half_bits_to_double(h) : bf16_bits_to_double(h);
}

template <class T>
std::vector<T> all_patterns() {
    std::vector<T> v(65536 + 64);  // slack for loads starting near the end
    for (std::size_t i = 0; i < v.size(); ++i) {
        const std::uint16_t b = static_cast<std::uint16_t>(i);
        std::memcpy(static_cast<void*>(&v[i]), &b, sizeof(b));
    }
    return v;
}

template <class A, class T>
void expect_exact_loads() {
    constexpr index_t W = simd::kLanes<A>;
    const std::vector<T> src = all_patterns<T>();
    auto expect_lane = [](float got, std::size_t i) {
        const double want = bits_to_double<T>(static_cast<std::uint16_t>(i));
        if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got)) << "pattern 0x" << std::hex << i << " gave " << got;
        } else {
            ASSERT_EQ(static_cast<double>(got), want) << "pattern 0x" << std::hex << i;
            ASSERT_EQ(std::signbit(got), std::signbit(want)) << "sign of pattern 0x" << std::hex << i;
        }
    };
    // Offsets 0 .. W-1 so that every pattern passes through every lane.
    for (index_t off = 0; off < W; ++off) {
        float out[64];
        for (std::size_t i = static_cast<std::size_t>(off); i + static_cast<std::size_t>(W) <= 65536; i += W) {
            simd::storeu(out, simd::load_float<A>(src.data() + i));
            for (index_t u = 0; u < W; ++u) expect_lane(out[u], i + static_cast<std::size_t>(u));
        }
    }
    // Partial loads: n < W lanes, the rest zero, nothing read past p + n (a guard pattern there
    // would show up as a lane that is not zero).
    std::vector<T> guarded(static_cast<std::size_t>(2 * W));
    for (index_t n = 0; n < W; ++n)
        for (std::size_t i = 0; i + static_cast<std::size_t>(W) <= 65536; i += 977) {
            for (index_t u = 0; u < 2 * W; ++u) {
                const std::uint16_t b = u < n ? static_cast<std::uint16_t>(i + static_cast<std::size_t>(u)) : 0x7f80;
                std::memcpy(static_cast<void*>(&guarded[static_cast<std::size_t>(u)]), &b, sizeof(b));
            }
            float out[64];
            simd::storeu(out, simd::load_float_partial<A>(guarded.data(), n));
            for (index_t u = 0; u < n; ++u) expect_lane(out[u], i + static_cast<std::size_t>(u));
            for (index_t u = n; u < W; ++u) ASSERT_EQ(out[u], 0.0f) << "lane " << u << " of a partial load of " << n;
        }
    // convert_row over lengths around the lane width, and to_float.
    for (index_t n : {index_t(1), W - 1, W, W + 1, 3 * W + 2, index_t(13), index_t(257)}) {
        if (n <= 0) continue;
        std::vector<float> dst(static_cast<std::size_t>(n) + 1, kGuard);
        simd::convert_row<A>(src.data() + 1000, dst.data(), n);
        for (index_t i = 0; i < n; ++i) expect_lane(dst[static_cast<std::size_t>(i)], 1000 + static_cast<std::size_t>(i));
        ASSERT_EQ(dst[static_cast<std::size_t>(n)], kGuard) << "convert_row wrote past n = " << n;
    }
    for (std::size_t i = 0; i < 65536; ++i) expect_lane(simd::to_float(src[i]), i);
}

TYPED_TEST(Simd, Bfloat16LoadsAreExactForEveryPattern) { expect_exact_loads<TypeParam, Eigen::bfloat16>(); }
TYPED_TEST(Simd, HalfLoadsAreExactForEveryPattern) { expect_exact_loads<TypeParam, Eigen::half>(); }

// int8 (attnkit/int8_kv.hpp): every value, -128 included, through every lane, as full, partial
// and row loads; the sign extension is what a wrong widening gets wrong first.
TYPED_TEST(Simd, Int8LoadsAreExactForEveryValue) {
    using A = TypeParam;
    constexpr index_t W = simd::kLanes<A>;
    std::vector<std::int8_t> src(256 + 64);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::int8_t>(static_cast<std::uint8_t>(i));
    auto want = [&](std::size_t i) { return static_cast<float>(static_cast<std::int8_t>(static_cast<std::uint8_t>(i))); };
    for (std::size_t i = 0; i + static_cast<std::size_t>(W) <= src.size(); ++i) {
        float out[64];
        simd::storeu(out, simd::load_float<A>(src.data() + i));
        for (index_t u = 0; u < W; ++u) ASSERT_EQ(out[u], want(i + static_cast<std::size_t>(u))) << "offset " << i;
    }
    std::vector<std::int8_t> guarded(static_cast<std::size_t>(2 * W), std::int8_t(77));
    for (index_t n = 0; n < W; ++n) {
        for (index_t u = 0; u < n; ++u) guarded[static_cast<std::size_t>(u)] = static_cast<std::int8_t>(-128 + 37 * u);
        float out[64];
        simd::storeu(out, simd::load_float_partial<A>(guarded.data(), n));
        for (index_t u = 0; u < n; ++u) ASSERT_EQ(out[u], static_cast<float>(guarded[static_cast<std::size_t>(u)]));
        for (index_t u = n; u < W; ++u) ASSERT_EQ(out[u], 0.0f) << "lane " << u << " of a partial load of " << n;
    }
    for (index_t n : {index_t(1), W - 1, W, W + 1, 3 * W + 2, index_t(13), index_t(255)}) {
        if (n <= 0) continue;
        std::vector<float> dst(static_cast<std::size_t>(n) + 1, kGuard);
        simd::convert_row<A>(src.data() + 1, dst.data(), n);
        for (index_t i = 0; i < n; ++i) ASSERT_EQ(dst[static_cast<std::size_t>(i)], want(static_cast<std::size_t>(i) + 1));
        ASSERT_EQ(dst[static_cast<std::size_t>(n)], kGuard) << "convert_row wrote past n = " << n;
    }
}

// load_bf16_pairs: lane i of even is element 2i, of odd element 2i + 1, exactly, for every pattern.
TYPED_TEST(Simd, Bfloat16PairLoadsSplitEvenAndOddElements) {
    using A = TypeParam;
    constexpr index_t W = simd::kLanes<A>;
    const std::vector<Eigen::bfloat16> src = all_patterns<Eigen::bfloat16>();
    for (std::size_t i = 0; i + static_cast<std::size_t>(2 * W) <= 65536; i += static_cast<std::size_t>(2 * W) - 1) {
        simd::vfloat<A> e, o;
        simd::load_bf16_pairs<A>(src.data() + i, e, o);
        float ev[64], ov[64];
        simd::storeu(ev, e);
        simd::storeu(ov, o);
        for (index_t l = 0; l < W; ++l) {
            const double we = bf16_bits_to_double(static_cast<std::uint16_t>(i + 2 * static_cast<std::size_t>(l)));
            const double wo = bf16_bits_to_double(static_cast<std::uint16_t>(i + 2 * static_cast<std::size_t>(l) + 1));
            if (std::isnan(we)) ASSERT_TRUE(std::isnan(ev[l])); else ASSERT_EQ(static_cast<double>(ev[l]), we) << i << " lane " << l;
            if (std::isnan(wo)) ASSERT_TRUE(std::isnan(ov[l])); else ASSERT_EQ(static_cast<double>(ov[l]), wo) << i << " lane " << l;
        }
    }
}

// ---- streaming kernels (dot, stream_store) ---------------------------------------------------

// dot and dot_down over lengths around multiples of the 4-accumulator block (4W) and the lane
// width, at every misalignment: to float rounding of the double dot, exact on small integers,
// and the same bits on a second call (the summation order depends only on n and the arch).
TYPED_TEST(Simd, DotMatchesDoubleDot) {
    using A = TypeParam;
    const index_t w = W<A>;
    using dot_fn = float (*)(const float*, const float*, index_t) noexcept;
    const std::pair<dot_fn, const char*> fns[] = {{&simd::dot<A>, "dot"}, {&simd::dot_down<A>, "dot_down"}};
    for (const auto& [dot, name] : fns) {
        SCOPED_TRACE(name);
        std::mt19937 rng(23);
        std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
        std::vector<float> a(static_cast<std::size_t>(16 * w + 64)), b(a.size());
        for (index_t n = 0; n <= 9 * w + 3; ++n) {
            for (index_t off = 0; off < w; ++off) {
                SCOPED_TRACE("n " + std::to_string(n) + " offset " + std::to_string(off));
                for (std::size_t i = 0; i < a.size(); ++i) a[i] = dist(rng), b[i] = dist(rng);
                const float* pa = a.data() + off;
                const float* pb = b.data() + 2 * off;  // a and b misaligned differently
                double want = 0, mag = 0;
                for (index_t i = 0; i < n; ++i) {
                    want += static_cast<double>(pa[i]) * pb[i];
                    mag += std::fabs(static_cast<double>(pa[i]) * pb[i]);
                }
                const float got = dot(pa, pb, n);
                ASSERT_NEAR(got, want, static_cast<double>(n + w) * kEps * mag);
                ASSERT_TRUE(same_bits(dot(pa, pb, n), got));
            }
            std::vector<float> x(static_cast<std::size_t>(n)), y(static_cast<std::size_t>(n));
            double exact = 0;
            for (index_t i = 0; i < n; ++i) {
                x[static_cast<std::size_t>(i)] = static_cast<float>(i % 7) - 3.0f;
                y[static_cast<std::size_t>(i)] = static_cast<float>(i % 5) + 1.0f;
                exact += static_cast<double>(x[static_cast<std::size_t>(i)]) * y[static_cast<std::size_t>(i)];
            }
            EXPECT_EQ(dot(x.data(), y.data(), n), static_cast<float>(exact)) << "n " << n;
        }
    }
}

// stream_aligned accepts exactly the vector-aligned addresses; stream_store there writes one full
// vector and nothing else; store_fence orders it (and is callable on every target).
TYPED_TEST(Simd, StreamStoreWritesOneAlignedVector) {
    using A = TypeParam;
    const std::size_t w = static_cast<std::size_t>(W<A>);
    GuardedBuffer buf;  // 64-byte aligned, payloads from kPad = 32 floats on
    for (std::size_t off = 0; off < 16; ++off)
        EXPECT_EQ(simd::stream_aligned<A>(buf.at(off)), off % w == 0) << "offset " << off;
    std::vector<float> vals(w);
    for (std::size_t i = 0; i < w; ++i) vals[i] = 0.5f + static_cast<float>(i);
    for (std::size_t off = 0; off < 16; off += w) {
        GuardedBuffer dst;
        ASSERT_TRUE(simd::stream_aligned<A>(dst.at(off)));
        simd::stream_store(dst.at(off), make<A>(vals));
        simd::store_fence();
        for (std::size_t i = 0; i < w; ++i) EXPECT_EQ(dst.at(off)[i], vals[i]) << "offset " << off << " lane " << i;
        EXPECT_TRUE(dst.guards_intact(off, w));
    }
}

TYPED_TEST(Simd, HsumEachReducesEveryVector) {
    using A = TypeParam;
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    for (int trial = 0; trial < 200; ++trial) {
        float x[64 * 64];
        V v[64];
        for (index_t i = 0; i < W; ++i) {
            for (index_t l = 0; l < W; ++l) x[i * W + l] = u(gen);
            v[i] = simd::loadu<A>(x + i * W);
        }
        float out[64];
        simd::storeu(out, simd::hsum_each(v));
        for (index_t i = 0; i < W; ++i) {
            double want = 0, mag = 0;
            for (index_t l = 0; l < W; ++l) want += x[i * W + l], mag += std::fabs(x[i * W + l]);
            ASSERT_NEAR(out[i], want, kHsumTolPerLane * W * kEps * mag) << "vector " << i;
        }
    }
}

TYPED_TEST(Simd, TransposeExchangesRowsAndColumns) {
    using A = TypeParam;
    using V = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    float x[64 * 64], out[64 * 64];
    V v[64];
    for (index_t i = 0; i < W; ++i) {
        for (index_t l = 0; l < W; ++l) x[i * W + l] = static_cast<float>(i * 100 + l);  // every element distinct
        v[i] = simd::loadu<A>(x + i * W);
    }
    simd::transpose(v);
    for (index_t i = 0; i < W; ++i) simd::storeu(out + i * W, v[i]);
    for (index_t i = 0; i < W; ++i)
        for (index_t l = 0; l < W; ++l) ASSERT_EQ(out[i * W + l], x[l * W + i]) << "row " << i << " lane " << l;
}

}  // namespace
