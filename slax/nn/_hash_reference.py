"""The multiresolution hash encoding in plain JAX: the twin that slax's tests and experiments compare
:func:`slax.nn.hash_encode` with, and the "plain JAX" model the experiments train beside it.

The same grids, cells, hash and weights as ``shaders/nn/hash_encoding.slang``, written with
gathers (``tables[offset + entry]``, each level's table one slice of the levels'); JAX
differentiates them, the tables' gradient being XLA's scatter-add. float16 tables are read as slax
reads them: gathered in float32, summed in float32 and rounded to float16 once per feature; the
tables are cast to float32 before the gathers, so that the gradient's scatter-add is float32's too,
rounded to float16 once (the cast's transpose).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

from slax.nn._hash_encoding import HashEncodingConfig, _require_arguments, _require_config

HASH_PRIMES = (1, 2654435761, 805459861)
"""The spatial hash's primes, one per dimension (the paper's)."""


def hash_encode_reference(tables: jax.Array, x: jax.Array, config: HashEncodingConfig) -> jax.Array:
    """:func:`slax.nn.hash_encode` in plain JAX: the same arguments, result and conventions.

    Args:
      tables: float32 or float16 ``config.table_shape``, ``(config.table_rows, features_per_level)``.
      x: float32 ``(..., d)``, points in [0, 1]^d.
      config: the encoding's :class:`HashEncodingConfig`.

    Returns:
      ``(..., levels * features_per_level)`` of the tables' dtype.

    Raises:
      TypeError: ``config`` not a :class:`HashEncodingConfig`, ``tables`` not float32 or float16, or
        ``x`` not float32.
      ValueError: ``tables`` not of ``config.table_shape``, or ``x`` not ending in ``config.dimensions``.
    """
    _require_config("hash_encode_reference", config)
    _require_arguments("hash_encode_reference", tables, x, config)
    wide = tables.astype(jnp.float32)
    levels = zip(config.level_offsets, config.level_entries, config.resolutions, config.dense_levels)
    features = [
        _level(wide[first : first + entries], x, resolution, dense, config)
        for first, entries, resolution, dense in levels
    ]
    return jnp.concatenate(features, axis=-1).astype(tables.dtype)


def _level(table: jax.Array, x: jax.Array, resolution: int, dense: bool, config: HashEncodingConfig):
    """One level's interpolated features, ``(..., F)``."""
    position = x * resolution
    cell = jnp.clip(jnp.floor(jax.lax.stop_gradient(position)).astype(jnp.int32), 0, resolution - 1)
    fraction = position - cell.astype(x.dtype)
    result = jnp.zeros((*x.shape[:-1], config.features_per_level), table.dtype)
    for corner in itertools.product((0, 1), repeat=config.dimensions):
        vertex = cell + jnp.asarray(corner, jnp.int32)
        weight = jnp.prod(jnp.where(jnp.asarray(corner, bool), fraction, 1 - fraction), axis=-1)
        entry = _entry(vertex, resolution, dense, config)
        result = result + weight[..., None] * table[entry]
    return result


def _entry(vertex: jax.Array, resolution: int, dense: bool, config: HashEncodingConfig) -> jax.Array:
    """The table entry of grid vertices ``(..., d)``: row-major if ``dense``, else hashed."""
    coordinates = vertex.astype(jnp.uint32)
    entry = jnp.zeros(vertex.shape[:-1], jnp.uint32)
    if dense:
        stride = 1
        for d in range(config.dimensions):
            entry = entry + coordinates[..., d] * jnp.uint32(stride)
            stride *= resolution + 1
        return entry.astype(jnp.int32)
    for d in range(config.dimensions):
        entry = entry ^ (coordinates[..., d] * jnp.uint32(HASH_PRIMES[d]))
    return (entry & jnp.uint32(config.table_size - 1)).astype(jnp.int32)
