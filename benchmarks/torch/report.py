#!/usr/bin/env python3
"""Markdown report of a dropit_bench_torch run (Google Benchmark JSON): for each example model, the
dropit training step against the dense one from the same run.

Cases are named train_step/<model>/<variant>/B:<batch>, variant = dense or dropit_<policy>/gamma:<γ>.
Times are medians over repetitions when the file holds aggregates, otherwise means over the
reported runs. Peak memory is the `peak_step_bytes` counter: bytes a training step allocates above
what was live before it (weights, gradients, optimizer state), measured at torch's allocator.

Target (issue 4): dropit step time ≤ 1.05× dense at γ = 0.9 (chunked min-k), for both models.

Usage: report.py RESULTS.json [--label LABEL] [--output torch.md]
"""

import argparse
import json
import sys
from collections import OrderedDict

UNIT_TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
TIME_TARGET = 1.05


def base_name(entry):
    name = entry.get("run_name", entry["name"])
    for suffix in ("/real_time", "/process_time", "/manual_time"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def load(path):
    """Returns (context, {name: entry}) with one entry per case (median > mean > average)."""
    with open(path) as f:
        data = json.load(f)
    chosen, runs = OrderedDict(), OrderedDict()
    for entry in data.get("benchmarks", []):
        name = base_name(entry)
        if entry.get("run_type") == "aggregate":
            priority = {"median": 2, "mean": 1}.get(entry.get("aggregate_name"), 0)
            if priority > chosen.get(name, (0, None))[0]:
                chosen[name] = (priority, entry)
        else:
            runs.setdefault(name, []).append(entry)
            chosen.setdefault(name, (0, None))
    cases = OrderedDict()
    for name, (_, entry) in chosen.items():
        if entry is None:
            reps = runs[name]
            entry = dict(reps[0])
            entry["real_time"] = sum(r["real_time"] for r in reps) / len(reps)
            for key in ("peak_step_bytes",):
                if key in entry:
                    entry[key] = max(r.get(key, 0) for r in reps)
        cases[name] = entry
    return data.get("context", {}), cases


def parse(name):
    """(model, variant, batch) from train_step/<model>/<variant...>/B:<batch>, or None."""
    parts = name.split("/")
    if len(parts) < 4 or parts[0] != "train_step":
        return None
    batch = parts[-1].split(":", 1)[1] if parts[-1].startswith("B:") else "?"
    return parts[1], "/".join(parts[2:-1]), batch


def ms(entry):
    return entry["real_time"] * UNIT_TO_MS[entry.get("time_unit", "ns")]


def mib(entry):
    value = entry.get("peak_step_bytes")
    return None if value is None else value / 2**20


def report(context, cases, label):
    models = OrderedDict()
    for name, entry in cases.items():
        parsed = parse(name)
        if parsed is None:
            continue
        model, variant, batch = parsed
        models.setdefault((model, batch), OrderedDict())[variant] = entry

    rows, verdicts = [], []
    for (model, batch), variants in models.items():
        dense = variants.get("dense")
        for variant, entry in variants.items():
            if variant == "dense":
                continue
            if entry.get("error_occurred") or dense is None or dense.get("error_occurred"):
                rows.append([model, batch, variant, "error", "", "", "", "", "", "", ""])
                continue
            time_ratio = ms(entry) / ms(dense)
            dense_mib, dropit_mib = mib(dense), mib(entry)
            mem_ratio = dropit_mib / dense_mib if dense_mib and dropit_mib is not None else None
            met = time_ratio <= TIME_TARGET
            verdicts.append(met)
            rows.append([
                model, batch, variant.replace("dropit_", "").replace("/", " "),
                f"{ms(dense):.1f}", f"{ms(entry):.1f}", f"{time_ratio:.3f}",
                "met" if met else "**missed**",
                "—" if dense_mib is None else f"{dense_mib:.1f}",
                "—" if dropit_mib is None else f"{dropit_mib:.1f}",
                "—" if mem_ratio is None else f"{mem_ratio:.3f}",
                f"{1 - mem_ratio:.0%}" if mem_ratio is not None else "—",
            ])

    header = ["model", "batch", "dropit policy", "dense ms", "dropit ms", "time dropit/dense",
              f"target ≤ {TIME_TARGET}", "dense peak MiB", "dropit peak MiB",
              "peak dropit/dense", "memory saved"]
    lines = [f"# dropit_bench_torch: a training step, dense vs dropit ({label})", ""]
    context_items = [
        ("CPU", context.get("cpu_model")),
        ("Threads", context.get("threading", context.get("threads"))),
        ("OMP_WAIT_POLICY", context.get("omp_wait_policy")),
        ("LibTorch", context.get("torch_version")),
        ("Compiler", f"{context.get('compiler', '?')}; {context.get('build', '?')}"),
        ("Inputs", f"{context.get('inputs', '?')}, batch {context.get('batch', '?')}"),
        ("Date", context.get("date")),
    ]
    lines += [f"- **{k}**: {v}" for k, v in context_items if v]
    lines += [
        "",
        "One step = forward, cross-entropy, backward, optimizer step (SGD with momentum for the CNN, "
        "AdamW for the ViT). Peak = bytes allocated during the step above what was live before it "
        "(weights, gradients, optimizer state), measured at torch's allocator by "
        "`dropit::torch::MemoryMeter`. dropit = `convert(model, ConvertOptions().relu(true))`: every "
        "Conv2d and Linear but the first at γ = 0.9, plus the 1-bit ReLU.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if verdicts:
        lines += ["", f"Time target met for {sum(verdicts)} of {len(verdicts)} case(s)."]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--label", default="this machine")
    parser.add_argument("--output")
    args = parser.parse_args()
    context, cases = load(args.results)
    text = report(context, cases, args.label)
    sys.stdout.write(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
