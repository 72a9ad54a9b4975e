// attnkit benchmarks: turn a Google Benchmark JSON file into a Markdown report.
//
//   attnkit_bench_report <results.json> [--baseline FAMILY] [--output FILE.md]
//
// Prints the machine (FMA peak, DRAM bandwidth) and one table per kind of case (prefill,
// decode): one row per shape, for every family found in the file (whatever they are) its
// GFLOP/s and peak fraction (decode: GB/s and bandwidth fraction too), and every family's
// speedup over the baseline family (default `materialised`). Benchmark names are
// "<family>/<key:value>/.../threads:N"; the suffixes Google Benchmark adds (real_time,
// iterations:, repeats:, min_time:, ...) are ignored. With repetitions the median aggregate is
// used (or the median of the repetitions when the file has no aggregates).
//
// No dependencies: a small JSON parser (enough for any JSON, including the NaN / Infinity that
// Google Benchmark writes for non-finite counters).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

// ---------------------------------------------------------------------------------------------
// JSON.
struct json {
    enum class kind { null, boolean, number, string, array, object };
    kind k = kind::null;
    bool b = false;
    double n = 0;
    std::string s;
    std::vector<json> a;
    std::vector<std::pair<std::string, json>> o;

    const json* get(const std::string& key) const {
        if (k != kind::object) return nullptr;
        for (const auto& kv : o)
            if (kv.first == key) return &kv.second;
        return nullptr;
    }
    std::string str(const std::string& key, const std::string& dflt = "") const {
        const json* v = get(key);
        return v && v->k == kind::string ? v->s : dflt;
    }
    bool flag(const std::string& key) const {
        const json* v = get(key);
        return v && v->k == kind::boolean && v->b;
    }
};

class json_parser {
   public:
    explicit json_parser(const std::string& text) : t_(text) {}
    json parse() {
        json v = value();
        ws();
        if (i_ != t_.size()) fail("trailing characters");
        return v;
    }

   private:
    [[noreturn]] void fail(const std::string& what) const {
        std::size_t line = 1;
        for (std::size_t j = 0; j < i_ && j < t_.size(); ++j) line += t_[j] == '\n';
        throw std::runtime_error("JSON parse error at line " + std::to_string(line) + ": " + what);
    }
    void ws() {
        while (i_ < t_.size() && std::strchr(" \t\r\n", t_[i_]) != nullptr) ++i_;
    }
    bool literal(const char* w) {
        const std::size_t n = std::strlen(w);
        if (t_.compare(i_, n, w) != 0) return false;
        i_ += n;
        return true;
    }
    json value() {
        ws();
        if (i_ >= t_.size()) fail("unexpected end");
        json v;
        const char c = t_[i_];
        if (c == '{') {
            v.k = json::kind::object;
            ++i_;
            ws();
            if (i_ < t_.size() && t_[i_] == '}') { ++i_; return v; }
            for (;;) {
                ws();
                if (i_ >= t_.size() || t_[i_] != '"') fail("expected a key");
                std::string key = string();
                ws();
                if (i_ >= t_.size() || t_[i_] != ':') fail("expected ':'");
                ++i_;
                v.o.emplace_back(std::move(key), value());
                ws();
                if (i_ < t_.size() && t_[i_] == ',') { ++i_; continue; }
                if (i_ < t_.size() && t_[i_] == '}') { ++i_; return v; }
                fail("expected ',' or '}'");
            }
        }
        if (c == '[') {
            v.k = json::kind::array;
            ++i_;
            ws();
            if (i_ < t_.size() && t_[i_] == ']') { ++i_; return v; }
            for (;;) {
                v.a.push_back(value());
                ws();
                if (i_ < t_.size() && t_[i_] == ',') { ++i_; continue; }
                if (i_ < t_.size() && t_[i_] == ']') { ++i_; return v; }
                fail("expected ',' or ']'");
            }
        }
        if (c == '"') {
            v.k = json::kind::string;
            v.s = string();
            return v;
        }
        if (literal("true")) { v.k = json::kind::boolean; v.b = true; return v; }
        if (literal("false")) { v.k = json::kind::boolean; return v; }
        if (literal("null")) return v;
        v.k = json::kind::number;
        if (literal("NaN") || literal("-NaN")) { v.n = std::nan(""); return v; }
        if (literal("Infinity") || literal("inf")) { v.n = HUGE_VAL; return v; }
        if (literal("-Infinity") || literal("-inf")) { v.n = -HUGE_VAL; return v; }
        const char* start = t_.c_str() + i_;
        char* end = nullptr;
        v.n = std::strtod(start, &end);
        if (end == start) fail(std::string("unexpected character '") + c + "'");
        i_ += static_cast<std::size_t>(end - start);
        return v;
    }
    std::string string() {
        ++i_;  // opening quote
        std::string out;
        while (i_ < t_.size() && t_[i_] != '"') {
            char c = t_[i_++];
            if (c != '\\') { out += c; continue; }
            if (i_ >= t_.size()) fail("bad escape");
            c = t_[i_++];
            switch (c) {
                case 'n': out += '\n'; break;
                case 't': out += '\t'; break;
                case 'r': out += '\r'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'u': {
                    if (i_ + 4 > t_.size()) fail("bad \\u escape");
                    unsigned cp = static_cast<unsigned>(std::stoul(t_.substr(i_, 4), nullptr, 16));
                    i_ += 4;
                    if (cp < 0x80) {
                        out += static_cast<char>(cp);
                    } else if (cp < 0x800) {
                        out += static_cast<char>(0xC0 | (cp >> 6));
                        out += static_cast<char>(0x80 | (cp & 0x3F));
                    } else {  // surrogate pairs are not needed for benchmark output
                        out += static_cast<char>(0xE0 | (cp >> 12));
                        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                        out += static_cast<char>(0x80 | (cp & 0x3F));
                    }
                    break;
                }
                default: out += c;  // \" \\ \/
            }
        }
        if (i_ >= t_.size()) fail("unterminated string");
        ++i_;
        return out;
    }
    const std::string& t_;
    std::size_t i_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Results.
struct result {
    std::string family, shape;      // "materialised", "L:1024/D:64/H:8/causal:1/threads:1"
    std::map<std::string, std::string> fields;  // L -> 1024, ...; decode -> ""
    std::map<std::string, std::vector<double>> samples;  // counter -> value per repetition
    std::map<std::string, double> median;                // from the median aggregate
    std::string error;
    int repetitions = 0;

    double get(const std::string& counter) const {
        auto m = median.find(counter);
        if (m != median.end()) return m->second;
        auto s = samples.find(counter);
        if (s == samples.end() || s->second.empty()) return std::nan("");
        std::vector<double> v = s->second;
        std::sort(v.begin(), v.end());
        const std::size_t n = v.size();
        return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    }
    bool decode() const { return fields.count("decode") != 0; }
};

bool gb_suffix(const std::string& seg) {
    for (const char* p : {"iterations:", "repeats:", "min_time:", "min_warmup_time:"})
        if (seg.compare(0, std::strlen(p), p) == 0) return true;
    return seg == "real_time" || seg == "manual_time" || seg == "process_time";
}

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    std::istringstream in(s);
    while (std::getline(in, cur, sep)) out.push_back(cur);
    return out;
}

// Counters: every numeric top-level key that is not one of Google Benchmark's own.
bool is_counter(const std::string& key) {
    static const char* own[] = {"family_index", "per_family_instance_index", "repetitions",
                                "repetition_index", "threads", "iterations", "real_time",
                                "cpu_time", "time_unit", "big_o", "rms"};
    for (const char* o : own)
        if (key == o) return false;
    return true;
}

std::string fmt_num(double x) {
    if (!std::isfinite(x)) return "n/a";
    char b[32];
    const double a = std::fabs(x);
    std::snprintf(b, sizeof b, a >= 100 ? "%.0f" : a >= 10 ? "%.1f" : a >= 1 ? "%.2f" : "%.3f", x);
    return b;
}
std::string fmt_pct(double x) {
    if (!std::isfinite(x)) return "n/a";
    char b[32];
    std::snprintf(b, sizeof b, x >= 0.1 ? "%.0f%%" : "%.1f%%", 100 * x);
    return b;
}
std::string fmt_speedup(double x) {
    if (!std::isfinite(x)) return "n/a";
    char b[32];
    std::snprintf(b, sizeof b, x >= 10 ? "%.1fx" : x >= 0.1 ? "%.2fx" : "%.3fx", x);
    return b;
}

// Markdown table writer.
struct table {
    std::vector<std::string> head;
    std::vector<bool> right;  // right-align (numbers)
    std::vector<std::vector<std::string>> rows;
    void print(std::ostream& os) const {
        std::vector<std::size_t> w(head.size(), 3);
        for (std::size_t c = 0; c < head.size(); ++c) w[c] = std::max(w[c], head[c].size());
        for (const auto& r : rows)
            for (std::size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], r[c].size());
        auto cell = [&](const std::string& s, std::size_t c) {
            const std::string pad(w[c] - s.size(), ' ');
            return right[c] ? pad + s : s + pad;
        };
        os << '|';
        for (std::size_t c = 0; c < head.size(); ++c) os << ' ' << cell(head[c], c) << " |";
        os << "\n|";
        for (std::size_t c = 0; c < head.size(); ++c)
            os << (right[c] ? std::string(w[c] + 1, '-') + ":|" : ' ' + std::string(w[c], '-') + " |");
        os << '\n';
        for (const auto& r : rows) {
            os << '|';
            for (std::size_t c = 0; c < head.size(); ++c) os << ' ' << cell(c < r.size() ? r[c] : "", c) << " |";
            os << '\n';
        }
    }
};

struct report {
    const json& root;
    std::vector<result> results;  // in the order of the file
    std::string baseline;

    result* find(const std::string& family, const std::string& shape) {
        for (auto& r : results)
            if (r.family == family && r.shape == shape) return &r;
        return nullptr;
    }

    void load() {
        const json* bms = root.get("benchmarks");
        if (!bms || bms->k != json::kind::array) throw std::runtime_error("no \"benchmarks\" array");
        for (const json& b : bms->a) {
            std::string run = b.str("run_name", b.str("name"));
            std::vector<std::string> segs;
            for (const std::string& s : split(run, '/'))
                if (!gb_suffix(s)) segs.push_back(s);
            if (segs.empty()) continue;
            std::string family = segs[0], shape;
            for (std::size_t i = 1; i < segs.size(); ++i) shape += (i > 1 ? "/" : "") + segs[i];
            result* r = find(family, shape);
            if (!r) {
                results.emplace_back();
                r = &results.back();
                r->family = family;
                r->shape = shape;
                for (std::size_t i = 1; i < segs.size(); ++i) {
                    const auto c = segs[i].find(':');
                    if (c == std::string::npos) r->fields[segs[i]] = "";
                    else r->fields[segs[i].substr(0, c)] = segs[i].substr(c + 1);
                }
            }
            if (b.flag("error_occurred")) {
                r->error = b.str("error_message", "error");
                continue;
            }
            const bool aggregate = b.str("run_type") == "aggregate";
            if (aggregate && b.str("aggregate_name") != "median") continue;
            if (!aggregate) ++r->repetitions;
            for (const auto& kv : b.o) {
                if (kv.second.k != json::kind::number || !is_counter(kv.first)) continue;
                if (aggregate) r->median[kv.first] = kv.second.n;
                else r->samples[kv.first].push_back(kv.second.n);
            }
            // Seconds per iteration, for families without FLOP/s.
            const json* rt = b.get("real_time");
            if (rt && rt->k == json::kind::number) {
                const std::string u = b.str("time_unit", "ns");
                const double s = rt->n * (u == "s" ? 1 : u == "ms" ? 1e-3 : u == "us" ? 1e-6 : 1e-9);
                if (aggregate) r->median["seconds"] = s;
                else r->samples["seconds"].push_back(s);
            }
        }
    }

    void machine(std::ostream& os) {
        const json* ctx = root.get("context");
        os << "# attnkit softmax attention benchmarks\n\n";
        if (ctx) {
            os << "- Host: " << ctx->str("host_name", "?") << ", " << ctx->str("date", "?");
            if (const json* n = ctx->get("num_cpus")) os << ", " << static_cast<long>(n->n) << " CPUs";
            if (const json* m = ctx->get("mhz_per_cpu")) os << " @ " << static_cast<long>(m->n) << " MHz";
            if (const json* l = ctx->get("load_avg"); l && l->k == json::kind::array && !l->a.empty()) {
                os << ", load average";
                for (const json& x : l->a) os << ' ' << fmt_num(x.n);
            }
            os << '\n';
            const json* l = ctx->get("load_avg");
            const json* n = ctx->get("num_cpus");
            if (l && l->k == json::kind::array && !l->a.empty() && n && n->n > 0 &&
                l->a[0].n >= 0.5 * n->n)
                os << "- **Warning: the machine was busy when the run started (1-minute load "
                   << fmt_num(l->a[0].n) << " on " << static_cast<long>(n->n)
                   << " CPUs): timings include other processes; compare ratios within one run.**\n";
            if (!ctx->str("attnkit_simd").empty()) os << "- Kernel ISA (compile flags): " << ctx->str("attnkit_simd") << '\n';
        }
        // FMA peak: the per-process measurement behind peak_frac, and the BM_fma_peak rows.
        os << "- FP32 FMA peak per thread";
        if (ctx && !ctx->str("attnkit_fma_peak_gflops_per_thread").empty())
            os << ": " << ctx->str("attnkit_fma_peak_gflops_per_thread")
               << " GFLOP/s (best run in thread CPU time; range " << ctx->str("attnkit_fma_peak_gflops_range")
               << "), the denominator of peak_frac (x threads)";
        for (const auto& r : results)
            if (r.family == "BM_fma_peak")
                os << "; BM_fma_peak " << r.shape << ": " << fmt_num(r.get("FLOP/s") * 1e-9) << " GFLOP/s";
        os << '\n';
        os << "- DRAM read bandwidth";
        bool first = true;
        if (ctx)
            for (const auto& kv : ctx->o)
                if (kv.first.rfind("attnkit_dram_read_gbs_threads_", 0) == 0) {
                    const std::string n = kv.first.substr(kv.first.rfind('_') + 1);
                    os << (first ? ": " : ", ") << kv.second.s << " GB/s with " << n
                       << (n == "1" ? " thread" : " threads");
                    first = false;
                }
        if (!first) os << " (best of 5 passes, the denominator of bw_frac)";
        for (const auto& r : results)
            if (r.family == "BM_dram_read" || r.family == "BM_dram_triad")
                os << "; " << r.family << ' ' << r.shape << ": " << fmt_num(r.get("GB/s")) << " GB/s";
        os << '\n';
        if (ctx && ctx->str("library_build_type") == "debug")
            os << "- Note: the Google Benchmark library reports a debug build (timing loop only; "
                  "the kernels are built with the project's flags).\n";
    }

    // Families of one table: in registration order (the program's "attnkit_families" context),
    // then any others in order of appearance.
    std::vector<std::string> families(bool decode) const {
        std::vector<std::string> f;
        const json* ctx = root.get("context");
        for (const std::string& name : split(ctx ? ctx->str("attnkit_families") : "", ','))
            for (const auto& r : results)
                if (r.family == name && r.decode() == decode) {
                    f.push_back(name);
                    break;
                }
        for (const auto& r : results)
            if (r.family.compare(0, 3, "BM_") != 0 && r.decode() == decode &&
                std::find(f.begin(), f.end(), r.family) == f.end())
                f.push_back(r.family);
        return f;
    }

    void attention_table(std::ostream& os, bool decode) {
        const std::vector<std::string> fams = families(decode);
        if (fams.empty()) return;
        // Shapes in order of appearance; shape columns from the key:value fields.
        std::vector<std::string> shapes;
        std::vector<std::string> cols;
        for (const auto& r : results) {
            if (r.family.compare(0, 3, "BM_") == 0 || r.decode() != decode) continue;
            if (std::find(shapes.begin(), shapes.end(), r.shape) == shapes.end()) shapes.push_back(r.shape);
            for (const std::string& s : split(r.shape, '/')) {
                const auto c = s.find(':');
                if (c == std::string::npos) continue;
                std::string k = s.substr(0, c);
                if (k == "Hk") continue;  // shown with H as "H/Hk"
                if (std::find(cols.begin(), cols.end(), k) == cols.end()) cols.push_back(k);
            }
        }
        const bool have_base = std::find(fams.begin(), fams.end(), baseline) != fams.end();
        table t;
        for (const auto& c : cols) {
            t.head.push_back(c == "H" ? "H/Hk" : c);
            t.right.push_back(true);
        }
        for (const auto& f : fams) {
            if (decode) {
                t.head.push_back(f + " GB/s");
                t.head.push_back(f + " bw");
                t.right.insert(t.right.end(), 2, true);
            }
            t.head.push_back(f + " GFLOP/s");
            t.head.push_back(f + " peak");
            t.right.insert(t.right.end(), 2, true);
        }
        if (have_base)
            for (const auto& f : fams)
                if (f != baseline) {
                    t.head.push_back(f + " / " + baseline);
                    t.right.push_back(true);
                }
        for (const auto& shape : shapes) {
            // A row with no number in it is left out, and so is a table without rows: a program's
            // layout applied to another program's JSON (the comparison suite's counters are not
            // these columns) would otherwise print rows of n/a.
            bool has_value = false;
            std::vector<std::string> row;
            const result* any = nullptr;
            for (const auto& f : fams)
                if ((any = find(f, shape)) != nullptr) break;
            for (const auto& c : cols) {
                auto it = any->fields.find(c);
                std::string v = it == any->fields.end() ? "" : it->second;
                if (c == "H") {
                    auto hk = any->fields.find("Hk");
                    if (hk != any->fields.end()) v += "/" + hk->second;
                }
                row.push_back(v);
            }
            const result* base = have_base ? find(baseline, shape) : nullptr;
            auto rate = [&](const result* r) {
                if (!r || !r->error.empty()) return std::nan("");
                const double fl = r->get("FLOP/s");
                return std::isfinite(fl) ? fl : 1.0 / r->get("seconds");
            };
            for (const auto& f : fams) {
                const result* r = find(f, shape);
                const bool ok = r && r->error.empty();
                const std::string missing = r ? "error" : "-";
                if (decode) {
                    row.push_back(ok ? fmt_num(r->get("GB/s")) : missing);
                    row.push_back(ok ? fmt_pct(r->get("bw_frac")) : missing);
                    has_value = has_value || (ok && (std::isfinite(r->get("GB/s")) ||
                                                     std::isfinite(r->get("bw_frac"))));
                }
                row.push_back(ok ? fmt_num(r->get("FLOP/s") * 1e-9) : missing);
                row.push_back(ok ? fmt_pct(r->get("peak_frac")) : missing);
                has_value = has_value || (ok && (std::isfinite(r->get("FLOP/s")) ||
                                                 std::isfinite(r->get("peak_frac"))));
            }
            if (have_base)
                for (const auto& f : fams)
                    if (f != baseline) {
                        const result* r = find(f, shape);
                        row.push_back(r && base ? fmt_speedup(rate(r) / rate(base)) : "-");
                    }
            if (has_value) t.rows.push_back(std::move(row));
        }
        if (t.rows.empty()) return;
        os << '\n' << (decode ? "## Decode (Lq = 1 against a KV cache)\n\n" : "## Prefill\n\n");
        if (decode)
            os << "GB/s: K/V bytes streamed per second (K/V cycled through copies >= 4x LLC, so "
                  "from DRAM); bw: fraction of the measured DRAM read bandwidth with as many "
                  "threads. ";
        os << "GFLOP/s: useful FLOPs (4 x D per visible query-key pair and head" << (decode ? "" : "; causal counts only the visible half")
           << "); peak: fraction of the measured FMA peak x threads. Speedups are time ratios on the same shape.\n\n";
        t.print(os);
    }

    void notes(std::ostream& os) {
        int reps = 0, medians = 0;
        std::vector<std::string> errors;
        for (const auto& r : results) {
            reps = std::max(reps, r.repetitions);
            medians += !r.median.empty();
            if (!r.error.empty()) errors.push_back("- `" + r.family + "/" + r.shape + "`: " + r.error);
        }
        os << "\nValues: " << (medians ? "medians of " + std::to_string(reps) + " repetitions (where run with repetitions)"
                                       : std::string("one run per benchmark")) << ".\n";
        if (!errors.empty()) {
            os << "\nFailed or skipped benchmarks:\n\n";
            for (const auto& e : errors) os << e << '\n';
        }
    }
};

}  // namespace

int main(int argc, char** argv) {
    std::string in_path, out_path, baseline = "materialised";
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if ((a == "--baseline" || a == "--output") && i + 1 < argc) {
            (a == "--baseline" ? baseline : out_path) = argv[++i];
        } else if (a == "-h" || a == "--help") {
            std::cout << "usage: " << argv[0] << " <results.json> [--baseline FAMILY] [--output FILE.md]\n";
            return 0;
        } else if (in_path.empty()) {
            in_path = a;
        } else {
            std::cerr << "unexpected argument: " << a << '\n';
            return 2;
        }
    }
    if (in_path.empty()) {
        std::cerr << "usage: " << argv[0] << " <results.json> [--baseline FAMILY] [--output FILE.md]\n";
        return 2;
    }
    std::ifstream f(in_path, std::ios::binary);
    if (!f) {
        std::cerr << "cannot read " << in_path << '\n';
        return 1;
    }
    std::stringstream buf;
    buf << f.rdbuf();
    const std::string text = buf.str();
    try {
        const json root = json_parser(text).parse();
        report r{root, {}, baseline};
        r.load();
        std::ostringstream os;
        r.machine(os);
        r.attention_table(os, false);
        r.attention_table(os, true);
        r.notes(os);
        std::cout << os.str();
        if (!out_path.empty()) {
            std::ofstream out(out_path);
            out << os.str();
            if (!out) {
                std::cerr << "cannot write " << out_path << '\n';
                return 1;
            }
        }
    } catch (const std::exception& e) {
        std::cerr << in_path << ": " << e.what() << '\n';
        return 1;
    }
    return 0;
}
