#!/usr/bin/env python3
"""The loops of a compiled kernel and the instructions in each, from its SASS: a static count
that needs no GPU (sass_regions.py counts what a run executed).

    nvcc -std=c++20 -arch=sm_90 -O3 -Iinclude -cubin -o kernel.cubin instance.cu
    cuobjdump -sass kernel.cubin > kernel.sass
    benchmarks/cuda/sass_loops.py kernel.sass [--max-length 300]

instance.cu holds one explicit instantiation of the kernel (a `template __global__ void ...;` line
after including dropit/dropit.cuh). A loop is the range from a backward branch's target to the
branch; nested loops and code a loop's body jumps over (rare cases, tails) are counted in the
range, so the executed path of one iteration is read from the listing itself: `--show START`
prints the instructions of the loop starting at that address.
"""

import argparse
import re
import sys

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def read(path):
    instructions = []
    with open(path) as f:
        for line in f:
            match = INSTRUCTION.search(line)
            if match:
                instructions.append((int(match.group(1), 16), match.group(2)))
    return instructions


def opcode(text):
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def loops(instructions):
    index_of = {address: i for i, (address, _) in enumerate(instructions)}
    for i, (address, text) in enumerate(instructions):
        match = BRANCH_TARGET.search(text)
        if match and opcode(text) == "BRA":
            target = int(match.group(1), 16)
            if target < address and target in index_of:
                yield instructions[index_of[target]:i + 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sass", help="cuobjdump -sass output of one kernel")
    parser.add_argument("--max-length", type=int, default=300,
                        help="leave out ranges longer than this (outer loops)")
    parser.add_argument("--show", help="print the loop starting at this hex address")
    args = parser.parse_args()
    instructions = read(args.sass)
    print(f"{len(instructions)} instructions")
    for body in loops(instructions):
        start, end = body[0][0], body[-1][0]
        if args.show and int(args.show, 16) == start:
            for address, text in body:
                print(f"  {address:#06x}  {text}")
        if len(body) > args.max_length:
            continue
        mix = {}
        for _, text in body:
            mix[opcode(text)] = mix.get(opcode(text), 0) + 1
        common = ", ".join(f"{name} {count}" for name, count in
                           sorted(mix.items(), key=lambda item: -item[1])[:8])
        print(f"loop {start:#06x}-{end:#06x}: {len(body):4d} instructions ({common})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
