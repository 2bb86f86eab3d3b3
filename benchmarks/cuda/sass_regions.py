#!/usr/bin/env python3
"""Where a kernel's instructions go, loop by loop, from Nsight Compute's SASS source page.

    ncu --set full -k regex:select_chunks --launch-count 1 -o profile <program> ...
    ncu -i profile.ncu-rep --page source --print-source sass --csv > sass.csv
    benchmarks/cuda/sass_regions.py sass.csv --output regions.md

A region is a run of instructions executed about equally often (within 2x of its first one), so a
loop body is one region and its execution count per instruction says how often the loop ran. The
table lists the regions holding at least --min-share of the executed warp-instructions, with their
stall samples and the memory, vote and shuffle operations in them: enough to tell which pass of a
kernel costs what, and to compare two versions of it.
"""

import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gbench_results  # noqa: E402  (benchmarks/gbench_results.py: write_report)

NOTABLE = ("ATOMS", "ATOM", "RED", "LDS", "STS", "LDG", "STG", "LDGSTS", "SHFL", "VOTE", "VOTEU",
           "POPC", "MATCH", "BAR", "REDUX")


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next(i for i, row in enumerate(rows) if "Instructions Executed" in row)
    header = rows[header_at]
    executed = header.index("Instructions Executed")
    stalls = header.index("Warp Stall Sampling (All Samples)")
    source = header.index("Source")
    kernel = rows[0][1] if rows and len(rows[0]) > 1 and rows[0][0] == "Kernel Name" else "?"
    body = []
    for row in rows[header_at + 1:]:
        if len(row) <= max(executed, stalls, source):
            continue
        body.append((float(row[executed] or 0), float(row[stalls] or 0), row[source].strip()))
    return kernel, body


def regions(body):
    found, current = [], None
    for index, (executed, stalls, source) in enumerate(body):
        if executed == 0:
            continue
        if current and index - current["last"] <= 2 and 0.5 < executed / current["per"] < 2:
            current["last"] = index
        else:
            current = {"first": index, "last": index, "per": executed, "count": 0,
                       "executed": 0.0, "stalls": 0.0, "ops": set()}
            found.append(current)
        current["count"] += 1
        current["executed"] += executed
        current["stalls"] += stalls
        name = opcode(source)
        if name.split(".")[0] in NOTABLE:
            current["ops"].add(name)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    parser.add_argument("--output", help="also write the table to this Markdown file")
    parser.add_argument("--min-share", type=float, default=0.5,
                        help="smallest share of the executed instructions listed, in percent")
    args = parser.parse_args()
    kernel, body = read(args.csv)
    total = sum(executed for executed, _, _ in body)
    all_stalls = sum(stalls for _, stalls, _ in body) or 1.0
    if total == 0:
        sys.exit(f"{args.csv}: no executed instructions (not an ncu SASS source page?)")
    lines = [f"# Executed instructions by region: `{kernel[:120]}`", "",
             f"{total / 1e6:.2f} M warp-instructions executed in all.", "",
             "| SASS lines | instructions | executions each | share | share of stall samples | "
             "memory, vote, shuffle |", "|---|---:|---:|---:|---:|---|"]
    for region in regions(body):
        share = 100 * region["executed"] / total
        if share < args.min_share:
            continue
        lines.append(
            f"| {region['first']}–{region['last']} | {region['count']} | "
            f"{region['per'] / 1e3:.1f} k | {share:.1f} % | "
            f"{100 * region['stalls'] / all_stalls:.1f} % | {', '.join(sorted(region['ops']))} |")
    gbench_results.write_report("\n".join(lines) + "\n", args.output)


if __name__ == "__main__":
    main()
