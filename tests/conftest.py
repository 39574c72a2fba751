"""One device fixture for the whole suite: each test runs on every device kind this machine has."""

from __future__ import annotations

import jax
import pytest

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


@pytest.fixture
def rng():
    """A fixed-seed NumPy generator, fresh per test."""
    import numpy as np

    return np.random.default_rng(1234)
