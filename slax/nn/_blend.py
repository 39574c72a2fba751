"""Weighted sums of table rows as JAX primitives: the part of the hash encoding that reads its tables.

``blend(rows, table, weights)[..., l, f] = sum_c weights[..., l, c] * table[rows[..., l, c], f]``
is bilinear in ``table`` and ``weights`` (``rows``, integers, are not differentiated). Its
derivatives are the same operation or one of its two transposes, which are bilinear too:

- ``scatter(rows, values, weights)`` (the table's shape): adds ``weights * values`` into the rows,
  the transpose of ``blend`` in the table (Slang's ``bwd_diff`` of ``blend_tables``, an atomic
  add per corner);
- ``corner_products(rows, table, values)`` (the weights' shape): ``table[rows] . values`` per corner,
  the transpose of ``blend`` in the weights (``bwd_diff`` of ``blend_weights``).

So the three primitives below close under ``jax.jvp`` and transposition to every order: a gradient
of a loss that holds a gradient (an eikonal term) is another of them, and never a second derivative
of a Slang function that reads a tensor (which slax refuses: docs/functions.md, "Tensors"). Each
runs ``blend_tables_2d``/``_3d`` or ``blend_weights_2d``/``_3d`` of
``shaders/nn/hash_encoding.slang`` through slax's functions: its value, or its ``jax.vjp``.

The table may be float32 or float16 (one generic Slang source, summing in float): ``blend`` and
``scatter`` return the table's dtype, ``corner_products`` the weights' float32; ``scatter`` adds in
float32 on every route (:func:`_scatter_impl` says why).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

import slax
from slax._jax_api import Zero, instantiate_zeros, is_undefined_primal, lower_fun, primitive_jvps
from slax._primitive import declare_primitive, result_aval

_DIMENSIONS = {4: "2d", 8: "3d"}
"""The Slang functions' suffix for a cell's corner count: 2^2 (bilinear) or 2^3 (trilinear)."""


def _slang_blend(differentiated, rows, table, weights):
    """``blend_tables`` or ``blend_weights`` (``differentiated``: ``"tables"`` or ``"weights"``,
    the operand its ``bwd_diff`` differentiates) over the grid ``(..., levels, features)``: one call
    per output value."""
    function = slax.load_module("nn/hash_encoding")[f"blend_{differentiated}_{_DIMENSIONS[rows.shape[-1]]}"]
    feature = jnp.arange(table.shape[-1], dtype=jnp.int32)
    return function(table, feature, rows[..., None, :], weights[..., None, :])


Spread = tuple[tuple[int, int, int, int], ...]
"""Rows of the table that many points add into at once, as ``(first, used, copies, spare)``: the
scatter adds the share of the point at flat position p (of ``rows.shape[:-1]``) in rows ``[first,
first + used)`` into copy ``k = p mod copies`` of them, copy 0 the rows themselves and copy k > 0
rows ``[spare + (k - 1) * used, spare + k * used)``, past the table's rows, then sums the copies
back into the first. A scatter's gradient table has :func:`gradient_rows` rows; what it returns,
the table's.

Why: a float atomic add waits for the last one into the same L2 cache line, and a coarse dense
level (instant-NGP's image grid: 289 to 1849 vertices) takes a whole batch's adds on a few lines;
BENCHMARKS.md ("The hash encoding") measures the scatter with and without copies."""


def gradient_rows(table_rows: int, spread: Spread) -> int:
    """The rows of a scatter's gradient table: the table's, then each range's copies."""
    return table_rows + sum((copies - 1) * used for _, used, copies, _ in spread)


def _spread_rows(rows, spread: Spread):
    """``rows`` with each range's rows moved to the copy of their point (see :data:`Spread`)."""
    if not spread:
        return rows
    flat = jnp.arange(math.prod(rows.shape[:-1]), dtype=rows.dtype).reshape(*rows.shape[:-1], 1)
    moved = rows
    for first, used, copies, spare in spread:
        copy = flat % copies
        inside = (rows >= first) & (rows < first + used) & (copy > 0)
        moved = jnp.where(inside, spare + (copy - 1) * used + (rows - first), moved)
    return moved


def _sum_copies(table, spread: Spread, table_rows: int):
    """The gradient table's first ``table_rows`` rows, each range's copies added into its rows: one
    gather and sum over the span of rows the ranges cover (:func:`_copy_sources`), one XLA fusion
    where a range at a time took a fusion each, one after the other. The sums stay a fusion of
    their own (an optimisation barrier): fused into their reader, Adam's pass over the whole table,
    they cost it 10 us a step on an H200 (instant-NGP's 2-D grid), for its every row."""
    if not spread:
        return table[:table_rows]
    low, sources = _copy_sources(spread)
    summed = jnp.where(sources[..., None] >= 0, table[np.maximum(sources, 0)], 0).sum(1)
    summed = jax.lax.optimization_barrier(summed)
    return jax.lax.dynamic_update_slice(table, summed, (low, 0))[:table_rows]


@functools.cache
def _copy_sources(spread: Spread) -> tuple[int, np.ndarray]:
    """``(low, sources)``: for each row of the span ``[low, high)`` that ``spread``'s ranges cover,
    the gradient table's rows whose sum it takes (itself, then its copies), -1 past a range's
    copies (or in the span's rows outside every range, which keep only themselves)."""
    low = min(first for first, *_ in spread)
    high = max(first + used for first, used, *_ in spread)
    most = max(copies for _, _, copies, _ in spread)
    sources = np.full((high - low, most), -1, np.int64)
    sources[:, 0] = np.arange(low, high)
    for first, used, copies, spare in spread:
        for k in range(1, copies):
            sources[first - low : first - low + used, k] = spare + (k - 1) * used + np.arange(used)
    return low, sources.astype(np.int32)


def _blend_impl(rows, table, weights, *, spread):
    return _slang_blend("tables", rows, table, weights)


def _scatter_impl(rows, values, weights, *, table_rows, spread):
    """Adds in float32 whatever the values' dtype (the float ``blend_tables``'s bwd_diff, into a
    float32 table), the copies too, and rounds each row's sum to the values' dtype once.

    The float16 ``blend_tables``'s bwd_diff would add each point's share into a float16 buffer (in
    place on the CPU device; a half atomic add on Vulkan, which lavapipe runs, and on CUDA): an
    entry of a coarse level takes thousands of shares a batch, and a share below half an ulp of the
    running sum (from a sum of 16 on, any below 2^-7) is lost, so the gradients of the entries most
    points read would come back short (~5% in tests/test_hash_encoding.py's float16 check).
    tiny-cuda-nn adds in float too where each add is of one value, as here (one call per feature),
    and in half only for pairs (``atomicAdd(__half2)``)."""
    zero = jnp.zeros((gradient_rows(table_rows, spread), values.shape[-1]), jnp.float32)
    moved = _spread_rows(rows, spread)
    _, pullback = jax.vjp(lambda table: _slang_blend("tables", moved, table, weights), zero)
    added = pullback(values.astype(jnp.float32))[0]
    return _sum_copies(added, spread, table_rows).astype(values.dtype)


def _corner_products_impl(rows, table, values, *, spread):
    zero = jnp.zeros(rows.shape, jnp.float32)
    _, pullback = jax.vjp(lambda weights: _slang_blend("weights", rows, table, weights), zero)
    return pullback(values)[0]


def _blend_abstract(rows, table, weights, *, spread):
    return result_aval(rows.shape[:-1] + table.shape[-1:], table.dtype, [rows, table, weights])


def _scatter_abstract(rows, values, weights, *, table_rows, spread):
    return result_aval((table_rows, values.shape[-1]), values.dtype, [rows, values, weights])


def _corner_products_abstract(rows, table, values, *, spread):
    return result_aval(rows.shape, jnp.float32, [rows, table, values])


def _bilinear_jvp(primitive, primals, tangents, **params):
    """``d p(rows, a, b) = p(rows, da, b) + p(rows, a, db)``, for each of the three."""
    rows, a, b = primals
    _, da, db = tangents
    out = primitive.bind(rows, a, b, **params)
    terms = []
    if type(da) is not Zero:
        terms.append(primitive.bind(rows, da, b, **params))
    if type(db) is not Zero:
        terms.append(primitive.bind(rows, a, db, **params))
    if not terms:
        return out, Zero.from_primal_value(out)
    return out, functools.reduce(jnp.add, terms)


def _blend_transpose(cotangent, rows, table, weights, *, spread):
    if type(cotangent) is Zero:
        return None, None, None
    cotangent = instantiate_zeros(cotangent)
    if is_undefined_primal(table):
        scattered = scatter_p.bind(rows, cotangent, weights, table_rows=table.aval.shape[0], spread=spread)
        return None, scattered, None
    return None, None, corner_products_p.bind(rows, table, cotangent, spread=spread)


def _scatter_transpose(cotangent, rows, values, weights, *, table_rows, spread):
    if type(cotangent) is Zero:
        return None, None, None
    cotangent = instantiate_zeros(cotangent)
    if is_undefined_primal(values):
        return None, blend_p.bind(rows, cotangent, weights, spread=spread), None
    return None, None, corner_products_p.bind(rows, cotangent, values, spread=spread)


def _corner_products_transpose(cotangent, rows, table, values, *, spread):
    if type(cotangent) is Zero:
        return None, None, None
    cotangent = instantiate_zeros(cotangent)
    if is_undefined_primal(table):
        scattered = scatter_p.bind(rows, values, cotangent, table_rows=table.aval.shape[0], spread=spread)
        return None, scattered, None
    return None, None, blend_p.bind(rows, table, cotangent, spread=spread)


def _per_example_rows(rows, size, table_rows):
    """``rows`` (batch first) offset into the example's own table in a stack of ``size`` tables
    flattened to ``(size * table_rows, features)``."""
    offsets = jnp.arange(size, dtype=rows.dtype) * table_rows
    return rows + offsets.reshape((size,) + (1,) * (rows.ndim - 1))


def _to_front(value, dim, size):
    if dim is None:
        return jnp.broadcast_to(value, (size, *value.shape))
    return jnp.moveaxis(value, dim, 0)


def _batch_reading(primitive, args, dims, *, spread):
    """``blend`` and ``corner_products``, whose second operand is the table: the batch becomes a
    leading axis of the per-point operands; a batched table (one per example) is the stack of the
    tables, each example's rows offset into its own (and no rows spread: :data:`Spread` names one
    table's)."""
    rows, table, other = args
    rows_dim, table_dim, other_dim = dims
    size = next(value.shape[dim] for value, dim in zip(args, dims) if dim is not None)
    rows, other = _to_front(rows, rows_dim, size), _to_front(other, other_dim, size)
    if table_dim is not None:
        table = jnp.moveaxis(table, table_dim, 0)
        rows = _per_example_rows(rows, size, table.shape[1])
        table = table.reshape(-1, table.shape[-1])
        spread = ()
    return primitive.bind(rows, table, other, spread=spread), 0


def _batch_scatter(primitive, args, dims, *, table_rows, spread):
    """``scatter``: an example's values add into a table of its own, so the result is the stack of
    them, added as one table of ``size * table_rows`` rows (no rows spread: :data:`Spread` names one
    table's)."""
    size = next(value.shape[dim] for value, dim in zip(args, dims) if dim is not None)
    rows, values, weights = (_to_front(value, dim, size) for value, dim in zip(args, dims))
    rows = _per_example_rows(rows, size, table_rows)
    out = primitive.bind(rows, values, weights, table_rows=size * table_rows, spread=())
    return out.reshape(size, table_rows, out.shape[-1]), 0


blend_p = declare_primitive(
    "slax_blend",
    abstract_eval=_blend_abstract,
    lowering=lower_fun(_blend_impl, multiple_results=False),
    batching_rule=_batch_reading,
    multiple_results=False,
    transpose=_blend_transpose,
)
scatter_p = declare_primitive(
    "slax_blend_scatter",
    abstract_eval=_scatter_abstract,
    lowering=lower_fun(_scatter_impl, multiple_results=False),
    batching_rule=_batch_scatter,
    multiple_results=False,
    transpose=_scatter_transpose,
)
corner_products_p = declare_primitive(
    "slax_blend_corner_products",
    abstract_eval=_corner_products_abstract,
    lowering=lower_fun(_corner_products_impl, multiple_results=False),
    batching_rule=_batch_reading,
    multiple_results=False,
    transpose=_corner_products_transpose,
)
for _primitive in (blend_p, scatter_p, corner_products_p):
    primitive_jvps[_primitive] = functools.partial(_bilinear_jvp, _primitive)


def blend(rows: jax.Array, table: jax.Array, weights: jax.Array, spread: Spread = ()) -> jax.Array:
    """``sum_c weights[..., c] * table[rows[..., c]]``: ``rows`` int32 ``(..., corners)`` (4 or 8
    corners) into ``table`` ``(table_rows, features)``, float32 or float16, ``weights`` float32
    ``(..., corners)``; returns ``(..., features)`` of the table's dtype, summed in float32 and
    rounded once. Differentiable to any order in ``table`` and ``weights``: the gradient in the
    table is of its dtype, added in float32 and rounded once (:func:`_scatter_impl`), that in the
    weights float32; the gradients in the table add ``spread``'s rows through copies
    (:data:`Spread`)."""
    return blend_p.bind(rows, table, weights, spread=spread)
