"""JAX arrays for SlangPy's tensor parameters, and the call grid of :func:`grid`.

A tensor parameter (``ITensor<T, D>``, ``IDiffTensor<T, D>``: read; ``IWTensor<T, D>``,
``IWDiffTensor<T, D>``: written) takes a whole array of shape ``(D dims..., element dims...)``: it is
not broadcast over the call grid; the function indexes it as it likes. A written tensor is an output:
the caller states its shape (``jax.ShapeDtypeStruct``, or a shape tuple meaning the element's dtype)
and the call returns it, zeroed before the kernel writes into it.

``slax.grid(shape)`` passed for the call-id parameter (``int idx``, ``int2``, ``int[2]``, ...) sets
the call grid, as SlangPy's ``spy.grid``: each grid point receives its coordinates. A vector's ``x``
is the last axis (the smallest stride), ``y`` the one before; an array's components are the axes in
order.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from slax._kernel_primitive import UINT_MAX
from slax._signature import Leaf, Value


@dataclasses.dataclass(frozen=True)
class Grid:
    """The call grid of a call, given for its call-id parameter (:func:`grid`)."""

    shape: tuple[int, ...]


def grid(shape: int | tuple[int, ...]) -> Grid:
    """The call grid ``shape``, for a Slang function's call-id parameter (SlangPy's ``spy.grid``).

    Example: ``mod.polynomial(slax.grid((4,)), 2.0, 8.0, -1.0, x, jax.ShapeDtypeStruct((4,), jnp.float32))``
    runs ``polynomial(int idx, ...)`` at ``idx = 0, 1, 2, 3``.

    Args:
      shape: the grid's shape, an int or a tuple of ints (one per axis).

    Returns:
      A :class:`Grid` to pass for the call-id parameter (``int idx``, ``int2``, ``int[2]``, ...):
      each grid point gets its coordinates, a vector's x being the last axis.

    Raises:
      ValueError: ``shape`` has no axes, holds a negative or non-integer size, or more than 2**32 - 1 points
        (a launch numbers its threads with a 32-bit uint).
    """
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(n, (int, np.integer)) and n >= 0 for n in dims):
        raise ValueError(f"slax.grid: shape must be non-negative integers; got {shape!r}.")
    if not dims:
        raise ValueError(
            f"slax.grid: shape must have at least one axis; got {shape!r}. A single call is slax.grid((1,))."
        )
    points = math.prod(int(n) for n in dims)
    if points > UINT_MAX:
        raise ValueError(
            f"slax.grid: shape {shape!r} has {points:,} points, more than one launch reaches: it "
            f"numbers its threads with a 32-bit uint, at most {UINT_MAX:,}. Split the work over "
            "several calls, e.g. jax.lax.map over chunks of the grid."
        )
    return Grid(tuple(int(n) for n in dims))


def grid_coordinates(given: Grid, leaf: Leaf, what: str) -> jax.Array:
    """The coordinates each point of ``given`` passes to an ``int``/``uint`` call-id parameter of
    type ``leaf``: shape ``grid + leaf.shape``."""
    rank = len(given.shape)
    fits = leaf.shape == (rank,) or (leaf.shape == () and rank == 1)
    if leaf.dtype not in ("int32", "uint32") or not fits:
        expected = "int or uint" if rank == 1 else f"int{rank}, uint{rank}, int[{rank}] or uint[{rank}]"
        raise TypeError(
            f"slax: {what} was given slax.grid({given.shape}), whose points have {rank} coordinate(s): "
            f"the parameter must be {expected}."
        )
    coordinates = math.prod(given.shape) * max(rank, 1)
    if coordinates > UINT_MAX:  # refused here, before they are built: eagerly, they would be
        raise ValueError(
            f"slax: {what} was given slax.grid({given.shape}), whose points have {coordinates:,} "
            f"coordinates, more than the {UINT_MAX:,} elements the kernels slax generates index with "
            "32-bit uints. Split the work over several calls, e.g. jax.lax.map over chunks of the grid."
        )
    axes = jnp.indices(given.shape, dtype=leaf.dtype)
    if not leaf.shape:
        return axes[0]
    if leaf.slang_type.startswith("vector"):  # x is the last axis
        axes = axes[::-1]
    return jnp.moveaxis(axes, 0, -1)


def tensor_operand(value: Value, argument: Any, function: str) -> jax.Array:
    """The array a tensor parameter takes: a read tensor's argument, checked; for a written one,
    zeros of the shape its argument states."""
    assert value.tensor is not None
    leaf, tensor = value.leaves[0], value.tensor
    what = f"argument {value.name!r} of {function}() (Slang {value.slang_type!r})"
    expected = f"{tensor.rank} dims"
    expected += f", then the element's {tensor.element}" if tensor.element else ""
    if tensor.written:
        shape, dtype = _stated_shape(argument, leaf, what)
    else:
        if isinstance(argument, (jax.ShapeDtypeStruct, tuple, list)) or argument is None:
            raise TypeError(f"slax: {what} is an input tensor: pass an array, got {argument!r}.")
        array = jnp.asarray(argument)
        shape, dtype = array.shape, array.dtype
    if dtype != np.dtype(leaf.dtype):
        raise TypeError(
            f"slax: {what} holds {leaf.slang_type} elements, so its dtype must be {leaf.dtype}; got "
            f"{dtype}. Cast it with .astype(jnp.{leaf.dtype})."
        )
    if len(shape) != tensor.rank + len(tensor.element) or tuple(shape[tensor.rank :]) != tensor.element:
        raise ValueError(
            f"slax: {what} is a {tensor.rank}-D tensor of {leaf.slang_type}, so its shape must have "
            f"{expected} (a tensor is passed whole, not broadcast over the call grid); got shape "
            f"{tuple(shape)}."
        )
    if math.prod(shape) == 0:
        raise ValueError(f"slax: {what} has shape {tuple(shape)}, with no elements.")
    return jnp.zeros(shape, dtype) if tensor.written else array


def _stated_shape(argument: Any, leaf: Leaf, what: str) -> tuple[tuple[int, ...], np.dtype]:
    if isinstance(argument, jax.ShapeDtypeStruct):
        return tuple(argument.shape), np.dtype(argument.dtype)
    if isinstance(argument, (tuple, list)) and all(isinstance(n, (int, np.integer)) for n in argument):
        return tuple(int(n) for n in argument), np.dtype(leaf.dtype)
    raise TypeError(
        f"slax: {what} is an output tensor: pass its shape, as jax.ShapeDtypeStruct(shape, "
        f"jnp.{leaf.dtype}) or a tuple of ints; the call returns it. Got {type(argument).__name__}."
    )
