"""A Slang function over a grid as JAX primitives, and the rules that differentiate it.

``slang_call_p`` calls the function, ``slang_tangent_p`` runs its ``fwd_diff`` (linear in the
tangents) and ``slang_cotangent_p`` its ``bwd_diff``. ``slang_call_p``'s JVP emits
``slang_tangent_p``, whose transpose emits ``slang_cotangent_p``, so ``jax.jvp`` runs forward mode
and ``jax.grad`` reverse mode through Slang's own derivatives, as JAX's ``lax`` primitives do.
Second derivatives close the same way: the JVPs of those two with respect to the primal inputs are
``slang_tangent_of_tangent_p`` and ``slang_tangent_of_cotangent_p``, each linear in its outer
tangents and transposing into the other and a first-order primitive (see "second derivatives"
below); a derivative of either with respect to its primal inputs, third order, is refused. Under
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
    keeps_fault_record,
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
from slax._signature import FAULT, Direction, Leaf, Signature


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


def check_bounds(function: FunctionSpec, operands, routes: LaunchRoutes) -> None:
    """``slax.config.debug_bounds``: runs the function once with every tensor index checked (its
    results dropped, no derivative) and raises ``IndexError`` when the call runs if an index fell
    outside its tensor, naming the function, the parameter, its shape and the index."""
    signature = dataclasses.replace(function.signature, bounds_checked=True)
    checked = dataclasses.replace(function, signature=signature)
    fault = jnp.zeros(FAULT.shape, jnp.uint32)
    record = slang_call_p.bind(
        *jax.lax.stop_gradient(list(operands)), fault, function=checked, routes=routes
    )[-1]
    _raise_on_fault(checked, record)


_DROPPED_TANGENT = 0xFFFFFFFF
"""The axis a fault record names for a load or store that dropped its tangent
(``SLAX_DROPPED_TANGENT`` in ``shaders/slax/tensor.slang``)."""


def _raise_on_fault(function: FunctionSpec, record) -> None:
    """Raises, when the kernel has run, the fault its record (:data:`FAULT`) holds, if any."""
    tensors = [value for value in function.signature.params if value.tensor is not None]
    jax.debug.callback(functools.partial(_raise_if_fault, function.name, tensors), record)


def _raise_if_fault(name: str, tensors, record) -> None:
    records = np.asarray(record).reshape(-1, FAULT.size)
    found = records[records[:, 0] != 0]
    if not len(found):
        return
    position, axis, index = (int(v) for v in found[0])
    value = tensors[position - 1]
    if axis == _DROPPED_TANGENT:
        raise NotImplementedError(
            f"slax: forward mode (jax.jvp, jax.jacfwd) through Slang function {name!r} would drop the "
            f"tangent of its tensor parameter {value.name!r} ({value.slang_type}): it indexes the "
            "tensor with SlangPy's rank-specific forms (x[i], w[i, j], x.load(i)), built on reads "
            "and writes SlangPy does not declare differentiable. Index it with one array or vector "
            "(int at[1] = { i }; x[at], or w[int2(j, i)]), whose load and store carry tangents; "
            "jax.grad, jax.vjp and jax.jacrev work either way."
        )
    shape = value.leaves[0].shape[: value.tensor.rank]
    raise IndexError(
        f"slax: Slang function {name!r} indexed its tensor parameter {value.name!r} (shape {shape}) "
        f"at {index if index < 2**31 else index - 2**32} on axis {axis}, which has {shape[axis]} "
        f"elements (valid: 0 to {shape[axis] - 1}) (slax.config.debug_bounds; without it the index "
        "is clamped to the axis's last element)."
    )


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
    if mode in (Mode.COTANGENT, Mode.TANGENT_OF_COTANGENT) and not function.signature.backward:
        raise TypeError(
            f"slax: Slang function {name!r} has forward-mode derivatives only (it is "
            "[ForwardDifferentiable], or has only a custom forward derivative): jax.jvp and "
            "jax.jacfwd work, while jax.grad, jax.vjp and jax.jacrev need its bwd_diff. Mark it "
            f"[Differentiable], or declare a backward derivative for it ([BackwardDerivative(g)] "
            f"on it, or [BackwardDerivativeOf({name})] on g)."
        )
    tensors = [value.name for value in function.signature.params if value.tensor is not None]
    if mode in (Mode.TANGENT_OF_TANGENT, Mode.TANGENT_OF_COTANGENT) and tensors:
        raise NotImplementedError(
            f"slax: second derivatives (jax.hessian, jax.jacfwd of jax.grad, jax.grad of jax.grad) of "
            f"Slang function {name!r} are not supported: it takes tensor parameter(s) "
            f"{', '.join(map(repr, tensors))}, and slax's second-order kernels nest fwd_diff, which "
            "would need a tangent of each tensor's tangent (and run once per input component: every "
            "element of a tensor). First derivatives work: jax.jvp, jax.jacfwd, jax.grad, jax.vjp, "
            "jax.jacrev."
        )
    if mode in (Mode.TANGENT_OF_TANGENT, Mode.TANGENT_OF_COTANGENT):
        _require_nested(function, mode)
    if mode in (Mode.TANGENT, Mode.TANGENT_OF_TANGENT) and not function.signature.forward:
        raise TypeError(
            f"slax: Slang function {name!r} has reverse-mode derivatives only (a custom backward "
            "derivative and no forward one): jax.grad, jax.vjp and jax.jacrev work, while jax.jvp "
            "and jax.jacfwd need its fwd_diff. Mark it [Differentiable], or declare a forward "
            f"derivative for it ([ForwardDerivative(g)] on it, or [ForwardDerivativeOf({name})] on g)."
        )


def _require_nested(function: FunctionSpec, mode: Mode) -> None:
    """Raises where Slang cannot nest ``fwd_diff(fwd_diff(f))``, which both second-order kernels
    run, or where it would differentiate something other than the derivatives the user declared."""
    name = function.name
    if mode is Mode.TANGENT_OF_COTANGENT and function.signature.custom_backward_only:
        raise TypeError(
            f"slax: Slang function {name!r} declares a backward derivative and no forward one, so "
            "Slang cannot take its second derivatives through the declared derivative: jax.hessian, "
            "jax.jvp of jax.grad and jax.grad of jax.grad run fwd_diff(fwd_diff(f)), which would "
            "differentiate its body instead. Declare a [Differentiable] forward derivative g for it "
            f"([ForwardDerivative(g)] on {name}, or [ForwardDerivativeOf({name})] on g), returning "
            "DifferentialPair(value, derivative)."
        )
    inout = [
        v.name
        for v in function.signature.params
        if v.direction is Direction.INOUT and v.differentiable and not v.no_diff
    ]
    if inout:
        raise TypeError(
            f"slax: second derivatives of Slang function {name!r} are not available: its "
            f"differentiable parameter(s) {', '.join(map(repr, inout))} are inout, and Slang "
            "2026.12 cannot nest fwd_diff through an inout parameter (an internal compiler error). "
            f"Take the value in and give the result out instead (a parameter {inout[0]!r} and an "
            f"'out' parameter, or the return value), in {name} and in what it calls."
        )
    if not function.signature.nested_forward:
        derivative = function.signature.forward_derivative
        raise TypeError(
            f"slax: second derivatives of Slang function {name!r} run fwd_diff({derivative}), of the "
            f"forward derivative declared for it, and Slang cannot differentiate {derivative!r}: "
            f"mark {derivative} [Differentiable] (or declare a forward derivative of its own for it)."
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
    diff_tangents = iter(_forward(function, routes, primals, live))
    out_tangents = [next(diff_tangents) if diff else _zero_tangent(o) for o, diff in zip(outputs, out_mask)]
    return outputs, out_tangents


def _zero_tangent(primal) -> Zero:
    return Zero(jax.typeof(primal).to_tangent_aval())


def _forward(function: FunctionSpec, routes: LaunchRoutes, primals, tangents) -> list:
    """``fwd_diff(f)`` at ``primals`` along ``tangents``: the tangents of the differentiable
    outputs. A function with differentiable tensors also passes a zeroed fault record, whose
    dropped tangent raises when the kernel has run (``keeps_fault_record``); it and the scratch
    results are dropped."""
    record = (
        [jnp.zeros(FAULT.shape, jnp.uint32)] if keeps_fault_record(function.signature, Mode.TANGENT) else []
    )
    outputs = slang_tangent_p.bind(*primals, *tangents, *record, function=function, routes=routes)
    if record:
        _raise_on_fault(function, outputs[-1])
    outputs = outputs[: _num_tangents(function)[1]]
    check_finite(
        f"fwd_diff of Slang function {function.name!r} ({function.path})", [*primals, *tangents], outputs
    )
    return outputs


def _num_tangents(function: FunctionSpec) -> tuple[int, int]:
    """How many tangent operands the forward-mode kernel takes and tangent results it gives, before
    its fault record (and its scratch results)."""
    signature = function.signature
    inputs = sum(_differentiable_mask(signature.inputs, input_differentiable))
    return inputs, sum(_differentiable_mask(signature.outputs, output_differentiable))


def _tangent_transpose(cotangents, *operands, function: FunctionSpec, routes: LaunchRoutes):
    n, (inputs, outputs) = _num_primals(function), _num_tangents(function)
    primals, tangents = operands[:n], operands[n : n + inputs]
    _require_linear_only_in(function, Mode.TANGENT, primals)
    cotangents = [instantiate_zeros(ct) for ct in cotangents[:outputs]]
    buffers = _gradient_buffers(function, primals)
    grads = _bind(slang_cotangent_p, function, routes, primals, [*cotangents, *buffers])
    return [None] * n + _sum_to_shapes(grads, tangents) + [None] * (len(operands) - n - inputs)


def _gradient_buffers(function: FunctionSpec, primals) -> list[jax.Array]:
    """A zeroed gradient buffer per differentiable input tensor, shaped as its primal: its loads'
    backward adds into it (the cotangent kernel's last operands, updated in place)."""
    buffers, k = [], 0
    for value in function.signature.inputs:
        if value.tensor is not None and not value.tensor.written and input_differentiable(value):
            buffers.append(jnp.zeros_like(primals[k]))
        k += len(value.leaves)
    return buffers


def _sum_to_shapes(grads, operands) -> list:
    """Each gradient summed to its linear operand's shape, or None where that operand is not
    one the transpose is taken with respect to."""
    return [
        _sum_to_shape(grad, operand.aval.shape) if is_undefined_primal(operand) else None
        for grad, operand in zip(grads, operands)
    ]


def _sum_to_shape(grad: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Sums a full-grid gradient over the axes its operand was broadcast along."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra else grad
    axes = tuple(d for d, n in enumerate(shape) if n == 1 and grad.shape[d] != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad


def _live_tangents(function: FunctionSpec, tangents) -> list | None:
    """The tangents of the differentiable primal input leaves (instantiated), or None where all
    are zero: then a first-derivative primitive's own tangent is linear, itself again."""
    mask = _differentiable_mask(function.signature.inputs, input_differentiable)
    live = [t for t, diff in zip(tangents, mask) if diff]
    if all(type(t) is Zero for t in live):
        return None
    return [instantiate_zeros(t) for t in live]


def _tangent_jvp(primals, tangents, *, function: FunctionSpec, routes: LaunchRoutes):
    """``fwd_diff(f)`` is linear in its tangents, whose own tangents pass through it; a tangent of
    its primal inputs makes the second tangent ``fwd_diff(fwd_diff(f))`` (forward over forward)."""
    n, (inputs, results) = _num_primals(function), _num_tangents(function)
    outputs = slang_tangent_p.bind(*primals, function=function, routes=routes)
    outer = _live_tangents(function, tangents[:n])
    inner = [instantiate_zeros(t) for t in tangents[n : n + inputs]]
    if outer is None:
        linear = _forward(function, routes, primals[:n], inner)
        return outputs, linear + [_zero_tangent(o) for o in outputs[results:]]
    _require_mode(function, Mode.TANGENT_OF_TANGENT)  # at trace time, before a kernel is written
    return outputs, _bind(slang_tangent_of_tangent_p, function, routes, primals, [*outer, *inner])


def _cotangent_jvp(primals, tangents, *, function: FunctionSpec, routes: LaunchRoutes):
    """``bwd_diff(f)`` is linear in its cotangents, whose tangents pass through it; a tangent of
    its primal inputs makes ``fwd_diff(bwd_diff(f))`` (forward over reverse: ``jax.hessian``)."""
    n = _num_primals(function)
    outputs = slang_cotangent_p.bind(*primals, function=function, routes=routes)
    outer = _live_tangents(function, tangents[:n])
    cotangent_tangents = [instantiate_zeros(t) for t in tangents[n:]]
    if outer is None:
        return outputs, _bind(slang_cotangent_p, function, routes, primals[:n], cotangent_tangents)
    _require_mode(function, Mode.TANGENT_OF_COTANGENT)  # at trace time, before a kernel is written
    both = [*outer, *cotangent_tangents]
    return outputs, _bind(slang_tangent_of_cotangent_p, function, routes, primals, both)


def _cotangent_transpose(cotangents, *operands, function: FunctionSpec, routes: LaunchRoutes):
    """``bwd_diff(f)`` is linear in its cotangents, and its transpose there is ``fwd_diff(f)``: the
    reverse over reverse of a loss whose cotangent of ``f`` depends on what the outer gradient is
    taken in (the parameters of a network behind ``f``, in an eikonal loss's gradient in x)."""
    n, (inputs, outputs) = _num_primals(function), _num_tangents(function)
    _require_linear_only_in(function, Mode.COTANGENT, operands[:n])
    tensors = [value.name for value in function.signature.params if value.tensor is not None]
    if tensors:
        raise NotImplementedError(
            f"slax: the transpose of bwd_diff of Slang function {function.name!r} in its cotangents "
            "(jax.grad of a loss holding jax.grad of it, where the cotangent depends on what the outer "
            "gradient is taken in) is not supported for functions of tensors: it takes "
            f"{', '.join(map(repr, tensors))}."
        )
    w = [instantiate_zeros(ct) for ct in cotangents[:inputs]]
    tangents = _forward(function, routes, operands[:n], w)
    return (
        [None] * n
        + _sum_to_shapes(tangents, operands[n : n + outputs])
        + [None] * (len(operands) - n - outputs)
    )


# --- second derivatives -----------------------------------------------------------------------------
#
# Both second-order primitives take fixed operands (the primal inputs ``x`` and an inner tangent
# ``dx`` or cotangent ``ct``) and are linear in the rest, their outer tangents:
#   fwd_diff(fwd_diff(f))(x, dx; ex, edx)  = f''[dx, ex] + f'[edx]
#   fwd_diff(bwd_diff(f))(x, ct; dx, dct)  = H(ct) dx + f'^T dct,   H(ct) the Hessian of ct . f
# so their transposes are first- and second-order kernels again, H(ct) being symmetric:
#   ex  <- H(w) dx  (fwd_diff(bwd_diff(f)) with cotangent w),  edx <- f'^T w  (bwd_diff(f));
#   dx  <- H(ct) w  (fwd_diff(bwd_diff(f)) with tangent w),    dct <- f' w    (fwd_diff(f)).
# The first gives reverse over forward (jax.jacrev(jax.jacfwd(f))), the second reverse over reverse
# (jax.grad of a function that calls jax.grad).


def _num_fixed(function: FunctionSpec, mode: Mode) -> int:
    """How many leading operands of a second-order primitive it is not linear in."""
    if mode is Mode.TANGENT_OF_TANGENT:
        inner = _differentiable_mask(function.signature.inputs, input_differentiable)
    else:
        inner = _differentiable_mask(function.signature.outputs, output_differentiable)
    return _num_primals(function) + sum(inner)


def _second_order_jvp(primals, tangents, *, function: FunctionSpec, routes: LaunchRoutes, mode: Mode):
    primitive = _PRIMITIVES[mode]
    fixed = _num_fixed(function, mode)
    if any(type(t) is not Zero for t in tangents[:fixed]):
        raise NotImplementedError(
            f"slax: derivatives of order 3 and beyond of Slang function {function.name!r} are not "
            f"supported: this one differentiates its second derivative ({_SLANG_FORM[mode]}) "
            "with respect to its primal inputs (or the cotangents or tangents it is taken along). "
            "slax takes Slang functions' derivatives up to second order: jax.hessian, "
            "jax.jacfwd(jax.jacfwd(f)), jax.jvp of jax.grad, jax.grad of a function calling jax.grad."
        )
    outputs = primitive.bind(*primals, function=function, routes=routes)
    linear = [instantiate_zeros(t) for t in tangents[fixed:]]
    return outputs, _bind(primitive, function, routes, primals[:fixed], linear)


def _tangent_of_tangent_transpose(cotangents, *operands, function: FunctionSpec, routes: LaunchRoutes):
    n, fixed = _num_primals(function), _num_fixed(function, Mode.TANGENT_OF_TANGENT)
    x, dx = operands[:n], operands[n:fixed]
    _require_linear_only_in(function, Mode.TANGENT_OF_TANGENT, operands[:fixed])
    ex, edx = operands[fixed : fixed + len(dx)], operands[fixed + len(dx) :]
    w = [instantiate_zeros(ct) for ct in cotangents]
    grads: list = [None] * fixed
    if any(is_undefined_primal(t) for t in ex):
        zeros = [jnp.zeros_like(c) for c in w]
        hessian_dx = _bind(slang_tangent_of_cotangent_p, function, routes, [*x, *w], [*dx, *zeros])
        grads += _sum_to_shapes(hessian_dx, ex)
    else:
        grads += [None] * len(ex)
    if any(is_undefined_primal(t) for t in edx):
        grads += _sum_to_shapes(_bind(slang_cotangent_p, function, routes, x, w), edx)
    else:
        grads += [None] * len(edx)
    return grads


def _tangent_of_cotangent_transpose(cotangents, *operands, function: FunctionSpec, routes: LaunchRoutes):
    n, fixed = _num_primals(function), _num_fixed(function, Mode.TANGENT_OF_COTANGENT)
    x = operands[:n]
    _require_linear_only_in(function, Mode.TANGENT_OF_COTANGENT, operands[:fixed])
    dx, dct = operands[fixed : fixed + len(cotangents)], operands[fixed + len(cotangents) :]
    w = [instantiate_zeros(ct) for ct in cotangents]
    grads: list = [None] * fixed
    if any(is_undefined_primal(t) for t in dx):
        zeros = [jnp.zeros_like(ct) for ct in operands[n:fixed]]
        hessian_w = _bind(slang_tangent_of_cotangent_p, function, routes, operands[:fixed], [*w, *zeros])
        grads += _sum_to_shapes(hessian_w, dx)
    else:
        grads += [None] * len(dx)
    if any(is_undefined_primal(t) for t in dct):
        grads += _sum_to_shapes(_forward(function, routes, x, w), dct)
    else:
        grads += [None] * len(dct)
    return grads


def _require_linear_only_in(function: FunctionSpec, mode: Mode, fixed) -> None:
    """A derivative primitive is transposed only with respect to the operands it is linear in."""
    if any(is_undefined_primal(p) for p in fixed):
        raise NotImplementedError(
            f"slax: cannot transpose the derivative {_SLANG_FORM[mode]} of Slang function "
            f"{function.name!r} with respect to its primal inputs, in which it is not linear (a "
            "derivative of order 3 or beyond, which slax does not support)."
        )


def _bind(primitive, function: FunctionSpec, routes: LaunchRoutes, fixed, linear) -> list:
    """Binds a derivative primitive and checks its results (``slax.config.debug_nans``)."""
    outputs = primitive.bind(*fixed, *linear, function=function, routes=routes)
    label = f"{_SLANG_FORM[_MODES[primitive]]} of Slang function {function.name!r} ({function.path})"
    check_finite(label, [*fixed, *linear], outputs)
    return outputs


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
    "slang_cotangent", Mode.COTANGENT, jvp=_cotangent_jvp, transpose=_cotangent_transpose
)
slang_tangent_of_tangent_p = _declare(
    "slang_tangent_of_tangent",
    Mode.TANGENT_OF_TANGENT,
    jvp=functools.partial(_second_order_jvp, mode=Mode.TANGENT_OF_TANGENT),
    transpose=_tangent_of_tangent_transpose,
)
slang_tangent_of_cotangent_p = _declare(
    "slang_tangent_of_cotangent",
    Mode.TANGENT_OF_COTANGENT,
    jvp=functools.partial(_second_order_jvp, mode=Mode.TANGENT_OF_COTANGENT),
    transpose=_tangent_of_cotangent_transpose,
)
_PRIMITIVES = {
    Mode.PRIMAL: slang_call_p,
    Mode.TANGENT: slang_tangent_p,
    Mode.COTANGENT: slang_cotangent_p,
    Mode.TANGENT_OF_TANGENT: slang_tangent_of_tangent_p,
    Mode.TANGENT_OF_COTANGENT: slang_tangent_of_cotangent_p,
}
_MODES = {primitive: mode for mode, primitive in _PRIMITIVES.items()}
_SLANG_FORM = {
    Mode.PRIMAL: "",
    Mode.TANGENT: "fwd_diff",
    Mode.COTANGENT: "bwd_diff",
    Mode.TANGENT_OF_TANGENT: "fwd_diff(fwd_diff)",
    Mode.TANGENT_OF_COTANGENT: "fwd_diff(bwd_diff)",
}
"""How each derivative is written in Slang, for messages."""
