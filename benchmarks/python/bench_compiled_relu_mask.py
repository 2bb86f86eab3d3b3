#!/usr/bin/env python3
"""The 1-bit ReLU mask under torch.compile (CPU, inductor): dropit's operator against the same mask
written in torch operations, which inductor could fuse with what produces the ReLU's input.

In a compiled ResNet the ReLU after a residual sum reads the output of a fused BatchNorm + add
kernel; dense torch fuses the ReLU into that kernel. dropit's ReLU is an opaque operator
(`dropit::relu_with_mask`, backward `dropit::relu_backward`), one more pass over the tensor each
way. Written in torch operations (a comparison, bits packed eight to a byte by shifts, in memory
order), inductor would fuse it. Per shape, channels-last float32, each compiled:

  forward   dense:     relu(x·a + b + r)                     (one fused kernel: the baseline)
            in torch:  the same, and the bits of (z > 0) packed by shifts
            operator:  z = x·a + b + r fused, then dropit::relu_with_mask(z)
  backward  dense:     where(y > 0, dy, 0)
            in torch:  dy · (bits unpacked by shifts)
            operator:  dropit::relu_backward(dy, mask)

Times are medians of interleaved rounds; ratios are the medians of per-round ratios to dense.

    PYTHONPATH=<package> python3 benchmarks/python/bench_compiled_relu_mask.py \
        [--rounds 15] [--output benchmarks/results/compiled-relu-mask-<machine>.md]
"""

import argparse
import statistics
import time

import torch

import dropit  # noqa: F401  (registers torch.ops.dropit)
from bench_common import cpu_name, print_table

# ResNet-50's residual outputs at batch 16, 128²: the two largest stages.
SHAPES = [(16, 256, 32, 32), (16, 512, 16, 16)]


def variants(shape):
    n, c, h, w = shape
    a = torch.randn(c).view(1, -1, 1, 1)
    b = torch.randn(c).view(1, -1, 1, 1)

    def pack(positive):  # eight booleans of memory order per byte
        p = positive.permute(0, 2, 3, 1).reshape(-1, 8).to(torch.int32)
        bits = p[:, 0]
        for i in range(1, 8):
            bits = bits | (p[:, i] << i)
        return bits.to(torch.uint8)

    def unpack(bits):
        shifts = torch.arange(8, dtype=torch.int32)
        flags = (bits.to(torch.int32).unsqueeze(-1) >> shifts) & 1
        return flags.bool().reshape(n, h, w, c).permute(0, 3, 1, 2)

    def dense_forward(x, r):
        return torch.relu(x * a + b + r)

    def torch_forward(x, r):
        z = x * a + b + r
        return torch.relu(z), pack(z > 0)

    def operator_forward(x, r):
        return torch.ops.dropit.relu_with_mask(x * a + b + r)

    def dense_backward(dy, y):
        return torch.where(y > 0, dy, 0)

    def torch_backward(dy, bits):
        return torch.where(unpack(bits), dy, 0)

    def operator_backward(dy, mask):
        return torch.ops.dropit.relu_backward(dy, mask)

    return {"forward": [("dense", dense_forward), ("in torch", torch_forward),
                        ("operator", operator_forward)],
            "backward": [("dense", dense_backward), ("in torch", torch_backward),
                         ("operator", operator_backward)]}


def seconds(function, *arguments, repeats=5):
    start = time.perf_counter()
    for _ in range(repeats):
        function(*arguments)
    return (time.perf_counter() - start) / repeats


def measure(shape, rounds: int):
    channels_last = torch.channels_last
    x = torch.randn(shape).to(memory_format=channels_last)
    r = torch.randn(shape).to(memory_format=channels_last)
    dy = torch.randn(shape).to(memory_format=channels_last)
    found = variants(shape)
    forward = [(name, torch.compile(f, fullgraph=True)) for name, f in found["forward"]]
    backward = [(name, torch.compile(f, fullgraph=True)) for name, f in found["backward"]]

    y = forward[0][1](x, r)
    y_torch, bits = forward[1][1](x, r)
    y_operator, mask = forward[2][1](x, r)
    assert torch.equal(y, y_torch) and torch.equal(y, y_operator)
    # What each backward reads: the dense output, the packed bits, dropit's mask.
    saved = {"dense": y, "in torch": bits, "operator": mask}
    want = backward[0][1](dy, y)
    for name, f in backward[1:]:
        assert torch.equal(f(dy, saved[name]), want), name

    times = {(d, n): [] for d in ("forward", "backward") for n in saved}
    for _ in range(rounds):
        for name, f in forward:
            times["forward", name].append(seconds(f, x, r))
        for name, f in backward:
            times["backward", name].append(seconds(f, dy, saved[name]))
    rows = []
    for direction in ("forward", "backward"):
        base = times[direction, "dense"]
        for name in saved:
            own = times[direction, name]
            ratio = statistics.median(t / d for t, d in zip(own, base))
            rows.append((direction, name, 1e3 * statistics.median(own), ratio))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--output", default="")
    args = parser.parse_args()
    torch.manual_seed(0)

    lines = ["# The 1-bit ReLU mask under torch.compile: dropit's operator or torch operations",
             "",
             f"Command: `python3 benchmarks/python/bench_compiled_relu_mask.py --rounds "
             f"{args.rounds}`, {time.strftime('%Y-%m-%d')}; torch {torch.__version__}, "
             f"{cpu_name()}, {torch.get_num_threads()} threads; channels-last float32; "
             f"{args.rounds} interleaved rounds of 5 calls each, medians (the script's docstring "
             "defines the variants).", "",
             "| shape | pass | variant | ms | vs dense |", "|---|---|---|---:|---:|"]
    for shape in SHAPES:
        for direction, name, ms, ratio in measure(shape, args.rounds):
            lines.append(f"| {'×'.join(map(str, shape))} | {direction} | {name} | {ms:.2f} | "
                         f"{ratio:.2f}× |")
    print_table("\n".join(lines) + "\n", args.output)


if __name__ == "__main__":
    main()
