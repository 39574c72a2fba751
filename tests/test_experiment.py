"""slax.experiment: chunks compile before timing; checkpoints are atomic and resuming gives the
uninterrupted run's bits."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from slax.experiment import load_checkpoint, save_checkpoint, train_in_chunks

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _state(seed):
    rng = np.random.default_rng(seed)
    return {"params": [jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)], "count": jnp.int32(seed)}


def test_round_trip(tmp_path):
    key = jax.random.key(3)
    save_checkpoint(tmp_path / "c.npz", _state(1), 40, key, np.arange(40.0))
    state, step, losses = load_checkpoint(tmp_path / "c.npz", _state(0), key)
    assert step == 40 and np.array_equal(losses, np.arange(40.0))
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(_state(1))):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    with pytest.raises(ValueError, match="another seed"):
        load_checkpoint(tmp_path / "c.npz", _state(0), jax.random.key(4))


def test_chunk_lengths_compile_before_any_step_is_timed():
    """10 steps in chunks of 4 take two programs (4 and 2 steps): both compile before the first chunk
    runs, so no compilation lands in the timed steps, and the compile time is reported apart."""
    events = []

    def on_compile(event, duration, fun_name="", **kwargs):
        if event.endswith("backend_compile_duration") and fun_name == "jit(training_chunk)":
            events.append("compile")

    def step(state, key):
        state = state + jax.random.normal(key)
        return state, state

    def evaluate(state):
        events.append("chunk")
        return 0.0

    jax.monitoring.register_event_duration_secs_listener(on_compile)
    try:
        run = train_in_chunks(step, jnp.float32(0), jax.random.key(0), 10, 4, "test", evaluate=evaluate)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_compile)
    assert events == ["compile", "compile", "chunk", "chunk", "chunk"]
    assert len(run.losses) == run.steps_timed == 10 and run.compile_seconds > 0
    speed = run.speed(batch=8)
    assert speed["timed_steps"] == 10 and speed["samples_per_s"] == 8 * speed["steps_per_s"]


def test_process_killed_mid_write_keeps_last_good_checkpoint(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import jax, jax.numpy as jnp, numpy as np
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from test_experiment import _state
        from slax import experiment
        path = experiment.pathlib.Path({str(tmp_path / "c.npz")!r})
        key = jax.random.key(3)
        experiment.save_checkpoint(path, _state(1), 100, key, np.zeros(100))
        real_savez = np.savez
        def savez_then_die(f, **arrays):
            f.write(b"PK\\x03\\x04 half of a zip file")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        experiment.np.savez = savez_then_die
        experiment.save_checkpoint(path, _state(2), 200, key, np.zeros(200))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=300)
    assert result.returncode == -signal.SIGKILL
    assert (tmp_path / "c.npz.tmp").exists(), "the second write never started"
    state, step, _ = load_checkpoint(tmp_path / "c.npz", _state(0), jax.random.key(3))
    assert step == 100 and np.array_equal(state["params"][0], _state(1)["params"][0])


def test_resume_after_kill_is_bit_identical(tmp_path):
    args = [
        "experiments/polynomial.py",
        "--steps",
        "600",
        "--chunk",
        "100",
        "--checkpoint-every",
        "200",
        "--target-mse",
        "1",
    ]
    whole, interrupted = tmp_path / "whole", tmp_path / "interrupted"
    subprocess.run(
        [sys.executable, *args, "--out", str(whole)], cwd=ROOT, check=True, capture_output=True, timeout=600
    )
    process = subprocess.Popen(
        [sys.executable, *args, "--out", str(interrupted)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoint = interrupted / "checkpoint-slax.npz"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if int(np.load(checkpoint)["step"]) >= 200:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    process.kill()
    process.wait()
    assert int(np.load(checkpoint)["step"]) < 600, "the run finished before it could be interrupted"
    resumed = subprocess.run(
        [sys.executable, *args, "--out", str(interrupted), "--resume"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0 and "resuming from step" in resumed.stdout, resumed.stdout + resumed.stderr
    for model in ("slax", "jax"):
        a, b = np.load(whole / f"checkpoint-{model}.npz"), np.load(interrupted / f"checkpoint-{model}.npz")
        assert int(a["step"]) == int(b["step"]) == 600
        for name in a.files:
            assert np.array_equal(a[name], b[name]), f"{model} {name} differs after resuming"


def test_fresh_run_refuses_existing_checkpoints(tmp_path):
    save_checkpoint(tmp_path / "checkpoint-slax.npz", _state(1), 1, jax.random.key(0), np.zeros(1))
    result = subprocess.run(
        [
            sys.executable,
            "experiments/polynomial.py",
            "--steps",
            "10",
            "--checkpoint-every",
            "5",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0 and "pass --resume" in result.stderr
