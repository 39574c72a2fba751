"""Slang source for a wide network's kernels on NVIDIA tensor cores, each warp's tile of 16 samples
in registers through every layer (``shaders/nn/wide_warp.slang``), for JAX on CUDA: float16
networks in halves (``wide_warp_half.slang``), float32 networks at one TF32 pass
(``wide_warp_tf32.slang``).

The kernels run every operation of the ``tensor_cores`` backend (slax/nn/_backends.py) where
:func:`wide_warp_fits` says so; elsewhere the backend's kernels are the tensor-core tiles'. What
Python writes is a descriptor of the network (:func:`wide_warp_source`), and the operand the
kernels read the weights from (:func:`warp_fragments`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from slax.nn._kernels import parameter_offsets
from slax.nn._precision import Float32Products
from slax.nn._slang_types import chain_aliases
from slax.nn._tensor_core_kernels import tf32_rounded
from slax.nn._tiled_kernels import TILE_THREADS

WIDE_WARP_WIDTH = 64
"""Widest layer (in or out) the kernel runs: four blocks of 16 columns. A warp then holds each
layer's 16 samples in 16 registers (as halves; as floats 32), and its share of the weight gradient
(a 64 x 64 layer's 32 blocks of 16 x 8 over a group's 8 or 4 warps) in 16 or 32 more; a 128-wide
network's would take four times as many."""
GROUP_SUM_REGISTERS = 68
"""The most registers a thread may keep its share of the weight and bias gradients' sums in, in
thread groups of 4 warps (:func:`group_warps`): those of the image task's 32-64-64-3 network."""
TF32_REGISTERS = 160
"""The most registers a thread of the TF32 format may keep its gradients' sums and its tile's
hidden activations in (:func:`wide_warp_fits`): a float a value, twice the halves' registers. The
image and SDF tasks' 32-64-64-3 and 32-64-64-1 take 132, within which ptxas spills little
(BENCHMARKS.md); four 64-wide hidden layers would take 268."""


def group_warps(sizes: tuple[int, ...], dtype: str = "float16") -> int:
    """Warps in a thread group of the ``dtype`` network of ``sizes``: in float32 4 (the
    turned-over rows of 8 warps' samples would not fit group-shared memory); in float16 4 where a
    thread's share of the gradients' sums at 4 warps takes at most GROUP_SUM_REGISTERS registers,
    else 8.

    The kernels use about 255 registers a thread, so a multiprocessor holds 8 warps: as one group of
    8, every warp waits at each of the group's barriers (two a layer a tile); as two groups of 4,
    one group computes while the other waits. Fewer warps share each layer's weight gradient, so
    each keeps more of its sums: four 64-wide hidden layers' would spill (BENCHMARKS.md, "The hash
    encoding", has the steps at 4 and 8 warps)."""
    if dtype == "float32":
        return 4
    return 4 if _sum_registers(sizes, 4) <= GROUP_SUM_REGISTERS else TILE_THREADS // 32


def _layer_sums(n_in: int, n_out: int, warps: int) -> tuple[int, int]:
    """The float4 blocks of a layer's sums a thread keeps in thread groups of ``warps`` warps: of
    its weight gradient (its strips of 16 x 8 blocks, ``WideSums.Sums``) and of its bias gradient
    (``WideSums.BiasBlocks``, shaders/nn/wide_warp.slang)."""
    strips, summing = math.ceil(2 * _blocks(n_in) / warps), min(warps, 2 * _blocks(n_in))
    return strips * _blocks(n_out), math.ceil(_blocks(n_out) / summing)


def _sum_registers(sizes: tuple[int, ...], warps: int) -> int:
    """Registers a thread keeps the gradients' sums in, in thread groups of ``warps`` warps."""
    return 4 * sum(sum(_layer_sums(n_in, n_out, warps)) for n_in, n_out in zip(sizes[:-1], sizes[1:]))


def group_samples(sizes: tuple[int, ...], dtype: str = "float16") -> int:
    """Samples a thread group runs at once: 16 a warp (:func:`group_warps`)."""
    return 16 * group_warps(sizes, dtype)


FORWARD_TILES = {"float16": 2, "float32": 1}
"""Tiles of 16 samples a warp of ``mlp_forward`` runs, by dtype: each layer's products run for
every tile in turn, sharing each B fragment the warp loads. Two in float16, where the fragments'
loads bound the forward pass; one in float32, whose TF32 forward is not bound by them and at two
tiles only doubles its registers (BENCHMARKS.md, "The MLP kept flat ...")."""


def warp_tile_threads(sizes: tuple[int, ...], samples: int, dtype: str = "float16", tiles: int = 1) -> int:
    """Threads of a launch whose warps run ``tiles`` tiles of 16 of ``samples`` each
    (``mlp_forward``: :data:`FORWARD_TILES`; ``mlp_input_gradient``: one), in whole thread groups
    (:func:`group_warps`)."""
    return -(-samples // (tiles * group_samples(sizes, dtype))) * 32 * group_warps(sizes, dtype)


def _blocks(width: int) -> int:
    """Blocks of 16 columns that hold ``width`` values."""
    return math.ceil(width / 16)


def _tf32_registers(sizes: tuple[int, ...]) -> int:
    """Registers a thread of the TF32 format keeps its sums (4 warps a group) and its tile's hidden
    activations in: 8 floats a lane for each 16 columns of a hidden layer."""
    return _sum_registers(sizes, 4) + sum(8 * _blocks(width) for width in sizes[1:-1])


def wide_warp_fits(sizes: tuple[int, ...], dtype: str, products: Float32Products) -> bool:
    """Whether ``shaders/nn/wide_warp.slang`` runs the network of ``sizes`` (a wide network: the
    caller checks that its gradient sums exceed a thread's) in ``dtype``, its float32 products
    ``products``: every layer at most WIDE_WARP_WIDTH wide, and in float32 one TF32 pass whose
    tiles and sums take at most TF32_REGISTERS registers. Other float32 networks, and every one at
    float32's accuracy (3xTF32), stay on the tensor-core tiles."""
    if max(sizes) > WIDE_WARP_WIDTH:
        return False
    if dtype == "float32":
        return products is Float32Products.TF32 and _tf32_registers(sizes) <= TF32_REGISTERS
    return dtype == "float16"


def _term_blocks(width: int, dtype: str) -> int:
    """Blocks of terms (16 halves, 8 TF32 values a product) that hold ``width`` values."""
    return _blocks(width) * (2 if dtype == "float32" else 1)


def fragment_offsets(sizes: tuple[int, ...], dtype: str = "float16") -> tuple[list[int], list[int], int]:
    """Where each layer's B fragments start in :func:`warp_fragments`, in blocks of 32 lanes' 8
    bytes: its weight's for the forward pass, its transpose's for the input gradient; and the blocks
    in all."""
    forward, backward, total = [], [], 0
    layers = list(zip(sizes[:-1], sizes[1:]))
    for n_in, n_out in layers:
        forward.append(total)
        total += 2 * _blocks(n_out) * _term_blocks(n_in, dtype)
    for n_in, n_out in layers:
        backward.append(total)
        total += 2 * _blocks(n_in) * _term_blocks(n_out, dtype)
    return forward, backward, total


def _fragment_order(matrix, dtype: str, pad=0):
    """``matrix`` (N x K; a JAX or numpy array) flattened in the order of the ``dtype`` format's B
    fragments of B = matrix^T (K x N), N and K padded to whole blocks of 16 with ``pad``. float16,
    mma.sync m16n8k16: for each block of 8 columns of B (8 rows of ``matrix``) and 16 rows (terms),
    in that order, lane l = 4 g + t's four halves B[2t][g], B[2t + 1][g],
    B[2t + 8][g], B[2t + 9][g]. float32, m16n8k8: for each block of 8 columns and 8 rows, lane l's
    two values matrix[g][2t] and matrix[g][2t + 1] of the block, the block's 8 terms in the order
    the TF32 format reads a tile's 8 columns (0, 2, 4, 6, 1, 3, 5, 7). 128 halves or 64 floats a
    block."""
    n, k = matrix.shape
    xp = np if isinstance(matrix, np.ndarray) else jnp
    if dtype == "float32":
        blocks_n, blocks_k = 2 * _blocks(n), 2 * _blocks(k)
        padded = xp.pad(matrix, ((0, 8 * blocks_n - n), (0, 8 * blocks_k - k)), constant_values=pad)
        # [j][g][s][t][p]: row 8j + g, column 8s + 2t + p  ->  [j][s][g][t][p]
        return padded.reshape(blocks_n, 8, blocks_k, 4, 2).transpose(0, 2, 1, 3, 4).reshape(-1)
    blocks_n, blocks_k = 2 * _blocks(n), _blocks(k)
    padded = xp.pad(matrix, ((0, 8 * blocks_n - n), (0, 16 * blocks_k - k)), constant_values=pad)
    # [j][g][s][h][t][p]: row 8j + g, column 16s + 8h + 2t + p  ->  [j][s][g][t][h][p]
    return padded.reshape(blocks_n, 8, blocks_k, 2, 4, 2).transpose(0, 2, 1, 4, 3, 5).reshape(-1)


def _fragment_words(values: jax.Array, dtype: str) -> jax.Array:
    """Fragment values in :func:`_fragment_order` as the kernels' uint32 words: pairs of halves
    (the first in the low 16 bits), or TF32 values (float32, rounded)."""
    if dtype == "float32":
        return jax.lax.bitcast_convert_type(tf32_rounded(values.astype(jnp.float32)), jnp.uint32)
    return jax.lax.bitcast_convert_type(values.astype(jnp.float16).reshape(-1, 2), jnp.uint32)


def _b_fragments(matrix: jax.Array) -> jax.Array:
    """``matrix`` (N x K) as mma.sync m16n8k16 B fragments of halves of B = matrix^T
    (:func:`_fragment_order`): 64 words a block."""
    return _fragment_words(_fragment_order(matrix, "float16"), "float16")


def _tf32_b_fragments(matrix: jax.Array) -> jax.Array:
    """``matrix`` (N x K) as mma.sync m16n8k8 B fragments of TF32 values of B = matrix^T
    (:func:`_fragment_order`): 64 words a block."""
    return _fragment_words(_fragment_order(matrix, "float32"), "float32")


@functools.cache
def _fragment_sources(sizes: tuple[int, ...], dtype: str) -> np.ndarray:
    """For each value of :func:`warp_fragments`, its index in the flat parameters, or -1 (a pad)."""
    offsets, _ = parameter_offsets(sizes)
    weights = [
        start + n_out + np.arange(n_out * n_in).reshape(n_out, n_in)
        for start, n_in, n_out in zip(offsets, sizes[:-1], sizes[1:])
    ]
    orders = [_fragment_order(w, dtype, -1) for w in weights]
    orders += [_fragment_order(w.T, dtype, -1) for w in weights]
    return np.concatenate(orders).astype(np.int32)


def warp_fragments(flat: jax.Array, sizes: tuple[int, ...], dtype: str) -> jax.Array:
    """The kernel's fragments operand (uint32, :func:`fragment_offsets`' layout) from the flat
    parameters (slax/nn/_kernels.py's layout, float32): every layer's W^T as B fragments for the
    forward pass, then every layer's W for the input gradients; of halves for a float16 network
    (its parameters are halves: the conversion is exact), of TF32 values for a float32 one. One
    gather from ``flat``, one XLA fusion: reordered a layer at a time, each layer's fragments took
    a fusion of their own and a concatenation another."""
    sources = _fragment_sources(tuple(sizes), dtype)
    values = jnp.where(sources >= 0, flat[np.maximum(sources, 0)], 0.0)
    return _fragment_words(values, dtype)


@functools.cache
def wide_warp_source(sizes: tuple[int, ...], activations: tuple[str, ...], dtype: str = "float16") -> str:
    """The descriptor of ``shaders/nn/wide_warp.slang`` for the ``dtype`` network of ``sizes``, with
    each layer's ``IActivation`` type in ``activations`` (``shaders/nn/activations.slang``); its
    layers' parameters where :func:`~slax.nn._kernels.parameter_offsets` puts them. The TF32
    format's layers also say whether they are the first (Reloads) and hidden."""
    offsets, parameters = parameter_offsets(sizes)
    forward, backward, _ = fragment_offsets(sizes, dtype)
    warps = group_warps(sizes, dtype)
    tf32 = dtype == "float32"
    format_file = "nn/wide_warp_tf32.slang" if tf32 else "nn/wide_warp_half.slang"
    layers = []
    for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        sums, _ = _layer_sums(n_in, n_out, warps)
        arguments = [n_in, n_out, offsets[k], forward[k], backward[k], sums, activations[k]]
        if tf32:  # Reloads (the first layer), Hidden
            arguments += [str(k == 0).lower(), str(k < len(sizes) - 2).lower()]
        layers.append(f"WideLayer<{', '.join(map(str, arguments))}>")
    return f"""import slax.kernel;
import nn.mlp;
import nn.tiled;
import nn.warp_mma;
static const int Inputs = {sizes[0]};
static const int Outputs = {sizes[-1]};
static const int GroupThreads = {32 * warps};
static const int ParameterCount = {parameters};
static const int MaxBlocks = {max(_blocks(width) for width in sizes)};
static const int ForwardTiles = {FORWARD_TILES[dtype]};
{chain_aliases("WideNetwork", ["WideChain<"] * (len(layers) - 1), layers)}#include "{format_file}"
#include "nn/wide_warp.slang"
"""
