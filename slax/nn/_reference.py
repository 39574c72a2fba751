"""The MLP in plain jax.numpy: the public reference, and the twins of the kernels' primitives that
the primitives' derivative rules differentiate (slax/nn/_primitives.py).

The twins take the primitives' operands (each layer's bias then weight, flat) and give their
results in the kernels' precision policy, so a rule may take any of their derivatives with JAX's
own machinery: a Jacobian-vector product of the backward pass is one ``jax.jvp`` of its twin.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from slax.nn._activations import ACTIVATIONS
from slax.nn._params import flat_layers, split_params

FULL_PRECISION = jax.lax.Precision.HIGHEST


def mlp_apply_reference(
    params: Any,
    x: jax.Array,
    storage_dtype: Any = None,
    precision: jax.lax.Precision | None = FULL_PRECISION,
) -> jax.Array:
    """The same network in plain jax.numpy, for comparison and as a pure-JAX baseline.

    It follows the kernels' precision policy: arithmetic in float32, activations rounded to
    ``storage_dtype`` (default: the parameters' dtype) after each affine map and activation, and
    gradients kept in float32 (the rounding passes gradients straight through, as the kernels'
    float32 backward pass does). The result has dtype ``storage_dtype``.

    Its products are full float32 by default (``precision=Precision.HIGHEST``), the reference
    the kernels' products at ``HIGHEST`` are held to: JAX's default precision (``precision=None``)
    lets XLA multiply float32 matrices in TF32 on GPUs with tensor cores (relative error ~5e-4), as
    :func:`mlp_apply` then does. Benchmarks pass ``None`` to time what a plain JAX program gets at
    JAX's matmul precision, the one slax's calls take too.

    Args:
      params: the network's parameters (:data:`slax.nn.Params`), whose activations it applies.
      x: inputs ``(..., in)``.
      storage_dtype: the dtype activations are rounded to; ``None``, the parameters'.
      precision: the matrix products' precision.

    Returns:
      The outputs ``(..., out)``, of dtype ``storage_dtype``.
    """
    layers, activations = split_params(params)
    storage = jnp.dtype(storage_dtype or layers[0]["weight"].dtype)
    return _apply(layers, activations, x, storage, precision)


def mlp_loss_reference(
    params: Any,
    x: jax.Array,
    target: jax.Array,
    storage_dtype: Any = None,
    precision: jax.lax.Precision | None = FULL_PRECISION,
) -> jax.Array:
    """Plain-JAX twin of :func:`slax.nn.mlp_loss_and_grad`'s loss; ``jax.grad`` of it is the twin
    of the gradients.

    Args:
      params: the network's parameters (:data:`slax.nn.Params`).
      x: inputs ``(batch, in)``.
      target: ``(batch, out)``.
      storage_dtype: as in :func:`mlp_apply_reference`.
      precision: as in :func:`mlp_apply_reference`.

    Returns:
      The batch mean of each sample's squared L2 error, a float32 scalar.

    Raises:
      ValueError: ``x`` holds no samples (a batch of 0): their mean has no value.
    """
    require_samples("mlp_loss_reference", x)
    prediction = mlp_apply_reference(params, x, storage_dtype, precision)
    error = prediction.astype(jnp.float32) - target.astype(jnp.float32)
    return jnp.mean(jnp.sum(error * error, axis=-1))


def require_samples(function: str, x: jax.Array) -> None:
    """Refuses a batch of no samples for a loss that is their mean: jnp.mean gives nan, a sum of
    no gradients zero, and either trains silently on a data pipeline that lost its samples."""
    if math.prod(x.shape[:-1]) == 0:
        raise ValueError(
            f"slax.nn.{function}: x has shape {x.shape}: no samples, and the loss is their mean, which "
            "has no value for none. Pass a batch of at least one sample (an empty batch is usually "
            "a data pipeline that lost its samples)."
        )


def _apply(layers, activations, x: jax.Array, storage, precision) -> jax.Array:
    """The network's output, as ``storage``."""
    return _layer_values(layers, activations, x, storage, precision)[-1][1].astype(storage)


def _layer_values(layers, activations, x: jax.Array, storage, precision) -> list[tuple[jax.Array, jax.Array]]:
    """Every layer's ``(kept, output)``, from the first to the last, float32 holding ``storage``
    values: its output y, and what the kernels keep of it (y, or its pre-activation z where the
    activation keeps its input: ``shaders/nn/activations.slang``)."""
    y = _round_to(x.astype(jnp.float32), storage)
    values = []
    for layer, name in zip(layers, activations):
        weight = layer["weight"].astype(jnp.float32)
        z = _round_to(
            jnp.matmul(y, weight.T, precision=precision) + layer["bias"].astype(jnp.float32), storage
        )
        activation = ACTIVATIONS[name]
        y = _round_to(activation.function(z), storage)
        values.append((z if activation.keeps_input else y, y))
    return values


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _round_to(values: jax.Array, dtype) -> jax.Array:
    """Rounds float32 values to ``dtype`` and back; its derivative is the identity."""
    return values.astype(dtype).astype(values.dtype)


@_round_to.defjvp
def _round_to_jvp(dtype, primals, tangents):
    return _round_to(primals[0], dtype), tangents[0]


# --- the primitives' twins ---------------------------------------------------------------------


def _layers(flat) -> list[dict[str, jax.Array]]:
    """The primitives' flat parameters (each layer's bias, then its weight) as float32 layers: half
    parameters convert exactly, and their derivatives are float32 as the kernels' are."""
    flat = [p.astype(jnp.float32) for p in flat]
    return [{"weight": w, "bias": b} for b, w in zip(flat[0::2], flat[1::2])]


def forward_twin(
    x: jax.Array, *flat: jax.Array, dtype: str, activations: tuple[str, ...], precision=FULL_PRECISION
) -> list[jax.Array]:
    """``mlp_forward_hidden``'s results: ``[y, hidden]``, ``hidden`` what each sample's hidden
    layers keep, one after the other (slax/nn/_kernels.py, ``hidden_width``)."""
    values = _layer_values(_layers(flat), activations, x, jnp.dtype(dtype), precision)
    hidden = [kept.astype(dtype) for kept, _ in values[:-1]]
    return [values[-1][1].astype(dtype), jnp.concatenate(hidden, axis=-1)]


def apply_twin(
    x: jax.Array, flat, dtype: str, activations: tuple[str, ...], precision=FULL_PRECISION
) -> jax.Array:
    """``mlp_forward``'s result: the network's output."""
    return _apply(_layers(flat), activations, x, jnp.dtype(dtype), precision).astype(dtype)


def tangent_twin(
    x: jax.Array,
    dx: jax.Array,
    flat,
    tangents,
    dtype: str,
    activations: tuple[str, ...],
    precision=FULL_PRECISION,
) -> jax.Array:
    """The network's Jacobian-vector product at ``(x, flat)`` along ``(dx, tangents)``."""

    def network(x, flat):
        return _apply(_layers(flat), activations, x, jnp.dtype(dtype), precision)

    tangents = [t.astype(jnp.float32) for t in tangents]
    return jax.jvp(network, (x, [p.astype(jnp.float32) for p in flat]), (dx, tangents))[1]


def backward_twin(
    x,
    dy,
    flat,
    dtype: str,
    activations: tuple[str, ...],
    group_ndim: int,
    input_gradient: bool,
    precision=FULL_PRECISION,
) -> list[jax.Array]:
    """``mlp_backward``'s results: ``[dx,] *gradients``, the network's vector-Jacobian product with
    ``dy``, each gradient summed over the samples of each of the ``group_ndim`` leading axes'
    groups (float32, as the kernels'); ``dx`` only with ``input_gradient``."""
    layers = _layers(flat)

    def one_group(x, dy):
        return _pullback(x, layers, dy, activations, jnp.dtype(dtype), precision)

    dx, grads = _per_group(one_group, group_ndim, x, dy)
    return [dx.reshape(x.shape), *grads] if input_gradient else grads


def _pullback(x, layers, dy, activations, storage, precision) -> tuple[jax.Array, list[jax.Array]]:
    """The network's vector-Jacobian product with ``dy`` at ``x``: ``dx`` and each layer's bias
    and weight gradient (flat), ``dy`` rounded to the outputs' dtype as the kernels read it."""
    y, pullback = jax.vjp(lambda x, layers: _apply(layers, activations, x, storage, precision), x, layers)
    dx, grads = pullback(dy.astype(y.dtype))
    return dx, flat_layers(grads)


def backward_tangent_twin(
    x,
    dy,
    x_direction,
    param_directions,
    flat,
    dtype: str,
    activations: tuple[str, ...],
    group_ndim: int,
    input_gradient: bool,
    param_output: bool,
    precision=FULL_PRECISION,
) -> list[jax.Array]:
    """``mlp_backward_tangent``'s results: the Jacobian-vector product of :func:`backward_twin`'s
    results in ``x`` and the parameters, at a fixed ``dy``, along ``x_direction`` (like ``x``, or
    None: no direction in ``x``) and ``param_directions`` (each layer's bias and weight with the
    ``group_ndim`` leading group axes: one direction per group; or None). Per sample, the Hessian
    of ``dy . network(x, params)`` times the direction: ``[dx,]`` (with ``input_gradient``) and,
    with ``param_output``, each parameter's part summed over each group's samples (float32).

    Forward over reverse: one ``jax.jvp`` of the backward pass, closed over what does not vary, so
    that an absent direction, and an activation whose second derivative is zero (LeakyReLU, ReLU,
    none), add no products."""
    layers = _layers(flat)

    def gradients(x, layers, dy):
        return _pullback(x, layers, dy, activations, jnp.dtype(dtype), precision)

    def one_group(x, dy, x_direction, param_directions):
        if param_directions is None:
            return jax.jvp(lambda x: gradients(x, layers, dy), (x,), (x_direction,))[1]
        directions = _layers(param_directions)
        if x_direction is None:
            return jax.jvp(lambda layers: gradients(x, layers, dy), (layers,), (directions,))[1]
        return jax.jvp(lambda x, layers: gradients(x, layers, dy), (x, layers), (x_direction, directions))[1]

    dx, grads = _per_group(one_group, group_ndim, x, dy, x_direction, group_data=(param_directions,))
    return [dx.reshape(x.shape)] * input_gradient + grads * param_output


def loss_grad_twin(
    x,
    target,
    flat,
    dtype: str,
    activations: tuple[str, ...],
    group_ndim: int,
    loss_scale: float,
    precision=FULL_PRECISION,
) -> list[jax.Array]:
    """``mlp_loss_grad``'s results: ``[loss, *gradients]``, per group of the ``group_ndim``
    leading axes: the sum of each sample's squared error weighted by ``loss_scale``, and its
    gradients (float32, as the kernels')."""
    layers = _layers(flat)

    def one_group(x, target):
        def loss(layers):
            error = _apply(layers, activations, x, jnp.dtype(dtype), precision).astype(jnp.float32)
            error = error - target.astype(jnp.float32)
            return jnp.float32(loss_scale) * jnp.sum(error * error)

        value, grads = jax.value_and_grad(loss)(layers)
        return value, flat_layers(grads)

    losses, grads = _per_group(one_group, group_ndim, x, target)
    return [losses, *grads]


def _per_group(one_group, group_ndim: int, x, *data, group_data=()):
    """``one_group(x, *data, *group_data) -> (value, sums)`` over each group of the ``group_ndim``
    leading axes (their samples flattened, mapped with vmap): ``data`` per sample like ``x`` (or
    None), ``group_data`` pytrees of arrays per group (leading axes the groups'); ``value`` per
    sample or per group, the sums per group, all reshaped to those axes."""
    groups = x.shape[:group_ndim]
    grouped = (math.prod(groups), math.prod(x.shape[group_ndim:-1]))
    per_sample = jax.tree.map(lambda a: a.reshape(grouped + a.shape[-1:]), (x, *data))
    per_group = jax.tree.map(lambda a: a.reshape(grouped[:1] + a.shape[group_ndim:]), group_data)
    value, sums = jax.vmap(one_group)(*per_sample, *per_group)
    value = value.reshape(groups + value.shape[1:])
    return value, [s.reshape(groups + s.shape[1:]) for s in sums]
