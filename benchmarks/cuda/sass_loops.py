#!/usr/bin/env python3
"""The loops of a compiled kernel and the instructions in each, from its SASS: a static count
that needs no GPU (sass_regions.py counts what a run executed).

    nvcc -std=c++20 -arch=sm_90 -O3 -Iinclude -cubin -o kernel.cubin instance.cu
    cuobjdump -sass kernel.cubin > kernel.sass
    benchmarks/cuda/sass_loops.py kernel.sass [--max-length 300]

instance.cu holds explicit instantiations of the kernels (`template __global__ void ...;` lines
after including dropit/dropit.cuh); each kernel's loops are listed under its name. A loop is the range from a backward branch's target to the
branch; nested loops and code a loop's body jumps over (rare cases, tails) are counted in the
range, so the executed path of one iteration is read from the listing itself: `--show START`
prints the instructions of the loop starting at that address. A loop that calls a subroutine
behind a branch (64-bit division's slow path) also gets its count without those blocks.
"""

import argparse
import re
import sys

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH_TARGET = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")
FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")


def read(path):
    """The listing's kernels: (name, [(address, instruction)]) each, addresses from 0 in each."""
    kernels = []
    with open(path) as f:
        for line in f:
            function = FUNCTION.match(line)
            if function:
                kernels.append((function.group(1), []))
                continue
            match = INSTRUCTION.search(line)
            if match:
                if not kernels:
                    kernels.append(("(unnamed)", []))
                kernels[-1][1].append((int(match.group(1), 16), match.group(2)))
    return kernels


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


def call_blocks(body):
    """Instructions a loop's path skips where every call is branched around: the blocks from a
    conditional forward branch's fall-through to its target that hold a CALL (nvcc's 64-bit
    division calls its slow path only where an operand needs more than 32 bits)."""
    index_of = {address: i for i, (address, _) in enumerate(body)}
    skipped = 0
    for i, (address, text) in enumerate(body):
        match = BRANCH_TARGET.search(text)
        if match and opcode(text) == "BRA" and text.startswith("@"):
            target = int(match.group(1), 16)
            if target > address and target in index_of:
                block = body[i + 1:index_of[target]]
                if any(opcode(t) == "CALL" for _, t in block):
                    skipped += len(block)
    return skipped


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sass", help="cuobjdump -sass output")
    parser.add_argument("--max-length", type=int, default=300,
                        help="leave out ranges longer than this (outer loops)")
    parser.add_argument("--show", help="print the loop starting at this hex address")
    args = parser.parse_args()
    kernels = read(args.sass)
    if not kernels:
        sys.exit(f"{args.sass}: no SASS instructions found; expected `cuobjdump -sass` output")
    for name, instructions in kernels:
        if len(kernels) > 1:
            print(f"\n{name}")
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
            calls = call_blocks(body)
            note = f"; {len(body) - calls} without its calls' blocks" if calls else ""
            print(f"loop {start:#06x}-{end:#06x}: {len(body):4d} instructions ({common}){note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
