// Rotary position embedding, in place, as the checkpoints of Hugging Face, Meta and GGUF use it.
// x [B, L, H, D] (float, Eigen::bfloat16 or Eigen::half, any view with contiguous rows, e.g. into
// a fused QKV buffer). The first R elements of each head (the rotary part, R = D unless partial)
// are rotated pair by pair, the rest pass through; pair c < R/2 at position p turns by the angle
// p f_c, f_c = theta^(-2c/R) changed by the frequency scaling (rope_options.hpp):
//
//   (u, v) -> (u cos - v sin, v cos + u sin) * attention_factor
//   rotate_half:  (u, v) = (x[c], x[c + R/2])   Hugging Face / GPT-NeoX: Llama, Qwen2, Mistral, ...
//   interleaved:  (u, v) = (x[2c], x[2c + 1])   GPT-J, Meta's original Llama weights, GGUF
//
//   attnkit::model::rope_options ro;              // Llama 3.1 8B: theta 5e5, llama3 scaling
//   ro.theta = 500000.0f;
//   ro.scaling.type = attnkit::model::rope_scaling_type::llama3;
//   ro.scaling.factor = 8;  ro.scaling.low_freq_factor = 1;  ro.scaling.high_freq_factor = 4;
//   ro.scaling.original_max_position_embeddings = 8192;
//   ro.position_offset = n_cached;                // prefill / decode of one sequence: row l at n_cached + l
//   attnkit::model::rope(q, ro);  attnkit::model::rope(k, ro);
//   attnkit::model::rope(k_step, positions, ro);  // ragged batch: positions [B, L] (int64 or int32)
//   attnkit::model::rope_backward(d_q, ro);       // training: dLoss/dq from dLoss/d(rope(q)), in place
//
// Positions: with a positions tensor, row (b, l) sits at positions(b, l) (>= 0), so a batch of
// sequences at different lengths decodes in one call; without one, at position_offset + l. Each
// angle and its reduction modulo pi/2 are computed in double (p f_c reaches 1e5 radians at long
// contexts, where a float argument would lose the phase), cos / sin of the reduced angle in
// float (simd::sincos), once per distinct position and frequency of the call, and shared by
// every row and head at that position. The value of every element depends only on its own input, position
// and the options: one call or many, any thread count, give the same bits.
//
// 16-bit x is read as float, rotated in float and rounded to nearest even once: exactly what
// rotating the float-converted values and rounding them would give.
//
// Errors (std::invalid_argument naming the argument and the shapes, before anything is written):
// bad options (rope_options.hpp), positions not [B, L] or negative, position_offset with a
// positions tensor, positions past int64, a view that reaches one element twice.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/rope/frequencies.hpp"
#include "attnkit/detail/rope/rotate.hpp"
#include "attnkit/model/rope_options.hpp"
#include "attnkit/simd/convert.hpp"
#include "attnkit/thread_pool.hpp"
#include "attnkit/view.hpp"

namespace attnkit {
namespace model {

namespace detail {

// What a table depends on: the options that shape the angles, the rotary dim, the positions.
struct rope_table_key {
    float theta = 0;
    rope_style style = rope_style::rotate_half;
    index_t R = 0;
    rope_scaling scaling{};

    bool same_frequencies(const rope_table_key& o) const {
        const rope_scaling &a = scaling, &b = o.scaling;
        return theta == o.theta && R == o.R && a.type == b.type && a.factor == b.factor &&
               a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
               a.original_max_position_embeddings == b.original_max_position_embeddings &&
               a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow && a.truncate == b.truncate &&
               a.attention_factor == b.attention_factor && a.mscale == b.mscale && a.mscale_all_dim == b.mscale_all_dim;
    }
};

struct rope_cache_access;

}  // namespace detail

// cos / sin tables kept between calls, for rope_options::cache. The layers of a model rotate q
// and k of a step at the same positions with the same options (2 x n_layers calls per step);
// with a cache the first call computes the angles and the others reuse its table, and a decode
// step reuses the frequencies of the previous one. Entries are keyed by everything a table
// depends on (theta, style, rotary dim, scaling, the call's distinct positions), so a hit gives
// exactly the table the call would compute: the same bits with or without a cache. Holds the
// most recent `max_tables` tables up to `max_floats` floats in all (a larger table is used once
// and not kept). Thread-safe (a mutex around lookups; tables are built outside it and shared).
class rope_cache {
   public:
    explicit rope_cache(std::size_t max_tables = 8, std::size_t max_floats = std::size_t(1) << 22)
        : max_tables_(max_tables), max_floats_(max_floats) {}
    rope_cache(const rope_cache&) = delete;
    rope_cache& operator=(const rope_cache&) = delete;

    void clear() {
        std::lock_guard<std::mutex> lk(mu_);
        entries_.clear();
    }
    // Calls whose table came from the cache / was computed.
    std::size_t hits() const {
        std::lock_guard<std::mutex> lk(mu_);
        return hits_;
    }
    std::size_t misses() const {
        std::lock_guard<std::mutex> lk(mu_);
        return misses_;
    }

   private:
    friend struct detail::rope_cache_access;
    struct entry {
        detail::rope_table_key key;
        std::vector<std::int64_t> positions;
        std::shared_ptr<const std::vector<double>> freq;
        std::shared_ptr<const std::vector<float>> table;
    };
    mutable std::mutex mu_;
    std::vector<entry> entries_;  // most recent first
    std::size_t max_tables_, max_floats_;
    std::size_t hits_ = 0, misses_ = 0;
};

namespace detail {

struct rope_cache_access {
    // The table for (key, positions), or null; freq is set when a table of the same
    // frequencies is held.
    static std::shared_ptr<const std::vector<float>> find(rope_cache& c, const rope_table_key& key,
                                                          const std::vector<std::int64_t>& positions,
                                                          std::shared_ptr<const std::vector<double>>& freq) {
        std::lock_guard<std::mutex> lk(c.mu_);
        for (std::size_t i = 0; i < c.entries_.size(); ++i) {
            rope_cache::entry& e = c.entries_[i];
            if (!e.key.same_frequencies(key)) continue;
            if (!freq) freq = e.freq;
            if (e.key.style == key.style && e.positions == positions) {
                std::rotate(c.entries_.begin(), c.entries_.begin() + static_cast<std::ptrdiff_t>(i),
                            c.entries_.begin() + static_cast<std::ptrdiff_t>(i) + 1);
                ++c.hits_;
                return c.entries_.front().table;
            }
        }
        ++c.misses_;
        return nullptr;
    }
    static void insert(rope_cache& c, const rope_table_key& key, const std::vector<std::int64_t>& positions,
                       std::shared_ptr<const std::vector<double>> freq, std::shared_ptr<const std::vector<float>> table) {
        std::lock_guard<std::mutex> lk(c.mu_);
        if (c.max_tables_ == 0 || table->size() > c.max_floats_) return;
        c.entries_.insert(c.entries_.begin(), rope_cache::entry{key, positions, std::move(freq), std::move(table)});
        std::size_t floats = 0, keep = 0;
        while (keep < c.entries_.size() && keep < c.max_tables_ &&
               floats + c.entries_[keep].table->size() <= c.max_floats_)
            floats += c.entries_[keep++].table->size();
        c.entries_.resize(keep);
    }
};

// The frequencies of the last options this thread used (a decode loop calls with the same
// options every time): R/2 pow calls and the scaling's blend are a visible part of a decode
// step's K (docs/benchmarks.md, RoPE). A memo of a pure function of the key: the same values
// either way.
inline std::shared_ptr<const std::vector<double>> frequencies_of(const rope_table_key& key, const rope_options& o) {
    thread_local rope_table_key last_key;
    thread_local std::shared_ptr<const std::vector<double>> last;
    if (!last || !last_key.same_frequencies(key)) {
        last = std::make_shared<const std::vector<double>>(attnkit::detail::rope::frequencies(o, key.R));
        last_key = key;
    }
    return last;
}

// Table rows start on a 64-byte line (rows are R or 2R floats, R even): a vector load of the
// table never straddles two lines.
constexpr index_t kRopeTableAlign = 16;
template <class V>
auto table_start(V& t) {
    const std::uintptr_t p = reinterpret_cast<std::uintptr_t>(t.data());
    return t.data() + ((64 - p % 64) % 64) / sizeof(float);
}

// Below this many elements (or angles) a call runs on the calling thread: handing a decode
// step's K to the pool costs more than rotating it (docs/benchmarks.md, RoPE).
constexpr index_t kRopeSerialElements = index_t(1) << 16;
constexpr index_t kRopeSerialAngles = index_t(1) << 13;

// A call with a positions tensor takes every row's position from it: o.position_offset must be 0.
inline void check_no_offset(const rope_options& o) {
    if (o.position_offset != 0)
        attnkit::detail::fail("opts.position_offset: expected 0 with a positions tensor (positions give every row's "
                              "position), got " + std::to_string(o.position_offset));
}

// The cos / sin table of a call: one row per distinct position, `stride` floats apart from
// `rows` (from o.cache when it holds them; `table` keeps them alive). Built on o.pool when it
// has enough angles (kRopeSerialAngles).
struct rope_table {
    std::shared_ptr<const std::vector<float>> table;
    const float* rows = nullptr;
    index_t stride = 0;
    bool interleaved = false;
};

inline rope_table make_rope_table(index_t R, const rope_options& o, const std::vector<std::int64_t>& distinct) {
    namespace rp = attnkit::detail::rope;
    using A = simd::default_arch;
    const bool interleaved = o.style == rope_style::interleaved;
    const index_t n = static_cast<index_t>(distinct.size());
    const index_t stride = rp::table_row_floats(interleaved, R);
    rope_table_key key;
    key.theta = o.theta;
    key.style = o.style;
    key.R = R;
    key.scaling = o.scaling;
    std::shared_ptr<const std::vector<double>> freq;
    std::shared_ptr<const std::vector<float>> table;
    if (o.cache) table = rope_cache_access::find(*o.cache, key, distinct, freq);
    if (!table) {
        if (!freq) freq = frequencies_of(key, o);
        auto t = std::make_shared<std::vector<float>>(static_cast<std::size_t>(n * stride + kRopeTableAlign));
        rp::build_table<A>(distinct.data(), n, *freq, rp::attention_factor(o.scaling), interleaved, table_start(*t),
                           n * (R / 2) >= kRopeSerialAngles ? o.pool : nullptr);
        table = std::move(t);
        if (o.cache) rope_cache_access::insert(*o.cache, key, distinct, freq, table);
    }
    rope_table r;
    r.rows = table_start(*table);
    r.table = std::move(table);
    r.stride = stride;
    r.interleaved = interleaved;
    return r;
}

// The distinct values of `all`, sorted, and for each entry of `all` its index among them: a
// decode batch at 16 lengths needs 16 table rows, a batch of prompts at the same offsets shares
// theirs.
inline std::vector<std::int64_t> distinct_positions(const std::vector<std::int64_t>& all, std::vector<index_t>& row) {
    std::vector<std::int64_t> distinct = all;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    row.resize(all.size());
    for (std::size_t i = 0; i < all.size(); ++i)
        row[i] = std::lower_bound(distinct.begin(), distinct.end(), all[i]) - distinct.begin();
    return distinct;
}

// x's rows at the positions of table rows, in place: row (b, l) uses table row row_of(b, l).
// kInverse rotates by -angle (rope_backward), from the same table: a cached table serves both
// directions.
template <bool kInverse, class T, class RowOf>
void rope_apply(const view<T, 4>& x, index_t R, const rope_options& o, const std::vector<std::int64_t>& distinct,
                RowOf&& row_of) {
    using A = simd::default_arch;
    const index_t B = x.dims[0], L = x.dims[1], H = x.dims[2];
    const rope_table t = make_rope_table(R, o, distinct);
    thread_pool* pool = B * L * H * R >= kRopeSerialElements ? o.pool : nullptr;
    parallel_for(pool, B * L, [&](index_t bl) {
        const index_t b = bl / L, l = bl % L;
        const float* row = t.rows + row_of(b, l) * t.stride;
        for (index_t h = 0; h < H; ++h) {
            T* p = x.ptr(b, l, h);
            attnkit::detail::rope::rope_head<A, kInverse>(p, p, row, R, R, t.interleaved);
        }
    });
}

// The rotation of the rows of n tokens at positions[0, n) (H heads of D elements each), from
// rows elsewhere into rows of the destination (kv_cache's append: k_new into the cache's pages,
// rotated in float and rounded once to the storage type). Made first, it checks the options as
// model::rope(x, positions, o) would for an x of [1, n, H, D] named `name`, so the caller can
// refuse before writing anything; then rotate(t, x, y) writes one head's row of token t: the
// form's rotation of x[0, R) and x[R, D) copied, with model::rope's arithmetic. The positions
// are the caller's own (a cache's token positions, never negative), not user input.
class rope_rows {
public:
    template <class S>
    rope_rows(const view<const S, 4>& shape, const std::int64_t* positions, const rope_options& o, const char* name)
        : R_(check_rope_options(o, shape, name)), D_(shape.dims[3]) {
        check_no_offset(o);
        const index_t n = shape.dims[1];
        if (n == 0 || R_ == 0) return;
        table_ = make_rope_table(R_, o, distinct_positions(std::vector<std::int64_t>(positions, positions + n), row_));
    }

    template <class S, class T>
    void rotate(index_t t, const S* x, T* y) const {
        if (D_ == 0) return;
        const float* row = table_.rows + row_[static_cast<std::size_t>(t)] * table_.stride;
        attnkit::detail::rope::rope_head<simd::default_arch>(x, y, row, R_, D_, table_.interleaved);
    }

private:
    index_t R_ = 0, D_ = 0;
    rope_table table_;
    std::vector<index_t> row_;
};

template <class X>
auto rope_x_view(X&& x_in) {
    auto x = attnkit::detail::output_view<4>("x", std::forward<X>(x_in), "[B, L, H, D]");
    using T = typename decltype(x)::value_type;
    static_assert(simd::kIsStorageType<T>, "attnkit::model::rope: x must be float, Eigen::bfloat16 or Eigen::half");
    attnkit::detail::check_layout("x", x);
    return x;
}

// Gradients are float (a 16-bit gradient would round every step of a backward pass).
template <class X>
auto rope_d_x_view(X&& x_in) {
    auto x = attnkit::detail::output_view<4>("d_x", std::forward<X>(x_in), "[B, L, H, D]");
    static_assert(std::is_same<typename decltype(x)::value_type, float>::value,
                  "attnkit::model::rope_backward: d_x must be float");
    attnkit::detail::check_layout("d_x", x);
    return x;
}

// The two forms of a call, for rope (kInverse false) and rope_backward (true); `name` names x in
// the messages. Row l of x at position o.position_offset + l:
template <bool kInverse, class T>
void rope_at_offset(const view<T, 4>& x, const rope_options& o, const char* name) {
    const index_t B = x.dims[0], L = x.dims[1], H = x.dims[2];
    const index_t R = check_rope_options(o, x, name);
    if (L > 0 && o.position_offset > std::numeric_limits<std::int64_t>::max() - L)
        attnkit::detail::fail("opts.position_offset: " + std::to_string(o.position_offset) + " + L = " +
                              std::to_string(L) + " overflows int64");
    // A row reached through several indices (a zero stride) would be rotated several times.
    attnkit::detail::check_outputs_apart({attnkit::detail::region_of(name, x)}, {});
    if (B == 0 || L == 0 || H == 0 || R == 0) return;
    std::vector<std::int64_t> distinct(static_cast<std::size_t>(L));
    for (index_t l = 0; l < L; ++l) distinct[static_cast<std::size_t>(l)] = o.position_offset + l;
    rope_apply<kInverse>(x, R, o, distinct, [](index_t, index_t l) { return l; });
}

// Row (b, l) of x at position positions(b, l).
template <bool kInverse, class T, class P>
void rope_at_positions(const view<T, 4>& x, const P& positions_in, const rope_options& o, const char* name) {
    const auto pos = attnkit::detail::input_view<2>("positions", positions_in, "[B, L]");
    using PT = typename decltype(pos)::value_type;
    static_assert(std::is_same<PT, std::int64_t>::value || std::is_same<PT, std::int32_t>::value,
                  "attnkit::model::rope: positions must be int64 or int32");
    const index_t B = x.dims[0], L = x.dims[1], H = x.dims[2];
    const index_t R = check_rope_options(o, x, name);
    check_no_offset(o);
    attnkit::detail::check_extent("positions", pos);
    if (pos.dims[0] != B || pos.dims[1] != L)
        attnkit::detail::fail("positions: expected shape [B, L] = [" + std::to_string(B) + ", " + std::to_string(L) +
                              "] for " + name + " " + shape_string(x) + ", got " + shape_string(pos));
    attnkit::detail::check_outputs_apart({attnkit::detail::region_of(name, x)},
                                         {attnkit::detail::region_of("positions", pos)});
    std::vector<std::int64_t> all(static_cast<std::size_t>(B * L));
    for (index_t b = 0; b < B; ++b)
        for (index_t l = 0; l < L; ++l) {
            const std::int64_t p = static_cast<std::int64_t>(pos(b, l));
            if (p < 0)
                attnkit::detail::fail("positions: expected >= 0, got " + std::to_string(p) + " at [" +
                                      std::to_string(b) + ", " + std::to_string(l) + "] of " + shape_string(pos));
            all[static_cast<std::size_t>(b * L + l)] = p;
        }
    if (B == 0 || L == 0 || H == 0 || R == 0) return;
    std::vector<index_t> row;
    const std::vector<std::int64_t> distinct = distinct_positions(all, row);
    rope_apply<kInverse>(x, R, o, distinct,
                         [&](index_t b, index_t l) { return row[static_cast<std::size_t>(b * L + l)]; });
}

}  // namespace detail

// Row l of x at position o.position_offset + l.
template <class X>
void rope(X&& x_in, const rope_options& o = {}) {
    detail::rope_at_offset<false>(detail::rope_x_view(std::forward<X>(x_in)), o, "x");
}

// Row (b, l) of x at position positions(b, l): positions [B, L], int64 or int32, >= 0, any
// strides (a [B] vector of decode positions is a view with dims {B, 1}). o.position_offset must
// be 0.
template <class X, class P,
          std::enable_if_t<attnkit::detail::tensor_traits<std::decay_t<P>>::kIsTensorish, int> = 0>
void rope(X&& x_in, const P& positions_in, const rope_options& o = {}) {
    detail::rope_at_positions<false>(detail::rope_x_view(std::forward<X>(x_in)), positions_in, o, "x");
}

// The gradient of rope with respect to its input, in place: given d_x = dLoss/d(rope(x)), leaves
// dLoss/dx in d_x. Each pair's forward is y = af R(angle) x, so this is af R(-angle) d_x, the
// transposed rotation (d_x [B, L, H, D] float; the part past the rotary dim passes through). The
// options, positions and errors are the forward's (x named d_x in messages): call it with the
// forward's options. The same table (and rope_cache entry) as the forward, the same arithmetic
// with the sine negated, so the bits are again independent of calls, threads and cache. The
// oracle: attnkit::reference::model::rope_backward.
template <class X>
void rope_backward(X&& d_x, const rope_options& o = {}) {
    detail::rope_at_offset<true>(detail::rope_d_x_view(std::forward<X>(d_x)), o, "d_x");
}

template <class X, class P,
          std::enable_if_t<attnkit::detail::tensor_traits<std::decay_t<P>>::kIsTensorish, int> = 0>
void rope_backward(X&& d_x, const P& positions, const rope_options& o = {}) {
    detail::rope_at_positions<true>(detail::rope_d_x_view(std::forward<X>(d_x)), positions, o, "d_x");
}

}  // namespace model
}  // namespace attnkit
