#!/usr/bin/env python3
"""Writes the ablation's report from the runs of dropit_fashion_mnist that scripts/ablation made.

    ablation_report.py RESULTS_DIR GRID_RUN SEED_RUN [SEED_RUN ...] --elapsed SECONDS

GRID_RUN is the --out-dir of the run over every policy and gamma (one seed); each SEED_RUN the
--out-dir of a run of the gamma = 0.9 rows with another seed. Every run directory holds the
program's settings.csv, epochs.csv and step_ratios.csv. Everything the report says about a run
comes from those files, the settings included. Writes, under RESULTS_DIR:

    ablation.csv   every run's epochs.csv rows, with the run and its seed in front
    ablation.md    the tables: accuracy over seeds at gamma = 0.9 (mean +- sample standard
                   deviation), and policy x gamma -> accuracy, memory and time vs dense
    ablation.png   accuracy and peak memory against gamma, one line per policy (gnuplot)
"""

import argparse
import csv
import os
import platform
import statistics
import subprocess
import sys

ORDER = [("chunked_min_k", "element"), ("min_k", "element"), ("min_k", "channel"),
         ("random", "element"), ("random", "channel")]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class Run:
    """One program run: its settings, its last epoch per variant, its interleaved step ratios."""

    def __init__(self, directory):
        self.directory = directory
        self.settings = {r["key"]: r["value"] for r in read_csv(os.path.join(directory, "settings.csv"))}
        self.rows = read_csv(os.path.join(directory, "epochs.csv"))
        last = max(int(r["epoch"]) for r in self.rows)
        self.final = {r["variant"]: r for r in self.rows if int(r["epoch"]) == last}
        ratios = os.path.join(directory, "step_ratios.csv")
        self.ratios = {r["variant"]: r for r in read_csv(ratios)} if os.path.exists(ratios) else {}

    def peak(self, variant):  # the largest per-epoch peak of a variant
        return max(int(r["peak_step_bytes"]) for r in self.rows if r["variant"] == variant)

    def policies(self):
        """(selection, granularity) -> {gamma: final row}, in the report's order."""
        found = {}
        for name, r in self.final.items():
            if name != "dense":
                found.setdefault((r["selection"], r["granularity"]), {})[r["gamma"]] = r
        keys = [k for k in ORDER if k in found] + [k for k in found if k not in ORDER]
        return {k: found[k] for k in keys}


def label(key):
    selection, granularity = key
    return selection if selection == "chunked_min_k" else f"{selection}, {granularity}"


def describe(settings):
    s = settings
    lines = [
        f"- **Command**: `{s['command']}`",
        f"- **Training**: {s['epochs']} epoch(s) on {s['train_images']} training images, batch "
        f"{s['batch_size']}; {s['optimizer']}; peak learning rate {s['peak_lr']}, {s['schedule']}; "
        f"ReLU: {s['relu']}; chunk size {s['chunk_size']}",
        f"- **Test**: {s['test_images']} test images",
        f"- **Threads**: {s['threads']} for torch, OpenBLAS and dropit (CPU kernels: {s['cpu_isa']})",
    ]
    return lines


def seeds_table(runs):
    """Final accuracy of the dense run and of every policy, over the seed runs."""
    seeds = [r.settings["seed"] for r in runs]
    out = ["| policy | mean ± sd (%) | " + " | ".join(f"seed {s}" for s in seeds) + " |",
           "|---|---:|" + "---:|" * len(seeds)]
    names = ["dense"] + [r["variant"] for r in runs[0].final.values() if r["variant"] != "dense"]
    for name in names:
        values = [float(run.final[name]["test_accuracy"]) for run in runs if name in run.final]
        if len(values) != len(runs):
            continue
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        row = runs[0].final[name]
        title = "dense (no dropit)" if name == "dense" else label((row["selection"], row["granularity"]))
        out.append(f"| {title} | {statistics.mean(values):.2f} ± {sd:.2f} | "
                   + " | ".join(f"{v:.2f}" for v in values) + " |")
    return out + [""]


def grid_table(grid, title, cell, dense_cell):
    policies = grid.policies()
    gammas = sorted({g for cells in policies.values() for g in cells}, key=float)
    out = [f"### {title}", "", "| policy | " + " | ".join(f"γ = {g}" for g in gammas) + " |",
           "|---|" + "---:|" * len(gammas),
           "| dense (no dropit) | " + " | ".join([dense_cell] * len(gammas)) + " |"]
    for key, cells in policies.items():
        out.append(f"| {label(key)} | " + " | ".join(cell(cells[g]) if g in cells else "—"
                                                    for g in gammas) + " |")
    return out + [""]


def plot(grid, results):
    policies = grid.policies()
    gammas = sorted({g for cells in policies.values() for g in cells}, key=float)
    dense_acc = float(grid.final["dense"]["test_accuracy"])
    dense_peak = grid.peak("dense")
    data_path = os.path.join(results, "ablation.dat")
    with open(data_path, "w") as f:
        for key, cells in policies.items():
            f.write(f"# {label(key)}: gamma, test accuracy, peak memory vs dense\n")
            for g in gammas:
                if g in cells:
                    r = cells[g]
                    f.write(f"{g} {r['test_accuracy']} {grid.peak(r['variant']) / dense_peak}\n")
            f.write("\n\n")

    def lines(column):
        return ", ".join(f"'{data_path}' index {i} using 1:{column} with linespoints lw 2 pt 7 "
                         f"title '{label(k)}'" for i, k in enumerate(policies))

    script = f"""set terminal pngcairo size 1400,560 noenhanced font ',10'
set output '{os.path.join(results, "ablation.png")}'
set grid
set multiplot layout 1,2 title 'DropIT ablation, Fashion-MNIST CNN, {grid.settings["epochs"]} epoch(s) on {grid.settings["train_images"]} images'
set xlabel 'gamma (fraction dropped)'
set xtics ({", ".join(gammas)})
set ylabel 'final test accuracy (%)'
set key bottom left
plot {lines(2)}, {dense_acc} with lines dt 2 lw 2 lc rgb 'black' title 'dense'
set ylabel 'peak training memory vs dense'
set key top right
plot {lines(3)}, 1 with lines dt 2 lw 2 lc rgb 'black' title 'dense'
unset multiplot
"""
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"ablation: no plot ({e})", file=sys.stderr)
    os.remove(data_path)


def machine():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or 'unknown CPU'}, {os.cpu_count()} cores"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("grid")
    parser.add_argument("seeds", nargs="+")
    parser.add_argument("--elapsed", type=float, required=True, help="wall time of every run, s")
    args = parser.parse_args()

    grid = Run(args.grid)
    seeds = [Run(d) for d in args.seeds]

    with open(os.path.join(args.results, "ablation.csv"), "w", newline="") as f:
        fields = ["run", "seed"] + list(grid.rows[0].keys())
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for name, run in [("grid", grid)] + [("seeds", r) for r in seeds]:
            for row in run.rows:
                writer.writerow({"run": name, "seed": run.settings["seed"], **row})

    seed_gammas = sorted({r["gamma"] for run in seeds for r in run.final.values()
                          if r["variant"] != "dense"}, key=float)
    dense = grid.final["dense"]
    dense_peak = grid.peak("dense")
    pairs = grid.settings["compare_steps"]
    md = [
        "# DropIT ablation on Fashion-MNIST (CNN)",
        "",
        "The structure of the paper's ablation — selection {random, min-k} × granularity {element, "
        "channel}, and chunked min-k, at several γ — on the ResNet-style CNN of "
        "`examples/fashion_mnist` (every Conv2d and Linear but the first converted, plus the 1-bit "
        "ReLU). Within a run every variant starts from the same weights and sees the same data in "
        "the same order. Made by `scripts/ablation` on "
        f"{machine()}, in {int(args.elapsed) // 60} min {int(args.elapsed) % 60} s for its "
        f"{1 + len(seeds)} program runs; every setting below is read from the runs' own "
        "`settings.csv`.",
        "",
        f"## γ = {', '.join(seed_gammas)} over {len(seeds)} seeds",
        "",
        "Final test accuracy; each seed draws other initial weights, another data order and, for "
        "random selection, other positions. sd: sample standard deviation over the seeds.",
        "",
    ]
    md += describe(seeds[0].settings) + [f"- **Seeds**: {', '.join(r.settings['seed'] for r in seeds)}", ""]
    md += seeds_table(seeds)
    md += [
        "## Every policy and γ, one seed",
        "",
    ]
    md += describe(grid.settings) + [
        "- **Peak memory**: bytes allocated during a training step above what was live before it "
        "(weights, gradients, optimizer state), measured at torch's allocator; the largest over the "
        "training epochs.",
        f"- **Step time**: after training, {pairs} step pairs of the dense model and of each dropit "
        "model, interleaved on one batch: the median of the per-pair ratios.",
        "",
    ]
    md += grid_table(grid, f"Final test accuracy (%) — dense: {float(dense['test_accuracy']):.2f} %",
                     lambda r: f"{float(r['test_accuracy']):.2f}", f"{float(dense['test_accuracy']):.2f}")
    md += grid_table(grid, f"Peak training memory vs dense (dense: {dense_peak / 2**20:.1f} MiB)",
                     lambda r: f"{grid.peak(r['variant']) / dense_peak:.2f}×", "1.00×")
    if grid.ratios:
        md += grid_table(grid, "Step time vs dense (interleaved)",
                         lambda r: f"{float(grid.ratios[r['variant']]['time_ratio']):.2f}×"
                         if r["variant"] in grid.ratios else "—", "1.00×")
    md += ["Raw numbers: `ablation.csv`; curves: `ablation.png`.", ""]
    with open(os.path.join(args.results, "ablation.md"), "w") as f:
        f.write("\n".join(md))
    plot(grid, args.results)


if __name__ == "__main__":
    main()
