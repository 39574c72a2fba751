"""The experiment scripts run end to end (short runs) and write what they promise."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_polynomial_trains_and_writes_outputs(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "experiments/polynomial.py",
            "--steps",
            "400",
            "--chunk",
            "100",
            "--target-mse",
            "0.05",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["slax"]["test_mse"] < 0.05
    assert (
        abs(metrics["slax"]["test_mse"] - metrics["jax"]["test_mse"])
        < 1e-3 * metrics["jax"]["test_mse"] + 1e-6
    )
    assert metrics["grad_disagreement_step0"]["max_rel"] < 1e-5
    assert metrics["device"]["slang"].startswith(("vulkan", "cuda"))
    for name in ("loss.png", "surfaces.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def test_polynomial_help():
    result = subprocess.run(
        [sys.executable, "experiments/polynomial.py", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "--dtype" in result.stdout and "--out" in result.stdout
