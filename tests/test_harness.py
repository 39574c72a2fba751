"""The experiments' shared modules (experiments/_harness.py, _training.py, _checkpoints.py): chunks
compile before timing; one model's fit keeps slax's parameters flat and gives them back in their own
form; checkpoints are atomic, the previous one is kept, damaged ones and changed
flags are refused by name, resuming gives the uninterrupted run's bits, and bad flags are refused
before anything is created."""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import signal
import textwrap

import _harness as harness
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _checkpoints import (
    CheckpointError,
    checkpoint_step,
    load_checkpoint,
    previous_checkpoint,
    save_checkpoint,
)
from _helpers import ROOT, once_per_run, run_python
from _training import TrainingRun, fit, result_line, train_in_chunks

# The experiments' harness (chunks, checkpoints, flags) does not depend on the route.
pytestmark = [pytest.mark.one_device_kind]


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
        import os, pathlib, signal, sys
        import jax, jax.numpy as jnp, numpy as np
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from test_harness import _state
        import _checkpoints
        path = pathlib.Path({str(tmp_path / "c.npz")!r})
        key = jax.random.key(3)
        _checkpoints.save_checkpoint(path, _state(1), 100, key, np.zeros(100))
        def savez_then_die(f, **arrays):
            f.write(b"PK\\x03\\x04 half of a zip file")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        _checkpoints.np.savez = savez_then_die
        _checkpoints.save_checkpoint(path, _state(2), 200, key, np.zeros(200))
        """
    )
    result = run_python("-c", script, timeout=300)
    assert result.returncode == -signal.SIGKILL
    assert (tmp_path / "c.npz.tmp").exists(), "the second write never started"
    state, step, _ = load_checkpoint(tmp_path / "c.npz", _state(0), jax.random.key(3))
    assert step == 100 and np.array_equal(state["params"][0], _state(1)["params"][0])


_KILLED_AFTER_A_CHECKPOINT = textwrap.dedent(
    """
    import os, runpy, signal, sys
    sys.path.insert(0, "experiments")
    import _training
    save = _training.save_checkpoint
    def save_then_die(path, state, step, *args, **kwargs):
        save(path, state, step, *args, **kwargs)
        if step >= 200:
            os.kill(os.getpid(), signal.SIGKILL)
    _training.save_checkpoint = save_then_die
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)
"""A script run as ``python -c SCRIPT experiments/X.py FLAGS``: runs X.py and kills itself with
SIGKILL right after the first checkpoint it saves at step 200 or later."""


@pytest.mark.slow
def test_fresh_run_refuses_existing_checkpoints(tmp_path):
    save_checkpoint(tmp_path / "checkpoint-slax.npz", _state(1), 1, jax.random.key(0), np.zeros(1))
    flags = ["--steps", "10", "--chunk", "5", "--checkpoint-every", "5", "--out", str(tmp_path)]
    result = run_python("experiments/polynomial.py", *flags, timeout=300)
    assert result.returncode == 2 and "pass --resume" in result.stderr, result.stdout + result.stderr
    assert "slax: compiling" not in result.stdout  # refused with the flags, before any kernel compiles


# --- damaged checkpoints: an error naming the file, and the previous one kept ------------------------


def _save_steps(path, *steps):
    for step in steps:
        save_checkpoint(path, _state(step), step, jax.random.key(3), np.zeros(step))


def test_saving_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoint-m.npz"
    _save_steps(path, 10, 20, 30)
    assert checkpoint_step(path) == 30 and checkpoint_step(previous_checkpoint(path)) == 20
    state, step, _ = load_checkpoint(previous_checkpoint(path), _state(0), jax.random.key(3))
    assert step == 20 and np.array_equal(state["params"][0], _state(20)["params"][0])


DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "garbage": lambda data: bytes(range(256)) * 8,
    "not a checkpoint": lambda data: _npz_bytes(weights=np.ones(3)),
}


def _npz_bytes(**arrays) -> bytes:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_checkpoint_names_the_file_and_the_intact_previous_one(tmp_path, damage):
    path = tmp_path / "checkpoint-m.npz"
    _save_steps(path, 10, 20)
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    with pytest.raises(CheckpointError, match=rf"{path} cannot be read .*previous checkpoint .*\(step 10\)"):
        load_checkpoint(path, _state(0), jax.random.key(3))


def test_damaged_checkpoint_without_a_previous_one_says_to_start_afresh(tmp_path):
    path = tmp_path / "checkpoint-m.npz"
    _save_steps(path, 10)
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match=rf"{path} cannot be read.*start the run afresh"):
        load_checkpoint(path, _state(0), jax.random.key(3))


def test_checkpoint_of_another_model_is_refused(tmp_path):
    path = tmp_path / "checkpoint-m.npz"
    _save_steps(path, 10)
    with pytest.raises(CheckpointError, match="holds another model's state"):
        load_checkpoint(path, {"params": [jnp.zeros((5, 4))], "count": jnp.int32(0)}, jax.random.key(3))


# --- resuming: refused where it would not continue the run ------------------------------------------

LONG_RUN = ["experiments/polynomial.py", "--steps", "600", "--chunk", "100", "--checkpoint-every", "200"]
LONG_RUN += ["--batch", "256", "--target-mse", "1"]
"""A run long enough to be killed mid-way: checkpoints at steps 200, 400 and 600."""


def _deterministic_env() -> dict[str, str]:
    """This environment, XLA asked for the same bits on every run: on GPUs XLA sums some reductions
    with atomics, in a different order each run, unless asked not to (slax's kernels sum in a fixed
    order)."""
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_deterministic_ops=true").strip()
    return {**os.environ, "XLA_FLAGS": flags}


@pytest.fixture(scope="module")
def finished_run(request, tmp_path_factory):
    """A fresh :data:`LONG_RUN`, finished: its latest checkpoints at step 600, the previous ones at
    400, and its flags recorded. Made once for all pytest-xdist workers; tests that change it copy
    it."""

    def make() -> str:
        out = tmp_path_factory.mktemp("finished") / "run"
        result = run_python(*LONG_RUN, "--out", str(out), env=_deterministic_env())
        assert result.returncode == 0, result.stdout + result.stderr
        return str(out)

    return pathlib.Path(once_per_run(request, "finished_run.txt", make))


@pytest.fixture(scope="module")
def killed_run(request, tmp_path_factory):
    """A :data:`LONG_RUN` started with ``--resume`` into an empty ``--out`` (as a launcher of
    preemptible jobs passes it every time), killed (SIGKILL, no chance to clean up) right after its
    first checkpoint at step >= 200: at the same point on every machine, however fast it trains (a
    GPU finishes 600 steps before a poll). Made once for all pytest-xdist workers; tests copy its
    directory before they resume it."""

    def make() -> str:
        out = tmp_path_factory.mktemp("killed") / "run"
        flags = [*LONG_RUN, "--out", str(out), "--resume"]
        killed = run_python("-c", _KILLED_AFTER_A_CHECKPOINT, *flags, env=_deterministic_env())
        assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
        step = int(np.load(out / "checkpoint-slax.npz")["step"])
        assert 200 <= step < 600, f"the run was not interrupted mid-way: its checkpoint is at step {step}"
        return str(out)

    return pathlib.Path(once_per_run(request, "killed_run.txt", make))


def _resume(out, *flags, env=None):
    """:data:`LONG_RUN` with ``flags`` (a repeated flag takes the later value) resumed in ``out``."""
    return run_python(*LONG_RUN, *flags, "--out", str(out), "--resume", env=env, timeout=300)


@pytest.mark.slow
def test_resume_after_kill_is_bit_identical(killed_run, finished_run, tmp_path):
    """The killed run, resumed with its flags, ends with the uninterrupted run's bits."""
    interrupted = tmp_path / "interrupted"
    shutil.copytree(killed_run, interrupted)
    resumed = _resume(interrupted, env=_deterministic_env())
    assert resumed.returncode == 0 and "resuming from step" in resumed.stdout, resumed.stdout + resumed.stderr
    for model in ("slax", "jax"):
        a = np.load(finished_run / f"checkpoint-{model}.npz")
        b = np.load(interrupted / f"checkpoint-{model}.npz")
        assert int(a["step"]) == int(b["step"]) == 600
        for name in a.files:
            assert np.array_equal(a[name], b[name]), f"{model} {name} differs after resuming"


CHANGED_FLAGS = ["--batch", "32", "--lr", "0.5", "--dtype", "float16"]
CHANGES = (
    "--batch 256 (the run's) vs 32 (now)",
    "--lr 0.01 (the run's) vs 0.5 (now)",
    "--dtype float32 (the run's) vs float16 (now)",
)
"""Flags that change :data:`LONG_RUN`, and how a refused ``--resume`` names each change."""


@pytest.mark.slow
def test_resume_with_flags_that_change_the_run_is_refused(finished_run):
    result = _resume(finished_run, *CHANGED_FLAGS, "--chunk", "50", "--target-mse", "2")
    assert result.returncode == 2, result.stdout + result.stderr
    for difference in CHANGES:
        assert difference in result.stderr, result.stderr
    assert "--chunk" not in result.stderr and "--target-mse" not in result.stderr


@pytest.mark.slow
def test_a_resume_that_starts_the_run_records_its_flags(killed_run):
    """``--resume`` into an empty ``--out`` (as a launcher of preemptible jobs passes it every time)
    trained and checkpointed but recorded no flags, so a later ``--resume`` with another --lr,
    --batch or --dtype was accepted and mixed two runs. The run it starts records its flags as a
    fresh run does, and a resume that would change them is refused (one with its flags continues
    it: test_resume_after_kill_is_bit_identical)."""
    assert (killed_run / "checkpoint-flags.json").exists()
    result = _resume(killed_run, *CHANGED_FLAGS)
    assert result.returncode == 2, result.stdout + result.stderr
    for difference in CHANGES:
        assert difference in result.stderr, result.stderr


def test_resume_with_steps_below_the_checkpoint_is_refused(finished_run):
    result = _resume(finished_run, "--steps", "400")
    assert result.returncode != 0
    assert "--steps 400 is below step 600" in result.stderr and "checkpoint-" in result.stderr


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_resume_from_a_damaged_checkpoint_names_it_and_what_to_do(finished_run, tmp_path, damage):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    path = out / "checkpoint-slax.npz"
    path.write_bytes(DAMAGE[damage](path.read_bytes()))
    result = _resume(out)
    assert result.returncode != 0
    assert f"checkpoint {path} cannot be read" in result.stderr, result.stderr
    assert f"cp {previous_checkpoint(path)} {path}" in result.stderr and "(step 400)" in result.stderr
    assert (out / "metrics.json").read_text() == (finished_run / "metrics.json").read_text()


# --- flags: refused before anything is created ------------------------------------------------------


def _parse(*flags):
    parser = argparse.ArgumentParser()
    harness.add_common_arguments(parser, steps=100, batch=8, chunk=10)
    return parser.parse_args(list(flags))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--devices", "4097"), "--devices 4097: JAX has"),
        (("--checkpoint-every", "30", "--chunk", "100"), "only at the end of the 100 steps"),
        (("--devices", "1", "--resume"), "--resume needs --out"),
    ],
)
def test_flags_bad_together_are_one_line_naming_the_flags_before_anything_is_created(
    tmp_path, capsys, flags, message
):
    """Flags each valid but no run together (or past the devices JAX has) are refused as argparse
    refuses a bad value: one line on stderr, exit status 2."""
    out = tmp_path / "never"
    out_flags = () if "--resume" in flags else ("--out", str(out))
    with pytest.raises(SystemExit) as raised:
        harness.prepare_run("test", _parse(*flags, *out_flags))
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("test: error: ") and message in error and error.count("\n") == 1, error
    assert not out.exists()


BAD_VALUES = [
    ("polynomial.py", "--steps", "0", "a positive integer"),
    ("polynomial.py", "--batch", "0", "a positive integer"),
    ("polynomial.py", "--chunk", "-5", "a positive integer"),
    ("polynomial.py", "--checkpoint-every", "-3", "0 or a positive integer"),
    ("polynomial.py", "--devices", "0", "a positive integer"),
    ("polynomial.py", "--seed", "-1", "an integer from 0 to 2**32 - 1"),
    ("polynomial.py", "--lr", "nan", "a finite number above 0"),
    ("polynomial.py", "--lr", "-0.01", "a finite number above 0"),
    ("polynomial.py", "--target-mse", "nan", "a finite number"),
    ("digits.py", "--lr", "inf", "a finite number above 0"),
    ("digits.py", "--weight-decay", "nan", "a finite number, 0 or above"),
    ("digits.py", "--target-accuracy", "nan", "a finite number"),
    ("sdf.py", "--lr", "0", "a finite number above 0"),
    ("texture.py", "--lr", "nan", "a finite number above 0"),
    ("texture.py", "--size", "0", "a positive integer"),
    ("image.py", "--frequencies", "0", "a positive integer"),
    ("image.py", "--target-psnr", "nan", "a finite number"),
    ("benchmark.py", "--batch", "0", "a positive integer"),
    ("benchmark.py", "--rounds", "0", "a positive integer"),
    ("benchmark.py", "--width", "0", "a positive integer"),
    ("benchmark.py", "--peak-tflops", "nan", "a finite number above 0"),
    ("profile_step.py", "--steps", "0", "a positive integer"),
    ("bridge_check.py", "--sizes", "0", "a positive integer"),
    ("soak.py", "--chunk", "0", "a positive integer"),
    ("soak.py", "--max-growth-mb", "nan", "a finite number"),
    ("gradcheck.py", "--seed", "-1", "an integer from 0 to 2**32 - 1"),
    ("compare_devices.py", "--tolerance", "nan", "a finite number, 0 or above"),
]
"""A value each flag cannot take, in every script that has the flag's kind, and what it takes."""


@pytest.mark.parametrize(("script", "flag", "value", "expected"), BAD_VALUES, ids=lambda v: str(v))
def test_bad_values_are_refused_by_argparse_naming_the_flag(script, flag, value, expected, tmp_path):
    """``--steps 0`` or ``--batch 0`` exited 1 (a missed target's status) after importing JAX;
    ``--lr nan`` trained on NaN for the whole run; ``soak.py --chunk 0`` died dividing by it. Every
    flag's type refuses what it cannot take when the flags are parsed: argparse's one line naming
    the flag, what it takes and the value, and exit status 2."""
    extra = [str(tmp_path)] if script == "compare_devices.py" else []  # its positional run directories
    result = run_python(f"experiments/{script}", *extra, f"{flag}={value}", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"error: argument {flag}: must be {expected}; got {value!r}" in result.stderr, result.stderr
    assert "loading JAX" not in result.stdout


def _parse_with_device_defaults(*flags):
    parser = argparse.ArgumentParser()
    steps, batch = harness.DeviceDefault(cpu=300, gpu=2000), harness.DeviceDefault(cpu=512, gpu=4096)
    harness.add_common_arguments(parser, steps=steps, batch=batch, chunk=100)
    return parser.parse_args(list(flags))


@pytest.mark.parametrize("on_gpu", [False, True])
def test_a_device_default_gives_the_devices_value_and_a_given_flag_wins(on_gpu):
    args = _parse_with_device_defaults("--batch", "64")
    harness.resolve_device_defaults(args, on_gpu=on_gpu)
    assert (args.steps, args.batch, args.chunk) == ((2000 if on_gpu else 300), 64, 100)


def test_prepare_run_chooses_the_defaults_of_the_device_jax_runs_on(tmp_path):
    """The values are chosen before the flags are checked, and metrics.json's config records them."""
    args = _parse_with_device_defaults("--out", str(tmp_path))
    harness.prepare_run("test", args)
    expected = (2000, 4096) if harness.on_cuda() else (300, 512)
    assert (args.steps, args.batch) == expected
    assert (harness.run_config(args)["steps"], harness.run_config(args)["batch"]) == expected


@pytest.mark.parametrize("script", ["sdf.py", "image.py"])
def test_help_shows_each_device_default_for_both_devices(script):
    """``--help`` answers before JAX is imported, so it cannot know the device: it shows both."""
    result = run_python(f"experiments/{script}", "--help", timeout=120)
    assert result.returncode == 0, result.stderr
    help_text = " ".join(result.stdout.split())
    shown = re.findall(r"\(default (\d+) on a CPU, (\d+) on a GPU\)", help_text)
    assert len(shown) >= 2, help_text  # --steps and --batch at least
    assert all(int(cpu) < int(gpu) for cpu, gpu in shown), shown
    assert re.search(r"Run time of the defaults: .+ on a 2-core CPU .+ On a GPU", help_text), help_text


def test_checkpoint_interval_rounded_to_whole_chunks_says_so(tmp_path, capsys):
    harness.validate_arguments("test", _parse("--checkpoint-every", "15", "--chunk", "10"))
    assert "--checkpoint-every 15 is rounded up to 20" in capsys.readouterr().out
    harness.validate_arguments("test", _parse("--checkpoint-every", "20", "--chunk", "10"))
    assert capsys.readouterr().out == ""


def test_wide_network_names_every_width_with_every_depth():
    """``--network wide`` stands for one architecture per --width and --hidden-layers, widths outer,
    each name giving back its sizes; the named networks pass through as they are."""
    args = argparse.Namespace(
        network=["polynomial", "wide"], width=[16, 128], hidden_layers=[2, 8], wide_input=32, wide_output=4
    )
    names = harness.workloads(args)
    assert names == ["polynomial", "wide-32-16x2-4", "wide-32-16x8-4", "wide-32-128x2-4", "wide-32-128x8-4"]
    assert harness.network_sizes("wide-32-128x2-4") == (32, 128, 128, 4)
    wide = harness.wide_architecture("wide-32-16x8-4")
    assert wide == dict(inputs=32, width=16, hidden_layers=8, outputs=4)
    assert harness.network_sizes("polynomial") == (4, 16, 4)
    assert harness.wide_architecture("polynomial") is None
    assert harness.network_sizes("texture") is None


def _quadratic_loss_and_grad(params, x, y):
    return jax.value_and_grad(lambda p: jnp.mean((x @ p["w"] + p["b"] - y) ** 2))(params)


@pytest.mark.parametrize(("name", "flat"), [("slax", True), ("jax", False)])
def test_fit_trains_in_the_models_parameter_form_and_returns_its_own(tmp_path, name, flat):
    rng = np.random.default_rng(5)
    params = {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), "b": jnp.zeros(2, jnp.float32)}
    w_true = jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)

    def draw_batch(key):
        x = jax.random.normal(key, (16, 3))
        return x, x @ w_true

    args = argparse.Namespace(steps=12, chunk=5, devices=None, checkpoint_every=0, resume=False)
    seen = []

    def evaluate(p):
        seen.append(jax.tree.structure(p))
        return float(p["b"][0])

    optimizer = optax.sgd(0.1)
    run, final = fit(
        name,
        params,
        _quadratic_loss_and_grad,
        optimizer,
        draw_batch,
        jax.random.key(1),
        args,
        tmp_path,
        evaluate=evaluate,
    )
    stored = run.state[0]
    assert isinstance(stored, jax.Array) == flat  # slax's: one vector (parameter_state)
    assert jax.tree.structure(final) == jax.tree.structure(params)
    assert seen == [jax.tree.structure(params)] * 3  # after each of the chunks 5, 5, 2
    assert len(run.losses) == 12 and run.losses[-1] < run.losses[0]
    assert run.evaluations[-1] == (12, float(final["b"][0]))  # the last chunk's, on the final parameters


def test_result_line_and_results_put_speed_after_the_models_own_measures():
    run = TrainingRun(None, np.random.default_rng(2).random(80), 2.0, 100, [], 3.25)
    results = run.results(64, {"test_mse": 0.5})
    assert list(results)[:2] == ["test_mse", "train_loss_mean_last_50_steps"]
    assert results["train_loss_mean_last_50_steps"] == pytest.approx(run.losses[-50:].mean())
    assert results["steps_per_s"] == 50.0 and results["samples_per_s"] == 3200.0
    assert result_line("slax", "held-out MSE 5.000e-01", results) == (
        "slax: held-out MSE 5.000e-01, 50 steps/s (compiling took 3.2 s more)"
    )
    assert result_line("jax", "PSNR", results, 1) == "jax: PSNR, 50.0 steps/s (compiling took 3.2 s more)"
