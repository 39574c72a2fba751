"""A wide float16 network's fused loss and gradient on tensor cores, each warp's tile of 16 samples in
registers through every layer (shaders/nn/wide_warp.slang): which networks take it, its weights'
fragments, its reflection on every device kind, and on a CUDA GPU its results against the float32
reference. Its PTX: tests/test_ptx_launch.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import assert_float16_loss_and_grad_match_reference, draw_uniform

import slax
from slax import nn
from slax._compile import kernel_parameters
from slax._device import get_device
from slax.nn import _backends as nn_backends
from slax.nn import _wide_warp_kernels as nn_wide_warp
from slax.nn._architecture import Architecture

ON_TENSOR_CORES = nn_backends.Platform("cuda", tensor_cores=True, capability=90)

WIDE = [(32, 64, 64, 16), (20, 48, 48, 5), (40, 64, 64, 64, 64, 3), (16, 32, 16, 32, 8), (33, 16, 16, 16, 17)]
"""Wide float16 networks the kernel runs: the benchmark's 64-wide shape, widths off multiples of 16
(padded columns: zero weights, f(0) activations, gradients not stored), four 64-wide hidden layers
(the most registers), and layers narrower than their neighbours."""
TOLERANCE = 1e-2
"""Normwise relative error of the loss and gradients against the float32 reference (activations
rounded to half): slax.testing's float16 tolerance. The kernel rounds each sample's gradient at a
layer's output to half where it multiplies and where the bias gradient sums it (2^-11 a term), and
its float sums run in another order than XLA's, so an activation can round the other way."""


def _ids(sizes):
    return "-".join(map(str, sizes))


@pytest.mark.parametrize(
    ("sizes", "dtype", "fits"),
    [
        ((32, 64, 64, 16), "float16", True),
        ((20, 48, 48, 5), "float16", True),
        ((32, 64, 64, 16), "float32", False),  # float32 stays on the 3xTF32 tiles
        ((32, 128, 128, 16), "float16", False),  # wider than 64: four times the registers a warp
        ((32, 65, 16), "float16", False),
    ],
)
def test_which_networks_take_the_warp_tiles(sizes, dtype, fits):
    """The tensor_cores backend runs a float16 network at most 64 wide's loss and gradient in the
    warp tiles (its own kernel, operands and launch), and every other entry point in its tiles."""
    arch, backend = Architecture(sizes, dtype), nn_backends.TensorCores()
    assert nn_wide_warp.wide_warp_fits(sizes, dtype) == fits
    assert backend.wide_warp(arch) == fits
    spec = backend.kernel(arch, ON_TENSOR_CORES, "mlp_loss_grad")
    assert ("typealias WideNetwork" in (spec.source or "")) == fits
    assert "WideNetwork" not in (backend.kernel(arch, ON_TENSOR_CORES, "mlp_backward").source or "")
    launch = backend.gradient_launch(arch, ON_TENSOR_CORES, "mlp_loss_grad", 1 << 18, 1 << 18)
    if fits:
        tiles = launch.share[1]
        assert launch.threads == 256 and launch.blocks * tiles * nn_wide_warp.TILE_SAMPLES == 1 << 18
        summary = backend.summary(arch, ON_TENSOR_CORES, "loss_grad")
        assert "a warp per tile of 16 samples in registers" in summary


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
    assert (forward, backward) == ([0, 12, 30], [36, 36, 54]) and total == 60
    assert f"WideLayer<48, 5, {offsets[2]}, 30, 54, 1, Identity>" in source


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


def test_every_device_kind_reflects_the_kernel(device_kind):
    """On the PTX route slax reads a kernel's parameters from SlangPy's reflection on
    ``slax.config.reflection_device`` (SlangPy's CPU device where no Vulkan driver is): the kernel
    compiles for every target, its tensor-core instructions NaN elsewhere."""
    spec = nn_backends.wide_warp_kernel(Architecture((20, 48, 48, 5), "float16"))
    parameters = kernel_parameters(get_device(slax.DeviceKind(device_kind)), spec)
    assert [name for name, _ in parameters.pointers] == ["x", "target", "params", "fragments", "partials"]
    assert [name for name, _ in parameters.scalars] == [
        "count",
        "samples_per_group",
        "blocks_per_group",
        "tiles_per_block",
        "loss_scale",
    ]


@pytest.mark.parametrize("sizes", WIDE, ids=_ids)
def test_warp_tiles_match_the_reference(sizes, device_kind, fused_kernels):
    """On a CUDA GPU, the loss and gradients of two vmapped groups of 1000 samples, of one of 333
    and of one of 5 (thread groups of 128 samples, rows past a group's end repeating its last
    sample and counting for nothing) agree with the float32 reference within TOLERANCE, and are the
    same bits on a second run."""
    if device_kind != "cuda":
        pytest.skip("JAX on a CUDA GPU runs the warp tiles; elsewhere the tiled kernels run")
    params = nn.mlp_init(jax.random.key(sum(sizes)), sizes, "float16")
    rows = jnp.zeros((1000, sizes[0]), jnp.float16)
    assert "a warp per tile of 16 samples in registers" in nn.describe(params, rows)["mlp_loss_and_grad"]
    assert_float16_loss_and_grad_match_reference(params, sum(sizes), TOLERANCE)
