// A paged key/value cache for serving: fixed-size pages of tokens, a page list per sequence,
// every layer's K and V in the same pages (vLLM's layout), attention over it by paged_attention.
//
//   attnkit::kv_cache_config cfg;
//   cfg.layers = 32; cfg.heads_kv = 8; cfg.dim = 128; cfg.pages = 4096; cfg.page_rows = 64;
//   attnkit::kv_cache<Eigen::bfloat16> cache(cfg);     // float, Eigen::bfloat16, Eigen::half, std::int8_t
//   const attnkit::index_t a = cache.add_sequence(), b = cache.add_sequence();
//   // one step of continuous batching: a's prompt chunk of 300 tokens, b's next token
//   const attnkit::kv_step step = cache.begin_step({a, b}, {300, 1});   // rows of q: 301
//   for (layer ...) {
//       // q [301, H, D], k_new, v_new [301, Hk, D] from the layer's projections
//       attnkit::model::rope(q4, step.positions_tensor(), rope);      // q as [1, 301, H, D]
//       cache.append(layer, step, k_new, v_new, rope);                // K rotated on the way in
//       cache.attention(layer, step, q, out, opts);                   // out [301, H, Dv]
//   }
//   cache.truncate(b, cache.length(b) - 2);   // reject two speculative tokens
//   cache.release(a);                         // a is done: its pages are free for others
//
// begin_step reserves the pages the new tokens need and advances each sequence's length; its
// kv_step (the sequences, every new token's position, the paged_kv of paged_attention) is valid
// until the next begin_step, truncate or release, and append / attention reject any other. Each
// layer appends its rows of the step before it attends. A token at position p of a sequence is
// row p % page_rows of the sequence's page p / page_rows; pages are taken from and returned to
// one free list, so released and truncated pages serve the next sequence at once.
//
// Storage: float, or Eigen::bfloat16 / Eigen::half (rounded to nearest even once, on append;
// with RoPE, after rotating in float), or std::int8_t: each appended row (token, head) quantised
// as attnkit::quantize_kv does (int8_kv.hpp: values and one float scale, after RoPE), scales in
// pages of their own beside the values'. The kernels read the pages as stored and convert in
// their loads. An int8 cache takes float rows only, and refuses a row that is not finite (int8
// cannot hold it) before writing anything. With RoPE, K goes from k_new to its page rotated in
// one pass, on the RoPE options' pool when the step is as large as model::rope would thread (a
// prefill chunk); the rows are the same for any thread count.
//
// Errors (std::invalid_argument naming the argument, and the cache left unchanged): a config out
// of range (page_rows not a multiple of 64, sizes that overflow); an unknown or released
// sequence id, a sequence twice in one step, negative token counts, more pages than are free (a
// full cache: free_pages() says how many are); a stale step; k_new / v_new / q / out of the wrong
// shape; truncating to a negative length or past the sequence's length.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "attnkit/detail/check.hpp"
#include "attnkit/detail/huge_pages.hpp"
#include "attnkit/eigen_core.hpp"
#include "attnkit/int8_kv.hpp"
#include "attnkit/model/rope.hpp"
#include "attnkit/paged_attention.hpp"
#include "attnkit/simd/convert.hpp"

namespace attnkit {

struct kv_cache_config {
    index_t layers = 1;
    index_t heads_kv = 0;
    index_t dim = 0;
    index_t dim_v = 0;       // 0: dim
    index_t pages = 0;       // pages of page_rows tokens each, shared by every sequence
    index_t page_rows = 64;  // a positive multiple of 64 (paged_attention.hpp says why)
};

// One step of a ragged batch (kv_cache::begin_step): the sequences it advances, in order, and
// its new tokens, whose rows of q, k_new, v_new and out follow that order.
struct kv_step {
    std::vector<index_t> seqs;
    std::vector<std::int64_t> positions;  // [Tq] the position of each new token
    paged_kv kv;                          // cu_seqlens_q, lengths after the step, block table
    std::uint64_t serial = 0;             // which begin_step made it

    index_t tokens() const { return static_cast<index_t>(positions.size()); }
    // positions as a [1, Tq] view, for model::rope on q viewed as [1, Tq, H, D].
    view<const std::int64_t, 2> positions_tensor() const {
        return view<const std::int64_t, 2>(positions.data(), {1, tokens()});
    }
};

template <class T = float>
class kv_cache {
    static constexpr bool kInt8 = std::is_same<T, std::int8_t>::value;
    // Tokens per task of append's row loop when it runs on the pool.
    static constexpr index_t kAppendGrain = 16;
    static_assert(simd::kIsStorageType<T> || kInt8,
                  "attnkit::kv_cache: storage is float, Eigen::bfloat16, Eigen::half or std::int8_t");

public:
    explicit kv_cache(const kv_cache_config& cfg) : cfg_(cfg) {
        using detail::fail;
        using detail::number;
        if (cfg_.dim_v == 0) cfg_.dim_v = cfg_.dim;
        if (cfg_.layers < 1) fail("config.layers: expected >= 1, got " + number(cfg_.layers));
        if (cfg_.heads_kv < 1) fail("config.heads_kv: expected >= 1, got " + number(cfg_.heads_kv));
        if (cfg_.dim < 1) fail("config.dim: expected >= 1, got " + number(cfg_.dim));
        if (cfg_.dim_v < 1) fail("config.dim_v: expected >= 1 (0: dim), got " + number(cfg_.dim_v));
        if (cfg_.pages < 0 || cfg_.pages > std::numeric_limits<std::int32_t>::max())
            fail("config.pages: expected 0 <= pages < 2^31 (block tables are int32), got " +
                 number(cfg_.pages));
        if (cfg_.page_rows < 1 || cfg_.page_rows % detail::kPageRowsMultiple != 0)
            fail("config.page_rows: expected a positive multiple of " +
                 number(detail::kPageRowsMultiple) + ", got " + number(cfg_.page_rows));
        index_t k_elems = 0, v_elems = 0, all = 0;
        const bool fits = detail::mul_fits(cfg_.pages, cfg_.page_rows, k_elems) &&
                          detail::mul_fits(k_elems, cfg_.heads_kv, k_elems) &&
                          detail::mul_fits(k_elems, std::max(cfg_.dim, cfg_.dim_v), v_elems) &&
                          detail::mul_fits(v_elems, 2 * cfg_.layers, all) &&
                          detail::mul_fits(all, static_cast<index_t>(kInt8 ? sizeof(float) : sizeof(T)), all);
        if (!fits)
            fail(
                "config: pages * page_rows * heads_kv * (dim + dim_v) * layers overflows int64 "
                "bytes (pages = " +
                number(cfg_.pages) + ", page_rows = " + number(cfg_.page_rows) +
                ", heads_kv = " + number(cfg_.heads_kv) + ", dim = " + number(cfg_.dim) +
                ", layers = " + number(cfg_.layers) + ")");
        page_k_ = cfg_.page_rows * cfg_.heads_kv * cfg_.dim;
        page_v_ = cfg_.page_rows * cfg_.heads_kv * cfg_.dim_v;
        k_.resize(static_cast<std::size_t>(cfg_.layers));
        v_.resize(static_cast<std::size_t>(cfg_.layers));
        for (index_t l = 0; l < cfg_.layers; ++l) {
            k_[static_cast<std::size_t>(l)].assign(static_cast<std::size_t>(cfg_.pages * page_k_),
                                                   T(0.0f));
            v_[static_cast<std::size_t>(l)].assign(static_cast<std::size_t>(cfg_.pages * page_v_),
                                                   T(0.0f));
        }
        if (kInt8) {
            const std::size_t n = static_cast<std::size_t>(cfg_.pages * cfg_.page_rows * cfg_.heads_kv);
            ks_.assign(static_cast<std::size_t>(cfg_.layers), page_array<float>(n, 0.0f));
            vs_.assign(static_cast<std::size_t>(cfg_.layers), page_array<float>(n, 0.0f));
        }
        free_.reserve(static_cast<std::size_t>(cfg_.pages));
        for (index_t pg = cfg_.pages - 1; pg >= 0; --pg)
            free_.push_back(static_cast<std::int32_t>(pg));
    }

    const kv_cache_config& config() const { return cfg_; }
    index_t free_pages() const { return static_cast<index_t>(free_.size()); }
    // Sequences added and not released.
    index_t sequences() const {
        return static_cast<index_t>(
            std::count_if(seqs_.begin(), seqs_.end(), [](const seq& s) { return s.live; }));
    }

    // A new, empty sequence; the ids of released sequences are given out again.
    index_t add_sequence() {
        ++serial_;
        for (std::size_t i = 0; i < seqs_.size(); ++i)
            if (!seqs_[i].live) {
                seqs_[i] = seq{};
                seqs_[i].live = true;
                return static_cast<index_t>(i);
            }
        seqs_.push_back(seq{});
        seqs_.back().live = true;
        return static_cast<index_t>(seqs_.size() - 1);
    }

    index_t length(index_t id) const { return at("seq", id).length; }
    // The pages of a sequence, in token order.
    const std::vector<std::int32_t>& pages_of(index_t id) const { return at("seq", id).pages; }

    // Frees the sequence's pages and its id.
    void release(index_t id) {
        seq& s = at("seq", id);
        ++serial_;
        free_.insert(free_.end(), s.pages.rbegin(), s.pages.rend());
        s = seq{};
    }

    // Keeps the first `length` tokens (rejected speculative tokens, an edited prompt); pages
    // past them return to the free list.
    void truncate(index_t id, index_t length) {
        seq& s = at("seq", id);
        if (length < 0 || length > s.length)
            detail::fail("length: expected 0 <= length <= the sequence's length " +
                         detail::number(s.length) + ", got " + detail::number(length));
        ++serial_;
        const std::size_t keep =
            static_cast<std::size_t>((length + cfg_.page_rows - 1) / cfg_.page_rows);
        while (s.pages.size() > keep) {
            free_.push_back(s.pages.back());
            s.pages.pop_back();
        }
        s.length = length;
    }

    // Reserves pages for new_tokens[i] more tokens of sequence seqs[i] and advances the lengths.
    kv_step begin_step(const std::vector<index_t>& ids, const std::vector<index_t>& new_tokens) {
        using detail::fail;
        using detail::number;
        if (ids.size() != new_tokens.size())
            fail("new_tokens: expected one count per sequence, " + number(ids.size()) + ", got " +
                 number(new_tokens.size()));
        index_t need = 0, total = 0;
        for (std::size_t i = 0; i < ids.size(); ++i) {
            const seq& s = at("seqs[" + number(i) + "]", ids[i]);
            for (std::size_t j = 0; j < i; ++j)
                if (ids[j] == ids[i])
                    fail("seqs[" + number(i) + "]: sequence " + number(ids[i]) + " is also seqs[" +
                         number(j) + "]; a step takes a sequence once");
            const index_t n = new_tokens[i];
            if (n < 0 || n > detail::kMaxKeys - s.length)
                fail("new_tokens[" + number(i) +
                     "]: expected 0 <= n and length + n <= 2^24 - 1, got n = " + number(n) +
                     " after " + number(s.length) + " tokens");
            const index_t pages_after = (s.length + n + cfg_.page_rows - 1) / cfg_.page_rows;
            need += pages_after - static_cast<index_t>(s.pages.size());
            total += n;
        }
        if (need > free_pages())
            fail("new_tokens: the step needs " + number(need) + " more pages of " +
                 number(cfg_.page_rows) + " tokens, " + number(free_pages()) +
                 " are free (the cache is full: release or truncate sequences)");

        ++serial_;
        kv_step st;
        st.serial = serial_;
        st.seqs = ids;
        st.positions.reserve(static_cast<std::size_t>(total));
        st.kv.cu_seqlens_q.assign(1, 0);
        index_t max_pages = 0;
        for (std::size_t i = 0; i < ids.size(); ++i) {
            seq& s = seqs_[static_cast<std::size_t>(ids[i])];
            const index_t n = new_tokens[i];
            for (index_t t = 0; t < n; ++t) st.positions.push_back(s.length + t);
            s.length += n;
            while (static_cast<index_t>(s.pages.size()) * cfg_.page_rows < s.length) {
                s.pages.push_back(free_.back());
                free_.pop_back();
            }
            st.kv.cu_seqlens_q.push_back(st.kv.cu_seqlens_q.back() + n);
            st.kv.seq_lengths.push_back(s.length);
            max_pages = std::max(max_pages, static_cast<index_t>(s.pages.size()));
        }
        st.kv.pages_per_seq = max_pages;
        st.kv.block_table.assign(ids.size() * static_cast<std::size_t>(max_pages), 0);
        for (std::size_t i = 0; i < ids.size(); ++i) {
            const auto& pg = seqs_[static_cast<std::size_t>(ids[i])].pages;
            std::copy(pg.begin(), pg.end(),
                      st.kv.block_table.begin() + static_cast<std::ptrdiff_t>(i * max_pages));
        }
        return st;
    }

    // Writes the step's new K and V rows of `layer`: k_new [Tq, Hk, D], v_new [Tq, Hk, Dv] (float,
    // or T), rows in the step's order.
    template <class K, class V>
    void append(index_t layer, const kv_step& step, const K& k_new, const V& v_new) {
        append_impl(layer, step, detail::input_view<3>("k_new", k_new, "[Tq, Hk, D]"),
                    detail::input_view<3>("v_new", v_new, "[Tq, Hk, Dv]"), nullptr);
    }
    // The same with RoPE applied to K at each token's position (model/rope.hpp), in float before
    // the one rounding to T.
    template <class K, class V>
    void append(index_t layer, const kv_step& step, const K& k_new, const V& v_new,
                const model::rope_options& rope) {
        append_impl(layer, step, detail::input_view<3>("k_new", k_new, "[Tq, Hk, D]"),
                    detail::input_view<3>("v_new", v_new, "[Tq, Hk, Dv]"), &rope);
    }

    // paged_attention of the step's queries q [Tq, H, D] over `layer`: out [Tq, H, Dv] (and lse
    // [Tq, H]). opts as softmax_attention's, key_lengths empty.
    template <class Q, class O>
    void attention(index_t layer, const kv_step& step, const Q& q, O&& out,
                   const softmax_options& opts = {}) const {
        check_step(step);
        paged_attention(q, k_pages(layer), v_pages(layer), step.kv, std::forward<O>(out), opts);
    }
    template <class Q, class O, class L,
              std::enable_if_t<detail::kIsLseArg<L, softmax_options>, int> = 0>
    void attention(index_t layer, const kv_step& step, const Q& q, O&& out, L&& lse,
                   const softmax_options& opts = {}) const {
        check_step(step);
        paged_attention(q, k_pages(layer), v_pages(layer), step.kv, std::forward<O>(out),
                        std::forward<L>(lse), opts);
    }

    // A layer's pages: [pages, page_rows, Hk, D] and [pages, page_rows, Hk, Dv]; for int8, an
    // int8_kv of those values and their scales [pages, page_rows, Hk].
    auto k_pages(index_t layer) const { return pages_of_layer(k_, ks_, layer, cfg_.dim); }
    auto v_pages(index_t layer) const { return pages_of_layer(v_, vs_, layer, cfg_.dim_v); }

private:
    struct seq {
        bool live = false;
        index_t length = 0;
        std::vector<std::int32_t> pages;
    };

    template <class Name>
    seq& at(const Name& name, index_t id) {
        return const_cast<seq&>(static_cast<const kv_cache&>(*this).at(name, id));
    }
    template <class Name>
    const seq& at(const Name& name, index_t id) const {
        if (id < 0 || id >= static_cast<index_t>(seqs_.size()) ||
            !seqs_[static_cast<std::size_t>(id)].live)
            detail::fail(std::string(name) + ": no live sequence " + detail::number(id) +
                         " (ids below " + detail::number(seqs_.size()) +
                         ", released ones excluded)");
        return seqs_[static_cast<std::size_t>(id)];
    }
    std::size_t layer_index(index_t layer) const {
        if (layer < 0 || layer >= cfg_.layers)
            detail::fail("layer: expected 0 <= layer < " + detail::number(cfg_.layers) + ", got " +
                         detail::number(layer));
        return static_cast<std::size_t>(layer);
    }
    // The pages of each layer, in memory advised as huge pages (detail/huge_pages.hpp: decode
    // streams them whole at every step).
    template <class E>
    using page_array = std::vector<E, detail::huge_page_allocator<E>>;
    auto pages_of_layer(const std::vector<page_array<T>>& x, const std::vector<page_array<float>>& s,
                        index_t layer, index_t dim) const {
        const std::size_t li = layer_index(layer);
        const view<const T, 4> values(x[li].data(), {cfg_.pages, cfg_.page_rows, cfg_.heads_kv, dim});
        if constexpr (kInt8)
            return int8_kv(values, view<const float, 3>(s[li].data(), {cfg_.pages, cfg_.page_rows, cfg_.heads_kv}));
        else
            return values;
    }
    void check_step(const kv_step& step) const {
        if (step.serial != serial_)
            detail::fail(
                "step: not the cache's current step (a begin_step, truncate, release or "
                "add_sequence came "
                "after it)");
    }

    template <class KT, class VT>
    void append_impl(index_t layer, const kv_step& step, const view<const KT, 3>& kn,
                     const view<const VT, 3>& vn, const model::rope_options* rope) {
        static_assert(
            (std::is_same<KT, float>::value || (std::is_same<KT, T>::value && !kInt8)) &&
                (std::is_same<VT, float>::value || (std::is_same<VT, T>::value && !kInt8)),
            "attnkit::kv_cache::append: k_new and v_new are float or the cache's 16-bit storage type");
        const std::size_t li = layer_index(layer);
        check_step(step);
        const index_t Tq = step.tokens(), Hk = cfg_.heads_kv;
        detail::check_layout("k_new", kn);
        detail::check_layout("v_new", vn);
        detail::check_shape("k_new", kn, {Tq, Hk, cfg_.dim}, "[Tq, Hk, D]");
        detail::check_shape("v_new", vn, {Tq, Hk, cfg_.dim_v}, "[Tq, Hk, Dv]");
        if (Tq == 0) return;
        // RoPE on the way in: K rotated from k_new straight into its slot, in float, rounded once
        // to T (int8: into a float buffer first, whose rows are then quantised). The options and
        // positions are checked here, before anything is written.
        std::optional<model::detail::rope_rows> rot;
        if (rope)
            rot.emplace(view<const KT, 4>(kn.data, {1, Tq, Hk, cfg_.dim}), step.positions.data(), *rope, "k_new");
        thread_pool* pool =
            rope && Tq * Hk * cfg_.dim >= model::detail::kRopeSerialElements ? rope->pool : nullptr;
        if constexpr (kInt8) {
            if (rot) {
                rotated_.resize(static_cast<std::size_t>(Tq * Hk * cfg_.dim));
                parallel_for(pool, 0, Tq, kAppendGrain, [&](std::int64_t t0, std::int64_t t1) {
                    for (index_t t = t0; t < t1; ++t)
                        for (index_t h = 0; h < Hk; ++h)
                            rot->rotate(t, kn.ptr(t, h), rotated_.data() + (t * Hk + h) * cfg_.dim);
                });
            }
        }
        // Row (t, h) of K as it is to be quantised (int8 caches: float rows only).
        auto k_row_at = [&](index_t t, index_t h) -> const KT* {
            if constexpr (kInt8)
                if (rot) return rotated_.data() + (t * Hk + h) * cfg_.dim;
            return kn.ptr(t, h);
        };
        // int8: every row's max |x| first, so that a row int8 cannot hold is refused before
        // anything is written.
        if constexpr (kInt8) {
            amax_.resize(static_cast<std::size_t>(2 * Tq * Hk));
            for (index_t t = 0; t < Tq; ++t)
                for (index_t h = 0; h < Hk; ++h) {
                    bool k_ok = true, v_ok = true;
                    amax_[static_cast<std::size_t>(2 * (t * Hk + h))] =
                        detail::row_amax<simd::default_arch>(k_row_at(t, h), cfg_.dim, k_ok);
                    amax_[static_cast<std::size_t>(2 * (t * Hk + h) + 1)] =
                        detail::row_amax<simd::default_arch>(vn.ptr(t, h), cfg_.dim_v, v_ok);
                    if (!k_ok || !v_ok)
                        detail::fail(std::string(k_ok ? "v_new" : "k_new") + ": row (" + detail::number(t) + ", " +
                                     detail::number(h) + ") is not finite" + (rope && !k_ok ? " after RoPE" : "") +
                                     "; an int8 cache cannot hold it");
                }
        }
        T* K = k_[li].data();
        T* V = v_[li].data();
        slots_.resize(static_cast<std::size_t>(Tq));
        for (std::size_t i = 0, t = 0; i < step.seqs.size(); ++i) {
            const auto& pages = seqs_[static_cast<std::size_t>(step.seqs[i])].pages;
            const index_t n = step.kv.cu_seqlens_q[i + 1] - step.kv.cu_seqlens_q[i];
            for (index_t j = 0; j < n; ++j, ++t) {
                const index_t pos = step.positions[t];
                slots_[t] = static_cast<index_t>(pages[static_cast<std::size_t>(pos / cfg_.page_rows)]) * cfg_.page_rows +
                           pos % cfg_.page_rows;
            }
        }
        // Every token's rows go to their own slot, so tokens split over threads freely; a step
        // large enough for model::rope to use the pool (a prefill chunk) uses it here too.
        parallel_for(pool, 0, Tq, kAppendGrain, [&](std::int64_t t0, std::int64_t t1) {
            for (index_t t = t0; t < t1; ++t) {
                const index_t slot = slots_[static_cast<std::size_t>(t)];
                for (index_t h = 0; h < Hk; ++h) {
                    T* kd = K + (slot * Hk + h) * cfg_.dim;
                    T* vd = V + (slot * Hk + h) * cfg_.dim_v;
                    if constexpr (kInt8) {
                        const std::size_t at = static_cast<std::size_t>(t * Hk + h);
                        ks_[li][static_cast<std::size_t>(slot * Hk + h)] =
                            detail::quantize_row(k_row_at(t, h), cfg_.dim, amax_[2 * at], kd);
                        vs_[li][static_cast<std::size_t>(slot * Hk + h)] =
                            detail::quantize_row(vn.ptr(t, h), cfg_.dim_v, amax_[2 * at + 1], vd);
                    } else {
                        if (rot)
                            rot->rotate(t, kn.ptr(t, h), kd);
                        else
                            store_row(kn.ptr(t, h), kd, cfg_.dim);
                        store_row(vn.ptr(t, h), vd, cfg_.dim_v);
                    }
                }
            }
        });
    }

    template <class S>
    static void store_row(const S* src, T* dst, index_t n) {
        if constexpr (kInt8) {
            (void)src, (void)dst, (void)n;  // int8 rows are quantised in append_impl
        } else if constexpr (std::is_same<S, T>::value) {
            std::copy_n(src, n, dst);
        } else {
            using A = simd::default_arch;
            constexpr index_t W = simd::kLanes<A>;
            index_t c = 0;
            for (; c + W <= n; c += W) simd::store_float<A>(dst + c, simd::loadu<A>(src + c));
            for (; c < n; ++c) dst[c] = T(src[c]);
        }
    }

    kv_cache_config cfg_;
    index_t page_k_ = 0, page_v_ = 0;
    std::vector<page_array<T>> k_, v_;
    std::vector<page_array<float>> ks_, vs_;  // int8: the scale of each (page row, head)
    std::vector<float> amax_;                  // int8: append's per-row max |x|
    std::vector<std::int32_t> free_;  // a stack: the most recently freed page is reused first
    std::vector<seq> seqs_;
    std::vector<float> rotated_;  // int8 with RoPE: the rotated K rows, quantised from there
    std::vector<index_t> slots_;  // append: each new token's page row
    std::uint64_t serial_ = 0;
};

}  // namespace attnkit
