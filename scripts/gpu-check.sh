#!/usr/bin/env bash
# Everything the GPU machine has to show for the open issues, in one device call:
#
#   source .gpu/env.sh && bash scripts/gpu-check.sh [STEP...]   (carry [".gpu"]; see BENCHMARKS.md)
#
# A device command may run 10 minutes at most, so name the steps each call runs (e.g.
# `bash scripts/gpu-check.sh environment bridge gradcheck-slangpy gradcheck-ptx`); with no names it
# runs every step. `bash scripts/gpu-check.sh --list` prints the step names. Steps run in the order
# below, whether or not an earlier one failed, each within its own time limit and all within
# $BUDGET seconds (default 560, inside one command's limit); a step the budget no longer covers is
# reported as not run. Writes each step's
# output to $OUT/<step>.log (JSON beside it) and a summary of exit codes to $OUT/summary.txt.
# Exits with the number of steps that failed or did not run.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
out="${OUT:-runs/gpu-check}"
deadline=$((SECONDS + ${BUDGET:-560}))
wanted=("$@")
mkdir -p "$out"
failures=0
: > "$out/summary.txt"
PY="${PYTHON:-$(command -v python || command -v python3)}"
export PY
# The test tools the GPU machine lacks (pytest-xdist, hypothesis), where scripts/gpu-test-bundle.sh
# packed them and the run carried .gpu-tests.
[ -d .gpu-tests/site ] && export PYTHONPATH="$PWD/.gpu-tests/site${PYTHONPATH:+:$PYTHONPATH}"

selected() {  # selected NAME: was NAME asked for (or were no steps named)?
  [ "${#wanted[@]}" = 0 ] && return 0
  local w
  for w in "${wanted[@]}"; do [ "$w" = "$1" ] && return 0; done
  return 1
}

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  if [ "${listing:-0}" = 1 ]; then echo "$name"; return; fi
  selected "$name" || return 0
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

listing=0
if [ "${1:-}" = "--list" ]; then listing=1; wanted=(); fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
# shellcheck disable=SC2016  # expanded by the inner shell
step environment 120 bash -c '
  nvidia-smi; "$PY" --version
  "$PY" -c "import jax; print(\"jax\", jax.__version__, jax.devices())"
  "$PY" -c "import slangpy; print(\"slangpy\", slangpy.__file__)"
  "$PY" -c "from slax._slang_c import nvrtc_library; print(\"nvrtc\", nvrtc_library())"
  "$PY" -c "import importlib.metadata as m
for d in (\"jax-cuda12-plugin\", \"jax-cuda13-plugin\", \"nvidia-cuda-nvrtc-cu12\", \"nvidia-cuda-nvrtc\", \"nvidia-cuda-nvcc-cu12\", \"nvidia-cuda-nvcc\"):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, \"missing\")"
  for m in optax tqdm matplotlib sklearn pytest hypothesis; do
    "$PY" -c "import $m" 2>/dev/null && echo "$m: yes" || echo "$m: missing"
  done'
# Issue 2 (zero-copy, per-call cost), issue 6 target 1 (dispatch on both routes, bitwise parity); with
# several GPUs, issue 20's check that each GPU runs its own shard (on the SlangPy route, its own device).
step bridge 600 "$PY" experiments/bridge_check.py --json "$out/bridge.json"
# Issue 6 target 4: the gradient checks on the GPU, on each launch route.
step gradcheck-slangpy 600 "$PY" experiments/gradcheck.py --launch slangpy --out "$out/gradcheck-slangpy"
step gradcheck-ptx 600 "$PY" experiments/gradcheck.py --launch ptx --out "$out/gradcheck-ptx"
# Issue 16: training-step speed against plain JAX (the digits network at the batches its target names:
# at 2^20 and beyond its kernels take milliseconds a step). Calls of 100 steps, as
# training runs them in chunks: a call's own launch and wait (~0.15 ms) over 20 steps added 5-10 us
# to every step of either model. The harness row: the step with no model (sampling, Adam, the loop).
step benchmark 360 "$PY" experiments/benchmark.py --network polynomial --batch 4096 65536 1048576 4194304 \
  --dtype float32 float16 --steps 100 --repeats 7 --launch ptx slangpy --harness --json "$out/bench.json"
# Each iteration of the scan's loop costs XLA a host round trip, a few us of a small batch's step: the
# same steps, two per iteration, for every model.
step benchmark-unrolled 240 "$PY" experiments/benchmark.py --network polynomial --batch 4096 65536 \
  --dtype float32 float16 --steps 100 --repeats 7 --unroll 2 --launch ptx --json "$out/bench-unrolled.json"
step benchmark-digits 240 "$PY" experiments/benchmark.py --network digits --batch 4096 65536 \
  --dtype float32 float16 --steps 100 --repeats 5 --launch ptx slangpy --json "$out/bench-digits.json"
# Issue 41: the eikonal step of experiments/sdf.py (second derivatives of the MLP) against plain JAX.
step benchmark-sdf 300 "$PY" experiments/benchmark.py --network sdf --batch 65536 262144 \
  --dtype float32 float16 --steps 50 --repeats 5 --launch ptx --json "$out/bench-sdf.json"
# Issue 56: float32 products by JAX's precision rule, plain JAX at the same precision in each row: the
# wide networks and the eikonal step at DEFAULT (one TF32 pass) and HIGHEST (3xTF32); and the
# kernels' numbers at each (tests/test_tensor_cores.py's float32 cases, tests/test_precision.py).
step tests-precision 300 env XLA_PYTHON_CLIENT_PREALLOCATE=false SLAX_CUDA_LAUNCH=ptx "$PY" -m pytest -q \
  -p no:cacheprovider tests/test_precision.py tests/test_tensor_cores.py -k "float32 or precision"
step benchmark-precision 540 "$PY" experiments/benchmark.py --network wide --width 64 128 --hidden-layers 2 4 \
  --wide-input 32 --wide-output 16 --batch 262144 --dtype float32 --precision default highest --steps 20 \
  --repeats 3 --launch ptx --json "$out/bench-precision.json"
step benchmark-sdf-precision 300 "$PY" experiments/benchmark.py --network sdf --batch 262144 --dtype float32 \
  --precision default highest --steps 50 --repeats 5 --launch ptx --json "$out/bench-sdf-precision.json"
# Issue 39: the texture fit (512x512x3, bilinear, Adam) at 2^16 and 2^20 samples a step, slax's
# atomic-add backward against plain JAX's scatter-add; target: slax at least 3x plain JAX's steps/s
# at 2^20 and no slower at 2^16.
step benchmark-texture 300 "$PY" experiments/benchmark.py --network texture --batch 65536 1048576 \
  --steps 100 --repeats 7 --launch ptx slangpy --json "$out/bench-texture.json"
# Issue 40: tiny-cuda-nn's class of networks (32 inputs, 16 outputs; widths 16, 32, 64 and 128 with
# 2 and 4 hidden layers, and 8 at width 64) at 2^14, 2^18 and 2^20 samples a step against plain JAX,
# one dtype a step: both dtypes' grid takes longer than one device command may run. Each step writes
# two JSON files; `python scripts/benchmark_table.py FILE...` renders them as a table per width.
for dtype in float16 float32; do
  # shellcheck disable=SC2016  # expanded by the inner shell
  step "benchmark-wide-${dtype/float/f}" 540 env DTYPE="$dtype" OUTDIR="$out" bash -c '
    wide() {  # wide NAME WIDTHS LAYERS
      "$PY" experiments/benchmark.py --network wide --width $2 --hidden-layers $3 --wide-input 32 \
        --wide-output 16 --batch 16384 262144 1048576 --dtype "$DTYPE" --steps 20 --repeats 3 \
        --launch ptx --mlp-backend auto tiled xla --json "$OUTDIR/bench-wide-$DTYPE-$1.json"
    }
    wide shallow "16 32 64 128" "2 4" && wide deep 64 8'
done
# Issue 16: where a step's time goes, kernel by kernel (JAX's profiler), slax on each route and plain JAX.
step profile 300 "$PY" experiments/profile_step.py --batch 4096 1048576 --launch ptx slangpy --json "$out/profile.json"
# Issue 7: 10,000 steps hold host and device memory, on each route.
step soak-slangpy 600 "$PY" experiments/soak.py --batch 65536 --launch slangpy --json "$out/soak-slangpy.json"
step soak-ptx 600 "$PY" experiments/soak.py --batch 65536 --launch ptx --json "$out/soak-ptx.json"
# Issue 5: the experiments as they are, held to the CPU path's results; issue 9: a one-device mesh.
for launch in slangpy ptx; do
  step "polynomial-$launch" 300 "$PY" experiments/polynomial.py --launch "$launch" --target-mse 1e-3 \
    --out "$out/polynomial-$launch"
  step "polynomial-float16-$launch" 300 "$PY" experiments/polynomial.py --launch "$launch" --dtype float16 \
    --target-mse 1e-3 --out "$out/polynomial-float16-$launch"
  step "digits-$launch" 300 "$PY" experiments/digits.py --launch "$launch" --target-accuracy 0.96 \
    --out "$out/digits-$launch"
  step "texture-$launch" 300 "$PY" experiments/texture.py --launch "$launch" --target-psnr 40 \
    --out "$out/texture-$launch"
done
# Issue 40: a 512x512 photograph learnt through a frequency encoding by a 64-wide MLP in float16,
# slax beside plain JAX.
step image 300 "$PY" experiments/image.py --launch ptx --dtype float16 --steps 2000 --batch 65536 \
  --chunk 250 --target-psnr 20 --out "$out/image"
# Issue 57: instant-NGP's image task at 2048x2048 (slax beside plain JAX, PSNR and steps/s), with a
# float32 MLP and a float16 one (float32 tables); its SDF task (3-D, resolutions 16 to 2048, the
# eikonal term through the encoding) in float16; where the image step's time goes against the
# memory-traffic floor.
step ngp-image 300 "$PY" experiments/ngp_image.py --launch ptx --size 2048 --steps 400 --batch 262144 \
  --log2-table-size 19 --chunk 100 --out "$out/ngp-image"
step ngp-image-float16 300 "$PY" experiments/ngp_image.py --launch ptx --size 2048 --steps 400 \
  --batch 262144 --log2-table-size 19 --chunk 100 --dtype float16 --out "$out/ngp-image-float16"
step ngp-sdf 300 "$PY" experiments/ngp_sdf.py --launch ptx --levels 16 --batch 262144 \
  --log2-table-size 19 --finest-resolution 2048 --dtype float16 --steps 400 --chunk 100 \
  --out "$out/ngp-sdf"
step profile-encoding 300 "$PY" experiments/profile_encoding.py --launch ptx --json "$out/encoding-profile.json"
step polynomial-mesh1 600 "$PY" experiments/polynomial.py --devices 1 --batch 65536 --steps 500 \
  --target-mse 1e-3 --out "$out/polynomial-mesh1"
# Issues 9 and 20: data parallel over two GPUs (plain jax.jit over a batch split across them), at the
# global batches the issues name, on each route: the same result as one GPU (compare_devices.py); the
# speed-up comes from benchmark.py, which times warm steps of both in one process.
if [ "$gpus" -ge 2 ]; then
  runs=()
  for launch in ptx slangpy; do
    for batch in 4194304 16777216; do
      for devices in 1 2; do
        name="polynomial-${devices}gpu-$batch-$launch"
        runs+=("$out/$name")
        step "$name" 300 "$PY" experiments/polynomial.py --devices "$devices" --launch "$launch" \
          --batch "$batch" --steps 200 --chunk 50 --target-mse 1 --out "$out/$name"
      done
    done
  done
  step polynomial-gpus-compared 60 "$PY" experiments/compare_devices.py "${runs[@]}" --tolerance 1e-4 \
    --json "$out/polynomial-gpus-compared.json"
  for devices in 1 2; do
    step "digits-${devices}gpu" 300 "$PY" experiments/digits.py --devices "$devices" --target-accuracy 0.96 \
      --out "$out/digits-${devices}gpu"
  done
  step digits-gpus-compared 60 "$PY" experiments/compare_devices.py "$out/digits-1gpu" "$out/digits-2gpu" \
    --tolerance 0.005 --json "$out/digits-gpus-compared.json"
  # Samples/s on 1 and 2 GPUs in one process, with plain JAX on as many, over calls of the 200 steps
  # issue 20 names (a call over two GPUs costs ~1 ms more than over one); each GPU's kernels and streams.
  step benchmark-gpus 400 "$PY" experiments/benchmark.py --network polynomial --batch 4194304 16777216 \
    --devices 1 2 --steps 200 --repeats 3 --launch ptx slangpy --json "$out/bench-gpus.json"
  step profile-gpus 300 "$PY" experiments/profile_step.py --devices 2 --batch 4194304 --launch ptx slangpy \
    --json "$out/profile-gpus.json"
fi
# The test suite with JAX on CUDA, where pytest is installed, on each launch route
# (scripts/gpu-tests.sh): its files in shards of about equal time, in pytest-xdist's processes where
# the run carried .gpu-tests (scripts/gpu-test-bundle.sh). One route is one call on a machine of two
# GPUs (`tests-ptx`: a shard a GPU, at once), two on one GPU (`tests-ptx-1of2`, then `tests-ptx-2of2`);
# both routes at once on one GPU are four calls and the whole_device tests' (`tests-both-1of4` to
# `tests-both-4of4`, then `tests-both-whole`), or three, the two lighter parts at once
# (`tests-both-1of4`, `tests-both-2of4`, then `tests-both-3and4of4`, which ends with the
# whole_device tests).
if "$PY" -c "import pytest, hypothesis" 2>/dev/null; then
  for launch in slangpy ptx; do
    step "tests-$launch" 600 bash scripts/gpu-tests.sh "$launch"
    for k in 1 2; do
      step "tests-$launch-${k}of2" 600 bash scripts/gpu-tests.sh "$launch" "$k/2"
    done
  done
  for k in 1 2 3 4; do
    step "tests-both-${k}of4" 600 bash scripts/gpu-tests.sh both "$k/4"
  done
  step tests-both-3and4of4 600 bash scripts/gpu-tests.sh both 3,4/4
  step tests-both-whole 600 bash scripts/gpu-tests.sh both whole
fi
[ "$listing" = 1 ] && exit 0
echo "=== $failures step(s) failed; logs in $out"
exit "$failures"
