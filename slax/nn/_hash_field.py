"""A scalar field behind the hash encoding and its gradient in the point, for an eikonal loss, with
the gradient in the tables added in one pass that reads the Jacobian's cotangent as its two factors.

With ``features, J = encode_jacobian(x, tables)`` (slax/nn/_jacobian_encoding.py), ``values =
apply(params, features)`` and the network's input gradient ``slopes = d values / d features``, the
field's gradient is ``J^T slopes``. A loss on ``values`` and that gradient sends back the
cotangents ``dvalues`` and ``direction``; through JAX's rules the Jacobian's cotangent is ``slopes
(x) direction``, which XLA writes out (``(..., levels, d, F)`` floats, 100 MB at 2^18 points and 16
levels in 3-D) for the scatter to read back. Here a ``jax.custom_vjp`` sees both factors, and
``scatter_field`` (``shaders/nn/fused_encoding.slang``) adds ``w_c ct_features + (grad w_c .
direction) slopes`` into each corner's row, the same sums without that array. The network's
parts are JAX's rules of ``apply`` (slax's MLP kernels for :func:`slax.nn.mlp_apply`, the Hessian
kernel for its part along the direction).

The derivative in ``x`` is refused, as ``hash_encode_with_jacobian``'s: it needs the encoding's
second derivatives in ``x``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero, custom_vjp_primal_tree_values

from slax.nn._fused_encoding import _add_into_tables, _chunked, _per_call
from slax.nn._jacobian_encoding import encode_jacobian

_PUBLIC = "slax.nn.hash_field_with_gradient"


def _slopes(apply, params, features):
    """The values of ``apply(params, features)`` (one output a point) and their gradient in the
    features, each point's own."""
    values, pullback = jax.vjp(lambda h: apply(params, h), features)
    (slopes,) = pullback(jnp.ones_like(values))
    return values, slopes


def _field(apply, config, spread, dtype, params, tables, x):
    """The values and their gradient in ``x``, and what the backward pass keeps."""
    features, jacobian = encode_jacobian(x, tables, config, spread, dtype)  # (..., L, F), (..., L, d, F)
    features = features.reshape(*x.shape[:-1], -1)
    values, slopes = _slopes(apply, params, features)
    if values.shape != x.shape[:-1] + (1,):
        raise ValueError(
            f"{_PUBLIC}: apply must give one value a point, shape {x.shape[:-1] + (1,)} for x of shape "
            f"{x.shape}; got {values.shape}."
        )
    by_level = slopes.reshape(*x.shape[:-1], config.levels, 1, config.features_per_level)
    gradient = jnp.sum(jacobian.astype(jnp.float32) * by_level.astype(jnp.float32), axis=(-3, -1))
    return (values, gradient), (params, features, jacobian, slopes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _hash_field(apply, config, spread, dtype, params, tables, x):
    return _field(apply, config, spread, dtype, params, tables, x)[0]


def _hash_field_fwd(apply, config, spread, dtype, params, tables, x):
    """The field and its gradient, keeping the parameters, the features, the Jacobian and the
    slopes; refuses a derivative in ``x`` (``symbolic_zeros`` says which inputs are perturbed)."""
    if x.perturbed:
        raise NotImplementedError(
            f"{_PUBLIC}: argument 'x' is not differentiable here (the field's gradient's derivative "
            "in x needs the encoding's second derivatives); differentiate slax.nn.hash_encode in x "
            "instead, or hold x constant (jax.lax.stop_gradient)."
        )
    params, tables, x = custom_vjp_primal_tree_values((params, tables, x))
    outputs, kept = _field(apply, config, spread, dtype, params, tables, x)
    return outputs, (*kept, tables, x)


def _instantiated(cotangent):
    """A cotangent JAX passes as a symbolic zero, as zeros."""
    return jnp.zeros(cotangent.shape, cotangent.dtype) if isinstance(cotangent, SymbolicZero) else cotangent


def _hash_field_bwd(apply, config, spread, dtype, kept, cotangents):
    """The parameters' cotangent from JAX's rules of ``apply`` (both of the field's cotangents);
    the tables' from ``scatter_field``, at the features' cotangent and the Jacobian's as its two
    factors, the slopes and the gradient's cotangent; none for ``x``."""
    params, features, jacobian, slopes, tables, x = kept
    dvalues, dgradient = map(_instantiated, cotangents)
    # The slopes' cotangent J dgradient, and what the network sends back from both cotangents.
    direction = jnp.sum(jacobian * dgradient[..., None, :, None], axis=-2)  # (..., L, F)
    direction = direction.reshape(features.shape).astype(slopes.dtype)
    _, network = jax.vjp(lambda p, h: _slopes(apply, p, h), params, features)
    dparams, dfeatures = network((dvalues, direction))
    level_shape = (*x.shape[:-1], config.levels, config.features_per_level)
    cotangents = [_chunked(value.reshape(level_shape), config) for value in (dfeatures, slopes)]
    grid = (config, 0, spread, tables.shape[0])
    dtables = _add_into_tables(
        "scatter_field",
        x,
        [_per_call(dgradient.astype(jnp.float32))],
        cotangents,
        *grid,
        dtype=str(tables.dtype),
    )
    return dparams, dtables, None


_hash_field.defvjp(_hash_field_fwd, _hash_field_bwd, symbolic_zeros=True)


def field_with_gradient(
    apply: Callable[[Any, jax.Array], jax.Array], params, tables, x, config, spread, dtype
) -> tuple[jax.Array, jax.Array]:
    """``apply(params, encoding(x))`` ``(..., 1)`` and its gradient in ``x`` ``(..., d)``, the
    tables ``(config.table_rows, F)`` (slax/nn/_hash_encoding.py checks the arguments)."""
    return _hash_field(apply, config, spread, dtype, params, tables, x)
