"""slax over several devices: inside jax.shard_map, and under plain jax.jit over batch-sharded
arrays (host CPU devices, in a subprocess because XLA's device count is fixed when JAX starts)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from _helpers import run_python

TWO_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}


def _run(*command: str) -> subprocess.CompletedProcess:
    return run_python(*command, env={**os.environ, **TWO_DEVICES})


def test_shard_map_runs_each_shard_on_its_device(cpu_path):
    result = _run("tests/scripts/sharded.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "grad of replicated arguments: ok" in result.stdout and "sharded: ok" in result.stdout


@pytest.mark.parametrize("devices", [2, 4])
def test_plain_jit_over_sharded_batches_partitions_each_call(cpu_path, devices):
    """Explicit and automatic sharding, given shardings or not: values, jax.grad and jax.jvp equal
    one device's, each device launches its own shard's kernels, no all-gather of the batch, and what
    cannot be partitioned runs replicated (tests/scripts/jit_sharded.py)."""
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    result = run_python("tests/scripts/jit_sharded.py", env={**os.environ, **env})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"jit over sharded batches on {devices} devices: ok" in result.stdout


def test_polynomial_data_parallel_matches_one_device(cpu_path, tmp_path):
    """The same global batch and seed on no mesh, a one-device mesh and two devices (plain jit over
    the sharded batch): the same training, to the rounding of summing the gradient in two halves
    (float32), carried through 200 Adam steps."""
    metrics = {}
    for devices in (None, 1, 2):
        out = tmp_path / f"devices-{devices}"
        flags = ["--steps", "200", "--chunk", "100", "--batch", "256", "--target-mse", "1", "--out", str(out)]
        result = _run("experiments/polynomial.py", *flags, *(["--devices", str(devices)] if devices else []))
        assert result.returncode == 0, result.stdout + result.stderr
        metrics[devices] = json.loads((out / "metrics.json").read_text())
    assert metrics[2]["config"]["devices"] == 2 and metrics[2]["slax"]["samples_per_s"] > 0
    for model in ("slax", "jax"):
        for devices in (1, 2):
            one, split = metrics[None][model]["test_mse"], metrics[devices][model]["test_mse"]
            assert abs(split - one) <= 1e-4 * one, (model, devices, one, split)
