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
    """An entry point's uniform parameters and thread-group size.

    Attributes:
      pointers: (name, element type) of each pointer parameter, in declaration order.
      scalars: (name, Slang scalar type) of each scalar parameter, in declaration order.
      order: the names of all uniform parameters in declaration order: the order of the compiled
        kernel's own arguments (``extern "C" __global__ void entry(...)`` on CUDA).
      thread_group_size: ``[numthreads(x, y, z)]``.
    """

    pointers: tuple[tuple[str, str], ...]
    scalars: tuple[tuple[str, str], ...]
    order: tuple[str, ...] = ()
    thread_group_size: tuple[int, int, int] = (1, 1, 1)


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
    if len(module.layout.parameters):
        names = [p.name for p in module.layout.parameters]
        raise ValueError(
            f"slax: Slang module {module.name!r} declares global shader parameters {names}; slax "
            f"kernels such as {entry!r} receive all data through their own uniform pointer and "
            "scalar parameters (see shaders/slax/kernel.slang)."
        )
    pointers, scalars, order = [], [], []
    for param in layout.parameters:
        if param.type_layout.size == 0:
            continue  # varying (a system value such as SV_DispatchThreadID), not an argument
        slang_type = param.type_layout.type
        if slang_type.kind == spy.TypeReflection.Kind.pointer:
            element = slang_type.full_name.removeprefix("Ptr<").split(",")[0].strip()
            pointers.append((param.name, element))
        elif slang_type.kind == spy.TypeReflection.Kind.scalar:
            scalars.append((param.name, slang_type.full_name))
        else:
            raise ValueError(
                f"slax: parameter {param.name!r} of entry point {entry!r} has type "
                f"{slang_type.full_name!r}; slax kernels take uniform pointers and scalars only "
                "(see shaders/slax/kernel.slang)."
            )
        order.append(param.name)
    x, y, z = layout.compute_thread_group_size
    return EntryPointParameters(tuple(pointers), tuple(scalars), tuple(order), (int(x), int(y), int(z)))


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
    module = _module_for(device, spec)
    parameters = entry_point_parameters(module, spec.entry)

    def build() -> spy.ComputeKernel:
        kernel = device.create_compute_kernel(device.link_program([module], [module.entry_point(spec.entry)]))
        kernel.pipeline  # noqa: B018 -- builds the pipeline now: code generation errors (e.g. a loop
        # that cannot be unrolled) surface here, at trace time, not at the first launch
        return kernel

    kernel = CompiledKernel(_compile(build, what=f"entry point {spec.entry!r}"), parameters)
    with _lock:
        return _kernels.setdefault(key, kernel)


def kernel_parameters(device: spy.Device, spec: KernelSpec) -> EntryPointParameters:
    """The parameters of ``spec``'s entry point, read from ``device``'s reflection of its module
    (without building a pipeline: for launch paths that compile the code themselves)."""
    return entry_point_parameters(_module_for(device, spec), spec.entry)


def _module_for(device: spy.Device, spec: KernelSpec) -> spy.SlangModule:
    if spec.source is None:
        return load_slang_module(device, spec.path or "")
    key = (id(device), spec.module_name)
    with _lock:
        module = _modules.get(key)
    if module is None:
        source = spec.source
        module = _compile(
            lambda: device.load_module_from_source(spec.module_name, source),
            what=f"the kernel slax generated for {spec.entry}",
        )
        with _lock:
            module = _modules.setdefault(key, module)
    return module


def _compile(action, *, what: str):
    try:
        return action()
    except Exception as error:
        if isinstance(error, SlangCompileError):
            raise
        message = str(error)
        raise SlangCompileError(f"slax: Slang failed to compile {what}:\n{message}") from None
