#!/usr/bin/python3
"""The training comparison's report: reads the JSON of attnkit_train_compare and writes
train_report.md (tables: mean and spread over seeds per task, variant and schedule; training
tokens/s; time in attnkit kernels and GEMMs; the text task's attention diagnostics) and one
PNG of loss curves per task (mean over seeds, the band between the lowest and highest seed).

    /usr/bin/python3 plot_training.py train_results.json OUT_DIR
"""
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TASK_TITLES = {
    "mqar": "MQAR (multi-query associative recall)",
    "blocks": "Block task of the MTA paper",
    "text": "Character-level language model (fortunes)",
}
MEASURE = {"mqar": ("recall accuracy", False), "blocks": ("error rate", True), "text": (None, False)}


def spread(values):
    """'mean ± half the range' over seeds (the range says more than a deviation of 3 numbers)."""
    m = statistics.mean(values)
    if len(values) < 2:
        return f"{m:.3f}"
    return f"{m:.3f} ± {(max(values) - min(values)) / 2:.3f}"


def group(runs):
    out = {}
    for r in runs:
        out.setdefault((r["task"], r["variant"], r["schedule"]), []).append(r)
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    data = json.load(open(sys.argv[1]))
    out_dir = sys.argv[2]
    plots = os.path.join(out_dir, "plots")
    os.makedirs(plots, exist_ok=True)
    groups = group(data["runs"])
    tasks = [t for t in ("mqar", "blocks", "text") if any(k[0] == t for k in groups)]
    lines = [
        "# Training comparison",
        "",
        f"Machine: {data['machine']}; {data['threads']} threads; "
        f"{'quick mode, ' if data['quick'] else ''}{data['seconds'] / 60:.1f} minutes in all. "
        "Every figure is the mean over seeds ± half the range between the lowest and the highest seed.",
        "",
    ]
    for task in tasks:
        keys = sorted((k for k in groups if k[0] == task), key=lambda k: (k[2] != "uniform", k[1] != "standard", k[1], k[2]))
        lines += [f"## {TASK_TITLES[task]}", "", data["setups"].get(task, ""), ""]
        measure, is_error = MEASURE[task]
        head = "| variant | schedule | held-out loss |"
        rule = "| --- | --- | --- |"
        if measure:
            head += f" {measure} |"
            rule += " --- |"
        if task == "text":
            head += " attention entropy | head diversity |"
            rule += " --- | --- |"
        head += " training tokens/s | kernels + GEMMs |"
        rule += " --- | --- |"
        lines += [head, rule]
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for k in keys:
            rs = groups[k]
            row = f"| {k[1]} | {k[2]} | {spread([r['eval_loss'] for r in rs])} |"
            if measure:
                vals = [(1 - r["eval_accuracy"]) if is_error else r["eval_accuracy"] for r in rs]
                row += f" {spread(vals)} |"
            if task == "text":
                ent = [r["entropy"] for r in rs if r["entropy"] >= 0]
                div = [r["head_diversity"] for r in rs if r["head_diversity"] >= 0]
                row += f" {spread(ent) if ent else 'n/a (no token mixing)'} | {spread(div) if div else 'n/a'} |"
            row += f" {statistics.mean(r['tokens_per_s'] for r in rs):,.0f} |"
            row += f" {100 * statistics.mean(r['kernel_share'] for r in rs):.0f}% |"
            lines.append(row)
            steps = rs[0]["steps"]
            curves = [r["loss"] for r in rs if len(r["loss"]) == len(steps)]
            mean = [statistics.mean(c[i] for c in curves) for i in range(len(steps))]
            lo = [min(c[i] for c in curves) for i in range(len(steps))]
            hi = [max(c[i] for c in curves) for i in range(len(steps))]
            label = k[1] if k[2] == "uniform" else f"{k[1]} ({k[2]})"
            (line,) = ax.plot(steps, mean, label=label, linewidth=1.4,
                              linestyle="-" if k[2] == "uniform" else "--")
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss")
        ax.set_title(TASK_TITLES[task])
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        png = os.path.join(plots, f"train_{task}.png")
        fig.savefig(png, dpi=110)
        plt.close(fig)
        if os.path.getsize(png) == 0:
            print(f"plot_training: empty {png}", file=sys.stderr)
            return 1
        lines += ["", f"![{TASK_TITLES[task]}](plots/train_{task}.png)", ""]
    with open(os.path.join(out_dir, "train_report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"plot_training: wrote {os.path.join(out_dir, 'train_report.md')} and {len(tasks)} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
