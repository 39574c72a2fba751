"""instant-NGP's multiresolution hash encoding (Müller et al. 2022) as a JAX function over Slang.

A point ``x`` in [0, 1]^d (d = 2 or 3) is looked up in ``levels`` grids, from ``coarsest_resolution``
to ``finest_resolution`` cells per axis in a geometric progression: level l has
``floor(N_min * b^l)`` cells, ``b = exp((ln N_max - ln N_min) / (levels - 1))``. Each level's
(resolution + 1)^d vertices index its own table of ``features_per_level`` values (float32 or
float16) an entry: row-major where the grid has at most ``T = 2^log2_table_size`` vertices (dense,
a table of as many entries), else by the paper's spatial hash, the XOR of the vertex's coordinates
times (1, 2654435761, 805459861) modulo T (a table of T entries). The levels' tables lie one after
the other in one ``(rows, F)`` array, as tiny-cuda-nn's grid lays them out: a coarse level takes
what it reads, not T entries (in 2-D, instant-NGP's image grid is a third of ``L * T``), and so
does every pass over the tables (Adam's). The encoding is the (bi/tri)linear interpolation of the
2^d corners' entries, per level, concatenated: ``(..., levels * features_per_level)``.

In Slang (``shaders/nn/fused_encoding.slang``), one call per point and level finds the point's
cell, its corners' rows and weights in registers and reads (or, for the gradient in the tables,
adds into) each corner's features as one vector; slax/nn/_fused_encoding.py declares the encoding,
its scatter into the tables and its gradient in the points as primitives that close under JAX's
derivatives, so that the gradient of an eikonal loss runs on them alone. Second derivatives in the
points (``jax.hessian``) go through the corners' rows and weights in memory
(``shaders/nn/hash_encoding.slang``'s ``level_corners``, slax/nn/_blend.py's primitives).
:func:`hash_encode_with_jacobian` reads the encoding with its Jacobian in the points, for a field
whose gradient in the point a loss holds: that loss's gradient in the tables is then one scatter
(slax/nn/_jacobian_encoding.py).
:func:`hash_encode_reference` (slax/nn/_hash_reference.py) is the same encoding in plain JAX.

float16 tables, as tiny-cuda-nn keeps its grids: half the memory and half the bytes each corner's
read moves; the sums are float32's, rounded once to float16 (the features, and the gradient in the
tables, which is added in float32: slax/nn/_fused_encoding.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from slax.nn._blend import gradient_rows
from slax.nn._fused_encoding import encode
from slax.nn._hash_field import field_with_gradient
from slax.nn._jacobian_encoding import encode_jacobian

TABLE_DTYPES = ("float32", "float16")
"""The tables' dtypes :func:`hash_encode` takes."""

TABLE_INIT_SCALE = 1e-4
"""Tables start uniform in ±1e-4, as the paper's."""

CONTENDED_ENTRIES = 8192
"""A dense level of at most this many entries takes its gradient through copies (:func:`_spread`)."""

GRADIENT_COPIES = 31
"""Copies a contended level's gradient adds into, at most (a prime: points at any stride of the
flattened batch spread over all of them)."""


@dataclasses.dataclass(frozen=True)
class HashEncodingConfig:
    """The encoding's hyperparameters; defaults are the paper's (Table 1), in 3-D.

    Attributes:
      dimensions: d, the inputs' dimension: 2 (images) or 3 (SDFs, NeRFs).
      levels: L, the number of grids.
      features_per_level: F, values per table entry.
      log2_table_size: log2 T, entries per level's table (the paper: 14 to 24; 19 by default).
      coarsest_resolution: N_min, cells per axis of the coarsest grid.
      finest_resolution: N_max, cells per axis of the finest grid (the paper: 512 to 524288).
    """

    dimensions: int = 3
    levels: int = 16
    features_per_level: int = 2
    log2_table_size: int = 19
    coarsest_resolution: int = 16
    finest_resolution: int = 512

    def __post_init__(self):
        def require(condition: bool, name: str, expected: str) -> None:
            if not condition:
                raise ValueError(
                    f"slax.nn.HashEncodingConfig: {name} must be {expected}, got {getattr(self, name)!r}."
                )

        for name in dataclasses.fields(self):
            value = getattr(self, name.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(
                    f"slax.nn.HashEncodingConfig: {name.name} must be an int, got {type(value).__name__} "
                    f"{value!r}."
                )
        require(self.dimensions in (2, 3), "dimensions", "2 or 3")
        require(self.levels >= 1, "levels", ">= 1")
        require(self.features_per_level >= 1, "features_per_level", ">= 1")
        require(1 <= self.log2_table_size <= 30, "log2_table_size", "in [1, 30]")
        require(self.coarsest_resolution >= 1, "coarsest_resolution", ">= 1")
        require(
            self.finest_resolution >= self.coarsest_resolution,
            "finest_resolution",
            f">= coarsest_resolution ({self.coarsest_resolution})",
        )
        require(
            self.levels > 1 or self.finest_resolution == self.coarsest_resolution,
            "finest_resolution",
            f"coarsest_resolution ({self.coarsest_resolution}) with one level",
        )
        # The kernels index the tables' rows, and the gradient's copies past them, with int32.
        rows = self.levels << self.log2_table_size
        if rows < 2**31:
            rows = gradient_rows(self.table_rows, _spread(self))
        if rows >= 2**31:
            raise ValueError(
                f"slax.nn.HashEncodingConfig: the tables' rows and their gradient's copies must be below "
                f"2^31 (the kernels index them with int32), got {rows} for levels * 2^log2_table_size = "
                f"{self.levels} * 2^{self.log2_table_size}."
            )

    @property
    def table_size(self) -> int:
        """T = 2^log2_table_size, entries per level."""
        return 1 << self.log2_table_size

    @property
    def growth_factor(self) -> float:
        """b, the ratio of consecutive levels' resolutions (1 with one level)."""
        if self.levels == 1:
            return 1.0
        return math.exp(
            (math.log(self.finest_resolution) - math.log(self.coarsest_resolution)) / (self.levels - 1)
        )

    @property
    def resolutions(self) -> tuple[int, ...]:
        """Each level's cells per axis, floor(N_min * b^l). The product is taken in float64 with a
        margin of 1e-9 relative, so that the finest level is N_max and not N_max - 1 by rounding."""
        b = self.growth_factor
        return tuple(
            int(math.floor(self.coarsest_resolution * b**level * (1 + 1e-9))) for level in range(self.levels)
        )

    @property
    def dense_levels(self) -> tuple[bool, ...]:
        """Whether each level's (resolution + 1)^d vertices fit in its table (indexed row-major)."""
        return tuple((r + 1) ** self.dimensions <= self.table_size for r in self.resolutions)

    @property
    def level_entries(self) -> tuple[int, ...]:
        """Each level's table entries: T for a hashed level; for a dense one its (resolution + 1)^d
        vertices rounded up to a multiple of 8 (at most T), as tiny-cuda-nn's, so that every level
        starts on a 32-byte boundary of float16 or float32 entries of 2 or more features."""
        return tuple(
            min(self.table_size, -(-((r + 1) ** self.dimensions) // 8) * 8) if dense else self.table_size
            for r, dense in zip(self.resolutions, self.dense_levels)
        )

    @property
    def level_offsets(self) -> tuple[int, ...]:
        """Each level's first row in the tables: level l's table is rows ``[level_offsets[l],
        level_offsets[l] + level_entries[l])``."""
        return tuple(itertools.accumulate(self.level_entries, initial=0))[:-1]

    @property
    def table_rows(self) -> int:
        """The entries of all levels' tables together, at most L * T."""
        return sum(self.level_entries)

    @property
    def output_features(self) -> int:
        """L * F, the encoding's width."""
        return self.levels * self.features_per_level

    @property
    def table_shape(self) -> tuple[int, int]:
        """The tables' shape, ``(table_rows, F)``: the levels' tables one after the other."""
        return (self.table_rows, self.features_per_level)


def hash_encoding_init(key: jax.Array, config: HashEncodingConfig, dtype: Any = jnp.float32) -> jax.Array:
    """The encoding's tables, uniform in ±1e-4 (the paper's initialisation).

    The dtype is an argument here, as :func:`slax.nn.mlp_init`'s, and not a field of the config:
    it belongs to the parameters, which :func:`hash_encode` reads it from, so one config encodes
    with tables of either dtype (a float32 copy of float16 tables, say) and nothing can disagree.

    Args:
      key: a JAX PRNG key.
      config: the encoding's :class:`HashEncodingConfig`.
      dtype: ``jnp.float32``, or ``jnp.float16`` for half the memory and table traffic (drawn in
        float32 and rounded).

    Returns:
      ``config.table_shape`` = ``(config.table_rows, features_per_level)`` of ``dtype``: level l's
      table is rows ``config.level_offsets[l]`` on, ``config.level_entries[l]`` of them. A dense
      level reads the first (resolution + 1)^d of its entries (up to 7 more round its table to a
      multiple of 8: their gradient is zero).

    Raises:
      TypeError: ``config`` not a :class:`HashEncodingConfig`, or ``dtype`` not float32 or float16.
    """
    _require_config("hash_encoding_init", config)
    _require_table_dtype("hash_encoding_init", "dtype", dtype)
    tables = jax.random.uniform(key, config.table_shape, jnp.float32, -TABLE_INIT_SCALE, TABLE_INIT_SCALE)
    return tables.astype(dtype)


def hash_encode(tables: jax.Array, x: jax.Array, config: HashEncodingConfig, dtype: Any = None) -> jax.Array:
    """The multiresolution hash encoding of points ``x``: ``(..., d) -> (..., levels * features)``,
    level by level (level l's features at ``[l * F, (l + 1) * F)``).

    Differentiable in ``tables`` and ``x`` in both modes and to second order (``jax.hessian``, the
    gradient in the tables of a loss that holds the gradient in ``x``, as an eikonal loss does);
    composes with ``jit``, ``vmap`` (also over a stack of tables) and ``lax.scan``. The derivative in
    ``x`` is that of the interpolation within the cell holding ``x``: it jumps across cell faces.

    float16 tables give float16 features, as JAX's functions keep their operands' dtype and as
    :func:`slax.nn.mlp_apply` of a float16 network takes them (``.astype(jnp.float32)`` for a
    float32 one). Each feature is summed in float32 from the float16 entries and rounded once, and
    the gradient in float16 tables is added in float32 and rounded once (slax/nn/_fused_encoding.py), so it
    keeps the small shares of the many points that read a coarse level's entry.

    ``dtype`` gives the features another dtype than the tables', as tiny-cuda-nn's encodings give
    theirs in the network's precision: float32 tables, which Adam updates by small steps, feeding a
    float16 network (:func:`slax.nn.mlp_apply` of float16 parameters). The features are rounded
    once from their float32 sums, and their float16 cotangent is widened as the gradient's kernel
    reads it, where ``.astype`` would be a pass over the features each way in XLA.

    Args:
      tables: float32 or float16 ``config.table_shape``, ``(config.table_rows,
        features_per_level)``, the levels' tables one after the other, from
        :func:`hash_encoding_init`.
      x: float32 ``(..., d)``, points in [0, 1]^d. A coordinate of exactly 1 lies in the last cell;
        points outside [0, 1]^d extrapolate the border cells linearly.
      config: the encoding's :class:`HashEncodingConfig`.
      dtype: the features' dtype, ``jnp.float32`` or ``jnp.float16``; default (None) the tables'.

    Returns:
      ``(..., levels * features_per_level)`` of ``dtype``.

    Raises:
      TypeError: ``config`` not a :class:`HashEncodingConfig`, ``tables`` or ``dtype`` not float32 or
        float16, or ``x`` not float32.
      ValueError: ``tables`` not of ``config.table_shape``, or ``x`` not ending in ``config.dimensions``.
    """
    _require_config("hash_encode", config)
    _require_arguments("hash_encode", tables, x, config)
    if dtype is not None:
        _require_table_dtype("hash_encode", "dtype", dtype, _FEATURES_DTYPE)
    features = encode(x, tables, config, _spread(config), dtype)
    return features.reshape(*x.shape[:-1], config.output_features)


def hash_encode_with_jacobian(
    tables: jax.Array, x: jax.Array, config: HashEncodingConfig, dtype: Any = None
) -> tuple[jax.Array, jax.Array]:
    """The encoding of points ``x`` (:func:`hash_encode`'s) and its Jacobian in ``x``, read in one
    pass over the tables, for a model that needs its gradient in the point (an SDF's eikonal loss).

    With ``features, jacobian = hash_encode_with_jacobian(tables, x, config)``, a field
    ``f(x) = network(features)`` has the gradient ``jacobian^T grad network``, a product in plain
    JAX, so the gradient in the tables of a loss on the field and its gradient adds both terms in
    one scatter, and the network's second derivative reads the Jacobian, not the tables again:
    two passes over the tables' corners a step, against five through :func:`hash_encode` and
    ``jax.grad`` in ``x``::

        features, jacobian = nn.hash_encode_with_jacobian(tables, x, config)
        values, pullback = jax.vjp(lambda h: nn.mlp_apply(params, h), features)
        (slopes,) = pullback(jnp.ones_like(values))              # each point's own
        gradient = jnp.sum(jacobian * slopes[..., None], axis=-2)  # (..., d), d values / d x

    Differentiable in ``tables`` to every order (reverse and forward); composes with ``jit`` and
    ``vmap`` (also over a stack of tables). Not differentiable in ``x``: that needs the encoding's
    second derivatives in ``x``, which :func:`hash_encode` takes.

    Args:
      tables: float32 or float16 ``config.table_shape``, ``(config.table_rows,
        features_per_level)``, the levels' tables one after the other, from
        :func:`hash_encoding_init`.
      x: float32 ``(..., d)``, points in [0, 1]^d (as :func:`hash_encode`'s).
      config: the encoding's :class:`HashEncodingConfig`.
      dtype: the features' dtype (as :func:`hash_encode`'s), ``jnp.float32`` or ``jnp.float16``;
        default (None) the tables'. The Jacobian keeps the tables' dtype: it multiplies the
        network's input gradient, a float32 product even behind a float16 network.

    Returns:
      ``features`` ``(..., levels * features_per_level)`` of ``dtype`` and ``jacobian`` ``(...,
      levels * features_per_level, d)`` of the tables' dtype (``jacobian[..., k, i]``: feature
      k's derivative in ``x[..., i]``, as ``jax.jacfwd`` lays it out), each summed in float32 and
      rounded once. The Jacobian is a transpose of the kernel's ``(..., levels, d,
      features_per_level)``, which XLA fuses into what reads it (as the product above).

    Raises:
      TypeError, ValueError: as :func:`hash_encode`.
      NotImplementedError: when differentiated in ``x``.
    """
    _require_config("hash_encode_with_jacobian", config)
    _require_arguments("hash_encode_with_jacobian", tables, x, config)
    if dtype is not None:
        _require_table_dtype("hash_encode_with_jacobian", "dtype", dtype, _FEATURES_DTYPE)
    features, jacobian = encode_jacobian(x, tables, config, _spread(config), dtype)  # (..., levels[, d], F)
    features = features.reshape(*x.shape[:-1], config.output_features)
    jacobian = jnp.swapaxes(jacobian, -1, -2)  # (..., levels, F, d)
    return features, jacobian.reshape(*x.shape[:-1], config.output_features, config.dimensions)


def hash_field_with_gradient(
    apply: Callable[[Any, jax.Array], jax.Array],
    params: Any,
    tables: jax.Array,
    x: jax.Array,
    config: HashEncodingConfig,
    dtype: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """A scalar field behind the encoding, ``apply(params, hash_encode(tables, x, config, dtype))``,
    and its gradient in ``x``, for a loss that holds both (an SDF's eikonal loss)::

        values, gradient = nn.hash_field_with_gradient(nn.mlp_apply, params, tables, x, config)

    The values and gradient of the product :func:`hash_encode_with_jacobian` documents, from the
    same kernels, but the loss's gradient in the tables reads the Jacobian's cotangent as its two
    factors (the network's input gradient, and the cotangent of the field's gradient), where
    JAX's rules would write it out and read it back: on an H200 that array is 100 MB at 2^18 points
    and 16 levels in 3-D (slax/nn/_hash_field.py).

    Differentiable (reverse mode, ``jax.grad``/``jax.vjp``) in ``params`` and ``tables``; composes
    with ``jit``, ``vmap`` and ``lax.scan``. Not differentiable in ``x`` (as
    :func:`hash_encode_with_jacobian`), and not in forward mode (``jax.jvp``): use
    :func:`hash_encode_with_jacobian` and the product there.

    Args:
      apply: ``apply(params, features) -> (..., 1)``, the field from the features ``(..., levels *
        features_per_level)`` of ``dtype``, e.g. :func:`slax.nn.mlp_apply` of a network with one
        output.
      params: ``apply``'s parameters, any pytree.
      tables: float32 or float16 ``config.table_shape`` (as :func:`hash_encode`'s).
      x: float32 ``(..., d)``, points in [0, 1]^d (as :func:`hash_encode`'s).
      config: the encoding's :class:`HashEncodingConfig`.
      dtype: the features' dtype (as :func:`hash_encode`'s); default (None) the tables'.

    Returns:
      ``values`` ``(..., 1)`` as ``apply`` gives them and ``gradient`` ``(..., d)``, float32 as
      ``x``, ``d values / d x``.

    Raises:
      TypeError, ValueError: as :func:`hash_encode`; ValueError where ``apply`` does not give one
        value a point.
      NotImplementedError: when differentiated in ``x``.
    """
    _require_config("hash_field_with_gradient", config)
    _require_arguments("hash_field_with_gradient", tables, x, config)
    if dtype is not None:
        _require_table_dtype("hash_field_with_gradient", "dtype", dtype, _FEATURES_DTYPE)
    dtype = str(jnp.dtype(tables.dtype if dtype is None else dtype))
    return field_with_gradient(apply, params, tables, x, config, _spread(config), dtype)


def _spread(config: HashEncodingConfig):
    """The dense levels small enough that a batch's gradient piles onto few cache lines: their
    entries, how many copies of them the gradient adds into (at most :data:`GRADIENT_COPIES`, and
    at most as many as T entries hold, which bounds the gradient's copies by the table's T a
    level), and where the copies start, past the tables, for :data:`slax.nn._blend.Spread`."""
    spread = []
    spare = config.table_rows
    for first, entries, dense in zip(config.level_offsets, config.level_entries, config.dense_levels):
        copies = min(GRADIENT_COPIES, config.table_size // entries)
        if dense and entries <= CONTENDED_ENTRIES and copies >= 2:
            spread.append((first, entries, copies, spare))
            spare += (copies - 1) * entries
    return tuple(spread)


_FEATURES_DTYPE = "the features' dtype, each rounded once from float32"


def _require_config(function: str, config) -> None:
    if not isinstance(config, HashEncodingConfig):
        raise TypeError(
            f"slax.nn.{function}: config must be a slax.nn.HashEncodingConfig, got {type(config).__name__}."
        )


def _require_table_dtype(
    function: str,
    name: str,
    dtype,
    why: str = "the tables are read in that dtype and summed in float32 (cast them with .astype)",
) -> None:
    try:
        given = np.dtype(dtype)
    except TypeError:
        given = None
    if str(given) not in TABLE_DTYPES:
        raise TypeError(
            f"slax.nn.{function}: {name} must be float32 or float16, "
            f"got {dtype if given is None else given}; {why}."
        )


def _require_arguments(function: str, tables, x, config: HashEncodingConfig) -> None:
    """Raises where ``tables`` or ``x`` do not fit ``config``, naming the argument, what it takes
    and what it got."""
    for name, value in (("tables", tables), ("x", x)):
        if getattr(value, "dtype", None) is None:
            raise TypeError(f"slax.nn.{function}: {name} must be a JAX array, got {type(value).__name__}.")
    _require_table_dtype(function, "tables", tables.dtype)
    if np.dtype(x.dtype) != np.float32:
        raise TypeError(
            f"slax.nn.{function}: x must be a float32 array, got {x.dtype}; the corner weights are "
            "float32 whatever the tables' dtype (x.astype(jnp.float32))."
        )
    if tuple(tables.shape) != config.table_shape:
        raise ValueError(
            f"slax.nn.{function}: tables must have shape (config.table_rows, features_per_level) "
            f"= {config.table_shape} for this config (the levels' tables one after the other), got "
            f"{tuple(tables.shape)}; make them with slax.nn.hash_encoding_init(key, config)."
        )
    if x.ndim < 1 or x.shape[-1] != config.dimensions:
        raise ValueError(
            f"slax.nn.{function}: x must have shape (..., {config.dimensions}) for a "
            f"{config.dimensions}-D encoding, got {tuple(x.shape)}."
        )
