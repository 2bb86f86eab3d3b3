#!/usr/bin/env python3
"""Markdown report of a dropit_bench_torch run (Google Benchmark JSON): the interleaved training
steps of each example model, dense against dropit, and each layer's weight gradient by dropit's two
paths against LibTorch's own kernel.

Times of the weight_grad cases are medians over repetitions when the file holds aggregates,
otherwise means over the reported runs. The train_step cases carry their own medians as counters.

Target: a dropit training step no slower than the dense one (≤ 1.00×) at γ = 0.9.

Usage: report.py RESULTS.json [--label LABEL] [--output torch.md]
"""

import argparse
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gbench_results  # noqa: E402  (benchmarks/gbench_results.py)

TIME_TARGET = 1.00


ms = gbench_results.time_ms


def train_step_table(cases):
    """Rows of train_step/<model>/<variant>/B:<batch>: interleaved dense and dropit steps."""
    header = ["model", "batch", "repetitions × step pairs", "dense ms", "dropit ms", "time dropit/dense",
              f"target ≤ {TIME_TARGET:.2f}", "dense peak MiB", "dropit peak MiB",
              "peak dropit/dense"]
    rows, verdicts = [], []
    for name, entry in cases.items():
        parts = name.split("/")
        if parts[0] != "train_step":
            continue
        field = {p.split(":", 1)[0]: p.split(":", 1)[1] for p in parts if ":" in p}
        batch = field.get("B", "?")
        if entry.get("error_occurred"):
            rows.append([parts[1], batch, "error"] + [""] * (len(header) - 3))
            continue
        met = entry["time_ratio"] <= TIME_TARGET
        verdicts.append(met)
        repetitions = entry.get("repetitions", 1)
        steps = f"{repetitions} × {field['iterations']}" if "iterations" in field else "?"
        rows.append([
            parts[1], batch, steps,
            f"{entry['dense_ms']:.1f}", f"{entry['dropit_ms']:.1f}",
            f"{entry['time_ratio']:.3f}", "met" if met else "**missed**",
            f"{entry['dense_peak_bytes'] / 2**20:.1f}", f"{entry['dropit_peak_bytes'] / 2**20:.1f}",
            f"{entry['peak_ratio']:.3f}",
        ])
    return header, rows, verdicts


def weight_grad_table(cases):
    """Per layer and γ: LibTorch's dense weight gradient, dropit's two paths, and the faster."""
    layers = OrderedDict()
    for name, entry in cases.items():
        parts = name.split("/")
        if parts[0] != "weight_grad" or entry.get("error_occurred"):
            continue
        layer, variant = parts[1], parts[2]
        gamma = parts[3].split(":", 1)[1] if parts[3].startswith("gamma:") else None
        layers.setdefault(layer, {})[(variant, gamma)] = ms(entry)
    header = ["layer", "γ", "LibTorch dense ms", "sparse ms", "densify + LibTorch ms",
              "faster path", "faster / LibTorch dense"]
    rows = []
    for layer, times in sorted(layers.items()):
        dense = times.get(("torch_dense", None))
        gammas = sorted({g for (_, g) in times if g is not None}, key=float)
        for gamma in gammas:
            sparse, densify = times.get(("dropit_sparse", gamma)), times.get(("dropit_densify", gamma))
            if None in (dense, sparse, densify):
                continue
            faster = "sparse" if sparse < densify else "densify"
            rows.append([layer, gamma, f"{dense:.2f}", f"{sparse:.2f}", f"{densify:.2f}", faster,
                         f"{min(sparse, densify) / dense:.2f}"])
    return header, rows


def markdown_table(header, rows):
    return (["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
            + ["| " + " | ".join(row) + " |" for row in rows])


def report(context, cases, label):
    lines = [f"# dropit_bench_torch: dropit against LibTorch's own kernels ({label})", ""]
    context_items = [
        ("CPU", context.get("cpu_model")),
        ("Threads", context.get("threading", context.get("threads"))),
        ("OMP_WAIT_POLICY", context.get("omp_wait_policy")),
        ("LibTorch", context.get("torch_version")),
        ("Compiler", f"{context.get('compiler', '?')}; {context.get('build', '?')}"),
        ("dropit's CPU loops", context.get("cpu_isa")),
        ("Inputs", f"{context.get('inputs', '?')}, batch {context.get('batch', '?')}"),
        ("Date", context.get("date")),
    ]
    lines += [f"- **{k}**: {v}" for k, v in context_items if v]
    header, rows, verdicts = train_step_table(cases)
    if rows:
        lines += [
            "",
            "## Training step",
            "",
            "One step = forward, cross-entropy, backward, optimizer step (SGD with momentum for the "
            "CNN, AdamW for the ViT). Dense and dropit steps alternate (dense, dropit, dropit, "
            "dense, ...) on the same batch; within a repetition, times are medians over the steps and "
            "the time ratio the median of the per-step ratios; the table gives the median over the "
            "repetitions. Peak = the most bytes a step allocated above what was "
            "live before it (weights, gradients, optimizer state), measured at torch's allocator "
            "by `dropit::torch::MemoryMeter`. dropit = `convert(model, ConvertOptions().relu(true))`:"
            " every Conv2d and Linear but the first at γ = 0.9 (chunked min-k), plus the 1-bit ReLU;"
            " LayerNorm and GELU become dropit's, so the Linear layers reading them recompute their"
            " inputs (the ViT's q/k/v and both MLP layers).",
            "",
        ]
        lines += markdown_table(header, rows)
        lines += ["", f"Time target met for {sum(verdicts)} of {len(verdicts)} model(s)."]
    header, rows = weight_grad_table(cases)
    if rows:
        lines += [
            "",
            "## Weight gradient of each layer",
            "",
            "The example models' conv2d and linear layers at the benchmark's batch, on post-ReLU "
            "normal inputs. LibTorch dense = `at::convolution_backward` (weight only) or `at::mm` "
            "on the dense input, what a LibTorch user runs; sparse = dropit's kernel on the cache; "
            "densify + LibTorch = the cache densified into a transient tensor, then the same "
            "LibTorch kernel. `dropit::torch::sparse_weight_grad_crossover` is fitted to the "
            "faster-path column.",
            "",
        ]
        lines += markdown_table(header, rows)
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--label", default="this machine")
    parser.add_argument("--output")
    args = parser.parse_args()
    context, cases = gbench_results.load(args.results)
    text = report(context, cases, args.label)
    sys.stdout.write(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
