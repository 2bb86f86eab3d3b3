#!/usr/bin/env bash
# Runs the Python training-step benchmark (bench_step.py) and writes
# benchmarks/results/python-<machine>.{json,md}. It uses the package built for python3's torch in
# DROPIT_BUILD_DIR (default build/, see cmake/dropit_python.cmake), else the installed one.
# Arguments go to bench_step.py. Run it on a quiet machine.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
. "$here/../run_common.sh"
torch_version="$(python3 -c "import torch; print(torch.__version__.split('+')[0])")"
lib="${DROPIT_BUILD_DIR:-$root/build}/python/torch-$torch_version/lib"
if [[ -d $lib ]]; then export PYTHONPATH="$lib${PYTHONPATH:+:$PYTHONPATH}"; fi
# From the repository root, so that the command the results record names no local path.
cd "$root"
python3 benchmarks/python/bench_step.py --label "$(machine_label)" --output-dir benchmarks/results "$@"
