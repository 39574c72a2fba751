"""What several test files share: where the repository is, and running Python in a fresh process."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Mapping

ROOT = pathlib.Path(__file__).resolve().parent.parent
"""The repository's root: experiments/, tests/scripts/ and shaders/ are under it."""


def run_python(
    *arguments: str, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python *arguments`` in a fresh process from the repository root, its output captured as
    text. ``env`` is its whole environment (default: this process's), to which the checkout and
    ``experiments/`` (the scripts' shared modules) are added in front of the import path."""
    env = dict(os.environ if env is None else env)
    paths = [str(ROOT), str(ROOT / "experiments"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    return subprocess.run(
        [sys.executable, *arguments], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
