"""The ``warp_rows`` backend: wide float16 networks whose weight-gradient sums pass a warp's
registers, their fused loss and per-sample gradients in warp tiles (shaders/nn/warp_rows.slang) and
their weight gradients summed by XLA's products: which networks take it, the descriptor, its
reflection on every device kind, and on a CUDA GPU its results against the float32 reference."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from _helpers import assert_loss_and_grad_match_reference, draw_uniform, relative_error

import slax
from slax import nn
from slax._compile import kernel_parameters
from slax._device import get_device
from slax.nn import _backends as nn_backends
from slax.nn import _warp_rows_kernels as nn_warp_rows
from slax.nn._architecture import Architecture
from slax.nn._reference import loss_grad_twin

ON_TENSOR_CORES = nn_backends.Platform("cuda", tensor_cores=True, capability=90)
AUTO = nn_backends.BackendRequest("auto", True)

WIDE = [
    (32, 128, 128, 16),
    (40, 128, 128, 128, 3),
    (16, *[32] * 6, 8),
    (20, 48, 48, 48, 5),
    (16, 112, 112, 65),
    (24, 64, 64, 64, 7, "sine"),
]
"""Networks the kernel runs: the benchmark's two 128-wide layers, three 128-wide layers with an odd
output width (its rows written a half at a time), six hidden layers (four in the hidden rows'
arrays), widths off multiples of 16 (padded columns), an output wider than its input, and a sine
output layer (which keeps z)."""
TOLERANCE = 1e-2
"""Normwise relative error of the loss and gradients against the float32 reference (activations
rounded to half): slax.testing's float16 tolerance. Each sample's gradient at a layer's output is
rounded to half before XLA's products sum it, and the sums run in XLA's order."""


def _ids(sizes):
    return "-".join(map(str, sizes))


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    ("sizes", "dtype", "why"),
    [
        ((32, 128, 128, 16), "float16", None),
        ((32, *[64] * 8, 16), "float16", None),
        ((32, 128, 128, 16), "float32", "float16 networks"),
        ((32, 128, 16), "float16", r"two or more hidden layers of one width, and these are \[128\]"),
        ((32, 128, 64, 16), "float16", r"of one width, and these are \[128, 64\]"),
        ((32, 256, 256, 16), "float16", "at most 128 wide, and this network's widest is 256"),
        ((4, 16, 4), "float16", "thread_sums runs narrow networks"),
    ],
)
def test_which_networks_the_warp_rows_run(sizes, dtype, why):
    arch = Architecture(sizes, dtype)
    refusal = nn_backends.WarpRows().unfit(arch, ON_TENSOR_CORES)
    if why is None:
        assert refusal is None
    else:
        assert refusal is not None and re.search(why, refusal), refusal
    assert nn_backends.WarpRows().unfit(
        Architecture((32, 128, 128, 16), "float16"), nn_backends.Platform("cpu")
    )


@pytest.mark.one_device_kind
def test_a_hidden_activation_keeping_its_input_is_refused_an_output_one_is_not():
    """Hidden layers' outputs are read back for their derivative; the last layer's kept values
    (z for sine) stay in registers."""
    hidden = Architecture((32, 128, 128, 16), "float16", ("sine", "sine", "none"))
    assert "a hidden sine layer keeps its input z" in nn_backends.WarpRows().unfit(hidden, ON_TENSOR_CORES)
    output = Architecture((32, 128, 128, 16), "float16", ("leaky_relu", "leaky_relu", "sine"))
    assert nn_backends.WarpRows().unfit(output, ON_TENSOR_CORES) is None


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    ("sizes", "samples", "backend"),
    [
        ((32, 128, 128, 16), 1 << 14, "warp_rows"),  # the rule's table keeps it off the tensor-core tiles
        ((32, 128, 128, 128, 128, 16), 1 << 20, "warp_rows"),  # the tiles' sums do not fit
        ((32, *[64] * 8, 16), 1 << 18, "warp_rows"),
        ((32, 64, 64, 16), 1 << 18, "tensor_cores"),  # the warp tiles hold its sums
    ],
)
def test_auto_takes_the_warp_rows_where_the_tiles_lose_or_do_not_fit(monkeypatch, sizes, samples, backend):
    monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", "90")
    choice = nn_backends.choose(Architecture(sizes, "float16"), "cuda", samples, AUTO)
    assert choice.backend.name == backend, choice.why


@pytest.mark.one_device_kind
@pytest.mark.parametrize(("capability", "tensor_cores"), [("90", False), ("75", True)])
def test_without_tensor_cores_auto_keeps_networks_xla_wins_on_xla(monkeypatch, capability, tensor_cores):
    """Where the warp rows cannot run (tensor cores off or absent), a network whose tiles the rule's
    table passes over runs on XLA, not on the tiled kernels, which are slower still."""
    monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", capability)
    request = nn_backends.BackendRequest("auto", tensor_cores)
    for dtype in ("float16", "float32"):
        choice = nn_backends.choose(Architecture((32, 128, 128, 16), dtype), "cuda", 1 << 14, request)
        assert choice.backend.name == "xla", choice.why
        assert "tiled: float" in choice.why and "train faster on XLA's products" in choice.why


@pytest.mark.one_device_kind
def test_auto_keeps_float32_networks_that_xla_wins_on_xla(monkeypatch):
    monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", "90")
    choice = nn_backends.choose(Architecture((32, 128, 128, 16), "float32"), "cuda", 1 << 14, AUTO)
    assert choice.backend.name == "xla"
    assert "tensor_cores: float32 networks with two adjacent hidden layers 128" in choice.why
    assert "warp_rows: it runs float16 networks" in choice.why


@pytest.mark.one_device_kind
def test_the_descriptor_names_the_layers_and_includes_the_kernel():
    """What Python writes per network is a descriptor: sizes as static consts, the chain of layer
    types with each layer's index, parameter offset and fragment blocks, the include."""
    sizes = (20, 48, 48, 48, 5)
    offsets, _ = nn_backends.parameter_offsets(sizes)
    source = nn_warp_rows.warp_rows_source(sizes, ("LeakyReLU",) * 3 + ("Identity",))
    assert "static const int Width = 48;" in source and "static const int Layers = 4;" in source
    assert source.rstrip().endswith('#include "nn/warp_rows.slang"')
    assert "{" not in source
    # fragments: every layer's forward blocks (12, 18, 18, 6), then every layer's input-gradient
    # blocks (12, 18, 18, 6; the first layer's too, which the warp tiles' dx reads)
    assert f"RowsLayer<3, 48, 5, {offsets[3]}, 48, 102, Identity>" in source


def test_every_device_kind_reflects_the_kernel(device_kind):
    """The kernel compiles for every target (its tensor-core instructions NaN off CUDA), and its
    parameters are the operands, the six results, then the scalars."""
    spec = nn_backends.warp_rows_kernel(Architecture((20, 48, 48, 48, 5), "float16"))
    parameters = kernel_parameters(get_device(slax.DeviceKind(device_kind)), spec)
    assert [name for name, _ in parameters.pointers] == [
        "x",
        "target",
        "params",
        "fragments",
        "losses",
        "first_dz",
        "hidden_inputs",
        "hidden_dz",
        "last_input",
        "last_dz",
    ]
    assert [name for name, _ in parameters.scalars] == ["count", "samples"]


@pytest.mark.parametrize("sizes", WIDE, ids=_ids)
def test_warp_rows_match_the_reference(sizes, device_kind):
    """On a CUDA GPU, the loss and gradients of two vmapped groups of 1000 samples, of one of 333
    and of one of 5 (warps of 16 samples, rows past the batch's end writing nothing) agree with the
    float32 reference within TOLERANCE, and are the same bits on a second run."""
    if device_kind != "cuda":
        pytest.skip("JAX on a CUDA GPU runs the warp rows; elsewhere the Slang kernels for every device")
    *sizes, output = sizes if isinstance(sizes[-1], str) else (*sizes, "none")
    params = nn.mlp_init(jax.random.key(sum(sizes)), tuple(sizes), "float16", output_activation=output)
    rows = jnp.zeros((1000, sizes[0]), jnp.float16)
    with slax.config.override(mlp_backend="warp_rows"):
        summary = nn.describe(params, rows)["mlp_loss_and_grad"]
        assert "each layer's input and output gradient written out" in summary
        assert_loss_and_grad_match_reference(params, sum(sizes), TOLERANCE)


def _rows_as_the_kernel_writes_them(sizes, flat):
    """A JAX stand-in for ``mlp_loss_rows`` on the network of ``sizes`` (LeakyReLU hidden layers,
    an affine output; ``flat``: each layer's bias then weight, halves): run_kernel's results, each
    sample's squared error and the five arrays of rows, as the kernel computes them (outputs and
    dz rounded to half)."""

    def run_kernel(spec, operands, results, count, scalars, routes):
        x, target = (operand.reshape(-1, operand.shape[-1]).astype(jnp.float32) for operand in operands[:2])
        layers = len(sizes) - 1
        inputs, kept, h = [], [], x
        for k in range(layers):
            inputs.append(h)
            z = h @ flat[2 * k + 1].astype(jnp.float32).T + flat[2 * k].astype(jnp.float32)
            h = (
                (jnp.where(z > 0, z, 0.01 * z) if k < layers - 1 else z)
                .astype(jnp.float16)
                .astype(jnp.float32)
            )
            kept.append(h)
        dy = h - target
        dz, gradient = [None] * layers, dy
        for k in reversed(range(layers)):
            slope = jnp.where(kept[k] > 0, 1.0, 0.01) if k < layers - 1 else 1.0
            dz[k] = (gradient * slope).astype(jnp.float16)
            gradient = dz[k].astype(jnp.float32) @ flat[2 * k + 1].astype(jnp.float32)
        halves = [array.astype(jnp.float16) for array in inputs]
        rows = [(dy * dy).sum(-1), dz[0], jnp.stack(halves[1:-1]), jnp.stack(dz[1:-1]), halves[-1], dz[-1]]
        assert [(row.shape, row.dtype) for row in rows] == [(s, jnp.dtype(d)) for s, d in results]
        return rows

    return run_kernel


QUICK_LEAVES_OUT = pytest.mark.slow
"""Shapes of the rows test --quick leaves out (each case about 10 s of XLA compiles on 2 cores): it
runs one shape per count of group axes, and an empty group."""


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    ("shape", "group_ndim"),
    [
        ((7, 20), 0),
        pytest.param((3, 5, 20), 0, marks=QUICK_LEAVES_OUT),
        ((2, 9, 20), 1),
        pytest.param((2, 3, 4, 20), 1, marks=QUICK_LEAVES_OUT),
        ((2, 3, 4, 5, 20), 2),
        pytest.param((2, 0, 20), 1, marks=QUICK_LEAVES_OUT),
        ((0, 4, 20), 1),
    ],
)
def test_the_rows_sum_to_the_loss_and_gradients_of_each_group(monkeypatch, shape, group_ndim):
    """What XLA does with the kernel's rows (``loss_grad``: dW = dz^T h and db = sum dz per group,
    the loss's factors, the gradients' order), on rows a JAX stand-in for the kernel writes: each
    group's loss and gradients agree with the ``xla`` backend's (slax/nn/_reference.py) within
    float16's tolerance, for groups of several sample axes and empty ones."""
    sizes = (20, 48, 48, 48, 5)
    params = nn.mlp_init(jax.random.key(1), sizes, "float16")
    flat = [array for layer in params for array in (layer["bias"], layer["weight"])]
    monkeypatch.setattr(nn_warp_rows, "run_kernel", _rows_as_the_kernel_writes_them(sizes, flat))
    x = draw_uniform(jax.random.key(2), shape, "float16")
    target = draw_uniform(jax.random.key(3), shape[:-1] + (sizes[-1],), "float16")
    packed = nn_backends.packed(flat)
    got = nn_warp_rows.loss_grad(None, sizes, x, target, flat, group_ndim, 0.25, packed, None)
    want = loss_grad_twin(x, target, flat, "float16", ("leaky_relu",) * 3 + ("none",), group_ndim, 0.25)
    assert [array.shape for array in got] == [array.shape for array in want]
    assert all(array.dtype == jnp.float32 for array in got)
    if x.size:
        for leaf, wanted in zip(got, want, strict=True):
            assert relative_error(leaf, wanted) < TOLERANCE
