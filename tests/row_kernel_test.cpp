// The decode row kernel (detail/row_kernel.hpp) through softmax_attention, where it runs: a few
// query rows per key/value head against long keys.
//
// What is covered:
//   gqa_ratios_storage_layouts  query rows per key/value head 1 to 8 (GQA groups 1, 2, 3, 4, 5, 8
//                       times Lq 1 to 3: the grouped rows of a head, kGroupRows, run in fours,
//                       twos and singles, and under causal and window masks a head's rows see
//                       different keys), and group 32 (MQA; past the row path's limit, the tile
//                       kernel); K/V in float, bfloat16 and half; token-major [B, L, Hk, D] and
//                       head-major [B, Hk, L, D] views; D and Dv around the lane width; Lk around
//                       the 8 streams of a step and the 64-key block, and long enough to split;
//                       against the oracle on the same stored values.
//   grouped_rows_equal_one_head_at_a_time  GQA gives, bit for bit, what MHA gives with each
//                       key/value head repeated for its query heads, wherever both run the row
//                       kernel: grouping the rows of a head changes which loads feed them, not
//                       their arithmetic.
//   threads_are_bitwise_identical  1, 2 and 3 threads (split-KV) with 16-bit GQA caches.
// Tolerances as softmax_attention_test: kOutEps / kLseEps times the magnitude of the problem.
#include "attnkit/detail/tile_traits.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/reference/softmax_attention.hpp"
#include "attnkit/thread_pool.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/softmax_checks.hpp"
#include "common/sweep.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::view;
using namespace attnkit_test;

constexpr index_t W = attnkit::simd::kLanes<attnkit::simd::default_arch>;

enum class kv_type { f32, bf16, f16 };
enum class mask { none, causal, window };

struct decode_case {
    index_t B, Lq, Lk, H, Hk, D, Dv;
    kv_type kv;
    mask m;
    bool head_major;
    std::uint64_t seed;
};

std::string name_of(const decode_case& c) {
    static const char* kv_names[] = {"f32", "bf16", "f16"};
    static const char* mask_names[] = {"full", "causal", "window"};
    std::ostringstream os;
    os << "B" << c.B << "_Lq" << c.Lq << "_Lk" << c.Lk << "_H" << c.H << "_Hk" << c.Hk << "_D" << c.D << "_Dv" << c.Dv
       << "_" << kv_names[static_cast<int>(c.kv)] << "_" << mask_names[static_cast<int>(c.m)]
       << (c.head_major ? "_head_major" : "_token_major");
    return os.str();
}

softmax_options options_of(const decode_case& c) {
    softmax_options o;
    o.causal = c.m != mask::none;
    if (c.m == mask::window) o.window_left = 37;
    return o;
}

// K or V of case c in storage T and layout: a tensor that owns the values and the view the
// kernel reads.
template <class T>
struct kv_tensor {
    tensor4<T> data;  // [B, L, Hk, n] or [B, Hk, L, n]
    view<const T, 4> v;
};

template <class T>
kv_tensor<T> make_kv(const tensor4<float>& x, bool head_major) {
    const index_t B = x.dimension(0), L = x.dimension(1), Hk = x.dimension(2), n = x.dimension(3);
    kv_tensor<T> r;
    if (!head_major) {
        r.data = stored_as<T>(x);
        r.v = view<const T, 4>(r.data.data(), {B, L, Hk, n}, {L * Hk * n, Hk * n, n, 1});
        return r;
    }
    r.data = tensor4<T>(B, Hk, L, n);
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < Hk; ++h)
                for (index_t d = 0; d < n; ++d) r.data(b, h, l, d) = T(x(b, l, h, d));
    r.v = bhld_as_bshd<const T>(r.data.data(), B, Hk, L, n);
    return r;
}

// The values the kernel reads, widened to float in [B, L, Hk, n] (for the tolerances).
template <class T>
tensor4<float> read_values(const view<const T, 4>& x) {
    tensor4<float> y(x.dims[0], x.dims[1], x.dims[2], x.dims[3]);
    for (index_t b = 0; b < x.dims[0]; ++b)
        for (index_t l = 0; l < x.dims[1]; ++l)
            for (index_t h = 0; h < x.dims[2]; ++h)
                for (index_t d = 0; d < x.dims[3]; ++d) y(b, l, h, d) = static_cast<float>(x(b, l, h, d));
    return y;
}

template <class T>
void check_case(const decode_case& c) {
    const tensor4<float> q = random_bshd(c.B, c.Lq, c.H, c.D, distribution::gaussian, c.seed);
    const kv_tensor<T> k = make_kv<T>(random_bshd(c.B, c.Lk, c.Hk, c.D, distribution::gaussian, c.seed + 1), c.head_major);
    const kv_tensor<T> v = make_kv<T>(random_bshd(c.B, c.Lk, c.Hk, c.Dv, distribution::gaussian, c.seed + 2), c.head_major);
    const softmax_options o = options_of(c);
    fast_result got = outputs_for<float>(q, read_values(v.v), kNaN);
    attnkit::softmax_attention(q, k.v, v.v, got.out, got.lse, o);
    ref_result want = outputs_for<double>(q, read_values(v.v), 0.0);
    attnkit::reference::softmax_attention(q, k.v, v.v, want.out, want.lse, o);
    const tensor4<float> kf = read_values(k.v), vf = read_values(v.v);
    EXPECT_TRUE(all_close(got.out, want.out, out_tolerance(q, kf, vf, o))) << "out";
    EXPECT_TRUE(all_close(got.lse, want.lse, lse_tolerance(q, kf, o))) << "lse";
}

// Every (D, Lk) pair meets the groups, query lengths and storage types in rotation: 7 groups x 3
// query lengths x 3 types = 63 cases, and D (7 values) and Lk (9 values) run through all 63
// pairs once since 7 and 9 are coprime. Masks and layouts rotate too. The reduced builds take
// every other case.
std::vector<decode_case> cases() {
    const index_t groups[] = {1, 2, 3, 4, 5, 8, 32};
    const index_t dims[] = {1, W - 1 > 0 ? W - 1 : 2, W, W + 1, 2 * W + 3, 64, 128};
    const index_t lengths[] = {1, 7, 8, 9, 63, 64, 65, 200, 1100};
    std::vector<decode_case> out;
    std::size_t i = 0;
    for (index_t G : groups)
        for (index_t Lq : {1, 2, 3})
            for (kv_type kv : {kv_type::f32, kv_type::bf16, kv_type::f16}) {
                const std::size_t at = i++;
                if (kReducedSweep && at % 2 == 1) continue;
                decode_case c;
                c.B = at % 4 == 0 ? 2 : 1;
                c.Hk = G == 32 ? 1 : (at % 3 == 0 ? 2 : 1);
                c.H = G * c.Hk;
                c.Lq = Lq;
                c.Lk = lengths[at % 9];
                c.D = dims[at % 7];
                c.Dv = at % 5 == 0 ? dims[(at + 3) % 7] : c.D;
                c.kv = kv;
                c.m = static_cast<mask>(at % 3);
                c.head_major = at % 2 == 0;
                c.seed = 1000 + 7 * at;
                out.push_back(c);
            }
    return out;
}

class gqa_ratios_storage_layouts : public ::testing::TestWithParam<decode_case> {};

TEST_P(gqa_ratios_storage_layouts, matches_reference_on_stored_values) {
    const decode_case& c = GetParam();
    switch (c.kv) {
        case kv_type::f32: check_case<float>(c); break;
        case kv_type::bf16: check_case<Eigen::bfloat16>(c); break;
        case kv_type::f16: check_case<Eigen::half>(c); break;
    }
}

INSTANTIATE_TEST_SUITE_P(row_kernel, gqa_ratios_storage_layouts, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<decode_case>& info) { return name_of(info.param); });

// Key/value head h of x repeated for each of its G query heads: [B, L, Hk * G, n].
template <class T>
tensor4<T> repeat_heads(const tensor4<T>& x, index_t G) {
    const index_t B = x.dimension(0), L = x.dimension(1), Hk = x.dimension(2), n = x.dimension(3);
    tensor4<T> y(B, L, Hk * G, n);
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l)
            for (index_t h = 0; h < Hk * G; ++h)
                for (index_t d = 0; d < n; ++d) y(b, l, h, d) = x(b, l, h / G, d);
    return y;
}

// Only where both calls take the row kernel: at most kRowKernelMaxRows query rows per
// key/value head (a GQA head's rows past it go to the tile kernel, whose sums run in another
// order).
template <class T>
void check_grouped_equals_repeated(index_t G, index_t Lq, index_t D, bool causal) {
    if (Lq * G > attnkit::detail::kRowKernelMaxRows<attnkit::simd::default_arch>) return;
    SCOPED_TRACE("G " + std::to_string(G) + " Lq " + std::to_string(Lq) + " D " + std::to_string(D));
    const index_t B = 1, Lk = 333, Hk = 2, H = G * Hk;
    const tensor4<float> q = random_bshd(B, Lq, H, D, distribution::gaussian, 71);
    const tensor4<T> k = stored_as<T>(random_bshd(B, Lk, Hk, D, distribution::gaussian, 72));
    const tensor4<T> v = stored_as<T>(random_bshd(B, Lk, Hk, D, distribution::gaussian, 73));
    softmax_options o;
    o.causal = causal;
    const fast_result grouped = run_fast(q, k, v, o);
    const fast_result single = run_fast(q, repeat_heads(k, G), repeat_heads(v, G), o);
    EXPECT_TRUE(bitwise_equal(grouped.out, single.out)) << "out";
    EXPECT_TRUE(bitwise_equal(grouped.lse, single.lse)) << "lse";
}

TEST(row_kernel, grouped_rows_equal_one_head_at_a_time) {
    for (index_t G : {2, 3, 4, 8})
        for (index_t D : {W + 1, index_t(64)}) {
            check_grouped_equals_repeated<Eigen::bfloat16>(G, 1, D, false);
            check_grouped_equals_repeated<Eigen::half>(G, 1, D, true);
            check_grouped_equals_repeated<float>(G, 1, D, false);
        }
    check_grouped_equals_repeated<Eigen::bfloat16>(2, 3, 64, true);
    check_grouped_equals_repeated<Eigen::half>(4, 2, 33, true);
}

TEST(row_kernel, threads_are_bitwise_identical) {
    const index_t B = 2, Lk = 3000, Hk = 2, H = 8, D = 64;
    const tensor4<float> q = random_bshd(B, 1, H, D, distribution::gaussian, 81);
    const tensor4<Eigen::bfloat16> k = stored_as<Eigen::bfloat16>(random_bshd(B, Lk, Hk, D, distribution::gaussian, 82));
    const tensor4<Eigen::half> v = stored_as<Eigen::half>(random_bshd(B, Lk, Hk, D, distribution::gaussian, 83));
    const tensor4<Eigen::half> k16 = stored_as<Eigen::half>(random_bshd(B, Lk, Hk, D, distribution::gaussian, 84));
    softmax_options o;
    o.key_lengths = {Lk, 1777};
    const fast_result one = run_fast(q, k, stored_as<Eigen::bfloat16>(widened(v)), o);
    const fast_result one16 = run_fast(q, k16, v, o);
    for (int n : {2, 3}) {
        attnkit::thread_pool pool(static_cast<std::size_t>(n));
        softmax_options on = o;
        on.pool = &pool;
        const fast_result many = run_fast(q, k, stored_as<Eigen::bfloat16>(widened(v)), on);
        const fast_result many16 = run_fast(q, k16, v, on);
        EXPECT_TRUE(bitwise_equal(one.out, many.out)) << n << " threads, bf16";
        EXPECT_TRUE(bitwise_equal(one.lse, many.lse)) << n << " threads, bf16";
        EXPECT_TRUE(bitwise_equal(one16.out, many16.out)) << n << " threads, f16";
        EXPECT_TRUE(bitwise_equal(one16.lse, many16.lse)) << n << " threads, f16";
    }
}

}  // namespace
