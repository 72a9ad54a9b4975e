// Argument validation of static QK attention (RndEmbQK / FixedSeqQK) and of the attention map:
// the fixed stream's q_fixed [1, Lmax, H, D] and k_fixed [1, Lmax, Hk, D], the per-call values
// v [B, L, Hk, Dv] with L <= Lmax, out [B, L, H, Dv] (or [B, T, H, Dv], T <= L, for the map), and
// a given mixing matrix w [H, Lmax, Lmax]. Everything throws std::invalid_argument naming the
// argument with its expected and actual shape, before any output is written.
#pragma once

#include <string>
#include <utility>

#include "attnkit/detail/check.hpp"

namespace attnkit {
namespace detail {
namespace static_qk {

// Shapes of the fixed stream (one attention map per head).
struct stream_shape {
    index_t max_len, heads, heads_k, dim;
    index_t group() const { return heads / heads_k; }
};

// Shapes of one application to values: v [batch, len, heads_k, dim_v], out [batch, rows, heads, dim_v].
struct values_shape {
    index_t batch, len, rows, heads, heads_k, dim_v;
};

template <class X>
auto q_fixed_view(const X& x) { return input_view<4>("q_fixed", x, "[1, Lmax, H, D]"); }
template <class X>
auto k_fixed_view(const X& x) { return input_view<4>("k_fixed", x, "[1, Lmax, Hk, D]"); }
template <class X>
auto v_view(const X& x) { return input_view<4>("v", x, "[B, L, Hk, Dv]"); }
template <class X>
auto out_view(X&& x) { return output_view<4>("out", std::forward<X>(x), "[B, L, H, Dv]"); }
template <class X>
auto weights_view(const X& x) { return input_view<3>("w", x, "[H, Lmax, Lmax]"); }

inline std::string str(index_t x) { return std::to_string(x); }

template <class TQ, class TK>
stream_shape check_stream(const view<TQ, 4>& qf, const view<TK, 4>& kf) {
    check_layout("q_fixed", qf);
    check_layout("k_fixed", kf);
    // One fixed stream for every batch item: a batch here would be a per-item Q/K, which is
    // softmax_attention's job.
    if (qf.dims[0] != 1)
        fail("q_fixed: expected batch 1 (one fixed stream, layout [1, Lmax, H, D]), got " + shape_string(qf));
    if (kf.dims[0] != 1)
        fail("k_fixed: expected batch 1 (one fixed stream, layout [1, Lmax, Hk, D]), got " + shape_string(kf));
    const stream_shape s{qf.dims[1], qf.dims[2], kf.dims[2], qf.dims[3]};
    if (s.heads < 1 || s.dim < 1) fail("q_fixed: heads and head dim must be >= 1, got " + shape_string(qf));
    if (s.heads_k < 1) fail("k_fixed: heads must be >= 1, got " + shape_string(kf));
    check_shape("k_fixed", kf, {1, s.max_len, s.heads_k, s.dim}, "[1, Lmax, Hk, D]");
    if (s.heads % s.heads_k != 0)
        fail("k_fixed: query heads H = " + str(s.heads) + " must be a multiple of key heads Hk = " + str(s.heads_k) +
             " (q_fixed " + shape_string(qf) + ", k_fixed " + shape_string(kf) + ")");
    return s;
}

// The stream of a static_attention_map, which holds H * Lmax (Lmax + 1) / 2 floats (one packed
// lower triangle per head): that count in bytes must be a number (a zero-stride stream makes any
// Lmax cheap to pass).
template <class TQ, class TK>
stream_shape check_map_stream(const view<TQ, 4>& qf, const view<TK, 4>& kf) {
    const stream_shape s = check_stream(qf, kf);
    index_t tri = 0, floats = 0, bytes = 0;
    if (!mul_fits(s.max_len, s.max_len + 1, tri) || !mul_fits(s.heads, tri / 2, floats) ||
        !mul_fits(floats, index_t(sizeof(float)), bytes))
        fail("q_fixed: a map of Lmax = " + str(s.max_len) + " positions and H = " + str(s.heads) +
             " heads holds H * Lmax (Lmax + 1) / 2 floats, which overflows int64 bytes (q_fixed " + shape_string(qf) +
             ")");
    return s;
}

// v against a stream (or map) of max_len positions, heads and heads_k; out has `rows` rows
// (== L for static_qk_attention, any 0 <= T <= L for the map: the last T rows).
// `owner` names what max_len belongs to in messages ("fixed stream", "map").
template <class TV, class TO>
values_shape check_values(const view<TV, 4>& v, const view<TO, 4>& out, index_t max_len, index_t heads,
                          index_t heads_k, bool last_rows, const char* owner = "fixed stream") {
    check_layout("v", v);
    check_layout("out", out);
    const values_shape s{v.dims[0], v.dims[1], out.dims[1], heads, heads_k, v.dims[3]};
    if (v.dims[2] != heads_k)
        fail("v: expected " + str(heads_k) + " key/value heads (layout [B, L, Hk, Dv]), got " + shape_string(v));
    if (s.dim_v < 1) fail("v: head dim must be >= 1, got " + shape_string(v));
    if (s.len > max_len)
        fail("v: length L = " + str(s.len) + " exceeds the " + std::string(owner) + "'s Lmax = " + str(max_len) + " (v " +
             shape_string(v) + ")");
    if (last_rows) {
        if (out.dims[0] != s.batch || out.dims[2] != heads || out.dims[3] != s.dim_v || s.rows > s.len)
            fail("out: expected shape [B, T, H, Dv] = [" + str(s.batch) + ", T <= " + str(s.len) + ", " + str(heads) +
                 ", " + str(s.dim_v) + "], got " + shape_string(out));
    } else {
        check_shape("out", out, {s.batch, s.len, heads, s.dim_v}, "[B, L, H, Dv]");
    }
    return s;
}

inline void check_options(const static_qk_options& o) { check_scale(o.scale); }

// out shares no memory with the stream or the values, not even out = v in place: every output
// row reads all the value rows up to its own (kernel and oracle alike).
template <class TQ, class TK, class TV, class TO>
void check_apart(const view<TQ, 4>& qf, const view<TK, 4>& kf, const view<TV, 4>& v, const view<TO, 4>& out) {
    check_outputs_apart({region_of("out", out)}, {region_of("q_fixed", qf), region_of("k_fixed", kf), region_of("v", v)});
}

// The backward of static_qk_attention (static_qk_attention_backward.hpp and its oracle): the
// forward's arguments as the forward checks them, d_out shaped like out, d_q_fixed and d_k_fixed
// shaped like the stream, d_v like v, each with a contiguous last dimension, none overlapping
// another or any input.
template <class TQ, class TK, class TV, class TO, class TD, class TG>
values_shape check_backward(const view<TQ, 4>& qf, const view<TK, 4>& kf, const view<TV, 4>& v, const view<TO, 4>& out,
                            const view<TD, 4>& d_out, const view<TG, 4>& d_qf, const view<TG, 4>& d_kf,
                            const view<TG, 4>& d_v, const static_qk_options& opts, stream_shape& st) {
    st = check_stream(qf, kf);
    const values_shape s = check_values(v, out, st.max_len, st.heads, st.heads_k, false);
    check_options(opts);
    check_apart(qf, kf, v, out);
    check_layout("d_out", d_out);
    check_shape("d_out", d_out, {s.batch, s.len, st.heads, s.dim_v}, "[B, L, H, Dv]");
    check_layout("d_q_fixed", d_qf);
    check_shape("d_q_fixed", d_qf, {1, st.max_len, st.heads, st.dim}, "[1, Lmax, H, D]");
    check_layout("d_k_fixed", d_kf);
    check_shape("d_k_fixed", d_kf, {1, st.max_len, st.heads_k, st.dim}, "[1, Lmax, Hk, D]");
    check_layout("d_v", d_v);
    check_shape("d_v", d_v, {s.batch, s.len, st.heads_k, s.dim_v}, "[B, L, Hk, Dv]");
    check_outputs_apart({region_of("d_q_fixed", d_qf), region_of("d_k_fixed", d_kf), region_of("d_v", d_v)},
                        {region_of("q_fixed", qf), region_of("k_fixed", kf), region_of("v", v), region_of("out", out),
                         region_of("d_out", d_out)});
    return s;
}

// A given causal mixing matrix, one square [Lmax, Lmax] block per head.
template <class TW>
stream_shape check_weights(const view<TW, 3>& w, index_t heads_k) {
    check_layout("w", w);
    if (w.dims[0] < 1) fail("w: expected at least one head (layout [H, Lmax, Lmax]), got " + shape_string(w));
    if (w.dims[1] != w.dims[2])
        fail("w: expected a square mixing matrix per head, [H, Lmax, Lmax], got " + shape_string(w));
    if (heads_k < 0 || (heads_k > 0 && w.dims[0] % heads_k != 0))
        fail("heads_kv: expected 0 (v's, at apply) or a divisor of H = " + str(w.dims[0]) + ", got " + str(heads_k));
    return {w.dims[1], w.dims[0], heads_k, 0};
}

// The key/value heads a map applies to v with: its own (a map of a stream: k_fixed's Hk; a
// from_weights map given heads_kv), or, for heads_k = 0 (from_weights without heads_kv), v's,
// which must divide H as everywhere else (GQA by index).
template <class TV>
index_t map_kv_heads(const view<TV, 4>& v, index_t heads, index_t heads_k) {
    if (heads_k != 0) return heads_k;
    const index_t hk = v.dims[2];
    if (hk < 1 || heads % hk != 0)
        fail("v: key/value heads Hk = " + str(hk) + " must divide the map's H = " + str(heads) +
             " (layout [B, L, Hk, Dv]), got " + shape_string(v));
    return hk;
}

// The backward of a from_weights map applied to all L rows of v (static_attention_map_backward
// and its oracle): w [H, Lmax, Lmax], v [B, L, Hk, Dv] with L <= Lmax and Hk dividing H, d_out
// [B, L, H, Dv], d_w shaped like w, d_v like v; gradients apart from each other and the inputs.
template <class TW, class TV, class TD, class TG>
values_shape check_map_backward(const view<TW, 3>& w, const view<TV, 4>& v, const view<TD, 4>& d_out,
                                const view<TG, 3>& d_w, const view<TG, 4>& d_v) {
    const stream_shape st = check_weights(w, 0);
    check_layout("v", v);
    const index_t hk = map_kv_heads(v, st.heads, 0);
    const values_shape s{v.dims[0], v.dims[1], v.dims[1], st.heads, hk, v.dims[3]};
    if (s.dim_v < 1) fail("v: head dim must be >= 1, got " + shape_string(v));
    if (s.len > st.max_len)
        fail("v: length L = " + str(s.len) + " exceeds the map's Lmax = " + str(st.max_len) + " (v " + shape_string(v) +
             ", w " + shape_string(w) + ")");
    check_layout("d_out", d_out);
    check_shape("d_out", d_out, {s.batch, s.len, st.heads, s.dim_v}, "[B, L, H, Dv]");
    check_layout("d_w", d_w);
    check_shape("d_w", d_w, {st.heads, st.max_len, st.max_len}, "[H, Lmax, Lmax]");
    check_layout("d_v", d_v);
    check_shape("d_v", d_v, {s.batch, s.len, hk, s.dim_v}, "[B, L, Hk, Dv]");
    check_outputs_apart({region_of("d_w", d_w), region_of("d_v", d_v)},
                        {region_of("w", w), region_of("v", v), region_of("d_out", d_out)});
    return s;
}

}  // namespace static_qk
}  // namespace detail
}  // namespace attnkit
