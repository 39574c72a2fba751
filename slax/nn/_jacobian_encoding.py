"""The hash encoding and its Jacobian in the point, read in one pass over the corners, and its
transpose, which adds both cotangents into the tables in one pass
(``shaders/nn/fused_encoding.slang``'s ``encode_jacobian`` and ``scatter_jacobian``).

With ``w_c(x)`` and ``r_c(x)`` as in slax/nn/_fused_encoding.py, two primitives, each linear in
its operands but ``x`` and the other's transpose in them:

- ``encode_jacobian(x, tables)``: two results, the encoding ``features[..., l, f] = sum_c w_c(x)
  tables[r_c, f]`` ``(..., levels, F)`` and its Jacobian ``jacobian[..., l, i, f] = sum_c d/dx_i
  w_c(x) tables[r_c, f]`` ``(..., levels, d, F)``, a level's features innermost;
- ``scatter_jacobian(x, features, jacobian)``: its transpose, jointly linear in the two
  cotangents (of those shapes): the tables' shape, ``w_c features[l, :] + sum_i d/dx_i w_c
  jacobian[l, i, :]`` added into row ``r_c``, one atomic vector add a corner.

``hash_encode_with_jacobian`` returns the Jacobian feature-major, ``(..., levels * F, d)``, as
``jacobian``'s last two axes swapped: XLA fuses that transpose into what reads it, and the field's
gradient ``sum_k jacobian[..., k, :] * slopes[..., k, None]`` then reduces the features with them
innermost, contiguous (written ``(..., levels, F, d)``, that product's reduction over the middle
axis took 237 us against 56 on an H200 at 2^18 points, 16 levels, F = 2, d = 3). Its transpose
swaps the cotangent back (JAX's transpose of the swap), fused likewise into what builds it.

Why: an eikonal loss holds the gradient of ``f(encoding(x))`` in x, which from ``hash_encode``
JAX computes with the encoding's gradient in x (``point_gradient``) and differentiates in the
tables with two scatters, the transposes of the encoding (its features' cotangent) and of that
gradient (the network's input gradient times the eikonal term's cotangent). Read as the
encoding's Jacobian, that gradient is a product in plain JAX, so the loss touches the tables in
two passes, this read and this scatter, and the network's second derivative reads the Jacobian,
not the tables.

Parameters as slax/nn/_fused_encoding.py's; ``dtype`` is ``encode_jacobian``'s features' (the
Jacobian keeps the tables', as it multiplies the network's input gradient in float32) and
``scatter_jacobian``'s result's (the tables').

Derivatives in x (the weights' second derivatives) are refused: ``hash_encode`` has them.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from slax._jax_api import Zero, instantiate_zeros, is_undefined_primal, lower_fun, primitive_jvps
from slax._primitive import declare_primitive, result_aval
from slax._signature import SLANG_SCALAR_FOR_DTYPE
from slax.nn._blend import Spread
from slax.nn._fused_encoding import (
    _add_into_tables,
    _batch_reading,
    _batch_scatter,
    _chunk_size,
    _chunked,
    _dtype,
    _grid,
    _per_call,
    _slang,
    refuse_x,
)

_PUBLIC = "slax.nn.hash_encode_with_jacobian"


def _encode_jacobian_impl(x, tables, *, config, stacked, spread, dtype):
    """The kernel's ``(..., levels, chunks, F / chunks)`` features and ``(..., levels, chunks, d,
    F / chunks)`` Jacobian as ``(..., levels, F)`` and ``(..., levels, d, F)`` (a level's chunks
    hold consecutive features: with one chunk, F <= 4, no data moves)."""
    rows = tables.reshape(-1, _chunk_size(config.features_per_level))
    function = _slang("encode_jacobian", config, U=SLANG_SCALAR_FOR_DTYPE[dtype])
    features, jacobian = function(rows, _per_call(x), *_grid(x, config, stacked, ()))
    shape = x.shape[:-1] + (config.levels, config.features_per_level)
    jacobian = jnp.moveaxis(jacobian, -3, -2)  # (..., levels, d, chunks, F / chunks)
    return [features.reshape(shape), jacobian.reshape(*shape[:-1], config.dimensions, shape[-1])]


def _scatter_jacobian_impl(x, features, jacobian, *, config, stacked, spread, dtype, table_rows):
    features = _chunked(features, config)  # (..., levels, chunks, F / chunks)
    jacobian = jnp.moveaxis(_chunked(jacobian, config), -2, -3)  # (..., levels, chunks, d, F / chunks)
    cotangents = [features, jacobian]
    grid = (config, stacked, spread, table_rows)
    return _add_into_tables("scatter_jacobian", x, (), cotangents, *grid, dtype=dtype)


def _encode_jacobian_abstract(x, tables, *, config, stacked, spread, dtype):
    shape = x.shape[:-1] + (config.levels, config.features_per_level)
    return [
        result_aval(shape, dtype, [x, tables]),
        result_aval((*shape[:-1], config.dimensions, shape[-1]), tables.dtype, [x, tables]),
    ]


def _scatter_jacobian_abstract(x, features, jacobian, *, config, stacked, spread, dtype, table_rows):
    return result_aval((table_rows, features.shape[-1]), dtype, [x, features, jacobian])


def _jvp(primitive, primals, tangents, **params):
    """The JVP of either primitive, jointly linear in its operands but ``x``: itself at their
    tangents (a zero one instantiated). Not :func:`linear_jvp`'s term per operand, which is for
    a primitive linear in each operand apart (``scatter_jacobian`` sums its two cotangents'
    shares), and for one result. No term in ``x``: it would need the weights' second derivatives,
    which these kernels do not take."""
    x, *operands = primals
    dx, *doperands = tangents
    if type(dx) is not Zero:
        raise NotImplementedError(
            f"{_PUBLIC}: argument 'x' is not differentiable here (the Jacobian's derivative in x "
            "needs the encoding's second derivatives); differentiate slax.nn.hash_encode in x "
            "instead (jax.jacfwd, jax.hessian), or hold x constant (jax.lax.stop_gradient)."
        )
    out = primitive.bind(*primals, **params)
    if all(type(tangent) is Zero for tangent in doperands):
        zero = Zero.from_primal_value
        return out, [zero(value) for value in out] if primitive.multiple_results else zero(out)
    return out, primitive.bind(x, *map(instantiate_zeros, doperands), **params)


_refuse_x = functools.partial(refuse_x, primitives=f"{_PUBLIC}: the encoding and its Jacobian")


def _encode_jacobian_transpose(cotangents, x, tables, *, config, stacked, spread, dtype):
    _refuse_x(x)
    if all(type(cotangent) is Zero for cotangent in cotangents):
        return None, None
    features, jacobian = map(instantiate_zeros, cotangents)
    params = {"config": config, "stacked": stacked, "spread": spread}
    rows = tables.aval.shape[0]
    return None, scatter_jacobian_p.bind(
        x, features, jacobian, dtype=_dtype(tables), table_rows=rows, **params
    )


def _scatter_jacobian_transpose(
    cotangent, x, features, jacobian, *, config, stacked, spread, dtype, table_rows
):
    """The read of the tables' cotangent, into whichever of the two operands is linear (the other,
    where JAX holds it known, is the zeros :func:`_jvp` instantiated)."""
    _refuse_x(x)
    if type(cotangent) is Zero:
        return None, None, None
    params = {"config": config, "stacked": stacked, "spread": spread}
    read = encode_jacobian_p.bind(x, instantiate_zeros(cotangent), dtype=_dtype(features), **params)
    linear = [is_undefined_primal(operand) for operand in (features, jacobian)]
    return None, *(value if is_linear else None for value, is_linear in zip(read, linear, strict=True))


encode_jacobian_p = declare_primitive(
    "slax_hash_encode_jacobian",
    abstract_eval=_encode_jacobian_abstract,
    lowering=lower_fun(_encode_jacobian_impl, multiple_results=True),
    batching_rule=_batch_reading,
    multiple_results=True,
    transpose=_encode_jacobian_transpose,
)
scatter_jacobian_p = declare_primitive(
    "slax_hash_scatter_jacobian",
    abstract_eval=_scatter_jacobian_abstract,
    lowering=lower_fun(_scatter_jacobian_impl, multiple_results=False),
    batching_rule=_batch_scatter,
    multiple_results=False,
    transpose=_scatter_jacobian_transpose,
)
for _primitive in (encode_jacobian_p, scatter_jacobian_p):
    primitive_jvps[_primitive] = functools.partial(_jvp, _primitive)


def encode_jacobian(x, tables, config, spread: Spread = (), dtype=None):
    """Points ``x`` float32 ``(..., d)`` in the ``tables`` ``(config.table_rows, F)``: the
    encoding ``(..., levels, F)`` of ``dtype`` (default the tables') and its Jacobian in x
    ``(..., levels, d, F)`` (``[..., l, i, f]``: feature f's derivative in ``x[..., i]``) of the
    tables' dtype. Differentiable in the tables to every order; the gradient adds ``spread``'s
    rows through copies (:data:`slax.nn._blend.Spread`)."""
    dtype = str(jnp.dtype(tables.dtype if dtype is None else dtype))
    return encode_jacobian_p.bind(x, tables, config=config, stacked=0, spread=spread, dtype=dtype)
