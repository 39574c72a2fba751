#!/usr/bin/env bash
# Installs what slax needs on a fresh Debian 12 machine: a Vulkan driver when no GPU driver is
# present (Mesa 25's lavapipe from bookworm-backports; bookworm's Mesa 22 cannot run SlangPy), and
# a virtual environment .venv with slax and its Python dependencies. Idempotent; the other scripts
# source it and run Python from $venv.
#
# Another interpreter or JAX release (CI checks the GPU machine's Python 3.12 and JAX 0.11.2 this way):
#   SLAX_PYTHON=python3.12 SLAX_VENV=.venv-312 SLAX_JAX_VERSION=0.11.2 bash scripts/test.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SLAX_VENV:-$root/.venv}"
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac
jax_pin=()
[ -z "${SLAX_JAX_VERSION:-}" ] || jax_pin=("jax==$SLAX_JAX_VERSION" "jaxlib==$SLAX_JAX_VERSION")

have_vulkan_driver() {
  { compgen -G '/usr/share/vulkan/icd.d/*.json' || compgen -G '/etc/vulkan/icd.d/*.json'; } >/dev/null &&
    ldconfig -p | grep -q 'libvulkan.so.1'
}

lavapipe_is_recent() {
  local version
  version="$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)"
  [ -z "$version" ] || dpkg --compare-versions "$version" ge 25
}

if command -v nvidia-smi >/dev/null 2>&1; then
  echo "setup: NVIDIA driver found; slax will use CUDA where JAX does."
elif ! have_vulkan_driver || ! lavapipe_is_recent; then
  if [ -r /etc/os-release ] && grep -q 'VERSION_CODENAME=bookworm' /etc/os-release; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "setup: installing Mesa 25 lavapipe (Vulkan on the CPU) from bookworm-backports"
    if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
      printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' |
        $sudo tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq -t bookworm-backports \
      mesa-vulkan-drivers libvulkan1 >/dev/null
  else
    echo "setup: no Vulkan driver found. Install Mesa >= 25 (mesa-vulkan-drivers) or a GPU driver." >&2
    exit 1
  fi
fi

if [ ! -x "$venv/bin/python" ]; then
  "${SLAX_PYTHON:-python3}" -m venv "$venv"
fi
stamp="$venv/.slax-installed${SLAX_JAX_VERSION:+-jax-$SLAX_JAX_VERSION}"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "${root}[test,experiments,dev]" "${jax_pin[@]}"
  touch "$stamp"
fi
