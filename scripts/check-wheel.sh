#!/usr/bin/env bash
# Builds the slang-jax wheel, installs it (with its dependencies from PyPI) into a fresh virtual
# environment, and runs tests/scripts/installed_wheel.py there from an empty directory outside the
# repository: a user's own .slang file, load_module("poly"), nn.mlp_apply and nn.mlp_loss_and_grad,
# from what the wheel ships alone. CI runs it (.ci/run) after scripts/test.sh, which installed the
# Vulkan driver. SLAX_PYTHON picks the interpreter (default python3).
set -euo pipefail
unset PYTHONPATH  # the installed wheel, not the checkout, must provide slax
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/slax-wheel.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT

echo "check-wheel: building the wheel and installing it into a fresh environment in $scratch"
"${SLAX_PYTHON:-python3}" -m venv "$scratch/venv"
python="$scratch/venv/bin/python"
"$python" -m pip install -q --upgrade pip
rm -rf "$root/dist" "$root/build"
"$python" -m pip wheel -q --no-deps -w "$root/dist" "$root"
wheel="$(ls "$root"/dist/slang_jax-*.whl)"
"$python" -m pip install -q "$wheel"
echo "check-wheel: installed $(basename "$wheel")"

mkdir "$scratch/user"
cp "$root/tests/scripts/installed_wheel.py" "$scratch/user/"
cd "$scratch/user"
# A cache of compiled modules of its own: nothing compiled from the checkout is reused.
SLAX_CACHE_DIR="$scratch/cache" "$python" installed_wheel.py
