"""A kernel's PTX, compiled in a child process under a time limit.

Slang's compiler can run for many minutes, or without end, on some kernels: with Slang 2026.12,
its IR specialisation (``SpecializationContext``) runs for more than four minutes, with no end
seen, on the backward derivative of a differentiable function that loops over ``IDiffTensor``
reads (``linear_layer`` of shaders/slangpy_examples.slang), for CUDA and C++ targets alike. A call
into Slang's C API cannot be interrupted in-process, so the PTX route compiles in a child process
that is killed after ``SLAX_PTX_COMPILE_TIMEOUT`` seconds (default 120; a kernel's PTX normally
takes a few), and :mod:`slax._ptx_launch` refuses the kernel (:class:`PtxCompileTimeout`), which
then runs on the SlangPy route. The child is a worker that lives across compiles (:class:`_Worker`):
a new one starts only after one was killed, or in a forked process.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import os
import pathlib
import pickle
import select
import subprocess
import sys
import tempfile
import threading

import slangpy as spy

from slax._compile import KernelSpec, announced
from slax._device import cache_dir
from slax._slang_c import CodeTarget, compile_arguments, nvrtc_version, required_nvrtc_library
from slax._sources import write_atomically

TIMEOUT_ENV_VAR = "SLAX_PTX_COMPILE_TIMEOUT"
DEFAULT_TIMEOUT_S = 120.0
COMPILE_ENVIRONMENT = ("SLAX_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "SLAX_NVRTC", "CUDA_HOME", "CUDA_PATH")
"""The variables a compile reads: where the cache is, whose ``sources`` of
``slax.load_module_from_source`` are on the include path (:func:`slax._device.cache_dir`,
:func:`slax._device.include_paths`), and where NVRTC is (:func:`slax._slang_c.nvrtc_library`, whose
path each compile passes to Slang). Each request carries the parent's values as they are then,
since the worker outlives changes to its parent's environment (a program, or a test, pointing
``SLAX_CACHE_DIR`` elsewhere after the first compile); ``SLAX_CACHE_DIR`` is the cache directory
as the parent resolved it (:func:`slax._device.cache_dir`), since the worker keeps the working
directory it started in."""


class PtxCompileTimeout(Exception):
    """Slang did not compile a kernel to PTX within the time limit."""


def timeout_s() -> float:
    """The time limit, from ``SLAX_PTX_COMPILE_TIMEOUT`` (seconds, finite and > 0: the wait for the
    worker's answer takes no endless limit)."""
    value = os.environ.get(TIMEOUT_ENV_VAR) or str(DEFAULT_TIMEOUT_S)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(
            f"slax: {TIMEOUT_ENV_VAR} must be a finite number of seconds above 0; got {value!r}."
        )
    return seconds


def compile_ptx(
    spec: KernelSpec, content: str, snapshot: str | None, defines: dict[str, str] | None = None
) -> str:
    """``spec``'s PTX (:func:`slax._slang_c.compile_entry_point`, with the preprocessor macros
    ``defines``), ``content`` being the content key of its Slang code (:mod:`slax._sources`): from
    the PTX cache where it holds it (:func:`cached_ptx_path`), else from the compile worker, which
    compiles with this process's :data:`COMPILE_ENVIRONMENT` as it is now, and then kept there.

    Raises:
      PtxCompileTimeout: the worker ran past :func:`timeout_s` on it and was killed.
      SlangCompileError, NvrtcNotFoundError: as the compile raises them, from the worker.
    """
    path = cached_ptx_path(spec, content, defines)
    try:
        return path.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    limit = timeout_s()
    environment = {name: os.environ.get(name) for name in COMPILE_ENVIRONMENT}
    environment["SLAX_CACHE_DIR"] = str(cache_dir())  # as resolved here: the worker's cwd is its own
    with announced(f"entry point {spec.entry!r} to PTX"):
        ptx = _ask_worker(spec, (spec, snapshot, defines, environment), limit)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, ptx.encode())
    except OSError:  # a cache that cannot be written costs the next process a compile, nothing more
        pass
    return ptx


def cached_ptx_path(spec: KernelSpec, content: str, defines: dict[str, str] | None) -> pathlib.Path:
    """Where the PTX cache keeps ``spec``'s PTX: ``SLAX_CACHE_DIR/ptx/<key>.ptx``. The key digests
    all the PTX depends on: the content key of the Slang code (every file it reads, so an edit to an
    import is a new key), the entry point and generated source, Slang's options and macros, and the
    versions of Slang (SlangPy's) and of NVRTC. Compiling to PTX takes seconds a kernel (a minute
    and more for a program of many kernels), paid once, not in every process; the file is written
    whole or not at all (:func:`slax._sources.write_atomically`), so a reader never sees a part."""
    nvrtc = required_nvrtc_library()
    version = _nvrtc_versions.get(nvrtc)
    if version is None:
        version = _nvrtc_versions.setdefault(nvrtc, nvrtc_version(nvrtc))
    options = compile_arguments(CodeTarget.PTX, defines, "nvrtc-{}.{}".format(*version))
    key = hashlib.sha256(
        repr((content, spec.entry, spec.path, spec.source, options, spy.__version__)).encode()
    ).hexdigest()
    return cache_dir() / "ptx" / f"{key}.ptx"


_nvrtc_versions: dict[str, tuple[int, int]] = {}


def _ask_worker(spec: KernelSpec, request: tuple, limit: float) -> str:
    """The worker's PTX for ``request`` (a worker started if none runs), or the compile's own
    error, raised here as the worker raised it; past ``limit`` seconds the worker is killed and
    PtxCompileTimeout raised, and a worker that died is reported with its error output."""
    with _lock:
        global _worker
        if _worker is None or _worker.poll() is not None:
            _worker = _Worker()
        worker = _worker
        try:
            ok, value = worker.ask(request, limit)
        except subprocess.TimeoutExpired:
            worker.close(kill=True)
            _worker = None
            raise PtxCompileTimeout(
                f"slax: Slang did not compile kernel {spec.entry!r} to PTX for the CUDA PTX route "
                f"within {limit:g} s ({TIMEOUT_ENV_VAR}); SLAX_CUDA_LAUNCH=slangpy (or "
                "slax.config.cuda_launch = 'slangpy') runs its kernels on the SlangPy route without "
                "the wait."
            ) from None
        except EOFError:
            status, errors = worker.close(kill=True), worker.errors()
            _worker = None
            raise RuntimeError(
                f"slax: the process compiling kernel {spec.entry!r} to PTX exited with status "
                f"{status}:\n{errors[-3000:]}"
            ) from None
    if not ok:
        raise value
    return value


class _Worker:
    """A child process that compiles kernels to PTX one request after another: it pays Python's
    and slax's start-up (1-2 s) once, not per kernel. Requests and answers are pickles on its
    stdin and on a copy of its stdout (its own stdout goes to its stderr, so that nothing a
    compiler prints mixes with the answers); its stderr goes to a file, read when it dies."""

    def __init__(self):
        package_root = str(pathlib.Path(__file__).resolve().parent.parent)
        path = os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])
        self._stderr = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [sys.executable, "-c", "import slax._ptx_compile as c; c._serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, "PYTHONPATH": path},
        )

    def poll(self) -> int | None:
        return self._process.poll()

    def ask(self, request, limit: float):
        """The answer to ``request``, or TimeoutExpired past ``limit`` seconds, or EOFError where
        the worker died."""
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None and stdout is not None
        try:
            pickle.dump(request, stdin)
            stdin.flush()
        except BrokenPipeError:
            raise EOFError from None
        ready, _, _ = select.select([stdout], [], [], limit)
        if not ready:
            raise subprocess.TimeoutExpired("slax PTX compile worker", limit)
        return pickle.load(stdout)

    def close(self, kill: bool = False) -> int | None:
        """Ends the worker (killed, or at the end of its requests), and returns its exit status."""
        if kill:
            self._process.kill()
        elif self._process.stdin is not None:
            self._process.stdin.close()
        try:
            return self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            return self._process.wait()

    def errors(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")


_worker: _Worker | None = None
_lock = threading.Lock()
"""One compile at a time in the worker; threads that compile kernels wait for each other."""


def worker_pid() -> int | None:
    """The compile worker's process id while one runs, else None: its CPU time is part of what a
    first call costs on the PTX route (tests/_helpers.py's ``compute_seconds``)."""
    worker = _worker
    return worker._process.pid if worker is not None and worker.poll() is None else None


def _close_worker() -> None:
    if _worker is not None:
        _worker.close()


def _forget_worker_in_child() -> None:
    """A forked process starts its own worker: its parent's pipes are its parent's."""
    global _worker, _lock
    _worker, _lock = None, threading.Lock()


atexit.register(_close_worker)
os.register_at_fork(after_in_child=_forget_worker_in_child)


def _serve() -> None:
    """The worker's loop: a request from stdin, its answer to the answers' stream, until stdin ends."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the compiler prints goes to stderr, not into the answers
    from slax._slang_c import CodeTarget, compile_entry_point

    while True:
        try:
            spec, snapshot, defines, environment = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        for name, value in environment.items():  # the parent's, as it compiles now
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        try:
            result: tuple[bool, object] = (True, compile_entry_point(spec, CodeTarget.PTX, snapshot, defines))
        except Exception as error:  # handed to the parent, which raises it
            result = (False, error)
        pickle.dump(result, answers)
        answers.flush()
