"""Training over several processes with ``jax.distributed``: two processes on the CPU, each with two
host devices, the batch sharded over all four (tests/scripts/multiprocess.py). The MLP's loss and
gradients and a Slang function's values and gradients equal one process's on one device, and each
process launches kernels over its own devices' rows only (the script checks that)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from _helpers import ROOT, python_env

from slax.testing import RELATIVE_TOLERANCE

pytestmark = [pytest.mark.jax_version, pytest.mark.one_device_kind, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(out, process_id: int, processes: int, port: int) -> subprocess.Popen:
    env = python_env({**os.environ, "JAX_PLATFORMS": "cpu"})
    env.pop("XLA_FLAGS", None)  # the script sets its own device count
    command = [sys.executable, "tests/scripts/multiprocess.py", str(out), str(process_id), str(processes)]
    return subprocess.Popen(
        [*command, str(port)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _run(out, processes: int) -> dict:
    port = _free_port()
    running = [_start(out, k, processes, port) for k in range(processes)]
    logs = []
    try:
        for process in running:
            logs.append(process.communicate(timeout=600)[0])
    finally:
        for process in running:
            process.kill()
    for process, log in zip(running, logs):
        assert process.returncode == 0, log[-5000:]
    return json.loads(out.read_text())


def test_two_processes_train_as_one(cpu_path, tmp_path):
    one = _run(tmp_path / "one.json", 1)
    two = _run(tmp_path / "two.json", 2)
    assert (one["devices"], one["processes"]) == (1, 1)
    assert (two["devices"], two["processes"]) == (4, 2)
    tolerance = RELATIVE_TOLERANCE["float32"]
    assert sorted(one["results"]) == sorted(two["results"])
    for name, want in one["results"].items():
        want, got = np.asarray(want), np.asarray(two["results"][name])
        assert got.shape == want.shape, (name, got.shape, want.shape)
        error = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30)
        assert error <= tolerance, (name, error)
