#!/usr/bin/env bash
# Builds the API reference (mkdocs.yml, docs/) into site/, with warnings as errors, as CI does:
#
#   bash scripts/docs.sh             # mkdocs build --strict: site/index.html
#   bash scripts/docs.sh serve       # any arguments go to mkdocs instead (serve: a live preview)
#
# mkdocstrings reads slax's docstrings from the source without importing slax, so the environment
# ($SLAX_DOCS_VENV, default .venv-docs) holds only pyproject.toml's docs extra, not slax, JAX or
# SlangPy: it installs in seconds. SLAX_PYTHON picks the interpreter (default python3, >= 3.11).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${SLAX_DOCS_VENV:-$root/.venv-docs}"
if [ ! -x "$venv/bin/python" ]; then
  "${SLAX_PYTHON:-python3}" -m venv "$venv"
fi
stamp="$venv/.slax-docs-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  mapfile -t requirements < <("$venv/bin/python" -c '
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))')
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "${requirements[@]}"
  touch "$stamp"
fi
[ $# -gt 0 ] || set -- build --strict
# Material for MkDocs prints a banner about its successor on every build; the build is the point.
NO_MKDOCS_2_WARNING=1 exec "$venv/bin/mkdocs" "$@"
