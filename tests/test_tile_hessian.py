"""The tile families' Hessian kernel (``mlp_hessian_sums`` of shaders/nn/tile_kernels.slang): the
parameters' part of each sample's Hessian of ``dy . network(x)`` along a direction in x, which the
gradient of an eikonal loss takes, for wide networks of LeakyReLU, ReLU and linear layers. Its
layouts (each layer's input tangent besides the tiles), its source, its reflection on every device
kind, and its results against the float32 reference: on the CPU routes the tiled family's, on a
CUDA GPU the tensor-core tiles' (float32; float16 networks at most 64 wide take the warp tiles',
tests/test_wide_warp.py) and, forced, the tiled family's."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import eikonal_loss, mlp_inputs, relative_error
from _training import cast

import slax
from slax import nn
from slax._compile import kernel_parameters
from slax._device import get_device
from slax.nn import _backends as nn_backends
from slax.nn import _tensor_core_kernels as tc
from slax.nn._architecture import Architecture
from slax.nn._kernels import mlp_source
from slax.nn._tiled_kernels import TILE_SCRATCH_FLOATS, tile_layout
from slax.testing import RELATIVE_TOLERANCE


def _ids(value):
    return "-".join(map(str, value)) if isinstance(value, tuple) else str(value)


# --- layouts and sources ----------------------------------------------------------------------------


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    ("sizes", "first_order", "hessian"),
    [((3, 64, 64, 64, 1), 32, 16), ((3, 32, 32, 1), 32, 32), ((20, 40, 24, 5), 32, 32)],
    ids=_ids,
)
def test_the_tensor_core_hessian_layout_holds_each_inputs_tangent(sizes, first_order, hessian):
    """The Hessian kernel's tensor-core layout (float32) adds a tangent tile per layer input, with
    its input's stride, after the tiles and before the losses, 16-byte aligned, within 48 KiB:
    tiles of 32 samples where they fit, else of 16 (the signed distance field's 3-64x3-1). The
    first-order layout is unchanged and has no tangents."""
    plain, tangents = tc.tensor_core_layout(sizes, "float32"), tc.tensor_core_layout(sizes, "float32", True)
    assert plain.tangents == () and (plain.samples, tangents.samples) == (first_order, hessian)
    assert len(tangents.tangents) == len(sizes) - 1
    end = tangents.offsets[-1] + hessian * tangents.strides[-1]
    starts = [end]
    for stride in tangents.strides[:-1]:
        starts.append(starts[-1] + hessian * stride)
    assert list(tangents.tangents) == starts[:-1] and tangents.losses == starts[-1]
    assert all(offset % 4 == 0 for offset in tangents.tangents)
    assert tangents.scratch <= tc.TENSOR_CORE_SCRATCH_FLOATS
    assert tangents.gradients == plain.gradients  # the same sums in registers


@pytest.mark.one_device_kind
@pytest.mark.parametrize("sizes", [(3, 64, 64, 64, 1), (20, 40, 24, 5), (64, 128, 64, 10)], ids=_ids)
def test_the_tiled_hessian_layout_holds_each_inputs_tangent(sizes):
    """The tiled family's Hessian layout: a tangent tile per layer input (width + 1 floats a row),
    in tiles as large as fit 32 KiB, no larger than the first-order kernels'."""
    plain, tangents = tile_layout(sizes), tile_layout(sizes, True)
    assert plain.tangents == () and len(tangents.tangents) == len(sizes) - 1
    assert tangents.samples <= plain.samples and tangents.scratch <= TILE_SCRATCH_FLOATS
    widths = [b - a for a, b in zip(tangents.tangents, [*tangents.tangents[1:], tangents.gradient])]
    assert widths == [tangents.samples * (width + 1) for width in sizes[:-1]]


@pytest.mark.one_device_kind
@pytest.mark.parametrize("tensor_cores", [False, True])
def test_only_the_hessian_source_declares_the_tangents(tensor_cores):
    """The Hessian kernel's source defines SLAX_TILE_TANGENTS and names each layer's input tangent
    as what its weight gradient reads (Tangent0 the direction's tile); the first-derivative
    kernels' source names none."""
    sizes = (3, 32, 32, 1)
    hessian = mlp_source(sizes, "float32", tensor_cores, tangents=True)
    first_order = mlp_source(sizes, "float32", tensor_cores)
    assert "#define SLAX_TILE_TANGENTS" in hessian and "typealias DirectionTile = Tangent0;" in hessian
    assert all(f"typealias Tangent{k} = " in hessian for k in range(3))
    assert "Tangent" not in first_order and "SLAX_TILE_TANGENTS" not in first_order
    assert "Memory, Tangent0, Tangent1>" in hessian and "Memory, Tangent2, Tile3>" in hessian


@pytest.mark.parametrize("tensor_cores", [False, True])
def test_every_device_kind_reflects_the_hessian_kernel(tensor_cores, device_kind):
    """The Hessian kernel of both families compiles for every target (the PTX route reads its
    parameters from the reflection device): x, direction, dy, the parameters and the weights'
    second operand in, a row of partial sums per thread group out, and the launch's scalars."""
    arch = Architecture((20, 40, 24, 5), "float32")
    device = get_device(slax.DeviceKind(device_kind))
    parameters = kernel_parameters(device, nn_backends.kernel(arch, "mlp_hessian_sums", tensor_cores))
    pointers = [name for name, _ in parameters.pointers]
    assert pointers == ["x", "direction", "dy", "params", "weights", "partials"]
    scalars = [name for name, _ in parameters.scalars]
    assert scalars == ["count", "samples_per_group", "blocks_per_group", "tiles_per_block"]


# --- results ---------------------------------------------------------------------------------------


HESSIAN = [
    pytest.param((20, 40, 24, 5), "float32", "relu", marks=pytest.mark.one_device_kind),
    pytest.param((3, 32, 32, 32, 1), "float16", "leaky_relu", marks=pytest.mark.one_device_kind),
    pytest.param(
        (3, 64, 64, 64, 1),
        "float32",
        "leaky_relu",
        marks=[pytest.mark.one_device_kind("vulkan"), pytest.mark.slow],
    ),
]
"""Networks the tile families' Hessian kernel runs: widths off multiples of 8 and 16 with ReLU, a
float16 network (on a GPU with tensor cores the warp tiles take it: on the CPU routes only), and
the signed distance field's in float32 (tiles of 16 samples on tensor cores). Each runs on one
route: the same tile kernels, which the first two compile on the CPU device and the last on Vulkan.
--quick runs the first two (each about 25 s on 2 cores): float32 and float16, both tile layouts' tails."""


@pytest.mark.parametrize(
    ("sizes", "dtype", "activation"), HESSIAN, ids=lambda p: _ids(p) if isinstance(p, tuple) else p
)
def test_the_tile_hessian_kernels_match_the_reference(sizes, dtype, activation, device_kind, lowered):
    """As "auto" chooses among the fused kernels: the gradient in the parameters of an eikonal loss
    runs the Hessian kernel for what the second derivative adds, and agrees with the float32
    reference within the dtype's tolerance, for 1000 samples (a tile's padding at the end) and
    vmapped over two groups of 333 (each group's gradient its own); the same bits on a second run.
    On a CUDA GPU, the tensor-core tiles' kernel, and forced onto the tiled family, its own."""
    if device_kind == "cuda" and dtype == "float16":
        pytest.skip("on a GPU with tensor cores float16 networks this wide take the warp tiles' kernel")
    params = nn.mlp_init(jax.random.key(sum(sizes)), sizes, dtype, activation=activation)
    x = mlp_inputs(params, jax.random.key(7), 1000, dtype)
    reference = functools.partial(nn.mlp_apply_reference, storage_dtype=dtype)
    backends = ["auto", "tiled"] if device_kind == "cuda" else ["auto"]
    for backend in backends:
        lowered.clear()
        with slax.config.override(mlp_backend=backend):
            gradient = jax.jit(jax.grad(eikonal_loss(nn.mlp_apply)))
            got, again = gradient(params, x), gradient(params, x)
            grouped = jax.jit(jax.vmap(jax.grad(eikonal_loss(nn.mlp_apply)), (None, 0)))(
                params, x[:666].reshape(2, 333, -1)
            )
        want = jax.grad(eikonal_loss(reference))(*cast((params, x), jnp.float32))
        for leaf, repeat, wanted in zip(
            jax.tree.leaves(got), jax.tree.leaves(again), jax.tree.leaves(want), strict=True
        ):
            assert np.array_equal(leaf, repeat), "the sums are not deterministic"
            assert relative_error(leaf, wanted) < RELATIVE_TOLERANCE[dtype]
        for k in range(2):
            part = cast((params, x[333 * k : 333 * (k + 1)]), jnp.float32)
            want = jax.grad(eikonal_loss(reference))(*part)
            for leaf, wanted in zip(jax.tree.leaves(grouped), jax.tree.leaves(want), strict=True):
                assert relative_error(leaf[k], wanted) < RELATIVE_TOLERANCE[dtype]
        on_tensor_cores = device_kind == "cuda" and backend == "auto"
        assert ("mlp_hessian_sums", on_tensor_cores) in {key[1:] for key in lowered}, lowered


@pytest.mark.one_device_kind
@pytest.mark.parametrize("family", [nn_backends.Tiled, nn_backends.TensorCores])
def test_a_float32_network_takes_its_direction_and_dy_as_they_are(monkeypatch, family):
    """A float32 network's tiles hold floats: hessian_sums hands the kernel the direction and dy
    unscaled (an eikonal term's direction, about 1e-6 at 2^18 samples, is far inside float's normal
    range; only halves need the power-of-two scaling, which tests/test_wide_warp.py checks for both
    families) and returns its weight sums as they are, the bias parts zero."""
    from slax.nn._params import flat_layers

    arch = Architecture((3, 32, 32, 1), "float32")
    platform = nn_backends.Platform("cuda", tensor_cores=True, capability=90)
    flat = flat_layers(nn.mlp_init(jax.random.key(2), arch.sizes, "float32"))
    keys = jax.random.split(jax.random.key(3), 3)
    x = jax.random.uniform(keys[0], (100, 3), jnp.float32, -1.0, 1.0)
    direction = jax.random.uniform(keys[1], (100, 3), jnp.float32, -1.0, 1.0) * 1e-6
    dy = jax.random.uniform(keys[2], (100, 1), jnp.float32, -1.0, 1.0) * 2.0**-20
    given = []

    def kernel(self, arch, platform, entry, data, params, group_ndim, *rest):
        assert entry == "mlp_hessian_sums"
        given.append(data)
        return [jnp.zeros(()), *(jnp.full(p.shape, 3.0 + k, jnp.float32) for k, p in enumerate(params))]

    monkeypatch.setattr(family, "gradient", kernel)
    got = family().hessian_sums(arch, platform, x, direction, dy, flat, 0, None)
    (data,) = given
    assert all(np.array_equal(a, b) for a, b in zip(data, [x, direction, dy], strict=True))
    for k, leaf in enumerate(got):
        assert np.array_equal(leaf, np.zeros(leaf.shape) if k % 2 == 0 else np.full(leaf.shape, 3.0 + k))
