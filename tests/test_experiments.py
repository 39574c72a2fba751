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


def test_digits_trains_and_writes_outputs(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "experiments/digits.py",
            "--steps",
            "300",
            "--chunk",
            "100",
            "--target-accuracy",
            "0.9",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["train_size"] + metrics["test_size"] == 1797
    assert metrics["slax"]["test_accuracy"] >= 0.9
    assert abs(metrics["slax"]["test_accuracy"] - metrics["jax"]["test_accuracy"]) <= 2 / metrics["test_size"]
    for name in ("loss.png", "accuracy.png", "confusion.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def test_gradcheck_passes_everything():
    result = subprocess.run(
        [sys.executable, "experiments/gradcheck.py"], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout and "mlp 64-128-64-10 fused" in result.stdout


def test_bridge_check_runs(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "experiments/bridge_check.py",
            "--steps",
            "20",
            "--repeats",
            "1",
            "--json",
            str(tmp_path / "bridge.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "bridge.json").read_text())
    assert report["in_place"] is True and [row["elements"] for row in report["rows"]] == [256, 1 << 20]


def test_benchmark_runs(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "experiments/benchmark.py",
            "--batch",
            "64",
            "--steps",
            "3",
            "--repeats",
            "1",
            "--json",
            str(tmp_path / "bench.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert {(r["network"], r["batch"]) for r in rows} == {("polynomial", 64), ("digits", 64)}
    assert all(r["slax_steps_per_s"] > 0 and r["jax_steps_per_s"] > 0 for r in rows)
