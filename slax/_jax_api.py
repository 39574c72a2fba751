"""The JAX API slax uses beyond JAX's stable public surface, in one module.

slax declares primitives (their impl, JVP, transpose, batching and dead-code rules), lowers kernel
launches to XLA custom calls through JAX's FFI lowering, runs SlangPy inside
``jax.experimental.buffer_callback``, serialises launches for jaxlib's Triton kernel launcher, and
keys JAX's caches by its launch routes per thread (``TraceState``).
Those names live in JAX's internal, ``jax.interpreters``/``jax.extend`` or experimental namespaces,
which move between releases. Every one of them is resolved here, and only here, from the dotted path
in :data:`PRIVATE_API`, so that:

- importing slax under a JAX that moved one fails at once with an ``ImportError`` naming the API, the
  JAX version and the versions slax supports, not with an ``AttributeError`` deep in a trace;
- ``tests/test_jax_api.py`` resolves each entry by name (a test per API), on every JAX release CI
  runs, and fails naming the one that moved.

jaxlib's Triton launcher ships only with jaxlib's CUDA plugin, so :func:`gpu_triton` resolves it when
the PTX route first needs it, not at import.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import jax

SUPPORTED_JAX = "0.10.2 to 0.12.x"
"""The JAX releases slax is tested with (``pyproject.toml``'s range; CI runs the oldest and the
newest, the GPU sessions the GPU machine's 0.11.2)."""

PRIVATE_API: dict[str, str] = {
    "Primitive": "jax.extend.core.Primitive",
    "apply_primitive": "jax._src.dispatch.apply_primitive",
    "dce_rules": "jax._src.interpreters.partial_eval.dce_rules",
    "primitive_jvps": "jax.interpreters.ad.primitive_jvps",
    "primitive_transposes": "jax.interpreters.ad.primitive_transposes",
    "Zero": "jax.interpreters.ad.Zero",
    "instantiate_zeros": "jax.interpreters.ad.instantiate_zeros",
    "is_undefined_primal": "jax.interpreters.ad.is_undefined_primal",
    "primitive_batchers": "jax.interpreters.batching.primitive_batchers",
    "register_lowering": "jax.interpreters.mlir.register_lowering",
    "lower_fun": "jax.interpreters.mlir.lower_fun",
    "LoweringRuleContext.replace": "jax.interpreters.mlir.LoweringRuleContext.replace",
    "ffi_lowering": "jax.ffi.ffi_lowering",
    "buffer_callback": "jax.experimental.buffer_callback.buffer_callback",
    "TraceState": "jax._src.config.config_ext.Config",
    "trace_state_unset": "jax._src.config.config_ext.unset",
    "get_axis_env": "jax._src.core.get_axis_env",
}
"""slax's name for each API -> where JAX keeps it."""

GPU_TRITON_API = (
    "jax._src.lib.gpu_triton.TritonKernel",
    "jax._src.lib.gpu_triton.TritonKernelCall",
    "jax._src.lib.gpu_triton.create_array_parameter",
    "jax._src.lib.gpu_triton.create_scalar_parameter",
    "jax._src.lib.gpu_triton.get_compute_capability",
)
"""What the PTX route asks of jaxlib's Triton kernel launcher (with jaxlib's CUDA plugin only)."""


class JaxApiMovedError(ImportError):
    """An API slax needs is not where this JAX release keeps it."""


def resolve(path: str) -> Any:
    """The object at dotted ``path`` (``package.module.attribute[.attribute]``), importing the
    longest importable module prefix; raises :class:`JaxApiMovedError` naming ``path`` if absent."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                found = getattr(found, attribute)
        except AttributeError:
            break
        return found
    raise JaxApiMovedError(
        f"slax: JAX {jax.__version__} has no {path}, which slax uses; slax supports JAX "
        f"{SUPPORTED_JAX} (pip install 'jax>=0.10.2,<0.13'). If a newer JAX moved it, "
        "slax/_jax_api.py is the one place to change."
    )


Primitive = resolve(PRIVATE_API["Primitive"])
apply_primitive = resolve(PRIVATE_API["apply_primitive"])
_dce_rules = resolve(PRIVATE_API["dce_rules"])
primitive_jvps = resolve(PRIVATE_API["primitive_jvps"])
primitive_transposes = resolve(PRIVATE_API["primitive_transposes"])
Zero = resolve(PRIVATE_API["Zero"])
instantiate_zeros = resolve(PRIVATE_API["instantiate_zeros"])
is_undefined_primal = resolve(PRIVATE_API["is_undefined_primal"])
primitive_batchers = resolve(PRIVATE_API["primitive_batchers"])
register_lowering = resolve(PRIVATE_API["register_lowering"])
lower_fun = resolve(PRIVATE_API["lower_fun"])
resolve(PRIVATE_API["LoweringRuleContext.replace"])  # ctx.replace(avals_out=...): the PTX launcher
ffi_lowering = resolve(PRIVATE_API["ffi_lowering"])
buffer_callback = resolve(PRIVATE_API["buffer_callback"])
TraceState = resolve(PRIVATE_API["TraceState"])
"""A value JAX keys its caches by (as ``jax.make_user_context``'s), with a global value and a value
per thread, set and cleared one by one (``set_local(trace_state_unset)``)."""
trace_state_unset = resolve(PRIVATE_API["trace_state_unset"])
_get_axis_env = resolve(PRIVATE_API["get_axis_env"])


def gpu_triton() -> Any | None:
    """jaxlib's Triton kernel launcher module (``jax._src.lib.gpu_triton``) with every name in
    :data:`GPU_TRITON_API` present, or None where jaxlib's CUDA plugin, which provides the
    launcher, is not installed; raises :class:`JaxApiMovedError` naming an API a release moved."""
    module = resolve("jax._src.lib.gpu_triton")
    if not hasattr(module, "TritonKernelCall"):
        return None
    for path in GPU_TRITON_API:
        resolve(path)
    return module


def lowering_for_export(ctx) -> bool:
    """Whether the lowering rule's ``ctx`` lowers for ``jax.export`` (whose module is serialised),
    not for a compile in this process (``ctx.module_context.lowering_parameters.for_export``)."""
    return bool(getattr(ctx.module_context.lowering_parameters, "for_export", False))


def register_dce_rule(primitive, rule: Callable[[list[bool], Any], tuple[list[bool], Any]]) -> None:
    """Registers ``rule(used_outputs, equation) -> (used_inputs, new equation or None)`` as
    ``primitive``'s dead-code elimination rule. JAX 0.12 calls such rules with the equation's live
    inputs between the two (for effects on references, which no slax primitive has); the equation
    comes last on every release."""
    _dce_rules[primitive] = lambda used_outputs, *live_inputs_and_equation: rule(
        used_outputs, live_inputs_and_equation[-1]
    )


def varying_axes(aval) -> frozenset:
    """The manual mesh axes an aval varies over inside ``jax.shard_map`` (JAX 0.10 keeps them in
    ``aval.manual_axis_type.varying``, later releases in ``aval.vma``)."""
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(getattr(mat, "varying", None) or getattr(aval, "vma", None) or ())


def partitioned_devices(ctx) -> int:
    """How many devices XLA's partitioner splits the computation a lowering rule (``ctx``) is in
    over: 1 outside any mesh or inside ``shard_map`` over all its axes (the axis context of
    ``ctx.module_context``: ``num_devices`` for a replicated one, the mesh less its manual axes
    for a sharding one)."""
    axis_context = ctx.module_context.axis_context
    devices = getattr(axis_context, "num_devices", 1)
    mesh = getattr(axis_context, "mesh", None)
    if mesh is not None:
        manual = set(getattr(axis_context, "manual_axes", ()))
        devices = math.prod(size for name, size in mesh.shape.items() if name not in manual)
    return devices


def program_devices(ctx) -> int:
    """How many devices the program a lowering rule (``ctx``) is in is compiled for: its module's
    ``mhlo.num_partitions``, which ``jax.jit`` sets from its arguments' devices, the context mesh
    and the concrete meshes in the program before it lowers any equation."""
    return int(ctx.module_context.module.operation.attributes["mhlo.num_partitions"].value)


def manual_mesh_devices(ctx) -> int:
    """How many devices the mesh of the ``jax.shard_map`` a lowering rule (``ctx``) is in spans
    (1 outside any): the mesh of the axis context of ``ctx.module_context`` with manual axes."""
    axis_context = ctx.module_context.axis_context
    if not getattr(axis_context, "manual_axes", None):
        return 1
    return math.prod(axis_context.mesh.shape.values())


def vmapped_mesh_axes() -> frozenset:
    """The explicit mesh axes that the vmaps being traced map over (``jax.vmap`` over an axis
    sharded along them, explicit sharding): ``jax.shard_map`` may not name them."""
    return frozenset(_get_axis_env().explicit_mesh_axis_names)
