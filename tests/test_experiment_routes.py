"""What the experiments say and record about where their kernels run (experiments/_harness.py), on
every route: the header and metrics.json name the SlangPy device and launch route that ran, no CUDA
launch route where no CUDA is involved, and a CPU route says what CPU routes are for. Also: the
scripts parse their flags before importing JAX or slax, so ``--help`` answers at once."""

from __future__ import annotations

import json

import _harness as harness
import benchmark
import digits
import gradcheck
import polynomial
import pytest
import sdf
from _helpers import ROOT, run_python

import slax
from slax import examples
from slax.testing import compare

ROUTES = {"cpu": "host-pointer", "vulkan": "host-copy"}
"""The launch route of each CPU device kind."""


def test_run_header_and_metrics_name_the_device_and_route_that_ran(
    device_kind, tmp_path, capsys, monkeypatch
):
    """Given ``--launch ptx`` (as a user might copy from a GPU command), a CPU run records and
    prints no CUDA launch route, but its device and route, and says what CPU routes are for."""
    monkeypatch.setattr(slax.config, "cuda_launch", slax.config.cuda_launch)  # restored after
    args = polynomial.parse_arguments(["--launch", "ptx", "--out", str(tmp_path)])
    out, device = harness.prepare_run("polynomial", args)
    printed = capsys.readouterr().out
    assert device["route"] == slax.launch_route() and device["slang"].startswith(device_kind)
    assert device["slang"].endswith(f", {device['route']} route")
    assert (
        f"polynomial: JAX on {device['jax']}, Slang kernels on {device['slang']}; writing to {out}" in printed
    )
    config = harness.run_config(args)
    if device_kind == "cuda":
        assert device["route"] == config["launch"] == "ptx"
        assert harness.CPU_ROUTE_NOTE not in printed
        return
    assert device["route"] == ROUTES[device_kind]
    assert config["launch"] is None  # no CUDA launch route where no CUDA runs
    assert "ptx" not in json.dumps(device) and "--launch ptx is ignored" in printed
    assert f"polynomial: {harness.CPU_ROUTE_NOTE}" in printed
    assert (
        "development and correctness" in harness.CPU_ROUTE_NOTE and "BENCHMARKS.md" in harness.CPU_ROUTE_NOTE
    )


def test_benchmark_names_every_cpu_device_it_times(device_kind):
    if device_kind == "cuda":
        pytest.skip("the CPU devices of CPU-placed JAX")
    cpu = f"cpu ({slax._device.get_device(slax.DeviceKind.CPU).info.adapter_name}), host-pointer route"
    chosen = f"{slax.describe_device()}, {ROUTES[device_kind]} route"  # the fixture's kind
    assert harness.slang_devices() == chosen
    assert harness.slang_devices(["cpu", device_kind]) == f"{cpu}; {chosen}"
    assert (
        benchmark.route_of("cpu") == "host-pointer" and benchmark.route_of(device_kind) == ROUTES[device_kind]
    )


@pytest.mark.one_device_kind
def test_flags_parsed_before_slax_is_imported_match_slax():
    """The scripts parse flags before importing slax: the copies of slax's choices they use agree."""
    assert harness.CUDA_LAUNCHES == slax.config.CUDA_LAUNCHES
    assert harness.MLP_BACKENDS == slax._config.MLP_BACKENDS
    assert harness.NETWORKS == {"polynomial": polynomial.SIZES, "digits": digits.SIZES, "sdf": sdf.SIZES}
    functions = [example.name for example in (*examples.EXAMPLES, *examples.TENSOR_EXAMPLES)]
    assert sorted(gradcheck.FUNCTIONS) == sorted([*functions, "polynomial"])


SCRIPTS = sorted(path.name for path in (ROOT / "experiments").glob("*.py") if not path.name.startswith("_"))

_HELP_THEN_LIST_MODULES = """
import runpy, sys
sys.argv = [{script!r}, "--help"]
try:
    runpy.run_path({path!r}, run_name="__main__")
except SystemExit as exit:
    status = exit.code
heavy = [name for name in ("jax", "slax", "slangpy", "matplotlib", "optax") if name in sys.modules]
print("exit", status, "imported", heavy)
"""


@pytest.mark.one_device_kind
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_answers_before_jax_or_slax_is_imported(script):
    """``--help`` takes well under a second: the flags are parsed before the imports that take
    seconds (JAX, slax and SlangPy, matplotlib)."""
    path = str(ROOT / "experiments" / script)
    result = run_python("-c", _HELP_THEN_LIST_MODULES.format(script=script, path=path), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
    assert result.stdout.splitlines()[-1] == "exit 0 imported []"


@pytest.mark.one_device_kind
def test_gradcheck_table_lines_are_the_file_lines():
    """gradcheck prints each row as its check finishes, in the fixed-width format of its table file."""
    row = compare("rev", "x", 1.0, 1.0, 1e-5)
    line = gradcheck.row_line("polynomial", "float32", row)
    header = gradcheck.table_line(name for name, _ in gradcheck.COLUMNS)
    assert line.split() == ["polynomial", "float32", "rev", "x", "0.00e+00", "0.00e+00", "1.0e-05", "yes"]
    assert line.index("float32") == header.index("dtype") and line.index("yes") == header.index("pass")
