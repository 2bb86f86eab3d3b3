#!/usr/bin/env python3
"""Host cost of a converted layer: forward + backward of dropit.nn.Linear, Conv2d and ReLU, and of
converted BatchNorm -> ReLU -> Conv2d and LayerNorm -> Linear -> GELU -> Linear blocks (recomputing
the layers' inputs, or caching them), on tiny tensors (kernel time about zero: what remains is
dispatch, argument checks, allocation and autograd bookkeeping — the cost that bounds a GPU step),
as a ratio to torch's own layers.
The two take their calls in turn, in rounds of --calls each, so that drift of a shared machine
cancels; the ratio is the median over rounds of each round's ratio.

--instructions counts instead the instructions one call executes (valgrind's callgrind, one
thread): a figure that no neighbour on a shared machine moves, for comparing two versions of the
code. Time is what users pay; instructions are not time (a cold path pays for its code's size too).

    python3 benchmarks/python/bench_host.py [--rounds 41] [--calls 200] [--output results.md]
    python3 benchmarks/python/bench_host.py --instructions [--calls 2000]
"""

import argparse
import copy
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

import dropit
from bench_common import cpu_name, print_table


def converted(model: nn.Module, **options) -> nn.Module:
    model = copy.deepcopy(model)
    dropit.convert(model, gamma=0.9, skip_first=False, **options)
    return model


def cases():
    torch.manual_seed(0)
    linear = nn.Linear(8, 8)
    conv = nn.Conv2d(4, 4, 3, padding=1)
    # A ResNet's BatchNorm -> ReLU -> convolution: the convolution recomputes its input from the
    # BatchNorm's (convert's default), or caches it (recompute=False).
    block = nn.Sequential(nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
    # A transformer's LayerNorm -> linear -> GELU -> linear: both linear layers recompute.
    mlp = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    return {
        "linear": (linear, dropit.nn.Linear.from_dense(copy.deepcopy(linear), gamma=0.9),
                   torch.randn(2, 8)),
        "conv2d": (conv, dropit.nn.Conv2d.from_dense(copy.deepcopy(conv), gamma=0.9),
                   torch.randn(1, 4, 6, 6)),
        "relu": (nn.ReLU(), dropit.nn.ReLU(), torch.randn(2, 64)),
        "BatchNorm-ReLU-conv2d, recomputing": (block, converted(block), torch.randn(2, 4, 6, 6)),
        "BatchNorm-ReLU-conv2d, caching": (block, converted(block, recompute=False),
                                           torch.randn(2, 4, 6, 6)),
        "LayerNorm-linear-GELU-linear, recomputing": (mlp, converted(mlp), torch.randn(2, 8)),
        "LayerNorm-linear-GELU-linear, caching": (mlp, converted(mlp, recompute=False),
                                                  torch.randn(2, 8)),
    }


def seconds_per_call(layer, x, calls):
    x = x.detach().requires_grad_(True)
    start = time.perf_counter()
    for _ in range(calls):
        layer(x).sum().backward()
    return (time.perf_counter() - start) / calls


def count_instructions_child(calls: int):
    """Under callgrind (started with instrumentation off): each layer's calls between a zeroing
    and a dump of the counters, an empty loop first. The parent reads the dumps in this order."""
    pid = str(os.getpid())

    def control(*arguments):
        subprocess.run(["callgrind_control", *arguments, pid], check=True,
                       stdout=subprocess.DEVNULL)

    control("--instr=on")
    for name, (torch_layer, dropit_layer, x) in cases().items():
        for layer in (None, torch_layer, dropit_layer):
            if layer is not None:
                seconds_per_call(layer, x, 20)  # warm-up
            control("--zero")
            if layer is not None:
                seconds_per_call(layer, x, calls)
            else:
                for _ in range(calls):
                    pass
            control("--dump")


def count_instructions(calls: int) -> list:
    """(layer, torch instructions per call, dropit's, ratio) from a child process run under
    callgrind."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            sys.exit(f"bench_host.py --instructions needs {tool}; install it "
                     "(Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={out}", sys.executable, os.path.abspath(__file__),
                   "--callgrind-child", "--calls", str(calls)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
        dumps = sorted(glob.glob(out + ".*"), key=lambda path: int(path.rsplit(".", 1)[1]))
        counts = []
        for path in dumps:
            with open(path, encoding="utf-8") as dump:
                counts.append(next(int(line.split()[1]) for line in dump
                                   if line.startswith("summary:")))
    rows = []
    for index, name in enumerate(cases()):
        empty, torch_count, dropit_count = counts[3 * index:3 * index + 3]
        t, d = (torch_count - empty) / calls, (dropit_count - empty) / calls
        rows.append((name, t, d, d / t))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--output", help="write the table to this Markdown file too")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per call under callgrind instead of timing")
    parser.add_argument("--callgrind-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.callgrind_child:
        torch.set_num_threads(1)
        count_instructions_child(args.calls)
        return
    if args.instructions:
        machine = (f"{cpu_name()}, torch {torch.__version__}, CPU ISA {dropit._C.cpu_isa}, "
                   "one thread")
        command = " ".join(["python3", "benchmarks/python/bench_host.py"] + sys.argv[1:])
        lines = [f"Instructions per forward + backward on tiny tensors (valgrind's callgrind; "
                 f"{machine}; {args.calls} calls, less an empty loop's).", "",
                 f"Command: `{command}`", "",
                 "| layer | torch instructions | dropit instructions | dropit / torch |",
                 "|---|---|---|---|"]
        lines += [f"| {name} | {t:,.0f} | {d:,.0f} | {ratio:.2f}× |"
                  for name, t, d, ratio in count_instructions(args.calls)]
        print_table("\n".join(lines) + "\n", args.output)
        return

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
