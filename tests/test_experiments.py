"""The experiment scripts run end to end (short runs) and write what they promise."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess

import _harness as harness
import _training
import benchmark
import gradcheck
import jax
import jax.numpy as jnp
import numpy as np
import profile_step
import pytest
from _helpers import ROOT, run_python

import slax
from slax import nn
from slax.nn import _backends as nn_backends

# The scripts' flags, outputs and plots do not depend on the route; the kernels they run are
# tested on every route by test_function.py and test_nn.py.
pytestmark = [pytest.mark.one_device_kind]


@pytest.mark.slow
def test_polynomial_trains_and_writes_outputs(tmp_path):
    """400 steps in chunks of 300 (a shorter last chunk), a target it meets: exit 0, the outputs
    listed at the end, compile time apart from the timed steps."""
    flags = ["--steps", "400", "--chunk", "300", "--target-mse", "0.05", "--out", str(tmp_path)]
    result = run_python("experiments/polynomial.py", *flags, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"outputs in {tmp_path}: loss.png, metrics.json, surfaces.png" in result.stdout
    assert "met: slax held-out MSE" in result.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["slax"]["test_mse"] < 0.05
    assert (
        abs(metrics["slax"]["test_mse"] - metrics["jax"]["test_mse"])
        < 1e-3 * metrics["jax"]["test_mse"] + 1e-6
    )
    assert metrics["step0_gradient_slax_vs_jax"]["max_difference_relative_to_largest"] < 1e-5
    assert metrics["device"]["slang"].startswith(("vulkan", "cpu", "cuda"))
    assert metrics["device"]["slang"].endswith(f", {metrics['device']['route']} route")
    _assert_in_order(
        result.stdout,
        "polynomial: loading JAX and slax ...",  # before the seconds JAX and slax take to import
        f"polynomial: JAX on {metrics['device']['jax']}, Slang kernels on {metrics['device']['slang']}",
        "polynomial: comparing the step-0 gradients of slax and plain JAX",
        # slax's log as the loss's kernel compiles: its entry point on the CPU routes; on CUDA the
        # module slax generates for it (its PTX may come from the cache another process filled)
        (
            "slax: compiling entry point 'mlp_loss_grad'",
            "slax: compiling the kernel slax generated for mlp_loss_grad",
        ),
        "slax: compiling the training chunks ...",
        "jax: compiling the training chunks ...",
        "polynomial: drawing loss.png, surfaces.png",
        "  wrote loss.png",
        "  wrote surfaces.png",
        "outputs in",
    )
    assert metrics["config"]["devices"] is None and metrics["config"]["out"] == str(tmp_path)
    for model in ("slax", "jax"):
        assert metrics[model]["timed_steps"] == 400 and metrics[model]["compile_time_s"] > 0
    for name in ("loss.png", "surfaces.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def _assert_in_order(output: str, *starts: str | tuple[str, ...]) -> None:
    """Each of ``starts`` (a string, or a tuple of alternatives) begins a line of ``output``, in this
    order: what a run says as it goes."""
    lines = output.splitlines()
    position = 0
    for start in starts:
        found = next((i for i in range(position, len(lines)) if lines[i].startswith(start)), None)
        assert found is not None, f"no line starting {start!r} after line {position}:\n{output[-4000:]}"
        position = found + 1


SCRIPTS = sorted(path.name for path in (ROOT / "experiments").glob("*.py") if not path.name.startswith("_"))
"""The scripts; experiments/_*.py are the modules they share."""

TRAINING_SCRIPTS = {
    "polynomial.py",
    "digits.py",
    "texture.py",
    "sdf.py",
    "image.py",
    "ngp_image.py",
    "ngp_sdf.py",
}
"""The scripts that train a model: each one's ``--help`` says how long its defaults take."""


def _flag_helps(help_text: str) -> dict[str, str]:
    """Each flag of an argparse ``--help`` and its help text, whitespace collapsed."""
    options = help_text.split("options:", 1)[1]
    blocks = re.split(r"\n(?=  -)", options.split("\n\n", 1)[0])
    return {
        re.match(r"\s*(-[\w-]+(?:, --[\w-]+)?)", block).group(1): " ".join(block.split())
        for block in blocks
        if block.strip()
    }


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_says_what_it_does_and_its_default(script):
    result = run_python(f"experiments/{script}", "--help", timeout=120)
    assert result.returncode == 0, result.stderr
    helps = _flag_helps(result.stdout)
    assert "-h, --help" in helps and len(helps) > 2, result.stdout  # the options were found
    for flag, text in helps.items():
        if flag != "-h, --help":
            assert "default" in text, f"{script} {flag}: {text}"
    assert "exit status:\n  0  the run finished" in result.stdout
    if script in TRAINING_SCRIPTS:
        run_time = re.search(
            r"Run time of the defaults: .+ on a 2-core CPU .+ On a GPU", " ".join(result.stdout.split())
        )
        assert run_time, f"{script}'s docstring should say how long its defaults take:\n{result.stdout}"


@pytest.mark.slow
def test_digits_trains_and_writes_outputs(tmp_path):
    result = run_python(
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


@pytest.mark.slow
def test_sdf_trains_and_writes_outputs(tmp_path):
    """A short run of the eikonal fit: slax's second derivatives give plain JAX's loss gradient and
    run, both models learn the same field, and the outputs are written."""
    flags = ["--steps", "40", "--chunk", "20", "--batch", "256", "--target-mse", "0.05"]
    flags += ["--out", str(tmp_path)]
    result = run_python("experiments/sdf.py", *flags, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"outputs in {tmp_path}: loss.png, metrics.json, slice.png" in result.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["step0_gradient_slax_vs_jax"]["max_difference_relative_to_largest"] < 1e-5
    for key in ("test_mse", "test_mse_near_surface", "eikonal_residual"):
        assert metrics["slax"][key] == pytest.approx(metrics["jax"][key], rel=1e-3)
    assert metrics["slax"]["test_mse"] < 0.05 and metrics["slax"]["timed_steps"] == 40
    for name in ("loss.png", "slice.png"):
        assert (tmp_path / name).stat().st_size > 10_000


@pytest.mark.slow
def test_texture_fits_a_small_texture_and_writes_outputs(tmp_path):
    """A 32x32 texture (the photograph averaged over 16x16 blocks), 60 steps: both samplers fit it
    alike, from the same gradient at step 0."""
    flags = ["--size", "32", "--batch", "2048", "--steps", "60", "--chunk", "30", "--target-psnr", "20"]
    result = run_python("experiments/texture.py", *flags, "--out", str(tmp_path), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"outputs in {tmp_path}: loss.png, metrics.json, texture.png" in result.stdout
    assert "met: slax texture PSNR (dB)" in result.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["step0_gradient_slax_vs_jax"]["max_difference_relative_to_largest"] < 1e-5
    assert metrics["slax"]["texture_psnr_db"] >= 20
    assert metrics["slax"]["texture_psnr_db"] == pytest.approx(metrics["jax"]["texture_psnr_db"], abs=0.1)
    for model in ("slax", "jax"):
        assert metrics[model]["timed_steps"] == 60 and metrics[model]["samples_per_s"] > 0
    for name in ("loss.png", "texture.png"):
        assert (tmp_path / name).stat().st_size > 10_000


@pytest.mark.slow
def test_image_learns_a_small_photograph_and_writes_outputs(tmp_path):
    """A 32x32 photograph through the frequency encoding and the 64-wide MLP, 40 steps: slax's
    fused loss gradient is plain JAX's at step 0, both fits end alike, and the outputs are written."""
    flags = ["--size", "32", "--batch", "1024", "--steps", "40", "--chunk", "20", "--target-psnr", "12"]
    result = run_python("experiments/image.py", *flags, "--out", str(tmp_path), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"outputs in {tmp_path}: image.png, loss.png, metrics.json" in result.stdout
    assert "met: slax image PSNR (dB)" in result.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["sizes"] == [40, 64, 64, 64, 64, 3]
    assert metrics["step0_gradient_slax_vs_jax"]["max_difference_relative_to_largest"] < 1e-5
    assert metrics["slax"]["image_psnr_db"] == pytest.approx(metrics["jax"]["image_psnr_db"], abs=0.1)
    assert metrics["device"]["route"] == slax.launch_route()
    for model in ("slax", "jax"):
        assert metrics[model]["timed_steps"] == 40 and metrics[model]["samples_per_s"] > 0
    for name in ("loss.png", "image.png"):
        assert (tmp_path / name).stat().st_size > 10_000


@pytest.mark.slow
def test_ngp_image_learns_a_small_image_and_writes_outputs(tmp_path):
    """A 32x32 procedural image through a 4-level hash encoding and the 64-wide MLP, 40 steps:
    slax's gradient is plain JAX's at step 0, both fits end alike, and the outputs are written."""
    flags = ["--size", "32", "--levels", "4", "--log2-table-size", "8", "--batch", "512"]
    flags += ["--steps", "40", "--chunk", "20", "--target-psnr", "8"]
    result = run_python("experiments/ngp_image.py", *flags, "--out", str(tmp_path), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"outputs in {tmp_path}: image.png, loss.png, metrics.json, psnr.png" in result.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["sizes"] == [8, 64, 64, 3]
    assert metrics["encoding"]["resolutions"] == [16, 20, 25, 32]
    assert metrics["step0_gradient_slax_vs_jax"]["max_difference_relative_to_largest"] < 1e-5
    assert metrics["slax"]["image_psnr_db"] == pytest.approx(metrics["jax"]["image_psnr_db"], abs=0.1)
    assert [step for step, _ in metrics["slax"]["psnr_db_by_step"]] == [20, 40]
    for name in ("loss.png", "psnr.png", "image.png"):
        assert (tmp_path / name).stat().st_size > 10_000


@pytest.mark.slow
def test_ngp_image_in_float16_runs_both_mlps_in_half_precision(tmp_path):
    """``--dtype float16``: float32 tables, both MLPs in float16 on the same casts, so slax's
    gradient is plain JAX's at step 0 to half precision's rounding and both fits end alike."""
    flags = ["--size", "32", "--levels", "4", "--log2-table-size", "8", "--batch", "512"]
    flags += ["--steps", "20", "--chunk", "20", "--dtype", "float16"]
    result = run_python("experiments/ngp_image.py", *flags, "--out", str(tmp_path), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["config"]["dtype"] == "float16"
    assert (metrics["encoding"]["tables_dtype"], metrics["encoding"]["mlp_dtype"]) == ("float32", "float16")
    half = float(np.finfo(np.float16).eps)
    assert metrics["step0_gradient_slax_vs_jax"]["max_difference_relative_to_largest"] < 10 * half
    assert metrics["slax"]["image_psnr_db"] == pytest.approx(metrics["jax"]["image_psnr_db"], abs=0.2)


@pytest.mark.slow
def test_ngp_sdf_learns_the_torus_through_the_hash_encoding_and_writes_outputs(tmp_path):
    """A 4-level 3-D hash encoding and the 64-wide MLP under the eikonal loss, 60 steps: slax's
    second derivatives through encoding and MLP give plain JAX's loss gradient, both fields end
    alike and well below the untrained error, and the outputs are written."""
    flags = ["--levels", "4", "--log2-table-size", "16", "--finest-resolution", "32", "--batch", "256"]
    flags += ["--steps", "60", "--chunk", "30", "--out", str(tmp_path)]
    result = run_python("experiments/ngp_sdf.py", *flags, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"outputs in {tmp_path}: loss.png, metrics.json, slice.png" in result.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["sizes"] == [8, 64, 64, 1]
    assert metrics["encoding"]["resolutions"] == [16, 20, 25, 32]
    assert metrics["step0_gradient_slax_vs_jax"]["max_difference_relative_to_largest"] < 1e-5
    for key in ("test_mse", "test_mse_near_surface", "eikonal_residual"):
        assert metrics["slax"][key] == pytest.approx(metrics["jax"][key], rel=1e-3)
    assert metrics["slax"]["test_mse"] < metrics["untrained_test_mse"] / 4
    assert metrics["slax"]["timed_steps"] == 60
    for name in ("loss.png", "slice.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def test_texture_refuses_a_size_that_does_not_divide_the_photograph(tmp_path):
    result = run_python("experiments/texture.py", "--size", "48", "--out", str(tmp_path), timeout=120)
    assert result.returncode == 2
    assert "--size must divide 512 (the photograph's crop); got 48." in result.stderr


def _run_without_extras(script: str, *flags: str) -> subprocess.CompletedProcess:
    """Runs an experiment as on a machine with JAX but without the experiments extra (tqdm,
    matplotlib, scikit-learn), like the GPU machine: those imports fail."""
    blocked = ("tqdm", "tqdm.auto", "matplotlib", "matplotlib.pyplot", "sklearn", "sklearn.datasets")
    program = (
        f"import runpy, sys; sys.modules.update(dict.fromkeys({blocked!r})); "
        f"sys.argv = {[script, *flags]!r}; runpy.run_path({script!r}, run_name='__main__')"
    )
    return run_python("-c", program, timeout=600)


@pytest.mark.slow
def test_polynomial_trains_without_the_experiments_extra(tmp_path):
    """Also: a target the run misses exits 1, saying so, after writing its metrics."""
    flags = ["--steps", "200", "--chunk", "100", "--target-mse", "1e-9", "--out", str(tmp_path)]
    result = _run_without_extras("experiments/polynomial.py", *flags)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "MISSED: slax held-out MSE" in result.stdout and "target at most 1e-09" in result.stdout
    assert "slax: 200/200 steps, loss" in result.stdout  # progress lines instead of a tqdm bar
    assert "matplotlib is not installed: no plots (pip install 'slang-jax[experiments]'" in result.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["slax"]["test_mse"] < 1
    assert not list(tmp_path.glob("*.png"))


def test_digits_without_scikit_learn_says_what_to_install(tmp_path):
    result = _run_without_extras("experiments/digits.py", "--out", str(tmp_path))
    assert result.returncode == 1
    assert "digits: the data set comes with scikit-learn, which is not installed" in result.stderr


GRADCHECK_SAMPLE = ("wave", "polynomial", "bilinear", "mlp-4-16-4")
"""The checks of gradcheck.py the test runs (``--only``; all of them take three times as long): the
first function, whose rows come before the next one's kernels compile; the polynomial, whose
rows name its Slang parameters; a function with a tensor parameter; and the smaller MLP, to second
order and through the fused loss. The others compile kernels of their own, which the unit tests
check on every route (tests/test_function.py, test_tensors.py; the 64-128-64-10 MLP's apply and
fused loss in test_nn.py, its tiled kernels to second order in test_nn_second_order.py), and the
GPU sessions run them all (scripts/gpu-check.sh)."""


@pytest.mark.slow
def test_gradcheck_passes_everything_it_checks(tmp_path):
    """gradcheck.py's float32 rows of :data:`GRADCHECK_SAMPLE` (its float16 ones compile every
    kernel again in halves, which the unit tests check)."""
    flags = ["--dtype", "float32", "--only", *GRADCHECK_SAMPLE, "--out", str(tmp_path)]
    result = run_python("experiments/gradcheck.py", *flags, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout and "mlp 4-16-4 fused" in result.stdout
    table = json.loads((tmp_path / "gradcheck.json").read_text())
    device = table["device"]
    assert f"gradcheck: JAX on {device['jax']}, Slang kernels on {device['slang']}" in result.stdout
    if device["route"] not in ("ptx", "slangpy"):  # no CUDA launch route where no CUDA runs
        assert "ptx" not in result.stdout and table["config"]["launch"] is None
    # Each row is printed as its check finishes: slax compiles later functions' kernels after it.
    _assert_in_order(result.stdout, "function ", "wave ", "slax: compiling", "mlp 4-16-4 ")
    assert table["failed"] == 0 and table["passed"] == len(table["rows"])
    checked = {r["function"] for r in table["rows"]}
    assert checked == {"wave", "polynomial", "bilinear", "mlp 4-16-4", "mlp 4-16-4 fused"}
    # Values, both modes and both second-order products of each function but the tensor one (its
    # parameters take first order only).
    for function in ("wave", "polynomial", "bilinear"):
        checks = {r["check"] for r in table["rows"] if r["function"] == function}
        first_order = {"value", "rev", "fwd"}
        assert checks == (first_order if function == "bilinear" else first_order | {"hvp fwd", "hvp rev"})
    polynomial = [
        r["argument"] for r in table["rows"] if r["function"] == "polynomial" and r["check"] == "rev"
    ]
    assert polynomial == ["a", "b", "c", "x"]  # rows name Slang parameters
    tensors = [r["argument"] for r in table["rows"] if r["function"] == "bilinear" and r["check"] == "rev"]
    assert tensors == ["texture", "uv"]  # a function with a tensor parameter, in reverse mode
    # The MLP's second order: Hessian-vector products in its parameters and inputs.
    second_order = {(r["function"], r["dtype"], r["check"]) for r in table["rows"] if "hvp" in r["check"]}
    assert {("mlp 4-16-4", "float32", "hvp fwd"), ("mlp 4-16-4", "float32", "hvp rev")} <= second_order
    assert (tmp_path / "gradcheck.txt").read_text().rstrip().endswith(f"{table['passed']} passed, 0 failed")


def test_gradcheck_only_names_what_it_can_check(capsys):
    """``--only`` takes the functions and networks gradcheck.py checks, and argparse's error for
    another name lists them."""
    assert gradcheck.parse_arguments(["--only", "wave", "mlp-4-16-4"]).only == ["wave", "mlp-4-16-4"]
    with pytest.raises(SystemExit) as raised:
        gradcheck.parse_arguments(["--only", "waves"])
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert "argument --only: invalid choice: 'waves'" in error
    assert all(name in error for name in (*gradcheck.FUNCTIONS, *gradcheck.NETWORKS)), error


def test_bridge_check_runs(device_kind, tmp_path):
    result = run_python(
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
    routes = {"cuda": ["slangpy", "ptx"], "vulkan": ["host-copy"], "cpu": ["host-pointer"]}[device_kind]
    assert f"Slang kernels on {report['slang_device']}; launch routes checked: {', '.join(routes)}" in (
        result.stdout
    )
    assert report["in_place"] == dict.fromkeys(routes, True)
    assert [(row["route"], row["elements"]) for row in report["rows"]] == [
        (route, size) for route in routes for size in (256, 1 << 20)
    ]
    if device_kind == "cuda":  # the PTX route against the SlangPy route, bitwise
        assert report["parity"] and all(row["identical"] for row in report["parity"])
    else:
        assert report["parity"] == []  # the PTX route exists on CUDA only


def test_benchmark_trains_slax_on_one_parameter_vector_and_plain_jax_either_way():
    """The state benchmark.py times: slax's parameters as one vector (its kernels' layout), plain
    JAX's as per-layer arrays unless asked to keep them flat (the ``jax/flat`` rows)."""
    (slax_params, _), (jax_params, _), (flat_params, _) = (
        benchmark.training_run("polynomial", model, "float32", 64, flat=flat)[1]
        for model, flat in (("slax", None), ("jax", None), ("jax", True))
    )
    assert slax_params.shape == flat_params.shape == (4 * 16 + 16 + 16 * 4 + 4,)
    assert [a.shape for a in jax.tree.leaves(jax_params)] == [(16,), (16, 4), (4,), (4, 16)]


@pytest.mark.slow
def test_benchmark_rounds_time_every_configuration_again_without_compiling_it_again(
    tmp_path, monkeypatch, capsys
):
    built = []

    def counted(*args, **kwargs):
        built.append(args[:3])
        return training_run(*args, **kwargs)

    training_run = benchmark.training_run
    monkeypatch.setattr(benchmark, "training_run", counted)
    benchmark._compiled_run.cache_clear()
    arguments = ["--network", "polynomial", "--batch", "64", "--dtype", "float32"]
    arguments += ["--steps", "2", "--repeats", "1", "--rounds", "2", "--json", str(tmp_path / "bench.json")]
    assert benchmark.main(arguments) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    configurations = (f"slax/{slax.launch_route()}", "jax", "jax/flat", "jax-f32")  # each model's
    assert [(r["round"], r["model"]) for r in rows] == [
        (round_index, model) for round_index in (1, 2) for model in configurations
    ]
    assert len(built) == len(configurations)  # built and compiled in round 1, timed again in round 2
    assert "round network" in capsys.readouterr().out  # the printed table names the round


@pytest.mark.slow
def test_benchmark_times_each_precision_with_plain_jax_at_the_same(tmp_path):
    """``--precision default highest``: every model's rows under each of JAX's matmul precisions, the
    precision recorded in each row (jax-f32, plain JAX at HIGHEST, only where it is not ``jax``);
    the floor's matrix rate a third at ``highest`` (3xTF32)."""
    arguments = ["--network", "polynomial", "--batch", "64", "--steps", "2", "--repeats", "1"]
    arguments += ["--precision", "default", "highest", "--peak-tflops", "1e-6", "--peak-gbps", "1e6"]
    assert benchmark.main([*arguments, "--json", str(tmp_path / "bench.json")]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    slax_row = f"slax/{slax.launch_route()}"
    assert [(r["precision"], r["model"]) for r in rows] == [
        ("default", slax_row),
        ("default", "jax"),
        ("default", "jax/flat"),
        ("default", "jax-f32"),
        ("highest", slax_row),
        ("highest", "jax"),
        ("highest", "jax/flat"),
    ]
    floors = {r["precision"]: r["floor_us"] for r in rows}
    assert floors["highest"] == pytest.approx(3 * floors["default"])  # bound by its FLOPs here


def test_benchmark_harness_row_samples_the_whole_batch_and_trains_nothing():
    """``--harness``'s row: the step with no model passes all of each batch, in the dtype the
    models read (labels stay integers), through an optimization barrier, so that XLA samples it in
    full, as for a model that reads it, rather than only the element its loss takes; and its zero
    gradients leave the parameters as they were."""
    cases = (
        ("polynomial", "float32", "tensor<1024x4xf32>, tensor<1024x4xf32>"),
        ("polynomial", "float16", "tensor<1024x4xf16>, tensor<1024x4xf16>"),
        ("digits", "float16", "tensor<1024x64xf16>, tensor<1024xi32>"),
    )
    for network, dtype, batch_types in cases:
        run, state = benchmark.training_run(network, "harness", dtype, 1024, flat=True)
        keys = benchmark.step_keys(3)
        lowered = run.lower(state, keys).as_text()
        barriers = re.findall(r"stablehlo\.optimization_barrier .* : (.*)$", lowered, re.M)
        assert barriers == [batch_types], (network, dtype, barriers)
        (params, _), losses = run(state, keys)
        np.testing.assert_array_equal(params, state[0])
        assert losses.shape == (3,) and np.all(np.isfinite(losses)) and len(set(losses.tolist())) == 3


@pytest.mark.slow  # 18 s; --quick times benchmark.py's wide network (11 s)
def test_benchmark_times_the_sdf_step_beside_plain_jax(tmp_path):
    """``--network sdf``: the eikonal training step, slax's and plain JAX's rows as for the other
    networks, its floor counting the forward pass, the input gradient and the backward pass of
    each."""
    arguments = ["--network", "sdf", "--batch", "64", "--steps", "2", "--repeats", "1"]
    arguments += ["--peak-tflops", "1", "--peak-gbps", "10", "--json", str(tmp_path / "bench.json")]
    assert benchmark.main(arguments) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    models = [f"slax/{slax.launch_route()}", "jax", "jax/flat", "jax-f32"]
    assert [(r["network"], r["model"]) for r in rows] == [("sdf", model) for model in models]
    assert rows[0]["flops"] == 12 * 64 * (3 * 64 + 64 * 64 + 64 * 64 + 64)
    assert rows[0]["bytes"] == 2 * 64 * (3 + 1) * 4
    assert all(r["steps_per_s"] > 0 for r in rows)


@pytest.mark.slow  # 32 s; --quick trains behind the hash encoding in tests/test_hash_encoding.py
def test_benchmark_times_the_hash_encoded_steps_beside_plain_jax(tmp_path):
    """``--network ngp_image``: ngp_image.py's step with the encoding of ``--levels`` and
    ``--log2-table-size`` (here 2 levels of 2^10 entries) named in its rows, slax's row with its
    tables and MLP each kept as one vector (as the script keeps them), and the script's plain JAX
    with them as arrays and kept flat; the floor counts the MLP's products (twice over for
    ngp_sdf's second derivatives), the float32 batch, and Adam's pass over every parameter.
    (ngp_sdf's step runs in the profile_step test.)"""
    arguments = ["--network", "ngp_image", "--levels", "2", "--log2-table-size", "10"]
    arguments += ["--batch", "64", "--dtype", "float16", "--steps", "2", "--repeats", "1"]
    arguments += ["--peak-tflops", "1", "--peak-gbps", "10", "--json", str(tmp_path / "bench.json")]
    assert benchmark.main(arguments) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [(r["network"], r["task"], r["levels"], r["model"]) for r in rows] == [
        ("ngp_image-2x2^10", "ngp_image", 2, model)
        for model in (f"slax/{slax.launch_route()}", "jax", "jax/flat")
    ]
    assert [tuple(r["sizes"]) for r in rows] == [(4, 64, 64, 3)] * 3
    assert [r["flat_parameters"] for r in rows] == ["parts", False, "parts"]
    # The tables: in 2-D the coarsest level's 17^2 vertices (296 entries, a multiple of 8) and the
    # finest's 2^10; in 3-D 17^3 vertices do not fit 2^10, and both levels hash.
    hidden = (4 * 64 + 64) + (64 * 64 + 64)
    image_parameters, sdf_parameters = (296 + 2**10) * 2 + hidden, 2 * 2**10 * 2 + hidden
    assert rows[0]["flops"] == 6 * 64 * (4 * 64 + 64 * 64 + 64 * 3)
    assert rows[0]["bytes"] == 2 * 64 * (2 + 3) * 4 + 7 * (image_parameters + 64 * 3 + 3) * 4
    assert benchmark.step_floor("ngp_sdf-2x2^10", "float16", 64) == (
        12 * 64 * (4 * 64 + 64 * 64 + 64 * 1),
        2 * 64 * (3 + 1) * 4 + 7 * (sdf_parameters + 64 * 1 + 1) * 4,
    )
    assert max(r["speedup_vs_jax"] for r in rows[1:]) == pytest.approx(1.0)
    assert all(r["steps_per_s"] > 0 for r in rows)


def test_the_hash_encoded_models_keep_each_part_as_one_vector():
    """A hash-encoded model's stored parameters, kept flat: one vector for the tables (which the
    kernels read whole, never concatenated with the MLP) and one for the MLP (its kernels' own
    layout); the gradient comes back in that form and its parts unravel to the model's."""
    params = {"tables": jnp.arange(12.0).reshape(6, 2), "mlp": nn.mlp_init(jax.random.key(0), (2, 4, 1))}

    def loss(p, x, y):
        return jnp.sum(p["tables"] ** 2) + jnp.sum(nn.mlp_apply(p["mlp"], x) * y)

    model = jax.value_and_grad(loss)
    stored, loss_and_grad, to_params = _training.parameter_state(params, model, _training.PARTS)
    assert {name: part.shape for name, part in stored.items()} == {"tables": (12,), "mlp": (17,)}
    x, y = jax.random.normal(jax.random.key(1), (3, 2)), jax.random.normal(jax.random.key(2), (3, 1))
    loss, grads = loss_and_grad(stored, x, y)
    want_loss, want = model(params, x, y)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    np.testing.assert_allclose(grads["tables"], 2 * np.arange(12.0), rtol=1e-6)
    want_mlp = jax.flatten_util.ravel_pytree(want["mlp"])[0]
    np.testing.assert_allclose(grads["mlp"], want_mlp, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(to_params(stored)["tables"], params["tables"])
    assert jax.tree.structure(to_params(stored)) == jax.tree.structure(params)


@pytest.mark.slow  # 19 s; --quick runs profile_step.py's table and its refusal of devices
def test_profile_step_traces_the_hash_encoded_step(device_kind):
    """profile_step.py's trace of a hash-encoded step (``--network ngp_sdf``, its eikonal term's
    second derivatives through slax's encoding): built and run by benchmark.py's training_run. On
    a GPU it times the encoding's two fused kernels (the read with the Jacobian and the field's one
    scatter, ``scatter_field``); on a CPU, where the profiler sees no GPU kernels, it refuses,
    saying so and naming what it saw."""
    args = profile_step.parse_arguments(["--network", "ngp_sdf", "--levels", "2", "--log2-table-size", "10"])
    (network,) = harness.workloads(args)
    config = dict(network=network, model="slax", dtype="float16", batch=64, steps=2, devices=None)
    if device_kind != "cuda":
        with pytest.raises(SystemExit, match="the trace holds no GPU kernels; its planes"):
            profile_step.kernel_times(config)
        return
    kernels, *_ = profile_step.kernel_times(config)
    for entry in ("encode_jacobian", "scatter_field"):
        assert any(entry in name and times[1] > 0 for name, times in kernels.items()), sorted(kernels)


def test_profile_step_table_sorts_kernels_by_time_with_their_share_of_the_step():
    """The profile's table: kernels longest first, names as the profiler gives them, each with its
    share of the step's kernel time and the running total."""
    kernels = {
        "loop_fusion_12": [2.0, 10.0],
        "slax_cotangent_blend_tables_3d": [1.0, 60.0],
        "mlp_backward": [1.0, 30.0],
    }
    lines = profile_step.kernel_table(kernels)
    assert lines[0].split() == ["launches", "us/step", "share", "cumul.", "kernel"]
    assert [line.split() for line in lines[1:]] == [
        ["1.00", "60.00", "60.0%", "60.0%", "slax_cotangent_blend_tables_3d"],
        ["1.00", "30.00", "30.0%", "90.0%", "mlp_backward"],
        ["2.00", "10.00", "10.0%", "100.0%", "loop_fusion_12"],
    ]


@pytest.mark.slow
def test_benchmark_times_a_wide_network_beside_plain_jax(tmp_path):
    """``--network wide``: an architecture of --width and --hidden-layers, fitted by squared error to
    random targets of its output width, its rows naming it and recording its sizes; its floor as
    the other MLPs' (no input gradient for the first layer). ``--mlp-backend``: a slax row per
    backend, each recording the backend the step took."""
    arguments = ["--network", "wide", "--width", "16", "--hidden-layers", "2", "--wide-input", "8"]
    arguments += ["--wide-output", "2", "--batch", "64", "--steps", "2", "--repeats", "1"]
    arguments += ["--peak-tflops", "1", "--peak-gbps", "10", "--json", str(tmp_path / "bench.json")]
    arguments += ["--mlp-backend", "auto", "xla"]
    assert benchmark.main(arguments) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    route = slax.launch_route()
    models = [f"slax/{route}/auto", f"slax/{route}/xla", "jax", "jax/flat", "jax-f32"]
    # "auto": the tensor-core tiles where slax may use tensor cores, the tiled kernels elsewhere
    on_gpu = any(d.platform == "gpu" for d in jax.devices())
    platform = nn_backends.Platform.of("cuda" if on_gpu else "cpu", nn_backends.BackendRequest.current())
    auto = "tensor_cores" if platform.tensor_cores else "tiled"
    assert [r["mlp_backend"] for r in rows] == [auto, "xla", None, None, None]
    assert [(r["network"], r["model"]) for r in rows] == [("wide-8-16x2-2", model) for model in models]
    assert {(tuple(r["sizes"]), r["width"], r["hidden_layers"]) for r in rows} == {((8, 16, 16, 2), 16, 2)}
    assert rows[0]["flops"] == 6 * 64 * (8 * 16 + 16 * 16 + 16 * 2) - 2 * 64 * 8 * 16
    assert rows[0]["bytes"] == 2 * 64 * (8 + 2) * 4
    x, targets = benchmark.make_batch("wide-8-16x2-2", jax.random.key(0), 64)
    assert x.shape == (64, 8) and targets.shape == (64, 2) and len(np.unique(targets)) == 128
    assert all(r["steps_per_s"] > 0 for r in rows)


def test_benchmark_table_shows_the_wide_family_per_width_and_dtype():
    """scripts/benchmark_table.py: the wide rows as one table per width and dtype (float16 first),
    a line per architecture and batch, in millions of samples/s with slax's ratio to plain JAX."""
    steps_us = {"slax/ptx": 262.144, "jax": 1048.576, "jax/flat": 2000.0, "jax-f32": 4194.304}
    rows = [
        {"network": name, "sizes": sizes, "width": sizes[1], "hidden_layers": len(sizes) - 2}
        | {"dtype": dtype, "batch": 1 << 20, "devices": None, "model": model, "step_us": us}
        for name, sizes in (("wide-32-64x2-16", [32, 64, 64, 16]), ("wide-32-128x2-16", [32, 128, 128, 16]))
        for dtype in ("float32", "float16")
        for model, us in steps_us.items()
    ]
    lines = _benchmark_table().wide_tables({"rows": rows})
    headings = [line for line in lines if line.startswith("**")]
    assert headings == [
        "**Width 64, float16**",
        "**Width 64, float32**",
        "**Width 128, float16**",
        "**Width 128, float32**",
    ]
    assert lines[2].startswith("| architecture | batch | devices | plain JAX M samples/s | jax-f32")
    assert lines[4] == "| 32-64-64-16 | 2^20 | 1 | 1e+03 | 250 | 4e+03 (4.00x) |"


@pytest.mark.slow
def test_benchmark_runs(tmp_path):
    result = run_python(
        "experiments/benchmark.py",
        "--batch",
        "64",
        "--steps",
        "3",
        "--unroll",
        "2",
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
        for model in (f"slax/{slax.launch_route()}", "jax", "jax/flat", "jax-f32")
    ]
    # slax trains its flat parameter vector; plain JAX both ways, each ratio to its faster form.
    assert [r["flat_parameters"] for r in rows[:4]] == [True, False, True, False]
    assert max(r["speedup_vs_jax"] for r in rows[1:3]) == pytest.approx(1.0)
    assert {r["unroll"] for r in rows} == {2}  # 3 steps, 2 per loop iteration: a remainder too
    polynomial = rows[0]
    # 4 -> 16 -> 4 at batch 64: 6*64*(64+64) - 2*64*64 FLOPs; inputs and targets written and read,
    # 2*64*(4+4)*4 bytes; at 1 TFLOP/s and 10 GB/s the bytes bound: 0.4096 us.
    assert (polynomial["flops"], polynomial["bytes"]) == (40960, 4096)
    assert polynomial["floor_us"] == pytest.approx(0.4096)
    assert polynomial["times_floor"] == pytest.approx(polynomial["step_us"] / 0.4096)
    assert all(r["steps_per_s"] > 0 for r in rows)


@pytest.mark.slow
def test_benchmark_times_the_texture_fit_against_plain_jax(tmp_path):
    """``--network texture``: slax's row and plain JAX's one row (no float16 rows: the sampler
    reads float4), the floor from the batch and Adam's pass over the 512x512 RGBA texture."""
    arguments = ["--network", "texture", "--batch", "256", "--dtype", "float32", "float16", "--steps", "2"]
    arguments += [
        "--repeats",
        "1",
        "--peak-tflops",
        "1",
        "--peak-gbps",
        "10",
        "--json",
        str(tmp_path / "b.json"),
    ]
    assert benchmark.main(arguments) == 0
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [(r["network"], r["dtype"], r["model"]) for r in rows] == [
        ("texture", "float32", f"slax/{slax.launch_route()}"),
        ("texture", "float32", "jax"),
    ]
    assert rows[1]["speedup_vs_jax"] == pytest.approx(1.0)
    assert (rows[0]["flops"], rows[0]["bytes"]) == (0, 2 * 256 * 6 * 4 + 7 * 512 * 512 * 4 * 4)
    assert all(r["steps_per_s"] > 0 for r in rows)


def _soak(tmp_path, *flags):
    return run_python(
        "experiments/soak.py", "--batch", "256", "--json", str(tmp_path / "soak.json"), *flags, timeout=600
    )


@pytest.mark.slow
@pytest.mark.whole_device
def test_soak_reads_memory_after_every_chunk(device_kind, tmp_path):
    result = _soak(tmp_path, "--steps", "2000", "--chunk", "500")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "soak.json").read_text())
    assert [r["step"] for r in report["readings"]] == [0, 500, 1000, 1500, 2000]
    # On the CPU path only host memory has a reading (lavapipe's device memory is host memory, and
    # the CPU device's kernels run on XLA's buffers); on
    # CUDA also XLA's bytes in use and the driver's count of the whole GPU's memory.
    if device_kind == "cuda":
        assert set(report["growth_mb"]) == {"host_rss_mb", "jax_device_mb", "cuda_used_mb"}
    else:
        assert set(report["growth_mb"]) == {"host_rss_mb"}
    assert all(growth < 16 for growth in report["growth_mb"].values()) and report["finite"]
    assert report["readings"][-1]["loss"] < report["readings"][0]["loss"]


@pytest.mark.slow
def test_soak_fails_on_growth_over_the_limit(tmp_path):
    """A limit below any possible reading makes the run fail: the check is live."""
    result = _soak(tmp_path, "--steps", "100", "--chunk", "100", "--max-growth-mb=-1e6")
    assert result.returncode == 1 and "FAIL: grew more than" in result.stdout, result.stdout + result.stderr


def _metrics(directory, devices, slax_mse, batch=1024):
    directory.mkdir()
    config = {"batch": batch, "devices": devices, "out": str(directory), "launch": "ptx"}
    metrics = {"config": config, "slax": {"test_mse": slax_mse}, "jax": {"test_mse": 0.5}}
    (directory / "metrics.json").write_text(json.dumps(metrics))
    return str(directory)


def test_compare_devices_holds_each_split_run_to_its_one_device_run(tmp_path):
    """Runs are grouped by their flags but --devices (and --out); within a group slax's result on
    several devices must be the one-device result to --tolerance, relative; a group without a
    one-device run is a failure, not a pass."""
    one = _metrics(tmp_path / "one", 1, 0.2)
    same = _metrics(tmp_path / "same", 2, 0.2 * (1 + 5e-5))
    result = run_python("experiments/compare_devices.py", one, same, "--tolerance", "1e-4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "same" in result.stdout and "5e-05" in result.stdout
    off = _metrics(tmp_path / "off", 2, 0.2 * (1 + 5e-4))
    alone = _metrics(tmp_path / "alone", 2, 0.2, batch=2048)
    result = run_python("experiments/compare_devices.py", one, off, alone, "--tolerance", "1e-4")
    assert result.returncode == 1
    assert f"FAILED: {off}: test_mse differs by 0.0005 (relative)" in result.stdout
    assert f"FAILED: {alone}: no one-device run to compare with" in result.stdout


def test_benchmark_table_shows_each_models_median_over_the_rounds():
    """scripts/benchmark_table.py: a run timed in several rounds (``--rounds``) is shown as each
    model's median step, and slax's ratio to the faster plain-JAX median."""
    table = _benchmark_table()
    times = {"slax/host-pointer": [400.0, 100.0, 300.0], "jax": [50.0, 90.0, 60.0], "jax/flat": [80.0] * 3}
    rows = [
        {
            "network": "digits",
            "dtype": "float32",
            "batch": 128,
            "devices": None,
            "model": model,
            "step_us": us,
        }
        for model, steps in times.items()
        for us in steps
    ]
    lines = table.training_table({"rows": rows})
    assert lines[2] == "| digits | float32 | 2^7 | 1 | 60.0 | 300.0 (0.20x) |"


def _benchmark_table():
    """scripts/benchmark_table.py as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("benchmark_table", ROOT / "scripts" / "benchmark_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    return table
