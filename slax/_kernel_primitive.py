"""``slang_kernel_p``: one launch of a compute kernel (slax calling convention) as a JAX primitive.

Every slax computation reaches XLA through it: hand-written kernels (``module.kernel(...)``) bind it
directly, Slang functions and the MLP lower to it. It runs the kernel on its operands and returns
fresh result arrays (or operands updated in place); its lowering hands the launch to the launcher
of the platform and the routes it was traced with (``slax/_launch.py``).

Under ``jax.vmap`` it runs one launch per example (a ``lax.map``): a kernel's threads index its
buffers as the kernel alone knows, so slax cannot widen the launch. It has no derivative: a
hand-written kernel differentiates through a ``jax.custom_vjp`` its caller attaches.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from slax._compile import Aliases, KernelSpec, Scalars
from slax._config import LaunchRoutes
from slax._jax_api import lower_fun, manual_mesh_devices, partitioned_devices, program_devices
from slax._launch import launcher_for
from slax._primitive import declare_primitive, result_aval

Results = tuple[tuple[tuple[int, ...], str], ...]
"""(shape, dtype name) of each result."""
UINT_MAX = 2**32 - 1
"""The most threads one launch runs: the calling convention numbers them with a 32-bit ``uint``
(``slax_thread_index``, shaders/slax/kernel.slang). The kernels slax generates (Slang functions',
the MLP's) index their buffers with ``uint``s too, so each of their buffers holds at most this many
elements; past it, indices would wrap and the kernel would read and write the wrong elements."""


def run_kernel(
    spec: KernelSpec,
    operands,
    results: Results,
    count: int,
    scalars: Scalars = (),
    aliases: Aliases = (),
    *,
    routes: LaunchRoutes,
) -> list[jax.Array]:
    """Runs the kernel ``spec`` with ``count`` threads; returns arrays of shapes/dtypes ``results``.

    ``aliases`` pairs (operand index, result index): that result is the operand's buffer, which the
    kernel updates in place through the operand's pointer (the result gets no pointer of its own).
    ``routes``: how the launch is lowered on each platform (``slax._config.current_routes()`` in an
    entry point; a primitive that lowers to this passes on its own).
    """
    return slang_kernel_p.bind(
        *operands, spec=spec, results=results, scalars=scalars, count=count, aliases=aliases, routes=routes
    )


def _abstract_eval(*operands, spec, results, scalars, count, aliases, routes):
    del scalars, aliases, routes
    _require_uint_reach(spec, [o.shape for o in operands], [shape for shape, _ in results], count)
    return [result_aval(shape, dtype, operands) for shape, dtype in results]


def _require_uint_reach(spec: KernelSpec, operand_shapes, result_shapes, count: int) -> None:
    """Refuses a launch whose thread numbers or (for kernels slax generates) buffer indices would
    pass ``UINT_MAX`` and wrap: it would silently compute the wrong elements. It runs where the
    launch is bound: a hand-written kernel's call when traced, a Slang function's or the MLP's
    launch when the computation is lowered (its thread count depends on the platform), before
    anything runs either way. A hand-written kernel indexes its buffers as it chooses
    (slax/_kernel.py checks the element counts it declares)."""
    split = "Split the work over several calls, e.g. jax.lax.map over chunks of the batch."
    if count > UINT_MAX:
        raise ValueError(
            f"slax: kernel {spec.entry!r} would launch {count:,} threads, but a launch numbers its "
            f"threads with a 32-bit uint (slax_thread_index, shaders/slax/kernel.slang): at most "
            f"{UINT_MAX:,}. {split}"
        )
    if spec.source is None:
        return
    buffers = [("operand", k, s) for k, s in enumerate(operand_shapes)]
    buffers += [("result", k, s) for k, s in enumerate(result_shapes)]
    for role, k, shape in buffers:
        if math.prod(shape) > UINT_MAX:
            raise ValueError(
                f"slax: kernel {spec.entry!r}: its {role} {k} has shape {tuple(shape)}, "
                f"{math.prod(shape):,} elements, but the kernels slax generates index their "
                f"buffers with 32-bit uints: at most {UINT_MAX:,} elements each. {split}"
            )


def _lowering(ctx, *operands, spec, results, scalars, count, aliases, routes, platform):
    del results  # ctx.avals_out
    _require_one_device_per_kernel(partitioned_devices(ctx), spec)
    _require_mesh_in_program(manual_mesh_devices(ctx), program_devices(ctx), spec)
    if count == 0:
        return _lower_empty_launch(ctx, *operands, aliases=aliases)
    launcher = launcher_for(platform, routes)
    return launcher.lower(ctx, operands, spec=spec, scalars=scalars, count=count, aliases=aliases)


def _lower_empty_launch(ctx, *operands, aliases):
    """No threads, no launch, on every route: results updated in place are their operands
    unchanged, fresh results are zeros (never uninitialised memory)."""
    in_place = {result: operand for operand, result in aliases}
    avals = ctx.avals_out

    def unchanged_or_zero(*arrays):
        return [
            arrays[in_place[k]] if k in in_place else jnp.zeros(a.shape, a.dtype) for k, a in enumerate(avals)
        ]

    return lower_fun(unchanged_or_zero, multiple_results=True)(ctx, *operands)


def _require_one_device_per_kernel(devices: int, spec: KernelSpec) -> None:
    """XLA cannot split a kernel over devices; slax's entry points partition their calls over the
    mesh the arguments' types carry (slax/_sharding.py), so a kernel reaching XLA's partitioner
    unpartitioned had arguments that carried none. Refuse (XLA would run it whole on gathered data
    on every device, or not at all), and say what works."""
    if devices > 1:
        raise ValueError(
            f"slax: the Slang kernel {spec.entry!r} is being partitioned over {devices} devices, but "
            "its arguments' types carry no mesh (jax.typeof(x).sharding), which is what slax "
            "partitions its calls by, and no mesh is set. Put the batch on a mesh "
            "(jax.device_put(x, NamedSharding(mesh, PartitionSpec('data')))) before the jitted "
            "call, or call it under `with jax.set_mesh(mesh):` (needed with jax.jit's "
            "in_shardings), or inside jax.shard_map, or place the inputs on one device."
        )


def _require_mesh_in_program(mesh_devices: int, program_devices: int, spec: KernelSpec) -> None:
    """A kernel inside ``jax.shard_map`` over a mesh of more devices than ``jax.jit`` compiles the
    program for: slax split the call over the mesh a value's type carries, but no argument of the
    jitted function, nor the context, placed the program on that mesh's devices (the value was
    computed under ``jit`` from an array the function closes over). XLA cannot run it (``No
    registered implementation for ... xla.sdy.GlobalToLocalShape``): refuse, and say what works."""
    if mesh_devices > program_devices:
        raise ValueError(
            f"slax: the Slang kernel {spec.entry!r} is split over a mesh of {mesh_devices} devices, "
            f"which its arguments' types carry, but jax.jit compiles this program for "
            f"{program_devices}: the sharded value was computed inside the jitted function from "
            "an array it closes over, which names no devices to jax.jit. Pass that array to the "
            "jitted function as an argument, or call it under `with jax.set_mesh(mesh):`."
        )


def _batch_by_loop(primitive, args, dims, *, aliases, **params):
    """One launch per example, in a ``lax.map``: the batched operands (and operands updated in
    place, which every example updates) sliced, the others shared."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    aliased = {operand for operand, _ in aliases}
    sliced = [k for k, d in enumerate(dims) if d is not None or k in aliased]
    stacked = [
        jnp.moveaxis(args[k], dims[k], 0)
        if dims[k] is not None
        else jnp.broadcast_to(args[k], (size, *args[k].shape))
        for k in sliced
    ]

    def one_example(slices):
        operands = list(args)
        for k, value in zip(sliced, slices):
            operands[k] = value
        return primitive.bind(*operands, aliases=aliases, **params)

    outputs = jax.lax.map(one_example, stacked)
    return outputs, [0] * len(outputs)


def _no_derivative(primals, tangents, *, spec, **params):
    raise TypeError(
        f"slax: Slang kernel {spec.entry!r} ({spec.path}) has no derivative: slax differentiates "
        "Slang functions (module.function(...)), not hand-written kernels. To differentiate through "
        "a kernel call, attach a derivative with jax.custom_vjp: decorate a function that calls the "
        "kernel with @jax.custom_vjp and give it f.defvjp(forward, backward), where backward "
        "computes the cotangents of its inputs (with another kernel, or in JAX)."
    )


slang_kernel_p = declare_primitive(
    "slang_kernel",
    abstract_eval=_abstract_eval,
    lowering=_lowering,
    platforms=("cpu", "cuda"),
    batching_rule=_batch_by_loop,
    jvp=_no_derivative,
)
