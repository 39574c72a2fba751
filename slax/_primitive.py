"""How every slax primitive is declared, and what their rules share.

:func:`declare_primitive` is the one recipe: a JAX ``Primitive`` with its impl (JAX's own
dispatch), abstract evaluation, lowering and batching rule, and its JVP, transpose and dead-code
elimination rules where it has them, registered the way JAX's ``lax`` registers its own. The
kernel launch (``slax/_kernel_primitive.py``), the Slang function primitives
(``slax/_function_primitives.py``) and the MLP (``slax/nn/_primitives.py``) are all declared with
it.

Every slax primitive takes a ``routes`` parameter (:class:`slax._config.LaunchRoutes`), bound by
the public entry point from ``slax.config`` and passed on by every rule, down to the kernel launch
whose lowering picks its launcher by it.

Also here: output avals that vary over ``shard_map``'s mesh axes as their operands do, the cast
that makes operands vary alike, and the ``debug_nans`` check each entry point runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import numpy as np

from slax._config import config
from slax._jax_api import (
    Primitive,
    apply_primitive,
    primitive_batchers,
    primitive_jvps,
    primitive_transposes,
    register_dce_rule,
    register_lowering,
    varying_axes,
)

BatchingRule = Callable[..., tuple]
"""``(primitive, args, dims, **params) -> (outputs, out_dims)``: JAX's batching rule, given the
primitive it batches."""


def declare_primitive(
    name: str,
    *,
    abstract_eval: Callable,
    lowering: Callable,
    batching_rule: BatchingRule,
    multiple_results: bool = True,
    platforms: Sequence[str] | None = None,
    jvp: Callable | None = None,
    transpose: Callable | None = None,
    dead_code: Callable | None = None,
) -> Primitive:
    """A slax primitive named ``name``, with its rules registered.

    Args:
      name: the primitive's name in jaxprs.
      abstract_eval: ``(*avals, **params) -> aval(s)``; see :func:`result_aval`.
      lowering: an MLIR lowering rule ``(ctx, *operands, **params)``, e.g. ``lower_fun(f)``
        (``slax._jax_api``) for a primitive that expands into others. With ``platforms``, it is
        registered for each of them and called with ``platform=`` as well; without, for every
        platform.
      batching_rule: called with the primitive first (see :data:`BatchingRule`).
      multiple_results: whether it returns a list of arrays.
      jvp, transpose: JAX's ``primitive_jvps`` and ``primitive_transposes`` rules, if any.
      dead_code: a dead-code elimination rule (JAX's ``dce_rules``), for a primitive that can drop
        an unread output: ``(used_outputs, eqn) -> (used_inputs, new eqn or None)``.
    """
    primitive = Primitive(name)
    primitive.multiple_results = multiple_results
    primitive.def_impl(functools.partial(apply_primitive, primitive))
    primitive.def_abstract_eval(abstract_eval)
    if platforms is None:
        register_lowering(primitive, lowering)
    for platform in platforms or ():
        register_lowering(primitive, functools.partial(lowering, platform=platform), platform=platform)
    primitive_batchers[primitive] = functools.partial(batching_rule, primitive)
    if jvp is not None:
        primitive_jvps[primitive] = jvp
    if transpose is not None:
        primitive_transposes[primitive] = transpose
    if dead_code is not None:
        register_dce_rule(primitive, dead_code)
    return primitive


def result_aval(shape, dtype, operands) -> jax.core.ShapedArray:
    """An output aval of a slax primitive. Inside ``shard_map`` it varies over the mesh axes any
    operand varies over (``vma``), as an elementwise or per-sample kernel's results do."""
    avals = [o for o in operands if isinstance(o, jax.core.ShapedArray)]
    if not avals:
        return jax.core.ShapedArray(tuple(shape), np.dtype(dtype))
    template = max(avals, key=lambda a: len(varying_axes(a)))
    sharding = jax.sharding.NamedSharding(template.sharding.mesh, jax.sharding.PartitionSpec())
    return template.update(shape=tuple(shape), dtype=np.dtype(dtype), weak_type=False, sharding=sharding)


def vary_alike(operands):
    """``operands`` (a pytree), each leaf cast to vary over every manual mesh axis any leaf varies over.

    Inside ``jax.shard_map`` a replicated argument (weights, say) meets per-device data in a slax
    kernel. JAX's own primitives first cast it to varying (``jax.lax.pcast(..., to="varying")``),
    whose transpose sums the cotangent over the axis; slax's entry points do the same, so that
    ``jax.grad`` with respect to a replicated argument is the all-device sum, as for any JAX
    function, and custom VJPs return cotangents of their arguments' types.
    """
    leaves, tree = jax.tree.flatten(operands)
    varying = [varying_axes(jax.typeof(leaf)) for leaf in leaves]
    axes = frozenset().union(*varying)
    if not axes:
        return operands
    cast = [
        jax.lax.pcast(leaf, tuple(sorted(axes - own, key=str)), to="varying") if axes - own else leaf
        for leaf, own in zip(leaves, varying)
    ]
    return jax.tree.unflatten(tree, cast)


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
