# Sourced by the benchmark run scripts: the build every benchmark gets, the thread settings, a
# machine label without the host name (CPU model and core count, e.g. amd-epyc-2c), and a function
# that removes the host name from a result file.
# shellcheck shell=bash

# build_benchmark <build dir> <target> [cmake configure arguments...]: configures dropit in Release
# as a user builds it (no -march=native) with the benchmarks on and the tests off, then builds
# <target> with DROPIT_BENCH_JOBS (2) jobs.
build_benchmark() {
  local build=$1 target=$2
  shift 2
  cmake -S "$(dirname "${BASH_SOURCE[0]}")/.." -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DDROPIT_BUILD_BENCHMARKS=ON -DDROPIT_BUILD_TESTS=OFF -DDROPIT_BENCH_NATIVE=OFF "$@"
  cmake --build "$build" --target "$target" -j "${DROPIT_BENCH_JOBS:-2}"
}

# One thread count (DROPIT_BENCH_THREADS, default every core) for dropit, torch, OpenBLAS and the
# baselines' OpenMP loops. libgomp threads spin after each parallel region by default and steal the
# cores OpenBLAS needs next (the im2col + sgemm baselines ran 2-6x slower, the dense ViT step 2x);
# sleeping threads cost neither side anything measurable.
set_benchmark_threads() {
  export DROPIT_BENCH_THREADS="${DROPIT_BENCH_THREADS:-$(nproc)}"
  export OMP_NUM_THREADS="$DROPIT_BENCH_THREADS" OPENBLAS_NUM_THREADS="$DROPIT_BENCH_THREADS"
  export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
}

machine_label() {
  local model
  model="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)"
  printf '%s-%sc' "$(printf '%s' "${model:-cpu}" | tr '[:upper:]' '[:lower:]' |
    sed -E 's/\((r|tm)\)//g; s/@.*$//; s/ (cpu|processor)( |$)/ /g' |
    sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//')" "$(nproc)"
}

strip_host_name() {
  python3 - "$1" <<'PY'
import json, sys
path = sys.argv[1]
with open(path) as f:
    data = json.load(f)
data.get("context", {}).pop("host_name", None)
with open(path, "w") as f:
    json.dump(data, f, indent=2)
    f.write("\n")
PY
}
