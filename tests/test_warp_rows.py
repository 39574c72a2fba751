"""The ``warp_rows`` backend: wide float16 networks whose weight-gradient sums pass a warp's
registers, their fused loss and per-sample gradients in warp tiles (shaders/nn/warp_rows.slang) and
their weight gradients summed by XLA's products: which networks take it, the descriptor, its
reflection on every device kind, and on a CUDA GPU its results against the float32 reference."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import draw_uniform, mlp_inputs, relative_error
from _training import cast

import slax
from slax import nn
from slax._compile import kernel_parameters
from slax._device import get_device
from slax.nn import _backends as nn_backends
from slax.nn import _warp_rows_kernels as nn_warp_rows
from slax.nn._architecture import Architecture

ON_TENSOR_CORES = nn_backends.Platform("cuda", tensor_cores=True, capability=90)
AUTO = nn_backends.BackendRequest("auto", True)

WIDE = [
    (32, 128, 128, 16),
    (40, 128, 128, 128, 3),
    (16, *[32] * 6, 8),
    (20, 48, 48, 48, 5),
    (16, 112, 112, 65),
]
"""Networks the kernel runs: the benchmark's two 128-wide layers, three 128-wide layers with an odd
output width (its rows written a half at a time), six hidden layers (four in the hidden rows'
arrays), widths off multiples of 16 (padded columns), and an output wider than its input."""
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
def test_a_hidden_activation_keeping_its_input_is_refused():
    arch = Architecture((32, 128, 128, 16), "float16", ("sine", "sine", "identity"))
    assert "a hidden sine layer keeps its input z" in nn_backends.WarpRows().unfit(arch, ON_TENSOR_CORES)


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    ("sizes", "samples", "backend"),
    [
        ((32, 128, 128, 16), 1 << 14, "warp_rows"),  # XLA_WINS keeps it off the tensor-core tiles
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
    assert f"RowsLayer<3, 48, 5, {offsets[3]}, 48, 90, Identity>" in source


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
    keys = jax.random.split(jax.random.key(sum(sizes)), 3)
    params = nn.mlp_init(keys[0], sizes, "float16")
    rows = jnp.zeros((1000, sizes[0]), jnp.float16)
    reference_grad = jax.jit(
        jax.value_and_grad(functools.partial(nn.mlp_loss_reference, storage_dtype="float16"))
    )
    with slax.config.override(mlp_backend="warp_rows"):
        assert (
            "each layer's input and output gradient written out"
            in nn.describe(params, rows)["mlp_loss_and_grad"]
        )
        function = jax.jit(jax.vmap(nn.mlp_loss_and_grad, in_axes=(None, 0, 0)))
        for groups, batch in ((2, 1000), (1, 333), (1, 5)):
            x = mlp_inputs(params, keys[1], groups * batch, "float16").reshape(groups, batch, sizes[0])
            target = draw_uniform(keys[2], (groups, batch, sizes[-1]), "float16")
            got = jax.tree.leaves(function(params, x, target))
            again = jax.tree.leaves(function(params, x, target))
            for k in range(groups):
                want = jax.tree.leaves(reference_grad(*cast((params, x[k], target[k]), jnp.float32)))
                for leaf, repeat, reference in zip(got, again, want, strict=True):
                    assert np.array_equal(leaf[k], repeat[k]), "the sums are not deterministic"
                    assert relative_error(leaf[k], reference) < TOLERANCE
