#!/usr/bin/env bash
# Installs what is needed (scripts/setup.sh), then runs the slax test suite.
#
#   bash scripts/test.sh           # what CI's first leg runs: every test, those whose result depends
#                                  # on the route on each CPU route here (tests/conftest.py), in
#                                  # parallel (pytest-xdist); ~25 min on a 2-core machine
#   bash scripts/test.sh --quick   # the tests not marked slow, on one route, sweeps by a sample
#                                  # taking every value once (tests/conftest.py): ~9 min on 2
#                                  # cores from a cold cache, ~5 min run again
#   bash scripts/test.sh ARGS...   # ARGS go to pytest as they are (add -n 2 for parallel workers)
#
# Parallel workers: one per core, at most 4 (each grows to several GB over the suite: with two,
# CI's run of it peaked at 18.5 GB in use on the 24 GB 2-core machine; --quick frees XLA's programs
# after each test and slax's kernels after each file, and its workers peaked at 1.9 GB), each given
# whole test files, the longest first (tests/conftest.py, _longest_files_first).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"   # sets $venv
cd "$root"

# CUDA tools for the PTX launch path's tests on a machine without a GPU (tests/test_ptx_launch.py):
# NVRTC (Slang -> PTX), ptxas (assembles the PTX for sm_90) and jaxlib's CUDA plugin (serialises
# kernel launches), matching the installed jaxlib. They go to $venv/cuda-tools, not into the
# environment's site-packages, so that JAX there stays the plain CPU JAX users have.
tools="$venv/cuda-tools"
jax_version="$("$venv/bin/python" -c 'import jaxlib; print(jaxlib.__version__)')"
# --quick runs no test that needs them (tests/test_ptx_launch.py is marked slow): no download.
if [ "$*" != "--quick" ] && [ ! -f "$tools/.installed-$jax_version" ]; then
  echo "test: fetching NVIDIA's CUDA tools (~330 MB, once, into $tools): NVRTC, ptxas and"
  echo "test: jax-cuda12-plugin==$jax_version. No GPU needed: tests/test_ptx_launch.py compiles slax's"
  echo "test: kernels to PTX, assembles them for the H100 and checks XLA's launches of them."
  rm -rf "$tools"
  "$venv/bin/python" -m pip install -q --no-deps --target "$tools" "jax-cuda12-plugin==$jax_version" \
    "nvidia-cuda-nvrtc-cu12==12.9.*" "nvidia-cuda-nvcc-cu12==12.9.*"
  touch "$tools/.installed-$jax_version"
fi
export SLAX_TEST_CUDA_TOOLS="$tools"

cores="$(nproc 2>/dev/null || echo 1)"
workers=$((cores < 4 ? cores : 4))
if [ $# -eq 0 ]; then
  echo "test: the whole suite (CI's first leg) under JAX $jax_version, in $workers parallel processes:"
  echo "test: every test once, and each test whose result depends on the route on every CPU route this"
  echo "test: machine has; ~25 minutes on 2 cores (bash scripts/test.sh --quick: ~9 minutes)."
  set -- -n "$workers" --dist loadfile --no-loadscope-reorder
elif [ "$*" = "--quick" ]; then
  echo "test: the quick run under JAX $jax_version, in $workers parallel processes: the tests not marked"
  echo "test: slow, on one route, sweeps by a sample; ~9 minutes on 2 cores (bash scripts/test.sh"
  echo "test: runs them all)."
  set -- --quick -n "$workers" --dist loadfile --no-loadscope-reorder
fi
exec "$venv/bin/python" -m pytest "$@"
