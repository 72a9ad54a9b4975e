// Per-thread scratch (detail/scratch.hpp): after a thread's first call of a shape, a decode call
// allocates nothing, so its time does not depend on how the allocator serves a block.
//
// The global operator new and delete are replaced in this program by counting ones; a call is
// run once to warm the calling thread's scratch, then the count across the next calls must be
// zero. Covered: softmax_attention decode (MHA and GQA; float, bfloat16 and half K/V;
// token-major and head-major views; a cache long enough to be split into pieces; key_lengths),
// paged_attention and softmax_attention_varlen decode, taylor_attention decode (the quadratic
// form through the same driver), one thread; the decode states' steps
// (taylor_state past its fold and in the linear form, and in the quadratic form after
// reserve; mta_state after reserve, every stage on; self_gating_state). With a thread pool the pieces go to whichever thread
// takes them, so a thread may meet a kind of piece for the first time in a later call; what
// holds there is that the scratch stops growing once each thread has met each kind.
//   scratch_lease   leases nest, end in reverse order and keep their capacity.
#include "attnkit/detail/scratch.hpp"
#include "attnkit/mta_state.hpp"
#include "attnkit/paged_attention.hpp"
#include "attnkit/self_gating_attention.hpp"
#include "attnkit/softmax_attention.hpp"
#include "attnkit/taylor_attention.hpp"
#include "attnkit/taylor_state.hpp"
#include "attnkit/varlen_attention.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "common/random.hpp"
#include "common/tensor.hpp"

namespace {

std::atomic<long> g_allocations{0};

void* counted(std::size_t n) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
    throw std::bad_alloc();
}

void* counted_aligned(std::size_t n, std::align_val_t al) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    const std::size_t a = static_cast<std::size_t>(al);
    const std::size_t size = (n + a - 1) / a * a;
    if (void* p = std::aligned_alloc(a, size == 0 ? a : size)) return p;
    throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t n) { return counted(n); }
void* operator new[](std::size_t n) { return counted(n); }
void* operator new(std::size_t n, std::align_val_t al) { return counted_aligned(n, al); }
void* operator new[](std::size_t n, std::align_val_t al) { return counted_aligned(n, al); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using attnkit::index_t;
using attnkit::view;
using namespace attnkit_test;

// Allocations made by f().
template <class F>
long allocations_of(F&& f) {
    const long before = g_allocations.load();
    f();
    return g_allocations.load() - before;
}

template <class T>
void expect_decode_allocates_nothing(index_t B, index_t Lk, index_t H, index_t Hk, index_t D, bool head_major,
                                     bool lengths) {
    SCOPED_TRACE("B " + std::to_string(B) + " Lk " + std::to_string(Lk) + " H " + std::to_string(H) + " Hk " +
                 std::to_string(Hk) + " D " + std::to_string(D) + (head_major ? " head-major" : ""));
    const tensor4<float> q = random_bshd(B, 1, H, D, distribution::gaussian, 5);
    const tensor4<T> k = stored_as<T>(random_bshd(B, Lk, Hk, D, distribution::gaussian, 6));
    const tensor4<T> v = stored_as<T>(random_bshd(B, Lk, Hk, D, distribution::gaussian, 7));
    // Head-major: the same tensors' memory read as [B, Hk, L, D] (values differ; the shape is
    // what matters here).
    const view<const T, 4> kv = head_major ? bhld_as_bshd<const T>(k.data(), B, Hk, Lk, D)
                                           : view<const T, 4>(k.data(), {B, Lk, Hk, D}, {Lk * Hk * D, Hk * D, D, 1});
    const view<const T, 4> vv = head_major ? bhld_as_bshd<const T>(v.data(), B, Hk, Lk, D)
                                           : view<const T, 4>(v.data(), {B, Lk, Hk, D}, {Lk * Hk * D, Hk * D, D, 1});
    tensor4<float> out(B, 1, H, D);
    tensor3<float> lse(B, 1, H);
    attnkit::softmax_options o;
    if (lengths) {
        o.key_lengths.assign(static_cast<std::size_t>(B), Lk);
        o.key_lengths.back() = Lk / 2 + 1;
    }
    attnkit::softmax_attention(q, kv, vv, out, lse, o);  // warms this thread's scratch
    for (int rep = 0; rep < 3; ++rep)
        EXPECT_EQ(allocations_of([&] { attnkit::softmax_attention(q, kv, vv, out, lse, o); }), 0) << "call " << rep;
}

TEST(scratch, softmax_decode_allocates_nothing_after_the_first_call) {
    expect_decode_allocates_nothing<float>(1, 4096, 8, 8, 128, false, false);
    expect_decode_allocates_nothing<float>(2, 777, 32, 8, 64, true, true);
    expect_decode_allocates_nothing<Eigen::bfloat16>(1, 16384, 32, 8, 128, false, false);
    expect_decode_allocates_nothing<Eigen::bfloat16>(2, 300, 8, 2, 33, true, true);
    expect_decode_allocates_nothing<Eigen::half>(1, 5000, 16, 2, 64, true, false);
    expect_decode_allocates_nothing<Eigen::half>(3, 100, 4, 4, 17, false, true);
}

TEST(scratch, paged_decode_allocates_nothing_after_the_first_call) {
    const index_t B = 2, H = 8, Hk = 2, D = 64, page_rows = 64, pages_per_seq = 20, P = B * pages_per_seq;
    const tensor4<float> k = random_bshd(P, page_rows, Hk, D, distribution::gaussian, 8);
    const tensor4<float> v = random_bshd(P, page_rows, Hk, D, distribution::gaussian, 9);
    tensor3<float> q(B, H, D), out(B, H, D);
    for (index_t i = 0; i < q.size(); ++i) q.data()[i] = 0.01f * static_cast<float>(i % 97);
    attnkit::paged_kv kv;
    kv.cu_seqlens_q = {0, 1, 2};  // one decode step per sequence
    kv.seq_lengths = {pages_per_seq * page_rows, 700};
    kv.pages_per_seq = pages_per_seq;
    for (index_t i = 0; i < B * pages_per_seq; ++i) kv.block_table.push_back(static_cast<std::int32_t>(P - 1 - i));
    attnkit::paged_attention(q, k, v, kv, out);  // warms this thread's scratch
    for (int rep = 0; rep < 3; ++rep)
        EXPECT_EQ(allocations_of([&] { attnkit::paged_attention(q, k, v, kv, out); }), 0) << "call " << rep;
}

TEST(scratch, varlen_decode_allocates_nothing_after_the_first_call) {
    const index_t H = 4, Hk = 2, D = 40;
    const std::vector<std::int64_t> cu_q = {0, 1, 2, 3}, cu_k = {0, 900, 905, 2000};
    const tensor4<float> q4 = random_bshd(1, 3, H, D, distribution::gaussian, 10);
    const tensor4<float> k4 = random_bshd(1, 2000, Hk, D, distribution::gaussian, 11);
    const tensor4<float> v4 = random_bshd(1, 2000, Hk, D, distribution::gaussian, 12);
    const view<const float, 3> q(q4.data(), {3, H, D}, {H * D, D, 1});
    const view<const float, 3> k(k4.data(), {2000, Hk, D}, {Hk * D, D, 1});
    const view<const float, 3> v(v4.data(), {2000, Hk, D}, {Hk * D, D, 1});
    tensor3<float> out(3, H, D);
    attnkit::softmax_attention_varlen(q, k, v, cu_q, cu_k, out);  // warms this thread's scratch
    for (int rep = 0; rep < 3; ++rep)
        EXPECT_EQ(allocations_of([&] { attnkit::softmax_attention_varlen(q, k, v, cu_q, cu_k, out); }), 0)
            << "call " << rep;
}

TEST(scratch, taylor_decode_allocates_nothing_after_the_first_call) {
    const index_t H = 8, Hk = 2, D = 64, Lk = 3000;
    const tensor4<float> q = random_bshd(2, 1, H, D, distribution::gaussian, 13);
    const tensor4<float> k = random_bshd(2, Lk, Hk, D, distribution::gaussian, 14);
    const tensor4<float> v = random_bshd(2, Lk, Hk, D, distribution::gaussian, 15);
    tensor4<float> out(2, 1, H, D);
    attnkit::taylor_options o;
    o.causal = true;  // bottom-right: the query is the last token
    attnkit::taylor_attention(q, k, v, out, o);  // warms this thread's scratch
    for (int rep = 0; rep < 3; ++rep)
        EXPECT_EQ(allocations_of([&] { attnkit::taylor_attention(q, k, v, out, o); }), 0) << "call " << rep;
}

// Decode steps of a state, one token each: the first warms this thread's scratch, the next
// n_steps must allocate nothing. The tokens are rows t of q, k, v ([1, n, ...] each).
template <class State>
void expect_steps_allocate_nothing(State& st, index_t n_steps, index_t H, index_t Hk, index_t D, index_t Dv) {
    const index_t n = n_steps + 1;
    const tensor4<float> q = random_bshd(1, n, H, D, distribution::gaussian, 21);
    const tensor4<float> k = random_bshd(1, n, Hk, D, distribution::gaussian, 22);
    const tensor4<float> v = random_bshd(1, n, Hk, Dv, distribution::gaussian, 23);
    tensor4<float> out(1, 1, H, Dv);
    auto row = [](const tensor4<float>& x, index_t t) {
        const index_t h = x.dimension(2), d = x.dimension(3);
        return view<const float, 4>(x.data() + t * h * d, {1, 1, h, d}, {h * d, h * d, d, 1});
    };
    st.step(row(q, 0), row(k, 0), row(v, 0), out);
    for (index_t t = 1; t < n; ++t)
        ASSERT_EQ(allocations_of([&] { st.step(row(q, t), row(k, t), row(v, t), out); }), 0)
            << "step " << t << " at length " << st.length();
}

// A prompt of T tokens, one step.
template <class State>
void prompt(State& st, index_t T, index_t H, index_t Hk, index_t D, index_t Dv) {
    const tensor4<float> q = random_bshd(1, T, H, D, distribution::gaussian, 31);
    const tensor4<float> k = random_bshd(1, T, Hk, D, distribution::gaussian, 32);
    const tensor4<float> v = random_bshd(1, T, Hk, Dv, distribution::gaussian, 33);
    tensor4<float> out(1, T, H, Dv);
    st.step(q, k, v, out);
}

TEST(scratch, taylor_state_steps_allocate_nothing) {
    const index_t H = 8, Hk = 2, D = 64, Dv = 64;
    {
        SCOPED_TRACE("automatic, past the fold");
        attnkit::taylor_state st(1, H, Hk, D, Dv);
        prompt(st, st.fold_length() + 5, H, Hk, D, Dv);
        ASSERT_EQ(st.form(), attnkit::taylor_form::linear);
        expect_steps_allocate_nothing(st, 70, H, Hk, D, Dv);  // past a chunk boundary: S updated
    }
    {
        SCOPED_TRACE("linear form");
        attnkit::taylor_options o;
        o.form = attnkit::taylor_form::linear;
        attnkit::taylor_state st(1, H, Hk, 32, 48, o);
        expect_steps_allocate_nothing(st, 70, H, Hk, 32, 48);
    }
    {
        SCOPED_TRACE("quadratic form, reserved");
        attnkit::taylor_options o;
        o.form = attnkit::taylor_form::quadratic;
        attnkit::taylor_state st(1, H, Hk, D, Dv, o);
        st.reserve(300);
        prompt(st, 100, H, Hk, D, Dv);
        expect_steps_allocate_nothing(st, 150, H, Hk, D, Dv);
    }
}

TEST(scratch, mta_state_steps_allocate_nothing_after_reserve) {
    const index_t H = 4, Hk = 2, D = 24, Dv = 20, G = 2;
    tensor4<float> kq_pre(H, G, 3, 5), kq_post(H, G, 2, 3);
    Eigen::Tensor<float, 2, Eigen::RowMajor> head_pre(H, H), head_post(H, H);
    Eigen::Tensor<float, 1, Eigen::RowMajor> norm(Dv), gate(Dv);
    for (auto* t : {&kq_pre, &kq_post}) t->setConstant(0.1f);
    for (auto* t : {&head_pre, &head_post}) t->setConstant(0.25f);
    norm.setConstant(1.0f);
    gate.setConstant(0.05f);
    attnkit::mta_options o;
    o.kq_pre = kq_pre, o.kq_post = kq_post, o.head_pre = head_pre, o.head_post = head_post;
    o.norm_weight = norm, o.gate_weight = gate;
    attnkit::mta_state st(1, H, Hk, D, Dv, o);
    st.reserve(400);
    prompt(st, 50, H, Hk, D, Dv);
    expect_steps_allocate_nothing(st, 300, H, Hk, D, Dv);
    st.reset();  // keeps what was reserved
    expect_steps_allocate_nothing(st, 100, H, Hk, D, Dv);
}

TEST(scratch, self_gating_state_steps_allocate_nothing) {
    const index_t H = 8, Hk = 2, D = 32, Dv = 40;
    attnkit::self_gating_state st(1, H, Hk, D, Dv);
    prompt(st, 37, H, Hk, D, Dv);
    expect_steps_allocate_nothing(st, 50, H, Hk, D, Dv);
}

TEST(scratch, leases_nest_and_keep_their_capacity) {
    using attnkit::detail::scratch_lease;
    float* outer_data = nullptr;
    {
        scratch_lease<> outer;
        outer.get().assign(1000, 1.0f);
        outer_data = outer.get().data();
        scratch_lease<> inner;
        EXPECT_NE(&inner.get(), &outer.get());
        inner.get().assign(10, 2.0f);
    }
    // The same depth gets the same buffer back, with its capacity: no allocation.
    const long n = allocations_of([&] {
        scratch_lease<> again;
        again.get().resize(1000);
        EXPECT_EQ(again.get().data(), outer_data);
        EXPECT_GE(again.get().capacity(), 1000u);
    });
    EXPECT_EQ(n, 0);
}

}  // namespace
