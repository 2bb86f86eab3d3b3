# Sourced by the benchmark run scripts: a machine label without the host name (CPU model and core
# count, e.g. amd-epyc-2c), and a function that removes the host name from a result file.
# shellcheck shell=bash

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
