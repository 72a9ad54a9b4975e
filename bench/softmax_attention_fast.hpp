// attnkit benchmarks: the fast kernels' families of softmax_attention_bench.
//
// softmax_attention_bench.cpp calls register_fast_kernels() after adding the `reference` and
// `materialised` families and before registering the cases, so every family added here runs on
// the same shapes, with the same inputs, output checks and counters (FLOP/s, peak_frac; decode
// also GB/s, bw_frac), and shows up in the bench_report table with its speedup over
// `materialised`. The callable gets attnkit's own signature; opts.causal is set by the case and
// opts.pool is the case's thread pool (nullptr for threads:1). For example:
//
//     #include "attnkit/softmax_attention.hpp"
//     ...
//     add_family("attnkit", [](auto& q, auto& k, auto& v, auto& out, auto& opts) {
//         attnkit::softmax_attention(q, k, v, out, opts);
//     });
//
// Optional third argument, attnkit_bench::family_options: `applies` (which cases), `iterations`,
// `max_repetitions`, `tolerance` of the output spot check (default 2e-3 relative to 1 + |ref|).
#pragma once

#include "attnkit/softmax_attention.hpp"
#include "common/attention_harness.hpp"

namespace attnkit_bench {

inline void register_fast_kernels() {
    // Also on bfloat16 / half / int8 K/V cases (add_typed_family: one generic callable for every
    // storage).
    add_typed_family<true>("attnkit", [](auto& q, auto& k, auto& v, auto& out, auto& opts) {
        attnkit::softmax_attention(q, k, v, out, opts);
    });
}

}  // namespace attnkit_bench
