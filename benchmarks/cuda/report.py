#!/usr/bin/env python3
"""Markdown report of a dropit_bench_cuda run (Google Benchmark JSON).

Pairs each case with its baseline from the same run, by name:

  compress/<policy>/<dtype>/.../N:n, densify/..., relu_mask/{pack,apply}/<dtype>/N:n
                                                    ->  device_copy/<dtype>/N:n
      bandwidth = the bytes the case must move / its time, against the copy's (target ≥ 80 %)
  linear_dw/<policy>/<dtype>/gamma:g/M/K/N, densify_gemm/...  ->  gemm/<dtype>/M/K/N
      time / cuBLAS time (target ≤ 1.10)
  conv2d_dw/<policy>/<dtype>/gamma:g/N/C/HW/k/s, densify_cudnn/...  ->  cudnn/<dtype>/N/C/HW/k/s
      time / cuDNN time (target ≤ 1.10)

Times are medians over repetitions when the file holds aggregates. Standard library only.

Usage: report.py RESULTS.json [--output gpu.md]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gbench_results  # noqa: E402  (benchmarks/gbench_results.py)

BANDWIDTH_TARGET = 0.80
GEMM_TARGET = 1.10


def parts(name):
    """(op, labels, {key: value}) of a name such as compress/min_k/f32/gamma:0.9/N:16777216."""
    pieces = name.split("/")
    labels = [p for p in pieces[1:] if ":" not in p]
    params = dict(p.split(":", 1) for p in pieces[1:] if ":" in p)
    return pieces[0], labels, params


def verdict(met):
    return "met" if met else "**missed**"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--output")
    args = parser.parse_args()
    context, cases = gbench_results.load(args.results)

    conv_keys = ("N", "C", "HW", "k", "s")
    copies, gemms, convs = {}, {}, {}
    for name, entry in cases.items():
        op, labels, params = parts(name)
        if op == "device_copy":
            copies[(labels[0], params["N"])] = entry
        elif op == "gemm":
            gemms[(labels[0], params["M"], params["K"], params["N"])] = entry
        elif op == "cudnn":
            convs[(labels[0],) + tuple(params[k] for k in conv_keys)] = entry

    copy_rows, gemm_rows, conv_rows = [], [], []
    for name, entry in cases.items():
        op, labels, params = parts(name)
        if op in ("compress", "densify", "relu_mask"):
            dtype = labels[-1]
            copy = copies.get((dtype, params["N"]))
            if copy is None:
                continue
            bandwidth = entry["bytes"] / gbench_results.time_ms(entry) / 1e6
            copy_bandwidth = copy["bytes"] / gbench_results.time_ms(copy) / 1e6
            fraction = bandwidth / copy_bandwidth
            copy_rows.append([op, labels[0], params.get("D", "—"), dtype, params.get("gamma", "—"),
                              params["N"], f"{gbench_results.time_ms(entry):.3f}",
                              f"{gbench_results.time_ms(copy):.3f}", f"{bandwidth:.0f}",
                              f"{copy_bandwidth:.0f}", f"{fraction:.0%}",
                              verdict(fraction >= BANDWIDTH_TARGET)])
        elif op in ("linear_dw", "densify_gemm"):
            dtype = labels[-1]
            gemm = gemms.get((dtype, params["M"], params["K"], params["N"]))
            if gemm is None:
                continue
            ratio = gbench_results.time_ms(entry) / gbench_results.time_ms(gemm)
            gemm_rows.append([op, dtype, params["gamma"],
                              f"{params['M']}×{params['K']}→{params['N']}",
                              f"{gbench_results.time_ms(entry):.3f}",
                              f"{gbench_results.time_ms(gemm):.3f}", f"{ratio:.2f}",
                              verdict(ratio <= GEMM_TARGET)])

        elif op in ("conv2d_dw", "densify_cudnn"):
            dtype = labels[-1]
            conv = convs.get((dtype,) + tuple(params[k] for k in conv_keys))
            if conv is None:
                continue
            ratio = gbench_results.time_ms(entry) / gbench_results.time_ms(conv)
            layer = (f"N={params['N']}, {params['C'].replace('x', '→')}, {params['HW']}², "
                     f"{params['k']}×{params['k']}, stride {params['s']}")
            conv_rows.append([op, dtype, params["gamma"], layer,
                              f"{gbench_results.time_ms(entry):.3f}",
                              f"{gbench_results.time_ms(conv):.3f}", f"{ratio:.2f}",
                              verdict(ratio <= GEMM_TARGET)])

    def table(header, rows):
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]

    md = ["# dropit_bench_cuda", "",
          f"- **GPU**: {context.get('gpu', '?')} ({context.get('gpu_memory_GiB', '?')} GiB)",
          f"- **Timing**: {context.get('timing', '?')}; median of the repetitions",
          f"- **Date**: {context.get('date', '?')}",
          *(["- **Incomplete**: the run was stopped at its time limit; the cases it finished are "
             "listed"] if context.get("incomplete") else []), "",
          "## Compress and densify against a device copy", "",
          "Bandwidth = the bytes a case must move (compress: the input read and the cache written; "
          "densify: the cache read and the dense tensor written; relu_mask pack: x read, relu(x) "
          "and the mask written; relu_mask apply: the mask and dZ read, dX written) over its "
          "time, against "
          "`cudaMemcpyAsync` of the dense tensor (read + write). Target: ≥ "
          f"{BANDWIDTH_TARGET:.0%} of the copy's bandwidth.", ""]
    md += table(["op", "policy", "D", "dtype", "γ", "N", "ms", "copy ms", "GB/s", "copy GB/s",
                 "of copy", "target"], copy_rows)
    md += ["", "## Linear weight gradient against cuBLAS", "",
           "dW[N, K] = dZᵀ·A with A [M, K] cached. linear_dw = the CUDA backend on the cache (it "
           "densifies into its workspace and calls `cublasGemmEx`); "
           "densify_gemm = the cache densified into a workspace, then `cublasGemmEx` (the LibTorch "
           "adapters' path); against `cublasGemmEx` on the dense A (float accumulation). Target: "
           f"≤ {GEMM_TARGET:.2f}× cuBLAS.", ""]
    md += table(["path", "dtype", "γ", "M×K→N", "ms", "cuBLAS ms", "× cuBLAS", "target"], gemm_rows)
    md += ["", "## Conv2d weight gradient against cuDNN", "",
           "conv2d_dw = the CUDA backend on the cache (densify, im2col over blocks of samples, "
           "strided-batched `cublasGemmEx`, float accumulation); densify_cudnn = the cache "
           "densified, then cuDNN (the LibTorch adapters' path); against cuDNN's backward filter "
           "on the dense input with PyTorch's default math (TF32 allowed for float). Target: "
           f"≤ {GEMM_TARGET:.2f}× cuDNN.", ""]
    md += table(["path", "dtype", "γ", "layer", "ms", "cuDNN ms", "× cuDNN", "target"], conv_rows)
    gbench_results.write_report("\n".join(md) + "\n", args.output)


if __name__ == "__main__":
    main()
