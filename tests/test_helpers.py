"""The tests' own shared machinery (tests/_helpers.py) where a mistake in it would hide: a thing
made once per run (:func:`_helpers.once_per_run`) that each pytest-xdist worker made again would
still pass every test that reads it, only slower."""

from __future__ import annotations

import os

import pytest
from _helpers import path_with_tests, run_python

# Runs pytest (and under xdist two workers) in subprocesses, whatever the device: a few seconds each.
pytestmark = pytest.mark.one_device_kind

MADE_ONCE = """
import os
import pathlib

import pytest
from _helpers import once_per_run

LOG = pathlib.Path(os.environ["ONCE_LOG"])


def make() -> str:
    with LOG.open("a") as log:
        log.write("made\\n")
    return f"made by {os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


@pytest.mark.parametrize("k", range(8))
def test_reads(k, request):
    text = once_per_run(request, "thing.txt", make)
    with LOG.open("a") as log:
        log.write(f"read {os.environ.get('PYTEST_XDIST_WORKER', 'main')} {text}\\n")
"""


def _environment_without_pytests() -> dict[str, str]:
    """This process's environment less pytest's own variables (PYTEST_ADDOPTS, an xdist worker's
    PYTEST_XDIST_WORKER, ...), which would change the child run's plugins and workers."""
    return {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}


@pytest.mark.parametrize(
    "workers",
    [
        pytest.param(["-n", "2"], id="two-workers", marks=pytest.mark.slow),
        pytest.param(["-p", "no:xdist"], id="no-xdist"),
    ],
)
def test_once_per_run_makes_its_thing_once_for_all_workers(tmp_path, workers):
    """Eight tests of one run ask for the thing, spread over two xdist workers (each gets at least
    two of them) or in one process: it is made once, and every test reads what was made."""
    (tmp_path / "test_made_once.py").write_text(MADE_ONCE)
    log = tmp_path / "log.txt"
    result = run_python(
        "-m", "pytest", "-p", "no:cacheprovider", "-q", *workers,
        f"--basetemp={tmp_path / 'base'}", str(tmp_path / "test_made_once.py"),
        env={**_environment_without_pytests(), "ONCE_LOG": str(log), "PYTHONPATH": path_with_tests()},
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = log.read_text().splitlines()
    assert lines.count("made") == 1, lines
    reads = [line.split(" ", 2) for line in lines if line.startswith("read")]
    assert len(reads) == 8
    assert len({text for _, _, text in reads}) == 1, reads
    if workers[0] == "-n":
        assert {worker for _, worker, _ in reads} == {"gw0", "gw1"}, reads
