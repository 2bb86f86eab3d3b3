"""What the Python benchmarks share: the machine's name, the summary of interleaved rounds, one
process's JSON share of a run, and the writing of their tables."""

import json
import os
import platform
import statistics


def cpu_name() -> str:
    """The processor's model name (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def summarise(times: list, peaks: list, helds: list, baseline: list, baseline_peaks: list,
              baseline_helds: list) -> dict:
    """One variant's rounds (seconds, peak bytes, bytes held after forward, each list in round
    order) against the baseline's: median step, the median of per-round time ratios, and the
    highest peak and held bytes with their ratios."""
    return {
        "median_step_ms": 1000 * statistics.median(times),
        "time_ratio": statistics.median(a / b for a, b in zip(times, baseline)),
        "peak_bytes": max(peaks),
        "peak_ratio": max(peaks) / max(baseline_peaks),
        "held_bytes": max(helds),
        "held_ratio": max(helds) / max(baseline_helds),
    }


def write_json(result: dict, path: str = ""):
    """``result`` as JSON into ``path`` (one process's share of a run), or on stdout without one."""
    text = json.dumps(result, indent=2)
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text + "\n")
    else:
        print(text)


def save_results(output_dir: str, name: str, label: str, record: dict, text: str):
    """Writes ``record`` as ``<name>-<label>.json`` and the table ``text`` as ``<name>-<label>.md``
    into ``output_dir``."""
    stem = os.path.join(output_dir, name + (f"-{label}" if label else ""))
    with open(stem + ".json", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(text)


def print_table(text: str, path: str = ""):
    """Prints a Markdown table and, given ``path``, writes it there too."""
    print(text, end="")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
