"""One device fixture for the whole suite: each test runs on every device kind this machine has."""

from __future__ import annotations

import functools
import os

import jax
import pytest
from _helpers import run_python

import slax


def pytest_report_header(config) -> str:
    """The versions under test, for CI logs that run the suite on more than one JAX."""
    import jaxlib
    import slangpy

    return f"slax under JAX {jax.__version__} (jaxlib {jaxlib.__version__}), SlangPy {slangpy.__version__}"


def _available_kinds() -> list[str]:
    kinds = ["vulkan"]
    if any(d.platform == "gpu" for d in jax.devices()):
        kinds = ["cuda"]
    return kinds


@pytest.fixture(params=_available_kinds(), autouse=True)
def device_kind(request):
    """The SlangPy device kind under test (Vulkan/lavapipe on CPU machines, CUDA with a GPU)."""
    slax.set_device_kind(request.param if request.param != "cuda" else None)
    yield request.param
    slax.set_device_kind(None)


@functools.cache
def _cpu_path_missing() -> str | None:
    """Why CPU-placed JAX cannot run Slang kernels here, or None if it can. Only asked on machines
    with a GPU (elsewhere the whole suite runs on the CPU path): they may have no Vulkan driver, so
    a fresh process tries to create the Vulkan device that CPU-placed JAX would use."""
    if "vulkan" in _available_kinds():
        return None
    probe = "import slax._device as d; d.get_device(d.DeviceKind.VULKAN)"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = run_python("-c", probe, env=env, timeout=300)
    if result.returncode == 0:
        return None
    return "no Vulkan device on this machine: " + (result.stderr.strip().splitlines() or ["?"])[-1][:300]


@pytest.fixture
def cpu_path():
    """For tests of CPU-placed JAX (host devices, cross-lowering) in a subprocess: skips, saying
    why, on a GPU machine without the Vulkan driver that path runs its kernels on."""
    missing = _cpu_path_missing()
    if missing:
        pytest.skip(f"tests slax with JAX on the CPU, which needs a Vulkan device; {missing}")


@pytest.fixture
def rng():
    """A fixed-seed NumPy generator, fresh per test."""
    import numpy as np

    return np.random.default_rng(1234)
