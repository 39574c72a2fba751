"""The experiment scripts run end to end (short runs) and write what they promise."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(*command: str, timeout: int) -> subprocess.CompletedProcess:
    """``python *command`` from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_polynomial_trains_and_writes_outputs(tmp_path):
    result = _run(
        "experiments/polynomial.py",
        "--steps",
        "400",
        "--chunk",
        "100",
        "--target-mse",
        "0.05",
        "--out",
        str(tmp_path),
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
    result = _run("experiments/polynomial.py", "--help", timeout=120)
    assert result.returncode == 0 and "--dtype" in result.stdout and "--out" in result.stdout


def test_digits_trains_and_writes_outputs(tmp_path):
    result = _run(
        "experiments/digits.py",
        "--steps",
        "300",
        "--chunk",
        "100",
        "--target-accuracy",
        "0.9",
        "--out",
        str(tmp_path),
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["train_size"] + metrics["test_size"] == 1797
    assert metrics["slax"]["test_accuracy"] >= 0.9
    assert abs(metrics["slax"]["test_accuracy"] - metrics["jax"]["test_accuracy"]) <= 2 / metrics["test_size"]
    for name in ("loss.png", "accuracy.png", "confusion.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def _run_without_extras(script: str, *flags: str) -> subprocess.CompletedProcess:
    """Runs an experiment as on a machine with JAX but without the experiments extra (tqdm,
    matplotlib, scikit-learn), like the GPU machine: those imports fail."""
    blocked = ("tqdm", "tqdm.auto", "matplotlib", "matplotlib.pyplot", "sklearn", "sklearn.datasets")
    program = (
        f"import runpy, sys; sys.modules.update(dict.fromkeys({blocked!r})); "
        f"sys.argv = {[script, *flags]!r}; runpy.run_path({script!r}, run_name='__main__')"
    )
    return _run("-c", program, timeout=600)


def test_polynomial_trains_without_the_experiments_extra(tmp_path):
    flags = ["--steps", "200", "--chunk", "100", "--target-mse", "1", "--out", str(tmp_path)]
    result = _run_without_extras("experiments/polynomial.py", *flags)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "slax: 200/200 steps, loss" in result.stdout  # progress lines instead of a tqdm bar
    assert "matplotlib is not installed: no plots (pip install 'slang-jax[experiments]'" in result.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["slax"]["test_mse"] < 1
    assert not list(tmp_path.glob("*.png"))


def test_digits_without_scikit_learn_says_what_to_install(tmp_path):
    result = _run_without_extras("experiments/digits.py", "--out", str(tmp_path))
    assert result.returncode == 1
    assert "digits: the data set comes with scikit-learn, which is not installed" in result.stderr


def test_gradcheck_passes_everything():
    result = _run("experiments/gradcheck.py", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout and "mlp 64-128-64-10 fused" in result.stdout


def test_bridge_check_runs(device_kind, tmp_path):
    result = _run(
        "experiments/bridge_check.py",
        "--steps",
        "20",
        "--repeats",
        "1",
        "--json",
        str(tmp_path / "bridge.json"),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "bridge.json").read_text())
    routes = ["slangpy", "ptx"] if device_kind == "cuda" else ["host-copy"]
    assert report["in_place"] == dict.fromkeys(routes, True)
    assert [(row["route"], row["elements"]) for row in report["rows"]] == [
        (route, size) for route in routes for size in (256, 1 << 20)
    ]
    if device_kind == "cuda":  # the PTX route against the SlangPy route, bitwise
        assert report["parity"] and all(row["identical"] for row in report["parity"])
    else:
        assert report["parity"] == []  # the PTX route exists on CUDA only


def test_benchmark_runs(tmp_path):
    result = _run(
        "experiments/benchmark.py",
        "--batch",
        "64",
        "--steps",
        "3",
        "--repeats",
        "1",
        "--peak-tflops",
        "1",
        "--peak-gbps",
        "10",
        "--json",
        str(tmp_path / "bench.json"),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [(r["network"], r["batch"], r["model"]) for r in rows] == [
        (network, 64, model)
        for network in ("polynomial", "digits")
        for model in ("slax/slangpy", "jax", "jax-f32")
    ]
    polynomial = rows[0]
    # 4 -> 16 -> 4 at batch 64: 6*64*(64+64) - 2*64*64 FLOPs; inputs and targets written and read,
    # 2*64*(4+4)*4 bytes; at 1 TFLOP/s and 10 GB/s the bytes bound: 0.4096 us.
    assert (polynomial["flops"], polynomial["bytes"]) == (40960, 4096)
    assert polynomial["floor_us"] == pytest.approx(0.4096)
    assert polynomial["times_floor"] == pytest.approx(polynomial["step_us"] / 0.4096)
    assert all(r["steps_per_s"] > 0 for r in rows)


def _soak(tmp_path, *flags):
    return _run(
        "experiments/soak.py", "--batch", "256", "--json", str(tmp_path / "soak.json"), *flags, timeout=600
    )


@pytest.mark.whole_device
def test_soak_reads_memory_after_every_chunk(device_kind, tmp_path):
    result = _soak(tmp_path, "--steps", "2000", "--chunk", "500")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "soak.json").read_text())
    assert [r["step"] for r in report["readings"]] == [0, 500, 1000, 1500, 2000]
    # On the CPU path only host memory has a reading (lavapipe's device memory is host memory); on
    # CUDA also XLA's bytes in use and the driver's count of the whole GPU's memory.
    if device_kind == "cuda":
        assert set(report["growth_mb"]) == {"host_rss_mb", "jax_device_mb", "cuda_used_mb"}
    else:
        assert set(report["growth_mb"]) == {"host_rss_mb"}
    assert all(growth < 16 for growth in report["growth_mb"].values()) and report["finite"]
    assert report["readings"][-1]["loss"] < report["readings"][0]["loss"]


def test_soak_fails_on_growth_over_the_limit(tmp_path):
    """A limit below any possible reading makes the run fail: the check is live."""
    result = _soak(tmp_path, "--steps", "100", "--chunk", "100", "--max-growth-mb=-1e6")
    assert result.returncode == 1 and "FAIL: grew more than" in result.stdout, result.stdout + result.stderr
