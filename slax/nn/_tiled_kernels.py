"""Slang source for the MLP kernels of a wide network, run a tile of samples at a time: a
descriptor of the architecture (:func:`tile_kernels_source`) ahead of
``shaders/nn/tile_kernels.slang``, whose entry points are written once for both families of layers,
the tiled one here (``shaders/nn/tiled.slang``, :func:`tiled_family`) and the tensor-core one
(slax/nn/_tensor_core_kernels.py). What Python computes is the layout: where each tile lives and
the generic arguments of each layer's type.

The entry points are those of slax/nn/_kernels.py (same names, pointers and results), with thread
groups of ``TILE_THREADS`` and, for the gradient kernels, ``tiles_per_block`` in place of
``samples_per_thread``: thread group ``block`` runs tiles ``(block % blocks_per_group) *
tiles_per_block`` onwards of its vmapped group, ``TileLayout.samples`` samples each, and writes
one row of ``partials`` (the parameters' gradient sums, then the loss) as the per-sample kernels do.

Per tile, in group-shared memory: the input and every layer's output (``TileLayout.offsets``), which
the backward pass overwrites with each layer's output gradient once that layer's weight gradient no
longer needs them; one layer's input gradient (``TileLayout.gradient``); and each role's share of
the loss (``TileLayout.losses``). The Hessian kernel (``mlp_hessian_sums``) has a source and layout
of its own (``tangents``): each layer's input tangent besides (``TileLayout.tangents``), which its
weight gradient reads in place of the input.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from slax._signature import SLANG_SCALAR_FOR_DTYPE
from slax.nn._slang_types import chain_aliases

TILE_THREADS = 256
"""Threads per thread group: SLAX_TILE_THREADS in shaders/nn/tiled.slang."""
TILE_SCRATCH_FLOATS = 8192
"""Group-shared floats a tiled kernel may use: 32 KiB, which Vulkan's lavapipe, NVIDIA, AMD, Intel
and Apple GPUs all offer (CUDA allows 48 KiB of static shared memory)."""
MAX_TILE_SAMPLES = 16
MAX_BLOCK_SUMS = 16
"""Most sums a role holds in one block of a product. Fewer registers let more thread groups share a
multiprocessor: on an H100 (digits network, float32, the backward kernel) at most 32 sums took 168
registers a thread and 47.9 / 643 us at batch 2^12 / 2^16; 16 took 80 and 32.7 / 511 us; 8 took
56 and 35.1 / 538 us (BENCHMARKS.md)."""
BLOCKS_WANTED = 264
"""Thread groups a gradient launch aims for before a group runs several tiles: two per
multiprocessor of an H100. Every thread group writes a row of partial sums for XLA to add, so more
would cost memory traffic, not add speed."""


@dataclasses.dataclass(frozen=True)
class TileLayout:
    """Where a tile's values live in group-shared memory (floats from the start).

    Attributes:
      samples: samples per tile.
      offsets: each tile of activations, from the input's to the output's; row stride width + 1.
      gradient: the input-gradient tile, row stride ``gradient_stride``.
      losses: TILE_THREADS floats, one per role.
      scratch: floats in all.
      tangents: the Hessian kernel's layout only: the tangent tile of each layer's input (row
        stride width + 1, as its input's); empty in the first-derivative kernels'.
    """

    samples: int
    offsets: tuple[int, ...]
    gradient: int
    gradient_stride: int
    losses: int
    scratch: int
    tangents: tuple[int, ...] = ()

    def tiles_per_block(self, samples: int, per_group: int) -> int:
        """Tiles each thread group of a gradient launch runs (:func:`tiles_per_block`)."""
        return tiles_per_block(self.samples, samples, per_group)


def tiles_per_block(tile_samples: int, samples: int, per_group: int, least: int = 1) -> int:
    """Tiles of ``tile_samples`` each thread group of a gradient launch runs, for ``samples`` in
    vmapped groups of ``per_group``: ``least`` until the launch would exceed BLOCKS_WANTED thread
    groups, then as many as bring it there, but no more than a vmapped group has."""
    tiles = math.ceil(per_group / tile_samples)
    wanted = math.ceil(samples / tile_samples / BLOCKS_WANTED)
    return max(1, min(max(wanted, least), tiles))


def _scratch(sizes: tuple[int, ...], samples: int, tangents: bool = False) -> TileLayout:
    offsets, total = [], 0
    for width in sizes:
        offsets.append(total)
        total += samples * (width + 1)
    tangent_offsets = []
    for width in sizes[:-1] if tangents else ():
        tangent_offsets.append(total)
        total += samples * (width + 1)
    stride = max(sizes[:-1]) + 1
    gradient, total = total, total + samples * stride
    return TileLayout(
        samples, tuple(offsets), gradient, stride, total, total + TILE_THREADS, tuple(tangent_offsets)
    )


@functools.cache
def tile_layout(sizes: tuple[int, ...], tangents: bool = False) -> TileLayout | None:
    """The largest tile (up to MAX_TILE_SAMPLES) whose values fit TILE_SCRATCH_FLOATS, or None when
    even one sample's do not; with ``tangents``, the Hessian kernel's, which also holds each layer's
    input tangent."""
    for samples in range(MAX_TILE_SAMPLES, 0, -1):
        layout = _scratch(sizes, samples, tangents)
        if layout.scratch <= TILE_SCRATCH_FLOATS:
            return layout
    return None


def tile_error(sizes: tuple[int, ...]) -> str | None:
    """Why the tiled kernels cannot run ``sizes``, or None."""
    if tile_layout(sizes) is not None:
        return None
    need = _scratch(sizes, 1).scratch
    return (
        f"layers {'-'.join(map(str, sizes))} are too wide for the kernels: a tile of one sample "
        f"holds its activations in every layer, one layer's input gradient and the loss's partial "
        f"sums, {need} floats, in {TILE_SCRATCH_FLOATS} floats ({TILE_SCRATCH_FLOATS // 256} KiB) of "
        f"group-shared memory; use narrower layers (their widths plus the widest input, about "
        f"{TILE_SCRATCH_FLOATS - TILE_THREADS} floats at most)"
    )


def block_shape(rows: int, cols: int, terms: int) -> tuple[int, int]:
    """The block (rows x cols) each role computes of a rows x cols product of ``terms`` terms: the
    one whose role finishes first, counting a load like two multiply-adds (a role loads a block's
    rows + cols values per term and does rows * cols multiply-adds), with at most MAX_BLOCK_SUMS
    sums a role."""

    def cost(shape: tuple[int, int]) -> tuple[int, int]:
        bm, bn = shape
        rounds = math.ceil(math.ceil(rows / bm) * math.ceil(cols / bn) / TILE_THREADS)
        return rounds * terms * (bm * bn + 2 * (bm + bn)), bm * bn

    return min(((bm, bn) for bm in range(1, 9) for bn in range(1, 9) if bm * bn <= MAX_BLOCK_SUMS), key=cost)


@dataclasses.dataclass(frozen=True)
class Network:
    """What a tile kernel source needs of the network: its widths, layers' (in, out), each layer's
    parameter offset (its bias; its weight follows) and activation (its ``IActivation`` type in
    ``shaders/nn/activations.slang``), the dtype, and the length of a row of partial sums."""

    sizes: tuple[int, ...]
    layers: list[tuple[int, int]]
    offsets: list[int]
    activations: list[str]
    dtype: str
    sums: int

    def below(self, k: int) -> str:
        """The activation whose outputs layer k reads: the layer below's, or for the network's input
        ``Identity`` (its tile holds the values themselves)."""
        return "Identity" if k == 0 else self.activations[k - 1]

    @property
    def hidden(self) -> int:
        """Values a sample's hidden activations take: every layer's output but the last."""
        return sum(self.sizes[1:-1])


@dataclasses.dataclass(frozen=True)
class TileFamily:
    """A family of tile kernels' part of a network's descriptor (:func:`tile_kernels_source`).

    Attributes:
      modules: the Slang modules its types come from.
      memory: its ``ITileMemory`` type (how it readies group-shared memory and fills tiles).
      tiles: its tile types in group-shared memory, ``{name: type}``: ``Tile0``, ``Tile1``, ...
        (each layer's input, then the output layer's) and whatever else its layers name.
      layers: each layer's ``ITileLayer`` type, reading ``Tile{k}`` and writing ``Tile{k + 1}``.
      samples, scratch, losses: samples a tile, group-shared floats, where the roles' shares of the
        loss start in them.
      fragment_scratch: warps load A fragments from group-shared memory (``IFragmentScratch``).
      tangents: the Hessian kernel's source: ``Tangent0``, ``Tangent1``, ... (each layer's input
        tangent) among the tiles, which its layers' weight gradients read.
    """

    modules: tuple[str, ...]
    memory: str
    tiles: dict[str, str]
    layers: list[str]
    samples: int
    scratch: int
    losses: int
    fragment_scratch: bool = False
    tangents: bool = False


def tile_kernels_source(network: Network, family: TileFamily) -> str:
    """The tile kernels of ``network`` whose layers are of ``family``: a descriptor of the
    architecture (``T``, the tiles, ``Network``: the chain of layer types, and its sizes as
    ``static const``s) that includes ``shaders/nn/tile_kernels.slang``, where the entry points
    (``mlp_forward``, ``mlp_forward_hidden``, ``mlp_backward``, ``mlp_backward_params``,
    ``mlp_input_gradient``, ``mlp_loss_grad``; their operands: slax/nn/_kernels.py) are written
    once; a family with ``tangents`` also has ``mlp_hessian_sums`` (``SLAX_TILE_TANGENTS``)."""
    imports = "".join(f"import {module};\n" for module in ("slax.kernel", *family.modules))
    tiles = "".join(f"typealias {name} = {tile};\n" for name, tile in family.tiles.items())
    last = len(network.layers)
    defines = "#define SLAX_TILE_HIDDEN\n" if network.hidden else ""
    defines += "#define SLAX_FRAGMENT_SCRATCH\n" if family.fragment_scratch else ""
    defines += "#define SLAX_TILE_TANGENTS\ntypealias DirectionTile = Tangent0;\n" if family.tangents else ""
    chain = chain_aliases("Network", ["TileChain<T, "] * (last - 1), family.layers)
    return f"""{imports}
typealias T = {SLANG_SCALAR_FOR_DTYPE[network.dtype]};
typealias Memory = {family.memory};
{tiles}{chain}typealias InputTile = Tile0;
typealias OutputTile = Tile{last};
typealias OutputActivation = {network.activations[-1]};
static const int Inputs = {network.sizes[0]};
static const int Outputs = {network.sizes[-1]};
static const int Samples = {family.samples};
static const int HiddenWidth = {network.hidden};
static const int ParameterCount = {network.sums - 1};
static const int ScratchFloats = {family.scratch};
static const int LossesAt = {family.losses};
static const bool AffineOutput = {str(network.activations[-1] == "Identity").lower()};
{defines}#include "nn/tile_kernels.slang"
"""


def tiled_family(network: Network, layout: TileLayout) -> TileFamily:
    """The tiled family (``shaders/nn/tiled.slang``, ``TiledLayer``): each layer's products split
    into blocks of sums over the group's threads (:func:`block_shape`), the weight gradient added to
    the group's row of partial sums after every tile, the forward pass reading the weights
    transposed; tiles loaded (their rows, ``width + 1`` floats apart, keep no 16-byte alignment for
    copies), on every device. With ``layout.tangents``, the Hessian kernel's: each layer's weight
    gradient reads its input's tangent tile."""
    s = layout.samples
    tiles = {
        f"Tile{k}": f"SharedTile<{offset}, {width + 1}, GroupScratch>"
        for k, (offset, width) in enumerate(zip(layout.offsets, network.sizes))
    }
    tiles.update(
        (f"Tangent{k}", f"SharedTile<{offset}, {width + 1}, GroupScratch>")
        for k, (offset, width) in enumerate(zip(layout.tangents, network.sizes))
    )
    tiles["Gradient"] = f"SharedTile<{layout.gradient}, {layout.gradient_stride}, GroupScratch>"

    def layer(k: int) -> str:
        (n_in, n_out), offset = network.layers[k], network.offsets[k]
        blocks = [block_shape(s, n_out, n_in), block_shape(n_out, n_in, s), block_shape(s, n_in, n_out)]
        shapes = ", ".join(f"Blocks<{m}, {n}>" for m, n in blocks)
        return (
            f"TiledLayer<T, {s}, {n_in}, {n_out}, {offset}, {shapes}, Tile{k}, {network.below(k)}, "
            f"Tile{k + 1}, {network.activations[k]}, Parameters, TransposedParameters, Gradient, Memory, "
            f"{tangent_tiles(network, k, layout.tangents, f'LayerOutputs<{network.below(k)}, T, Tile{k}>')}>"
        )

    return TileFamily(
        modules=("nn.mlp", "nn.tiled"),
        memory="TileLoads<T>",
        tiles=tiles,
        layers=[layer(k) for k in range(len(network.layers))],
        samples=s,
        scratch=layout.scratch,
        losses=layout.losses,
        tangents=bool(layout.tangents),
    )


def tangent_tiles(network: Network, k: int, tangents: tuple[int, ...], weight_input: str) -> str:
    """Layer k's ``XT, YT`` generic arguments: what its weight gradient reads as its input, and its
    output's tangent tile. In the Hessian kernel's source (``tangents``, a layout's tangent tiles),
    its input's tangent ``Tangent{k}`` and ``Tangent{k + 1}`` (the last layer's output has none: its
    own output tile stands in, never written as a tangent); elsewhere ``weight_input`` (its input as
    the first-derivative kernels read it) and its output tile, the tangent unused."""
    last = len(network.layers) - 1
    if not tangents:
        return f"{weight_input}, Tile{k + 1}"
    return f"Tangent{k}, {'Tile' if k == last else 'Tangent'}{k + 1}"
