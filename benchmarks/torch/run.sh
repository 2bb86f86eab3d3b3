#!/usr/bin/env bash
# Builds dropit_bench_torch (Release, as a user builds it: no -march=native) and runs it on a quiet
# machine: interleaved training steps of the Fashion-MNIST example models (CNN, ViT), dense vs
# dropit γ = 0.9 chunked min-k + 1-bit ReLU, and each layer's weight gradient by dropit's two paths
# against LibTorch's own kernel.
#   benchmarks/results/torch-<machine>.json   Google Benchmark output (host name removed)
#   benchmarks/results/torch-<machine>.md     ratio tables from benchmarks/torch/report.py
# Arguments go to the benchmark binary. Environment: DROPIT_BENCH_BUILD_DIR (default build-bench),
# DROPIT_BENCH_JOBS (2), DROPIT_BENCH_THREADS (every core), DROPIT_BENCH_BATCH (128),
# DROPIT_BENCH_STEPS (interleaved step pairs per repetition, 60), DROPIT_BENCH_MIN_TIME (seconds
# per repetition of a weight-gradient case, 0.5), DROPIT_BENCH_REPETITIONS (5).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${DROPIT_BENCH_BUILD_DIR:-$root/build-bench}"
results="$root/benchmarks/results"

. "$here/../run_common.sh"
# Examples ON: their build unpacks Fashion-MNIST, so the step runs on a real batch.
build_benchmark "$build" dropit_bench_torch -DDROPIT_BUILD_EXAMPLES=ON -DDROPIT_BUILD_TORCH=ON
set_benchmark_threads
label="$(machine_label)"
json="$results/torch-$label.json"
mkdir -p "$results"

# Repetitions interleaved at random, so that a slow spell of a shared machine does not land on one
# variant only; the medians are reported (the training steps also alternate within a repetition).
"$build/benchmarks/torch/dropit_bench_torch" \
  --benchmark_out="$json" --benchmark_out_format=json \
  --benchmark_repetitions="${DROPIT_BENCH_REPETITIONS:-5}" \
  --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true \
  --benchmark_min_time="${DROPIT_BENCH_MIN_TIME:-0.5}" "$@"

strip_host_name "$json"

python3 "$here/report.py" "$json" --label "$label" --output "$results/torch-$label.md"
echo "wrote $json and $results/torch-$label.md"
