"""Compiling Slang modules and kernels on a device, once per process (and on disk across processes)."""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import threading

import slangpy as spy

from slax._errors import SlangCompileError


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A compute entry point following the slax calling convention (``shaders/slax/kernel.slang``).

    Attributes:
      entry: the entry point's name.
      path: the ``.slang`` file that defines it, or ``None`` when ``source`` does.
      source: generated Slang source defining it, or ``None`` when ``path`` does.
    """

    entry: str
    path: str | None = None
    source: str | None = None

    @property
    def module_name(self) -> str:
        if self.source is not None:
            return "slax_generated_" + hashlib.sha256(self.source.encode()).hexdigest()[:16]
        return pathlib.Path(self.path or "").stem


_lock = threading.Lock()
_kernels: dict[tuple[int, KernelSpec], spy.ComputeKernel] = {}
_modules: dict[tuple[int, str], spy.SlangModule] = {}


def load_slang_module(device: spy.Device, path: str) -> spy.SlangModule:
    """Loads the Slang file at ``path`` on ``device``; compile errors become SlangCompileError."""
    key = (id(device), path)
    with _lock:
        module = _modules.get(key)
        if module is None:
            module = _compile(lambda: device.load_module(path), what=path)
            _modules[key] = module
        return module


def compile_kernel(device: spy.Device, spec: KernelSpec) -> spy.ComputeKernel:
    """The compute kernel for ``spec`` on ``device``, compiled on first use."""
    key = (id(device), spec)
    with _lock:
        kernel = _kernels.get(key)
        if kernel is not None:
            return kernel
    if spec.source is not None:
        source = spec.source
        module = _compile(
            lambda: device.load_module_from_source(spec.module_name, source),
            what=f"the kernel slax generated for {spec.entry}",
        )
    else:
        module = load_slang_module(device, spec.path or "")
    kernel = _compile(
        lambda: device.create_compute_kernel(
            device.link_program([module], [module.entry_point(spec.entry)])
        ),
        what=f"entry point {spec.entry!r}",
    )
    with _lock:
        return _kernels.setdefault(key, kernel)


def _compile(action, *, what: str):
    try:
        return action()
    except Exception as error:
        if isinstance(error, SlangCompileError):
            raise
        message = str(error)
        if "entry_point" in message or "entry point" in message.lower() and "not found" in message:
            raise SlangCompileError(f"slax: {what} is not defined: {message}") from None
        raise SlangCompileError(f"slax: Slang failed to compile {what}:\n{message}") from None
