#!/usr/bin/env bash
# The test suite on a GPU machine, on one CUDA launch route or both, within one device command's
# 10 minutes:
#
#   source .gpu/env.sh && bash scripts/gpu-tests.sh ROUTE [K/N|K,L.../N]    (ROUTE: ptx, slangpy or both)
#
# The suite's files are split into N shards of about equal time (tests/quick_seconds.json's
# seconds; a file it lacks counts 10). Without K/N, N is the number of GPUs and every shard runs at
# once, each on a GPU of its own; with K/N, shard K of N runs alone; with K,L/N, shards K and L run
# at once on the first GPU, the machine's processes shared among them. `both` runs each shard on the
# two routes at once, on the same GPU, each with half the processes: the suite's time is mostly
# single long tests and compiles, not the processes (in 575 s on one H200, 8 processes ran 67-80%
# of one route, 16 processes 73-86%), so two routes at once take little longer than one. On one
# H200, one route's suite runs longer than a device command: run it as K/N parts, a command each
# (both routes in four parts: in three, one part runs past a command's time; BENCHMARKS.md,
# "Correctness on the GPUs"), then the whole_device tests (`whole`, below). Shards at once take
# less time than one after the other (more processes than cores keep them busy through the long
# single tests), so `both 3,4/4` fits the two lighter parts into one command.
# Each shard runs in pytest-xdist's processes where the GPU image has them (carry .gpu-tests:
# scripts/gpu-test-bundle.sh), each taking GPU memory as it needs it; the tests that read the
# whole GPU's free memory (marked whole_device) run after every shard has ended, alone, in the last
# shard, or by themselves with K/N = whole. Logs: $OUT/tests-ROUTE-K.log (default runs/gpu-tests),
# each test's outcome on a line of its own (a run cut short keeps what ran) and every test's time.
# Exits non-zero when a test failed or a shard did not run to its end.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
route=${1:?usage: gpu-tests.sh ptx|slangpy|both [K/N|K,L.../N|whole]}
routes=("$route"); [ "$route" = both ] && routes=(ptx slangpy)
out="${OUT:-runs/gpu-tests}"
mkdir -p "$out"
PY="${PY:-${PYTHON:-$(command -v python || command -v python3)}}"
[ -d .gpu-tests/site ] && export PYTHONPATH="$PWD/.gpu-tests/site${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
# A kernel's PTX compile that passes SLAX_PTX_COMPILE_TIMEOUT runs on the SlangPy route instead, so
# the PTX route's tests would not test it: with many test processes on the cores a compile can take
# minutes (past the default 120 s for one tensor kernel, 24 processes on 16 cores), so the suite
# waits longer, and each shard's summary counts the kernels that fell back all the same.
export SLAX_PTX_COMPILE_TIMEOUT="${SLAX_PTX_COMPILE_TIMEOUT:-480}"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$gpus" -ge 1 ] || { echo "gpu-tests: no GPU here" >&2; exit 1; }
if [ "${2:-}" = whole ]; then
  only=whole shards=1
elif [ -n "${2:-}" ]; then
  only=${2%/*} shards=${2#*/}
else
  only="" shards=$gpus
fi
read -ra listed <<< "${only//,/ }"
# Processes a shard: the machine's cores shared among the shards running at once, but at least
# three eighths of them (four runs at once on 16 cores take 6 each), since the shards' long single
# tests leave cores idle; at most 16.
running=$(( ${#routes[@]} * $([ -n "$only" ] && echo "${#listed[@]}" || echo "$shards") ))
workers=$(( $(nproc) / running )); [ "$workers" -ge $(( $(nproc) * 3 / 8 )) ] || workers=$(( $(nproc) * 3 / 8 ))
[ "$workers" -le 16 ] || workers=16
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

run_shard() {  # run_shard K GPU ROUTE
  local log="$out/tests-$3-$1.log"
  # shellcheck disable=SC2046  # a list of file names without spaces
  CUDA_VISIBLE_DEVICES=$2 SLAX_CUDA_LAUNCH=$3 "$PY" -m pytest -v -p no:cacheprovider -rfE --durations=0 \
    "${parallel[@]}" -m "not whole_device" $(shard_files "$1") > "$log" 2>&1
  local status=$?
  local fell_back note=""
  fell_back=$(grep -c "UserWarning: slax: Slang did not compile kernel" "$log")
  [ "$fell_back" -gt 0 ] && note=" ($fell_back kernel(s) ran on the SlangPy route: PTX compile timed out)"
  echo "tests-$3 shard $1/$shards on GPU $2: exit $status; $(tail -n 1 "$log")$note"
  return "$status"
}

run_whole_device() {  # the whole_device tests of each route, one after the other
  local status=0 r
  for r in "${routes[@]}"; do
    CUDA_VISIBLE_DEVICES=0 SLAX_CUDA_LAUNCH=$r "$PY" -m pytest -v -p no:cacheprovider -rfE -m whole_device tests \
      > "$out/tests-$r-whole-device.log" 2>&1 || status=1
    echo "tests-$r whole_device: $(tail -n 1 "$out/tests-$r-whole-device.log")"
  done
  return "$status"
}

failed=0
pids=()
if [ "$only" = whole ]; then
  run_whole_device || failed=1
  exit "$failed"
elif [ -n "$only" ]; then
  for k in "${listed[@]}"; do
    for r in "${routes[@]}"; do run_shard "$k" 0 "$r" & pids+=($!); done
  done
else
  for k in $(seq 1 "$shards"); do
    for r in "${routes[@]}"; do run_shard "$k" $((k - 1)) "$r" & pids+=($!); done
  done
fi
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
if [ -z "$only" ] || [[ " ${listed[*]} " == *" $shards "* ]]; then
  run_whole_device || failed=1
fi
exit "$failed"
