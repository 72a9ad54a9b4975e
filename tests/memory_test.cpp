// The fast kernel never materialises the Lq x Lk score matrix: at L = 16384 its peak resident
// memory stays within a few MiB of its inputs and outputs (the score matrix alone would be
// 8 GiB per head group). Linux only: reads VmHWM from /proc/self/status and resets it through
// /proc/self/clear_refs.
#include <gtest/gtest.h>

#include <attnkit/attnkit.hpp>

#include <cmath>
#include <fstream>
#include <string>

#include "common/random.hpp"
#include "common/tensor.hpp"

// Sanitizers' shadow memory and quarantine dwarf what is measured here.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ATTNKIT_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define ATTNKIT_TEST_SANITIZED 1
#endif
#endif

namespace {

bool sanitized() {
#ifdef ATTNKIT_TEST_SANITIZED
    return true;
#else
    return false;
#endif
}

// A "VmHWM:" (peak) or "VmRSS:" (current) line of /proc/self/status in KiB, or -1.
long proc_status_kib(const char* field) {
    std::ifstream status("/proc/self/status");
    std::string line;
    const std::string key(field);
    while (std::getline(status, line))
        if (line.rfind(key, 0) == 0) return std::stol(line.substr(key.size()));
    return -1;
}
long peak_rss_kib() { return proc_status_kib("VmHWM:"); }
long current_rss_kib() { return proc_status_kib("VmRSS:"); }

bool reset_peak_rss() {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    return static_cast<bool>(clear);
}

void expect_small_peak(const attnkit::softmax_options& opts, long limit_kib) {
    constexpr attnkit::index_t B = 1, L = 16384, H = 8, D = 128;
    auto q = attnkit_test::random_bshd<float>(B, L, H, D, attnkit_test::distribution::gaussian, 1);
    auto k = attnkit_test::random_bshd<float>(B, L, H, D, attnkit_test::distribution::gaussian, 2);
    auto v = attnkit_test::random_bshd<float>(B, L, H, D, attnkit_test::distribution::gaussian, 3);
    auto out = attnkit_test::make_bshd(B, L, H, D, 0.0f);  // touched: resident before the call
    Eigen::Tensor<float, 3, Eigen::RowMajor> lse(B, L, H);
    lse.setZero();

    if (sanitized()) GTEST_SKIP() << "sanitizer build: its own memory use would be measured";
    if (peak_rss_kib() < 0 || !reset_peak_rss()) GTEST_SKIP() << "no /proc/self/status or clear_refs";
    const long before = current_rss_kib();
    attnkit::softmax_attention(q, k, v, out, lse, opts);
    const long extra = peak_rss_kib() - before;
    ::testing::Test::RecordProperty("extra_peak_rss_kib", std::to_string(extra));
    EXPECT_LT(extra, limit_kib) << "peak RSS grew by " << extra << " KiB over inputs and outputs";
    EXPECT_TRUE(std::isfinite(out(0, L - 1, H - 1, D - 1)));
}

// A sliding window keeps the work small; the buffers are the same as for full attention.
TEST(memory, prefill_16k_window_stays_within_a_few_mib) {
    attnkit::thread_pool pool(2);
    attnkit::softmax_options opts;
    opts.causal = true;
    opts.window_left = 255;
    opts.pool = &pool;
    expect_small_peak(opts, 8 * 1024);
}

// Decode over a 16k cache takes the split-KV path with its partial buffers.
TEST(memory, decode_16k_stays_within_a_few_mib) {
    constexpr attnkit::index_t B = 1, L = 16384, H = 8, D = 128;
    auto q = attnkit_test::random_bshd<float>(B, 1, H, D, attnkit_test::distribution::gaussian, 4);
    auto k = attnkit_test::random_bshd<float>(B, L, H, D, attnkit_test::distribution::gaussian, 5);
    auto v = attnkit_test::random_bshd<float>(B, L, H, D, attnkit_test::distribution::gaussian, 6);
    auto out = attnkit_test::make_bshd(B, 1, H, D, 0.0f);
    attnkit::thread_pool pool(2);
    attnkit::softmax_options opts;
    opts.pool = &pool;
    if (sanitized()) GTEST_SKIP() << "sanitizer build: its own memory use would be measured";
    if (peak_rss_kib() < 0 || !reset_peak_rss()) GTEST_SKIP() << "no /proc/self/status or clear_refs";
    const long before = current_rss_kib();
    attnkit::softmax_attention(q, k, v, out, opts);
    const long extra = peak_rss_kib() - before;
    EXPECT_LT(extra, 2 * 1024) << "peak RSS grew by " << extra << " KiB";
}

}  // namespace
