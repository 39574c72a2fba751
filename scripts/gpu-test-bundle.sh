#!/usr/bin/env bash
# Packs the test tools the GPU machine lacks into .gpu-tests/ at the project root, for
# scripts/gpu-check.sh's test steps to run the suite in parallel there.
#
# The GPU machine reaches no package index and has pytest but neither pytest-xdist nor hypothesis,
# so the whole suite ran in one process a route: about 17 minutes each, more than one device
# command's 10. This downloads, at the versions this checkout's .venv runs (scripts/setup.sh),
# the pure-Python wheels of what the suite runs with (pytest, pytest-xdist and what they import;
# hypothesis; equinox for tests/test_frameworks.py) and unpacks them, metadata included (pytest
# finds xdist by its entry point), into .gpu-tests/site: about 6 MB. Flax is left out: it needs
# tensorstore's 17 MB binary, past what a run may carry beside SlangPy's bundle, so its tests skip
# there, saying so.
#
# Use, from the project root on the CPU machine, after scripts/setup.sh:
#   bash scripts/gpu-test-bundle.sh          # idempotent
# then carry [".gpu", ".gpu-tests"]: scripts/gpu-check.sh puts .gpu-tests/site first on PYTHONPATH.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="$root/.venv/bin/python"
[ -x "$python" ] || { echo "gpu-test-bundle: no .venv here: run bash scripts/setup.sh first" >&2; exit 1; }
# The versions .venv runs, except hypothesis: its newer releases (the .venv's among them) ship a
# native module built for one Python, so the newest the index has as a pure-Python wheel (the suite
# asks hypothesis>=6.100).
pins=()
for name in pytest pluggy iniconfig packaging execnet pytest-xdist sortedcontainers equinox jaxtyping \
            wadler-lindig typing-extensions; do
  version="$("$python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name")"
  pins+=("$name==$version")
done
pins+=("hypothesis>=6.100")
rm -rf .gpu-tests
mkdir -p .gpu-tests/wheels .gpu-tests/site
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  --platform any -d .gpu-tests/wheels "${pins[@]}"
for wheel in .gpu-tests/wheels/*.whl; do
  "$python" -m zipfile -e "$wheel" .gpu-tests/site
  basename "$wheel" >> .gpu-tests/site/BUNDLED
done
rm -rf .gpu-tests/wheels
echo "gpu-test-bundle: .gpu-tests/site ($(du -sh .gpu-tests | cut -f1)) holds:" $(cat .gpu-tests/site/BUNDLED)
