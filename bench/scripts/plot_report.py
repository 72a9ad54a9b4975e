#!/usr/bin/python3
"""Draws the comparison suite's plots from Google Benchmark JSON files.

    /usr/bin/python3 bench/scripts/plot_report.py OUT_DIR RESULTS.json [MORE.json ...]

Also writes OUT_DIR/suite.md: the fastest variant at each L (prefill) and context (decode),
the lengths from which Taylor and static QK beat standard attention, each decoder schedule's
throughput relative to the all-standard model and, when the JSON of the variants' own
benchmark programs is given too (the bench-all preset), each suite row against its twin there;
a twin_recheck.json among the files (recheck_twins.py) adds the pairs re-measured side by side.

Benchmark names follow bench/variants_bench.cpp:

    <variant>/prefill/L:<L>/D:<D>/H:<H>/threads:<t>     prefill of L tokens
    <variant>/decode/ctx:<N>/D:<D>/H:<H>/threads:<t>    one decode step at context N
    decoder/<schedule>/<variant>/<phase>/threads:<t>    the decoder template (tokens/s counter)

With repetitions the median aggregate is used, else the single run. Writes, for each kind
found: prefill_time.png (log-log time against L, one line per variant and thread count),
decode_time.png (time per step against context), schedules.png (decoder tokens/s per schedule
and variant). Prints the files written; exits 1 when no plot could be drawn.
Needs Debian's python3-matplotlib (cmake/install-deps.sh installs it).
"""
import json
import os
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # no display: CI and headless machines
import matplotlib.pyplot as plt  # noqa: E402

TIME_TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def load_runs(paths):
    """name -> (time in ms, counters) from median aggregates, or runs when no aggregate."""
    medians, runs = {}, defaultdict(list)
    context = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        context.update(data.get("context", {}))
        for b in data.get("benchmarks", []):
            if b.get("error_occurred"):
                continue
            name = b.get("run_name", b["name"])
            ms = b["real_time"] * TIME_TO_MS.get(b.get("time_unit", "ns"), 1e-6)
            entry = (ms, {k: v for k, v in b.items() if isinstance(v, (int, float))})
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") == "median":
                    medians[name] = entry
            else:
                runs[name].append(entry)
    result = dict(medians)
    for name, entries in runs.items():
        if name not in result:
            entries.sort(key=lambda e: e[0])
            result[name] = entries[len(entries) // 2]
    return result, context


def parse(name):
    parts = name.split("/")
    fields = {}
    for p in parts[1:]:
        if ":" in p:
            k, v = p.split(":", 1)
            fields[k] = v
    return parts, fields


def machine_label(context):
    simd = context.get("attnkit_simd", "")
    peak = context.get("attnkit_fma_peak_gflops_per_thread", "")
    bw = context.get("attnkit_dram_read_gbs_threads_1", "")
    host = context.get("host_name", "")
    cpu = "%s, %s GFLOP/s/thread, %s GB/s read" % (simd, peak, bw) if simd else ""
    return (host + " " + cpu).strip()


def line_plot(series, xlabel, ylabel, title, path, label):
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(8, 5.5))
    # A colour per variant and a line style per thread count: with six variants at two thread
    # counts, matplotlib's ten-colour cycle would give two variants the same colour.
    names = sorted({key.split(" (")[0] for key in series})
    colours = plt.get_cmap("tab10")
    styles = ["-", "--", ":", "-."]
    threads = sorted({key.split(" (")[-1] for key in series})
    for key in sorted(series):
        pts = sorted(series[key])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key,
                color=colours(names.index(key.split(" (")[0]) % 10),
                linestyle=styles[threads.index(key.split(" (")[-1]) % len(styles)])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title + ("\n" + label if label else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def fmt_ms(x):
    return "%.3g" % x if x is not None else "-"


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def summary(runs, label):
    """Markdown: fastest variant per shape, crossovers, schedule costs (1 thread)."""
    kinds = {"prefill": ("L", "L"), "decode": ("ctx", "context")}
    text = []
    for kind, (field, title) in kinds.items():
        grid = defaultdict(dict)  # size -> variant -> ms
        for name, (ms, _) in runs.items():
            parts, f = parse(name)
            if len(parts) > 1 and parts[1] == kind and f.get("threads") == "1" and field in f:
                grid[int(f[field])][parts[0]] = ms
        if not grid:
            continue
        variants = sorted({v for row in grid.values() for v in row})
        rows = []
        for size in sorted(grid):
            row = grid[size]
            best = min(row, key=row.get)
            rows.append([str(size)] + [fmt_ms(row.get(v)) for v in variants] + [best])
        text.append("### %s, 1 thread: time in ms (fastest last)\n\n" % kind.capitalize())
        text.append(table([title] + variants + ["fastest"], rows) + "\n")
        for var in ("taylor", "static_qk", "self_gating", "mta"):
            sizes = [s for s in sorted(grid) if var in grid[s] and "softmax" in grid[s]]
            if not sizes:
                continue
            # The crossover: the smallest size from which the variant wins at every larger size,
            # winning meaning more than WIN_MARGIN faster (medians on a shared machine move by a
            # few percent: static QK at B = 1 is softmax with other inputs, and a 0.2% edge is
            # no crossover).
            cross = None
            for s in reversed(sizes):
                if grid[s][var] < (1.0 - WIN_MARGIN) * grid[s]["softmax"]:
                    cross = s
                else:
                    break
            if cross is None:
                where = "at no measured %s up to %d" % (title, sizes[-1])
            elif cross == sizes[0]:
                where = "at every measured %s (%d to %d)" % (title, sizes[0], sizes[-1])
            else:
                where = "from %s = %d on (up to %d measured)" % (title, cross, sizes[-1])
            text.append("- %s is faster than softmax (by more than %d%%) %s.\n" % (var, round(100 * WIN_MARGIN), where))
        text.append("\n")
    # Decoder schedules relative to the all-standard model.
    dec = defaultdict(dict)
    for name, (ms, counters) in runs.items():
        parts, f = parse(name)
        if parts[0] == "decoder" and len(parts) >= 4:
            tps = counters.get("tokens/s")
            if tps:
                dec[(parts[1], parts[2])][parts[3]] = tps
    base = dec.get(("uniform", "standard"))
    if dec and base:
        rows = []
        for (sched, var), ph in sorted(dec.items()):
            cells = [sched, var]
            for phase in ("prefill", "decode"):
                v = ph.get(phase)
                b = base.get(phase)
                cells.append("%.0f" % v if v else "-")
                cells.append("%.2fx" % (v / b) if v and b else "-")
            rows.append(cells)
        text.append("### Decoder (70M shape), tokens/s and ratio to the all-standard model\n\n")
        text.append(table(["schedule", "variant", "prefill tok/s", "x standard", "decode tok/s", "x standard"], rows))
    if not text:
        return ""
    return "## Comparison suite\n\n" + ("Machine: " + label + "\n\n" if label else "") + "".join(text)


# Each suite row's twin in the variant's own benchmark program (same entry point, same shape):
# (suite variant, kind) -> (own family, fields the own row must carry). "{x}" takes the suite
# row's field x; "{H*D}" the model width. Rows without a twin are listed as such.
WIN_MARGIN = 0.05

OWN_TWINS = {
    ("softmax", "prefill"): ("attnkit", {"L": "{L}", "D": "{D}", "H": "{H}", "causal": "1"}),
    ("taylor", "prefill"): ("taylor_automatic", {"L": "{L}", "D": "{D}", "H": "{H}", "causal": "1"}),
    ("self_gating", "prefill"): ("self_gating", {"L": "{L}", "D": "{D}", "H": "{H}", "causal": "1"}),
    ("static_qk", "prefill"): ("static_qk", {"B": "1", "L": "{L}", "D": "{D}", "H": "{H}"}),
    ("mta", "prefill"): ("mta_full", {"L": "{L}", "D": "{D}", "H": "{H}"}),
    ("mlp", "prefill"): ("gated_mlp", {"N": "{L}", "d_model": "{H*D}"}),
    ("softmax", "decode"): ("attnkit", {"decode": None, "Lk": "{ctx}", "D": "{D}", "H": "{H}"}),
}


def own_twin(runs, name):
    """The own-benchmark row measuring the same call as suite row `name`, or None."""
    parts, f = parse(name)
    if len(parts) < 2 or (parts[0], parts[1]) not in OWN_TWINS:
        return None
    family, want = OWN_TWINS[(parts[0], parts[1])]
    values = dict(f)
    if "H" in f and "D" in f:
        values["H*D"] = str(int(f["H"]) * int(f["D"]))
    want = {k: (v.format(**values) if v else None) for k, v in want.items()}
    want["threads"] = f.get("threads", "1")
    for other in runs:
        oparts, of = parse(other)
        if oparts[0] != family or other == name or len(oparts) < 2:
            continue
        if ("decode" in want) != (oparts[1] == "decode"):
            continue
        if all(k == "decode" or of.get(k) == v for k, v in want.items()):
            return other
    return None


def load_recheck(paths):
    """suite row -> (suite ms median, own ms median, rounds) from twin_recheck.json, if given."""
    out = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for r in data.get("twin_recheck", []):
            s, o = r["suite_ms"], r["own_ms"]
            if s and o:
                out[r["suite"]] = (statistics.median(s), statistics.median(o), len(s))
    return out


def suite_vs_own(runs, recheck=None):
    """Markdown: each suite row that has a twin in a variant's own benchmark, time ratio.

    A pair re-measured side by side (recheck_twins.py) is judged by that ratio; the others by
    the ratio of the run."""
    recheck = recheck or {}
    rows, slower = [], []
    for name in sorted(runs):
        twin = own_twin(runs, name)
        if twin is None:
            continue
        ms, own_ms = runs[name][0], runs[twin][0]
        ratio = ms / own_ms
        again = recheck.get(name)
        cells = [name.split("/min_time")[0], twin.split("/real_time")[0], fmt_ms(ms), fmt_ms(own_ms), "%.2f" % ratio]
        if again:
            cells.append("%.2f (%s / %s ms)" % (again[0] / again[1], fmt_ms(again[0]), fmt_ms(again[1])))
            ratio = again[0] / again[1]
        else:
            cells.append("")
        rows.append(cells)
        if ratio > 1.10:
            slower.append(name)
    if not rows:
        return "", []
    text = "### The suite against each variant's own benchmark (same call, same shape)\n\n"
    if recheck:
        n = max(r[2] for r in recheck.values())
        text += ("Rows more than 10%% apart in the run were measured again side by side (%d rounds of "
                 "suite row then twin, the order swapped every other round; medians): the last "
                 "column, which decides.\n\n" % n)
    text += table(["suite row", "own benchmark row", "suite ms", "own ms", "suite / own", "re-measured"], rows) + "\n"
    if slower:
        text += "Slower in the suite by more than 10%%: %s\n\n" % ", ".join(slower)
    else:
        text += "No suite row is more than 10%% slower than its own-benchmark twin (%d pairs).\n\n" % len(rows)
    return text, slower


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip())
        return 2
    out_dir, paths = argv[1], argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    rechecks = [p for p in paths if os.path.basename(p) == "twin_recheck.json"]
    paths = [p for p in paths if p not in rechecks]
    runs, context = load_runs(paths)
    label = machine_label(context)

    prefill, decode = defaultdict(list), defaultdict(list)
    schedules = defaultdict(dict)
    for name, (ms, counters) in runs.items():
        parts, f = parse(name)
        if len(parts) < 2:
            continue
        threads = f.get("threads", "1")
        if parts[1] == "prefill" and "L" in f:
            key = "%s (D=%s, %s thr)" % (parts[0], f.get("D", "?"), threads)
            prefill[key].append((int(f["L"]), ms))
        elif parts[1] == "decode" and "ctx" in f:
            key = "%s (D=%s, %s thr)" % (parts[0], f.get("D", "?"), threads)
            decode[key].append((int(f["ctx"]), ms))
        elif parts[0] == "decoder" and len(parts) >= 4:
            tps = counters.get("tokens/s") or counters.get("tokens_per_second")
            if tps:
                schedules["%s, %s thread(s)" % (parts[3], threads)][(parts[1], parts[2])] = tps

    written = []
    md = summary(runs, label)
    own_md, _ = suite_vs_own(runs, load_recheck(rechecks))
    md += own_md
    if md:
        p = os.path.join(out_dir, "suite.md")
        with open(p, "w") as f:
            f.write(md)
        written.append(p)
    p = os.path.join(out_dir, "prefill_time.png")
    if line_plot(prefill, "sequence length L", "time per prefill (ms)", "Prefill time against L", p, label):
        written.append(p)
    p = os.path.join(out_dir, "decode_time.png")
    if line_plot(decode, "context length", "time per decode step (ms)", "Decode step time against context", p, label):
        written.append(p)
    if schedules:
        p = os.path.join(out_dir, "schedules.png")
        groups = sorted(schedules)
        fig, axes = plt.subplots(len(groups), 1, figsize=(10, 4 * len(groups)), squeeze=False)
        for ax, g in zip(axes[:, 0], groups):
            items = sorted(schedules[g].items())
            ax.bar(range(len(items)), [v for _, v in items])
            ax.set_xticks(range(len(items)))
            ax.set_xticklabels(["%s\n%s" % k for k, _ in items], fontsize=7, rotation=60)
            ax.set_ylabel("tokens/s")
            ax.set_title("Decoder throughput by schedule and variant: " + g, fontsize=10)
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    for w in written:
        print(w)
    empty = [w for w in written if os.path.getsize(w) == 0]
    if empty:
        print("empty output: " + ", ".join(empty), file=sys.stderr)
        return 1
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
