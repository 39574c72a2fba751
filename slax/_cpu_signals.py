"""Signals while a slax kernel runs on SlangPy's CPU device: Vulkan's values for an integer
division by zero instead of a dead process, and a way out of an endless kernel with Ctrl-C, there
and on Vulkan.

On x86-64, C++'s integer ``/`` and ``%`` (which Slang's CPU target writes for Slang's) raise a
hardware fault for a zero divisor and for ``INT_MIN / -1``, and Linux kills the process with
SIGFPE; GPUs and lavapipe return a value. ``_cpu_signals.c`` (beside this file) has a SIGFPE
handler that completes such a division with the values lavapipe gives (signed ``x / 0 = 0``,
``x % 0 = -1``; unsigned ``x / 0 = x % 0 = `` all ones; ``INT_MIN / -1 = INT_MIN``, remainder 0),
and only while the faulting thread runs a slax kernel (:func:`guarded`); any other SIGFPE reaches
the handler installed before it.

A kernel runs in SlangPy's C++ dispatch (on Vulkan, in the driver, while the launching thread
waits for it in C++), and Python raises ``KeyboardInterrupt`` for Ctrl-C only once the dispatch
returns: stopping the kernel midway would mean unwinding SlangPy's and Python's
frames from a signal handler. So while a kernel runs, the library's SIGINT handler says so on
stderr and passes the first Ctrl-C on to Python's handler (``KeyboardInterrupt`` when the kernel
returns); a second one before the kernel returns ends the process, as SIGINT's default action does.

Built once per content with the C++ compiler that builds the kernels, into the cache directory;
a library found damaged there (cut short or garbled) is rebuilt.
Where the CPU is not x86-64 (AArch64 divides by zero without a fault: ``x / 0 = 0``,
``x % 0 = x``) or the system is not Linux, nothing is installed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import subprocess
import sys
from collections.abc import Iterator

from slax._device import cpp_compiler, writable_cache_dir

_SOURCE = pathlib.Path(__file__).with_name("_cpu_signals.c")


def applies() -> bool:
    """Whether the handlers are installed here: Linux on x86-64, where integer division faults."""
    return sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64")


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The handlers' library, built (once per content) and installed; None where it does not apply."""
    if not applies():
        return None
    source = _SOURCE.read_bytes()
    compiler = cpp_compiler()
    if compiler is None:
        raise RuntimeError(
            "slax: SlangPy's CPU device needs a C++ compiler (clang++ or g++); none is on PATH."
        )
    # The layout is in the key: a library built before its digest was appended is not damaged.
    key = hashlib.sha256(source + compiler.encode() + b"; sha256 appended").hexdigest()[:16]
    target = writable_cache_dir("cpu") / f"slax_signals_{key}.so"
    if not _whole(target):
        damaged = target.exists()
        _build(compiler, target)
        if damaged:
            print(
                f"slax: the CPU device's compiled signal handlers {target} is damaged (not the "
                "library as built: cut short or garbled); rebuilt it.",
                file=sys.stderr,
            )
    # RTLD_GLOBAL: a kernel's worker threads find slax_kernel_enter/leave by name (slax/_cpu_dispatch.h).
    library = ctypes.CDLL(str(target), use_errno=True, mode=ctypes.RTLD_GLOBAL)
    if library.slax_install_division_handler() != 0:
        raise OSError(ctypes.get_errno(), "slax: sigaction(SIGFPE) failed installing the division handler")
    if library.slax_install_interrupt_handler() != 0:
        raise OSError(ctypes.get_errno(), "slax: sigaction(SIGINT) failed installing the interrupt handler")
    return library


def interruptible() -> bool:
    """Whether a wait for a kernel that runs elsewhere can be made interruptible here
    (:func:`waiting`): where the handlers apply and a C++ compiler builds them. A Vulkan device
    needs no compiler; without one, Ctrl-C waits for the kernel there."""
    return applies() and cpp_compiler() is not None


_DIGEST_SIZE = 32
"""The library as built ends in the SHA-256 of the bytes before it (the dynamic loader ignores
bytes past what the ELF headers describe)."""


def _whole(library: pathlib.Path) -> bool:
    """Whether ``library`` is whole as :func:`_build` wrote it: a file cut short fails to load in
    every later process, or, cut inside a segment, kills the process with SIGBUS when loaded."""
    try:
        content = library.read_bytes()
    except FileNotFoundError:
        return False
    body, digest = content[:-_DIGEST_SIZE], content[-_DIGEST_SIZE:]
    return len(content) > _DIGEST_SIZE and hashlib.sha256(body).digest() == digest


def _build(compiler: str, target: pathlib.Path) -> None:
    """Builds the library into a file of this process's, appends its digest, and renames it to
    ``target``: another process (a pytest-xdist worker building it at the same time) sees a whole
    library or none."""
    partial = target.with_suffix(f".{os.getpid()}.partial")
    command = [compiler, "-x", "c", "-O2", "-shared", "-fPIC", str(_SOURCE), "-o", str(partial)]
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0:
        raise RuntimeError(
            f"slax: building the CPU device's signal handlers failed ({' '.join(command)}):\n{built.stderr}"
        )
    with partial.open("ab") as library:
        library.write(hashlib.sha256(partial.read_bytes()).digest())
    os.replace(partial, target)


def install() -> None:
    """Installs the handlers in this process (once); call before the first CPU-device launch."""
    _library()


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """While inside, an integer division fault on this thread completes with Vulkan's values, and
    a SIGINT is a kernel's (first: noted, then ``KeyboardInterrupt``; second: the process ends)."""
    library = _library()
    if library is None:
        yield
        return
    library.slax_kernel_enter()
    try:
        yield
    finally:
        library.slax_kernel_leave()


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """While inside, this thread waits for a kernel that runs elsewhere (Vulkan's driver threads):
    a SIGINT is a kernel's, as in :func:`guarded`; a division fault on this thread is not. Nothing
    where no C++ compiler builds the handlers (:func:`interruptible`)."""
    library = _library() if interruptible() else None
    if library is None:
        yield
        return
    library.slax_wait_enter()
    try:
        yield
    finally:
        library.slax_wait_leave()
