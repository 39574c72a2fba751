"""The PTX launch route on CUDA (:class:`PtxLauncher`): a slax kernel compiled by Slang to PTX,
launched by XLA itself.

The default CUDA route. The SlangPy route (:class:`slax._bridge.ZeroCopyLauncher`) calls back into
Python on every launch so that SlangPy can dispatch (45-90 us a call on an H100, against ~15 us
here; BENCHMARKS.md). Here the kernel becomes a custom call that jaxlib's Triton
kernel launcher runs (the ``triton_kernel_call_ffi`` target that jax-triton and Pallas use): XLA
launches the PTX on its own stream, with its own buffers, on whichever GPU runs the computation,
and no Python runs per call.

It relies on the slax calling convention (``shaders/slax/kernel.slang``): an entry point whose
parameters are all uniform pointers and scalars compiles for CUDA to
``extern "C" __global__ void entry(T*..., scalars...)``, which the launcher fills with one array
parameter per buffer (operands, then fresh results) and one scalar parameter per scalar, in the
entry point's own order. The PTX's ``.entry`` signature is checked against that list before any
launch. A kernel outside the convention (thread groups not whole warps in x, scalars the launcher
cannot pass) runs on the SlangPy route instead, with a warning naming why, when it is lowered; one
whose PTX signature does not match fails at trace time, not with wrong numbers.

``jax.export`` serialises these custom calls, but refuses by default: JAX guarantees no stable format
for ``triton_kernel_call_ffi`` (:data:`PTX_LAUNCH_TARGET`), so an exported artifact runs only where
jaxlib reads the same serialised kernel call (the jaxlib that exported it), on a GPU of the compute
capability the PTX was built for or newer. Export with
``disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(PTX_LAUNCH_TARGET)]``.

jaxlib's Triton launcher is private JAX API; slax pins JAX to the versions it tested
(``pyproject.toml``) and tests this lowering on every version it supports (tests/test_ptx_launch.py).
Select the other route with ``slax.config.cuda_launch = "slangpy"`` or ``SLAX_CUDA_LAUNCH=slangpy``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import warnings
import zlib
from collections.abc import Sequence

from slax._compile import (
    ROW_THREADS,
    Aliases,
    EntryPointParameters,
    KernelSpec,
    Scalars,
    kernel_parameters,
    spec_content,
)
from slax._device import cuda_defines, reflection_device
from slax._jax_api import ffi_lowering, gpu_triton
from slax._ptx_compile import PtxCompileTimeout, compile_ptx
from slax._sources import require_unchanged, snapshot

WARP_SIZE = 32
PTX_LAUNCH_TARGET = "triton_kernel_call_ffi"
"""The custom call target the PTX route lowers each launch to: jaxlib's Triton kernel launcher."""
_TRITON_SCALAR_TYPE = {
    "float": "fp32",
    "double": "fp64",
    "int": "i32",
    "uint": "u32",
    "int64_t": "i64",
    "uint64_t": "u64",
}
"""Slang scalar type -> the launcher's scalar parameter type."""
_PTX_PARAM_TYPE = {
    "fp32": "f32",
    "fp64": "f64",
    "i32": "u32",
    "u32": "u32",
    "i64": "u64",
    "u64": "u64",
    "array": "u64",
}
"""The launcher's parameter type -> the ``.param`` type NVRTC gives it in the PTX entry signature
(NVRTC declares ``int`` as ``.u32``)."""


class PtxLaunchError(ValueError):
    """A kernel the PTX launch path cannot run (and why)."""


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """How to launch one kernel: its PTX, warps per group, groups, and parameters in order."""

    ptx: str
    num_warps: int
    grid: tuple[int, int, int]
    parameters: tuple[tuple[str, str, int | float | None], ...]
    """(name, launcher type or ``"array"``, scalar value or None) per kernel argument."""


def launch_plan(spec: KernelSpec, scalars: Sequence[tuple[str, int | float]], count: int) -> LaunchPlan:
    """The launch of ``spec`` with ``count`` threads and ``scalars`` by name; raises
    :class:`PtxLaunchError` for kernels outside the calling convention."""
    entry = kernel_parameters(reflection_device(), spec)
    group_x, group_y, group_z = entry.thread_group_size
    if group_y != 1 or group_z != 1 or group_x % WARP_SIZE or group_x > 1024:
        raise PtxLaunchError(
            f"slax: kernel {spec.entry!r} has [numthreads({group_x}, {group_y}, {group_z})]; the PTX "
            f"launch path runs thread groups of whole warps in x only: numthreads(32*k, 1, 1), "
            "k <= 32. Use the SlangPy launch (slax.config.cuda_launch = 'slangpy')."
        )
    arguments = _arguments(spec, entry, dict(scalars))
    expected = tuple(_PTX_PARAM_TYPE[kind] for _, kind, _ in arguments)
    ptx = _checked_ptx(spec, spec_content(spec), expected)
    rows = max(1, math.ceil(count / ROW_THREADS))
    grid = (math.ceil(min(count, ROW_THREADS) / group_x), rows, 1)
    return LaunchPlan(ptx, group_x // WARP_SIZE, grid, arguments)


def _arguments(spec: KernelSpec, entry: EntryPointParameters, values: dict) -> tuple:
    pointers = dict(entry.pointers)
    scalar_types = dict(entry.scalars)
    arguments: list[tuple[str, str, int | float | None]] = []
    for name in entry.order:
        if name in pointers:
            arguments.append((name, "array", None))
            continue
        launcher_type = _TRITON_SCALAR_TYPE.get(scalar_types[name])
        if launcher_type is None:
            raise PtxLaunchError(
                f"slax: kernel {spec.entry!r} scalar {name!r} has Slang type {scalar_types[name]!r}, "
                f"which the PTX launch path cannot pass; use one of {sorted(_TRITON_SCALAR_TYPE)}."
            )
        value = float(values[name]) if launcher_type.startswith("fp") else int(values[name])
        arguments.append((name, launcher_type, value))
    return tuple(arguments)


_timed_out: dict[str, str] = {}
"""Content keys whose PTX compile ran past the time limit, with the message."""


@functools.cache
def _checked_ptx(spec: KernelSpec, content: str, expected: tuple[str, ...]) -> str:
    """``spec``'s PTX, compiled once per ``content`` (its Slang code's content key), after checking
    its entry signature is ``expected``."""
    # The module's files as they were loaded: from disk, or from a snapshot of them once edited.
    kept = snapshot(content)
    if content in _timed_out:
        raise PtxLaunchError(_timed_out[content])
    try:
        ptx = compile_ptx(spec, content, kept, _compile_defines())
    except PtxCompileTimeout as timeout:  # kept, so later lowerings fall back at once
        _timed_out[content] = str(timeout)
        raise PtxLaunchError(str(timeout)) from None
    if kept is None:  # Slang read the files on disk just now: they must still be those of ``content``.
        require_unchanged(content, f"the Slang module of kernel {spec.entry!r}")
    found = tuple(ptx_entry_parameter_types(ptx, spec.entry))
    if found != expected:
        raise PtxLaunchError(
            f"slax: the PTX of kernel {spec.entry!r} takes parameters {list(found)}, but its uniform "
            f"parameters call for {list(expected)}. Kernels for the PTX launch path take uniform "
            "pointers and scalars only (no global shader parameters); see shaders/slax/kernel.slang."
        )
    return ptx


def _compile_defines() -> dict[str, str]:
    """The macros a kernel's Slang is compiled with for the GPU it will run on
    (:func:`slax._device.cuda_defines`); none where this process sees no GPU and was not told one
    (its PTX then uses no instruction newer than its code asks for)."""
    try:
        return cuda_defines(compute_capability())
    except (PtxLaunchError, RuntimeError):
        return {}


def ptx_entry_parameter_types(ptx: str, entry: str) -> list[str]:
    """The ``.param`` types of ``.entry entry(...)`` in ``ptx``, in order."""
    match = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\(([^)]*)\)", ptx)
    if match is None:
        raise PtxLaunchError(f"slax: the PTX Slang produced has no entry point {entry!r}.")
    return re.findall(r"\.param\s+\.(\w+)", match.group(1))


def compute_capability() -> int:
    """The GPU's compute capability as the launcher wants it (90 for sm_90): from
    ``SLAX_CUDA_COMPUTE_CAPABILITY`` when set (to lower for a GPU this process does not see; ``90``
    or ``9.0``), else from GPU 0."""
    explicit = os.environ.get("SLAX_CUDA_COMPUTE_CAPABILITY", "").strip()
    if explicit:
        match = re.fullmatch(r"(\d+)(?:\.(\d))?", explicit)
        if match is None or int(match[1]) == 0:
            raise ValueError(
                f"slax: SLAX_CUDA_COMPUTE_CAPABILITY={explicit!r} is no compute capability; give it as "
                "JAX spells it (9.0) or as the launcher does (90), or leave it unset to ask GPU 0."
            )
        return int(match[1]) * 10 + int(match[2]) if match[2] else int(match[1])
    return int(_gpu_triton().get_compute_capability(0))


def _gpu_triton():
    triton = gpu_triton()
    if triton is None:
        raise PtxLaunchError(
            "slax: the PTX launch path needs jaxlib's CUDA plugin (pip install 'jax[cuda12]'), "
            "which provides the Triton kernel launcher; it is not installed."
        )
    return triton


def kernel_call_opaque(spec: KernelSpec, plan: LaunchPlan) -> bytes:
    """The serialised kernel call that ``triton_kernel_call_ffi`` runs."""
    triton = _gpu_triton()
    kernel = triton.TritonKernel(spec.entry, plan.num_warps, 1, 0, plan.ptx, "", compute_capability())
    parameters = [
        triton.create_array_parameter(0, 16)
        if kind == "array"
        else triton.create_scalar_parameter(value, kind)
        for _, kind, value in plan.parameters
    ]
    call = triton.TritonKernelCall(kernel, *plan.grid, parameters)
    return zlib.compress(call.to_proto(spec.entry, b""))


class PtxLauncher:
    """Lowers a launch to a ``triton_kernel_call_ffi`` custom call (route ``"ptx"``); a kernel the
    launcher cannot run goes to ``fallback`` (the SlangPy route), with a warning."""

    name = "ptx"

    def __init__(self, fallback):
        self.fallback = fallback

    def lower(self, ctx, operands, *, spec: KernelSpec, scalars: Scalars, count: int, aliases: Aliases):
        """The launcher hands array parameters the custom call's buffers in order, operands then
        results. A result updated in place has no pointer of its own, so the custom call returns
        the fresh results first and the in-place ones after them (never read by the kernel), then
        the lowering puts them back in the primitive's order."""
        in_place = {result: operand for operand, result in aliases}
        try:
            plan = launch_plan(spec, scalars, count)
        except PtxLaunchError as refusal:
            warnings.warn(f"{refusal} It runs on the SlangPy route instead.", stacklevel=2)
            return self.fallback.lower(
                ctx, operands, spec=spec, scalars=scalars, count=count, aliases=aliases
            )
        order = [k for k in range(len(ctx.avals_out)) if k not in in_place] + sorted(in_place)
        call_ctx = ctx.replace(avals_out=[ctx.avals_out[k] for k in order])
        lowering = ffi_lowering(
            PTX_LAUNCH_TARGET,
            api_version=4,
            operand_output_aliases={
                in_place[k]: position for position, k in enumerate(order) if k in in_place
            },
        )
        outputs = lowering(call_ctx, *operands, opaque=kernel_call_opaque(spec, plan))
        by_result = dict(zip(order, outputs))
        return [by_result[k] for k in range(len(ctx.avals_out))]
