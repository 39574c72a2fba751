"""Moving JAX buffers to Slang kernels and launching them with SlangPy, inside ``buffer_callback``.

Three launchers (the interface is :class:`slax._launch.Launcher`) lower a launch to a
``jax.experimental.buffer_callback`` that runs their :meth:`callback` with XLA's buffers:

- :class:`HostCopyLauncher` (route ``"host-copy"``) for CPU-resident JAX buffers and a Vulkan (or
  CUDA) device: copy operands into device buffers kept per call site (reused across calls, resized
  only when a shape changes), dispatch, copy results back.
- :class:`HostPointerLauncher` (route ``"host-pointer"``) for CPU-resident JAX buffers and
  SlangPy's CPU device, whose kernels are host code: they receive XLA's host addresses, no copies.
- :class:`ZeroCopyLauncher` (route ``"slangpy"``) for CUDA-resident JAX buffers: the kernel receives
  XLA's device pointers and runs on XLA's stream, with no copies and no synchronisation.
"""

from __future__ import annotations

import abc
import collections
import contextlib
import ctypes
import dataclasses
import functools
import logging
import math
import threading
from collections.abc import Callable, Iterator, Sequence

import jax
import numpy as np
import slangpy as spy

from slax import _cpu_signals
from slax._compile import ROW_THREADS, Aliases, CompiledKernel, KernelSpec, Scalars, compile_kernel
from slax._device import DeviceKind, get_device, keep_inherited, process_generation
from slax._jax_api import buffer_callback, lower_fun, lowering_for_export
from slax._ptx_launch import PTX_LAUNCH_TARGET

BufferCallback = Callable[..., None]

_BUFFER_USAGE = spy.BufferUsage.shader_resource | spy.BufferUsage.unordered_access


def thread_grid(count: int) -> list[int]:
    """Dispatch dimensions for ``count`` threads laid out in rows (see ``slax/kernel.slang``)."""
    return [min(count, ROW_THREADS), max(1, math.ceil(count / ROW_THREADS)), 1]


class _CallbackLauncher(abc.ABC):
    """Lowers a launch to a ``buffer_callback`` running :meth:`callback` on XLA's buffers."""

    name: str
    """The route's name (``slax.launch_route()``)."""

    def lower(self, ctx, operands, *, spec: KernelSpec, scalars: Scalars, count: int, aliases: Aliases):
        if lowering_for_export(ctx):
            raise NotImplementedError(
                f"slax: jax.export cannot serialise Slang kernel {spec.entry!r} on the {self.name!r} "
                "route: there slax runs kernels as host callbacks (jax.experimental.buffer_callback), "
                "and JAX serialises no host callback. Compile in the process that runs the kernels "
                "instead (jax.jit(f).lower(...).compile()). Only the PTX route (JAX on a CUDA GPU, "
                "slax.config.cuda_launch='ptx', the default there) lowers kernels to XLA custom calls, "
                "which jax.export serialises given disabled_checks=[jax.export.DisabledSafetyCheck."
                f"custom_call({PTX_LAUNCH_TARGET!r})] (README, Limits)."
            )
        callback = self.callback(spec, scalars, count, aliases)
        shapes = [jax.ShapeDtypeStruct(aval.shape, aval.dtype) for aval in ctx.avals_out]
        run = buffer_callback(callback, shapes, input_output_aliases=dict(aliases))
        return lower_fun(lambda *args: run(*args), multiple_results=True)(ctx, *operands)

    @abc.abstractmethod
    def callback(self, spec: KernelSpec, scalars: Scalars, count: int, aliases: Aliases) -> BufferCallback:
        """The function ``buffer_callback`` runs as ``run(ctx, outs, *ins)`` for one launch."""


class _ProcessDevice:
    """A launcher's SlangPy device and dispatch lock in this process.

    A child forked after slax ran kernels inherits its parent's devices without their driver's
    threads (lavapipe's among them): reading a buffer of one waits for those threads forever. So
    where :func:`slax._device.process_generation` moved on, a launch takes the child's own device
    and lock, and its call site compiles its kernel and makes its buffers again on it.
    """

    def __init__(self, kind: DeviceKind):
        self.kind = kind
        self._current = (process_generation(), get_device(kind), threading.Lock())

    def current(self) -> tuple[int, spy.Device, threading.Lock]:
        """(generation, device, the lock that serialises dispatches on the device's queue)."""
        if self._current[0] != process_generation():  # the old lock may have been held at fork()
            self._current = (process_generation(), get_device(self.kind), threading.Lock())
        return self._current


@dataclasses.dataclass
class _CallSite:
    """A call site's kernel, compiled on the device of process generation ``generation``."""

    generation: int
    compiled: CompiledKernel


class HostCopyLauncher(_CallbackLauncher):
    """Runs kernels on host buffers by copying through device buffers that persist per call site.
    Ctrl-C twice ends an endless kernel, as on SlangPy's CPU device (:mod:`slax._cpu_signals`),
    where a C++ compiler builds the handler (a Vulkan device needs none: it says so once)."""

    name = "host-copy"

    def __init__(self, kind: DeviceKind):
        self.process = _ProcessDevice(kind)
        if _cpu_signals.interruptible():
            _cpu_signals.install()
        elif _cpu_signals.applies():
            logging.getLogger("slax").warning(
                "slax: no C++ compiler (g++ or clang++) builds the Ctrl-C handler here: Ctrl-C waits "
                "for a running Slang kernel to return on %s. Install g++ to end an endless kernel "
                "with two Ctrl-C.",
                kind.value,
            )

    def callback(self, spec: KernelSpec, scalars: Scalars, count: int, aliases: Aliases) -> BufferCallback:
        generation, device, _ = self.process.current()
        site = _CallSite(generation, compile_kernel(device, spec))
        aliased = dict((result, operand) for operand, result in aliases)
        buffers: dict[int, spy.Buffer] = {}

        def buffer_for(device: spy.Device, slot: int, nbytes: int) -> spy.Buffer:
            nbytes = max(nbytes, 4)
            buffer = buffers.get(slot)
            if buffer is None or buffer.size != nbytes:
                buffer = device.create_buffer(size=nbytes, usage=_BUFFER_USAGE)
                buffers[slot] = buffer
            return buffer

        def run(ctx, outs: Sequence, *ins) -> None:
            nonlocal site
            del ctx
            host_ins = [_host_array(b, "operand") for b in ins]
            host_outs = [_host_array(b, "result") for b in outs]
            generation, device, lock = self.process.current()
            with lock:
                if site.generation != generation:  # forked: this process's own kernel and buffers
                    keep_inherited(site.compiled, *buffers.values())
                    buffers.clear()
                    site = _CallSite(generation, compile_kernel(device, spec))
                compiled = site.compiled
                names_list = [name for name, _ in compiled.parameters.pointers]
                in_buffers = [buffer_for(device, slot, a.nbytes) for slot, a in enumerate(host_ins)]
                out_buffers = [
                    in_buffers[aliased[k]] if k in aliased else buffer_for(device, len(ins) + k, a.nbytes)
                    for k, a in enumerate(host_outs)
                ]
                for array, buffer in zip(host_ins, in_buffers):
                    if array.nbytes:
                        buffer.copy_from_numpy(np.ascontiguousarray(array).reshape(-1))
                pointer_buffers = in_buffers + [b for k, b in enumerate(out_buffers) if k not in aliased]
                addresses = {name: b.device_address for name, b in zip(names_list, pointer_buffers)}
                with _explained_device_errors(device, spec), _cpu_signals.waiting():
                    compiled.kernel.dispatch(thread_grid(count), **addresses, **dict(scalars))
                    for array, buffer in zip(host_outs, out_buffers):
                        data = buffer.to_numpy().view(np.uint8)[: array.nbytes]
                        array[...] = data.view(array.dtype).reshape(array.shape)

        return run


class HostPointerLauncher(_CallbackLauncher):
    """Runs kernels of SlangPy's CPU device on XLA's host buffers in place: the kernel's pointers
    are the buffers' addresses.

    SlangPy's CPU device runs a dispatch's thread groups on the calling thread, holding the GIL
    (measured in BENCHMARKS.md: a launch split over Python threads takes as long as one); slax's
    kernels spread them over worker threads themselves (slax/_cpu_dispatch.h). An integer division
    by zero in a kernel gives Vulkan's values rather than SIGFPE, and Ctrl-C twice ends an endless
    kernel (:mod:`slax._cpu_signals`).
    """

    name = "host-pointer"

    def __init__(self, kind: DeviceKind):
        self.process = _ProcessDevice(kind)
        _cpu_signals.install()

    def callback(self, spec: KernelSpec, scalars: Scalars, count: int, aliases: Aliases) -> BufferCallback:
        generation, device, _ = self.process.current()
        site = _CallSite(generation, compile_kernel(device, spec))
        scalar_args = dict(scalars)
        aliased = {result for _, result in aliases}

        def run(ctx, outs: Sequence, *ins) -> None:
            nonlocal site
            del ctx
            fresh = [b for k, b in enumerate(outs) if k not in aliased]
            arrays = [_host_array(b, "operand") for b in ins] + [_host_array(b, "result") for b in fresh]
            pointers = [array.ctypes.data for array in arrays]
            generation, device, lock = self.process.current()
            with lock, _explained_device_errors(device, spec), _cpu_signals.guarded():
                if site.generation != generation:  # forked: this process's own kernel
                    keep_inherited(site.compiled)
                    site = _CallSite(generation, compile_kernel(device, spec))
                compiled = site.compiled
                names = [name for name, _ in compiled.parameters.pointers]
                compiled.kernel.dispatch(thread_grid(count), **dict(zip(names, pointers)), **scalar_args)

        return run


launches_per_gpu: collections.Counter[int] = collections.Counter()
"""Kernels the ``"slangpy"`` route has launched on each CUDA GPU (by ordinal) in this process: what
shows, on several GPUs, that each buffer went to the SlangPy device of the GPU holding it."""


class ZeroCopyLauncher(_CallbackLauncher):
    """Runs kernels on XLA's CUDA buffers in place, on XLA's stream.

    Each GPU has its own SlangPy CUDA device (sharing JAX's context on that GPU); a launch uses the
    device of the GPU that holds its buffers, so that under ``shard_map`` every GPU runs its own
    shard. The kernel is compiled at lowering on GPU 0 (so compile errors surface at trace time)
    and on first use on any other GPU.
    """

    name = "slangpy"

    def __init__(self, kind: DeviceKind):
        self.kind = kind

    def callback(self, spec: KernelSpec, scalars: Scalars, count: int, aliases: Aliases) -> BufferCallback:
        first = get_device(self.kind, 0)
        with current_cuda_context(first):
            compiled = {0: compile_kernel(first, spec)}
        names = [name for name, _ in compiled[0].parameters.pointers]
        scalar_args = dict(scalars)
        aliased = {result for _, result in aliases}

        def run(ctx, outs: Sequence, *ins) -> None:
            fresh = [b for k, b in enumerate(outs) if k not in aliased]
            pointers = [b.__cuda_array_interface__["data"][0] for b in (*ins, *fresh)]
            ordinal = cuda_device_ordinal(pointers[0]) if pointers else 0
            device = get_device(self.kind, ordinal)
            with current_cuda_context(device):
                if ordinal not in compiled:
                    compiled[ordinal] = compile_kernel(device, spec)
                with _explained_device_errors(device, spec):
                    compiled[ordinal].kernel.dispatch(
                        thread_grid(count),
                        cuda_stream=spy.NativeHandle.from_cuda_stream(ctx.stream),
                        **dict(zip(names, pointers)),
                        **scalar_args,
                    )
            launches_per_gpu[ordinal] += 1

        return run


@functools.cache
def _cuda_driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def cuda_device_ordinal(pointer: int) -> int:
    """The ordinal of the GPU whose memory holds device ``pointer`` (CUDA driver API)."""
    ordinal = ctypes.c_int(-1)
    status = _cuda_driver().cuPointerGetAttribute(
        ctypes.byref(ordinal), _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ctypes.c_uint64(pointer)
    )
    if status != 0:
        raise RuntimeError(f"slax: cuPointerGetAttribute failed (CUresult {status}) for buffer {pointer:#x}.")
    return ordinal.value


_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


@contextlib.contextmanager
def current_cuda_context(device: spy.Device) -> Iterator[None]:
    """Makes ``device``'s CUDA context current on this thread for the block.

    SlangPy compiles and launches in whichever CUDA context the calling thread has current, and XLA
    calls a buffer callback on threads of its own, one per GPU. With two GPUs the SlangPy route
    aborted the process (slang-rhi's ``cuLaunchKernel``: CUDA_ERROR_INVALID_HANDLE) when
    ``polynomial.py --devices 2`` evaluated after training; with the device's context pushed around
    each compile and launch the same runs pass (BENCHMARKS.md, "Two GPUs"; a smaller reproduction,
    GPU 1's context current while compiling for GPU 0, did not abort either way, so the exact
    trigger is not pinned down). Each SlangPy device shares its GPU's primary context with JAX, so
    this is the context JAX's own work on that GPU uses.
    """
    context = next((h.value for h in device.native_handles if h.type == spy.NativeHandleType.CUcontext), None)
    if not context:
        yield
        return
    driver = _cuda_driver()
    status = driver.cuCtxPushCurrent_v2(ctypes.c_void_p(context))
    if status != 0:
        raise RuntimeError(
            f"slax: cuCtxPushCurrent failed (CUresult {status}) for {device.info.adapter_name}."
        )
    try:
        yield
    finally:
        driver.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))


@contextlib.contextmanager
def _explained_device_errors(device: spy.Device, spec: KernelSpec):
    """A failing dispatch (device lost, driver reset, out of memory) reaches JAX as a runtime error;
    say which kernel on which device failed and what to do, with SlangPy's own message."""
    try:
        yield
    except Exception as error:
        raise RuntimeError(
            f"slax: running Slang kernel {spec.entry!r} on {device.info.api_name} device "
            f"{device.info.adapter_name!r} failed: {error}. If the device was lost (driver reset, "
            "GPU removed or out of memory), its state cannot be recovered in this process: restart "
            "the process (a training run resumes from its last saved state)."
        ) from error


def _host_array(buffer, role: str) -> np.ndarray:
    array = np.asarray(buffer)
    if not array.flags.c_contiguous:
        raise ValueError(
            f"slax: XLA handed a non-contiguous {role} buffer of shape {array.shape} with strides "
            f"{array.strides}; slax kernels read row-major data. Pass arrays with the default layout."
        )
    return array
