// The fused multi-token attention call behind attnkit::mta_attention (and mta_state's prompt):
// the work partition over (batch item, query block) and the one or two passes of
// detail/mta/block_kernel.hpp.
#pragma once

#include <algorithm>
#include <vector>

#include "attnkit/detail/mta/block_kernel.hpp"
#include "attnkit/detail/mta/check.hpp"
#include "attnkit/detail/mta/epilogue.hpp"
#include "attnkit/detail/mta/params.hpp"
#include "attnkit/detail/mta/plan.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/options.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace detail {
namespace mta {

// The fused kernel on checked arguments: ms from check_call, w the options' weights copied
// (make_params). mta_state's prompt path calls this with the copies it made when it was built.
template <class A>
void run_fused(const view<const float, 4>& q, const view<const float, 4>& k, const view<const float, 4>& v,
               const view<float, 4>& out, const shape& ms, const params& w, thread_pool* pool) {
    if (ms.s.batch == 0 || ms.s.len_q == 0) return;
    const plan pl = make_plan<A>(ms, w);
    problem pr;
    pr.q = rows_of(q), pr.k = rows_of(k), pr.v = rows_of(v);
    pr.out = out.data, pr.ob = out.strides[0], pr.ol = out.strides[1], pr.oh = out.strides[2];
    std::vector<float> stats;
    if (pl.two_pass) {
        stats.resize(static_cast<std::size_t>(pl.B * pl.L * pl.H));
        pr.stats = stats.data();
    }
    // Heavy items first: the last query blocks see the most keys.
    auto pass = [&](bool stats_only) {
        parallel_for(pool, pl.n_items(), [&](index_t it) {
            const index_t qb = pl.n_qblocks - 1 - it / pl.B, b = it % pl.B;
            const index_t i0 = qb * pl.block_rows, i1 = std::min(pl.L, i0 + pl.block_rows);
            scratch_lease<> lease;
            std::vector<float>& buf = lease.get();
            if (static_cast<index_t>(buf.size()) < pl.at.total) buf.assign(static_cast<std::size_t>(pl.at.total), 0.0f);
            block_kernel<A>(pl, pr, buf.data()).run(b, i0, i1, stats_only);
        });
    };
    if (pl.two_pass) pass(true);
    pass(false);
}

template <class A>
ATTNKIT_NOINLINE void forward(const view<const float, 4>& q, const view<const float, 4>& k,
                              const view<const float, 4>& v, const view<float, 4>& out, const mta_options& opts) {
    const shape ms = check_call(q, k, v, out, opts);
    if (ms.s.batch == 0 || ms.s.len_q == 0) return;
    run_fused<A>(q, k, v, out, ms, make_params(opts, ms), opts.pool);
}

#ifdef ATTNKIT_KERNEL_INSTANCE  // compiled kernels (config.hpp)
ATTNKIT_KERNEL_INSTANCE void forward<simd::default_arch>(const view<const float, 4>&, const view<const float, 4>&,
                                                         const view<const float, 4>&, const view<float, 4>&,
                                                         const mta_options&);
#endif

}  // namespace mta
}  // namespace detail
}  // namespace attnkit
