"""Reading Google Benchmark JSON output, and writing a report's table, shared by the benchmarks'
report writers.

One entry per case: the median aggregate when the file holds aggregates (else the mean), otherwise
the average of the reported runs. Standard library only.
"""

import json
import sys
from collections import OrderedDict

UNIT_TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
TIMER_SUFFIXES = ("/real_time", "/process_time", "/manual_time")


def base_name(entry):
    """The case's name without the timer suffix Google Benchmark appends."""
    name = entry.get("run_name", entry["name"])
    for suffix in TIMER_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def time_ms(entry):
    return entry["real_time"] * UNIT_TO_MS[entry.get("time_unit", "ns")]


def parse(text):
    """The JSON document, or, when the run was stopped while writing it, the cases it finished.

    Google Benchmark writes one case at a time, so a cut file is complete up to its last `},`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        end = text.rfind("\n    },")
        if end < 0 or '"benchmarks"' not in text[:end]:
            raise
        data = json.loads(text[: end + len("\n    }")] + "\n  ]\n}")
        data.setdefault("context", {})["incomplete"] = True
        return data


def load(path):
    """Returns (context, OrderedDict case name -> entry, in run order); context["incomplete"] is
    set when the file was cut off and only the cases it finished are returned."""
    with open(path) as f:
        data = parse(f.read())
    chosen = OrderedDict()  # name -> (priority, entry); the median beats the mean beats the runs
    runs = OrderedDict()
    for entry in data.get("benchmarks", []):
        name = base_name(entry)
        if entry.get("run_type") == "aggregate":
            priority = {"median": 2, "mean": 1}.get(entry.get("aggregate_name"), 0)
            if priority > chosen.get(name, (0, None))[0]:
                chosen[name] = (priority, entry)
        else:
            runs.setdefault(name, []).append(entry)
            chosen.setdefault(name, (0, None))
    cases = OrderedDict()
    for name, (_, entry) in chosen.items():
        if entry is None:  # no aggregates: average the runs
            entry = dict(runs[name][0])
            entry["real_time"] = sum(r["real_time"] for r in runs[name]) / len(runs[name])
        cases[name] = entry
    return data.get("context", {}), cases


def write_report(text, output=None):
    """Prints a report's text and, given ``output``, writes it to that file too."""
    sys.stdout.write(text)
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
