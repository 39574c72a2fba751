"""tests/conftest.py's hooks, in a pytest run of their own: a pytest-xdist worker ends quietly."""

from __future__ import annotations

import os
import types

import pytest
from _helpers import ROOT, path_with_tests, run_python

pytestmark = pytest.mark.one_device_kind

ASKED_TO_HURRY = """
import gc
import os
import types
import signal

import pytest


def interrupt_during_gc():
    # What execnet does to a pytest-xdist worker still ending 5 s after the controller asked it to
    # exit (execnet/gateway_base.py, _terminate_execution): a SIGINT, here while gc runs, as when
    # it lands in the gc of a big heap.
    def interrupt(phase, info):
        gc.callbacks.remove(interrupt)
        os.kill(os.getpid(), signal.SIGINT)

    gc.callbacks.append(interrupt)
    gc.collect()


@pytest.mark.one_device_kind
def test_worker_is_asked_to_hurry(request):
    request.config.add_cleanup(interrupt_during_gc)
"""


@pytest.mark.slow
def test_a_worker_asked_to_hurry_at_its_end_raises_no_keyboard_interrupt(tmp_path):
    """A worker whose end outlasts execnet's 5 s gets a SIGINT, which raised KeyboardInterrupt
    wherever the worker was, often in JAX's gc callback: a ``PytestUnraisableExceptionWarning``
    after a green run, when every test has reported."""
    test_file = tmp_path / "test_asked_to_hurry.py"
    test_file.write_text(ASKED_TO_HURRY)
    env = {**os.environ, "PYTHONPATH": path_with_tests()}
    result = run_python(
        "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
        "--rootdir", str(ROOT), "-n", "1", "-q", str(test_file), env=env, timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "1 passed" in output, output[-3000:]
    assert "KeyboardInterrupt" not in output, output[-3000:]


class _Case:
    """A stand-in for a collected test item: its function and its parameters (hashable by identity,
    as pytest's items are)."""

    def __init__(self, function, kind, **params):
        self.function = function
        self.callspec = types.SimpleNamespace(params={"device_kind": kind, **params})


def test_a_sweeps_sample_takes_every_value_once_per_route():
    """``_route_sample``: the diagonal of a whole product (three sizes, three batches, two dtypes:
    three cases), per test and per device kind; where the cases are not the whole product, the
    diagonal's cases that exist, then the first case of each value they missed."""
    from conftest import _route_sample

    def sweep():
        pass

    product = [
        _Case(sweep, kind, sizes=s, batch=b, dtype=d)
        for kind in ("cpu", "vulkan")
        for s in ("a", "b", "c")
        for b in (1, 31, 1000)
        for d in ("float32", "float16")
    ]
    sampled = _route_sample(product)
    for kind in ("cpu", "vulkan"):
        cases = [item.callspec.params for item in sampled if item.callspec.params["device_kind"] == kind]
        assert len(cases) == 3
        assert {case["sizes"] for case in cases} == {"a", "b", "c"}
        assert {case["batch"] for case in cases} == {1, 31, 1000}
        assert {case["dtype"] for case in cases} == {"float32", "float16"}
    listed = [_Case(sweep, "vulkan", pair=p, dtype=d) for p, d in (("x", "f32"), ("y", "f32"), ("z", "f16"))]
    # the diagonal (x, f32), (y, f16), (z, f32) holds only the first; y and z come from their first cases
    assert _route_sample(listed) == set(listed)
    listed = [_Case(sweep, "vulkan", pair=p, dtype=d) for p, d in (("x", "f32"), ("y", "f32"), ("y", "f16"))]
    assert _route_sample(listed) == {listed[0], listed[2]}  # the diagonal (x, f32), (y, f16)


SWEEP_WITH_ONE_ROUTE_PARAMETER = """
import pytest


@pytest.mark.sweep
@pytest.mark.parametrize("pair", ["x", "y", "z"])
@pytest.mark.parametrize("sizes", ["narrow", pytest.param("wide", marks=pytest.mark.one_device_kind)])
def test_sweep(sizes, pair):
    pass
"""


def test_a_sweeps_sample_is_drawn_from_the_cases_that_run_on_the_route(tmp_path):
    """A sweep whose ``wide`` parameter runs on the first kind alone samples the other kind from its
    ``narrow`` cases: every pair there. The diagonal of the whole product, (narrow, x), (wide, y),
    (narrow, z), would leave y to a case that kind does not run."""
    from conftest import _device_kinds

    kinds = _device_kinds()
    if len(kinds) < 2:
        pytest.skip(f"needs two device kinds; this machine has {kinds}")
    test_file = tmp_path / "test_sweep_with_one_route_parameter.py"
    test_file.write_text(SWEEP_WITH_ONE_ROUTE_PARAMETER)
    env = {**os.environ, "PYTHONPATH": path_with_tests(), "SLAX_TEST_DEVICES": ",".join(kinds[:2])}
    result = run_python(
        "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
        "--rootdir", str(ROOT), "-n", "0", "-q", "--collect-only", str(test_file), env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    collected = [
        line.split("[")[1].rstrip("]") for line in result.stdout.splitlines() if "::test_sweep[" in line
    ]
    second = kinds[1]
    assert sorted(case for case in collected if case.startswith(second)) == [
        f"{second}-narrow-{pair}" for pair in ("x", "y", "z")
    ], collected
    assert len([case for case in collected if case.startswith(kinds[0])]) == 6, collected


QUICK_CASES = """
import pytest


@pytest.mark.parametrize("size", [1, pytest.param(2, marks=pytest.mark.one_device_kind), 3])
def test_representatives(size):
    pass


@pytest.mark.parametrize("size", [pytest.param(1, marks=pytest.mark.one_device_kind), 2])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_all_on_one_kind_but_one(size, dtype):
    pass


@pytest.mark.one_device_kind
@pytest.mark.parametrize("size", [1, 2])
def test_wholly_on_one_kind(size):
    pass


@pytest.mark.quick_sample
@pytest.mark.parametrize("size", ["a", "b", "c"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_product(size, dtype):
    pass


@pytest.mark.slow
def test_slow():
    pass
"""


@pytest.mark.slow
def test_quick_runs_on_one_kind_what_the_full_run_runs_on_each_further_kind(tmp_path):
    """``--quick``: of a test some of whose parameters are marked ``one_device_kind``, the others; a
    test marked ``one_device_kind`` whole, every case; of a test marked ``quick_sample``, its sample
    (the diagonal of three sizes and two dtypes: three cases); no test marked ``slow``. Without
    ``--quick``, every case."""
    from conftest import _device_kinds

    kind = _device_kinds()[0]
    test_file = tmp_path / "test_quick_cases.py"
    test_file.write_text(QUICK_CASES)
    env = {**os.environ, "PYTHONPATH": path_with_tests(), "SLAX_TEST_DEVICES": kind}

    def collected(*flags):
        result = run_python(
            "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
            "--rootdir", str(ROOT), "-n", "0", "-q", "--collect-only", *flags, str(test_file), env=env,
            timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        return [line.split("::")[1] for line in result.stdout.splitlines() if "::" in line]

    assert len(collected()) == 3 + 4 + 2 + 6 + 1
    quick = collected("--quick")
    assert [case for case in quick if case.startswith("test_representatives")] == [
        f"test_representatives[{kind}-1]",
        f"test_representatives[{kind}-3]",
    ]
    assert sorted(case for case in quick if case.startswith("test_all_on_one_kind_but_one")) == [
        f"test_all_on_one_kind_but_one[{kind}-float16-2]",
        f"test_all_on_one_kind_but_one[{kind}-float32-2]",
    ]
    assert len([case for case in quick if case.startswith("test_wholly_on_one_kind")]) == 2
    product = [case for case in quick if case.startswith("test_product")]
    assert len(product) == 3 and {case.split("-")[1] for case in product} == {"float32", "float16"}
    assert not [case for case in quick if case.startswith("test_slow")]
