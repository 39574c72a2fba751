"""Plain ``jax.jit`` over batch-sharded arrays: each slax call partitions itself along its batch.

XLA cannot split a slax kernel over devices by itself: to the partitioner it is an opaque custom
call, which it would run whole on gathered data. JAX's mechanism for teaching it,
``jax.experimental.custom_partitioning``, cannot hold a kernel launched by a Python callback (the
host-copy and SlangPy routes): it lowers the partitioned computation apart from the program
(``build_mlir_module_helper`` in ``jax/_src/custom_partitioning.py``), the callbacks registered
there are dropped, and the launch crashes the process. So slax reads the sharding where JAX
carries it, in the operands' types (``jax.typeof(x).sharding``: the mesh, and under explicit
sharding the spec), and runs the call inside ``jax.shard_map`` over that mesh:

- The leading axis of the batch (a Slang function's first grid axis, the MLP's samples) is split
  over the mesh axes it is sharded along (explicit sharding), or over every automatic axis
  (automatic sharding, where the propagation decides shardings later; the split it then meets
  costs no communication when the batch is sharded so, and a reshard otherwise). Arrays placed by
  ``jax.jit(..., in_shardings=...)`` carry no mesh in their types; under ``jax.set_mesh(mesh)`` the
  batch splits over that mesh's axes. An array the jitted function closes over splits the call
  over its own mesh, whose devices it names to ``jax.jit``. Each device runs the kernel on its own
  shard: no all-gather of the batch.
- Everything else (weights, arguments broadcast along the batch, other axes of the batch) is
  replicated: a sharded weight matrix is gathered first, a correct replicated computation.
- Losses and gradients that sum over the batch are averaged over the devices by the call itself
  (:func:`slax.nn.mlp_loss_and_grad`); ``jax.grad`` with respect to replicated arguments sums over
  the mesh through ``shard_map``'s own transpose, exactly once.

A batch that does not divide over the mesh, or a call with no batch axis, runs replicated on every
device. Inside ``jax.shard_map`` (manual axes) calls run as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from slax._jax_api import vmapped_mesh_axes

_NO_MESH = jax.sharding.AbstractMesh((), ())

LocalCall = Callable[..., Sequence[jax.Array]]
"""``(axes, *leaves) -> outputs``: a slax call on one device's shards; ``axes`` are the mesh axes
its batch is split over, for collectives over the batch (``()`` when it is not split)."""


def across_devices(
    call: LocalCall, leaves: Sequence[jax.Array], batched: Sequence[bool], out_batched: Sequence[bool]
) -> list[jax.Array]:
    """``call(axes, *leaves)``, partitioned over the mesh the leaves' types carry, if any.

    Args:
      call: the slax call on one device's shards (see :data:`LocalCall`).
      leaves: its array arguments.
      batched: per leaf, whether its leading axis is the batch (else it is replicated).
      out_batched: per output, whether its leading axis is the batch (else ``call`` must return it
        replicated: the same on every device, e.g. after ``jax.lax.pmean`` over ``axes``).
    """
    mesh, axes = _mesh_and_batch_axes(leaves, batched)
    if mesh is None:
        return list(call((), *leaves))
    placed = _with_devices(mesh, leaves)
    split = PartitionSpec(axes if axes else None)
    in_specs = tuple(_spec(leaf, split, is_batched) for leaf, is_batched in zip(leaves, batched))
    if AxisType.Explicit in mesh.axis_types:  # explicit shardings must match the specs: reshard
        leaves = [
            jax.sharding.reshard(leaf, NamedSharding(mesh, spec))
            if jax.typeof(leaf).sharding.mesh in (mesh, _NO_MESH)
            else leaf
            for leaf, spec in zip(leaves, in_specs)
        ]
    out_specs = tuple(split if is_batched else PartitionSpec() for is_batched in out_batched)
    local = jax.shard_map(
        lambda *shards: tuple(call(axes, *shards)),
        mesh=placed,
        in_specs=in_specs,
        out_specs=out_specs,
        axis_names=set(_automatic_or_explicit(mesh)),
    )
    return list(local(*leaves))


def mean_over_devices(values: Sequence[Any], axes: str | tuple[str, ...]) -> list[Any]:
    """``jax.lax.pmean`` of each value (array or pytree of arrays) over the mesh ``axes``, as one
    all-reduce per dtype of one flat vector.

    Separate ``pmean`` calls reach XLA as one combined all-reduce anyway, but XLA packs each operand
    into it and unpacks each result with its own copy kernel: on two H200s the MLP's loss and four
    gradients cost 10.7 copy launches a training step, one flat vector 0.7 (BENCHMARKS.md, "Two
    GPUs"; the step time did not measurably change). One concatenation is one fused kernel; the
    slices of the result fuse into their consumers.
    """
    if not axes:
        return list(values)
    leaves, tree = jax.tree.flatten(list(values))
    by_dtype: dict[Any, list[int]] = {}
    for index, leaf in enumerate(leaves):
        by_dtype.setdefault(jnp.result_type(leaf), []).append(index)
    means = list(leaves)
    for indices in by_dtype.values():
        flat = jax.lax.pmean(jnp.concatenate([jnp.ravel(leaves[i]) for i in indices]), axes)
        start = 0
        for i in indices:
            size = math.prod(jnp.shape(leaves[i]))
            means[i] = flat[start : start + size].reshape(jnp.shape(leaves[i]))
            start += size
    return jax.tree.unflatten(tree, means)


def _mesh_and_batch_axes(leaves, batched) -> tuple[jax.sharding.AbstractMesh | None, tuple[str, ...]]:
    """The mesh of more than one device that the leaves' types carry (None if none), and the axes
    of it that the batch splits over (empty: replicate)."""
    shardings = [jax.typeof(leaf).sharding for leaf in leaves]
    meshes = [s.mesh for s in shardings if _automatic_or_explicit(s.mesh)]
    context = jax.sharding.get_abstract_mesh()  # jax.set_mesh: arrays placed by in_shardings
    if _automatic_or_explicit(context):  # carry no mesh in their types, but the context has it
        meshes.append(context)
    if not meshes:
        return None, ()
    mesh = meshes[0]
    _require_batch_not_vmapped(mesh)
    sizes = dict(mesh.shape)
    batch_leaves = [(leaf, s) for leaf, s, is_batched in zip(leaves, shardings, batched) if is_batched]
    if not batch_leaves or any(jax.typeof(leaf).ndim == 0 for leaf, _ in batch_leaves):
        return mesh, ()
    kinds = dict(zip(mesh.axis_names, mesh.axis_types))
    explicit = [a for a in _spec_axes(batch_leaves[0][1]) if kinds.get(a) == AxisType.Explicit]
    # Axes the batch's type does not pin (automatic ones, or any axis of a context mesh the batch's
    # type does not know): the batch splits over all of them.
    typed = batch_leaves[0][1].mesh == mesh
    automatic = [a for a in _automatic_or_explicit(mesh) if kinds[a] == AxisType.Auto or not typed]
    axes = tuple(explicit or automatic)
    batch = jax.typeof(batch_leaves[0][0]).shape[0]
    if batch % math.prod(sizes[a] for a in axes):
        return mesh, ()
    return mesh, axes


def _with_devices(mesh, leaves):
    """``mesh`` with the devices of a concrete array among ``leaves`` placed on it (an array the
    jitted function closes over), or else ``mesh`` itself, abstract.

    ``jax.jit`` compiles for the devices its arguments name and those of the concrete meshes its
    ``shard_map`` calls name. A closed-over array is a constant to it: its mesh is in its type, but
    its devices are not among those, and a ``shard_map`` over the abstract mesh would sit in a
    program compiled for one device, which XLA cannot run (``No registered implementation for ...
    xla.sdy.GlobalToLocalShape``). Over the concrete mesh it names the devices, as
    ``jax.shard_map(mesh=jax.make_mesh(...))`` does in plain JAX."""
    for leaf in leaves:
        placed = getattr(leaf, "sharding", None) if not isinstance(leaf, jax.core.Tracer) else None
        if isinstance(placed, NamedSharding) and placed.mesh.abstract_mesh == mesh:
            return placed.mesh
    return mesh


def _require_batch_not_vmapped(mesh) -> None:
    """Refuses a call inside ``jax.vmap`` over an axis sharded along ``mesh``'s explicit axes: the
    vmap takes those axes from ``jax.shard_map``, through which slax splits its calls, and the
    kernel would reach XLA's partitioner whole."""
    vmapped = sorted(vmapped_mesh_axes() & set(_automatic_or_explicit(mesh)))
    if vmapped:
        raise ValueError(
            f"slax: a slax call inside jax.vmap over an axis sharded along the explicit mesh axes "
            f"{tuple(vmapped)}: jax.vmap takes those axes away from jax.shard_map, through which "
            "slax splits its calls over the devices. Call it on the whole batch without the vmap "
            "(a Slang function broadcasts over its arguments' leading axes), or reshard the "
            "vmapped array first (jax.sharding.reshard(x, PartitionSpec()))."
        )


def _automatic_or_explicit(mesh) -> list[str]:
    """The axes of ``mesh`` not already manual (inside ``shard_map``) that span several devices."""
    return [
        name
        for name, kind in zip(mesh.axis_names, mesh.axis_types)
        if kind != AxisType.Manual and dict(mesh.shape)[name] > 1
    ]


def _spec_axes(sharding) -> tuple[str, ...]:
    """The mesh axes the leading dimension of an array of ``sharding`` is split along."""
    spec = getattr(sharding, "spec", None)
    if not spec or spec[0] is None:
        return ()
    return tuple(spec[0]) if isinstance(spec[0], tuple) else (spec[0],)


def _spec(leaf, split: PartitionSpec, is_batched: bool) -> PartitionSpec:
    return split if is_batched and jax.typeof(leaf).ndim else PartitionSpec()
