#!/usr/bin/env python3
"""Markdown report of a dropit_bench_cpu run (Google Benchmark JSON).

Each dropit case is paired with its baseline from the same run, found through the regular names
(`op/labels.../key:value...`):

  compress/<policy>/<dtype>/.../N:n, densify/...  ->  memcpy/<dtype>/N:n      dropit / memcpy
  linear_dw/<policy>/<dtype>/.../M:m/K:k/N:n      ->  sgemm/f32/M:m/K:k/N:n   sgemm / dropit
  conv2d_dw/<policy>/<dtype>/.../<layer>          ->  im2col_sgemm/*/<layer>  dense / dropit
                                                      (the faster of the two im2col forms)

Times are medians over repetitions when the file holds aggregates, otherwise means over the
reported iterations. Standard library only.

Usage: report.py RESULTS.json [--label LABEL] [--output cpu.md]
"""

import argparse
import os
import sys
from collections import OrderedDict

import gbench_results


# The project's performance targets: (op, predicate on the parsed case, kind, bound, description).
def _full_size_f32(c, policy):
    """The 2^24-element fp32 case of `policy` at gamma 0.9 (D = 2^14 where the policy chunks)."""
    return (c.policy == policy and c.dtype == "f32" and c.params.get("gamma") == "0.9"
            and c.params.get("N") == str(1 << 24) and c.params.get("D", "16384") == "16384")


TARGETS = [
    ("compress", lambda c: _full_size_f32(c, "chunked_min_k"), "max_ratio", 2.5, "≤ 2.5× memcpy"),
    ("compress", lambda c: _full_size_f32(c, "min_k_element"), "max_ratio", 4.0, "≤ 4× memcpy"),
    ("compress", lambda c: _full_size_f32(c, "random_element"), "max_ratio", 1.5, "≤ 1.5× memcpy"),
    ("densify", lambda c: _full_size_f32(c, "random_element"), "max_ratio", 1.5, "≤ 1.5× memcpy"),
    ("linear_dw", lambda c: c.params.get("gamma") == "0.9", "min_speedup", 1.5, "≥ 1.5× faster"),
    ("conv2d_dw", lambda c: c.params.get("gamma") == "0.9", "min_speedup", 1.2, "≥ 1.2× faster"),
]


class Case:
    """One benchmark: its parsed name, time in ms and counters."""

    def __init__(self, name, entry):
        self.name = name
        parts = name.split("/")
        self.op = parts[0]
        self.labels = [p for p in parts[1:] if ":" not in p]
        self.params = OrderedDict(p.split(":", 1) for p in parts[1:] if ":" in p)
        self.time_ms = gbench_results.time_ms(entry)
        self.entry = entry
        self.error = entry.get("error_message") if entry.get("error_occurred") else None

    @property
    def policy(self):
        return self.labels[0] if self.labels else ""

    @property
    def dtype(self):
        return self.labels[1] if len(self.labels) > 1 else ""

    def counter(self, key):
        return self.entry.get(key)


def load(path):
    """Returns (context, cases in run order)."""
    context, entries = gbench_results.load(path)
    return context, [Case(name, entry) for name, entry in entries.items()]


def fmt_ms(ms):
    if ms is None:
        return "—"
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def fmt_ratio(x):
    return "—" if x is None else f"{x:.2f}"


def find_baseline(case, by_op):
    """The baseline case for `case`, or None."""
    if case.op in ("compress", "densify"):
        candidates = [b for b in by_op.get("memcpy", [])
                      if b.labels == [case.dtype] and b.params.get("N") == case.params.get("N")]
    elif case.op == "linear_dw":
        keys = ("M", "K", "N")
        candidates = [b for b in by_op.get("sgemm", [])
                      if all(b.params.get(k) == case.params.get(k) for k in keys)]
    elif case.op == "conv2d_dw":
        keys = ("B", "Cin", "Cout", "HW", "k", "s", "p")
        candidates = [b for b in by_op.get("im2col_sgemm", [])
                      if all(b.params.get(k) == case.params.get(k) for k in keys)]
    else:
        return None
    candidates = [b for b in candidates if b.error is None]
    return min(candidates, key=lambda b: b.time_ms) if candidates else None


def target_for(case):
    for op, applies, kind, bound, text in TARGETS:
        if case.op == op and applies(case):
            return kind, bound, text
    return None


def judge(case, value):
    """(target text, verdict) for a ratio or speed-up, or ("", "")."""
    target = target_for(case)
    if target is None or value is None:
        return "", ""
    kind, bound, text = target
    met = value <= bound if kind == "max_ratio" else value >= bound
    return text, "met" if met else "**missed**"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_header(context, label, lscpu):
    def cache_text(c):
        kind = {"Data": "d", "Instruction": "i"}.get(c["type"], "")
        shared = f" per {c['num_sharing']} CPUs" if c.get("num_sharing", 1) > 1 else ""
        return f"L{c['level']}{kind} {c['size'] // 1024} KiB{shared}"

    items = [
        ("Machine", label),
        ("CPU", f"{context.get('cpu_model', '?')}, {context.get('num_cpus', '?')} logical CPUs"
                f" at {context.get('mhz_per_cpu', '?')} MHz"),
        ("lscpu", lscpu),
        ("Caches", ", ".join(cache_text(c) for c in context.get("caches", []))),
        ("Threads", context.get("threading", context.get("threads"))),
        ("OMP_WAIT_POLICY", context.get("omp_wait_policy")),
        ("BLAS", f"{context.get('openblas', '?')} (core {context.get('openblas_core', '?')})"),
        ("Compiler", f"{context.get('compiler', '?')}; {context.get('build', '?')}"),
        ("dropit", context.get("dropit_version")),
        ("Inputs", context.get("inputs")),
        ("Compress shape", context.get("compress_shape")),
        ("Date", context.get("date")),
    ]
    if context.get("cpu_scaling_enabled"):
        items.append(("Note", "CPU frequency scaling was enabled; timings may be noisy."))
    return "\n".join(f"- **{k}**: {v}" for k, v in items if v)


def report(context, cases, label, lscpu, source):
    by_op = OrderedDict()
    for case in cases:
        by_op.setdefault(case.op, []).append(case)
    memcpy_1t = {(c.labels[0], c.params.get("N")): c for c in by_op.get("memcpy_1t", [])}
    summary, sections, errors = [], [], []

    def section(title, note, header, op, row_of):
        rows = []
        for case in by_op.get(op, []):
            if case.error:
                errors.append((case.name, case.error))
            else:
                baseline = find_baseline(case, by_op)
                rows.append(row_of(case, baseline, baseline.time_ms if baseline else None))
        if rows:
            sections.extend([f"## {title}\n", note + "\n", table(header, rows), ""])

    def cache_bytes(case):
        value = case.counter("cache_B_per_elem")
        return "—" if value is None else f"{value:.3f}"

    def copy_row(case, baseline, base_ms):
        ratio = case.time_ms / base_ms if base_ms else None
        single = memcpy_1t.get((case.dtype, case.params.get("N")))
        ratio_1t = case.time_ms / single.time_ms if single and single.error is None else None
        text, verdict = judge(case, ratio)
        if text:
            summary.append([case.name, f"{ratio:.2f}× memcpy", text, verdict])
        return [case.policy, case.dtype, case.params.get("D", "—"), case.params.get("gamma"),
                case.params.get("N"), cache_bytes(case), fmt_ms(case.time_ms), fmt_ms(base_ms),
                fmt_ratio(ratio), fmt_ratio(ratio_1t), text, verdict]

    copy_header = ["policy", "dtype", "D", "γ", "N", "cache B/elem", "dropit ms", "memcpy ms",
                   "× memcpy", "× 1-thread memcpy", "target", ""]
    section("compress", "Ratio = dropit time / memcpy time for the same input bytes (lower is "
            "better). `memcpy` runs on the same threads as dropit; the 1-thread column is for "
            "reference.", copy_header, "compress", copy_row)
    section("densify", "Ratio = dropit time / memcpy time for the same dense bytes.", copy_header,
            "densify", copy_row)

    def grad_row(case, baseline, base_ms):
        speedup = base_ms / case.time_ms if base_ms else None
        text, verdict = judge(case, speedup)
        if text:
            summary.append([case.name, f"{speedup:.2f}× faster", text, verdict])
        base = fmt_ms(base_ms)
        if baseline is not None and baseline.op == "im2col_sgemm":
            base += f" ({baseline.labels[0]})"
        shape = " ".join(f"{k}={v}" for k, v in case.params.items() if k not in ("D", "gamma"))
        return [case.policy, case.dtype, case.params.get("gamma"), shape, cache_bytes(case),
                fmt_ms(case.time_ms), base, fmt_ratio(speedup), text, verdict]

    section("linear weight gradient", "dW[N, K] = dZᵀ·A with A [M, K] cached; speed-up = "
            "OpenBLAS `cblas_sgemm` time (fp32, dense A) / dropit time (higher is better).",
            ["policy", "dtype", "γ", "shape", "cache B/elem", "dropit ms", "sgemm ms", "speed-up",
             "target", ""], "linear_dw", grad_row)
    section("conv2d weight gradient", "dW from the cached input X [B, Cin, HW, HW]; speed-up = "
            "dense im2col + OpenBLAS sgemm time (fp32; the faster of per-image and whole-batch "
            "im2col, named in brackets) / dropit time (higher is better).",
            ["policy", "dtype", "γ", "layer", "cache B/elem", "dropit ms", "im2col+sgemm ms",
             "speed-up", "target", ""], "conv2d_dw", grad_row)

    baseline_rows = []
    for op in ("memcpy", "memcpy_1t", "sgemm", "im2col_sgemm"):
        for case in by_op.get(op, []):
            if case.error:
                errors.append((case.name, case.error))
                continue
            bps, flops = case.counter("bytes_per_second"), case.counter("dense_FLOPS")
            rate = (f"{bps / 1e9:.1f} GB/s" if bps
                    else f"{flops / 1e9:.0f} GFLOP/s" if flops else "—")
            baseline_rows.append([case.name, fmt_ms(case.time_ms), rate])
    if baseline_rows:
        sections.extend(["## Baselines\n", "Rates count the input bytes (memcpy) or the dense "
                         "FLOPs (sgemm, im2col + sgemm).\n",
                         table(["baseline", "ms", "rate"], baseline_rows), ""])

    out = ["# dropit CPU benchmarks\n",
           f"From `{os.path.basename(source)}`. Every dropit case is compared with a dense "
           "baseline measured in the same run (wall-clock time, median of the repetitions).\n",
           machine_header(context, label, lscpu), ""]
    if summary:
        met = sum(1 for row in summary if row[3] == "met")
        out.extend([f"## Targets: {met} of {len(summary)} met\n",
                    table(["case", "measured", "target", ""], summary), ""])
    if errors:
        out.extend(["## Errors\n"] + [f"- `{name}`: {message}" for name, message in errors] + [""])
    return "\n".join(out + sections)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", help="Google Benchmark JSON output of dropit_bench_cpu")
    parser.add_argument("--label", default="", help="machine label for the header")
    parser.add_argument("--lscpu", default="", help="lscpu summary for the header")
    parser.add_argument("--output", "-o", help="write here instead of stdout")
    args = parser.parse_args()
    context, cases = load(args.results)
    if not cases:
        sys.exit(f"report.py: no benchmarks in {args.results}")
    gbench_results.write_report(report(context, cases, args.label or context.get("cpu_model", "?"),
                                       args.lscpu, args.results), args.output)


if __name__ == "__main__":
    main()
