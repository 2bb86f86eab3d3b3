#!/usr/bin/env python3
"""compress of a channels-last activation, read where it lies, against what it costs a user
without that: torch's own copy to contiguous (``Tensor.contiguous()``) and then compress; and
against compress of the same activation stored contiguously.

The shapes are the block outputs of a torchvision ResNet-50 at batch 16 and 128² (what the
compiled network, which inductor runs channels-last, compresses), with a ReLU's output as values.
The three variants run in turn, round after round, on the same tensor; a ratio is the median of
the rounds' ratios, so that drift of a shared machine cancels. The caches are checked equal first.

    python3 benchmarks/python/bench_compress_layouts.py [--rounds 41] [--output FILE]
"""

import argparse
import statistics
import sys
import time

import torch

import dropit
from bench_common import cpu_name, print_table

SHAPES = [(16, 256, 32, 32), (16, 512, 16, 16), (16, 1024, 8, 8), (16, 2048, 4, 4)]


def seconds(work, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        work()
    return (time.perf_counter() - start) / repeats


def measure(shape, rounds: int, repeats: int) -> dict:
    policy = dropit.Policy(gamma=0.9)
    arguments = policy.arguments(channel_axis=1, call=0)
    compress = torch.ops.dropit.compress
    contiguous = torch.randn(shape, generator=torch.Generator().manual_seed(1)).relu()
    channels_last = contiguous.contiguous(memory_format=torch.channels_last)
    variants = {
        "contiguous": lambda: compress(contiguous, *arguments),
        "channels-last, in place": lambda: compress(channels_last, *arguments),
        "channels-last, copied first": lambda: compress(channels_last.contiguous(), *arguments),
    }
    caches = [work() for work in variants.values()]
    for values, positions in caches[1:]:
        assert torch.equal(values, caches[0][0]) and torch.equal(positions, caches[0][1])
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, work in variants.items():
            times[name].append(seconds(work, repeats))
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(times[a], times[b]))
    return {
        "shape": shape,
        "ms": {name: 1e3 * statistics.median(t) for name, t in times.items()},
        "in_place_vs_copied": ratio("channels-last, in place", "channels-last, copied first"),
        "in_place_vs_contiguous": ratio("channels-last, in place", "contiguous"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--repeats", type=int, default=5, help="calls timed together per round")
    parser.add_argument("--output", default="")
    args = parser.parse_args()
    rows = [measure(shape, args.rounds, args.repeats) for shape in SHAPES]
    lines = [f"compress (chunked min-k, gamma 0.9) of ResNet-50's block outputs on {cpu_name()}, "
             f"{torch.get_num_threads()} threads, torch {torch.__version__}; median of "
             f"{args.rounds} interleaved rounds of {args.repeats} calls.", "",
             f"Command: `python3 {' '.join(sys.argv)}`", "",
             "| shape [N, C, H, W] | contiguous ms | channels-last in place ms | "
             "channels-last copied first ms | in place / copied first | in place / contiguous |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        ms = row["ms"]
        lines.append(f"| {list(row['shape'])} | {ms['contiguous']:.2f} | "
                     f"{ms['channels-last, in place']:.2f} | "
                     f"{ms['channels-last, copied first']:.2f} | "
                     f"{row['in_place_vs_copied']:.2f}× | {row['in_place_vs_contiguous']:.2f}× |")
    print_table("\n".join(lines) + "\n", args.output)


if __name__ == "__main__":
    main()
