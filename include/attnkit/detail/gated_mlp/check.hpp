// Argument validation of the gated MLP, shared by the kernel and the oracle: every shape and
// overlap rule is checked here, before either writes anything.
#pragma once

#include <string>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/memory_overlap.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {

struct gated_mlp_shape {
    index_t rows;     // N, or B * L
    index_t d_model;  // x's last dimension
    index_t width;    // m, the hidden width
};

inline const char* gated_mlp_layout(int rank) { return rank == 2 ? "[N, d_model]" : "[B, L, d_model]"; }

template <int R>
gated_mlp_shape check_gated_mlp(const view<const float, R>& x, const view<const float, 2>& w_gate,
                                const view<const float, 2>& w_up, const view<const float, 2>& w_down,
                                const view<float, R>& out) {
    static_assert(R == 2 || R == 3, "gated_mlp: x is [N, d_model] or [B, L, d_model]");
    check_layout("x", x);
    check_layout("w_gate", w_gate);
    check_layout("w_up", w_up);
    check_layout("w_down", w_down);
    check_layout("out", out);
    const index_t d = x.dims[R - 1];
    const index_t m = w_gate.dims[1];
    if (w_gate.dims[0] != d)
        fail("w_gate: expected [d_model, m] with d_model = " + std::to_string(d) + " (the last dimension of x " +
             shape_string(x) + "), got " + shape_string(w_gate));
    check_shape("w_up", w_up, {d, m}, "[d_model, m] (the shape of w_gate)");
    check_shape("w_down", w_down, {m, d}, "[m, d_model]");
    check_shape<float, R>("out", out, x.dims, R == 2 ? "[N, d_model] (the shape of x)" : "[B, L, d_model] (the shape of x)");
    // Rows are written block by block while other blocks still read x: out needs its own memory.
    check_outputs_apart({region_of("out", out)}, {region_of("x", x), region_of("w_gate", w_gate),
                                                  region_of("w_up", w_up), region_of("w_down", w_down)});
    index_t rows = 1;
    for (int i = 0; i < R - 1; ++i) rows *= x.dims[i];
    return {rows, d, m};
}

}  // namespace detail
}  // namespace attnkit
