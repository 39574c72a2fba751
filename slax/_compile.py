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


@dataclasses.dataclass(frozen=True)
class EntryPointParameters:
    """An entry point's uniform parameters: pointers in order, with element types, then scalars."""

    pointers: tuple[tuple[str, str], ...]
    scalars: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    kernel: spy.ComputeKernel
    parameters: EntryPointParameters


def entry_point_parameters(module: spy.SlangModule, entry: str) -> EntryPointParameters:
    """Reads the pointer and scalar parameters of ``entry``; ValueError if there is none."""
    try:
        layout = module.entry_point(entry).layout
    except RuntimeError:
        raise ValueError(
            f"slax: Slang module {module.name!r} has no entry point {entry!r}; kernels are "
            '[shader("compute")] functions with uniform pointer and scalar parameters.'
        ) from None
    pointers, scalars = [], []
    for param in layout.parameters:
        slang_type = param.type_layout.type
        if slang_type.kind == spy.TypeReflection.Kind.pointer:
            element = slang_type.full_name.removeprefix("Ptr<").split(",")[0].strip()
            pointers.append((param.name, element))
        elif slang_type.kind == spy.TypeReflection.Kind.scalar:
            scalars.append((param.name, slang_type.full_name))
    return EntryPointParameters(tuple(pointers), tuple(scalars))


_lock = threading.Lock()
_kernels: dict[tuple[int, KernelSpec], CompiledKernel] = {}
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


def compile_kernel(device: spy.Device, spec: KernelSpec) -> CompiledKernel:
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
    parameters = entry_point_parameters(module, spec.entry)
    kernel = CompiledKernel(
        _compile(
            lambda: device.create_compute_kernel(
                device.link_program([module], [module.entry_point(spec.entry)])
            ),
            what=f"entry point {spec.entry!r}",
        ),
        parameters,
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
        raise SlangCompileError(f"slax: Slang failed to compile {what}:\n{message}") from None
