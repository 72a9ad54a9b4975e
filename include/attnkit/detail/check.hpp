// Argument validation shared by every public entry point. Each routine checks one kind of
// argument and throws std::invalid_argument naming it with the expected and actual values,
// before any output is written.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {

[[noreturn]] inline void fail(const std::string& what) { throw std::invalid_argument("attnkit: " + what); }

// Kernels stream rows, so the innermost dimension must be contiguous; other strides are free
// (that is what lets [B,H,L,D] and fused QKV buffers through without copies).
template <class T, int N>
void check_layout(const char* name, const view<T, N>& v) {
    if (v.strides[N - 1] != 1)
        fail(std::string(name) + ": the last dimension must be contiguous (stride 1), got stride " +
             std::to_string(v.strides[N - 1]) + " for shape " + shape_string(v));
    for (int i = 0; i < N; ++i)
        if (v.dims[i] < 0) fail(std::string(name) + ": negative dimension in shape " + shape_string(v));
    if (v.data == nullptr && v.size() > 0) fail(std::string(name) + ": null data for shape " + shape_string(v));
}

template <class T, int N>
void check_shape(const char* name, const view<T, N>& v, const std::array<index_t, N>& expected,
                 const char* layout) {
    if (v.dims != expected) {
        std::string e = "[";
        for (int i = 0; i < N; ++i) e += (i ? ", " : "") + std::to_string(expected[i]);
        fail(std::string(name) + ": expected shape " + layout + " = " + e + "], got " + shape_string(v));
    }
}

// Shapes of one attention call: q [B,Lq,H,D], k [B,Lk,Hk,D], v [B,Lk,Hk,Dv].
struct attention_shape {
    index_t batch, len_q, len_k, heads, heads_k, dim, dim_v;
    index_t group() const { return heads / heads_k; }
};

template <class TQ, class TK, class TV>
attention_shape check_qkv(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v) {
    check_layout("q", q);
    check_layout("k", k);
    check_layout("v", v);
    attention_shape s{q.dims[0], q.dims[1], k.dims[1], q.dims[2], k.dims[2], q.dims[3], v.dims[3]};
    if (s.heads < 1 || s.dim < 1) fail("q: heads and head dim must be >= 1, got " + shape_string(q));
    if (s.heads_k < 1) fail("k: heads must be >= 1, got " + shape_string(k));
    if (s.dim_v < 1) fail("v: head dim must be >= 1, got " + shape_string(v));
    check_shape("k", k, {s.batch, s.len_k, s.heads_k, s.dim}, "[B, Lk, Hk, D]");
    check_shape("v", v, {s.batch, s.len_k, s.heads_k, s.dim_v}, "[B, Lk, Hk, Dv]");
    if (s.heads % s.heads_k != 0)
        fail("k: query heads H = " + std::to_string(s.heads) + " must be a multiple of key heads Hk = " +
             std::to_string(s.heads_k) + " (q " + shape_string(q) + ", k " + shape_string(k) + ")");
    return s;
}

template <class TO>
void check_out(const char* name, const view<TO, 4>& out, const attention_shape& s) {
    check_layout(name, out);
    check_shape(name, out, {s.batch, s.len_q, s.heads, s.dim_v}, "[B, Lq, H, Dv]");
}

template <class TL>
void check_lse(const char* name, const view<TL, 3>& lse, const attention_shape& s) {
    check_layout(name, lse);
    check_shape(name, lse, {s.batch, s.len_q, s.heads}, "[B, Lq, H]");
}

// The arguments of an attention entry point as views, named for error messages. Every entry
// point (kernels and oracles) converts through these, so names and layouts read the same.
template <class X>
auto q_view(const X& x) { return input_view<4>("q", x, "[B, Lq, H, D]"); }
template <class X>
auto k_view(const X& x) { return input_view<4>("k", x, "[B, Lk, Hk, D]"); }
template <class X>
auto v_view(const X& x) { return input_view<4>("v", x, "[B, Lk, Hk, Dv]"); }
template <class X>
auto out_view(X&& x) { return output_view<4>("out", std::forward<X>(x), "[B, Lq, H, Dv]"); }
template <class X>
auto lse_view(X&& x) { return output_view<3>("lse", std::forward<X>(x), "[B, Lq, H]"); }

inline void check_scale(float scale) {
    // Kernels fold scale * log2(e) into the queries: that product must stay finite.
    if (!std::isfinite(scale) || scale < 0.0f || !std::isfinite(scale * 1.4426950408889634f))
        fail("opts.scale: expected 0 (default 1/sqrt(D)) or a finite value > 0 below 2.3e38, got " +
             std::to_string(scale));
}

inline void check_options(const softmax_options& o, const attention_shape& s) {
    check_scale(o.scale);
    if (o.window_left < -1)
        fail("opts.window_left: expected -1 (unlimited) or >= 0, got " + std::to_string(o.window_left));
    if (o.chunk < 0) fail("opts.chunk: expected 0 (off) or > 0, got " + std::to_string(o.chunk));
    if (std::isnan(o.softcap)) fail("opts.softcap: expected a number (<= 0 is off), got NaN");
    if (std::isinf(o.softcap)) fail("opts.softcap: expected a finite value, got " + std::to_string(o.softcap));
    // s / softcap is computed as s * (1 / softcap): a subnormal cap would make that infinite.
    if (o.softcap > 0.0f && !std::isfinite(1.0f / o.softcap))
        fail("opts.softcap: expected <= 0 (off) or a normal value > 0, got " + std::to_string(o.softcap));
    if (!o.key_lengths.empty()) {
        if (static_cast<index_t>(o.key_lengths.size()) != s.batch)
            fail("opts.key_lengths: expected one per batch item, B = " + std::to_string(s.batch) + ", got " +
                 std::to_string(o.key_lengths.size()));
        for (std::size_t b = 0; b < o.key_lengths.size(); ++b)
            if (o.key_lengths[b] < 0 || o.key_lengths[b] > s.len_k)
                fail("opts.key_lengths[" + std::to_string(b) + "]: expected 0 <= len <= Lk = " +
                     std::to_string(s.len_k) + ", got " + std::to_string(o.key_lengths[b]));
    }
    if (!o.sinks.empty()) {
        if (static_cast<index_t>(o.sinks.size()) != s.heads)
            fail("opts.sinks: expected one per query head, H = " + std::to_string(s.heads) + ", got " +
                 std::to_string(o.sinks.size()));
        for (std::size_t h = 0; h < o.sinks.size(); ++h)
            if (std::isnan(o.sinks[h]) || o.sinks[h] == HUGE_VALF)
                fail("opts.sinks[" + std::to_string(h) + "]: expected a finite logit or -inf, got " +
                     std::to_string(o.sinks[h]));
    }
}

inline float resolve_scale(float scale, index_t dim) {
    return scale > 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
}

}  // namespace detail
}  // namespace attnkit
