"""Slang source for the MLP kernels of a wide network, run a tile of samples at a time
(``shaders/nn/tiled.slang``).

The entry points are those of slax/nn/_kernels.py (same names, pointers and results), with thread
groups of ``TILE_THREADS`` and, for the gradient kernels, ``tiles_per_block`` in place of
``samples_per_thread``: thread group ``block`` runs tiles ``(block % blocks_per_group) *
tiles_per_block`` onwards of its vmapped group, ``TileLayout.samples`` samples each, and writes
one row of ``partials`` (the parameters' gradient sums, then the loss) as the per-sample kernels do.

Per tile, in group-shared memory: the input and every layer's output (``TileLayout.offsets``), which
the backward pass overwrites with each layer's output gradient once that layer's weight gradient no
longer needs them; one layer's input gradient (``TileLayout.gradient``); and each role's share of
the loss (``TileLayout.losses``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Protocol

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
    """

    samples: int
    offsets: tuple[int, ...]
    gradient: int
    gradient_stride: int
    losses: int
    scratch: int

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


def _scratch(sizes: tuple[int, ...], samples: int) -> TileLayout:
    offsets, total = [], 0
    for width in sizes:
        offsets.append(total)
        total += samples * (width + 1)
    stride = max(sizes[:-1]) + 1
    gradient, total = total, total + samples * stride
    return TileLayout(samples, tuple(offsets), gradient, stride, total, total + TILE_THREADS)


@functools.cache
def tile_layout(sizes: tuple[int, ...]) -> TileLayout | None:
    """The largest tile (up to MAX_TILE_SAMPLES) whose values fit TILE_SCRATCH_FLOATS, or None when
    even one sample's do not."""
    for samples in range(MAX_TILE_SAMPLES, 0, -1):
        layout = _scratch(sizes, samples)
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
    ``shaders/nn/activations.slang``), the dtype, and the length of a row of partial sums.

    Layer k's output tile, ``Tile{k + 1}``, holds what its activation keeps (y, or z where the
    activation keeps its input); :meth:`layer_input` and :meth:`output` read y from it."""

    sizes: tuple[int, ...]
    layers: list[tuple[int, int]]
    offsets: list[int]
    activations: list[str]
    dtype: str
    sums: int

    def layer_input(self, k: int) -> str:
        """The matrix of layer k's input values: the input tile, or the outputs of layer k - 1."""
        return "Tile0" if k == 0 else f"LayerOutputs<{self.activations[k - 1]}, T, Tile{k}>"

    @property
    def output(self) -> str:
        """The matrix of the network's output values."""
        return self.layer_input(len(self.layers))

    @property
    def affine_output(self) -> bool:
        """Whether the output layer has no activation: its output gradient is dy itself."""
        return self.activations[-1] == "Identity"

    @property
    def hidden(self) -> int:
        """Values a sample's hidden activations take: every layer's output but the last."""
        return sum(self.sizes[1:-1])

    def hidden_offset(self, k: int) -> int:
        """Where layer k's output (k < the last layer) starts among a sample's hidden values."""
        return sum(self.sizes[1 : k + 1])


class TileProducts(Protocol):
    """The layers' matrix products of tile kernels: Slang code for the entry points of
    :func:`tile_kernels_source`, which run in every thread of a group, with ``first, end`` its
    roles (groupRoles), ``tile`` (TileSamples) the tile, ``t`` the tile's number in the group, and
    ``sums`` the group's row of partial sums."""

    @property
    def samples(self) -> int:
        """Samples per tile."""

    @property
    def operand(self) -> str:
        """The name of the parameters' second operand (the first, ``params``, is the flat layout)."""

    @property
    def copies_tiles(self) -> bool:
        """Whether tiles are filled from memory by asynchronous copies (copyTile, float data on
        CUDA) rather than loads (loadTile)."""

    def declarations(self) -> str:
        """Module-level code: ``Parameters`` (reading ``params``), ``Tile0``... (each layer's input
        and the output), ``Losses``, and whatever the products need."""

    def setup(self, summing: bool) -> str:
        """Each entry point's first lines after the roles: the pointers behind ``declarations``;
        ``summing``: in a gradient kernel."""

    def forward(self, k: int, summing: bool) -> str:
        """Layer k from Tile{k} to Tile{k+1}, ending with a group barrier; ``summing``: in a
        gradient kernel, whose parameter gradient sums are live."""

    def begin_sums(self) -> str:
        """Before a gradient kernel's tiles: the parameter gradient sums start."""

    def backward(self, k: int, input_gradient: bool) -> str:
        """Layer k's backward pass from its output gradient in Tile{k+1}: its parameter gradients
        added to the sums, and for k > 0 the previous layer's output gradient (through its
        activation) over Tile{k}, or for k == 0 with ``input_gradient`` the network's to ``dx``;
        ending where the next tile may overwrite Tile0."""

    def end_sums(self) -> str:
        """After a gradient kernel's tiles: the sums to ``sums``."""


def tile_kernels_source(network: Network, products: TileProducts) -> str:
    """The entry points of a wide network's tile kernels (see slax/nn/_kernels.py), with its layers'
    products from ``products``; they follow the source's preamble (``_kernels._preamble``: the
    imports, ``T``, ``GroupScratch``):

    - ``mlp_forward``: ``x, params, <operand> -> y``, a tile per thread group;
    - ``mlp_forward_hidden``: the same, also writing each sample's hidden activations (every layer's
      output but the last, ``Network.hidden`` values a sample, as T) for ``mlp_backward``;
    - ``mlp_backward``: ``x, hidden, dy, params, <operand> -> partial sums, dx``, from the hidden
      activations ``mlp_forward_hidden`` wrote, with no forward pass;
    - ``mlp_backward_params``: the same without ``dx``, nor the first layer's input-gradient
      product behind it (a training step's gradient: its data need none);
    (a network of one layer has no hidden activations, and these take no ``hidden`` pointer);
    - ``mlp_loss_grad``: ``x, target, params, <operand> -> partial sums``, forward and backward.
    """
    s, sizes, hidden = products.samples, network.sizes, network.hidden
    last = len(network.layers) - 1

    def roles(summing: bool) -> str:
        return f"""
    uint thread = slax_thread_index(thread_id);
    if (thread >= count) return;  // whole thread groups only: count is a multiple of the group size
    uint block = thread / SLAX_TILE_THREADS, local = thread % SLAX_TILE_THREADS, first, end;
    groupRoles(local, SLAX_TILE_THREADS, first, end);
{products.setup(summing)}"""

    def fill(data: str, width: int, stride: int, offset: int, k: int, zero_padding: bool) -> str:
        """Tile{k} from ``width`` values a sample at ``data + offset`` (``stride`` apart), read only
        after ``filled`` (the wait for copies, then a group barrier): loaded (loadTile), or copied
        (copyTile), by 4 floats
        where the source rows stay 16-byte aligned. That takes ``data`` 16-byte aligned: XLA's GPU
        buffers are (its entry parameters at least 16 bytes, kEntryParameterAlignBytes, its own
        allocations 64), and so are the destination rows of the products that copy
        (:func:`slax.nn._tensor_core_kernels.tensor_core_layout` checks its tiles)."""
        at, zero = (f"{data} + {offset}" if offset else data), str(zero_padding).lower()
        if products.copies_tiles:
            floats = 4 if width % 4 == 0 and stride % 4 == 0 and offset % 4 == 0 else 1
            return f"copyTile<{s}, {width}, {stride}, {floats}, Tile{k}>({at}, tile, {zero}, first, end);"
        return f"loadTile<T, {s}, {width}, {stride}, Tile{k}>({at}, tile, {zero}, first, end);"

    def filled(indent: str) -> str:
        """The group barrier after a tile's fills, behind the wait for their copies."""
        return f"waitTileCopies();\n{indent}groupBarrier();" if products.copies_tiles else "groupBarrier();"

    def fill_hidden() -> str:
        """Each hidden layer's output tile from ``hidden``."""
        return "".join(
            f"\n        {fill('hidden', sizes[k + 1], hidden, network.hidden_offset(k), k + 1, False)}"
            for k in range(last)
        )

    def store_hidden() -> str:
        """Each hidden layer's output tile to ``hidden``."""
        return "".join(
            f"\n    storeTile<T, {s}, {sizes[k + 1]}, {hidden}, Tile{k + 1}>"
            f"(hidden + {network.hidden_offset(k)}, tile, first, end);"
            for k in range(last)
        )

    def forward_body(keep_hidden: bool) -> str:  # (a network with no hidden layer keeps nothing)
        chain = "\n".join(products.forward(k, False) for k in range(len(network.layers)))
        return f"""{roles(False)}
    let tile = TileSamples(0, block * {s}, samples);
    {fill("x", sizes[0], sizes[0], 0, 0, False)}
    {filled("    ")}
{chain}{store_hidden() if keep_hidden else ""}
    storeTile<T, {s}, {sizes[-1]}, {sizes[-1]}, {network.output}>(y, tile, first, end);"""

    def gradient_body(from_hidden: bool, input_gradient: bool) -> str:
        if from_hidden and network.affine_output:
            inputs = f"""{fill_hidden()}
        {fill("dy", sizes[-1], sizes[-1], 0, last + 1, True)}
        {filled("        ")}"""
        elif from_hidden:  # dy times the output activation's derivative, at z the last layer recomputes
            inputs = f"""{fill_hidden()}
        {filled("        ")}
{products.forward(last, True)}
        tileOutputGradient<T, {s}, {sizes[-1]}, {network.activations[-1]}, Tile{last + 1}>(
            dy, tile, first, end);
        groupBarrier();"""
        else:
            chain = "\n".join(products.forward(k, True) for k in range(len(network.layers)))
            inputs = f"""
        {filled("        ")}
{chain}
        tileSquaredError<T, {s}, {sizes[-1]}, {network.activations[-1]}, Tile{last + 1}, Losses>(
            target, tile, loss_scale, first, end);
        groupBarrier();"""
        layers_back = "\n".join(products.backward(k, input_gradient) for k in range(last, -1, -1))
        return f"""{roles(True)}
    float* sums = partials + block * {network.sums};
    uint groupStart = (block / blocks_per_group) * samples_per_group;
    uint firstTile = (block % blocks_per_group) * tiles_per_block;
    clearLosses<Losses>(first, end);
{products.begin_sums()}
    for (uint t = 0; t < tiles_per_block; t++)
    {{
        let tile = TileSamples(groupStart, (firstTile + t) * {s}, samples_per_group);
        if (tile.first >= samples_per_group) break;  // the same for the whole thread group
        {fill("x", sizes[0], sizes[0], 0, 0, False)}{inputs}
{layers_back}
    }}
{products.end_sums()}
    groupBarrier();
    sumLosses<Losses>(first, end, sums + {network.sums - 1});"""

    operand = products.operand
    hidden_pointer = "uniform T* hidden, " if hidden else ""

    def backward_entry(input_gradient: bool) -> str:
        """``mlp_backward``, or without ``dx`` (nor layer 0's input-gradient product)
        ``mlp_backward_params``."""
        name, dx = ("mlp_backward", "uniform T* dx, ") if input_gradient else ("mlp_backward_params", "")
        return f"""
[shader("compute")]
[numthreads(SLAX_TILE_THREADS, 1, 1)]
void {name}(uint3 thread_id : SV_DispatchThreadID, uniform T* x, {hidden_pointer}uniform T* dy,
            uniform float* params, uniform float* {operand}, uniform float* partials, {dx}uniform uint count,
            uniform uint samples_per_group, uniform uint blocks_per_group, uniform uint tiles_per_block)
{{{gradient_body(True, input_gradient)}
}}
"""

    return f"""
{products.declarations()}

[shader("compute")]
[numthreads(SLAX_TILE_THREADS, 1, 1)]
void mlp_forward(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform float* params,
                 uniform float* {operand}, uniform T* y, uniform uint count, uniform uint samples)
{{{forward_body(False)}
}}

[shader("compute")]
[numthreads(SLAX_TILE_THREADS, 1, 1)]
void mlp_forward_hidden(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform float* params,
                        uniform float* {operand}, uniform T* y, {hidden_pointer}uniform uint count,
                        uniform uint samples)
{{{forward_body(True)}
}}

{backward_entry(True)}{backward_entry(False)}
[shader("compute")]
[numthreads(SLAX_TILE_THREADS, 1, 1)]
void mlp_loss_grad(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform T* target,
                   uniform float* params, uniform float* {operand}, uniform float* partials,
                   uniform uint count, uniform uint samples_per_group, uniform uint blocks_per_group,
                   uniform uint tiles_per_block, uniform float loss_scale)
{{{gradient_body(False, False)}
}}
"""


@dataclasses.dataclass(frozen=True)
class TiledProducts:
    """:class:`TileProducts` of the tiled kernels: each layer's products split into blocks of sums
    over the group's threads (``shaders/nn/tiled.slang``), the weight gradient added to the group's
    row of partial sums after every tile, the forward pass reading the weights transposed."""

    network: Network
    layout: TileLayout
    operand: str = "transposed_params"

    @property
    def copies_tiles(self) -> bool:
        """Tiles are loaded (loadTile): their rows in group-shared memory are ``width + 1`` floats
        apart, which no 16-byte copy keeps aligned, and the kernels run on every device."""
        return False

    @property
    def samples(self) -> int:
        return self.layout.samples

    def declarations(self) -> str:
        tiles = "\n".join(
            f"typealias Tile{k} = SharedTile<{offset}, {width + 1}, GroupScratch>;"
            for k, (offset, width) in enumerate(zip(self.layout.offsets, self.network.sizes))
        )
        return f"""
static float* parameterPointer;

static float* transposedPointer;

struct Parameters : IParameters
{{
    static float load(uint index) {{ return parameterPointer[index]; }}
}}

struct TransposedParameters : IParameters
{{
    static float load(uint index) {{ return transposedPointer[index]; }}
}}

{tiles}
typealias Gradient = SharedTile<{self.layout.gradient}, {self.layout.gradient_stride}, GroupScratch>;
typealias Losses = SharedTile<{self.layout.losses}, 0, GroupScratch>;"""

    def setup(self, summing: bool) -> str:
        return "    parameterPointer = params;\n    transposedPointer = transposed_params;"

    def forward(self, k: int, summing: bool) -> str:
        s, (n_in, n_out) = self.samples, self.network.layers[k]
        bm, bn = block_shape(s, n_out, n_in)
        return (
            f"        tileForward<T, {s}, {n_in}, {n_out}, {self.network.offsets[k]}, {bm}, {bn}, "
            f"Parameters, TransposedParameters, {self.network.layer_input(k)}, Tile{k + 1}, "
            f"{self.network.activations[k]}>(first, end);\n"
            "        groupBarrier();"
        )

    def begin_sums(self) -> str:
        return "    // each tile's gradient terms go to `sums` (the first tile's start them)"

    def backward(self, k: int, input_gradient: bool) -> str:
        s, (n_in, n_out), offset = self.samples, self.network.layers[k], self.network.offsets[k]
        wm, wn = block_shape(n_out, n_in, s)
        lines = [
            f"        tileParameterGradient<{s}, {n_in}, {n_out}, {offset}, {wm}, {wn}, "
            f"{self.network.layer_input(k)}, Tile{k + 1}>(first, end, sums, t == 0);"
        ]
        if k > 0 or input_gradient:
            xm, xn = block_shape(s, n_in, n_out)
            lines.append(
                f"        tileInputGradient<{s}, {n_in}, {n_out}, {offset}, {xm}, {xn}, Parameters, "
                f"Tile{k + 1}, Gradient>(first, end);"
            )
        lines.append("        groupBarrier();")
        if k > 0:
            lines.append(
                f"        tileActivationGradient<{s}, {n_in}, {self.network.activations[k - 1]}, Gradient, "
                f"Tile{k}>(first, end);\n        groupBarrier();"
            )
        elif input_gradient:
            lines.append(f"        storeTile<T, {s}, {n_in}, {n_in}, Gradient>(dx, tile, first, end);")
        return "\n".join(lines)

    def end_sums(self) -> str:
        return ""
