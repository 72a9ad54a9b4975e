// The lse merge (detail/lse_merge.hpp) and its three users: attnkit::merge_partials, split-KV
// decode and attention sinks (docs/variants.md section 1, "Partial merge").
//
// The merge weights of two partial results must sum to 1 however large their lse: at lse = 1e6
// a float has a spacing of 0.06, so weights taken from a rounded combined lse
// (exp(lse_a - lse)) can be off by several percent. Every test here is written so that such an
// error is far outside its tolerance. Also: two softmax_attention calls over halves of the keys,
// merged, equal the whole call (one half fully masked, or both), and lse = +inf on either side.
#include "attnkit/softmax_attention.hpp"
#include "attnkit/reference/softmax_attention.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/compare.hpp"
#include "common/random.hpp"
#include "common/softmax_checks.hpp"
#include "common/tensor.hpp"

namespace {

using attnkit::index_t;
using attnkit::softmax_options;
using attnkit::view;
using namespace attnkit_test;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kEps = kEpsFloat;

// Exact merge in double: weights exp(l - max) / sum, the lse from the shifted sum.
struct merged {
    std::vector<double> o;
    double lse;
};
merged merge_in_double(const std::vector<double>& oa, double la, const std::vector<double>& ob, double lb) {
    if (la == -HUGE_VAL && lb == -HUGE_VAL) return {std::vector<double>(oa.size(), 0.0), -HUGE_VAL};
    const double mx = std::max(la, lb);
    const double wa = std::exp(la - mx), wb = std::exp(lb - mx);
    merged m{std::vector<double>(oa.size()), mx + std::log(wa + wb)};
    for (std::size_t c = 0; c < oa.size(); ++c) m.o[c] = (wa * oa[c] + wb * ob[c]) / (wa + wb);
    return m;
}

// ---- the detail function: one row ----------------------------------------------------------

TEST(merge_row, weights_sum_to_one_at_any_lse_magnitude) {
    // Both sides hold v = 1: any weights that do not sum to 1 show directly.
    for (float base : {0.0f, 1.0f, 1e3f, 1e4f, -1e4f, 1e6f, -1e6f, 3e7f, 1e30f}) {
        for (float gap : {0.0f, 0.25f, 1.0f, 7.5f, 30.0f, 200.0f}) {
            SCOPED_TRACE(::testing::Message() << "lse_a " << base << ", lse_b " << base + gap);
            std::vector<float> oa(5, 1.0f), ob(5, 1.0f);
            float lse = base;
            attnkit::detail::merge_row(oa.data(), lse, ob.data(), base + gap, 5);
            for (float x : oa) EXPECT_NEAR(1.0, x, 2 * kEps);
            // The combined lse is max + log(1 + e^-gap), rounded once at the magnitude of max.
            const double expect = static_cast<double>(base + gap) + std::log1p(std::exp(-static_cast<double>(gap)));
            EXPECT_NEAR(expect, lse, 2 * kEps * (std::fabs(expect) + 1.0));
        }
    }
}

TEST(merge_row, matches_the_double_merge_either_way_round) {
    const std::vector<double> va = random_values(7, distribution::gaussian, 31),
                              vb = random_values(7, distribution::gaussian, 32);
    for (float la : {-3.0f, 0.0f, 2.5f, 1e4f}) {
        for (float d : {-20.0f, -1.0f, 0.0f, 0.5f, 3.0f, 40.0f}) {
            const float lb = la + d;
            SCOPED_TRACE(::testing::Message() << "lse_a " << la << ", lse_b " << lb);
            std::vector<float> oa(va.begin(), va.end()), ob(vb.begin(), vb.end());
            std::vector<double> a(oa.begin(), oa.end()), b(ob.begin(), ob.end());
            const merged m = merge_in_double(a, la, b, lb);
            std::vector<float> ab = oa, ba = ob;
            float lab = la, lba = lb;
            attnkit::detail::merge_row(ab.data(), lab, ob.data(), lb, 7);
            attnkit::detail::merge_row(ba.data(), lba, oa.data(), la, 7);
            for (std::size_t c = 0; c < 7; ++c) {
                EXPECT_NEAR(m.o[c], ab[c], 4 * kEps * 3.0) << c;
                EXPECT_NEAR(m.o[c], ba[c], 4 * kEps * 3.0) << c;
            }
            EXPECT_NEAR(m.lse, lab, 2 * kEps * (std::fabs(m.lse) + 1.0));
            EXPECT_NEAR(m.lse, lba, 2 * kEps * (std::fabs(m.lse) + 1.0));
        }
    }
}

TEST(merge_row, empty_sides_nan_and_zero_valued_side) {
    std::vector<float> o{1.0f, 2.0f};
    const std::vector<float> b{3.0f, 4.0f};
    float lse = -kInf;
    attnkit::detail::merge_row(o.data(), lse, b.data(), 0.5f, 2);  // empty a takes b as it is
    EXPECT_EQ(b, o);
    EXPECT_EQ(0.5f, lse);
    attnkit::detail::merge_row(o.data(), lse, b.data(), -kInf, 2);  // empty b changes nothing
    EXPECT_EQ(b, o);
    EXPECT_EQ(0.5f, lse);
    // A zero-valued side with equal lse (a sink as heavy as the keys) halves the output.
    attnkit::detail::merge_row(o.data(), lse, nullptr, 0.5f, 2);
    EXPECT_NEAR(1.5, o[0], 2 * kEps);
    EXPECT_NEAR(2.0, o[1], 2 * kEps);
    EXPECT_NEAR(0.5 + std::log(2.0), lse, 2 * kEps);
    // A far heavier zero side: the small weight keeps its relative precision.
    o = {1.0f, 1.0f};
    lse = 0.0f;
    attnkit::detail::merge_row(o.data(), lse, nullptr, 60.0f, 2);
    EXPECT_NEAR(std::exp(-60.0), o[0], 4 * kEps * std::exp(-60.0));
    // NaN in either lse gives NaN.
    o = {1.0f, 1.0f};
    lse = std::nanf("");
    attnkit::detail::merge_row(o.data(), lse, b.data(), 1.0f, 2);
    EXPECT_TRUE(std::isnan(o[0]) && std::isnan(lse));
}

// ---- attnkit::merge_partials ---------------------------------------------------------------

// lse = +inf (scores past the float range): a side at +inf outweighs a finite one, and two
// sides at +inf are a tie, the mean of the outputs with lse = +inf (their difference used to
// make both NaN).
TEST(merge_partials, both_lse_plus_inf_give_the_mean) {
    const index_t B = 1, L = 2, H = 1, Dv = 3;
    tensor4<float> oa(B, L, H, Dv), ob(B, L, H, Dv), out(B, L, H, Dv);
    tensor3<float> la(B, L, H), lb(B, L, H), lse(B, L, H);
    for (index_t c = 0; c < Dv; ++c) {
        oa(0, 0, 0, c) = oa(0, 1, 0, c) = 1.0f + static_cast<float>(c);
        ob(0, 0, 0, c) = ob(0, 1, 0, c) = -3.0f * static_cast<float>(c);
    }
    la(0, 0, 0) = lb(0, 0, 0) = kInf;                // both +inf: the mean
    la(0, 1, 0) = 5.0f, lb(0, 1, 0) = kInf;          // one +inf: that side
    attnkit::merge_partials(oa, la, ob, lb, out, lse);
    for (index_t c = 0; c < Dv; ++c) {
        EXPECT_EQ(0.5f * (oa(0, 0, 0, c) + ob(0, 0, 0, c)), out(0, 0, 0, c)) << c;
        EXPECT_EQ(ob(0, 1, 0, c), out(0, 1, 0, c)) << c;
    }
    EXPECT_EQ(kInf, lse(0, 0, 0));
    EXPECT_EQ(kInf, lse(0, 1, 0));
    // Either way round, and through the row merge the engine uses.
    std::vector<float> o{2.0f, 4.0f};
    const std::vector<float> b{6.0f, 0.0f};
    float l = kInf;
    attnkit::detail::merge_row(o.data(), l, b.data(), kInf, 2);
    EXPECT_EQ(4.0f, o[0]);
    EXPECT_EQ(2.0f, o[1]);
    EXPECT_EQ(kInf, l);
}

TEST(merge_partials, normalised_at_lse_1e6) {
    const index_t B = 1, L = 2, H = 3, Dv = 4;
    tensor4<float> oa = make_bshd(B, L, H, Dv, 1.0f), ob = make_bshd(B, L, H, Dv, 1.0f);
    tensor3<float> la = make_lse(B, L, H, 1e6f), lb = make_lse(B, L, H, 1e6f);
    lb(0, 1, 2) = 1e6f + 0.5f;
    tensor4<float> out = make_bshd(B, L, H, Dv, 7.0f);
    tensor3<float> lse = make_lse(B, L, H, 7.0f);
    attnkit::merge_partials(oa, la, ob, lb, out, lse);
    EXPECT_TRUE(all_close(out, make_bshd(B, L, H, Dv, 1.0f), 2 * kEps, 0.0));
    EXPECT_NEAR(1e6 + std::log(2.0), lse(0, 0, 0), 0.07);  // one float spacing at 1e6
}

TEST(merge_partials, random_partials_against_double) {
    const index_t B = 2, L = 3, H = 2, Dv = 5;
    const tensor4<float> oa = random_bshd(B, L, H, Dv, distribution::gaussian, 41),
                         ob = random_bshd(B, L, H, Dv, distribution::gaussian, 42);
    tensor3<float> la(B, L, H), lb(B, L, H);
    const std::vector<double> r = random_values(static_cast<std::size_t>(2 * B * L * H), distribution::outliers, 43);
    for (index_t i = 0; i < B * L * H; ++i) {
        la.data()[i] = static_cast<float>(5e3 * r[static_cast<std::size_t>(i)]);
        lb.data()[i] = la.data()[i] + static_cast<float>(4.0 * r[static_cast<std::size_t>(B * L * H + i)]);
    }
    la(1, 2, 1) = -kInf;  // an empty side
    tensor4<float> out(B, L, H, Dv);
    tensor3<float> lse(B, L, H);
    attnkit::merge_partials(oa, la, ob, lb, out, lse);
    for_each_index<3>({B, L, H}, [&](const std::array<index_t, 3>& i) {
        std::vector<double> a(Dv), b(Dv);
        for (index_t c = 0; c < Dv; ++c) a[c] = oa(i[0], i[1], i[2], c), b[c] = ob(i[0], i[1], i[2], c);
        const merged m = merge_in_double(a, la(i[0], i[1], i[2]), b, lb(i[0], i[1], i[2]));
        for (index_t c = 0; c < Dv; ++c) ASSERT_NEAR(m.o[c], out(i[0], i[1], i[2], c), 16 * kEps * 4.0);
        ASSERT_NEAR(m.lse, lse(i[0], i[1], i[2]), 2 * kEps * (std::fabs(m.lse) + 1.0));
    });
}

// In place (out is out_a or out_b, lse is lse_a or lse_b) gives the same numbers; any other
// sharing of memory between an output and an argument is rejected before anything is written;
// lse views take any strides ([B, H, Lq] as FlashAttention stores it).
TEST(merge_partials, in_place_overlap_and_strided_lse) {
    const index_t B = 2, L = 3, H = 2, Dv = 4;
    const tensor4<float> oa = random_bshd(B, L, H, Dv, distribution::gaussian, 71),
                         ob = random_bshd(B, L, H, Dv, distribution::gaussian, 72);
    tensor3<float> la(B, L, H), lb(B, L, H);
    for (index_t i = 0; i < la.size(); ++i) la.data()[i] = 0.3f * i, lb.data()[i] = 2.0f - 0.2f * i;
    tensor4<float> out(B, L, H, Dv);
    tensor3<float> lse(B, L, H);
    attnkit::merge_partials(oa, la, ob, lb, out, lse);

    tensor4<float> a = oa, b = ob;
    tensor3<float> lsa = la, lsb = lb;
    attnkit::merge_partials(a, lsa, ob, lb, a, lsa);  // into the first side
    EXPECT_TRUE(all_close(a, out, 0.0, 0.0));
    EXPECT_TRUE(all_close(lsa, lse, 0.0, 0.0));
    attnkit::merge_partials(oa, la, b, lsb, b, lsb);  // into the second side
    EXPECT_TRUE(all_close(b, out, 0.0, 0.0));
    EXPECT_TRUE(all_close(lsb, lse, 0.0, 0.0));

    // lse_a, lse_b and lse in [B, H, Lq] buffers.
    std::vector<float> bhl_a(static_cast<std::size_t>(B * H * L)), bhl_b(bhl_a.size()), bhl(bhl_a.size(), 7.0f);
    const std::array<index_t, 3> dims{B, L, H}, strides{H * L, 1, L};
    const view<float, 3> va(bhl_a.data(), dims, strides), vb(bhl_b.data(), dims, strides), vl(bhl.data(), dims, strides);
    for_each_index<3>(dims, [&](const std::array<index_t, 3>& i) {
        va(i[0], i[1], i[2]) = la(i[0], i[1], i[2]);
        vb(i[0], i[1], i[2]) = lb(i[0], i[1], i[2]);
    });
    tensor4<float> out2(B, L, H, Dv);
    attnkit::merge_partials(oa, va, ob, vb, out2, vl);
    EXPECT_TRUE(all_close(out2, out, 0.0, 0.0));
    EXPECT_TRUE(all_close(vl, lse, 0.0, 0.0));

    // Overlaps: out half over out_a, lse inside out, out over lse_b's memory.
    std::vector<float> buf(static_cast<std::size_t>(3 * B * L * H * Dv), 7.0f);
    const view<float, 4> o1(buf.data(), {B, L, H, Dv}), o2(buf.data() + 5, {B, L, H, Dv});
    for_each_index<4>(o1.dims, [&](const std::array<index_t, 4>& i) { o1(i[0], i[1], i[2], i[3]) = 1.0f; });
    tensor3<float> l1 = la;
    EXPECT_THROW(attnkit::merge_partials(o1, la, ob, lb, o2, l1), std::invalid_argument);
    const view<float, 3> l_in_out(buf.data() + 3, {B, L, H});
    EXPECT_THROW(attnkit::merge_partials(oa, la, ob, lb, o1, l_in_out), std::invalid_argument);
    const view<float, 4> o_over_lb(lb.data(), {1, 1, 1, 3});
    const view<float, 3> one(l1.data(), {1, 1, 1});
    tensor4<float> oa1(1, 1, 1, 3), ob1(1, 1, 1, 3);
    tensor3<float> la1(1, 1, 1), lb1 = make_lse(1, 1, 1, 0.0f);
    oa1.setConstant(1.0f), ob1.setConstant(1.0f), la1.setConstant(0.0f);
    EXPECT_THROW(attnkit::merge_partials(oa1, la1, ob1, view<const float, 3>(lb.data(), {1, 1, 1}), o_over_lb, one),
                 std::invalid_argument);
    EXPECT_EQ(2.0f, lb(0, 0, 0));  // nothing written
    EXPECT_EQ(7.0f, buf[5 + B * L * H * Dv]);
}

// ---- merging two softmax_attention calls over halves of the keys ---------------------------

TEST(merge_partials, two_key_halves_equal_the_whole_call) {
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
        const fast_result a = run_fast(q, sequence_view(k, 0, g.split), sequence_view(v, 0, g.split), o);
        tensor4<float> kb = make_bshd<float>(g.B, g.Lk - g.split, g.Hk, g.D),
                       vb = make_bshd<float>(g.B, g.Lk - g.split, g.Hk, g.Dv);
        copy_into(kb, sequence_view(k, g.split, g.Lk - g.split));
        copy_into(vb, sequence_view(v, g.split, g.Lk - g.split));
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

        // Order does not matter up to rounding (in place: in_place_overlap_and_strided_lse).
        fast_result swapped{make_bshd<float>(g.B, g.Lq, g.H, g.Dv, kNaN),
                            make_lse<float>(g.B, g.Lq, g.H, kNaN)};
        attnkit::merge_partials(b.out, b.lse, a.out, a.lse, swapped.out, swapped.lse);
        EXPECT_TRUE(all_close(swapped.out, merged.out, out_tolerance(q, k, v, o)));
    }
}

TEST(merge_partials, a_fully_masked_half) {
    const index_t B = 3, Lq = 20, Lk = 150, H = 4, Hk = 2, D = 32, split = 70;
    const tensor4<float> q = random_bshd(B, Lq, H, D, distribution::gaussian, 31);
    const tensor4<float> k = random_bshd(B, Lk, Hk, D, distribution::gaussian, 32);
    const tensor4<float> v = random_bshd(B, Lk, Hk, D, distribution::gaussian, 33);
    const auto ka = sequence_view(k, 0, split), va = sequence_view(v, 0, split);
    const auto kb = sequence_view(k, split, Lk - split), vb = sequence_view(v, split, Lk - split);

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

// ---- the fast kernel's split-KV and sink paths ---------------------------------------------

// Every score of a row equals `logit` exactly, whatever the order of a dot product's terms:
// q = (logit, 0, ...), every key k_j = (1, 0, ...), scale 1. All weights are then equal.
struct equal_logits {
    tensor4<float> q, k;
};
equal_logits make_equal_logits(index_t Lq, index_t Lk, index_t H, index_t D, float logit) {
    equal_logits e{make_bshd(1, Lq, H, D), make_bshd(1, Lk, H, D)};
    for (index_t i = 0; i < e.q.size(); i += D) e.q.data()[i] = logit;
    for (index_t i = 0; i < e.k.size(); i += D) e.k.data()[i] = 1.0f;
    return e;
}

TEST(softmax_attention_split, equal_logits_1e4_stay_normalised) {
    // Lk = 300 runs unsplit; 1024 and longer run split-KV for a single decode row. With v = 1 both
    // must give 1: the probabilities are all equal, only the merge can lose mass.
    for (index_t Lk : {300, 1024, 4099, 16384}) {
        for (float logit : {1e2f, 1e4f, -1e4f}) {
            SCOPED_TRACE(::testing::Message() << "Lk " << Lk << ", logit " << logit);
            const index_t H = 2, D = 16;
            const equal_logits e = make_equal_logits(1, Lk, H, D, logit);
            const tensor4<float> v = make_bshd(1, Lk, H, 8, 1.0f);
            tensor4<float> out = make_bshd(1, 1, H, 8, 7.0f);
            tensor3<float> lse = make_lse(1, 1, H, 7.0f);
            softmax_options o;
            o.scale = 1.0f;
            attnkit::softmax_attention(e.q, e.k, v, out, lse, o);
            EXPECT_TRUE(all_close(out, make_bshd(1, 1, H, 8, 1.0f), 4 * kEps, 0.0));
            // lse = logit + log(Lk): the logit itself carries an error of eps * |logit| (the
            // dot product in float), the merge adds no more than a few spacings on top.
            const double expect = static_cast<double>(logit) + std::log(static_cast<double>(Lk));
            for (index_t h = 0; h < H; ++h) EXPECT_NEAR(expect, lse(0, 0, h), 8 * kEps * (std::fabs(expect) + 1.0));
        }
    }
}

TEST(softmax_attention_split, split_and_unsplit_agree_with_the_reference_at_large_logits) {
    // Equal scores, values 1 + u/2 with u uniform in [-1, 1]: every weight is 1/Lk and out is the
    // mean of v, near 1. A merge whose weights sum to 1 - 4e-4 (the old error at 1e4) is far
    // outside 64 eps; float sums over 2048 values stay inside it.
    for (index_t Lk : {500, 2048}) {
        SCOPED_TRACE(::testing::Message() << "Lk " << Lk);
        const index_t H = 2, D = 8, Dv = 6;
        const equal_logits e = make_equal_logits(1, Lk, H, D, 1e4f);
        tensor4<float> v = random_bshd(1, Lk, H, Dv, distribution::uniform, 51);
        for (index_t i = 0; i < v.size(); ++i) v.data()[i] = 1.0f + 0.5f * v.data()[i];
        tensor4<float> out(1, 1, H, Dv);
        tensor4<double> ref(1, 1, H, Dv);
        softmax_options o;
        o.scale = 1.0f;
        attnkit::softmax_attention(e.q, e.k, v, out, o);
        attnkit::reference::softmax_attention(e.q, e.k, v, ref, o);
        EXPECT_TRUE(all_close(out, ref, 64 * kEps, 0.0));
    }
}

TEST(softmax_attention_split, sink_as_heavy_as_the_keys_halves_the_output) {
    // Sink logit = the keys' lse: the sink takes exactly half of the mass. v = 1, so out = 1/2.
    for (index_t Lk : {100, 2048}) {
        for (float logit : {0.0f, 1e4f}) {
            SCOPED_TRACE(::testing::Message() << "Lk " << Lk << ", logit " << logit);
            const index_t H = 2, D = 16;
            const equal_logits e = make_equal_logits(1, Lk, H, D, logit);
            const tensor4<float> v = make_bshd(1, Lk, H, 4, 1.0f);
            tensor4<float> out(1, 1, H, 4);
            tensor3<float> keys_lse(1, 1, H);
            softmax_options o;
            o.scale = 1.0f;
            attnkit::softmax_attention(e.q, e.k, v, out, keys_lse, o);
            o.sinks = {keys_lse(0, 0, 0), keys_lse(0, 0, 1)};
            tensor3<float> lse(1, 1, H);
            attnkit::softmax_attention(e.q, e.k, v, out, lse, o);
            EXPECT_TRUE(all_close(out, make_bshd(1, 1, H, 4, 0.5f), 4 * kEps, 0.0));
            for (index_t h = 0; h < H; ++h)
                EXPECT_NEAR(static_cast<double>(keys_lse(0, 0, h)) + std::log(2.0), lse(0, 0, h),
                            2 * kEps * (std::fabs(keys_lse(0, 0, h)) + 1.0));
        }
    }
}

}  // namespace
