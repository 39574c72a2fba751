"""The hash encoding's fused primitives: kernels that take the points, not their corners' rows and
weights, and find those in registers (``shaders/nn/fused_encoding.slang``).

With ``w_c(x)`` and ``r_c(x)`` the weight and table row of corner c of the cell of level l holding
point x (piecewise constant rows), three primitives, each linear in every operand but ``x``:

- ``encode(x, tables)[..., l, :] = sum_c w_c(x) tables[r_c]``, the encoding, and with a direction
  ``encode(x, tables, v) = sum_c (grad w_c(x) . v) tables[r_c]``, its derivative along v in x;
- ``scatter(x, cotangent[, v])``: ``encode``'s transpose in the tables (the tables' shape), added
  atomically a corner's features at a time by Slang's ``bwd_diff``;
- ``point_gradient(x, tables, cotangent)[...] = sum_{l,c} <cotangent[l], tables[r_c]> grad w_c(x)``
  (x's shape): ``encode``'s gradient in x, the transpose of ``encode(x, tables, v)`` in v.

Each one's JVP in its linear operands, and its transpose in them, is another of the three, and
the JVP of ``encode(x, tables)`` and ``scatter(x, cotangent)`` in x is the same with the direction
``dx``; so a loss's gradient, and the gradient in the tables of a loss that holds the gradient in x
(an eikonal term: ``point_gradient`` transposed, ``scatter(x, cotangent, v)`` and ``encode(x,
tables, v)``), runs on fused kernels alone, and never needs a second derivative of a Slang
function that reads a tensor (which slax refuses). What needs the weights' second derivatives in x
(``jax.hessian`` in x; the JVP in x of the three with a direction or of ``point_gradient``) is
computed through the corners' rows and weights in memory (:func:`_unfused`: Slang's
``level_corners`` and slax/nn/_blend.py's primitives, which differentiate to second order).

Operands: ``x`` float32 ``(..., d)``; ``tables`` ``(rows, F)``, float32 or float16, the levels'
tables flattened (or a stack of them, see ``stacked``); ``cotangent`` ``(..., L, F)``, float32 or
float16. Parameters: ``config`` (:class:`slax.nn.HashEncodingConfig`); ``spread``
(:data:`slax.nn._blend.Spread`, the coarse levels' rows a scatter spreads over copies);
``stacked``, how many leading axes of ``x`` pick which table of a stack the point reads (``vmap``
over tables: the stack is flattened into ``tables``, one table being ``config.table_rows`` rows); ``dtype``,
the result's dtype name for ``encode`` (the features') and ``scatter`` (the tables'), which need
not be their operands' (a float16 network's features from float32 tables: summed in float32 and
rounded once to it, where a cast after the kernel would be one more pass over them in XLA);
``scatter``'s ``table_rows``.
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
from slax._signature import SLANG_SCALAR_FOR_DTYPE
from slax.nn import _blend
from slax.nn._blend import Spread, _sum_copies, gradient_rows

_CORNERS_FUNCTIONS = {2: "level_corners_2d", 3: "level_corners_3d"}


def _chunk_size(features: int) -> int:
    """Features a call reads as one Slang vector (at most 4): all ``features``, or the largest
    divisor of them up to 4."""
    return next(size for size in (features, 4, 3, 2, 1) if size <= 4 and features % size == 0)


def _slang(name: str, config, **generics):
    """The fused Slang function ``name`` for the config's dimension and chunk of features, and any
    other generic parameters it has (``generics``)."""
    function = slax.load_module("nn/fused_encoding")[name]
    return function.specialize(D=config.dimensions, F=_chunk_size(config.features_per_level), **generics)


def _grid_levels(config, spread: Spread) -> dict:
    """The ``GridLevel`` struct's fields, ``(levels, 1)`` int32 arrays that the points broadcast
    against (the last axis the chunks'); ``copies`` and ``spare`` from ``spread`` (1 and 0 for a
    level not spread)."""
    copies, spare = [1] * config.levels, [0] * config.levels
    for first, _, count, at in spread:
        level = config.level_offsets.index(first)
        copies[level], spare[level] = count, at
    fields = {
        "offset": config.level_offsets,
        "entries": config.level_entries,
        "resolution": config.resolutions,
        "dense": config.dense_levels,
        "copies": copies,
        "spare": spare,
    }
    return {name: _level_field(value) for name, value in fields.items()}


def _level_field(values) -> jax.Array:
    """A field's ``(levels, 1)`` values, or ``(1, 1)`` where every level's is the same (a level's
    copies and spare rows where no level spreads): XLA turns a constant of one repeated value into
    a broadcast, which a kernel of its own would write for every call."""
    values = np.asarray(values, np.int32)[:, None]
    return jnp.asarray(values[:1] if (values == values[0]).all() else values)


def _origin(x, config, stacked: int):
    """Each point's first entry in the flattened stack of tables: the flat position over ``x``'s
    first ``stacked`` axes times one table's entries (0 for one table), broadcasting over the grid
    ``x.shape[:-1] + (levels, chunks)``."""
    if not stacked:
        return 0
    tables = math.prod(x.shape[:stacked])
    rows = jnp.arange(tables, dtype=jnp.int32) * config.table_rows
    return rows.reshape(x.shape[:stacked] + (1,) * (x.ndim - stacked + 1))


def _per_call(value):
    """A per-point operand ``(..., d)`` broadcasting over the levels and chunks: ``(..., 1, 1, d)``."""
    return value[..., None, None, :]


def _grid(x, config, stacked: int, spread: Spread) -> tuple:
    """The arguments every fused function ends with: the levels, the points' origins and the chunks
    (``chunk``, ``chunks``)."""
    chunks = config.features_per_level // _chunk_size(config.features_per_level)
    chunk = jnp.arange(chunks, dtype=jnp.int32)
    return _grid_levels(config, spread), _origin(x, config, stacked), chunk, chunks


def _chunked(value, config):
    """``(..., F)`` as ``(..., chunks, F / chunks)``, the Slang functions' vectors."""
    size = _chunk_size(config.features_per_level)
    return value.reshape(*value.shape[:-1], value.shape[-1] // size, size)


def _encode_impl(x, tables, *direction, config, stacked, spread, dtype):
    name = "encode_slopes" if direction else "encode_values"
    rows = tables.reshape(-1, _chunk_size(config.features_per_level))
    features = _slang(name, config, U=SLANG_SCALAR_FOR_DTYPE[dtype])(
        rows, _per_call(x), *map(_per_call, direction), *_grid(x, config, stacked, ())
    )
    return features.reshape(*features.shape[:-2], config.features_per_level)


def _scatter_impl(x, cotangent, *direction, config, stacked, spread, dtype, table_rows):
    name = "scatter_slopes" if direction else "scatter_values"
    per_point = [_per_call(value) for value in direction]
    grid = (config, stacked, spread, table_rows)
    return _add_into_tables(name, x, per_point, [_chunked(cotangent, config)], *grid, dtype=dtype)


def _add_into_tables(name, x, per_point, cotangents, config, stacked, spread, table_rows, *, dtype):
    """The scatter of Slang's ``name`` (``bwd_diff`` of a gather from a float32 gradient table),
    ``per_point`` its operands between the point and the cotangents, ``cotangents`` those of each
    call ``(..., levels, chunks, ...)``, float32 or float16: a ``(table_rows, F)`` gradient of
    ``dtype``.

    Adds in float32 whatever the cotangents' dtype (the kernel widens them as it reads them), into
    a float32 table, and rounds each row's sum to ``dtype`` once (slax/nn/_blend.py's
    ``_scatter_impl`` says why). A point's share in a level of ``spread`` goes into copy ``point
    mod copies`` of the level's entries (past the table's rows), summed back after."""
    points = jnp.arange(math.prod(x.shape[:-1]), dtype=jnp.int32).reshape(*x.shape[:-1], 1, 1)
    grid = _grid(x, config, stacked, spread)

    # The Slang function reads the gradient as elements of P = per_element * size values (its
    # gather_cell says why): two rows where two rows' features fit one vector. The rows pair up
    # exactly: every level's entries, and so its copies', are even (HashEncodingConfig's
    # level_entries: T >= 2, or a multiple of 8).
    size = _chunk_size(config.features_per_level)
    per_element = 2 if 2 * size <= 4 else 1
    function = _slang(name, config, P=per_element * size)

    def gather(gradient):
        return function(gradient, _per_call(x), *per_point, *cotangents, *grid, points)

    rows = gradient_rows(table_rows, spread) * config.features_per_level // size
    # The gather's primal table: bwd_diff of a function linear in it never reads it. Not zeros: XLA
    # would make it one buffer with the zeros the gradient is added into, and copy that buffer
    # (the kernel adds into it in place) each call. On a GPU an allocation left unwritten
    # (lax.empty): a pass that fills 67 MB (instant-NGP's tables) took 21 us of a 0.54 ms step on an
    # H200. On the CPU, where lax.empty is zeros, NaN, so that a read would show in the CI's tests.
    shape = (rows // per_element, per_element * size)
    unread = jax.lax.platform_dependent(
        cpu=lambda: jnp.full(shape, jnp.nan, jnp.float32),
        default=lambda: jax.lax.empty(shape, jnp.float32),
    )
    sums, pullback = jax.vjp(gather, unread)
    added = pullback(jnp.ones(sums.shape, sums.dtype))[0]
    added = added.reshape(-1, config.features_per_level)
    return _sum_copies(added, spread, table_rows).astype(dtype)


def _point_gradient_impl(x, tables, cotangent, *, config, stacked, spread):
    """Each level's (and chunk's) share from the kernel, ``(..., levels, chunks, d)``, summed here."""
    rows = tables.reshape(-1, _chunk_size(config.features_per_level))
    shares = _slang("point_gradient", config)(
        rows, _per_call(x), _chunked(cotangent.astype(tables.dtype), config), *_grid(x, config, stacked, ())
    )
    return shares.sum(axis=(-3, -2))


def _encode_abstract(x, tables, *direction, config, stacked, spread, dtype):
    shape = x.shape[:-1] + (config.levels, config.features_per_level)
    return result_aval(shape, dtype, [x, tables, *direction])


def _scatter_abstract(x, cotangent, *direction, config, stacked, spread, dtype, table_rows):
    return result_aval((table_rows, cotangent.shape[-1]), dtype, [x, cotangent, *direction])


def _point_gradient_abstract(x, tables, cotangent, *, config, stacked, spread):
    return result_aval(x.shape, jnp.float32, [x, tables, cotangent])


def _unfused(primitive, x, operands, params):
    """``primitive``'s result, as a function of ``x``, through the corners' rows and weights in
    memory: the twin whose derivatives in ``x`` to second order slax takes (the fallback for the
    JVP in ``x`` that the fused kernels do not have: the weights' second derivatives)."""
    config, stacked, spread = params["config"], params["stacked"], params["spread"]

    def weights_and_rows(x):
        rows, weights = level_corners(x, config, stacked)
        return weights, rows

    if primitive is point_gradient_p:
        tables, cotangent = operands
        _, pullback, rows = jax.vjp(weights_and_rows, x, has_aux=True)
        products = _blend.corner_products_p.bind(rows, tables, cotangent, spread=spread)
        return pullback(products)[0]
    if len(operands) == 2:  # with a direction: the weights' derivative along it
        _, values, rows = jax.jvp(weights_and_rows, (x,), (operands[1],), has_aux=True)
    else:
        values, rows = weights_and_rows(x)
    if primitive is encode_p:
        result = _blend.blend_p.bind(rows, operands[0], values, spread=spread)
    else:
        result = _blend.scatter_p.bind(
            rows, operands[0], values, table_rows=params["table_rows"], spread=spread
        )
    return result.astype(params["dtype"])


def level_corners(x: jax.Array, config, stacked: int = 0) -> tuple[jax.Array, jax.Array]:
    """Each level's cell corners for points ``x (..., d)``, through memory: int32 rows of the
    flattened tables (of the stack, see ``stacked``) and float32 weights, both
    ``(..., levels, 2^d)`` (Slang's ``level_corners_2d/3d``, [Differentiable] in ``x`` to second
    order)."""
    corners = slax.load_module("nn/hash_encoding")[_CORNERS_FUNCTIONS[config.dimensions]]
    levels = (config.level_offsets, config.resolutions, config.dense_levels, config.level_entries)
    rows, weights = corners(x[..., None, :], *(jnp.asarray(value, jnp.int32) for value in levels))
    return rows + jnp.asarray(_origin(x, config, stacked), jnp.int32), weights


def linear_jvp(x_term, primitive, primals, tangents, **params):
    """The JVP of a primitive ``(x, *operands)`` linear in every operand but ``x``: a term per
    nonzero tangent of an operand, the primitive bound with it in the operand's place, and the
    term in ``x`` from ``x_term(primitive, x, operands, dx, params)``."""
    x, *operands = primals
    dx, *doperands = tangents
    out = primitive.bind(*primals, **params)
    terms = []
    for k, tangent in enumerate(doperands):
        if type(tangent) is not Zero:
            changed = [*operands[:k], tangent, *operands[k + 1 :]]
            terms.append(primitive.bind(x, *changed, **params))
    if type(dx) is not Zero:
        terms.append(x_term(primitive, x, operands, dx, params).astype(out.dtype))
    if not terms:
        return out, Zero.from_primal_value(out)
    return out, functools.reduce(jnp.add, terms)


def _x_term(primitive, x, operands, dx, params):
    """The term in ``x`` of :func:`linear_jvp` for the three primitives: the same primitive with
    direction ``dx`` where it has none, else :func:`_unfused`'s JVP."""
    if primitive is not point_gradient_p and len(operands) == 1:
        return primitive.bind(x, operands[0], dx, **params)
    unfused = functools.partial(_unfused, primitive, operands=operands, params=params)
    return jax.jvp(unfused, (x,), (dx,))[1]


def refuse_x(x, primitives: str) -> None:
    """Raises for a transpose in ``x``, which ``primitives`` (named for the message) are not linear in."""
    if is_undefined_primal(x):
        raise NotImplementedError(f"{primitives} are not linear in x.")


_refuse_x = functools.partial(refuse_x, primitives="slax.nn hash encoding: the fused primitives")


def _dtype(operand) -> str:
    """The dtype name of an operand, known or (being transposed) undefined."""
    return str((operand.aval if is_undefined_primal(operand) else operand).dtype)


def _encode_transpose(cotangent, x, tables, *direction, config, stacked, spread, dtype):
    _refuse_x(x)
    result = [None] * (2 + len(direction))
    if type(cotangent) is Zero:
        return result
    cotangent = instantiate_zeros(cotangent)
    params = {"config": config, "stacked": stacked, "spread": spread}
    if is_undefined_primal(tables):
        rows = tables.aval.shape[0]
        result[1] = scatter_p.bind(x, cotangent, *direction, dtype=_dtype(tables), table_rows=rows, **params)
    if direction and is_undefined_primal(direction[0]):
        result[2] = point_gradient_p.bind(x, tables, cotangent, **params)
    return result


def _scatter_transpose(cotangent, x, values, *direction, config, stacked, spread, dtype, table_rows):
    _refuse_x(x)
    result = [None] * (2 + len(direction))
    if type(cotangent) is Zero:
        return result
    cotangent = instantiate_zeros(cotangent)
    params = {"config": config, "stacked": stacked, "spread": spread}
    if is_undefined_primal(values):
        result[1] = encode_p.bind(x, cotangent, *direction, dtype=_dtype(values), **params)
    if direction and is_undefined_primal(direction[0]):
        result[2] = point_gradient_p.bind(x, cotangent, values, **params)
    return result


def _point_gradient_transpose(cotangent, x, tables, values, *, config, stacked, spread):
    _refuse_x(x)
    if type(cotangent) is Zero:
        return None, None, None
    cotangent = instantiate_zeros(cotangent)
    params = {"config": config, "stacked": stacked, "spread": spread}
    if is_undefined_primal(tables):
        rows = tables.aval.shape[0]
        return (
            None,
            scatter_p.bind(x, values, cotangent, dtype=_dtype(tables), table_rows=rows, **params),
            None,
        )
    return None, None, encode_p.bind(x, tables, cotangent, dtype=_dtype(values), **params)


def _move(value, dim, size, to):
    """``value``'s batch axis at ``to`` (broadcast there if it has none)."""
    if dim is None:
        return jnp.broadcast_to(jnp.expand_dims(value, to), value.shape[:to] + (size,) + value.shape[to:])
    return jnp.moveaxis(value, dim, to)


def _batch_reading(primitive, args, dims, *, config, stacked, spread, **rest):
    """``encode``, ``point_gradient`` and ``encode_jacobian`` (two results), whose second operand
    is the tables. Unbatched tables: the batch is one more axis of the points, after those that
    pick a table. A batched stack: the stacks flattened into one, the batch the first axis that
    picks a table (no rows spread: :data:`Spread` names one table's)."""
    x, tables, *per_point = args
    x_dim, tables_dim, *per_point_dims = dims
    size = next(value.shape[dim] for value, dim in zip(args, dims) if dim is not None)
    at = stacked
    if tables_dim is not None:
        tables = jnp.moveaxis(tables, tables_dim, 0)
        tables = tables.reshape(-1, tables.shape[-1])
        at, stacked, spread = 0, stacked + 1, ()
    x = _move(x, x_dim, size, at)
    per_point = [_move(value, dim, size, at) for value, dim in zip(per_point, per_point_dims)]
    out = primitive.bind(x, tables, *per_point, config=config, stacked=stacked, spread=spread, **rest)
    return out, [at] * len(out) if primitive.multiple_results else at


def _batch_scatter(primitive, args, dims, *, config, stacked, spread, table_rows, **rest):
    """``scatter`` and ``scatter_jacobian``: an example's shares add into a table of its own, so
    the result is the stack of them, added as one stack of ``size * table_rows`` rows (no rows
    spread)."""
    size = next(value.shape[dim] for value, dim in zip(args, dims) if dim is not None)
    args = [_move(value, dim, size, 0) for value, dim in zip(args, dims)]
    out = primitive.bind(
        *args, config=config, stacked=stacked + 1, spread=(), table_rows=size * table_rows, **rest
    )
    return out.reshape(size, table_rows, out.shape[-1]), 0


encode_p = declare_primitive(
    "slax_hash_encode",
    abstract_eval=_encode_abstract,
    lowering=lower_fun(_encode_impl, multiple_results=False),
    batching_rule=_batch_reading,
    multiple_results=False,
    transpose=_encode_transpose,
)
scatter_p = declare_primitive(
    "slax_hash_scatter",
    abstract_eval=_scatter_abstract,
    lowering=lower_fun(_scatter_impl, multiple_results=False),
    batching_rule=_batch_scatter,
    multiple_results=False,
    transpose=_scatter_transpose,
)
point_gradient_p = declare_primitive(
    "slax_hash_point_gradient",
    abstract_eval=_point_gradient_abstract,
    lowering=lower_fun(_point_gradient_impl, multiple_results=False),
    batching_rule=_batch_reading,
    multiple_results=False,
    transpose=_point_gradient_transpose,
)
for _primitive in (encode_p, scatter_p, point_gradient_p):
    primitive_jvps[_primitive] = functools.partial(linear_jvp, _x_term, _primitive)


def encode(x: jax.Array, tables: jax.Array, config, spread: Spread = (), dtype=None) -> jax.Array:
    """The encoding of points ``x`` float32 ``(..., d)`` in the flattened ``tables``
    ``(config.table_rows, F)`` (float32 or float16): ``(..., levels, F)`` of ``dtype`` (float32 or
    float16; default the tables'), summed in float32 and rounded once. Differentiable in both to
    second order; the gradient in the tables adds ``spread``'s rows through copies
    (:data:`slax.nn._blend.Spread`)."""
    dtype = str(jnp.dtype(tables.dtype if dtype is None else dtype))
    return encode_p.bind(x, tables, config=config, stacked=0, spread=spread, dtype=dtype)
