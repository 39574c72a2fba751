#!/usr/bin/env bash
# Installs what is needed (scripts/setup.sh), then runs the slax test suite. Extra args go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest "$@"
