"""slax kernels inside jax.shard_map over several devices (two host CPU devices, in a subprocess
because XLA's device count is fixed when JAX starts)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_shard_map_runs_each_shard_on_its_device():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "tests/scripts/sharded.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0 and "refused: ok" in result.stdout, result.stdout + result.stderr
