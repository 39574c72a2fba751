"""The JAX primitives of slax and their rules.

- ``slang_kernel_p``: the bridge. Runs one compute kernel (slax calling convention) on its operands
  and returns fresh result arrays; lowered per platform to ``buffer_callback`` through a launcher.
- ``slang_call_p``, ``slang_tangent_p``, ``slang_cotangent_p``: a Slang function called over a grid,
  its ``fwd_diff`` (linear in the tangents) and its ``bwd_diff``. ``slang_call_p``'s JVP emits
  ``slang_tangent_p``, whose transpose emits ``slang_cotangent_p``, so ``jax.jvp`` runs forward mode
  and ``jax.grad`` reverse mode through Slang's own derivatives. Each lowers to ``slang_kernel_p``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import dispatch
from jax.experimental.buffer_callback import buffer_callback
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from slax._bridge import launcher_for
from slax._codegen import Broadcast, KernelNames, Mode, kernel_source, operand_leaves, result_leaves
from slax._compile import KernelSpec
from slax._config import config
from slax._ptx_launch import lower_kernel_call
from slax._signature import Leaf, Signature

# --- the bridge: one kernel launch ------------------------------------------------------------

slang_kernel_p = Primitive("slang_kernel")
slang_kernel_p.multiple_results = True
slang_kernel_p.def_impl(functools.partial(dispatch.apply_primitive, slang_kernel_p))


def result_aval(shape, dtype, operands) -> jax.core.ShapedArray:
    """An output aval of a slax primitive. Inside ``shard_map`` it varies over the mesh axes any
    operand varies over (``vma``), as an elementwise or per-sample kernel's results do."""
    avals = [o for o in operands if isinstance(o, jax.core.ShapedArray)]
    if not avals:
        return jax.core.ShapedArray(tuple(shape), np.dtype(dtype))
    template = max(avals, key=lambda a: len(_varying_axes(a)))
    sharding = jax.sharding.NamedSharding(template.sharding.mesh, jax.sharding.PartitionSpec())
    return template.update(shape=tuple(shape), dtype=np.dtype(dtype), weak_type=False, sharding=sharding)


def _varying_axes(aval) -> frozenset:
    """The manual mesh axes an aval varies over (JAX 0.10 keeps them in ``mat``, later in ``vma``)."""
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(getattr(mat, "varying", None) or getattr(aval, "vma", None) or ())


def vary_alike(operands):
    """``operands`` (a pytree), each leaf cast to vary over every manual mesh axis any leaf varies over.

    Inside ``jax.shard_map`` a replicated argument (weights, say) meets per-device data in a slax
    kernel. JAX's own primitives first cast it to varying (``jax.lax.pcast(..., to="varying")``),
    whose transpose sums the cotangent over the axis; slax's entry points do the same, so that
    ``jax.grad`` with respect to a replicated argument is the all-device sum, as for any JAX
    function, and custom VJPs return cotangents of their arguments' types.
    """
    leaves, tree = jax.tree.flatten(operands)
    varying = [_varying_axes(jax.typeof(leaf)) for leaf in leaves]
    axes = frozenset().union(*varying)
    if not axes:
        return operands
    cast = [
        jax.lax.pcast(leaf, tuple(sorted(axes - own, key=str)), to="varying") if axes - own else leaf
        for leaf, own in zip(leaves, varying)
    ]
    return jax.tree.unflatten(tree, cast)


def _kernel_abstract_eval(*operands, spec, results, scalars, count, aliases):
    del spec, scalars, count, aliases
    return [result_aval(shape, dtype, operands) for shape, dtype in results]


def _kernel_lowering(ctx, *operands, spec, results, scalars, count, aliases, platform):
    _require_one_device_per_kernel(ctx.module_context.axis_context, spec)
    if count == 0:
        return _lower_empty_launch(ctx, *operands, aliases=aliases)
    if platform == "cuda" and config.cuda_launch == "ptx":
        return lower_kernel_call(ctx, *operands, spec=spec, scalars=scalars, count=count, aliases=aliases)
    callback = launcher_for(platform).callback(spec, scalars, count, aliases)
    shapes = [jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for shape, dtype in results]
    run = buffer_callback(callback, shapes, input_output_aliases=dict(aliases))
    return mlir.lower_fun(lambda *args: run(*args), multiple_results=True)(ctx, *operands)


def _lower_empty_launch(ctx, *operands, aliases):
    """No threads, no launch, on every route: results updated in place are their operands
    unchanged, fresh results are zeros (never uninitialised memory)."""
    in_place = {result: operand for operand, result in aliases}
    avals = ctx.avals_out

    def unchanged_or_zero(*arrays):
        return [
            arrays[in_place[k]] if k in in_place else jnp.zeros(a.shape, a.dtype) for k, a in enumerate(avals)
        ]

    return mlir.lower_fun(unchanged_or_zero, multiple_results=True)(ctx, *operands)


def _require_one_device_per_kernel(axis_context, spec: KernelSpec) -> None:
    """XLA cannot split a Python callback over devices; under automatic (GSPMD) partitioning it
    would run the whole kernel on gathered data on every device. Refuse, and say what works."""
    devices = getattr(axis_context, "num_devices", 1)
    mesh = getattr(axis_context, "mesh", None)
    if mesh is not None:
        manual = set(getattr(axis_context, "manual_axes", ()))
        devices = math.prod(size for name, size in mesh.shape.items() if name not in manual)
    if devices > 1:
        raise ValueError(
            f"slax: the Slang kernel {spec.entry!r} is being partitioned automatically over {devices} "
            "devices (jax.jit with sharded inputs), which slax does not support; call it inside "
            "jax.shard_map so that each device runs it on its own shard (see "
            "slax.experiment.data_parallel), or place the inputs on one device."
        )


slang_kernel_p.def_abstract_eval(_kernel_abstract_eval)
for _platform in ("cpu", "cuda"):
    mlir.register_lowering(
        slang_kernel_p, functools.partial(_kernel_lowering, platform=_platform), platform=_platform
    )


def run_kernel(
    spec: KernelSpec,
    operands,
    results: tuple[tuple[tuple[int, ...], str], ...],
    count: int,
    scalars: tuple[tuple[str, int | float], ...] = (),
    aliases: tuple[tuple[int, int], ...] = (),
) -> list[jax.Array]:
    """Runs the kernel ``spec`` with ``count`` threads; returns arrays of shapes/dtypes ``results``.

    ``aliases`` pairs (operand index, result index): that result is the operand's buffer, which the
    kernel updates in place through the operand's pointer (the result gets no pointer of its own).
    """
    return slang_kernel_p.bind(
        *operands, spec=spec, results=results, scalars=scalars, count=count, aliases=aliases
    )


def check_finite(label: str, operands, outputs) -> None:
    """With ``slax.config.debug_nans`` (or ``jax_debug_nans``): raise at run time if ``outputs``
    hold NaN/Inf although all ``operands`` were finite. Called by every public entry point after
    binding its primitive, so eager calls see the current setting and jitted ones the setting at
    trace time."""
    if config.debug_nans or jax.config.jax_debug_nans:  # type: ignore[attr-defined]
        check = functools.partial(_raise_if_kernel_made_non_finite, label, len(operands))
        jax.debug.callback(check, *operands, *outputs)


def _raise_if_kernel_made_non_finite(label: str, num_operands: int, *arrays) -> None:
    """Raises if a result is NaN/Inf although every operand was finite (else it came from upstream)."""
    if not all(_finite(a) for a in arrays[:num_operands]):
        return
    for k, output in enumerate(arrays[num_operands:]):
        output = np.asarray(output)
        if not _finite(output):
            first = np.unravel_index(np.flatnonzero(~np.isfinite(output))[0], output.shape)
            raise FloatingPointError(
                f"slax: {label} produced a non-finite value ({output[first]}) in result {k} of "
                f"shape {output.shape}, first at index {tuple(int(i) for i in first)} "
                "(slax.config.debug_nans)."
            )


def _finite(array) -> bool:
    array = np.asarray(array)
    return not np.issubdtype(array.dtype, np.floating) or bool(np.all(np.isfinite(array)))


# --- a Slang function over a grid --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FunctionSpec:
    """A Slang function that primitives call.

    Attributes:
      path: its module file.
      signature: its array signature.
      content: the content key of the module as loaded (:mod:`slax._sources`): a primitive, and
        every cache of compiled code, tells an edited module's functions from the old ones by it.
      names: the identifiers its generated kernels declare (none of them the user's).
    """

    path: str
    signature: Signature
    content: str
    names: KernelNames = KernelNames()

    @property
    def name(self) -> str:
        return self.signature.name


slang_call_p = Primitive("slang_call")
slang_tangent_p = Primitive("slang_tangent")
slang_cotangent_p = Primitive("slang_cotangent")
_MODES = {
    slang_call_p: Mode.PRIMAL,
    slang_tangent_p: Mode.TANGENT,
    slang_cotangent_p: Mode.COTANGENT,
}


def _grid_of(operands_shapes, leaves: list[Leaf]) -> tuple[int, ...]:
    grids = [shape[: len(shape) - len(leaf.shape)] for shape, leaf in zip(operands_shapes, leaves)]
    return tuple(np.broadcast_shapes(*grids)) if grids else ()


def _function_abstract_eval(*operands, function: FunctionSpec, mode: Mode):
    grid = _grid_of([o.shape for o in operands], operand_leaves(function.signature, mode))
    return [
        result_aval(grid + leaf.shape, leaf.dtype, operands)
        for leaf in result_leaves(function.signature, mode)
    ]


@functools.cache
def _function_kernel(function: FunctionSpec, mode: Mode, broadcast: Broadcast) -> KernelSpec:
    source = kernel_source(function.path, function.signature, mode, broadcast, function.names)
    entry = function.names.entry(function.signature, mode)
    return KernelSpec(entry, path=function.path, source=source, content=function.content)


def _run_function(*operands, function: FunctionSpec, mode: Mode):
    leaves = operand_leaves(function.signature, mode)
    grid = _grid_of([o.shape for o in operands], leaves)
    broadcast = []
    for operand, leaf in zip(operands, leaves):
        own = operand.shape[: operand.ndim - len(leaf.shape)]
        own = (1,) * (len(grid) - len(own)) + tuple(own)
        broadcast.append(tuple(own[d] == 1 and grid[d] != 1 for d in range(len(grid))))
    names = function.names
    count = math.prod(grid)
    scalars = ((names.count, count), *((names.grid(d), n) for d, n in enumerate(grid)))
    results = tuple((grid + leaf.shape, leaf.dtype) for leaf in result_leaves(function.signature, mode))
    spec = _function_kernel(function, mode, tuple(broadcast))
    return run_kernel(spec, operands, results, count, scalars)


for _p, _mode in _MODES.items():
    _p.multiple_results = True
    _p.def_impl(functools.partial(dispatch.apply_primitive, _p))
    _p.def_abstract_eval(functools.partial(_function_abstract_eval, mode=_mode))
    mlir.register_lowering(
        _p, mlir.lower_fun(functools.partial(_run_function, mode=_mode), multiple_results=True)
    )


def _differentiable_mask(values) -> list[bool]:
    """Per leaf of ``values``: does it take part in differentiation (its kernel operand or result)?"""
    return [not value.no_diff and leaf.differentiable for value in values for leaf in value.leaves]


def _require_differentiable(function: FunctionSpec) -> None:
    if not function.signature.differentiable:
        raise TypeError(
            f"slax: Slang function {function.name!r} is not differentiable; mark it "
            "[Differentiable] in Slang to take its derivatives with jax.grad/jax.jvp."
        )


def _call_jvp(primals, tangents, *, function: FunctionSpec):
    _require_differentiable(function)
    outputs = slang_call_p.bind(*primals, function=function)
    mask = _differentiable_mask(function.signature.inputs)
    live = [t for t, diff in zip(tangents, mask) if diff]
    out_mask = _differentiable_mask(function.signature.outputs)
    if all(type(t) is ad.Zero for t in live) or not any(out_mask):
        return outputs, [_zero_tangent(o) for o in outputs]
    live = [ad.instantiate_zeros(t) for t in live]
    computed = slang_tangent_p.bind(*primals, *live, function=function)
    check_finite(
        f"fwd_diff of Slang function {function.name!r} ({function.path})", [*primals, *live], computed
    )
    diff_tangents = iter(computed)
    out_tangents = [next(diff_tangents) if diff else _zero_tangent(o) for o, diff in zip(outputs, out_mask)]
    return outputs, out_tangents


def _zero_tangent(primal) -> ad.Zero:
    return ad.Zero(jax.typeof(primal).to_tangent_aval())


def _tangent_transpose(cotangents, *operands, function: FunctionSpec):
    num_primals = sum(len(v.leaves) for v in function.signature.inputs)
    primals, tangents = operands[:num_primals], operands[num_primals:]
    if any(ad.is_undefined_primal(p) for p in primals):
        raise NotImplementedError(
            f"slax: cannot transpose the derivative of {function.name!r} with respect to its "
            "primal inputs (a higher-order derivative that slax does not support)."
        )
    cotangents = [ad.instantiate_zeros(ct) for ct in cotangents]
    grads = slang_cotangent_p.bind(*primals, *cotangents, function=function)
    check_finite(
        f"bwd_diff of Slang function {function.name!r} ({function.path})", [*primals, *cotangents], grads
    )
    return [None] * num_primals + [
        _sum_to_shape(g, t.aval.shape) if ad.is_undefined_primal(t) else None for g, t in zip(grads, tangents)
    ]


def _sum_to_shape(grad: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Sums a full-grid gradient over the axes its operand was broadcast along."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra else grad
    axes = tuple(d for d, n in enumerate(shape) if n == 1 and grad.shape[d] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def _tangent_jvp(primals, tangents, *, function: FunctionSpec):
    return _linear_part_jvp(
        slang_tangent_p,
        "forward-over-forward (e.g. jax.jacfwd of jax.jvp)",
        primals,
        tangents,
        function,
    )


def _cotangent_jvp(primals, tangents, *, function: FunctionSpec):
    return _linear_part_jvp(
        slang_cotangent_p,
        "derivatives of its gradient, e.g. jax.hessian or jax.jacrev(jax.grad(f))",
        primals,
        tangents,
        function,
    )


def _linear_part_jvp(primitive, what, primals, tangents, function):
    num_primals = sum(len(v.leaves) for v in function.signature.inputs)
    if any(type(t) is not ad.Zero for t in tangents[:num_primals]):
        raise NotImplementedError(
            f"slax: second derivatives of Slang function {function.name!r} are not supported "
            f"({what}); slax differentiates Slang functions once, in either mode."
        )
    outputs = primitive.bind(*primals, function=function)
    linear = [ad.instantiate_zeros(t) for t in tangents[num_primals:]]
    return outputs, primitive.bind(*primals[:num_primals], *linear, function=function)


def _no_reverse_over_reverse(cotangents, *operands, function: FunctionSpec):
    raise NotImplementedError(
        f"slax: second derivatives of Slang function {function.name!r} are not supported "
        "(reverse-over-reverse, e.g. jax.jacrev(jax.grad(f))); slax differentiates Slang functions "
        "once, in either mode."
    )


def _function_batch(primitive, args, dims, *, function: FunctionSpec):
    """Batches by turning the vmapped axis into a leading grid axis of the same kernel."""
    leaves = operand_leaves(function.signature, _MODES[primitive])
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    rank = max(
        (a.ndim - (d is not None) - len(leaf.shape) for a, d, leaf in zip(args, dims, leaves)),
        default=0,
    )
    moved = []
    for arg, dim, leaf in zip(args, dims, leaves):
        if dim is None:
            moved.append(arg)
            continue
        arg = jnp.moveaxis(arg, dim, 0)
        own_rank = arg.ndim - 1 - len(leaf.shape)
        moved.append(arg.reshape((size,) + (1,) * (rank - own_rank) + arg.shape[1:]))
    outputs = primitive.bind(*moved, function=function)
    return outputs, [0] * len(outputs)


ad.primitive_jvps[slang_call_p] = _call_jvp
ad.primitive_jvps[slang_tangent_p] = _tangent_jvp
ad.primitive_jvps[slang_cotangent_p] = _cotangent_jvp
ad.primitive_transposes[slang_tangent_p] = _tangent_transpose
ad.primitive_transposes[slang_cotangent_p] = _no_reverse_over_reverse
for _p in _MODES:
    batching.primitive_batchers[_p] = functools.partial(_function_batch, _p)
