"""A Slang function over a grid as JAX primitives, and the rules that differentiate it.

``slang_call_p`` calls the function, ``slang_tangent_p`` runs its ``fwd_diff`` (linear in the
tangents) and ``slang_cotangent_p`` its ``bwd_diff``. ``slang_call_p``'s JVP emits
``slang_tangent_p``, whose transpose emits ``slang_cotangent_p``, so ``jax.jvp`` runs forward mode
and ``jax.grad`` reverse mode through Slang's own derivatives, as JAX's ``lax`` primitives do. Under
``jax.vmap`` the mapped axis becomes a leading axis of the same grid: one launch. Each lowers to a
generated kernel (``slax/_codegen.py``) run by ``slang_kernel_p``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from slax._codegen import (
    Broadcast,
    KernelNames,
    Mode,
    ResultSlot,
    input_differentiable,
    kernel_source,
    operand_leaves,
    output_differentiable,
    result_slots,
)
from slax._compile import KernelSpec
from slax._config import LaunchRoutes
from slax._jax_api import Zero, instantiate_zeros, is_undefined_primal, lower_fun
from slax._kernel_primitive import run_kernel
from slax._primitive import check_finite, declare_primitive, result_aval
from slax._signature import Leaf, Signature


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


def _grid_of(operands_shapes, leaves: list[Leaf]) -> tuple[int, ...]:
    grids = [shape[: len(shape) - len(leaf.shape)] for shape, leaf in zip(operands_shapes, leaves)]
    return tuple(np.broadcast_shapes(*grids)) if grids else ()


def _result_shapes(operand_shapes, signature: Signature, mode: Mode) -> list[tuple[int, ...]]:
    """Each result's shape: dense over the grid, or as :class:`ResultSlot` says."""
    grid = _grid_of(operand_shapes, operand_leaves(signature, mode))

    def shape(slot: ResultSlot) -> tuple[int, ...]:
        if slot.like_operand is not None:
            return tuple(operand_shapes[slot.like_operand])
        return slot.leaf.shape if slot.scratch else grid + slot.leaf.shape

    return [shape(slot) for slot in result_slots(signature, mode)]


def _abstract_eval(*operands, function: FunctionSpec, routes: LaunchRoutes, mode: Mode):
    shapes = _result_shapes([o.shape for o in operands], function.signature, mode)
    slots = result_slots(function.signature, mode)
    return [result_aval(shape, slot.leaf.dtype, operands) for shape, slot in zip(shapes, slots)]


@functools.cache
def _function_kernel(function: FunctionSpec, mode: Mode, broadcast: Broadcast) -> KernelSpec:
    source = kernel_source(function.path, function.signature, mode, broadcast, function.names)
    entry = function.names.entry(function.signature, mode)
    return KernelSpec(entry, path=function.path, source=source, content=function.content)


def _run_function(*operands, function: FunctionSpec, routes: LaunchRoutes, mode: Mode):
    _require_mode(function, mode)
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
    slots = result_slots(function.signature, mode)
    shapes = _result_shapes([o.shape for o in operands], function.signature, mode)
    results = tuple((shape, slot.leaf.dtype) for shape, slot in zip(shapes, slots))
    aliases = tuple(
        (slot.like_operand, k)
        for k, slot in enumerate(slots)
        if slot.like_operand is not None and slot.aliased
    )
    spec = _function_kernel(function, mode, tuple(broadcast))
    return run_kernel(spec, operands, results, count, scalars, aliases, routes=routes)


def _batch_as_grid_axis(primitive, args, dims, *, function: FunctionSpec, routes: LaunchRoutes):
    """Batches by turning the vmapped axis into a leading grid axis of the same kernel."""
    mode = _MODES[primitive]
    leaves = operand_leaves(function.signature, mode)
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    rank = max(
        (a.ndim - (d is not None) - len(leaf.shape) for a, d, leaf in zip(args, dims, leaves)),
        default=0,
    )
    # A buffer the kernel writes in place (a written tensor, a gradient buffer) is one per example.
    in_place = {slot.like_operand for slot in result_slots(function.signature, mode) if slot.aliased}
    moved = []
    for k, (arg, dim, leaf) in enumerate(zip(args, dims, leaves)):
        if dim is None and k in in_place:
            arg, dim = jnp.broadcast_to(arg, (size, *arg.shape)), 0
        if dim is None:
            moved.append(arg)
            continue
        arg = jnp.moveaxis(arg, dim, 0)
        own_rank = arg.ndim - 1 - len(leaf.shape)
        moved.append(arg.reshape((size,) + (1,) * (rank - own_rank) + arg.shape[1:]))
    outputs = primitive.bind(*moved, function=function, routes=routes)
    slots = result_slots(function.signature, mode)
    # A result shaped as an operand (a tensor's) is shaped as that operand per example.
    outputs = [
        out.reshape((size, *_unbatched_shape(args[slot.like_operand], dims[slot.like_operand])))
        if slot.like_operand is not None
        else out
        for out, slot in zip(outputs, slots)
    ]
    return outputs, [None if slot.scratch else 0 for slot in slots]


def _unbatched_shape(arg, dim) -> tuple[int, ...]:
    shape = tuple(arg.shape)
    return shape if dim is None else shape[:dim] + shape[dim + 1 :]


# --- differentiation ------------------------------------------------------------------------------


def _differentiable_mask(values, takes_part) -> list[bool]:
    """Per leaf of ``values``: does it take part in differentiation (its kernel operand or result)?
    ``takes_part``: :func:`input_differentiable` or :func:`output_differentiable`."""
    return [takes_part(value) and leaf.differentiable for value in values for leaf in value.leaves]


def _num_primals(function: FunctionSpec) -> int:
    return sum(len(v.leaves) for v in function.signature.inputs)


def _require_differentiable(function: FunctionSpec) -> None:
    """Raises unless Slang differentiates the function and each struct's derivatives map to JAX's."""
    signature = function.signature
    if not signature.differentiable:
        raise TypeError(
            f"slax: Slang function {function.name!r} is not differentiable; mark it "
            "[Differentiable] in Slang (or declare a derivative for it) to take its derivatives "
            "with jax.grad/jax.jvp."
        )
    head = (signature.result,) if signature.result is not None else ()
    unmapped = [value for value in head + signature.params if value.unmapped_differential]
    if unmapped:
        raise TypeError(
            f"slax: cannot differentiate Slang function {function.name!r}: "
            + "; ".join(
                f"{v.name!r} is the struct {v.slang_type!r}, and {v.unmapped_differential}" for v in unmapped
            )
            + ". JAX's tangent of a struct is a dict of its fields, so each member of the Differential "
            "needs the field it belongs to: give it one with [DerivativeMember(...)] on that field, or "
            "remove the member."
        )


def _require_mode(function: FunctionSpec, mode: Mode) -> None:
    """Raises, before any kernel is written, where Slang has no derivative of the function in
    ``mode``: it would fail to compile ``fwd_diff``/``bwd_diff`` with a message about neither."""
    name = function.name
    if mode is Mode.COTANGENT and not function.signature.backward:
        raise TypeError(
            f"slax: Slang function {name!r} has forward-mode derivatives only (it is "
            "[ForwardDifferentiable], or has only a custom forward derivative): jax.jvp and "
            "jax.jacfwd work, while jax.grad, jax.vjp and jax.jacrev need its bwd_diff. Mark it "
            f"[Differentiable], or declare a backward derivative for it ([BackwardDerivative(g)] "
            f"on it, or [BackwardDerivativeOf({name})] on g)."
        )
    tensors = [value.name for value in function.signature.params if value.tensor is not None]
    if mode is Mode.TANGENT and tensors:
        raise NotImplementedError(
            f"slax: Slang function {name!r} takes tensor parameter(s) {', '.join(map(repr, tensors))}, "
            "and forward mode (jax.jvp, jax.jacfwd) through tensors is not supported: SlangPy's tensor "
            "loads and stores have backward derivatives only (their fwd_diff carries no tangent), so "
            "slax would return zeros. jax.grad, jax.vjp and jax.jacrev work; for a Jacobian-vector "
            "product, differentiate a pure-JAX twin, or pass the values element-wise."
        )
    if mode is Mode.TANGENT and not function.signature.forward:
        raise TypeError(
            f"slax: Slang function {name!r} has reverse-mode derivatives only (a custom backward "
            "derivative and no forward one): jax.grad, jax.vjp and jax.jacrev work, while jax.jvp "
            "and jax.jacfwd need its fwd_diff. Mark it [Differentiable], or declare a forward "
            f"derivative for it ([ForwardDerivative(g)] on it, or [ForwardDerivativeOf({name})] on g)."
        )


def _call_jvp(primals, tangents, *, function: FunctionSpec, routes: LaunchRoutes):
    _require_differentiable(function)
    outputs = slang_call_p.bind(*primals, function=function, routes=routes)
    mask = _differentiable_mask(function.signature.inputs, input_differentiable)
    live = [t for t, diff in zip(tangents, mask) if diff]
    out_mask = _differentiable_mask(function.signature.outputs, output_differentiable)
    if all(type(t) is Zero for t in live) or not any(out_mask):
        return outputs, [_zero_tangent(o) for o in outputs]
    live = [instantiate_zeros(t) for t in live]
    computed = slang_tangent_p.bind(*primals, *live, function=function, routes=routes)
    check_finite(
        f"fwd_diff of Slang function {function.name!r} ({function.path})", [*primals, *live], computed
    )
    diff_tangents = iter(computed)
    out_tangents = [next(diff_tangents) if diff else _zero_tangent(o) for o, diff in zip(outputs, out_mask)]
    return outputs, out_tangents


def _zero_tangent(primal) -> Zero:
    return Zero(jax.typeof(primal).to_tangent_aval())


def _tangent_transpose(cotangents, *operands, function: FunctionSpec, routes: LaunchRoutes):
    primals, tangents = operands[: _num_primals(function)], operands[_num_primals(function) :]
    if any(is_undefined_primal(p) for p in primals):
        raise NotImplementedError(
            f"slax: cannot transpose the derivative of {function.name!r} with respect to its "
            "primal inputs (a higher-order derivative that slax does not support)."
        )
    cotangents = [instantiate_zeros(ct) for ct in cotangents]
    buffers = _gradient_buffers(function, primals)
    grads = slang_cotangent_p.bind(*primals, *cotangents, *buffers, function=function, routes=routes)
    check_finite(
        f"bwd_diff of Slang function {function.name!r} ({function.path})", [*primals, *cotangents], grads
    )
    return [None] * len(primals) + [
        _sum_to_shape(g, t.aval.shape) if is_undefined_primal(t) else None for g, t in zip(grads, tangents)
    ]


def _gradient_buffers(function: FunctionSpec, primals) -> list[jax.Array]:
    """A zeroed gradient buffer per differentiable input tensor, shaped as its primal: its loads'
    backward adds into it (the cotangent kernel's last operands, updated in place)."""
    buffers, k = [], 0
    for value in function.signature.inputs:
        if value.tensor is not None and not value.tensor.written and input_differentiable(value):
            buffers.append(jnp.zeros_like(primals[k]))
        k += len(value.leaves)
    return buffers


def _sum_to_shape(grad: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Sums a full-grid gradient over the axes its operand was broadcast along."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra else grad
    axes = tuple(d for d, n in enumerate(shape) if n == 1 and grad.shape[d] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def _tangent_jvp(primals, tangents, *, function: FunctionSpec, routes: LaunchRoutes):
    what = "forward-over-forward (e.g. jax.jacfwd of jax.jvp)"
    return _linear_part_jvp(slang_tangent_p, what, primals, tangents, function, routes)


def _cotangent_jvp(primals, tangents, *, function: FunctionSpec, routes: LaunchRoutes):
    what = "derivatives of its gradient, e.g. jax.hessian or jax.jacrev(jax.grad(f))"
    return _linear_part_jvp(slang_cotangent_p, what, primals, tangents, function, routes)


def _linear_part_jvp(primitive, what, primals, tangents, function, routes):
    """A derivative primitive is linear in its tangent or cotangent operands, whose tangents it
    passes on; a tangent of its primal operands is a second derivative, which slax refuses."""
    num_primals = _num_primals(function)
    if any(type(t) is not Zero for t in tangents[:num_primals]):
        raise NotImplementedError(
            f"slax: second derivatives of Slang function {function.name!r} are not supported "
            f"({what}); slax differentiates Slang functions once, in either mode."
        )
    outputs = primitive.bind(*primals, function=function, routes=routes)
    linear = [instantiate_zeros(t) for t in tangents[num_primals:]]
    return outputs, primitive.bind(*primals[:num_primals], *linear, function=function, routes=routes)


def _no_reverse_over_reverse(cotangents, *operands, function: FunctionSpec, routes: LaunchRoutes):
    raise NotImplementedError(
        f"slax: second derivatives of Slang function {function.name!r} are not supported "
        "(reverse-over-reverse, e.g. jax.jacrev(jax.grad(f))); slax differentiates Slang functions "
        "once, in either mode."
    )


def _declare(name: str, mode: Mode, **rules):
    return declare_primitive(
        name,
        abstract_eval=functools.partial(_abstract_eval, mode=mode),
        lowering=lower_fun(functools.partial(_run_function, mode=mode), multiple_results=True),
        batching_rule=_batch_as_grid_axis,
        **rules,
    )


slang_call_p = _declare("slang_call", Mode.PRIMAL, jvp=_call_jvp)
slang_tangent_p = _declare("slang_tangent", Mode.TANGENT, jvp=_tangent_jvp, transpose=_tangent_transpose)
slang_cotangent_p = _declare(
    "slang_cotangent", Mode.COTANGENT, jvp=_cotangent_jvp, transpose=_no_reverse_over_reverse
)
_MODES = {slang_call_p: Mode.PRIMAL, slang_tangent_p: Mode.TANGENT, slang_cotangent_p: Mode.COTANGENT}
