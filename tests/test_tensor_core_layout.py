"""The tensor-core MLP kernels' layouts (slax/nn/_tensor_core_kernels.py): the B fragments XLA lays
out, read back through an emulation of mma.sync with the PTX ISA's fragment layout; the layouts and
when a network takes them; the gradient rectangles; the hidden activations the forward pass keeps
for the backward pass. The kernels themselves against the reference: tests/test_tensor_cores.py."""

from __future__ import annotations

import collections
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import draw_uniform, equations

from slax import nn
from slax.nn import _primitives as nn_primitives
from slax.nn import _tensor_core_kernels as tc
from slax.nn._activations import HIDDEN_DEFAULT, OUTPUT_DEFAULT, layer_activations
from slax.nn._architecture import Architecture
from slax.nn._backends import Platform, TensorCores
from slax.nn._kernels import hidden_width, kernel_layout, layer_pairs, parameter_offsets
from slax.nn._tiled_kernels import TILE_THREADS, Network, TileLayout

# Layouts, read back by an emulation of mma.sync in NumPy: no kernel runs.
pytestmark = [pytest.mark.one_device_kind]

DTYPES = ["float32", "float16"]
DIGITS = (64, 128, 64, 10)
WIDE = [(40, 10), (13, 21, 10), DIGITS]
"""Wide networks (too many parameters for a thread's registers) that fit the tensor-core layout: one
layer alone (no hidden activations), widths off multiples of 8 (fragments and tiles padded with
zeros), and the digits network."""
LANE = np.arange(32)
GROUP, THREAD = LANE // 4, LANE % 4
"""Each lane's groupID and threadID_in_group (PTX ISA, "Matrix Fragments for mma.m16n8k8")."""


# --- B fragments against mma.sync -------------------------------------------------------------------


def _tf32_operand(values):
    """What mma.sync reads of a .tf32 operand: a float's top 19 bits (sign, exponent, 10 mantissa bits)."""
    bits = np.asarray(values, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


def _mma(a, b, c):
    """``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`` on a warp's fragments (a: 32 x 4,
    b: 32 x 2, c: 32 x 4, a row a lane), laid out as the PTX ISA says: lane (g, t) holds A[g][t],
    A[g+8][t], A[g][t+4], A[g+8][t+4]; B[t][g], B[t+4][g]; C[g][2t], C[g][2t+1], C[g+8][2t],
    C[g+8][2t+1]. Summed in float64, so only the fragments' layout and TF32 operands can err."""
    g, t = GROUP, THREAD
    a, b = _tf32_operand(a).astype(np.float64), _tf32_operand(b).astype(np.float64)
    lhs, rhs, acc = np.zeros((16, 8)), np.zeros((8, 8)), np.zeros((16, 8))
    lhs[g, t], lhs[g + 8, t], lhs[g, t + 4], lhs[g + 8, t + 4] = a.T
    rhs[t, g], rhs[t + 4, g] = b.T
    acc[g, 2 * t], acc[g, 2 * t + 1], acc[g + 8, 2 * t], acc[g + 8, 2 * t + 1] = c.T
    d = lhs @ rhs + acc
    return np.stack([d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1]], axis=-1)


def _row_product(lhs, fragments, n, pieces):
    """``lhs`` (M x K) times B (K x N) as warpRowProduct runs it, B given as ``fragments`` (b_fragments
    of B's transpose): per 16 x 8 block of the result an mma.sync per 8 terms; A fragments from
    ``lhs`` padded with zeros, as the kernels' tiles are; lane l's B fragment of block b read as
    loadFragment reads it, 2 * pieces floats at (32 b + l) 2 pieces, the hi pair then the lo pair.
    With two pieces ``lhs`` is split as split4 splits it (hi: its TF32 bits, lo: the rest) and each
    block adds lo hi, hi lo and hi hi (mmaPieces)."""
    m, k = lhs.shape
    steps, col_blocks = -(-k // 8), -(-n // 8)
    tile = np.zeros((16 * -(-m // 16), 8 * steps), np.float32)
    tile[:m, :k] = lhs
    loads = np.asarray(fragments).reshape(col_blocks * steps, 32, 2 * pieces)
    g, t = GROUP, THREAD
    out = np.zeros((tile.shape[0], 8 * col_blocks))
    for top in range(0, tile.shape[0], 16):
        for j in range(col_blocks):
            acc = np.zeros((32, 4))
            for s in range(steps):
                r, c = top + g, 8 * s + t
                a = np.stack([tile[r, c], tile[r + 8, c], tile[r, c + 4], tile[r + 8, c + 4]], axis=-1)
                b = loads[j * steps + s]
                if pieces == 1:
                    acc = _mma(a, b, acc)
                else:
                    a_hi = _tf32_operand(a)
                    for a_piece, b_piece in ((a - a_hi, b[:, :2]), (a_hi, b[:, 2:]), (a_hi, b[:, :2])):
                        acc = _mma(a_piece, b_piece, acc)
            r, c = top + g, 8 * j + 2 * t
            out[r, c], out[r, c + 1], out[r + 8, c], out[r + 8, c + 1] = acc.T
    return out[:m, :n]


def _fragment_pieces(fragments, n, k, pieces):
    """Each value of ``fragments`` (b_fragments of an N x K matrix) back at its place in the matrix,
    padded to whole 8 x 8 blocks, per piece: block (j, s)'s lane (g, t) holds b0 = B[t][g] and
    b1 = B[t+4][g] of that block of B, the matrix's transpose, read as loadFragment reads them."""
    col_blocks, steps = -(-n // 8), -(-k // 8)
    loads = np.asarray(fragments).reshape(col_blocks, steps, 32, pieces, 2)
    out = np.zeros((pieces, 8 * col_blocks, 8 * steps), np.float32)
    for j in range(col_blocks):
        for s in range(steps):
            out[:, 8 * j + GROUP, 8 * s + THREAD] = loads[j, s, :, :, 0].T
            out[:, 8 * j + GROUP, 8 * s + THREAD + 4] = loads[j, s, :, :, 1].T
    return out


@pytest.mark.parametrize("pieces", [1, 2])
def test_b_fragments_multiply_as_mma_sync_reads_them(pieces):
    """A 20 x 13 matrix times a 10 x 13 matrix's transpose, through the fragments b_fragments lays
    out and mma.sync with the PTX ISA's layout: shapes off 16 and 8, so padding rows, padding terms
    and padding columns all take part. One piece, of half values (TF32 values exactly, as a float16
    network's weights are): exact. Two pieces of floats: within 2^-19 of each term's |a b|, which
    3xTF32 guarantees: a's lo (below 2^-10 |a|) loses under 2^-20 |a| to mma.sync's TF32 reading, the
    split b's pieces miss 2^-23 |b| (test below), and lo lo, left out, is under 2^-21 |a b|."""
    keys = jax.random.split(jax.random.key(20 + pieces), 2)
    dtype = jnp.float16 if pieces == 1 else jnp.float32
    lhs = np.asarray(draw_uniform(keys[0], (20, 13), dtype), np.float32)
    matrix = np.asarray(draw_uniform(keys[1], (10, 13), dtype), np.float32)
    fragments = tc.b_fragments(jnp.asarray(matrix), pieces)
    assert fragments.shape == (64 * 2 * 2 * pieces,)
    got = _row_product(lhs, fragments, 10, pieces)
    want = lhs.astype(np.float64) @ matrix.astype(np.float64).T
    if pieces == 1:
        np.testing.assert_array_equal(got, want)
    else:
        bound = 2.0**-19 * (np.abs(lhs).astype(np.float64) @ np.abs(matrix).astype(np.float64).T)
        assert np.all(np.abs(got - want) <= bound)


def test_two_pieces_are_the_tf32_rounding_and_its_rest():
    """Split weights: hi, the weight rounded to TF32 (nearest, ties away from zero: cvt.rna.tf32.f32),
    and lo, the rest rounded to TF32, both with their low 13 mantissa bits clear, since mma.sync
    would drop them. For |w| in [2^e, 2^(e+1)): |w - hi| <= 2^(e-11), half a TF32 ulp; the rest,
    under 2^(e-11), has 13 significant bits of which TF32 keeps 11, so |w - hi - lo| <= 2^(e-23),
    one float32 ulp. Past the matrix's edges both pieces are zero."""
    keys = jax.random.split(jax.random.key(23), 2)
    scales = 2.0 ** np.asarray(jax.random.randint(keys[1], (10, 13), -20, 21))
    matrix = (np.asarray(draw_uniform(keys[0], (10, 13), jnp.float32)) * scales).astype(np.float32)
    tie = np.float32(1 + 2**-11)  # halfway between TF32 values 1 and 1 + 2^-10
    matrix[0, :3] = [tie, -tie, np.nextafter(tie, np.float32(0))]
    hi, lo = _fragment_pieces(tc.b_fragments(jnp.asarray(matrix), 2), 10, 13, 2)
    assert not np.any(hi[10:]) and not np.any(hi[:, 13:]) and not np.any(lo[10:]) and not np.any(lo[:, 13:])
    hi, lo = hi[:10, :13], lo[:10, :13]
    for piece in (hi, lo):
        assert not np.any(piece.view(np.uint32) & np.uint32(0x1FFF))
    np.testing.assert_array_equal(hi[0, :3], [1 + 2**-10, -(1 + 2**-10), 1.0])
    value = matrix.astype(np.float64)
    binade = 2.0 ** np.floor(np.log2(np.abs(value)))
    assert np.all(np.abs(value - hi) <= 2.0**-11 * binade)
    assert np.all(np.abs(value - hi.astype(np.float64) - lo) <= 2.0**-23 * binade)


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_fragments_are_where_the_layout_and_the_kernels_read_them(dtype):
    """The fragments operand holds each layer's weight then each one's transpose, one after the
    other, at the layout's forward_fragments and backward_fragments (in 8 x 8 blocks of ``pieces``
    floats), which is where the generated row products read them. A float16 network's weights are
    TF32 values, one piece; a float32 network's two; gradients are floats, always two."""
    assert tc.pieces(dtype) == {"float32": (2, 2, 2), "float16": (1, 1, 2)}[dtype]
    sizes = (13, 21, 10)
    layout = tc.tensor_core_layout(sizes, dtype)
    keys = jax.random.split(jax.random.key(24), len(sizes) - 1)
    pairs = layer_pairs(sizes)
    weights = [draw_uniform(key, (n_out, n_in), dtype) for key, (n_in, n_out) in zip(keys, pairs)]
    fragments = tc.weight_fragments(weights, dtype)
    assert fragments.dtype == jnp.float32
    weight_pieces = tc.pieces(dtype)[1]
    activations = ["LeakyReLU", "Identity"]
    offsets, sums = parameter_offsets(sizes)[0], kernel_layout(sizes).sums
    network = Network(sizes, layer_pairs(sizes), offsets, activations, dtype, sums)
    family = tc.tensor_core_family(network, layout)
    # TensorCoreLayer<T, S, In, Out, Offset, Pieces<...>, ForwardFragments, ForwardChunk, BackwardFragments
    read = [
        re.match(r"TensorCoreLayer<T, \d+, \d+, \d+, \d+, Pieces<[^>]*>, (\d+), \d+, (\d+),", layer)
        for layer in family.layers
    ]
    sections = []
    for k, weight in enumerate(weights):
        for block, matrix, at in (
            (layout.forward_fragments[k], weight, read[k].group(1)),
            (layout.backward_fragments[k], weight.T, read[k].group(2)),
        ):
            start = block * 64 * weight_pieces
            expected = tc.b_fragments(matrix.astype(jnp.float32), weight_pieces)
            np.testing.assert_array_equal(fragments[start : start + expected.size], expected)
            assert int(at) == start
            sections.append((start, start + expected.size))
    sections.sort()
    assert [end for _, end in sections[:-1]] == [start for start, _ in sections[1:]]
    assert (sections[0][0], sections[-1][1]) == (0, fragments.size)


# --- layouts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "dtype"),
    [(DIGITS, "float32"), (DIGITS, "float16"), ((400, 10), "float16")]
    + [(sizes, "float32") for sizes in WIDE],
    ids=str,
)
def test_networks_within_the_limits_take_tensor_cores(sizes, dtype):
    """With tensor cores on, a wide network whose tile fits 48 KiB of group-shared memory and whose
    gradient sums fit a thread's registers takes their layout: tiles of tile_samples samples,
    each width's row padded to 8 plus 4 floats (so 400-10 fits in float16's tiles of 16, not in
    float32's of 32), then a float per thread for the losses."""
    layout = kernel_layout(sizes, tensor_cores=True, dtype=dtype)
    assert layout.tensor_cores and not layout.thread_sums
    assert layout.tile == tc.tensor_core_layout(sizes, dtype)
    samples = tc.tile_samples(sizes, dtype)
    assert layout.tile.samples == samples
    rows = [8 * math.ceil(width / 8) + 4 for width in sizes]
    assert layout.tile.strides == tuple(rows)
    assert layout.tile.scratch == samples * sum(rows) + TILE_THREADS <= tc.TENSOR_CORE_SCRATCH_FLOATS
    assert layout.tile.register_sums <= tc.MAX_REGISTER_SUMS


def _unbounded_layout(monkeypatch, sizes, dtype):
    """The tensor-core layout ``sizes`` would take with no limit on scratch or register sums."""
    with monkeypatch.context() as patch:
        patch.setattr(tc, "TENSOR_CORE_SCRATCH_FLOATS", math.inf)
        patch.setattr(tc, "MAX_REGISTER_SUMS", math.inf)
        tc.tensor_core_layout.cache_clear()
        layout = tc.tensor_core_layout(sizes, dtype)
    tc.tensor_core_layout.cache_clear()  # nothing made without the limits stays cached
    return layout


@pytest.mark.parametrize(
    ("sizes", "dtype", "scratch_over", "sums_over"),
    [
        ((400, 10), "float32", True, False),  # 32 rows of 404 floats: 13,824 (in float16, 16 rows fit)
        ((784, 16, 10), "float16", True, False),  # 16 rows of 796 + 20 + 20 floats: 13,504
        ((64, 192, 64, 10), "float32", False, True),  # 103 sums
        ((64, 192, 64, 10), "float16", False, True),
        ((784, 128, 10), "float16", True, True),
        ((3, 2048, 2048, 3), "float32", True, True),
    ],
    ids=str,
)
def test_networks_over_a_limit_have_no_tensor_core_layout(monkeypatch, sizes, dtype, scratch_over, sums_over):
    """A wide network whose tile would not fit a thread group's 48 KiB of group-shared memory, or
    whose gradient sums would not fit a thread's registers, has no tensor-core layout: the
    tensor-core backend refuses it, saying so, and its kernels are the tiled ones (the layout
    without tensor cores); each case is over the limit it names, and only that."""
    assert tc.tensor_core_layout(sizes, dtype) is None
    assert kernel_layout(sizes, tensor_cores=True, dtype=dtype).tile is None
    arch = Architecture(sizes, dtype, layer_activations(len(sizes) - 1, HIDDEN_DEFAULT, OUTPUT_DEFAULT))
    refusal = TensorCores().unfit(arch, Platform("cuda", tensor_cores=True, capability=90))
    assert refusal is not None and "does not fit 48 KiB" in refusal
    assert isinstance(kernel_layout(sizes, tensor_cores=False, dtype=dtype).tile, TileLayout)
    unbounded = _unbounded_layout(monkeypatch, sizes, dtype)
    assert (unbounded.scratch > tc.TENSOR_CORE_SCRATCH_FLOATS) == scratch_over
    assert (unbounded.register_sums > tc.MAX_REGISTER_SUMS) == sums_over


@pytest.mark.parametrize("dtype", DTYPES)
def test_narrow_networks_and_tensor_cores_off_never_take_them(dtype):
    """Narrow networks sum per thread whatever the switch; with tensor cores off, every wide network
    takes the tiled layout; a network too wide for any tile has none either way."""
    for tensor_cores in (True, False):
        narrow = kernel_layout((4, 16, 4), tensor_cores=tensor_cores, dtype=dtype)
        assert narrow.thread_sums and narrow.tile is None and not narrow.tensor_cores
        assert kernel_layout((3, 4000, 4000), tensor_cores=tensor_cores, dtype=dtype).tile is None
    for sizes in WIDE:
        assert isinstance(kernel_layout(sizes, tensor_cores=False, dtype=dtype).tile, TileLayout)


def _gradient_cost(rows, cols, row_blocks, col_blocks):
    """gradient_shape's cost model: per step of 8 samples a split A fragment costs 16 instructions,
    a B fragment 8, a block's products 12, over the rounds the warps need; then blocks held."""
    rectangles = math.ceil(row_blocks / rows) * math.ceil(col_blocks / cols)
    rounds = math.ceil(rectangles / tc.WARPS)
    return rounds * (16 * rows + 8 * cols + 12 * rows * cols), rounds * rows * cols


def test_gradient_rectangles_cover_every_block_once_at_least_cost():
    """The warps' rectangles (GradientRectangle: rectangle warp + round * WARPS, row after row)
    cover every 16 x 8 block of a weight gradient exactly once, in no more rounds than needed, and
    no other rectangle of at most 4 x 8 blocks costs less under the documented model."""
    for n_out in (1, 10, 16, 17, 64, 100, 128, 300, 784):
        for n_in in (1, 3, 8, 9, 64, 128, 200, 784):
            shape = tc.gradient_shape(n_out, n_in)
            row_blocks, col_blocks = math.ceil(n_out / 16), math.ceil(n_in / 8)
            assert 1 <= shape.rows <= min(4, row_blocks) and 1 <= shape.cols <= min(8, col_blocks)
            across, down = math.ceil(col_blocks / shape.cols), math.ceil(row_blocks / shape.rows)
            assert (shape.rounds - 1) * tc.WARPS < across * down <= shape.rounds * tc.WARPS
            covered = collections.Counter()
            for rectangle in range(shape.rounds * tc.WARPS):
                if rectangle >= across * down:  # held = false
                    continue
                top, left = (rectangle // across) * shape.rows, (rectangle % across) * shape.cols
                for i in range(top, min(top + shape.rows, row_blocks)):
                    covered.update((i, j) for j in range(left, min(left + shape.cols, col_blocks)))
            assert covered == collections.Counter(np.ndindex(row_blocks, col_blocks)), (n_out, n_in)
            costs = [_gradient_cost(r, c, row_blocks, col_blocks) for r in range(1, 5) for c in range(1, 9)]
            assert _gradient_cost(shape.rows, shape.cols, row_blocks, col_blocks) == min(costs), (n_out, n_in)


# --- hidden activations -------------------------------------------------------------------------


def _equations(jaxpr, primitive):
    """Every equation of ``primitive`` in ``jaxpr``, nested jaxprs (custom_vjp, jit) included."""
    return list(equations(jaxpr, lambda equation: equation.primitive is primitive))


@pytest.mark.parametrize(
    ("sizes", "hidden"), [((13, 21, 10), 21), (DIGITS, 128 + 64), ((40, 10), 0), ((4, 16, 4), 0)], ids=str
)
def test_grad_passes_the_kept_hidden_activations_to_the_backward_kernel(sizes, hidden):
    """Under jax.grad, a wide network's forward kernel also returns its hidden layers' outputs, and the
    backward kernel takes exactly those and runs no forward pass; a narrow network's backward kernel
    recomputes its few activations in registers, and a wide one of one layer has none: both keep
    nothing."""
    assert hidden_width(sizes) == hidden
    params = nn.mlp_init(jax.random.key(25), sizes)
    x = draw_uniform(jax.random.key(26), (33, sizes[0]), "float32")
    jaxpr = jax.make_jaxpr(jax.grad(lambda p, x: jnp.sum(jnp.sin(nn.mlp_apply(p, x)))))(params, x).jaxpr
    (forward,) = _equations(jaxpr, nn_primitives.mlp_forward_p)
    (backward,) = _equations(jaxpr, nn_primitives.mlp_backward_p)
    assert forward.params["keep_hidden"] is backward.params["hidden"] is (hidden > 0)
    if hidden:
        _, kept = forward.outvars
        assert kept.aval.shape == (33, hidden) and backward.invars[1] is kept
    else:
        assert len(forward.outvars) == 1
        assert len(backward.invars) == 2 + 2 * (len(sizes) - 1)  # x, dy, every bias and weight


@pytest.mark.parametrize(
    ("sizes", "dtype", "samples"),
    [
        ((32, 16, 16, 16), "float16", 32),
        ((32, 32, 32, 32, 32, 16), "float16", 32),
        ((32, 64, 64, 16), "float16", 16),
        ((32, 16, 16, 16), "float32", 32),
        ((32, 64, 64, 16), "float32", 32),
    ],
    ids=str,
)
def test_narrow_float16_networks_take_two_block_tiles(sizes, dtype, samples):
    """A float16 network at most NARROW_FLOAT16_WIDTH wide runs tiles of two mma blocks (32
    samples), as float32 networks do; wider float16 ones one block (16): each measured faster."""
    assert tc.tile_samples(sizes, dtype) == samples
    layout = tc.tensor_core_layout(sizes, dtype)
    assert layout is not None and layout.samples == samples
