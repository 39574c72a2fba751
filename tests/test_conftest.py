"""tests/conftest.py's hooks, in a pytest run of their own: a pytest-xdist worker ends quietly."""

from __future__ import annotations

import os

import pytest
from _helpers import ROOT, run_python

pytestmark = pytest.mark.one_device_kind

ASKED_TO_HURRY = """
import gc
import os
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


def test_a_worker_asked_to_hurry_at_its_end_raises_no_keyboard_interrupt(tmp_path):
    """A worker whose end outlasts execnet's 5 s gets a SIGINT, which raised KeyboardInterrupt
    wherever the worker was, often in JAX's gc callback: a ``PytestUnraisableExceptionWarning``
    after a green run, when every test has reported."""
    test_file = tmp_path / "test_asked_to_hurry.py"
    test_file.write_text(ASKED_TO_HURRY)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    result = run_python(
        "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
        "--rootdir", str(ROOT), "-n", "1", "-q", str(test_file), env=env, timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "1 passed" in output, output[-3000:]
    assert "KeyboardInterrupt" not in output, output[-3000:]
