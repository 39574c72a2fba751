#!/usr/bin/env bash
# The test suite on a GPU machine, on one CUDA launch route, within one device command's 10 minutes:
#
#   source .gpu/env.sh && bash scripts/gpu-tests.sh ROUTE [K/N]    (ROUTE: ptx or slangpy)
#
# The suite's files are split into N shards of about equal time (tests/quick_seconds.json's
# seconds; a file it lacks counts 10). Without K/N, N is the number of GPUs and every shard runs at
# once, each on a GPU of its own; with K/N, shard K of N runs alone. One route's suite runs longer
# than a device command on one H200 (in 575 s, 8 processes ran 67-80% of it, 16 processes 73-86%:
# the processes do not bound it), so a one-GPU machine runs it as 1/2 and 2/2, a command each, and
# a two-GPU machine as one command.
# Each shard runs in pytest-xdist's processes where the GPU image has them (carry .gpu-tests:
# scripts/gpu-test-bundle.sh), each taking GPU memory as it needs it; the tests that read the
# whole GPU's free memory (marked whole_device) run after every shard has ended, alone, in the last
# shard. Logs: $OUT/tests-ROUTE-K.log (default runs/gpu-tests), each with the slowest 30 tests.
# Exits non-zero when a test failed or a shard did not run to its end.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
route=${1:?usage: gpu-tests.sh ptx|slangpy [K/N]}
out="${OUT:-runs/gpu-tests}"
mkdir -p "$out"
PY="${PY:-${PYTHON:-$(command -v python || command -v python3)}}"
[ -d .gpu-tests/site ] && export PYTHONPATH="$PWD/.gpu-tests/site${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false SLAX_CUDA_LAUNCH="$route"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$gpus" -ge 1 ] || { echo "gpu-tests: no GPU here" >&2; exit 1; }
if [ -n "${2:-}" ]; then
  only=${2%/*} shards=${2#*/}
else
  only="" shards=$gpus
fi
# Processes a shard: the machine's cores shared among the shards running at once, at most 16.
running=$([ -n "$only" ] && echo 1 || echo "$shards")
workers=$(( $(nproc) / running )); [ "$workers" -le 16 ] || workers=16
parallel=()
"$PY" -c "import xdist" 2>/dev/null && parallel=(-n "$workers")

shard_files() {  # shard_files K: the test files of shard K (1-based) of $shards
  "$PY" - "$1" "$shards" <<'EOF'
import json, pathlib, sys
k, n = int(sys.argv[1]), int(sys.argv[2])
seconds = json.loads(pathlib.Path("tests/quick_seconds.json").read_text())
files = sorted(path.name for path in pathlib.Path("tests").glob("test_*.py"))
loads, shards = [0.0] * n, [[] for _ in range(n)]
for name in sorted(files, key=lambda name: -seconds.get(name, 10)):  # longest first, to the lightest
    lightest = loads.index(min(loads))
    loads[lightest] += seconds.get(name, 10)
    shards[lightest].append(f"tests/{name}")
print(" ".join(shards[k - 1]))
EOF
}

run_shard() {  # run_shard K GPU
  local log="$out/tests-$route-$1.log"
  # shellcheck disable=SC2046  # a list of file names without spaces
  CUDA_VISIBLE_DEVICES=$2 "$PY" -m pytest -q -p no:cacheprovider -rfE --durations=30 "${parallel[@]}" \
    -m "not whole_device" $(shard_files "$1") > "$log" 2>&1
  local status=$?
  echo "tests-$route shard $1/$shards on GPU $2: exit $status; $(tail -n 1 "$log")"
  return "$status"
}

failed=0
if [ -n "$only" ]; then
  run_shard "$only" 0 || failed=1
else
  pids=()
  for k in $(seq 1 "$shards"); do
    run_shard "$k" $((k - 1)) & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
fi
if [ -z "$only" ] || [ "$only" = "$shards" ]; then
  CUDA_VISIBLE_DEVICES=0 "$PY" -m pytest -q -p no:cacheprovider -rfE -m whole_device tests \
    > "$out/tests-$route-whole-device.log" 2>&1 || failed=1
  echo "tests-$route whole_device: $(tail -n 1 "$out/tests-$route-whole-device.log")"
fi
exit "$failed"
