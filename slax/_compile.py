"""Compiling Slang modules and kernels on a device, once per content (and on disk across processes).

Modules and kernels are cached by content key (:mod:`slax._sources`): the Slang code they are built
from, never the path or name it came under.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import pathlib
import threading
import time
from collections.abc import Iterator

import slangpy as spy

from slax import _sources
from slax._device import cpp_compiler, include_paths, writable_cache_dir
from slax._errors import SlangCompileError
from slax._gxx_wrapper import builds_through_wrapper

GROUP_SIZE = 64
"""Threads per group: SLAX_GROUP_SIZE in shaders/slax/kernel.slang (tests/test_codegen.py pins both)."""
ROW_THREADS = 64 * 32768
"""Threads per dispatch row: SLAX_ROW_THREADS in shaders/slax/kernel.slang."""

Scalars = tuple[tuple[str, int | float], ...]
"""A launch's scalar arguments: (name, value) pairs of the entry point's scalar parameters."""
Aliases = tuple[tuple[int, int], ...]
"""(operand index, result index) pairs: the result is the operand's buffer, updated in place."""


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A compute entry point following the slax calling convention (``shaders/slax/kernel.slang``).

    Attributes:
      entry: the entry point's name.
      path: the ``.slang`` file that defines it, or that ``source`` imports (the Slang function a
        generated kernel runs).
      source: generated Slang source defining it, or ``None`` when ``path`` does.
      content: the content key (:mod:`slax._sources`) of ``path``'s module as it was loaded: the
        kernel runs exactly that code, edited since or not. ``None``: ``path`` or ``source`` as
        they are when the kernel is compiled.
    """

    entry: str
    path: str | None = None
    source: str | None = None
    content: str | None = None

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


def module_layout(module: spy.SlangModule) -> spy.ProgramLayout:
    """The reflection of ``module`` and the modules it imports (what ``module.layout`` gives), read
    from the module linked alone.

    A layout SlangPy makes with ``SlangModule.layout`` keeps the module's Slang session alive after
    every reference to it is gone (SlangPy 0.43.1): each session dropped after it stayed in memory
    for the life of the process, ~12 MB for each of the MLP's kernel modules. A linked program's
    layout is freed with its last reference, and its session with it.
    """
    return module.session.link_program([module], []).layout


def entry_point_parameters(module: spy.SlangModule, entry: str) -> EntryPointParameters:
    """Reads the pointer and scalar parameters of ``entry``; ValueError if there is none."""
    try:
        layout = module.entry_point(entry).layout
    except RuntimeError:
        raise ValueError(
            f"slax: Slang module {module.name!r} has no entry point {entry!r}; kernels are "
            '[shader("compute")] functions with uniform pointer and scalar parameters.'
        ) from None
    globals_ = module_layout(module).parameters
    if len(globals_):
        names = [p.name for p in globals_]
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


_lock = threading.RLock()
_sessions: dict[tuple[int, str], _Session] = {}
_kernels: dict[tuple[int, KernelSpec, str], CompiledKernel] = {}
"""Keyed by ``id(device)``: a forked child's devices are new objects, and its parent's are never
freed there (:func:`slax._device.keep_inherited`), so an id never names two devices."""


def _new_lock_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # another thread may have held it (compiling) at fork()


os.register_at_fork(after_in_child=_new_lock_in_child)


@dataclasses.dataclass
class _Session:
    """A Slang session holding one version of one module (its content key), and the generated
    kernel modules that import it (by their source).

    SlangPy's device keeps one session in which a module is loaded once per name: an edited file
    would never be read again, and a module whose import failed stays half-loaded in it (loading it
    again "succeeds", and linking it crashes the process). A session per content key has neither
    problem; one that failed to load is dropped, so a retry compiles, and fails, afresh.
    """

    session: spy.SlangSession
    root: spy.SlangModule
    generated: dict[str, spy.SlangModule] = dataclasses.field(default_factory=dict)


def load_slang_module(device: spy.Device, path: str) -> tuple[spy.SlangModule, str]:
    """Loads the Slang file at ``path`` on ``device`` as it is now; returns the module and its
    content key (:mod:`slax._sources`). Compile errors become SlangCompileError."""
    with _lock:
        content = _sources.known_content(path)
        if content is not None and (id(device), content) in _sessions:
            return _sessions[(id(device), content)].root, content
        session = _new_session(device)
        module = _compile(lambda: session.load_module(path), what=path)
        content = _sources.record_content(path)
        loaded = _sessions.setdefault((id(device), content), _Session(session, module))
        return loaded.root, content


def compile_kernel(device: spy.Device, spec: KernelSpec) -> CompiledKernel:
    """The compute kernel for ``spec`` on ``device``, compiled on first use."""
    content = spec_content(spec)
    key = (id(device), spec, content)
    with _lock:
        kernel = _kernels.get(key)
        if kernel is not None:
            return kernel
    module = _module_for(device, spec, content)
    parameters = entry_point_parameters(module, spec.entry)

    def build() -> spy.ComputeKernel:
        program = module.session.link_program([module], [module.entry_point(spec.entry)])
        with _through_slaxs_gxx(device):
            kernel = device.create_compute_kernel(program)
            kernel.pipeline  # noqa: B018 -- builds the pipeline now: code generation errors (e.g. a
            # loop that cannot be unrolled) surface here, at trace time, not at the first launch
        return kernel

    try:
        built = _compile(build, what=f"entry point {spec.entry!r}")
    except SlangCompileError as error:
        error = _explained_by_push_constants(error, device, spec, parameters)
        raise _explained_by_quoted_path(error, device, spec) from None
    kernel = CompiledKernel(built, parameters)
    with _lock:
        return _kernels.setdefault(key, kernel)


VULKAN_GUARANTEED_PUSH_CONSTANT_BYTES = 128
"""maxPushConstantsSize every Vulkan device offers; lavapipe and NVIDIA's drivers offer 256."""

_SCALAR_BYTES = {"half": 2, "double": 8, "int64_t": 8, "uint64_t": 8}


def _through_slaxs_gxx(device: spy.Device) -> contextlib.AbstractContextManager:
    """Where ``device`` is SlangPy's CPU device building with g++ (Slang takes clang++ where there
    is one), its builds through slax's g++ (slax/_gxx_wrapper.py: each kernel built once per cache,
    with Slang's prelude precompiled); else nothing changed."""
    compiler = cpp_compiler()
    if device.info.type != spy.DeviceType.cpu or compiler is None or os.path.basename(compiler) != "g++":
        return contextlib.nullcontext()
    return builds_through_wrapper(str(writable_cache_dir("cpu", "g++")))


def uniform_bytes(parameters: EntryPointParameters) -> int:
    """The bytes an entry point's arguments take as Vulkan push constants: 8 per pointer, scalars
    at their size, each aligned to its size, in declaration order."""
    kinds = dict(parameters.pointers)
    scalars = dict(parameters.scalars)
    offset = 0
    for name in parameters.order:
        size = 8 if name in kinds else _SCALAR_BYTES.get(scalars.get(name, ""), 4)
        offset = -(-offset // size) * size + size
    return offset


def _explained_by_quoted_path(
    error: SlangCompileError, device: spy.Device, spec: KernelSpec
) -> SlangCompileError:
    """SlangPy's CUDA compile hands NVRTC ``#line`` directives with the module's path unescaped, so a
    path holding a double quote fails there with only "expected a file name"; say so."""
    if device.info.type != spy.DeviceType.cuda or '"' not in (spec.path or ""):
        return error
    return SlangCompileError(
        f"{error}\nslax: the module's path {spec.path!r} holds a double quote, which SlangPy's CUDA "
        "compile cannot pass to NVRTC. Move or link the module to a path without one, or use the PTX "
        "route (slax.config.cuda_launch = 'ptx', the default), which compiles it."
    )


def _explained_by_push_constants(
    error: SlangCompileError, device: spy.Device, spec: KernelSpec, parameters: EntryPointParameters
) -> SlangCompileError:
    """SlangPy says only "Failed to create shader program" when a Vulkan kernel's arguments do not
    fit the device's push constants; say so, with the numbers, where that can be the cause."""
    needed = uniform_bytes(parameters)
    if device.info.type != spy.DeviceType.vulkan or needed <= VULKAN_GUARANTEED_PUSH_CONSTANT_BYTES:
        return error
    return SlangCompileError(
        f"{error}\nslax: kernel {spec.entry!r} takes {len(parameters.pointers)} pointers and "
        f"{len(parameters.scalars)} scalars: {needed} bytes of arguments, which Vulkan passes as push "
        f"constants; devices offer {VULKAN_GUARANTEED_PUSH_CONSTANT_BYTES} bytes or more (lavapipe "
        "and NVIDIA: 256), and the log above names this device's limit if it is the cause. Each "
        "array argument (each field of a struct, each out parameter, and for derivatives each "
        "tangent or cotangent) is one pointer: pass fewer, or run JAX on a CUDA GPU, whose "
        "kernels take 4 KiB of arguments."
    )


def kernel_parameters(device: spy.Device, spec: KernelSpec) -> EntryPointParameters:
    """The parameters of ``spec``'s entry point, read from ``device``'s reflection of its module
    (without building a pipeline: for launch paths that compile the code themselves)."""
    return entry_point_parameters(_module_for(device, spec, spec_content(spec)), spec.entry)


def spec_content(spec: KernelSpec) -> str:
    """The content key of the code ``spec`` runs: the one it was made with, or for a spec made
    without one, that of its module file or source as they are now."""
    if spec.content is not None:
        return spec.content
    if spec.path is not None:
        return _sources.content_of(spec.path)
    return _sources.content_of(spec.source or "", source=True)


def _module_for(device: spy.Device, spec: KernelSpec, content: str) -> spy.SlangModule:
    """The module defining ``spec``'s entry point, in the session of ``content``."""
    with _lock:
        loaded = _sessions.get((id(device), content))
        if loaded is None:
            session = _new_session(device)
            if spec.path is not None:
                root = _compile(lambda: session.load_module(spec.path or ""), what=spec.path)
            else:
                source = spec.source or ""
                root = _compile(
                    lambda: session.load_module_from_source(spec.module_name, source),
                    what=f"the kernel slax generated for {spec.entry}",
                )
            # The files were read again just now: they must still be the code of ``content``.
            _sources.require_unchanged(content, f"the Slang module of kernel {spec.entry!r}")
            loaded = _sessions.setdefault((id(device), content), _Session(session, root))
        if spec.path is None or spec.source is None:
            return loaded.root
        module = loaded.generated.get(spec.source)
        if module is None:
            source = spec.source
            module = _compile(
                lambda: loaded.session.load_module_from_source(spec.module_name, source),
                what=f"the kernel slax generated for {spec.entry}",
            )
            loaded.generated[source] = module
        return module


def _new_session(device: spy.Device) -> spy.SlangSession:
    """A fresh Slang session with the device's compiler options and module cache, and the include
    path as it is now (it names the cache directory, which may have moved since the device was
    made): the one slax lists a module's imports with."""
    desc = device.slang_session.desc
    options = desc.compiler_options
    options.include_paths = include_paths()
    return device.create_slang_session(
        compiler_options=options,
        add_default_include_paths=desc.add_default_include_paths,
        cache_path=desc.cache_path,
    )


_log = logging.getLogger("slax")
"""slax's log: at INFO, each Slang module and kernel as it starts compiling, and the time of each
that took a second or more (seconds each where SlangPy's caches are cold: on the CPU device g++
builds every kernel; at DEBUG, every compile's time), so that a program can show why it
waits (the experiments print it: experiments/_harness.show_slax_progress)."""


@contextlib.contextmanager
def announced(what: str) -> Iterator[None]:
    """Says in slax's log that ``what`` compiles, before its body runs, and how long it took after
    (not where it raised). A compile that took a second or more is worth its line at INFO; quicker
    ones (cache hits) would only bury the ones that matter, so they go to DEBUG."""
    _log.info("compiling %s ...", what)
    began = time.perf_counter()
    yield
    seconds = time.perf_counter() - began
    _log.log(logging.INFO if seconds >= 1.0 else logging.DEBUG, "compiled %s in %.1f s", what, seconds)


def _compile(action, *, what: str):
    """Runs ``action``, a Slang compile of ``what``, saying so in slax's log (:func:`announced`);
    its failures become SlangCompileError."""
    try:
        with announced(what):
            return action()
    except Exception as error:
        if isinstance(error, SlangCompileError):
            raise
        message = str(error)
        raise SlangCompileError(f"slax: Slang failed to compile {what}:\n{message}") from None
