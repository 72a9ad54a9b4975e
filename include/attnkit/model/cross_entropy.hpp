// Softmax cross-entropy of a language model's logits against integer targets, and its gradient:
//
//   double loss = attnkit::model::cross_entropy(logits, targets, d_logits[, pool]);
//
//   loss           = mean over the n counted rows t of lse(logits[t, :]) - logits[t, targets[t]]
//   d_logits[t, :] = (softmax(logits[t, :]) - onehot(targets[t])) / n,  0 for an ignored row
//
// logits and d_logits [N, V] float (views with contiguous rows, Eigen RowMajor tensors or
// TensorMaps); d_logits is overwritten and may be logits itself, the same view (in place, the
// usual use: the logits are not needed after; a row's logits are read before its gradient is
// written). targets [N] int32: an attnkit::view<const std::int32_t, 1>, an
// Eigen::Tensor<std::int32_t, 1, Eigen::RowMajor> or a std::vector<std::int32_t>. A target < 0
// ignores its row (PyTorch's ignore_index -100, or any negative value): the row is not read, is
// not counted in n, and gets a zero gradient. With no counted row the loss is 0 and d_logits all
// 0. The gradient is that of the mean, so a loss over several calls (micro-batches) is the
// caller's weighted sum.
//
// Numerics: each row is shifted by its maximum, exp by simd::exp, the sum of the exponentials in
// float over blocks of kCeSumBlock and in double across blocks, the log and the loss in double,
// so logits of any finite scale (1e4 and beyond) give the oracle's loss to float accuracy.
// Masked entries (-inf logits) get probability 0. A counted row whose target logit is -inf has
// loss +inf (the target is impossible) and, like every row, a finite gradient: the softmax over
// its finite logits minus the onehot; a row with no finite logit has the softmax taken as 0
// (gradient -onehot / n). NaN or +inf logits in a counted row make its loss and gradient NaN,
// and no other row's.
//
// Threads: rows are split over the pool in fixed blocks; each row's loss is kept and the losses
// are added in double in row order, so the loss and d_logits have the same bits for any thread
// count.
//
// Errors (std::invalid_argument naming the argument and the shapes, before anything is
// written): shapes, a target >= V, d_logits overlapping logits (other than being the same view)
// or the targets, or itself. The oracle: attnkit::reference::model::cross_entropy.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/scratch.hpp"
#include "attnkit/simd/simd.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace model {
namespace detail {

// Exponentials per float partial sum: each lane adds at most kCeSumBlock / (2 W) terms <= 1 before
// the partial goes into double, which bounds the relative error of a row's sum at a few dozen eps
// for any vocabulary (150K entries summed in float lanes alone would allow ~1e-4).
constexpr index_t kCeSumBlock = 256;
static_assert(kCeSumBlock % 32 == 0, "kCeSumBlock: a whole number of two-vector steps at up to 16 lanes");
// Elements per parallel task, in whole rows (at least one): a row of a 150K vocabulary is a
// task of its own, rows of a small one are grouped. Fixed by V, never by the pool.
constexpr index_t kCeTaskElements = index_t(1) << 15;

// One counted row: writes (softmax - onehot(t)) * inv_n to dz (which may be z itself) and returns
// the row's loss lse(z) - z[t] in double.
template <class A>
double cross_entropy_row(const float* z, index_t t, float* dz, index_t V, double inv_n) {
    using Vf = simd::vfloat<A>;
    constexpr index_t W = simd::kLanes<A>;
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    const float zt = z[t];  // before dz (maybe z) is written
    Vf m0(kNegInf), m1(kNegInf);
    index_t j = 0;
    for (; j + 2 * W <= V; j += 2 * W) {
        m0 = simd::max(m0, simd::loadu<A>(z + j));
        m1 = simd::max(m1, simd::loadu<A>(z + j + W));
    }
    float m = simd::hmax(simd::max(m0, m1));
    for (; j < V; ++j) m = z[j] > m ? z[j] : m;
    if (ATTNKIT_UNLIKELY(m == kNegInf)) {
        // No finite logit (a fully masked row), unless a NaN hid from the maximum: the softmax
        // has nowhere to put its mass and is taken as 0; the loss is +inf (or NaN for a NaN).
        bool nan = false;
        for (j = 0; j < V; ++j) nan = nan || std::isnan(z[j]);
        const float fill = nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
        for (j = 0; j < V; ++j) dz[j] = fill;
        if (!nan) dz[t] = static_cast<float>(-inv_n);
        return nan ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    }
    // e = exp(z - m) into dz, summed.
    const Vf mv(m);
    Vf a0(0.0f), a1(0.0f);
    double s = 0.0;
    j = 0;
    for (; j + 2 * W <= V; j += 2 * W) {
        const Vf e0 = simd::exp(simd::loadu<A>(z + j) - mv), e1 = simd::exp(simd::loadu<A>(z + j + W) - mv);
        simd::storeu(dz + j, e0);
        simd::storeu(dz + j + W, e1);
        a0 = a0 + e0;
        a1 = a1 + e1;
        if ((j + 2 * W) % kCeSumBlock == 0) {
            s += static_cast<double>(simd::hsum(a0 + a1));
            a0 = a1 = Vf(0.0f);
        }
    }
    for (; j + W <= V; j += W) {
        const Vf e = simd::exp(simd::loadu<A>(z + j) - mv);
        simd::storeu(dz + j, e);
        a0 = a0 + e;
    }
    if (j < V) {  // the last V mod W through the same vector code, padded with -inf (exp: 0)
        float b[W];
        for (index_t i = 0; i < W; ++i) b[i] = i < V - j ? z[j + i] : kNegInf;
        const Vf e = simd::exp(simd::loadu<A>(b) - mv);
        simd::storeu(b, e);
        for (index_t i = 0; i < V - j; ++i) dz[j + i] = b[i];
        a1 = a1 + e;
    }
    s += static_cast<double>(simd::hsum(a0 + a1));
    // s >= 1 (the maximum's own term) unless a NaN: the scale is finite for every finite row.
    const double et = static_cast<double>(dz[t]);
    const float sc = static_cast<float>(inv_n / s);
    const Vf scale(sc);
    for (j = 0; j + W <= V; j += W) simd::storeu(dz + j, simd::loadu<A>(dz + j) * scale);
    for (; j < V; ++j) dz[j] *= sc;
    // The target's p / n - 1 / n in double: p near 1 would cancel in float.
    dz[t] = static_cast<float>(et / s * inv_n - inv_n);
    return static_cast<double>(m) + std::log(s) - static_cast<double>(zt);
}

// targets as a view (std::vector<std::int32_t> included).
inline view<const std::int32_t, 1> ce_targets_view(const std::vector<std::int32_t>& t) {
    return view<const std::int32_t, 1>(t.data(), {static_cast<index_t>(t.size())});
}
template <class T>
view<const std::int32_t, 1> ce_targets_view(const T& t) {
    const auto v = attnkit::detail::input_view<1>("targets", t, "[N]");
    static_assert(std::is_same<typename decltype(v)::value_type, std::int32_t>::value,
                  "attnkit::model::cross_entropy: targets must be int32");
    return v;
}

template <class A>
double cross_entropy_run(const view<const float, 2>& z, const view<const std::int32_t, 1>& tg,
                         const view<float, 2>& dz, thread_pool* pool) {
    attnkit::detail::check_layout("logits", z);
    attnkit::detail::check_extent("targets", tg);
    attnkit::detail::check_layout("d_logits", dz);
    const index_t N = z.dims[0], V = z.dims[1];
    if (tg.dims[0] != N)
        attnkit::detail::fail("targets: expected shape [N] = [" + std::to_string(N) + "] for logits " +
                              shape_string(z) + ", got " + shape_string(tg));
    if (dz.dims != z.dims)
        attnkit::detail::fail("d_logits: expected the shape of logits " + shape_string(z) + ", got " +
                              shape_string(dz));
    // d_logits = logits (the same view) is in place: a row's logits are read before its gradient
    // is written, and no other row reads them. Any other overlap would race between threads.
    attnkit::detail::check_outputs_apart(
        {attnkit::detail::in_place(attnkit::detail::region_of("d_logits", dz), 1)},
        {attnkit::detail::in_place(attnkit::detail::region_of("logits", z), 1),
         attnkit::detail::region_of("targets", tg)});
    index_t counted = 0;
    for (index_t r = 0; r < N; ++r) {
        const std::int32_t t = tg(r);
        if (t >= V)
            attnkit::detail::fail("targets: expected < V = " + std::to_string(V) + " (or < 0 to ignore the row), got " +
                                  std::to_string(t) + " at [" + std::to_string(r) + "] for logits " + shape_string(z));
        counted += t >= 0 ? 1 : 0;
    }
    if (N == 0 || V == 0) return 0.0;  // V = 0: every target was negative (checked above)
    const double inv_n = counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0;
    attnkit::detail::scratch_lease<double> loss_lease;
    std::vector<double>& row_loss = loss_lease.get();
    row_loss.resize(static_cast<std::size_t>(N));
    const index_t rows_per_task = std::max<index_t>(1, kCeTaskElements / V);
    parallel_for(pool, (N + rows_per_task - 1) / rows_per_task, [&](index_t k) {
        const index_t r1 = std::min(N, (k + 1) * rows_per_task);
        for (index_t r = k * rows_per_task; r < r1; ++r) {
            const index_t t = tg(r);
            float* dr = dz.data + r * dz.strides[0];
            if (t < 0) {
                std::fill(dr, dr + V, 0.0f);
                continue;
            }
            row_loss[static_cast<std::size_t>(r)] = cross_entropy_row<A>(z.data + r * z.strides[0], t, dr, V, inv_n);
        }
    });
    double total = 0.0;
    for (index_t r = 0; r < N; ++r)
        if (tg(r) >= 0) total += row_loss[static_cast<std::size_t>(r)];
    return counted > 0 ? total / static_cast<double>(counted) : 0.0;
}

}  // namespace detail

template <class L, class T, class DL>
double cross_entropy(const L& logits, const T& targets, DL&& d_logits, thread_pool* pool = nullptr) {
    const auto z = attnkit::detail::input_view<2>("logits", logits, "[N, V]");
    const view<const std::int32_t, 1> tg = detail::ce_targets_view(targets);
    const auto dz = attnkit::detail::output_view<2>("d_logits", std::forward<DL>(d_logits), "[N, V]");
    ATTNKIT_IF_FLOAT("attnkit::model::cross_entropy: float logits and d_logits (double is for attnkit::reference)",
                     z, dz) {
        return detail::cross_entropy_run<simd::default_arch>(z, tg, dz, pool);
    }
    return 0.0;
}

}  // namespace model
}  // namespace attnkit
