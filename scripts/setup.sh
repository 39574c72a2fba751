#!/usr/bin/env bash
# Installs what slax needs, and says where its kernels will run: a virtual environment .venv with
# slax and its Python dependencies (and JAX's CUDA support where an NVIDIA GPU is); no system
# packages where an NVIDIA driver or a C++ compiler is there. Without a GPU, slax runs kernels of
# CPU-placed JAX on SlangPy's CPU device, the faster CPU route, which builds them with the
# system's g++ or clang++ (installed with apt-get, as root or through sudo, only if neither is
# there). SLAX_INSTALL_LAVAPIPE=1 also installs a Vulkan driver that runs on the CPU (Mesa 25's
# lavapipe from Debian 12's bookworm-backports, as root; bookworm's Mesa 22 cannot run SlangPy),
# which SLAX_DEVICE=vulkan chooses: CI does, to test both CPU routes.
# Idempotent; the other scripts source it and run Python from $venv.
#
# Another interpreter or JAX release (CI checks Python 3.12 and the newest JAX this way):
#   SLAX_PYTHON=python3.12 SLAX_VENV=.venv-312 SLAX_JAX_VERSION=0.11.2 bash scripts/test.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SLAX_VENV:-$root/.venv}"
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac
jax_pin=()
[ -z "${SLAX_JAX_VERSION:-}" ] || jax_pin=("jax==$SLAX_JAX_VERSION" "jaxlib==$SLAX_JAX_VERSION")

vulkan_driver_files() {
  # The driver manifests the Vulkan loader reads: those VK_DRIVER_FILES or VK_ICD_FILENAMES list,
  # when set (as the loader does), else the system's.
  local listed="${VK_DRIVER_FILES:-${VK_ICD_FILENAMES:-}}" file
  if [ -n "$listed" ]; then
    for file in ${listed//:/ }; do [ -e "$file" ] && echo "$file"; done
  else
    compgen -G '/usr/share/vulkan/icd.d/*.json' || compgen -G '/etc/vulkan/icd.d/*.json' || true
  fi
}

have_vulkan_driver() {
  [ -n "$(vulkan_driver_files)" ] && ldconfig -p | grep -q 'libvulkan.so.1'
}

lavapipe_is_recent() {
  local version
  version="$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)"
  [ -z "$version" ] || dpkg --compare-versions "$version" ge 25
}

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

install_lavapipe() {
  if ! { [ -r /etc/os-release ] && grep -q 'VERSION_CODENAME=bookworm' /etc/os-release; }; then
    echo "setup: SLAX_INSTALL_LAVAPIPE=1 installs Mesa 25 on Debian 12 only; install Mesa >= 25" \
      "(mesa-vulkan-drivers) yourself, or unset it to use SlangPy's CPU device." >&2
    exit 1
  fi
  echo "setup: installing Mesa 25 lavapipe (Vulkan on the CPU) from bookworm-backports"
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' |
      as_root tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
  fi
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports \
    mesa-vulkan-drivers libvulkan1 >/dev/null
}

have_cpp_compiler() {
  command -v g++ >/dev/null 2>&1 || command -v clang++ >/dev/null 2>&1
}

install_cpp_compiler() {
  # SlangPy's CPU device builds slax's kernels with g++ or clang++: installed where neither is here
  # and apt-get can (as root or through sudo). Without one, only a Vulkan driver runs kernels.
  if have_cpp_compiler; then
    return
  fi
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || command -v sudo >/dev/null 2>&1; }; then
    echo "setup: installing g++, with which SlangPy's CPU device builds slax's kernels"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null
  elif ! { have_vulkan_driver && lavapipe_is_recent; }; then
    echo "setup: slax needs a Vulkan driver or a C++ compiler (g++ or clang++) for SlangPy's CPU" \
      "device, and this machine has neither; install g++ (or conda's gxx), or Mesa >= 25." >&2
    exit 1
  fi
}

nvidia=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1 && nvidia=1
if [ "$nvidia" = 1 ]; then
  echo "setup: an NVIDIA GPU is here, so slax will run its kernels on it through CUDA (the PTX route)."
else
  if [ "${SLAX_INSTALL_LAVAPIPE:-0}" = 1 ] && ! { have_vulkan_driver && lavapipe_is_recent; }; then
    install_lavapipe
  fi
  install_cpp_compiler
  if have_vulkan_driver && ! lavapipe_is_recent; then
    # Mesa < 25's Vulkan driver lacks VK_KHR_shader_non_semantic_info: tests must not try it.
    export SLAX_DEVICE="${SLAX_DEVICE:-cpu}" SLAX_TEST_DEVICES="${SLAX_TEST_DEVICES:-cpu}"
  fi
fi

if [ ! -x "$venv/bin/python" ]; then
  "${SLAX_PYTHON:-python3}" -m venv "$venv"
fi
stamp="$venv/.slax-installed${SLAX_JAX_VERSION:+-jax-$SLAX_JAX_VERSION}"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  echo "setup: installing slax[test,experiments,dev] and its dependencies into $venv with pip" \
    "(quiet: a minute or two with pip's cache warm, several minutes without) ..."
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "${root}[test,experiments,dev]" "${jax_pin[@]}"
  touch "$stamp"
  echo "setup: installed"
fi
if [ "$nvidia" != 1 ]; then
  # slax's own choice of device (slax/_device.py, automatic_cpu_device_kind, or SLAX_DEVICE), asked
  # of slax rather than guessed here.
  "$venv/bin/python" -c 'import slax; print("setup: no NVIDIA GPU here; slax runs its kernels on", slax.describe_device("cpu"))' \
    || echo "setup: no NVIDIA GPU here, and slax could not create a device to run its kernels (above)." >&2
fi
# On an NVIDIA GPU, JAX's own CUDA support (its cuda12 extra: the plugin and NVIDIA's libraries, a
# few GB), at the JAX version just installed: plain jaxlib runs JAX on the CPU only.
cuda_stamp="$stamp-cuda12"
if [ "$nvidia" = 1 ] && { [ ! -f "$cuda_stamp" ] || [ "$stamp" -nt "$cuda_stamp" ]; }; then
  jax_version="$("$venv/bin/python" -c 'import jax; print(jax.__version__)')"
  echo "setup: installing JAX $jax_version's CUDA support (jax[cuda12]) into $venv ..."
  "$venv/bin/python" -m pip install -q "jax[cuda12]==$jax_version"
  touch "$cuda_stamp"
fi
