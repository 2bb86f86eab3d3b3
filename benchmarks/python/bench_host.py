#!/usr/bin/env python3
"""Host cost of a converted layer: forward + backward of dropit.nn.Linear, Conv2d and ReLU on tiny
tensors (kernel time about zero: what remains is dispatch, argument checks, allocation and autograd
bookkeeping — the cost that bounds a GPU step), as a ratio to torch's own layer.

The two take their calls in turn, in rounds of --calls each, so that drift of a shared machine
cancels; the ratio is the median over rounds of each round's ratio.

    python3 benchmarks/python/bench_host.py [--rounds 41] [--calls 200] [--output results.md]
"""

import argparse
import copy
import statistics
import sys
import time

import torch
from torch import nn

import dropit
from bench_common import cpu_name, print_table


def cases():
    torch.manual_seed(0)
    linear = nn.Linear(8, 8)
    conv = nn.Conv2d(4, 4, 3, padding=1)
    return {
        "linear": (linear, dropit.nn.Linear.from_dense(copy.deepcopy(linear), gamma=0.9),
                   torch.randn(2, 8)),
        "conv2d": (conv, dropit.nn.Conv2d.from_dense(copy.deepcopy(conv), gamma=0.9),
                   torch.randn(1, 4, 6, 6)),
        "relu": (nn.ReLU(), dropit.nn.ReLU(), torch.randn(2, 64)),
    }


def seconds_per_call(layer, x, calls):
    x = x.detach().requires_grad_(True)
    start = time.perf_counter()
    for _ in range(calls):
        layer(x).sum().backward()
    return (time.perf_counter() - start) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--output", help="write the table to this Markdown file too")
    args = parser.parse_args()

    rows = []
    for name, (torch_layer, dropit_layer, x) in cases().items():
        for layer in (torch_layer, dropit_layer):  # warm-up
            seconds_per_call(layer, x, args.calls)
        ratios, torch_times, dropit_times = [], [], []
        for _ in range(args.rounds):
            t = seconds_per_call(torch_layer, x, args.calls)
            d = seconds_per_call(dropit_layer, x, args.calls)
            torch_times.append(t)
            dropit_times.append(d)
            ratios.append(d / t)
        rows.append((name, statistics.median(torch_times) * 1e6,
                     statistics.median(dropit_times) * 1e6, statistics.median(ratios)))

    machine = (f"{cpu_name()}, {torch.get_num_threads()} threads, "
               f"torch {torch.__version__}, CPU ISA {dropit._C.cpu_isa}")
    command = " ".join(["python3", "benchmarks/python/bench_host.py"] + sys.argv[1:])
    lines = [f"Host cost of forward + backward on tiny tensors ({machine}; {args.rounds} rounds of "
             f"{args.calls} calls, interleaved; median of per-round ratios).", "",
             f"Command: `{command}`", "",
             "| layer | torch µs | dropit µs | dropit / torch |", "|---|---|---|---|"]
    lines += [f"| {name} | {t:.1f} | {d:.1f} | {ratio:.2f}× |" for name, t, d, ratio in rows]
    text = "\n".join(lines) + "\n"
    print_table(text, args.output)


if __name__ == "__main__":
    main()
