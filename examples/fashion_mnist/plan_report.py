#!/usr/bin/env python3
"""Writes the memory planner's accuracy report from the runs scripts/plan-accuracy made.

    plan_report.py RESULTS_DIR RUN [RUN ...] --elapsed SECONDS

Each RUN is the --out-dir of one dropit_fashion_mnist run (one model, one seed: dense, dropit, the
planner at each budget, and dropit without recomputation). Everything the report says about a run comes from its own
settings.csv and epochs.csv. Writes, under RESULTS_DIR:

    plan.csv   every run's epochs.csv rows, with the seed in front
    plan.md    per model: final test accuracy of each variant over the seeds (mean +- sample
               standard deviation, every seed), and the training's peak step memory vs dense
"""

import argparse
import csv
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ablation_report import Run, describe, machine  # noqa: E402


def model_section(model, runs):
    seeds = [r.settings["seed"] for r in runs]
    out = [f"## {model.upper()}", ""]
    out += describe(runs[0].settings) + [f"- **Seeds**: {', '.join(seeds)}", ""]
    out += ["| variant | accuracy mean ± sd (%) | " + " | ".join(f"seed {s}" for s in seeds)
            + " | peak step memory vs dense (seed " + seeds[0] + ") |",
            "|---|---:|" + "---:|" * len(seeds) + "---:|"]
    dense_peak = runs[0].peak("dense")
    for name in runs[0].final:
        values = [float(run.final[name]["test_accuracy"]) for run in runs if name in run.final]
        if len(values) != len(runs):
            continue
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append(f"| {name} | {statistics.mean(values):.2f} ± {sd:.2f} | "
                   + " | ".join(f"{v:.2f}" for v in values)
                   + f" | {runs[0].peak(name) / dense_peak:.2f}× |")
    return out + [""]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--elapsed", type=float, required=True, help="wall time of every run, s")
    args = parser.parse_args()

    runs = [Run(d) for d in args.runs]
    by_model = {}
    for run in runs:
        by_model.setdefault(run.settings["model"], []).append(run)

    with open(os.path.join(args.results, "plan.csv"), "w", newline="") as f:
        fields = ["seed"] + list(runs[0].rows[0].keys())
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for run in runs:
            for row in run.rows:
                writer.writerow({"seed": run.settings["seed"], **row})

    md = [
        "# The memory planner on Fashion-MNIST: accuracy over seeds",
        "",
        "The example models of `examples/fashion_mnist` trained dense, with dropit (`convert`: "
        "γ = 0.9 chunked min-k, 1-bit ReLU, exact recomputation after LayerNorm, GELU and "
        "BatchNorm → ReLU), with `plan_memory` at each budget (per block: keep, convert as "
        "dropit, recompute or checkpoint; planned on the first training batch) and with DropIT "
        "alone (`no recompute`: `convert` with `DropitOptions().recompute(false)`, every "
        "converted layer's input in a DropIT cache). Within a run every variant "
        "starts from the same weights and sees the same data in the same order. Made by "
        f"`scripts/plan-accuracy` on {machine()}, in {int(args.elapsed) // 60} min "
        f"{int(args.elapsed) % 60} s for its {len(runs)} program runs; every setting below is read "
        "from the runs' own `settings.csv`. Peak step memory: bytes a training step allocated "
        "above what was live before it, at torch's allocator, the largest of the run. The "
        "interleaved step times and the bytes held after forward of the same variants: "
        "`benchmarks/results/torch-<machine>.md`.",
        "",
    ]
    for model, model_runs in by_model.items():
        md += model_section(model, model_runs)
    md += ["Raw numbers: `plan.csv`.", ""]
    with open(os.path.join(args.results, "plan.md"), "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()
