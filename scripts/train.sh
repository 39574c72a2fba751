#!/usr/bin/env bash
# Installs what is needed (scripts/setup.sh), then trains the polynomial MLP with Slang kernels from
# JAX on whatever device is there. Extra args go to experiments/polynomial.py (see --help).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"   # sets $venv
cd "$root"
exec "$venv/bin/python" experiments/polynomial.py "$@"
