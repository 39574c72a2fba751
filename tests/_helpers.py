"""What several test files share: where the repository is, and running Python in a fresh process."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Mapping

ROOT = pathlib.Path(__file__).resolve().parent.parent
"""The repository's root: experiments/, tests/scripts/ and shaders/ are under it."""


def python_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the checkout and ``experiments/`` (the
    scripts' shared modules) in front of the import path: a fresh process imports the slax under
    test, not whichever one its environment has installed."""
    env = dict(os.environ if env is None else env)
    paths = [str(ROOT), str(ROOT / "experiments"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    return env


def run_python(
    *arguments: str, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python *arguments`` in a fresh process from the repository root (:func:`python_env`), its
    output captured as text."""
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=ROOT,
        env=python_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
