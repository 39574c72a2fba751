"""A kernel's PTX, compiled in a child process under a time limit.

Slang's compiler can run for many minutes, or without end, on some kernels: with Slang 2026.12,
its IR specialisation (``SpecializationContext``) runs for more than four minutes, with no end
seen, on the backward derivative of a differentiable function that loops over ``IDiffTensor``
reads (``linear_layer`` of shaders/slangpy_examples.slang), for CUDA and C++ targets alike. A call
into Slang's C API cannot be interrupted in-process, so the PTX route compiles in a child process
that is killed after ``SLAX_PTX_COMPILE_TIMEOUT`` seconds (default 120; a kernel's PTX normally
takes a few), and :mod:`slax._ptx_launch` refuses the kernel (:class:`PtxCompileTimeout`), which
then runs on the SlangPy route.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slax._compile import KernelSpec

TIMEOUT_ENV_VAR = "SLAX_PTX_COMPILE_TIMEOUT"
DEFAULT_TIMEOUT_S = 120.0


class PtxCompileTimeout(Exception):
    """Slang did not compile a kernel to PTX within the time limit."""


def timeout_s() -> float:
    """The time limit, from ``SLAX_PTX_COMPILE_TIMEOUT`` (seconds, > 0)."""
    value = os.environ.get(TIMEOUT_ENV_VAR) or str(DEFAULT_TIMEOUT_S)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"slax: {TIMEOUT_ENV_VAR} must be a number of seconds above 0; got {value!r}.")
    return seconds


def compile_ptx(spec: KernelSpec, snapshot: str | None) -> str:
    """``spec``'s PTX (:func:`slax._slang_c.compile_entry_point`), from a child process.

    Raises:
      PtxCompileTimeout: the child ran past :func:`timeout_s` and was killed.
      SlangCompileError, NvrtcNotFoundError: as the compile raises them, from the child.
    """
    limit = timeout_s()
    package_root = str(pathlib.Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="slax-ptx-") as directory:
        request, answer = os.path.join(directory, "request"), os.path.join(directory, "answer")
        with open(request, "wb") as file:
            pickle.dump((spec, snapshot), file)
        command = [sys.executable, "-c", "import slax._ptx_compile as c; c._child()", request, answer]
        try:
            done = subprocess.run(command, env=env, capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise PtxCompileTimeout(
                f"slax: Slang did not compile kernel {spec.entry!r} to PTX for the CUDA PTX route "
                f"within {limit:g} s ({TIMEOUT_ENV_VAR}); SLAX_CUDA_LAUNCH=slangpy (or "
                "slax.config.cuda_launch = 'slangpy') runs its kernels on the SlangPy route without "
                "the wait."
            ) from None
        if not os.path.exists(answer):
            raise RuntimeError(
                f"slax: the process compiling kernel {spec.entry!r} to PTX exited with status "
                f"{done.returncode}:\n{done.stderr.decode(errors='replace')[-3000:]}"
            )
        with open(answer, "rb") as file:
            ok, value = pickle.load(file)
    if not ok:
        raise value
    return value


def _child() -> None:
    from slax._slang_c import CodeTarget, compile_entry_point

    request, answer = sys.argv[1:3]
    with open(request, "rb") as file:
        spec, snapshot = pickle.load(file)
    try:
        result: tuple[bool, object] = (True, compile_entry_point(spec, CodeTarget.PTX, snapshot))
    except Exception as error:  # handed to the parent, which raises it
        result = (False, error)
    with open(answer, "wb") as file:
        pickle.dump(result, file)
