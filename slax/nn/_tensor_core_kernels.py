"""Slang source for the MLP kernels of a wide network on NVIDIA tensor cores
(``shaders/nn/tensor_cores.slang``), for JAX on CUDA.

The entry points, launches and partial sums are those of the tiled kernels
(slax/nn/_tiled_kernels.py), tiles of :func:`tile_samples` samples, with one difference in the
operands: where the tiled kernels take the weights transposed, these take them as B fragments
(:func:`weight_fragments`), each layer's weight for the forward pass and its transpose for the
backward pass, which XLA lays out once per step.

A gradient launch's thread group keeps its weight gradient in registers for all its tiles
(``warpGradientProduct``) and writes its row of partial sums once, so a network runs here only if
those sums fit a thread's registers (``MAX_REGISTER_SUMS``), and if a tile fits its group-shared memory
(``TENSOR_CORE_SCRATCH_FLOATS``); others run the tiled kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from slax.nn._precision import Float32Products
from slax.nn._tiled_kernels import TILE_THREADS, Network, TileFamily, tangent_tiles, tiles_per_block

TENSOR_CORE_SAMPLES = {"float32": 32, "float16": 16}
"""Samples per tile, by the network's dtype: blocks of an mma.sync's 16 rows. Two blocks let each
weight fragment a warp loads serve both and halve the barriers per sample; in float32, whose
fragments are twice as large, that was faster (digits, 2^16 samples, H100: 277 against 292 us a
training step), in float16 one block was (227 against 238 us), its gradient kernel spilling fewer
registers (BENCHMARKS.md); narrow networks excepted (:func:`tile_samples`)."""
NARROW_FLOAT16_WIDTH = 32
"""Widest layer of a float16 network whose tiles take two blocks (32 samples) all the same: its
fragments are few, and with one block its barriers per sample cost most of a step. Measured on an
H100 (32 inputs, 16 outputs, training steps at 2^18 samples, against plain JAX): 16 wide with 2
hidden layers 0.76x with 16-sample tiles, 1.13x with 32; 32 wide with 4, 1.39x and 1.58x; but 64
wide with 4, 1.53x and 1.46x (BENCHMARKS.md, wide networks)."""
TENSOR_CORE_SCRATCH_FLOATS = 12288
"""Group-shared floats a tensor-core kernel may use: 48 KiB, the most CUDA gives a kernel's static
group-shared memory."""
WARPS = TILE_THREADS // 32
MAX_REGISTER_SUMS = 96
"""Most floats of weight and bias gradient a thread keeps in registers across its tiles."""
LEAST_SAMPLES_PER_BLOCK = 32
"""Samples a gradient launch's thread group runs at least (whole tiles): each writes a row of partial
sums (the network's parameters, 17,227 floats for the digits network) that XLA then adds, so at
small batches fewer groups running more tiles each finish sooner (digits, 2^12 samples, tiles of
16: 26 against 37 us for the gradient kernel with two tiles a group rather than one). A float32
tile of 32 samples is that many already."""
MAX_CHUNK = 4
"""Most column blocks a warp runs at once in a row product (each holds 4 floats of sums)."""


def _stride(width: int) -> int:
    """A tile's row stride for ``width`` values: room for them rounded up to 8 (the zero columns an
    A fragment reaches), plus 4, so that rows start 16-byte aligned and the 8 rows an ldmatrix
    block or a warp's column load reads fall in different banks (shaders/nn/tensor_cores.slang,
    FragmentTile)."""
    return 8 * math.ceil(width / 8) + 4


def _blocks8(rows: int, cols: int) -> int:
    """8 x 8 blocks of B fragments of a rows x cols matrix."""
    return math.ceil(rows / 8) * math.ceil(cols / 8)


@dataclasses.dataclass(frozen=True)
class GradientShape:
    """How warps hold a layer's weight gradient (shaders/nn/tensor_cores.slang, GradientRectangle):
    ``rounds`` rectangles of ``rows`` x ``cols`` blocks of 16 x 8 each."""

    rows: int
    cols: int
    rounds: int

    @property
    def blocks(self) -> int:
        return self.rows * self.cols * self.rounds


def gradient_shape(n_out: int, n_in: int) -> GradientShape:
    """The rectangles for an n_out x n_in weight gradient that cost a warp least per step of 8
    samples: counting a split A fragment (4 loads, 4 splits of two instructions each) as 16
    instructions, a B fragment as 8 and a block's products as 12, over as many rounds as the warps
    need to cover every block; among equals, the fewest blocks held (registers)."""
    row_blocks, col_blocks = math.ceil(n_out / 16), math.ceil(n_in / 8)

    def shape(rows: int, cols: int) -> GradientShape:
        rectangles = math.ceil(row_blocks / rows) * math.ceil(col_blocks / cols)
        return GradientShape(rows, cols, math.ceil(rectangles / WARPS))

    def cost(s: GradientShape) -> tuple[int, int]:
        return s.rounds * (16 * s.rows + 8 * s.cols + 12 * s.rows * s.cols), s.blocks

    rows, cols = range(1, min(4, row_blocks) + 1), range(1, min(8, col_blocks) + 1)
    return min((shape(r, c) for r in rows for c in cols), key=cost)


@dataclasses.dataclass(frozen=True)
class TensorCoreLayout:
    """Where a tile's values live in group-shared memory, where each layer's B fragments are, and
    how many gradient sums a thread holds.

    Attributes:
      samples: samples per tile (:func:`tile_samples`).
      offsets, strides: each tile of activations, from the input's to the output's (floats from the
        start of group-shared memory; row stride).
      losses: TILE_THREADS floats, one per thread, for the loss's partial sums.
      scratch: group-shared floats in all.
      forward_fragments, backward_fragments: where each layer's B fragments start, of its weight
        (Out x In) and of its transpose, in blocks of 8 x 8 values (:func:`weight_fragments`).
      gradients: how warps hold each layer's weight gradient.
      bias_sums: per layer, the bias gradients each thread holds.
      tangents: the Hessian kernel's layout only: the tangent tile of each layer's input (strides
        as its input's); empty in the first-derivative kernels'.
    """

    samples: int
    offsets: tuple[int, ...]
    strides: tuple[int, ...]
    losses: int
    scratch: int
    forward_fragments: tuple[int, ...]
    backward_fragments: tuple[int, ...]
    gradients: tuple[GradientShape, ...]
    bias_sums: tuple[int, ...]
    tangents: tuple[int, ...] = ()

    def tiles_per_block(self, samples: int, per_group: int) -> int:
        least = max(1, LEAST_SAMPLES_PER_BLOCK // self.samples)
        return tiles_per_block(self.samples, samples, per_group, least)

    @property
    def register_sums(self) -> int:
        """Floats of gradient sums a thread keeps in registers across its tiles."""
        return 4 * sum(shape.blocks for shape in self.gradients) + sum(self.bias_sums)


def tile_samples(sizes: tuple[int, ...], dtype: str) -> int:
    """Samples per tile of the tensor-core kernels of ``sizes`` in ``dtype``: TENSOR_CORE_SAMPLES,
    but two blocks for a float16 network at most NARROW_FLOAT16_WIDTH wide."""
    if dtype == "float16" and max(sizes) <= NARROW_FLOAT16_WIDTH:
        return 32
    return TENSOR_CORE_SAMPLES[dtype]


@functools.cache
def tensor_core_layout(sizes: tuple[int, ...], dtype: str, tangents: bool = False) -> TensorCoreLayout | None:
    """The layout of the tensor-core kernels of ``sizes`` in ``dtype``, or None where they cannot
    run it (a tile over the group-shared memory budget, or gradient sums over ``MAX_REGISTER_SUMS``).
    With ``tangents``, the Hessian kernel's, whose tiles also hold each layer's input tangent: in
    tiles of :func:`tile_samples`, or of one mma block (16 samples) where those do not fit (the
    signed distance field's 3-64x3-1 in float32)."""
    candidates = [tile_samples(sizes, dtype)]
    if tangents and candidates[0] > 16:
        candidates.append(16)
    for samples in candidates:
        layout = _layout(sizes, samples, tangents)
        if layout.scratch <= TENSOR_CORE_SCRATCH_FLOATS:
            break
    if layout.scratch > TENSOR_CORE_SCRATCH_FLOATS or layout.register_sums > MAX_REGISTER_SUMS:
        return None
    return layout


def _layout(sizes: tuple[int, ...], samples: int, tangents: bool) -> TensorCoreLayout:
    layers = list(zip(sizes[:-1], sizes[1:]))
    strides = tuple(_stride(width) for width in sizes)
    offsets, total = [], 0
    for stride in strides:
        offsets.append(total)
        total += samples * stride
    tangent_offsets = []
    for stride in strides[:-1] if tangents else ():
        tangent_offsets.append(total)
        total += samples * stride
    # Every row 16-byte aligned in group-shared memory, as ldmatrix reads it and copyTile writes it
    # (16-byte cp.async): the group's `scratch`, its only group-shared array, starts the window.
    assert all(offset % 4 == 0 for offset in offsets + tangent_offsets)
    assert all(stride % 4 == 0 for stride in strides)
    forward, backward, blocks = [], [], 0
    for n_in, n_out in layers:
        forward.append(blocks)
        blocks += _blocks8(n_out, n_in)
    for n_in, n_out in layers:
        backward.append(blocks)
        blocks += _blocks8(n_in, n_out)
    return TensorCoreLayout(
        samples=samples,
        offsets=tuple(offsets),
        strides=strides,
        losses=total,
        scratch=total + TILE_THREADS,
        forward_fragments=tuple(forward),
        backward_fragments=tuple(backward),
        gradients=tuple(gradient_shape(n_out, n_in) for n_in, n_out in layers),
        bias_sums=tuple(math.ceil(n_out / TILE_THREADS) for _, n_out in layers),
        tangents=tuple(tangent_offsets),
    )


def pieces(
    dtype: str, tangents: bool = False, products: Float32Products = Float32Products.FLOAT32
) -> tuple[int, int, int]:
    """TF32 pieces of the activations, the weights and the gradients in a ``dtype`` network: one
    for values held as half (a float16 network's activations and weights are TF32 values exactly),
    two for floats. In the Hessian kernel (``tangents``) the weight gradients read the inputs'
    tangents, floats, as activations: two pieces. A float32 network whose ``products`` are one TF32
    pass takes one piece of everything, as XLA's TF32 products read their operands."""
    if dtype == "float32" and products is Float32Products.TF32:
        return 1, 1, 1
    held = 1 if dtype == "float16" else 2
    return (2 if tangents else held), held, 2


def tf32_rounded(values):
    """``values`` (float32) rounded to TF32, to nearest with ties away from zero (cvt.rna.tf32.f32):
    the low 13 of the 23 mantissa bits cleared after adding half of their weight; NaN stays NaN (the
    GPU's NaN, 0x7fffffff, plus that half would wrap to -0)."""
    bits = jax.lax.bitcast_convert_type(values, jnp.uint32)
    rounded = jax.lax.bitcast_convert_type((bits + jnp.uint32(0x1000)) & jnp.uint32(0xFFFFE000), jnp.float32)
    return jnp.where(jnp.isnan(values), values, rounded)


def b_fragments(matrix, weight_pieces: int):
    """``matrix`` (N x K, float32) as mma.sync's B fragments of B = matrix^T (K x N): for each block
    of 8 columns of B (j) and 8 rows (s), in that order, lane l = 4 g + t's two values
    B[8s + t][8j + g] and B[8s + t + 4][8j + g] side by side, zeros past the matrix's edges, rounded
    to TF32; in two pieces, the pair's TF32 parts (hi) then the TF32 rest (lo), so the kernel loads
    a lane's fragment with one load and rounds nothing. 64 ceil(N/8) ceil(K/8) values a piece.
    Half values are TF32 values: rounding keeps them as they are."""
    n, k = matrix.shape
    blocks_n, blocks_k = math.ceil(n / 8), math.ceil(k / 8)
    padded = jnp.pad(matrix, ((0, 8 * blocks_n - n), (0, 8 * blocks_k - k)))
    # [j][g][s][h][t]: row 8j + g, column 8s + 4h + t  ->  [j][s][g][t][h]
    blocks = padded.reshape(blocks_n, 8, blocks_k, 2, 4).transpose(0, 2, 1, 4, 3)
    hi = tf32_rounded(blocks)
    if weight_pieces > 1:
        hi = jnp.stack([hi, tf32_rounded(blocks - hi)], axis=-2)  # [j][s][g][t][piece][h]
    return hi.reshape(-1)


def weight_fragments(weights, dtype: str, products: Float32Products = Float32Products.FLOAT32) -> jax.Array:
    """The fragments operand of the tensor-core kernels of a ``dtype`` network whose float32
    products are ``products`` (``TensorCoreLayout.forward_fragments`` and ``backward_fragments``):
    each layer's weight (Out x In), then each one's transpose, as B fragments in float32 (one small
    XLA fusion)."""
    weight_pieces = pieces(dtype, products=products)[1]
    weights = [w.astype(jnp.float32) for w in weights]
    return jnp.concatenate(
        [b_fragments(w, weight_pieces) for w in weights] + [b_fragments(w.T, weight_pieces) for w in weights]
    )


def _chunk(cols: int) -> int:
    """Column blocks of 8 a warp runs at once in a row product of ``cols`` columns."""
    return max(1, min(MAX_CHUNK, math.ceil(math.ceil(cols / 8) / WARPS)))


def tensor_core_family(
    network: Network, layout: TensorCoreLayout, products: Float32Products = Float32Products.FLOAT32
) -> TileFamily:
    """The tensor-core family of tile kernels (shaders/nn/tensor_cores.slang, ``TensorCoreLayer``):
    warps run each product in mma.sync blocks (a float32 network's as ``products``), keep the
    weight gradient in registers across the group's tiles, and write it to the row of partial sums
    once. Float tiles are copied (cp.async: all of a tile's loads in flight at once, through no
    register); half ones are loaded, to be converted."""
    s, (act, weight, grad) = layout.samples, pieces(network.dtype, bool(layout.tangents), products)
    tiles = {
        f"Tile{k}": f"FragmentTile<{offset}, {stride}, GroupScratch>"
        for k, (offset, stride) in enumerate(zip(layout.offsets, layout.strides))
    }
    tiles.update(
        (f"Tangent{k}", f"FragmentTile<{offset}, {stride}, GroupScratch>")
        for k, (offset, stride) in enumerate(zip(layout.tangents, layout.strides))
    )

    def layer(k: int) -> str:
        (n_in, n_out), shape = network.layers[k], layout.gradients[k]
        # where its B fragments start, in floats: 64 a block of 8 x 8 and piece
        forward, backward = (
            64 * weight * fragments[k] for fragments in (layout.forward_fragments, layout.backward_fragments)
        )
        return (
            f"TensorCoreLayer<T, {s}, {n_in}, {n_out}, {network.offsets[k]}, "
            f"Pieces<{act}, {weight}, {grad}>, {forward}, {_chunk(n_out)}, {backward}, {_chunk(n_in)}, "
            f"GradientShape<{shape.rows}, {shape.cols}, {shape.rounds}>, {layout.bias_sums[k]}, "
            f"Tile{k}, {network.below(k)}, Tile{k + 1}, {network.activations[k]}, Parameters, Memory, "
            f"{tangent_tiles(network, k, layout.tangents, f'Tile{k}')}>"
        )

    copies = network.dtype == "float32"
    memory = "FragmentCopies<GroupScratch>" if copies else "FragmentLoads<T, GroupScratch>"
    return TileFamily(
        modules=("nn.mlp", "nn.tiled", "nn.tensor_cores"),
        memory=memory,
        tiles=tiles,
        layers=[layer(k) for k in range(len(network.layers))],
        samples=s,
        scratch=layout.scratch,
        losses=layout.losses,
        fragment_scratch=True,
        tangents=bool(layout.tangents),
    )
