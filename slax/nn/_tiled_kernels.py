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
        """Tiles each thread group of a gradient launch runs, for ``samples`` in vmapped groups of
        ``per_group``: one until the launch would exceed BLOCKS_WANTED thread groups, then as many
        as bring it there, but no more than a vmapped group has."""
        tiles = math.ceil(per_group / self.samples)
        wanted = math.ceil(samples / self.samples / BLOCKS_WANTED)
        return max(1, min(wanted, tiles))


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
    best = None
    for bm in range(1, 9):
        for bn in range(1, 9):
            if bm * bn > MAX_BLOCK_SUMS:
                continue
            rounds = math.ceil(math.ceil(rows / bm) * math.ceil(cols / bn) / TILE_THREADS)
            cost = rounds * terms * (bm * bn + 2 * (bm + bn))
            if best is None or (cost, bm * bn) < best[0]:
                best = ((cost, bm * bn), (bm, bn))
    return best[1]


def tiled_source(
    sizes: tuple[int, ...],
    layers: list[tuple[int, int]],
    offsets: list[int],
    slopes: list[float],
    sums: int,
) -> str:
    """The three entry points for ``sizes`` (see slax/nn/_kernels.py), given its layers' (in, out),
    parameter offsets and slopes and the length of a row of partial sums; they follow the source's
    preamble (``_kernels._preamble``: the imports, ``T``, ``GroupScratch`` of ``TileLayout.scratch``
    floats)."""
    layout = tile_layout(sizes)
    s = layout.samples
    last = len(layers) - 1
    tiles = "\n".join(
        f"typealias Tile{k} = SharedTile<{offset}, {width + 1}, GroupScratch>;"
        for k, (offset, width) in enumerate(zip(layout.offsets, sizes))
    )

    def forward(k: int) -> str:
        n_in, n_out = layers[k]
        bm, bn = block_shape(s, n_out, n_in)
        return (
            f"        tileForward<T, {s}, {n_in}, {n_out}, {offsets[k]}, {bm}, {bn}, Parameters, "
            f"TransposedParameters, Tile{k}, Tile{k + 1}>(first, end, {slopes[k]});\n        groupBarrier();"
        )

    def backward(k: int, input_gradient: bool) -> str:
        n_in, n_out = layers[k]
        wm, wn = block_shape(n_out, n_in, s)
        lines = [
            f"        tileParameterGradient<{s}, {n_in}, {n_out}, {offsets[k]}, {wm}, {wn}, Tile{k}, "
            f"Tile{k + 1}>(first, end, sums, t == 0);"
        ]
        if input_gradient:
            xm, xn = block_shape(s, n_in, n_out)
            lines.append(
                f"        tileInputGradient<{s}, {n_in}, {n_out}, {offsets[k]}, {xm}, {xn}, Parameters, "
                f"Tile{k + 1}, Gradient>(first, end);"
            )
        lines.append("        groupBarrier();")
        if k > 0:
            slope = slopes[k - 1]
            lines.append(
                f"        tileActivationGradient<{s}, {n_in}, Gradient, Tile{k}>(first, end, {slope});"
                "\n        groupBarrier();"
            )
        return "\n".join(lines)

    def gradient_body(entry_backward: bool) -> str:
        hidden = "\n".join(forward(k) for k in range(last))
        if entry_backward:
            output = f"""
        loadTile<T, {s}, {sizes[-1]}, Tile{last + 1}>(dy, tile, true, first, end);
        groupBarrier();"""
        else:
            output = f"""
{forward(last)}
        tileSquaredError<T, {s}, {sizes[-1]}, Tile{last + 1}, Losses>(target, tile, loss_scale, first, end);
        groupBarrier();"""
        layers_back = "\n".join(backward(k, k > 0 or entry_backward) for k in range(last, -1, -1))
        store_dx = (
            f"\n        storeTile<T, {s}, {sizes[0]}, Gradient>(dx, tile, first, end);"
            if entry_backward
            else ""
        )
        return f"""
    uint thread = slax_thread_index(thread_id);
    if (thread >= count) return;  // whole thread groups only: count is a multiple of the group size
    uint block = thread / SLAX_TILE_THREADS, first, end;
    groupRoles(thread % SLAX_TILE_THREADS, SLAX_TILE_THREADS, first, end);
    parameterPointer = params;
    transposedPointer = transposed_params;
    float* sums = partials + block * {sums};
    uint groupStart = (block / blocks_per_group) * samples_per_group;
    uint firstTile = (block % blocks_per_group) * tiles_per_block;
    clearLosses(first, end);
    for (uint t = 0; t < tiles_per_block; t++)
    {{
        let tile = TileSamples(groupStart, (firstTile + t) * {s}, samples_per_group);
        if (tile.first >= samples_per_group) break;  // the same for the whole thread group
        loadTile<T, {s}, {sizes[0]}, Tile0>(x, tile, false, first, end);
        groupBarrier();
{hidden}{output}
{layers_back}{store_dx}
    }}
    groupBarrier();
    sumLosses(first, end, sums + {sums - 1});"""

    forward_chain = "\n".join(forward(k) for k in range(len(layers)))
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
typealias Gradient = SharedTile<{layout.gradient}, {layout.gradient_stride}, GroupScratch>;
typealias Losses = SharedTile<{layout.losses}, 0, GroupScratch>;

void clearLosses(uint first, uint end)
{{
    for (uint role = first; role < end; role++) Losses.store(0, role, 0.0);
}}

// The roles' shares of the loss, added in role order (the backward kernel's are all zero).
void sumLosses(uint first, uint end, float* out)
{{
    if (first == 0 && end > 0)
    {{
        float sum = 0.0;
        for (uint role = 0; role < SLAX_TILE_THREADS; role++) sum += Losses.load(0, role);
        *out = sum;
    }}
}}

[shader("compute")]
[numthreads(SLAX_TILE_THREADS, 1, 1)]
void mlp_forward(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform float* params,
                 uniform float* transposed_params, uniform T* y, uniform uint count, uniform uint samples)
{{
    uint thread = slax_thread_index(thread_id);
    if (thread >= count) return;  // whole thread groups only: count is a multiple of the group size
    uint first, end;
    groupRoles(thread % SLAX_TILE_THREADS, SLAX_TILE_THREADS, first, end);
    parameterPointer = params;
    transposedPointer = transposed_params;
    let tile = TileSamples(0, (thread / SLAX_TILE_THREADS) * {s}, samples);
    loadTile<T, {s}, {sizes[0]}, Tile0>(x, tile, false, first, end);
    groupBarrier();
{forward_chain}
    storeTile<T, {s}, {sizes[-1]}, Tile{last + 1}>(y, tile, first, end);
}}

[shader("compute")]
[numthreads(SLAX_TILE_THREADS, 1, 1)]
void mlp_backward(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform T* dy,
                  uniform float* params, uniform float* transposed_params, uniform float* partials,
                  uniform T* dx, uniform uint count, uniform uint samples_per_group,
                  uniform uint blocks_per_group, uniform uint tiles_per_block)
{{{gradient_body(True)}
}}

[shader("compute")]
[numthreads(SLAX_TILE_THREADS, 1, 1)]
void mlp_loss_grad(uint3 thread_id : SV_DispatchThreadID, uniform T* x, uniform T* target,
                   uniform float* params, uniform float* transposed_params, uniform float* partials,
                   uniform uint count, uniform uint samples_per_group, uniform uint blocks_per_group,
                   uniform uint tiles_per_block, uniform float loss_scale)
{{{gradient_body(False)}
}}
"""
