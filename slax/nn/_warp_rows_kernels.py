"""A wide float16 network's fused loss and gradient where its weight-gradient sums do not fit a
warp's registers: the warp tiles of ``shaders/nn/warp_rows.slang`` run each sample through the
forward pass, the loss and the input gradients in registers and write out each layer's input ``h``
and output gradient ``dz`` as halves; XLA's matrix products sum them into the weight gradients
(``dW = dz^T h``, ``db = sum dz``), as tiny-cuda-nn's fully fused MLP leaves its weight gradients
to separate matrix products.

What Python writes per network is a descriptor (:func:`warp_rows_source`); :func:`loss_grad`
launches the kernel and adds up its rows. The weights reach the kernel as the warp tiles' B
fragments of halves (slax/nn/_wide_warp_kernels.py).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from slax._compile import KernelSpec
from slax._config import LaunchRoutes
from slax._kernel_primitive import run_kernel
from slax.nn._kernels import parameter_offsets
from slax.nn._slang_types import chain_aliases
from slax.nn._tiled_kernels import TILE_THREADS
from slax.nn._wide_warp_kernels import fragment_offsets, warp_fragments

WARP_ROWS_WIDTH = 128
"""Widest layer the kernel runs: eight blocks of 16 columns. A warp holds one layer's tile at a
time: its 16 samples' 128 outputs as float sums (64 registers) and as halves (32)."""


def warp_rows_error(sizes: tuple[int, ...], dtype: str) -> str | None:
    """Why ``shaders/nn/warp_rows.slang`` cannot run the loss and gradient of ``sizes`` in
    ``dtype``, or None where it can: float16, at least two hidden layers, all of one width (its
    rows go to five arrays whatever the depth), every layer at most WARP_ROWS_WIDTH wide."""
    if dtype != "float16":
        return f"it runs float16 networks (its rows and products are halves), and this one is {dtype}"
    hidden = sizes[1:-1]
    if len(hidden) < 2 or len(set(hidden)) != 1:
        return f"it runs networks of two or more hidden layers of one width, and these are {list(hidden)}"
    if max(sizes) > WARP_ROWS_WIDTH:
        return f"its layers are at most {WARP_ROWS_WIDTH} wide, and this network's widest is {max(sizes)}"
    return None


@functools.cache
def warp_rows_source(sizes: tuple[int, ...], activations: tuple[str, ...]) -> str:
    """The descriptor of ``shaders/nn/warp_rows.slang`` for the network of ``sizes``, with each
    layer's ``IActivation`` type in ``activations`` (``shaders/nn/activations.slang``)."""
    offsets, _ = parameter_offsets(sizes)
    forward, backward, _ = fragment_offsets(sizes)
    layers = [
        f"RowsLayer<{k}, {n_in}, {n_out}, {offsets[k]}, {forward[k]}, {backward[k]}, {activations[k]}>"
        for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]))
    ]
    return f"""import slax.kernel;
import nn.mlp;
import nn.tiled;
import nn.warp_mma;
static const int Inputs = {sizes[0]};
static const int Outputs = {sizes[-1]};
static const int Width = {sizes[1]};
static const int Layers = {len(layers)};
static const int MaxBlocks = {max(math.ceil(width / 16) for width in sizes)};
{chain_aliases("RowsNetwork", ["RowsChain<"] * (len(layers) - 1), layers)}#include "nn/warp_rows.slang"
"""


def kernel(sizes: tuple[int, ...], activations: tuple[str, ...]) -> KernelSpec:
    """The kernel ``mlp_loss_rows`` of the network of ``sizes``."""
    return KernelSpec("mlp_loss_rows", source=warp_rows_source(sizes, activations))


def loss_grad(
    spec: KernelSpec,
    sizes: tuple[int, ...],
    x: jax.Array,
    target: jax.Array,
    params,
    group_ndim: int,
    loss_scale: float,
    packed: jax.Array,
    routes: LaunchRoutes,
) -> list[jax.Array]:
    """``[loss, *gradients]`` per group of the leading ``group_ndim`` axes of ``x`` (the
    primitives' ``loss_grad``): the kernel's rows, summed by XLA's products. ``dz`` arrives
    without the loss's factor 2 ``loss_scale``, which multiplies the float32 sums; the products
    of halves are exact and sum in float32 (``preferred_element_type``), as the kernel's own
    products do."""
    width, layers = sizes[1], len(sizes) - 1
    lead = x.shape[:-1]
    samples = math.prod(lead)
    blocks = -(-samples // (16 * (TILE_THREADS // 32)))  # a thread group's warps, 16 samples each
    count = blocks * TILE_THREADS
    losses, first_dz, hidden_h, hidden_dz, last_h, last_dz = run_kernel(
        spec,
        [x, target, packed, warp_fragments(packed, sizes, "float16")],
        (
            ((samples,), "float32"),
            ((samples, width), "float16"),
            ((layers - 2, samples, width), "float16"),
            ((layers - 2, samples, width), "float16"),
            ((samples, width), "float16"),
            ((samples, sizes[-1]), "float16"),
        ),
        count,
        (("count", count), ("samples", samples)),
        routes=routes,
    )
    scale = 2.0 * loss_scale

    def weight_gradient(dz, h):
        """``dW = dz^T h`` and ``db = sum dz`` over each group's samples, float32."""
        dz = dz.reshape(dz.shape[:-2] + lead + dz.shape[-1:])
        h = h.reshape(h.shape[:-2] + lead + h.shape[-1:])
        samples_axes = tuple(range(dz.ndim - 1 - (len(lead) - group_ndim), dz.ndim - 1))
        batch_axes = tuple(range(dz.ndim - 1 - len(lead), dz.ndim - 1 - len(lead) + group_ndim))
        leading = tuple(range(dz.ndim - 1 - len(lead)))
        dims = ((samples_axes, samples_axes), (leading + batch_axes, leading + batch_axes))
        dw = jax.lax.dot_general(dz, h, dims, preferred_element_type=jnp.float32)
        db = dz.astype(jnp.float32).sum(axis=samples_axes)
        return db * scale, dw * scale

    gradients = [*weight_gradient(first_dz, x.reshape(samples, sizes[0]))]
    db, dw = weight_gradient(hidden_dz, hidden_h)  # layers 1 .. layers - 2, at least one
    for k in range(layers - 2):
        gradients += [db[k], dw[k]]
    gradients += [*weight_gradient(last_dz, last_h)]
    loss = losses.reshape(lead).sum(axis=tuple(range(group_ndim, len(lead)))) * loss_scale
    return [loss, *gradients]
