#!/usr/bin/env bash
# Builds dropit's CPU benchmarks (Release, as a user builds them: no -march=native) and runs them
# on a quiet machine:
#   benchmarks/results/cpu-<machine>.json   Google Benchmark output (host name removed)
#   benchmarks/results/cpu.md               Markdown table from report.py
# Arguments go to the benchmark binary, e.g. --benchmark_filter=compress (the files are still
# written). Environment: DROPIT_BENCH_BUILD_DIR (default build-bench), DROPIT_BENCH_JOBS (2),
# DROPIT_BENCH_THREADS (every core), DROPIT_BENCH_MIN_TIME (seconds per repetition, 0.5).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${DROPIT_BENCH_BUILD_DIR:-$(dirname "$here")/build-bench}"
results="$here/results"

. "$here/run_common.sh"
build_benchmark "$build" dropit_bench_cpu -DDROPIT_BUILD_EXAMPLES=OFF
set_benchmark_threads
label="$(machine_label)"
json="$results/cpu-$label.json"
mkdir -p "$results"

# Three repetitions, reporting their median; the warm-up absorbs thread-pool start-up and the
# other library's threads winding down from the previous case. About 5-10 minutes on 2 cores.
"$build/benchmarks/dropit_bench_cpu" \
  --benchmark_out="$json" --benchmark_out_format=json \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_min_time="${DROPIT_BENCH_MIN_TIME:-0.5}" --benchmark_min_warmup_time=0.05 \
  "$@"

strip_host_name "$json"

fields='Model name|Socket\(s\)|Core\(s\) per socket|Thread\(s\) per core|L3 cache'
lscpu_summary="$(lscpu | grep -E "^($fields):" |
  sed -E 's/[[:space:]]+/ /g' | paste -sd ';' - | sed 's/;/; /g')"
python3 "$here/report.py" "$json" --label "$label" --lscpu "$lscpu_summary" \
  --output "$results/cpu.md"
echo "wrote $json and $results/cpu.md"
