// Argument validation shared by every public entry point. Each routine checks one kind of
// argument and throws std::invalid_argument naming it with the expected and actual values,
// before any output is written.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#if defined(__has_include)
#if __has_include(<charconv>)
#include <charconv>
#endif
#endif

#include "attnkit/detail/limits.hpp"
#include "attnkit/detail/memory_overlap.hpp"
#include "attnkit/options.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {

[[noreturn]] inline void fail(const std::string& what) { throw std::invalid_argument("attnkit: " + what); }

// Numbers in error messages. Floats print in their shortest round-trip form, %g style
// ("1e-40", "3e+38", "-0.5", "nan", "inf"): std::to_string's fixed 6 decimals turned 1e-40 into
// "0.000000" and 3e38 into a 39-digit integer. Integers print as they are.
template <class X, std::enable_if_t<std::is_floating_point<X>::value, int> = 0>
std::string number(X x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
    char buf[64];
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
    const auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest form that reads back as x
    return std::string(buf, r.ptr);
#else
    std::snprintf(buf, sizeof buf, "%.*g", std::numeric_limits<X>::max_digits10, static_cast<double>(x));
    return buf;
#endif
}
template <class X, std::enable_if_t<std::is_integral<X>::value, int> = 0>
std::string number(X x) {
    return std::to_string(x);
}

// Dims >= 0, element count and every element's byte offset representable in int64, data
// non-null when there is an element. Strides are free, including 0 and negative (checks on
// outputs reject self-overlap separately); the byte offsets are what memory checks rely on.
template <class T, int N>
void check_extent(const char* name, const view<T, N>& v) {
    for (int i = 0; i < N; ++i)
        if (v.dims[i] < 0) fail(std::string(name) + ": negative dimension in shape " + shape_string(v));
    index_t count = 1, reach = 0;  // reach: largest |element offset|, in elements
    bool ok = true;
    for (int i = 0; i < N && ok; ++i) {
        ok = mul_fits(count, v.dims[i], count);
        if (v.dims[i] > 0 && v.strides[i] != std::numeric_limits<index_t>::min()) {
            index_t step = 0;
            const index_t st = v.strides[i] < 0 ? -v.strides[i] : v.strides[i];
            ok = ok && mul_fits(v.dims[i] - 1, st, step) && step <= std::numeric_limits<index_t>::max() - reach;
            reach += ok ? step : 0;
        } else if (v.dims[i] > 0) {
            ok = false;
        }
    }
    index_t bytes = 0;
    if (ok && count > 0) ok = mul_fits(reach + 1, static_cast<index_t>(sizeof(T)), bytes);
    if (!ok)
        fail(std::string(name) + ": shape " + shape_string(v) + " with strides " + strides_string(v) +
             " overflows int64 (element count or byte offsets)");
    if (v.data == nullptr && count > 0) fail(std::string(name) + ": null data for shape " + shape_string(v));
}

// Kernels stream rows, so the innermost dimension must be contiguous; other strides are free
// (that is what lets [B,H,L,D] and fused QKV buffers through without copies).
template <class T, int N>
void check_layout(const char* name, const view<T, N>& v) {
    if (v.strides[N - 1] != 1 && v.dims[N - 1] > 1)
        fail(std::string(name) + ": the last dimension must be contiguous (stride 1), got stride " +
             number(v.strides[N - 1]) + " for shape " + shape_string(v));
    check_extent(name, v);
}

template <class T, int N>
void check_shape(const char* name, const view<T, N>& v, const std::array<index_t, N>& expected,
                 const char* layout) {
    if (v.dims != expected) {
        std::string e = "[";
        for (int i = 0; i < N; ++i) e += (i ? ", " : "") + number(expected[i]);
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
        fail("k: query heads H = " + number(s.heads) + " must be a multiple of key heads Hk = " +
             number(s.heads_k) + " (q " + shape_string(q) + ", k " + shape_string(k) + ")");
    return s;
}

template <class TO>
void check_out(const char* name, const view<TO, 4>& out, const attention_shape& s) {
    check_layout(name, out);
    check_shape(name, out, {s.batch, s.len_q, s.heads, s.dim_v}, "[B, Lq, H, Dv]");
}

// lse is read and written element by element, so it takes any strides: FlashAttention's
// [B, H, Lq] buffer is a view with strides {H * Lq, 1, Lq}.
template <class TL>
void check_lse(const char* name, const view<TL, 3>& lse, const attention_shape& s) {
    check_extent(name, lse);
    check_shape(name, lse, {s.batch, s.len_q, s.heads}, "[B, Lq, H]");
}

// Outputs of an attention call must not overlap the inputs or each other (memory_overlap.hpp);
// out may be q itself, the same view, in place: every entry point reads a query row before it
// writes the output row at the same address (the fast kernels pack the queries of a work item
// before anything of it is written; split-KV writes outputs only after every piece has run).
// lse may be null.
template <class TQ, class TK, class TV, class TO, class TL>
void check_attention_memory(const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v,
                            const view<TO, 4>& out, const view<TL, 3>* lse) {
    constexpr unsigned kOutIsQ = 1;
    check_outputs_apart({in_place(region_of("out", out), kOutIsQ), lse ? region_of("lse", *lse) : memory_region{}},
                        {in_place(region_of("q", q), kOutIsQ), region_of("k", k), region_of("v", v)});
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

// Kernels fold scale * log2(e) into the queries, and a soft-cap into softcap * log2(e) and
// 1 / softcap: those must stay finite.
constexpr float kLog2eCheck = 1.4426950408889634f;

inline void check_scale(float scale) {
    if (!std::isfinite(scale) || scale < 0.0f || !std::isfinite(scale * kLog2eCheck))
        fail("opts.scale: expected 0 (default 1/sqrt(D)) or a finite value > 0 below 2.3e38, got " + number(scale));
}

inline void check_softcap(float softcap) {
    if (std::isnan(softcap)) fail("opts.softcap: expected a number (<= 0 is off), got NaN");
    if (std::isinf(softcap)) fail("opts.softcap: expected a finite value, got " + number(softcap));
    if (softcap > 0.0f && (!std::isfinite(1.0f / softcap) || !std::isfinite(softcap * kLog2eCheck)))
        fail("opts.softcap: expected <= 0 (off) or a normal value > 0 below 2.3e38, got " + number(softcap));
}

inline void check_options(const softmax_options& o, const attention_shape& s) {
    check_scale(o.scale);
    if (o.window_left < -1)
        fail("opts.window_left: expected -1 (unlimited) or >= 0, got " + number(o.window_left));
    if (o.chunk < 0) fail("opts.chunk: expected 0 (off) or > 0, got " + number(o.chunk));
    check_softcap(o.softcap);
    if (!o.key_lengths.empty()) {
        if (static_cast<index_t>(o.key_lengths.size()) != s.batch)
            fail("opts.key_lengths: expected one per batch item, B = " + number(s.batch) + ", got " +
                 number(o.key_lengths.size()));
        for (std::size_t b = 0; b < o.key_lengths.size(); ++b)
            if (o.key_lengths[b] < 0 || o.key_lengths[b] > s.len_k)
                fail("opts.key_lengths[" + number(b) + "]: expected 0 <= len <= Lk = " +
                     number(s.len_k) + ", got " + number(o.key_lengths[b]));
    }
    if (!o.sinks.empty()) {
        if (static_cast<index_t>(o.sinks.size()) != s.heads)
            fail("opts.sinks: expected one per query head, H = " + number(s.heads) + ", got " +
                 number(o.sinks.size()));
        for (std::size_t h = 0; h < o.sinks.size(); ++h)
            if (std::isnan(o.sinks[h]) || o.sinks[h] == HUGE_VALF)
                fail("opts.sinks[" + number(h) + "]: expected a finite logit or -inf, got " +
                     number(o.sinks[h]));
    }
}

// n <= kMaxKeys (detail/limits.hpp), else "<name>: at most 2^24 - 1 <what>, got <length_name> = n in <shape of x>".
template <class T, int N>
void check_max_keys(const char* name, index_t n, const char* what, const char* length_name, const view<T, N>& x) {
    if (n > kMaxKeys)
        fail(std::string(name) + ": at most 2^24 - 1 " + what + ", got " + length_name + " = " + number(n) + " in " +
             shape_string(x));
}

// The fixed sizes of a decode state (taylor_state, self_gating_state, mta_state), checked at
// construction: batch >= 0, heads, heads_kv, dim, dim_v >= 1, heads a multiple of heads_kv, and
// B * H * (D + Dv + 64) floats countable in int64 bytes (every state holds at least a few rows of
// that size per batch item and head, vector-padded by up to 64 floats; without the bound a huge
// batch wraps the products that size its buffers). `state` names the class in the messages.
// Returns the sizes as text ("batch 1, heads 4, ...") for the caller's own further checks.
inline std::string check_state_sizes(const char* state, index_t batch, index_t heads, index_t heads_kv, index_t dim,
                                     index_t dim_v) {
    const std::string got = "batch " + number(batch) + ", heads " + number(heads) + ", heads_kv " + number(heads_kv) +
                            ", dim " + number(dim) + ", dim_v " + number(dim_v);
    if (batch < 0 || heads < 1 || heads_kv < 1 || dim < 1 || dim_v < 1)
        fail(std::string(state) + ": expected batch >= 0 and heads, heads_kv, dim, dim_v >= 1, got " + got);
    if (heads % heads_kv != 0) fail(std::string(state) + ": heads must be a multiple of heads_kv, got " + got);
    constexpr index_t kMax = std::numeric_limits<index_t>::max();
    index_t bh = 0, elems = 0, bytes = 0;
    if (!mul_fits(batch, heads, bh) || dim > kMax / 4 || dim_v > kMax / 4 || !mul_fits(bh, dim + dim_v + 64, elems) ||
        !mul_fits(elems, index_t(sizeof(float)), bytes))
        fail(std::string(state) + ": batch * heads * (dim + dim_v) overflows int64 bytes, got " + got);
    return got;
}

// One step of a decode state built with the sizes in `sizes` (len_q and len_k unused):
// q [B, T, H, D], k [B, T, Hk, D], v [B, T, Hk, Dv], out [B, T, H, Dv] with T >= min_tokens, and
// out apart from k, v and itself; out may be q itself, the same view (each state reads a token's
// query before it writes that token's output). `state` names the class in the messages. Returns
// the step's shape, Lq = Lk = T.
// A state step's tensor against its layout "<layout> of the <state>", a string built only to
// throw: a decode step allocates nothing.
template <class T>
void check_step_shape(const char* state, const char* name, const view<T, 4>& x, const std::array<index_t, 4>& want,
                      const char* layout) {
    if (x.dims != want) check_shape<T, 4>(name, x, want, (std::string(layout) + " of the " + state).c_str());
}

template <class TQ, class TK, class TV, class TO>
attention_shape check_state_step(const char* state, const view<TQ, 4>& q, const view<TK, 4>& k, const view<TV, 4>& v,
                                 const view<TO, 4>& out, const attention_shape& sizes, index_t min_tokens) {
    check_layout("q", q);
    check_layout("k", k);
    check_layout("v", v);
    check_layout("out", out);
    const index_t T = q.dims[1];
    if (T < min_tokens)
        fail("q: a " + std::string(state) + " step appends T >= " + number(min_tokens) + " tokens, got q " +
             shape_string(q));
    check_step_shape(state, "q", q, {sizes.batch, T, sizes.heads, sizes.dim}, "[B, T, H, D]");
    check_step_shape(state, "k", k, {sizes.batch, T, sizes.heads_k, sizes.dim}, "[B, T, Hk, D]");
    check_step_shape(state, "v", v, {sizes.batch, T, sizes.heads_k, sizes.dim_v}, "[B, T, Hk, Dv]");
    check_step_shape(state, "out", out, {sizes.batch, T, sizes.heads, sizes.dim_v}, "[B, T, H, Dv]");
    check_attention_memory(q, k, v, out, static_cast<const view<float, 3>*>(nullptr));
    return attention_shape{sizes.batch, T, T, sizes.heads, sizes.heads_k, sizes.dim, sizes.dim_v};
}

// A decode state holds exactly the tokens appended to it and each new query sees all of them, so
// it takes no key_lengths. (An absolute-position cut would silently mask every decode token of an
// item whose prompt was right-padded.)
inline void check_state_key_lengths(const char* state, const std::vector<std::int64_t>& key_lengths) {
    if (!key_lengths.empty())
        fail(std::string(state) + ": opts.key_lengths must be empty (a state holds exactly the tokens appended, " +
             "each new query sees all of them), got " + number(key_lengths.size()) + " lengths");
}

// True when every view holds float elements.
template <class... Views>
constexpr bool kFloatViews = (std::is_same<typename std::decay_t<Views>::value_type, float>::value && ...);

// kFloatViews of the arguments' types, for decltype only (never defined): lets a macro take the
// views themselves rather than their decltypes.
template <class... Views>
std::integral_constant<bool, kFloatViews<Views...>> float_views(const Views&...);

// The guard of every float-only entry point:
//
//   ATTNKIT_IF_FLOAT("attnkit::mta_attention: float storage", qv, kv, vv, ov)
//       detail::mta::forward<A>(qv, kv, vv, ov, opts);
//
// static_asserts that every view holds float elements, with the entry point's own message, and
// runs the statement that follows only then (if constexpr; an `else` may follow), so that a wrong
// element type gives that one error and none from inside the kernel. A macro because a
// static_assert message must be a string literal written where it fires.
#define ATTNKIT_IF_FLOAT(message, ...)                                                      \
    static_assert(decltype(::attnkit::detail::float_views(__VA_ARGS__))::value, message); \
    if constexpr (decltype(::attnkit::detail::float_views(__VA_ARGS__))::value)

// The optional lse argument of an entry point is anything that is not its options struct, so
// that a wrong lse type (an Eigen expression, a weights tensor) reaches lse_view's static_assert
// instead of silently disabling the overload.
template <class L, class Options>
constexpr bool kIsLseArg = !std::is_convertible<const std::decay_t<L>&, const Options&>::value;

inline float resolve_scale(float scale, index_t dim) {
    return scale > 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
}

}  // namespace detail
}  // namespace attnkit
