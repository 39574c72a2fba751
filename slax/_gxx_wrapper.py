"""The ``g++`` slax puts on ``PATH`` while SlangPy builds a CPU kernel: each kernel built once per
cache, and with Slang's C++ prelude precompiled.

Slang's CPU target writes a kernel as one C++ file, which SlangPy's CPU device builds with the
system's g++ in every process that uses it (it keeps no built kernels across processes), and whose
first ~4,300 lines are Slang's prelude (inside the include guard ``SLANG_CPP_PRELUDE_H``): for a
small kernel, three quarters of g++'s time is parsing that prelude again. This wrapper, for a
command that builds such a file:

- takes the kernel from slax's cache where the same C++ was built before with the same flags and
  compiler (keyed by a SHA-256 of the three, the C++ without the ``#line`` directives and blank
  lines that differ between processes: :func:`_without_line_directives`; the file g++ would write,
  copied, checked against its own SHA-256), so that a second process, or a program run again,
  builds nothing;
- else builds it with the prelude precompiled: compiled once per prelude text, flags and compiler
  into a header (``g++ -x c++-header``, the same flags) that the build gets as ``-include``, so that
  g++ loads it and skips the kernel's own copy by its include guard (the same machine code; a small
  kernel's build 0.48 -> 0.24 s on a 2-core machine), and keeps what it built;
- builds it with :data:`KERNEL_FLAGS` ahead of SlangPy's flags, which let g++ inline the small
  functions Slang writes a kernel's body as;
- builds it with each launch's thread groups spread over worker threads (:func:`over_cores`,
  slax/_cpu_dispatch.h), from the C++ as Slang wrote it where that does not build.

Any other command (one that builds no file Slang wrote) runs as it came. Slang runs ``g++`` by
name, found on ``PATH`` at each build, and SlangPy passes it no options of ours:
:func:`builds_through_wrapper` puts this wrapper first on ``PATH`` around a build. The wrapper runs
this file as a script (the standard library only, no slax or JAX to import: it runs once a build).
Files appear whole (written aside, then renamed): builds in other processes never read half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import sys
import threading
from collections.abc import Iterator

FORMAT = "slax-gxx-2"
"""The cache's format, part of every key: a change to what the wrapper keeps or how it builds
changes it, so that no entry of the old format is served."""
KERNEL_FLAGS = ("--param", "max-inline-insns-auto=200")
"""Flags a Slang kernel's build gets ahead of SlangPy's (``-O3`` among them). Slang writes every
function of a kernel as a ``static`` function not declared ``inline``, down to a three-line
``lerp``, and g++ -O3 inlines such a function only where it is at most 30 of its instructions
long (``max-inline-insns-auto``, GCC 12): a kernel then passes its vectors between small
functions through the stack (a ``float4`` as two 8-byte halves read back as one 16-byte load,
which stalls on every call). At 200, the limit g++ keeps for functions declared ``inline``, the
functions a kernel's body calls, derivatives' propagations included, are inlined into it
(BENCHMARKS.md, "The CPU device's kernels inlined, and over the cores")."""
DISPATCH_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cpu_dispatch.h")
"""The C++ that runs a launch's thread groups over the machine's cores (its comment says how and
when), appended to a kernel by :func:`over_cores`."""
_DISPATCH_PARAMETERS = "(ComputeVaryingInput* varyingInput, void* entryPointParams, void* globalParams)"
"""The parameters of the functions Slang exports for a compute entry point that take a range of
thread groups: the entry point's own (the whole launch), and its ``_Group`` (one group)."""
_DISPATCH = re.compile(rf"^SLANG_PRELUDE_EXPORT\nvoid (\w+){re.escape(_DISPATCH_PARAMETERS)}$", re.MULTILINE)
"""The start of such a function, its name the group."""
_SERIAL = ("_slang_atomic", "Interlocked", "__atomic_fetch_", "__atomic_add_fetch")
"""Names in a kernel's C++ (past Slang's prelude) that leave its groups in order: Slang's atomics
(relaxed ones, under g++), whose order between groups would decide a sum's bits."""
PRELUDE_GUARD = "#ifndef SLANG_CPP_PRELUDE_H"
"""The first line of every C++ file Slang's CPU target writes: its prelude's include guard."""


def prelude_text(source: str) -> str | None:
    """The prelude at the start of ``source`` (a C++ file Slang wrote): from its include guard to
    the ``#endif`` that closes it, counting the conditional directives between; None where
    ``source`` does not start with the guard or never closes it."""
    if not source.startswith(PRELUDE_GUARD):
        return None
    depth, end = 0, 0
    for line in source.splitlines(keepends=True):
        end += len(line)
        directive = _directive(line)
        if directive in ("if", "ifdef", "ifndef"):
            depth += 1
        elif directive == "endif":
            depth -= 1
            if depth == 0:
                return source[:end]
    return None


def _directive(line: str) -> str | None:
    """The name of the preprocessor directive on ``line`` (``"ifdef"`` for ``#  ifdef X``), or None."""
    text = line.lstrip()
    if not text.startswith("#"):
        return None
    text = text[1:].lstrip()
    end = 0
    while end < len(text) and (text[end].isalnum() or text[end] == "_"):
        end += 1
    return text[:end]


def header_flags(arguments: list[str], source: str) -> list[str]:
    """The flags of a g++ command that builds ``source``, as a precompiled header of its prelude
    must be built with: all but the source, the output, and what only the link reads."""
    flags, skip = [], False
    for argument in arguments:
        if skip:
            skip = False
        elif argument == "-o":
            skip = True
        elif argument != source and argument != "-shared" and not argument.startswith(("-l", "-Wl,")):
            flags.append(argument)
    return flags


def over_cores(text: str, prelude: str, dispatch: str) -> str:
    """``text``, a kernel's C++ starting with Slang's ``prelude``, with its launches run over the
    machine's cores: each entry point's exported dispatch function renamed ``slax_serial_<name>``,
    and ``dispatch`` (:data:`DISPATCH_SOURCE`'s C++) appended with an exported ``<name>`` that runs
    it through ``slax_dispatch``. ``text`` as it is where it uses Slang's atomics (:data:`_SERIAL`)
    or has no such function."""
    kernel = text[len(prelude) :]
    if any(name in kernel for name in _SERIAL):
        return text
    names = [name for name in _DISPATCH.findall(kernel) if not name.endswith("_Group")]
    if not names:
        return text
    signature = _DISPATCH_PARAMETERS
    for name in names:
        kernel = kernel.replace(
            f"SLANG_PRELUDE_EXPORT\nvoid {name}{signature}", f"static void slax_serial_{name}{signature}"
        )
    exported = "".join(
        f"\nSLANG_PRELUDE_EXPORT\nvoid {name}{signature}\n"
        f"{{\n    slax_dispatch(slax_serial_{name}, varyingInput, entryPointParams, globalParams);\n}}\n"
        for name in names
    )
    return prelude + kernel + "\n" + dispatch + exported


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join([FORMAT, *parts]).encode(errors="surrogateescape")).hexdigest()


def _compiler_identity(compiler: str) -> str:
    status = os.stat(compiler)
    return f"{os.path.realpath(compiler)}:{status.st_size}:{status.st_mtime_ns}"


def _aside(path: str) -> str:
    """A name beside ``path`` for a file written before it is renamed to ``path``: unique across
    processes, also those of other hosts or containers sharing the cache (whose ids may repeat)."""
    return f"{path}.{os.getpid()}-{os.urandom(6).hex()}.partial"


def _write_whole(path: str, data: bytes, mode: int = 0o644) -> None:
    aside = _aside(path)
    with open(aside, "wb") as file:
        file.write(data)
    os.chmod(aside, mode)
    os.replace(aside, path)


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def precompiled_prelude(compiler: str, directory: str, prelude: str, flags: list[str]) -> str | None:
    """The path of a ``prelude.h`` holding ``prelude`` with its ``.gch`` beside it, built by
    ``compiler`` with ``flags`` (now, where missing) in a folder of ``directory`` named by their
    digest; None where g++ cannot build it."""
    folder = os.path.join(
        directory,
        "preludes",
        _digest(_compiler_identity(compiler), prelude, *flags)[:32],
    )
    header = os.path.join(folder, "prelude.h")
    if os.path.exists(header + ".gch"):
        return header
    os.makedirs(folder, exist_ok=True)
    _write_whole(header, prelude.encode(errors="surrogateescape"))
    aside = _aside(header + ".gch")
    if _run([compiler, *flags, "-x", "c++-header", header, "-o", aside], quiet=True) != 0:
        with contextlib.suppress(OSError):
            os.remove(aside)
        return None
    os.replace(aside, header + ".gch")
    return header


def _run(command: list[str], quiet: bool = False) -> int:
    """``command``'s exit status (127 where it cannot start); with ``quiet``, its output goes
    nowhere. ``posix_spawn``: no subprocess module to import once a build, and no fork of a
    process that may have threads (the tests call :func:`build` in theirs)."""
    actions = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)] if quiet else []
    try:
        pid = os.posix_spawn(command[0], command, os.environ, file_actions=actions)
    except OSError:
        return 127
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def build(compiler: str, directory: str, arguments: list[str]) -> int:
    """Runs the g++ command ``arguments`` with ``compiler``, the real g++, the cache in
    ``directory``: a build of one C++ file Slang wrote into ``-o OUTPUT`` is taken from the cache
    or built with the prelude precompiled and kept (the module's docstring); any other command runs
    as it came, and so does this one where the cache cannot be read or written. Returns g++'s exit
    status."""
    sources = [a for a in arguments if a.endswith(".cpp") and not a.startswith("-")]
    outputs = [arguments[k + 1] for k, a in enumerate(arguments[:-1]) if a == "-o"]
    if len(sources) != 1 or len(outputs) != 1:
        return _run([compiler, *arguments])
    source, output = sources[0], outputs[0]
    try:
        text = _read(source).decode(errors="surrogateescape")
    except OSError:
        return _run([compiler, *arguments])
    prelude = prelude_text(text)
    if prelude is None:
        return _run([compiler, *arguments])
    arguments = [*KERNEL_FLAGS, *arguments]
    try:
        spread = over_cores(text, prelude, _read(DISPATCH_SOURCE).decode())
    except OSError:
        spread = text
    shape = [{source: "<source>", output: "<output>"}.get(a, a) for a in arguments]
    code = _without_line_directives(spread, arguments)
    kept = os.path.join(directory, "kernels", _digest(_compiler_identity(compiler), code, *shape)[:40])
    with contextlib.suppress(OSError):
        kernel = _kept_kernel(kept)
        if kernel is not None:
            _write_whole(output, kernel, 0o755)
            return 0
    status = _build_spread(compiler, directory, arguments, source, prelude, spread) if spread != text else 1
    # Slang's C++ as it came, where there is nothing to spread or it did not build: kept under the
    # spread's key where g++ rejected the spread (exit status 1; it would again, in every process),
    # not where the build was cut short (killed, no room for the file), which may pass next time.
    keep = status in (0, 1)
    if status != 0:
        status = _build_with_header(compiler, directory, arguments, source, prelude)
    if status == 0 and keep:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(kept), exist_ok=True)
            kernel = _read(output)
            _write_whole(kept, hashlib.sha256(kernel).hexdigest().encode() + b"\n" + kernel)
    return status


def _build_spread(
    compiler: str, directory: str, arguments: list[str], source: str, prelude: str, spread: str
) -> int:
    """Builds ``spread`` (:func:`over_cores` of ``source``'s C++) as ``arguments`` build ``source``,
    from a file of its own beside it, g++'s output discarded (a failure here is not the kernel's:
    Slang, which reads g++'s diagnostics, would take it for one); g++'s exit status (127 where the
    file cannot be written)."""
    beside = f"{os.path.splitext(source)[0]}-cores-{os.getpid()}-{os.urandom(6).hex()}.cpp"
    try:
        _write_whole(beside, spread.encode(errors="surrogateescape"))
    except OSError:
        return 127
    try:
        swapped = [beside if argument == source else argument for argument in arguments]
        return _build_with_header(compiler, directory, swapped, beside, prelude, quiet=True)
    finally:
        with contextlib.suppress(OSError):
            os.remove(beside)


def _build_with_header(
    compiler: str, directory: str, arguments: list[str], source: str, prelude: str, quiet: bool = False
) -> int:
    """Runs ``arguments`` (which build ``source``) with ``prelude`` precompiled where g++ can build
    it, else, or where the build fails with it (a prelude cut short), as they are; with ``quiet``,
    g++'s output goes nowhere."""
    try:
        header = precompiled_prelude(compiler, directory, prelude, header_flags(arguments, source))
    except OSError:
        header = None
    at = arguments.index(source)
    included = ["-include", header] if header else []
    status = _run([compiler, *arguments[:at], *included, *arguments[at:]], quiet=quiet)
    if status != 0 and header:
        status = _run([compiler, *arguments], quiet=quiet)
    return status


def _without_line_directives(text: str, arguments: list[str]) -> str:
    """``text`` without its ``#line`` directives and blank lines where they cannot change what g++
    builds from it (no ``__LINE__`` or ``__FILE__`` in it, no debug information asked for), else as
    it is. Slang writes the same kernel with other ``#line`` directives, and blank lines for some, in
    a process that loaded its modules from SlangPy's module cache (no source locations) than in the
    one that compiled them."""
    if "__LINE__" in text or "__FILE__" in text or any(a.startswith("-g") and a != "-g0" for a in arguments):
        return text
    lines = text.splitlines(keepends=True)
    return "".join(line for line in lines if line.strip() and _directive(line) != "line")


def _kept_kernel(path: str) -> bytes | None:
    """The kernel kept at ``path`` (its SHA-256 in hex, a newline, the library g++ wrote), or None
    where none is kept or what is there does not match its digest (cut short or damaged on disk: the
    build then runs and keeps it again)."""
    digest, _, kernel = _read(path).partition(b"\n")
    return kernel if hashlib.sha256(kernel).hexdigest().encode() == digest else None


# --- in slax's process ------------------------------------------------------------------------------


def wrapper_folder(directory: str, compiler: str) -> str:
    """A folder in ``directory`` holding a ``g++`` that runs this file with the real ``compiler``
    and the cache in ``directory``; written now where missing."""
    script = (
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -S -E {shlex.quote(os.path.abspath(__file__))} "
        f'{shlex.quote(compiler)} {shlex.quote(directory)} "$@"\n'
    )
    folder = os.path.join(directory, "bin", _digest(script)[:16])
    if not os.path.exists(os.path.join(folder, "g++")):
        os.makedirs(folder, exist_ok=True)
        _write_whole(os.path.join(folder, "g++"), script.encode(errors="surrogateescape"), 0o755)
    return folder


_path_lock = threading.Lock()
_builds = 0
_path_before: str | None = None


@contextlib.contextmanager
def builds_through_wrapper(directory: str) -> Iterator[None]:
    """While the body runs (SlangPy builds a CPU kernel), ``g++`` on ``PATH`` is this wrapper, with
    its cache in ``directory``; ``PATH`` is as it was once no build is left. The change is to the
    process's environment, which Slang reads at each build: a program that starts ``g++`` on another
    thread meanwhile gets the wrapper, which runs a command that builds no C++ of Slang's as it
    came, and a change another thread makes to ``PATH`` during a build is undone with it. The real
    g++ is found on ``PATH`` as it was before any build changed it."""
    global _builds, _path_before
    with _path_lock:
        path = _path_before if _builds else os.environ.get("PATH")
        runnable = sys.executable and os.path.isfile(__file__) and not getattr(sys, "frozen", False)
        compiler = shutil.which("g++", path=path) if runnable else None
        compiler = os.path.abspath(compiler) if compiler else None
        try:
            folder = wrapper_folder(directory, compiler) if compiler else ""
        except OSError:  # the cache cannot hold the wrapper: builds go to g++ as they would
            compiler = None
        if compiler is not None:
            if _builds == 0:
                _path_before = path
                os.environ["PATH"] = folder + os.pathsep + (path or os.defpath)
            _builds += 1
    try:
        yield
    finally:
        # Without a wrapper (no g++ on PATH now, no interpreter to run this file with: a frozen or
        # embedded Python, a zipped slax; or no cache for it) nothing was changed to undo.
        if compiler is not None:
            with _path_lock:
                _builds -= 1
                if _builds == 0:
                    if _path_before is None:
                        os.environ.pop("PATH", None)
                    else:
                        os.environ["PATH"] = _path_before


if __name__ == "__main__":
    sys.exit(build(sys.argv[1], sys.argv[2], sys.argv[3:]))
