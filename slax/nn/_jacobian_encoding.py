"""The hash encoding and its Jacobian in the point, read in one pass over the corners, and its
transpose, which adds both cotangents into the tables in one pass
(``shaders/nn/fused_encoding.slang``'s ``encode_jacobian`` and ``scatter_jacobian``).

With ``w_c(x)`` and ``r_c(x)`` as in slax/nn/_fused_encoding.py, two primitives, each linear in
its second operand and the other's transpose in it:

- ``encode_jacobian(x, tables)[..., l, 0, :] = sum_c w_c(x) tables[r_c]`` (the encoding) and
  ``[..., l, 1 + i, :] = sum_c d/dx_i w_c(x) tables[r_c]`` (its derivative along axis i);
- ``scatter_jacobian(x, cotangent)``: the tables' shape, ``w_c ct[0] + sum_i d/dx_i w_c ct[1 + i]``
  added into row ``r_c``, one atomic vector add a corner.

Why: an eikonal loss holds the gradient of ``f(encoding(x))`` in x, which from ``hash_encode``
JAX computes with the encoding's gradient in x (``point_gradient``) and differentiates in the
tables with two scatters, the transposes of the encoding (its features' cotangent) and of that
gradient (the network's input gradient times the eikonal term's cotangent). Read as the
encoding's Jacobian, that gradient is a product in plain JAX, so the loss touches the tables in
two passes, this read and this scatter, and the network's second derivative reads the Jacobian,
not the tables.

Derivatives in x (the weights' second derivatives) are refused: ``hash_encode`` has them.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from slax._jax_api import Zero, instantiate_zeros, lower_fun, primitive_jvps
from slax._primitive import declare_primitive, result_aval
from slax.nn._blend import Spread
from slax.nn._fused_encoding import (
    _add_into_tables,
    _batch_reading,
    _batch_scatter,
    _chunk_size,
    _grid,
    _per_call,
    _slang,
    linear_jvp,
    refuse_x,
)

_PUBLIC = "slax.nn.hash_encode_with_jacobian"


def _encode_jacobian_impl(x, tables, *, config, stacked, spread):
    """The kernel's ``(..., levels, chunks, 1 + d, F / chunks)`` as ``(..., levels, 1 + d, F)``."""
    rows = tables.reshape(-1, _chunk_size(config.features_per_level))
    both = _slang("encode_jacobian", config)(rows, _per_call(x), *_grid(x, config, stacked, ()))
    both = jnp.moveaxis(both, -3, -2)
    return both.reshape(*both.shape[:-2], config.features_per_level)


def _scatter_jacobian_impl(x, cotangent, *, config, stacked, spread, table_rows):
    size = _chunk_size(config.features_per_level)
    chunked = cotangent.reshape(*cotangent.shape[:-1], -1, size)
    chunked = jnp.moveaxis(chunked, -2, -3)  # (..., levels, chunks, 1 + d, F / chunks)
    sums = {"K": config.dimensions + 1}  # D + 1 written out: Slang 2026.12 crashes on that generic argument
    return _add_into_tables("scatter_jacobian", x, chunked, (), config, stacked, spread, table_rows, sums)


def _encode_jacobian_abstract(x, tables, *, config, stacked, spread):
    shape = x.shape[:-1] + (config.levels, 1 + config.dimensions, config.features_per_level)
    return result_aval(shape, tables.dtype, [x, tables])


def _scatter_jacobian_abstract(x, cotangent, *, config, stacked, spread, table_rows):
    return result_aval((table_rows, cotangent.shape[-1]), cotangent.dtype, [x, cotangent])


def _refuse_x_term(primitive, x, operands, dx, params):
    """No term in x: it would need the weights' second derivatives, which these kernels do not take."""
    raise NotImplementedError(
        f"{_PUBLIC}: argument 'x' is not differentiable here (the Jacobian's derivative in x "
        "needs the encoding's second derivatives); differentiate slax.nn.hash_encode in x "
        "instead (jax.jacfwd, jax.hessian), or hold x constant (jax.lax.stop_gradient)."
    )


_refuse_x = functools.partial(refuse_x, primitives=f"{_PUBLIC}: the encoding and its Jacobian")


def _encode_jacobian_transpose(cotangent, x, tables, *, config, stacked, spread):
    _refuse_x(x)
    if type(cotangent) is Zero:
        return None, None
    rows = tables.aval.shape[0]
    params = {"config": config, "stacked": stacked, "spread": spread}
    return None, scatter_jacobian_p.bind(x, instantiate_zeros(cotangent), table_rows=rows, **params)


def _scatter_jacobian_transpose(cotangent, x, values, *, config, stacked, spread, table_rows):
    _refuse_x(x)
    if type(cotangent) is Zero:
        return None, None
    params = {"config": config, "stacked": stacked, "spread": spread}
    return None, encode_jacobian_p.bind(x, instantiate_zeros(cotangent), **params)


encode_jacobian_p = declare_primitive(
    "slax_hash_encode_jacobian",
    abstract_eval=_encode_jacobian_abstract,
    lowering=lower_fun(_encode_jacobian_impl, multiple_results=False),
    batching_rule=_batch_reading,
    multiple_results=False,
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
    primitive_jvps[_primitive] = functools.partial(linear_jvp, _refuse_x_term, _primitive)


def encode_jacobian(x, tables, config, spread: Spread = ()):
    """Points ``x`` float32 ``(..., d)`` in the flattened ``tables`` ``(levels * T, F)``: the
    encoding (``[..., 0, :]``) and its derivative along each axis of x (``[..., 1 + i, :]``),
    ``(..., levels, 1 + d, F)`` of the tables' dtype. Differentiable in the tables to every order;
    the gradient adds ``spread``'s rows through copies (:data:`slax.nn._blend.Spread`)."""
    return encode_jacobian_p.bind(x, tables, config=config, stacked=0, spread=spread)
