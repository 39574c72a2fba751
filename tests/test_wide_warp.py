"""A wide network's fused loss and gradient on tensor cores, each warp's tile of 16 samples in
registers through every layer (shaders/nn/wide_warp.slang), in float16 and in float32 at one TF32
pass: which networks take it, its weights' fragments, its reflection on every device kind, and on
a CUDA GPU its results against the float32 reference. Its PTX: tests/test_ptx_launch.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import (
    assert_loss_and_grad_match_reference,
    draw_uniform,
    eikonal_loss,
    mlp_inputs,
    relative_error,
)

import slax
from slax import nn
from slax._compile import kernel_parameters
from slax._device import get_device
from slax.nn import _backends as nn_backends
from slax.nn import _wide_warp_kernels as nn_wide_warp
from slax.nn._architecture import Architecture

ON_TENSOR_CORES = nn_backends.Platform("cuda", True, 90, nn_backends.Float32Products.TF32)
"""An H100's or H200's tensor cores, float32 products at JAX's DEFAULT precision (one TF32 pass)."""
AT_HIGHEST = nn_backends.Platform("cuda", True, 90, nn_backends.Float32Products.FLOAT32)

WIDE = [
    (32, 64, 64, 16),
    (20, 48, 48, 5),
    (40, 64, 64, 64, 64, 3),
    (16, 32, 16, 32, 8),
    (33, 16, 16, 16, 17),
    (3, 48, 48, 1),
]
"""Wide float16 networks the kernel runs: the benchmark's 64-wide shape, widths off multiples of 16
(padded columns: zero weights, f(0) activations, gradients not stored), four 64-wide hidden layers
(the most registers, in thread groups of 8 warps where the others take 4), layers narrower than
their neighbours, and a first layer of 3 inputs whose 3 blocks of outputs' bias gradients fall to
2 warps of a group of 4."""
TOLERANCE = 1e-2
"""Normwise relative error of the loss and gradients against the float32 reference (activations
rounded to half): slax.testing's float16 tolerance. The kernel rounds each sample's gradient at a
layer's output to half where it multiplies and where the bias gradient sums it (2^-11 a term), and
its float sums run in another order than XLA's, so an activation can round the other way."""
TF32_WIDE = [(32, 64, 64, 3), (32, 64, 64, 16), (20, 48, 48, 5), (16, 32, 16, 32, 8), (33, 16, 16, 16, 17)]
"""Float32 networks the kernel runs at one TF32 pass: the image task's, the 64-wide benchmark's,
widths off multiples of 16, layers narrower than their neighbours, odd widths in and out."""
TF32_TOLERANCE = 4e-3
"""Normwise relative error of a float32 network's loss and gradients at one TF32 pass against the
float32 reference at full precision: each operand rounded to TF32 (2^-11 relative), as XLA's
DEFAULT products round them, summed in float32."""


def _ids(sizes):
    return "-".join(map(str, sizes))


@pytest.mark.parametrize(
    ("sizes", "dtype", "platform", "fits"),
    [
        ((32, 64, 64, 16), "float16", ON_TENSOR_CORES, True),
        ((20, 48, 48, 5), "float16", ON_TENSOR_CORES, True),
        ((32, 64, 64, 16), "float32", ON_TENSOR_CORES, True),  # one TF32 pass, JAX's DEFAULT
        ((32, 64, 64, 3), "float32", ON_TENSOR_CORES, True),
        ((32, 64, 64, 16), "float32", AT_HIGHEST, False),  # float32's accuracy: the 3xTF32 tiles
        ((32, 64, 64, 64, 64, 16), "float32", ON_TENSOR_CORES, False),  # tiles and sums past 160 registers
        ((32, 64, 64, 64, 64, 16), "float16", ON_TENSOR_CORES, True),
        (
            (32, 128, 128, 16),
            "float16",
            ON_TENSOR_CORES,
            False,
        ),  # wider than 64: four times the registers a warp
        ((32, 65, 16), "float16", ON_TENSOR_CORES, False),
    ],
)
def test_which_networks_take_the_warp_tiles(sizes, dtype, platform, fits):
    """The tensor_cores backend runs every entry point of a float16 network at most 64 wide in the
    warp tiles (their own kernels, operands and launches), and of a float32 one at one TF32 pass
    whose tiles and sums fit TF32_REGISTERS; every other network in its tiles."""
    arch, backend = Architecture(sizes, dtype), nn_backends.TensorCores()
    assert nn_wide_warp.wide_warp_fits(sizes, dtype, platform.products) == fits
    assert backend.wide_warp(arch, platform) == fits
    for entry in ("mlp_loss_grad", "mlp_backward", "mlp_backward_params", "mlp_forward"):
        spec = backend.kernel(arch, platform, entry)
        assert ("typealias WideNetwork" in (spec.source or "")) == fits
    launch = backend.gradient_launch(arch, platform, "mlp_loss_grad", 1 << 18, 1 << 18)
    if fits:
        tiles = launch.share[1]
        warps = nn_wide_warp.group_warps(sizes, dtype)
        assert launch.threads == 32 * warps and launch.blocks * tiles * 16 * warps == 1 << 18
        summary = backend.summary(arch, platform, "loss_grad")
        products = "TF32" if dtype == "float32" else "float16"
        assert f"a warp per tile of 16 samples in registers through every layer as {products}" in summary


def test_the_descriptor_names_the_layers_and_includes_the_kernels():
    """What Python writes per network is a descriptor: sizes as static consts, the chain of layer
    types, the include; no function bodies."""
    sizes = (20, 48, 48, 5)
    offsets, _ = nn_backends.parameter_offsets(sizes)
    source = nn_wide_warp.wide_warp_source(sizes, ("LeakyReLU", "LeakyReLU", "Identity"))
    assert "static const int MaxBlocks = 3;" in source
    assert source.rstrip().endswith('#include "nn/wide_warp.slang"')
    assert "{" not in source
    forward, backward, total = nn_wide_warp.fragment_offsets(sizes)
    # blocks of 8 columns by 16 terms: 2 x 3 x 2, 2 x 3 x 3, 2 x 1 x 3; the input gradients' after
    # (2 x 2 x 3, 2 x 3 x 3, 2 x 3 x 1)
    assert (forward, backward) == ([0, 12, 30], [36, 48, 66]) and total == 72
    # 4 warps a thread group (group_warps): the 6 strips of 8 inputs take 2 a warp, of 1 block out
    assert f"WideLayer<48, 5, {offsets[2]}, 30, 66, 2, Identity>" in source
    assert '#include "nn/wide_warp_half.slang"' in source


def test_the_tf32_descriptor_marks_the_first_and_hidden_layers():
    """A float32 network's descriptor includes the TF32 format; its blocks of 8 terms take twice the
    fragments of 16 halves; its first layer reads its input again (Reloads) and its hidden layers
    round their outputs (Hidden); its groups are 4 warps."""
    sizes = (20, 48, 48, 5)
    offsets, _ = nn_backends.parameter_offsets(sizes)
    source = nn_wide_warp.wide_warp_source(sizes, ("ReLU", "ReLU", "Identity"), "float32")
    assert '#include "nn/wide_warp_tf32.slang"' in source and "{" not in source
    assert "static const int GroupThreads = 128;" in source
    forward, backward, total = nn_wide_warp.fragment_offsets(sizes, "float32")
    # blocks of 8 columns by 8 terms: 6 x 4, 6 x 6, 2 x 6; the input gradients' 4 x 6, 6 x 6, 6 x 2
    assert (forward, backward) == ([0, 24, 60], [72, 96, 132]) and total == 144
    assert "WideLayer<20, 48, 0, 0, 72, 3, ReLU, true, true>" in source
    assert "WideLayer<48, 48, 1008, 24, 96, 6, ReLU, false, true>" in source
    assert f"WideLayer<48, 5, {offsets[2]}, 60, 132, 2, Identity, false, false>" in source


@pytest.mark.one_device_kind  # launches and sources: no kernel runs
@pytest.mark.parametrize(
    ("sizes", "warps"),
    [
        ((32, 64, 64, 3), 4),  # the image task's network: its sums take GROUP_SUM_REGISTERS
        ((32, 32, 32, 16), 4),
        ((32, 64, 64, 64, 16), 8),  # three 64-wide hidden layers' sums would spill at 4 warps
        ((32, 16, 16, 16, 16, 16, 16, 16, 16, 16), 8),
    ],
    ids=lambda value: _ids(value) if isinstance(value, tuple) else f"{value}warps",
)
def test_thread_groups_of_four_warps_where_the_sums_fit(sizes, warps):
    """Networks whose gradients' sums a thread keeps in at most GROUP_SUM_REGISTERS registers at 4
    warps a group run groups of 4 (two a multiprocessor, one computing while the other waits at a
    barrier), the others groups of 8; the descriptor, the launches and the sums' strips agree."""
    assert nn_wide_warp.group_warps(sizes) == warps
    assert (nn_wide_warp._sum_registers(sizes, 4) <= nn_wide_warp.GROUP_SUM_REGISTERS) == (warps == 4)
    source = nn_wide_warp.wide_warp_source(sizes, ("ReLU",) * (len(sizes) - 2) + ("Identity",))
    assert f"static const int GroupThreads = {32 * warps};" in source
    assert nn_wide_warp.warp_tile_threads(sizes, 1000) == -(-1000 // (16 * warps)) * 32 * warps
    assert nn_wide_warp.warp_tile_threads(sizes, 1000, tiles=2) == -(-1000 // (32 * warps)) * 32 * warps
    assert f"static const int ForwardTiles = {nn_wide_warp.FORWARD_TILES['float16']};" in source
    arch, backend = Architecture(sizes, "float16"), nn_backends.TensorCores()
    launch = backend.gradient_launch(arch, ON_TENSOR_CORES, "mlp_backward", 3 << 16, 1 << 16)
    assert launch.threads == 32 * warps
    assert launch.blocks * launch.share[1] * 16 * warps >= 1 << 16
    first_strips = -(-2 * (-(-sizes[0] // 16)) // warps)  # the first layer's strips a warp keeps
    blocks_out = -(-sizes[1] // 16)
    assert f"WideLayer<{sizes[0]}, {sizes[1]}, 0, 0, " in source
    assert f", {first_strips * blocks_out}, ReLU>" in source


@pytest.mark.one_device_kind  # the fragments are JAX arrays: no kernel runs
@pytest.mark.parametrize("shape", [(16, 32), (20, 48), (5, 48), (48, 5)], ids=_ids)
def test_fragments_are_mma_b_fragments_of_halves(shape):
    """Each block of ``_b_fragments(M)`` (M: N x K) holds, for lane 4g + t, the halves of B = M^T at
    rows 2t, 2t + 1 (first word) and 2t + 8, 2t + 9 (second), column g, of its 16 x 8 block (low
    half first), zeros past the edges; blocks of 8 columns of B, then of 16 rows; N padded to 16."""
    m = np.asarray(draw_uniform(jax.random.key(shape[0] * 100 + shape[1]), shape, "float16"))
    words = np.asarray(nn_wide_warp._b_fragments(jnp.asarray(m)))
    n_blocks, k_blocks = 2 * -(-shape[0] // 16), -(-shape[1] // 16)
    assert words.shape == (n_blocks * k_blocks * 64,)
    padded = np.zeros((8 * n_blocks, 16 * k_blocks), np.float16)
    padded[: shape[0], : shape[1]] = m
    halves = words.reshape(n_blocks, k_blocks, 32, 2).astype("<u4").view(np.float16)
    halves = halves.reshape(n_blocks, k_blocks, 32, 2, 2)
    for j in range(n_blocks):
        for s in range(k_blocks):
            for lane in range(32):
                g, t = divmod(lane, 4)
                row = padded[8 * j + g, 16 * s :]
                want = [[row[2 * t], row[2 * t + 1]], [row[2 * t + 8], row[2 * t + 9]]]
                np.testing.assert_array_equal(halves[j, s, lane], np.asarray(want, np.float16))


@pytest.mark.one_device_kind  # JAX arithmetic: no kernel runs
def test_tf32_rounding_is_to_nearest_and_keeps_nans():
    """tf32_rounded (the weights' rounding; the kernels round activations to the same values with
    cvt.rna.tf32.f32) clears the low 13 mantissa bits, to nearest with ties away from zero, keeps
    infinities, and keeps NaN a NaN: the GPU's NaN (0x7fffffff) and its negation (0xffffffff) plus
    half a TF32 unit would wrap to -0 and +0, silently finite."""
    bits = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0x7F800000, 0xFF800000, 0x3F801000, 0x3F800FFF],
                    np.uint32)  # fmt: skip
    rounded = np.asarray(nn_wide_warp.tf32_rounded(jnp.asarray(bits.view(np.float32))))
    assert np.isnan(rounded[:3]).all()
    assert rounded[3] == np.inf and rounded[4] == -np.inf
    assert rounded.view(np.uint32)[5:].tolist() == [0x3F802000, 0x3F800000]  # a tie away, below it down
    values = np.asarray(draw_uniform(jax.random.key(3), (1000,), "float32")) * 1e3
    rounded = np.asarray(nn_wide_warp.tf32_rounded(jnp.asarray(values)))
    assert not np.any(rounded.view(np.uint32) & 0x1FFF)
    assert np.all(np.abs(rounded - values) <= np.abs(values) * 2.0**-11)


@pytest.mark.one_device_kind  # the fragments are JAX arrays: no kernel runs
@pytest.mark.parametrize("shape", [(16, 32), (20, 48), (5, 48), (48, 5)], ids=_ids)
def test_tf32_fragments_take_a_blocks_terms_in_the_tiles_order(shape):
    """Each block of ``_tf32_b_fragments(M)`` (M: N x K) holds, for lane 4g + t, M[g][2t] and
    M[g][2t + 1] of its 8 x 8 block rounded to TF32 (to nearest, low 13 bits clear): B = M^T's
    terms t and t + 4 where a tile's C fragment, read as an A fragment, holds columns 2t and
    2t + 1; blocks of 8 columns of B, then of 8 rows; N and K padded to 16."""
    m = np.asarray(draw_uniform(jax.random.key(shape[0] * 10 + shape[1]), shape, "float32"))
    words = np.asarray(nn_wide_warp._tf32_b_fragments(jnp.asarray(m)))
    n_blocks, k_blocks = 2 * -(-shape[0] // 16), 2 * -(-shape[1] // 16)
    assert words.shape == (n_blocks * k_blocks * 64,) and not np.any(words & 0x1FFF)
    values = words.view(np.float32).reshape(n_blocks, k_blocks, 32, 2)
    padded = np.zeros((8 * n_blocks, 8 * k_blocks), np.float32)
    padded[: shape[0], : shape[1]] = m
    for j in range(n_blocks):
        for s in range(k_blocks):
            for lane in range(32):
                g, t = divmod(lane, 4)
                want = padded[8 * j + g, 8 * s + 2 * t : 8 * s + 2 * t + 2]
                np.testing.assert_allclose(values[j, s, lane], want, rtol=2.0**-11, atol=0)


@pytest.mark.one_device_kind  # numpy: no kernel runs
def test_the_tf32_tiles_c_fragments_are_the_next_layers_a_fragments():
    """The TF32 format's layout, lane by lane in numpy: a tile's C fragments of h (lane (g, t):
    rows g, g + 8, columns 2t, 2t + 1 of each block of 8), passed to mma.sync's A operand as
    (x, z, y, w), times the weights' B fragments (_tf32_b_fragments), give h W^T as C fragments,
    the next layer's input with no exchange between lanes (the input gradient's dz W takes W^T's
    fragments the same way)."""
    rng = np.random.default_rng(5)
    n_in, n_out = 24, 40
    h = rng.standard_normal((16, n_in)).astype(np.float32)
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    tf32 = lambda v: np.asarray(nn_wide_warp.tf32_rounded(jnp.asarray(v, jnp.float32)))  # noqa: E731
    in_blocks, out_blocks = 2 * -(-n_in // 16), 2 * -(-n_out // 16)
    hp = np.zeros((16, 8 * in_blocks), np.float32)
    hp[:, :n_in] = tf32(h)
    fragments = np.asarray(nn_wide_warp._tf32_b_fragments(jnp.asarray(w))).view(np.float32)
    fragments = fragments.reshape(out_blocks, in_blocks, 32, 2)

    def c_fragment(matrix, block, lane):  # rows g, g + 8; columns 2t, 2t + 1 of the block
        g, t = divmod(lane, 4)
        c = 8 * block + 2 * t
        return np.array([matrix[g, c], matrix[g, c + 1], matrix[g + 8, c], matrix[g + 8, c + 1]])

    def mma(c, a, b):  # m16n8k8 from the lanes' fragments: A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]
        A, B = np.zeros((16, 8)), np.zeros((8, 8))
        for lane in range(32):
            g, t = divmod(lane, 4)
            A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4] = a[lane]
            B[t, g], B[t + 4, g] = b[lane]
        product = A @ B
        return [c[lane] + c_fragment(product, 0, lane) for lane in range(32)]

    for j in range(out_blocks):
        z = [np.zeros(4) for _ in range(32)]
        for k in range(in_blocks):
            a = [c_fragment(hp, k, lane)[[0, 2, 1, 3]] for lane in range(32)]
            z = mma(z, a, fragments[j, k])
        want = hp @ np.pad(tf32(w), ((0, 8 * out_blocks - n_out), (0, 8 * in_blocks - n_in))).T
        for lane in range(32):
            np.testing.assert_allclose(z[lane], c_fragment(want, j, lane), rtol=1e-5, atol=1e-5)


def test_every_device_kind_reflects_the_kernel(device_kind):
    """On the PTX route slax reads a kernel's parameters from SlangPy's reflection on
    ``slax.config.reflection_device`` (SlangPy's CPU device where no Vulkan driver is): the kernel
    compiles for every target, its tensor-core instructions NaN elsewhere."""
    arch = Architecture((20, 48, 48, 5), "float16")
    device = get_device(slax.DeviceKind(device_kind))
    for entry, pointers in [
        ("mlp_backward", ["x", "dy", "dx_scales", "params", "fragments", "partials", "dx"]),
        ("mlp_forward", ["x", "params", "fragments", "y"]),
        ("mlp_input_gradient", ["x", "dy", "dx_scales", "params", "fragments", "dx"]),
    ]:
        parameters = kernel_parameters(device, nn_backends.wide_warp_kernel(arch, entry))
        assert [name for name, _ in parameters.pointers] == pointers, entry
    parameters = kernel_parameters(device, nn_backends.wide_warp_kernel(arch, "mlp_loss_grad"))
    assert [name for name, _ in parameters.pointers] == ["x", "target", "params", "fragments", "partials"]
    scalars = ["count", "samples_per_group", "blocks_per_group", "tiles_per_block"]
    assert [name for name, _ in parameters.scalars] == [*scalars, "loss_scale"]
    parameters = kernel_parameters(device, nn_backends.wide_warp_kernel(arch, "mlp_hessian_sums"))
    assert [name for name, _ in parameters.pointers] == [
        "x",
        "direction",
        "dy",
        "params",
        "fragments",
        "partials",
    ]
    assert [name for name, _ in parameters.scalars] == scalars


def _at_default_precision():
    """JAX's DEFAULT matmul precision, at which a float32 network's products are one TF32 pass (the
    suite runs at HIGHEST: tests/conftest.py)."""
    return jax.default_matmul_precision("default")


def _wide_cases(count=None):
    """(sizes, dtype, activation) of the float16 networks and, at one TF32 pass, the float32 ones."""
    halves = [(sizes, "float16", "leaky_relu") for sizes in WIDE[:count]]
    activations = ["relu", "leaky_relu", "sigmoid", "tanh", "relu"]
    floats = [(sizes, "float32", a) for sizes, a in zip(TF32_WIDE[:count], activations, strict=False)]
    return halves + floats


def _case_ids(case):
    return f"{_ids(case[0])}-{case[1]}-{case[2]}"


@pytest.mark.parametrize("case", _wide_cases(), ids=_case_ids)
def test_warp_tiles_match_the_reference(case, device_kind, fused_kernels):
    """On a CUDA GPU, the loss and gradients of two vmapped groups of 1000 samples, of one of 333
    and of one of 5 (thread groups of 64 or 128 samples, rows past a group's end repeating its last
    sample and counting for nothing) agree with the float32 reference within TOLERANCE (float16)
    or TF32_TOLERANCE (float32, at JAX's DEFAULT precision), and are the same bits on a second
    run."""
    if device_kind != "cuda":
        pytest.skip("JAX on a CUDA GPU runs the warp tiles; elsewhere the tiled kernels run")
    sizes, dtype, activation = case
    params = nn.mlp_init(jax.random.key(sum(sizes)), sizes, dtype, activation=activation)
    rows = jnp.zeros((1000, sizes[0]), dtype)
    products = "TF32" if dtype == "float32" else "float16"
    tolerance = TF32_TOLERANCE if dtype == "float32" else TOLERANCE
    with _at_default_precision():
        said = nn.describe(params, rows)["mlp_loss_and_grad"]
        assert f"a warp per tile of 16 samples in registers through every layer as {products}" in said
        assert_loss_and_grad_match_reference(params, sum(sizes), tolerance)


@pytest.mark.parametrize("case", _wide_cases(4), ids=_case_ids)
def test_the_squared_errors_gradient_on_the_warp_tiles_matches_the_reference(case, device_kind):
    """On a CUDA GPU, ``jax.value_and_grad`` of ``mlp_squared_error`` in the parameters and x, one
    launch of ``mlp_loss_grad_input`` per call (the forward pass, the loss, its gradients and dx),
    vmapped as test_warp_tiles_match_the_reference's groups: within TOLERANCE (float16) or
    TF32_TOLERANCE (float32, at JAX's DEFAULT precision) of the float32 reference, dx included, and
    the same bits on a second run."""
    if device_kind != "cuda":
        pytest.skip("JAX on a CUDA GPU runs the warp tiles; elsewhere the backends' forward and backward")
    sizes, dtype, activation = case
    params = nn.mlp_init(jax.random.key(sum(sizes)), sizes, dtype, activation=activation)
    tolerance = TF32_TOLERANCE if dtype == "float32" else TOLERANCE
    with _at_default_precision():
        assert_loss_and_grad_match_reference(params, sum(sizes) + 1, tolerance, input_gradient=True)


def test_tf32_warp_tiles_carry_nans_as_xlas_products_do(device_kind):
    """On a CUDA GPU at JAX's DEFAULT precision, a float32 tanh network on the TF32 warp tiles: a
    sample of NaN inputs (the GPU's own NaN, which the tiles' TF32 rounding must not turn into
    zero) gives NaN outputs and the other samples their reference values; its NaN reaches the
    weight gradient, as through XLA's products."""
    if device_kind != "cuda":
        pytest.skip("JAX on a CUDA GPU runs the warp tiles; elsewhere the tiled kernels run")
    sizes = (32, 64, 64, 3)
    params = nn.mlp_init(jax.random.key(4), sizes, "float32", activation="tanh")
    x = draw_uniform(jax.random.key(5), (100, sizes[0]), "float32")
    nan_row = x.at[7].set(jnp.sqrt(x[7] - 2.0))  # the GPU's own NaN, 0x7fffffff
    with _at_default_precision():
        y = jax.jit(nn.mlp_apply)(params, nan_row)
        assert jnp.isnan(y[7]).all() and not jnp.isnan(jnp.delete(y, 7, axis=0)).any()
        want = nn.mlp_apply_reference(params, jnp.delete(x, 7, axis=0))
        assert relative_error(jnp.delete(y, 7, axis=0), want) < TF32_TOLERANCE
        weights = jax.jit(jax.grad(lambda p, x: nn.mlp_apply(p, x).sum()))(params, nan_row)
        assert all(jnp.isnan(layer["weight"]).any() for layer in weights)


@pytest.mark.parametrize("case", _wide_cases(4), ids=_case_ids)
def test_mlp_apply_and_its_gradients_on_the_warp_tiles_match_the_reference(case, device_kind, lowered):
    """On a CUDA GPU, mlp_apply and jax.grad of a loss of it run the warp tiles' kernels: the forward
    pass (mlp_forward), the gradient in the parameters (mlp_backward_params), in the parameters and
    x (mlp_backward) and in x alone (mlp_input_gradient, no sums), each within TOLERANCE (float32:
    TF32_TOLERANCE) of the float32 reference for 1000 samples of a mean loss (cotangents of 1e-3,
    where the float16 kernels' half gradients need the power-of-two scaling), per-example gradients
    vmapped over two groups of 333 too; the same bits on a second run."""
    if device_kind != "cuda":
        pytest.skip("JAX on a CUDA GPU runs the warp tiles; elsewhere the tiled kernels run")
    from _training import cast

    with _at_default_precision():
        sizes, dtype, activation = case
        tolerance = TF32_TOLERANCE if dtype == "float32" else TOLERANCE
        params = nn.mlp_init(jax.random.key(sum(sizes) + 1), sizes, dtype, activation=activation)
        x = mlp_inputs(params, jax.random.key(8), 1000, dtype)
        reference = functools.partial(nn.mlp_apply_reference, storage_dtype=dtype)

        def loss(apply):
            return lambda params, x: jnp.mean(jnp.sin(1.3 * apply(params, x).astype(jnp.float32)))

        def warp_tiles():
            return sorted({key[1] for key in lowered if key[2] == "warp tiles"})

        lowered.clear()
        got = jax.jit(nn.mlp_apply)(params, x)
        assert warp_tiles() == ["mlp_forward"]
        assert relative_error(got, reference(*cast((params, x), jnp.float32))) < tolerance
        for argnums, entry in [
            (0, "mlp_backward_params"),
            ((0, 1), "mlp_backward"),
            (1, "mlp_input_gradient"),
        ]:
            lowered.clear()
            gradient = jax.jit(jax.grad(loss(nn.mlp_apply), argnums))
            got, again = gradient(params, x), gradient(params, x)
            assert warp_tiles() == sorted(["mlp_forward", entry])
            want = jax.grad(loss(reference), argnums)(*cast((params, x), jnp.float32))
            for leaf, repeat, wanted in zip(
                jax.tree.leaves(got), jax.tree.leaves(again), jax.tree.leaves(want), strict=True
            ):
                assert np.array_equal(leaf, repeat), f"{entry}: not deterministic"
                assert relative_error(leaf, wanted) < tolerance, entry
        grouped = jax.jit(jax.vmap(jax.grad(loss(nn.mlp_apply), (0, 1)), (None, 0)))(
            params, x[:666].reshape(2, 333, -1)
        )
        for k in range(2):
            want = jax.grad(loss(reference), (0, 1))(*cast((params, x[333 * k : 333 * (k + 1)]), jnp.float32))
            for leaf, wanted in zip(jax.tree.leaves(grouped), jax.tree.leaves(want), strict=True):
                assert relative_error(leaf[k], wanted) < tolerance


@pytest.mark.one_device_kind  # JAX arithmetic: no kernel runs
def test_power_of_two_normalisation_only_scales_up():
    """Each group below 0.5 is raised into [0.5, 1) by a power of two, exactly (scaled back, the same
    bits); a group at or past 0.5 stays as it is, since scaling it down would push its small values
    into half's subnormals (a dy of 1000 beside one of 1e-3); zeros stay zeros."""
    values = jnp.array([[1000.0, 1.234e-3], [1e-6, -3e-7], [0.0, 0.0]], jnp.float16)
    scaled, exponent = nn_backends.power_of_two_normalised(values, 1)
    assert exponent.tolist() == [0, -19, 0]
    assert np.array_equal(scaled[0], values[0]) and not jnp.any(scaled[2])
    assert 0.5 <= float(jnp.max(jnp.abs(scaled[1]))) < 1.0
    assert np.array_equal(nn_backends.scaled_back(scaled, exponent), values)
    # Random groups from 1e-9 to 1e4, half's subnormals among them: the scaled values are ldexp's
    # of the values, bit for bit, and scale back to them.
    magnitudes = 10.0 ** jax.random.uniform(jax.random.key(0), (40, 1, 1), minval=-9, maxval=4)
    values = (jax.random.normal(jax.random.key(1), (40, 30, 3)) * magnitudes).astype(jnp.float16)
    for group_ndim in (0, 1, 2):
        scaled, exponent = nn_backends.power_of_two_normalised(values, group_ndim)
        shaped = exponent.reshape(exponent.shape + (1,) * (3 - group_ndim))
        assert np.array_equal(scaled, jnp.ldexp(values.astype(jnp.float32), -shaped).astype(jnp.float16))
        assert np.array_equal(nn_backends.scaled_back(scaled, exponent), values)


@pytest.mark.one_device_kind  # the kernels are replaced by the twin: no kernel runs
@pytest.mark.quick_sample
@pytest.mark.parametrize(("group_ndim", "param_output"), [(0, True), (1, True), (1, False)])
def test_the_backward_kernels_take_dy_scaled_into_halfs_normal_range(monkeypatch, group_ndim, param_output):
    """The warp tiles' backward scales each group's dy by a power of two (the largest into [0.5,
    1)) before its kernels, which round each layer's output gradient to half, and scales their
    results back (dx in the kernels, by the scales they are given): cotangents as small as a mean
    loss's over 2^18 samples (1e-6, below half's normal range) go in and come out exactly. The
    kernels are replaced by the twin, in float32 on what they are given, dx times its scales."""
    from slax.nn._params import flat_layers
    from slax.nn._reference import backward_twin

    arch = Architecture((3, 32, 32, 1), "float16")
    flat = flat_layers(nn.mlp_init(jax.random.key(2), arch.sizes, "float16"))
    keys = jax.random.split(jax.random.key(4), 2)
    x = draw_uniform(keys[0], (2, 100, 3), "float16")
    dy = (draw_uniform(keys[1], (2, 100, 1), "float32") * jnp.array([1e-6, 1e-3])[:, None, None]).astype(
        jnp.float16
    )
    if group_ndim == 0:
        x, dy = x[0], dy[0]
    peaks = []

    def twin(x, dy, group_ndim):
        return backward_twin(x, dy, flat, arch.dtype, arch.activations, group_ndim, True)

    def seen(dy, group_ndim):
        peaks.append(jnp.abs(dy.astype(jnp.float32)).max(tuple(range(group_ndim, dy.ndim))))

    def scaled(dx, scales, scaled_ndim):  # the kernels' dx: a scale per group (or sample)
        shape = dx.shape[:scaled_ndim] + (1,) * (dx.ndim - scaled_ndim)
        return (dx.astype(jnp.float32) * scales.reshape(shape)).astype(dx.dtype)

    def gradient(self, arch, platform, entry, data, params, group_ndim, *rest):
        assert entry == "mlp_backward"
        x, dy, scales = data
        seen(dy, group_ndim)
        dx, *sums = twin(x, dy, group_ndim)
        return [jnp.zeros(x.shape[:group_ndim]), scaled(dx, scales, group_ndim), *sums]

    def warp_tiles(self, arch, platform, entry, data, params, width, routes):
        assert entry == "mlp_input_gradient"
        x, dy, scales = data
        seen(dy, group_ndim)
        return scaled(twin(x, dy, 0)[0], scales, x.ndim - 1)

    monkeypatch.setattr(nn_backends.TensorCores, "gradient", gradient)
    monkeypatch.setattr(nn_backends.TensorCores, "_warp_tiles", warp_tiles)
    got = nn_backends.TensorCores().backward(
        arch, ON_TENSOR_CORES, [x, dy], flat, group_ndim, True, param_output, None
    )
    want = twin(x, dy, group_ndim)
    assert len(got) == (len(want) if param_output else 1)
    for leaf, wanted in zip(got, want):  # dx: halves, which the unscaled twin rounds in their subnormals
        tolerance = 1e-6 if wanted.dtype == jnp.float32 else 2e-3
        assert leaf.dtype == wanted.dtype and relative_error(leaf, wanted) < tolerance
    assert jnp.all((peaks[0] >= 0.5) & (peaks[0] < 1.0)), peaks


HESSIAN = [(3, 64, 64, 64, 1), (20, 48, 48, 5), (16, 32, 16, 32, 8)]
"""Networks whose eikonal gradient takes the Hessian kernel: the signed distance field's, widths off
multiples of 16 (with ReLU hidden layers), and layers narrower than their neighbours."""


WARP_TILES, TILES = "the warp tiles' Hessian kernel", "the tensor_cores kernels' Hessian kernel"


@pytest.mark.parametrize(
    ("sizes", "dtype", "activation", "platform", "runs"),
    [
        ((3, 64, 64, 64, 1), "float16", "leaky_relu", ON_TENSOR_CORES, WARP_TILES),
        ((20, 48, 48, 5), "float16", "relu", ON_TENSOR_CORES, WARP_TILES),
        ((3, 64, 64, 64, 1), "float16", "tanh", ON_TENSOR_CORES, None),  # its second derivative
        ((3, 64, 64, 64, 1), "float32", "leaky_relu", ON_TENSOR_CORES, TILES),  # past TF32_REGISTERS
        ((32, 64, 64, 1), "float32", "relu", ON_TENSOR_CORES, WARP_TILES),  # one TF32 pass
        ((32, 64, 64, 1), "float32", "relu", AT_HIGHEST, TILES),
        ((3, 128, 128, 1), "float16", "leaky_relu", ON_TENSOR_CORES, TILES),  # wider than the warp tiles
        ((3, 128, 128, 1), "float32", "tanh", ON_TENSOR_CORES, None),
        ((3, 64, 64, 64, 1), "float16", "leaky_relu", nn_backends.Platform("cuda", False, 90), None),
        ((3, 64, 64, 64, 1), "float16", "leaky_relu", nn_backends.Platform("cpu"), None),
    ],
)
def test_which_networks_take_the_hessian_kernel(sizes, dtype, activation, platform, runs):
    """tensor_cores runs the Hessian-vector product's parameters' part (an eikonal loss's) on the
    warp tiles for float16 networks at most 64 wide of activations whose second derivative is zero,
    on its tiles for the others of such activations; elsewhere it has none (the twin runs);
    describe says which."""
    activations = (activation,) * (len(sizes) - 2) + ("none",)
    arch, backend = Architecture(sizes, dtype, activations), nn_backends.TensorCores()
    said = backend.second_order_summary(arch, platform)
    if runs is None:
        assert "Hessian kernel" not in said, said
        assert backend.hessian_sums(arch, platform, None, None, None, [], 0, None) is None
    else:
        assert runs in said, said


@pytest.mark.one_device_kind  # the kernel is replaced by the twin: no kernel runs
@pytest.mark.parametrize(
    ("family", "platform"),
    [(nn_backends.TensorCores, ON_TENSOR_CORES), (nn_backends.Tiled, nn_backends.Platform("cpu"))],
    ids=["warp-tiles", "tiled"],
)
@pytest.mark.parametrize("group_ndim", [0, 1])
def test_the_hessian_kernel_takes_directions_scaled_into_halfs_normal_range(
    monkeypatch, group_ndim, family, platform
):
    """hessian_sums of a float16 network (the warp tiles', and the tiled family's, whose tiles also
    hold halves) scales each group's direction and dy by powers of two (the largest into [0.5, 1))
    before the kernel, which rounds each layer's tangent to half, and scales its sums back:
    directions as tiny as an eikonal term's at 2^18 samples (about 1e-6, below half's normal range)
    go in and come out exactly. The kernel is replaced by the twin, in float32 on what it is given;
    the bias parts are zero."""
    from slax.nn._params import flat_layers
    from slax.nn._reference import backward_tangent_twin

    arch = Architecture((3, 32, 32, 1), "float16")
    flat = flat_layers(nn.mlp_init(jax.random.key(2), arch.sizes, "float16"))
    keys = jax.random.split(jax.random.key(3), 2)
    x = draw_uniform(keys[0], (2, 100, 3), "float16")
    tiny = draw_uniform(keys[1], (2, 100, 3), "float32") * jnp.array([1e-6, 1e-3])[:, None, None]
    direction = tiny.astype(jnp.float16)
    dy = jnp.full((2, 100, 1), 2.0**-20, jnp.float16)
    if group_ndim == 0:  # one group of the first group's tiny directions
        x, direction, dy = x[0], direction[0], dy[0]
    peaks = []

    def twin(x, direction, dy, group_ndim):
        args = (arch.dtype, arch.activations, group_ndim, False, True)
        return backward_tangent_twin(x, dy, direction, None, flat, *args)

    def kernel(self, arch, platform, entry, data, params, group_ndim, *rest):
        x, direction, dy = data
        sample_axes = tuple(range(group_ndim, direction.ndim))
        peaks.append(jnp.stack([jnp.abs(direction).max(sample_axes), jnp.abs(dy).max(sample_axes)]))
        assert entry == "mlp_hessian_sums" and direction.dtype == dy.dtype == jnp.float16
        return [jnp.zeros(x.shape[:group_ndim]), *twin(x, direction, dy, group_ndim)]

    monkeypatch.setattr(family, "gradient", kernel)
    got = family().hessian_sums(arch, platform, x, direction, dy, flat, group_ndim, None)
    want = twin(x, direction, dy, group_ndim)
    for k, (leaf, wanted) in enumerate(zip(got, want, strict=True)):
        if k % 2 == 0:
            assert leaf.shape == wanted.shape and not jnp.any(leaf)
        else:
            assert relative_error(leaf, wanted) < 1e-6 and float(jnp.max(jnp.abs(wanted))) < 1e-3
    assert jnp.all((peaks[0] >= 0.5) & (peaks[0] < 1.0)), peaks


@pytest.mark.parametrize(
    ("sizes", "dtype"),
    [
        *((sizes, "float16") for sizes in HESSIAN),
        ((32, 64, 64, 1), "float32"),
        *((s, "float32") for s in HESSIAN[1:]),
    ],
    ids=lambda value: _ids(value) if isinstance(value, tuple) else value,
)
def test_the_hessian_kernel_matches_the_reference(sizes, dtype, device_kind, monkeypatch):
    """On a CUDA GPU, as "auto" chooses: the gradient in the parameters of an eikonal loss runs the
    warp tiles' Hessian kernel (mlp_hessian_sums) for what the second derivative adds, and agrees
    with the float32 reference within TOLERANCE (float32 at one TF32 pass: TF32_TOLERANCE), for
    1000 samples and vmapped over two groups of 333 (each group's gradient its own); the same bits
    on a second run. A tanh network (its second derivative not zero) takes the twin instead."""
    if device_kind != "cuda":
        pytest.skip("JAX on a CUDA GPU runs the warp tiles; elsewhere the twin runs")
    from _training import cast

    with _at_default_precision():
        tolerance = TF32_TOLERANCE if dtype == "float32" else TOLERANCE

        entries = []
        make = nn_backends.wide_warp_kernel
        monkeypatch.setattr(
            nn_backends, "wide_warp_kernel", lambda arch, entry: entries.append(entry) or make(arch, entry)
        )
        activation = "relu" if sizes in (HESSIAN[1], (32, 64, 64, 1)) else "leaky_relu"
        params = nn.mlp_init(jax.random.key(sum(sizes)), sizes, dtype, activation=activation)
        x = mlp_inputs(params, jax.random.key(7), 1000, dtype)
        reference = functools.partial(nn.mlp_apply_reference, storage_dtype=dtype)
        gradient = jax.jit(jax.grad(eikonal_loss(nn.mlp_apply)))
        got, again = gradient(params, x), gradient(params, x)
        want = jax.grad(eikonal_loss(reference))(*cast((params, x), jnp.float32))
        for leaf, repeat, wanted in zip(
            jax.tree.leaves(got), jax.tree.leaves(again), jax.tree.leaves(want), strict=True
        ):
            assert np.array_equal(leaf, repeat), "the sums are not deterministic"
            assert relative_error(leaf, wanted) < tolerance
        assert "mlp_hessian_sums" in entries
        grouped = jax.jit(jax.vmap(jax.grad(eikonal_loss(nn.mlp_apply)), (None, 0)))(
            params, x[:666].reshape(2, 333, -1)
        )
        for k in range(2):
            want = jax.grad(eikonal_loss(reference))(*cast((params, x[333 * k : 333 * (k + 1)]), jnp.float32))
            for leaf, wanted in zip(jax.tree.leaves(grouped), jax.tree.leaves(want), strict=True):
                assert relative_error(leaf[k], wanted) < tolerance
        entries.clear()
        smooth = nn.mlp_init(jax.random.key(1), sizes, dtype, activation="tanh")
        got = jax.jit(jax.grad(eikonal_loss(nn.mlp_apply)))(smooth, x)
        want = jax.grad(eikonal_loss(reference))(*cast((smooth, x), jnp.float32))
        for leaf, wanted in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert relative_error(leaf, wanted) < tolerance
        assert "mlp_hessian_sums" not in entries
