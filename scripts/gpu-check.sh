#!/usr/bin/env bash
# Everything the GPU machine has to show for the open issues, in one device call:
#
#   source .gpu/env.sh && bash scripts/gpu-check.sh          (carry [".gpu"]; see BENCHMARKS.md)
#
# Runs the steps below in order of importance, whether or not an earlier one failed, each within
# its own time limit and all within $BUDGET seconds (default 1500: a session has 30 minutes of
# device time); a step the budget no longer covers is reported as not run. Writes each step's
# output to $OUT/<step>.log (JSON beside it) and a summary of exit codes to $OUT/summary.txt.
# Exits with the number of steps that failed or did not run.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
out="${OUT:-runs/gpu-check}"
deadline=$((SECONDS + ${BUDGET:-1500}))
mkdir -p "$out"
failures=0
: > "$out/summary.txt"
PY="${PYTHON:-$(command -v python || command -v python3)}"
export PY

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 30 ]; then
    echo "$name: not run (budget spent)" | tee -a "$out/summary.txt"
    failures=$((failures + 1))
    return
  fi
  [ "$limit" -le "$left" ] || limit=$left
  echo "=== $name ($*)"
  local began=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
  local status=$?
  tail -n 60 "$out/$name.log"
  echo "$name: exit $status after $((SECONDS - began)) s" | tee -a "$out/summary.txt"
  [ "$status" = 0 ] || failures=$((failures + 1))
}

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
# shellcheck disable=SC2016  # expanded by the inner shell
step environment 120 bash -c '
  nvidia-smi; "$PY" --version
  "$PY" -c "import jax; print(\"jax\", jax.__version__, jax.devices())"
  "$PY" -c "import slangpy; print(\"slangpy\", slangpy.__file__)"
  "$PY" -c "from slax._slang_c import nvrtc_library; print(\"nvrtc\", nvrtc_library())"
  "$PY" -c "import importlib.metadata as m
for d in (\"jax-cuda12-plugin\", \"nvidia-cuda-nvrtc-cu12\", \"nvidia-cuda-nvcc-cu12\"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, \"missing\")"
  for m in optax tqdm matplotlib sklearn pytest hypothesis; do
    "$PY" -c "import $m" 2>/dev/null && echo "$m: yes" || echo "$m: missing"
  done'
# Issue 2 (zero-copy, per-call cost), issue 6 target 1 (dispatch on both routes, bitwise parity).
step bridge 600 "$PY" experiments/bridge_check.py --json "$out/bridge.json"
# Issue 6 target 4: the gradient checks on the GPU, on each launch route.
step gradcheck-slangpy 600 "$PY" experiments/gradcheck.py --launch slangpy
step gradcheck-ptx 600 "$PY" experiments/gradcheck.py --launch ptx
# Issue 6 targets 2 and 3, issue 5's benchmark.
step benchmark 1200 "$PY" experiments/benchmark.py --batch 4096 65536 1048576 --dtype float32 float16 \
  --launch slangpy ptx --json "$out/bench.json"
# Issue 7: 10,000 steps hold host and device memory, on each route.
step soak-slangpy 600 "$PY" experiments/soak.py --batch 65536 --launch slangpy --json "$out/soak-slangpy.json"
step soak-ptx 600 "$PY" experiments/soak.py --batch 65536 --launch ptx --json "$out/soak-ptx.json"
# Issue 5: the experiments as they are; issue 9: a one-device mesh on one GPU.
step polynomial 600 "$PY" experiments/polynomial.py --out "$out/polynomial"
step digits 600 "$PY" experiments/digits.py --out "$out/digits"
step polynomial-mesh1 600 "$PY" experiments/polynomial.py --devices 1 --batch 65536 --steps 500 \
  --out "$out/polynomial-mesh1"
# Issue 9: data parallel over two GPUs, at the global batches the issue names.
if [ "$gpus" -ge 2 ]; then
  for devices in 1 2; do
    for batch in 4194304 16777216; do
      step "polynomial-${devices}gpu-$batch" 600 "$PY" experiments/polynomial.py --devices "$devices" \
        --batch "$batch" --steps 200 --chunk 50 --target-mse 1 --out "$out/polynomial-${devices}gpu-$batch"
    done
  done
fi
# The test suite with JAX on CUDA, where pytest is installed.
if "$PY" -c "import pytest, hypothesis" 2>/dev/null; then
  step tests 900 "$PY" -m pytest -q -x -p no:cacheprovider tests
fi
echo "=== $failures step(s) failed; logs in $out"
exit "$failures"
