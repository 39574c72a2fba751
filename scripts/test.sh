#!/usr/bin/env bash
# Installs what is needed (scripts/setup.sh), then runs the slax test suite. Extra args go to pytest.
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
if [ ! -f "$tools/.installed-$jax_version" ]; then
  echo "test: fetching NVIDIA's CUDA tools (~330 MB, once, into $tools): NVRTC, ptxas and"
  echo "test: jax-cuda12-plugin==$jax_version. No GPU needed: tests/test_ptx_launch.py compiles slax's"
  echo "test: kernels to PTX, assembles them for the H100 and checks XLA's launches of them."
  rm -rf "$tools"
  "$venv/bin/python" -m pip install -q --no-deps --target "$tools" "jax-cuda12-plugin==$jax_version" \
    "nvidia-cuda-nvrtc-cu12==12.9.*" "nvidia-cuda-nvcc-cu12==12.9.*"
  touch "$tools/.installed-$jax_version"
fi
export SLAX_TEST_CUDA_TOOLS="$tools"

exec "$venv/bin/python" -m pytest "$@"
