#!/usr/bin/env python3
"""Markdown report of a dropit_bench_torch run (Google Benchmark JSON): the interleaved training
steps of each example model, dense against dropit (with and without recomputation, and recomputation
alone), checkpointing and the memory planner, and each layer's weight gradient by dropit's two
paths against LibTorch's own kernel.

Times of the weight_grad cases are medians over repetitions when the file holds aggregates,
otherwise means over the reported runs. The train_step cases carry their own medians as counters.

Targets: a dropit training step no slower than the dense one (≤ 1.00×) at γ = 0.9; the memory
planner at budget 0.5 holding ≤ 0.50× dense after forward at ≤ 1.03× step time, at 0.3 ≤ 0.30×
at ≤ 1.10×.

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


# Targets of each variant: (held ratio, time ratio); None where there is none.
TARGETS = {
    "dropit": (None, TIME_TARGET),
    "plan 0.5": (0.50, 1.03),
    "plan 0.3": (0.30, 1.10),
}


def variant_of(parts, field):
    """'dropit', 'DropIT only', 'recompute only', 'checkpoint' or 'plan <budget>' from a case
    name's parts."""
    variant = parts[2].removeprefix("dense_vs_")
    if variant == "dropit_only":
        return "DropIT only"
    if variant == "recompute_only":
        return "recompute only"
    if variant.startswith("dropit"):
        return "dropit"
    if variant == "plan":
        return f"plan {field.get('budget', '?')}"
    return variant


def train_step_table(cases):
    """Rows of train_step/<model>/dense_vs_<variant>/.../B:<batch>: interleaved dense and variant
    steps."""
    header = ["model", "variant", "batch", "repetitions × step pairs", "dense ms", "variant ms",
              "time variant/dense", "held after forward dense MiB", "variant MiB",
              "held variant/dense", "peak dense MiB", "variant MiB", "peak variant/dense",
              "target (held, time)"]
    rows, verdicts = [], []
    for name, entry in cases.items():
        parts = name.split("/")
        if parts[0] != "train_step":
            continue
        field = {p.split(":", 1)[0]: p.split(":", 1)[1] for p in parts if ":" in p}
        batch = field.get("B", "?")
        variant = variant_of(parts, field)
        if entry.get("error_occurred"):
            rows.append([parts[1], variant, batch, "error"] + [""] * (len(header) - 4))
            continue
        held_target, time_target = TARGETS.get(variant, (None, None))
        met = ((held_target is None or entry["held_ratio"] <= held_target)
               and (time_target is None or entry["time_ratio"] <= time_target))
        if time_target is not None:
            verdicts.append(met)
        target = " / ".join(f"≤ {t:.2f}" if t is not None else "—"
                            for t in (held_target, time_target))
        repetitions = entry.get("repetitions", 1)
        steps = f"{repetitions} × {field['iterations']}" if "iterations" in field else "?"
        rows.append([
            parts[1], variant, batch, steps,
            f"{entry['dense_ms']:.1f}", f"{entry['dropit_ms']:.1f}", f"{entry['time_ratio']:.3f}",
            f"{entry['dense_held_bytes'] / 2**20:.1f}", f"{entry['dropit_held_bytes'] / 2**20:.1f}",
            f"{entry['held_ratio']:.3f}",
            f"{entry['dense_peak_bytes'] / 2**20:.1f}", f"{entry['dropit_peak_bytes'] / 2**20:.1f}",
            f"{entry['peak_ratio']:.3f}",
            "—" if time_target is None else f"{target}: {'met' if met else '**missed**'}",
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
            "CNN, AdamW for the ViT). Dense and variant steps alternate (dense, variant, variant, "
            "dense, ...) on the same batch; within a repetition, times are medians over the steps and "
            "the time ratio the median of the per-step ratios; the table gives the median over the "
            "repetitions. Held = the bytes the graph holds after forward (the loss excluded); "
            "peak = the most bytes a step allocated above what was live before it (weights, "
            "gradients, optimizer state); both measured at torch's allocator by "
            "`dropit::torch::MemoryMeter`. Variants: dropit = `convert(model, "
            "ConvertOptions().relu(true))`: every Conv2d and Linear but the first at γ = 0.9 "
            "(chunked min-k), plus the 1-bit ReLU; LayerNorm, GELU and BatchNorm2d become dropit's, "
            "so the layers reading them (directly or through a ReLU) recompute their inputs "
            "exactly. DropIT only = the same with `DropitOptions().recompute(false)`: DropIT "
            "caches, no recomputation. recompute only = the same with "
            "`DropitOptions().cache(false)`: recomputation where it is exact, every other input "
            "kept as torch keeps it (exact gradients). checkpoint = `checkpoint_each(blocks)`: every residual or transformer block "
            "checkpointed, dense inside. plan b = `plan_memory(model, loss, "
            "PlanOptions().budget(b))`: per block (stem and head layers, residual or transformer "
            "blocks) keep, convert (as dropit), recompute (convert, recomputing through one layer "
            "too: `recompute_layers`) or checkpoint, to hold at most b of dense after "
            "forward at the least measured time. Targets: dropit no slower than dense; plan 0.5 "
            "≤ 0.50× held at ≤ 1.03× time; plan 0.3 ≤ 0.30× at ≤ 1.10×.",
            "",
        ]
        lines += markdown_table(header, rows)
        lines += ["", f"Targets met by {sum(verdicts)} of {len(verdicts)} case(s)."]
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
    gbench_results.write_report(report(context, cases, args.label), args.output)


if __name__ == "__main__":
    main()
