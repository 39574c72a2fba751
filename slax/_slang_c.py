"""Slang's C compile API, from SlangPy's own ``libslang-compiler``, through ctypes.

SlangPy compiles for the devices it drives and keeps the code, and the list of files a module was
read from, to itself. slax needs both: the PTX launch path (:mod:`slax._ptx_launch`) needs the PTX
text of one entry point, which jaxlib's kernel launcher then loads, and content keys
(:mod:`slax._sources`) need the files a module imports. The same compiler library gives both
through Slang's C API, so the PTX comes from the very Slang that SlangPy runs, with SlangPy's
defaults (row-major matrices, default optimisation) and the devices' include path
(:func:`slax._device.include_paths`).

PTX goes through NVRTC, which Slang loads at run time: it is found in the ``nvidia-cuda-nvrtc``
wheel that JAX's CUDA packages install, in a CUDA toolkit, or at ``SLAX_NVRTC`` (a path to
``libnvrtc.so*``).
"""

from __future__ import annotations

import ctypes
import enum
import functools
import glob
import importlib.util
import os
import pathlib
import threading
from typing import TYPE_CHECKING

import slangpy as spy

from slax._codegen import slang_string
from slax._device import include_paths
from slax._errors import SlangCompileError

if TYPE_CHECKING:
    from slax._compile import KernelSpec

_SOURCE_LANGUAGE_SLANG = 1
_STAGE_COMPUTE = 6


class CodeTarget(enum.IntEnum):
    """Slang's ``SlangCompileTarget`` values used by slax."""

    CPP_SOURCE = 13
    CUDA_SOURCE = 17
    PTX = 18


class NvrtcNotFoundError(RuntimeError):
    """No NVRTC library to turn Slang's CUDA output into PTX."""


@functools.cache
def _library() -> ctypes.CDLL:
    package = pathlib.Path(spy.__file__).parent
    candidates = sorted(glob.glob(str(package / "libslang-compiler.so*")))
    if not candidates:
        raise RuntimeError(f"slax: SlangPy at {package} ships no libslang-compiler library.")
    lib = ctypes.CDLL(candidates[0])
    p, i, s = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    signatures = {
        "spCreateSession": (p, [s]),
        "spCreateCompileRequest": (p, [p]),
        "spDestroyCompileRequest": (None, [p]),
        "spAddCodeGenTarget": (i, [p, i]),
        "spAddSearchPath": (None, [p, s]),
        "spProcessCommandLineArguments": (ctypes.c_int32, [p, ctypes.POINTER(s), i]),
        "spAddTranslationUnit": (i, [p, i, s]),
        "spAddTranslationUnitSourceFile": (None, [p, i, s]),
        "spAddTranslationUnitSourceString": (None, [p, i, s, s]),
        "spAddEntryPoint": (i, [p, i, s, i]),
        "spCompile": (ctypes.c_int32, [p]),
        "spGetDiagnosticOutput": (s, [p]),
        "spGetEntryPointCode": (p, [p, i, ctypes.POINTER(ctypes.c_size_t)]),
        "spGetDependencyFileCount": (i, [p]),
        "spGetDependencyFilePath": (s, [p, i]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


_lock = threading.Lock()
"""Slang sessions are not thread-safe; one compile at a time."""
_session: int | None = None


def _global_session() -> int:
    global _session
    if _session is None:
        _session = _library().spCreateSession(None)
        if not _session:
            raise RuntimeError("slax: Slang's spCreateSession failed.")
    return _session


def nvrtc_library() -> str | None:
    """Path of an NVRTC library Slang can load, or None.

    Looks at ``SLAX_NVRTC``, then the NVIDIA wheels JAX's CUDA packages install
    (``nvidia-cuda-nvrtc-cu12``, ``nvidia-cuda-nvrtc`` for CUDA 13), then ``CUDA_HOME``/``CUDA_PATH``
    and ``/usr/local/cuda``.
    """
    explicit = os.environ.get("SLAX_NVRTC")
    if explicit:
        if not os.path.isfile(explicit):
            raise NvrtcNotFoundError(f"slax: SLAX_NVRTC={explicit!r} is not a file.")
        return explicit
    wheels = importlib.util.find_spec("nvidia")  # the namespace package NVIDIA's wheels share
    locations = (wheels.submodule_search_locations or []) if wheels else []
    directories = [
        os.path.join(location, wheel_lib)
        for location in locations
        for wheel_lib in ("cuda_nvrtc/lib", "cu13/lib")
    ]
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(variable):
            directories.append(os.path.join(os.environ[variable], "lib64"))
    directories.append("/usr/local/cuda/lib64")
    for directory in directories:
        matches = sorted(glob.glob(os.path.join(directory, "libnvrtc.so*")))
        matches = [m for m in matches if "builtins" not in m and ".alt." not in m]
        if matches:
            return min(matches, key=len)
    return None


def required_nvrtc_library() -> str:
    """:func:`nvrtc_library`'s path; NvrtcNotFoundError, saying how to get one, where none is found."""
    nvrtc = nvrtc_library()
    if nvrtc is None:
        raise NvrtcNotFoundError(
            "slax: compiling Slang to PTX needs NVRTC, which was not found. Install JAX's CUDA "
            "packages (pip install 'jax[cuda12]' brings nvidia-cuda-nvrtc-cu12) or a CUDA "
            "toolkit, or point SLAX_NVRTC at libnvrtc.so."
        )
    return nvrtc


def nvrtc_version(path: str) -> tuple[int, int]:
    """(major, minor) of the NVRTC library at ``path``, as its ``nvrtcVersion`` reports it."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    if ctypes.CDLL(path).nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
        raise RuntimeError(f"slax: nvrtcVersion of {path!r} failed.")
    return major.value, minor.value


def compile_arguments(target: CodeTarget, defines: dict[str, str] | None, nvrtc: str | None) -> list[str]:
    """The options :func:`compile_entry_point` gives Slang: row-major matrices, ``defines`` as
    preprocessor macros, and for PTX the NVRTC library at ``nvrtc``."""
    arguments = ["-matrix-layout-row-major"]
    arguments += [f"-D{name}={value}" for name, value in (defines or {}).items()]
    if target is CodeTarget.PTX:
        # No #line directives in the CUDA source NVRTC compiles: Slang writes paths into them
        # unescaped, and a module path with a double quote in it is then a syntax error there.
        arguments += ["-nvrtc-path", nvrtc or "", "-line-directive-mode", "none"]
    return arguments


def dependency_files(path: str | None = None, source: str | None = None, name: str = "") -> list[str]:
    """The files Slang reads to check the module at ``path``, or the ``source`` text named ``name``:
    the module itself and everything it imports or includes, in Slang's order. A source module is
    listed by ``name``, not a file.

    Raises:
      SlangCompileError: Slang rejected the module; the message carries its diagnostics.
    """
    lib = _library()
    with _lock:
        request = lib.spCreateCompileRequest(_global_session())
        try:
            for directory in include_paths():
                lib.spAddSearchPath(request, directory.encode())
            unit = lib.spAddTranslationUnit(request, _SOURCE_LANGUAGE_SLANG, None)
            if source is not None:
                lib.spAddTranslationUnitSourceString(request, unit, name.encode(), source.encode())
            else:
                lib.spAddSearchPath(request, str(pathlib.Path(path or "").parent).encode())
                lib.spAddTranslationUnitSourceFile(request, unit, str(path).encode())
            if lib.spCompile(request) < 0:
                # (Slang's dependency list is only valid after a successful compile: reading it
                # after a failure crashes.)
                diagnostics = (lib.spGetDiagnosticOutput(request) or b"").decode(errors="replace")
                raise SlangCompileError(f"slax: Slang failed to compile {path or name}:\n{diagnostics}")
            count = lib.spGetDependencyFileCount(request)
            paths = [lib.spGetDependencyFilePath(request, k) for k in range(count)]
            return [path.decode(errors="surrogateescape") for path in paths]
        finally:
            lib.spDestroyCompileRequest(request)


def relocated(path: str, snapshot_root: str | None) -> str:
    """Where ``path`` is in the snapshot at ``snapshot_root`` (``path`` itself for None)."""
    if snapshot_root is None:
        return path
    return os.path.join(snapshot_root, os.path.abspath(path).lstrip(os.sep))


def compile_entry_point(
    spec: KernelSpec, target: CodeTarget, snapshot: str | None = None, defines: dict[str, str] | None = None
) -> str:
    """The code of ``spec``'s entry point for ``target`` (PTX, CUDA or C++ source), as text; with
    ``snapshot`` (:func:`slax._sources.snapshot`), from the module's files kept there, ahead of
    the files on disk; with ``defines``, those preprocessor macros set.

    Raises:
      SlangCompileError: Slang rejected the module; the message carries its diagnostics (file:line).
      NvrtcNotFoundError: PTX was asked for and no NVRTC library was found.
    """
    nvrtc = required_nvrtc_library() if target is CodeTarget.PTX else None
    arguments = compile_arguments(target, defines, nvrtc)
    lib = _library()
    with _lock:
        request = lib.spCreateCompileRequest(_global_session())
        try:
            argv = (ctypes.c_char_p * len(arguments))(*[a.encode() for a in arguments])
            if lib.spProcessCommandLineArguments(request, argv, len(arguments)) < 0:
                raise RuntimeError(f"slax: Slang rejected the options {arguments}.")
            lib.spAddCodeGenTarget(request, int(target))
            for directory in include_paths():
                if snapshot is not None:
                    lib.spAddSearchPath(request, relocated(directory, snapshot).encode())
                lib.spAddSearchPath(request, directory.encode())
            unit = lib.spAddTranslationUnit(request, _SOURCE_LANGUAGE_SLANG, None)
            if spec.source is not None:
                name = f"{spec.module_name}.slang"
                source = spec.source
                if spec.path is not None:  # a generated kernel imports the module by its path
                    moved = relocated(spec.path, snapshot)
                    source = source.replace(slang_string(spec.path), slang_string(moved))
                lib.spAddTranslationUnitSourceString(request, unit, name.encode(), source.encode())
            else:
                path = pathlib.Path(relocated(spec.path or "", snapshot))
                lib.spAddSearchPath(request, str(path.parent).encode())
                lib.spAddTranslationUnitSourceFile(request, unit, str(path).encode())
            entry = lib.spAddEntryPoint(request, unit, spec.entry.encode(), _STAGE_COMPUTE)
            failed = lib.spCompile(request) < 0
            diagnostics = (lib.spGetDiagnosticOutput(request) or b"").decode(errors="replace")
            if failed:
                raise SlangCompileError(
                    f"slax: Slang failed to compile entry point {spec.entry!r} to "
                    f"{target.name}:\n{diagnostics}"
                )
            size = ctypes.c_size_t()
            code = lib.spGetEntryPointCode(request, entry, ctypes.byref(size))
            if not code:
                raise SlangCompileError(f"slax: Slang produced no {target.name} for {spec.entry!r}.")
            return ctypes.string_at(code, size.value).decode().rstrip("\0")
        finally:
            lib.spDestroyCompileRequest(request)
