"""The tensor-core MLP kernels (shaders/nn/tensor_cores.slang) at work: the ``slax.config.tensor_cores``
switch, wide networks against the plain-JAX reference on every device, and on a CUDA GPU, where
they run on tensor cores, against the reference and the tiled kernels. Their layouts:
tests/test_tensor_core_layout.py."""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import pytest
from _helpers import draw_uniform, equations, mlp_inputs, relative_error, run_python
from _training import cast

import slax
from slax import nn
from slax._config import _parse_switch
from slax.nn import _primitives as nn_primitives
from slax.nn._backends import BackendRequest, Platform
from slax.nn._kernels import hidden_width, kernel_layout
from slax.nn._precision import float32_products
from slax.nn._wide_warp_kernels import wide_warp_fits

DTYPES = ["float32", "float16"]
DIGITS = (64, 128, 64, 10)
WIDE = [(40, 10), (13, 21, 10), DIGITS]
"""Wide networks (too many parameters for a thread's registers) that fit the tensor-core layout: one
layer alone (no hidden activations), widths off multiples of 8 (fragments and tiles padded with
zeros), and the digits network."""
TOLERANCE = {"float32": 1e-5, "float16": 1e-2}
"""Normwise relative error of a network's loss and gradients against the float32 reference. float32:
the tiled kernels sum in another order (a few ulps); the tensor cores' 3xTF32 products miss under
3 * 2^-20 (3e-6) of each |a b| (test_b_fragments_multiply_as_mma_sync_reads_them): 1.7e-6 measured
for the digits network on an H100. float16: the kernels round activations to half as the reference
does, but a sum in another order can round the other way (2^-11 relative) in each of the layers:
about ten half ulps, slax.testing's tolerance."""


TF32_TOLERANCE = 4e-3
"""The same at JAX's default precision, one TF32 pass on tensor cores (``precision="default"``):
each operand keeps 10 of its significand's 23 bits (mma.sync reads an activation's top bits, a
weight rounded to TF32), 2^-10 relative at most, compounded over the layers and summed over the
batch; XLA's own TF32 products land as far from the float32 reference."""


def _ids(sizes):
    return "-".join(map(str, sizes))


# --- the switch -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "on"),
    [(value, True) for value in ("1", " TRUE ", "on", "Yes")]
    + [(value, False) for value in ("0", "false", "OFF", "no")],
)
def test_switch_values(value, on):
    """An on/off variable takes the usual spellings, in any case, with spaces around; unset or empty
    it is the default (as an empty SLAX_CUDA_LAUNCH is); anything else is refused naming the
    variable, rather than read as on or off."""
    assert _parse_switch(value, "SLAX_TENSOR_CORES", not on) is on
    for unset in (None, "", "  "):
        assert _parse_switch(unset, "SLAX_TENSOR_CORES", on) is on
    with pytest.raises(ValueError, match=r"SLAX_TENSOR_CORES='2' is not a switch; expected 1 or 0"):
        _parse_switch("2", "SLAX_TENSOR_CORES", on)


@pytest.mark.one_device_kind
def test_the_environment_variable_is_read_at_import():
    """``SLAX_TENSOR_CORES`` sets the switch and the MLP's request when slax is imported; a value
    that is no switch stops the import, naming the variable."""
    show = (
        "import slax, slax.nn._backends as b; "
        "print(slax.config.tensor_cores, b.BackendRequest.current().tensor_cores)"
    )
    result = run_python("-c", show, env={**os.environ, "SLAX_TENSOR_CORES": " Off "}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False", "False"]
    result = run_python("-c", "import slax", env={**os.environ, "SLAX_TENSOR_CORES": "maybe"}, timeout=300)
    assert result.returncode != 0 and "SLAX_TENSOR_CORES='maybe' is not a switch" in result.stderr


def test_the_switch_takes_only_booleans():
    """A truthy non-bool would be taken for a setting it is not (and routes must stay hashable data)."""
    before = slax.config.tensor_cores
    with pytest.raises(
        TypeError,
        match=r"tensor_cores must be True or False \(slax.config.tensor_cores or SLAX_TENSOR_CORES\); got 0",
    ):
        slax.config.tensor_cores = 0
    assert slax.config.tensor_cores is before and BackendRequest.current().tensor_cores is before


def test_the_switch_is_read_when_the_mlp_is_traced():
    """The MLP's primitives carry the switch in their request, as it was when mlp_apply was traced
    (a function jitted afresh takes the new setting; one already compiled keeps its own: the
    switch is no launch route, so switching it retraces no other function,
    tests/test_backends.py)."""
    params = nn.mlp_init(jax.random.key(27), (13, 21, 10))
    x = draw_uniform(jax.random.key(28), (4, 13), "float32")
    before = slax.config.tensor_cores
    for setting in (not before, before):
        with slax.config.override(tensor_cores=setting):
            jaxpr = jax.make_jaxpr(lambda x: nn.mlp_apply(params, x))(x).jaxpr
        (forward,) = equations(jaxpr, lambda e: e.primitive is nn_primitives.mlp_forward_p)
        products = BackendRequest.current().products  # JAX's matmul precision now
        assert forward.params["request"] == BackendRequest(slax.config.mlp_backend, setting, products)
        assert not hasattr(forward.params["routes"], "tensor_cores")


@pytest.mark.parametrize(("capability", "on"), [("70", False), ("75", False), ("80", True), ("90", True)])
def test_gpus_before_sm_80_run_the_tiled_kernels(monkeypatch, capability, on):
    """The tensor-core kernels' PTX is for sm_80 (TF32 mma.sync), which a V100 or T4 refuses to
    load: lowered for CUDA, only a GPU of compute capability 8.0 or newer takes them (the capability
    the PTX launcher reads, here set as SLAX_CUDA_COMPUTE_CAPABILITY sets it for a GPU not present);
    the CPU never does."""
    monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", capability)
    assert Platform.of("cuda", BackendRequest(tensor_cores=True)).tensor_cores is on
    assert Platform.of("cpu", BackendRequest(tensor_cores=True)).tensor_cores is False
    assert Platform.of("cuda", BackendRequest(tensor_cores=False)).tensor_cores is False


# --- networks ---------------------------------------------------------------------------------------


def _problem(sizes, dtype, batch=1000):
    """Parameters, inputs away from kinks and targets; 1000 samples end in a part tile (tiles of 32
    samples in float32, 16 in float16)."""
    keys = jax.random.split(jax.random.key(sum(sizes)), 3)
    params = nn.mlp_init(keys[0], sizes, dtype)
    return params, mlp_inputs(params, keys[1], batch, dtype), draw_uniform(keys[2], (batch, sizes[-1]), dtype)


def _loss_around(apply):
    return lambda params, x: jnp.sum(jnp.sin(apply(params, x).astype(jnp.float32) * 1.3))


def _gradients(params, x, target):
    """mlp_loss_and_grad's loss and gradients, and the gradients of a loss around mlp_apply over the
    parameters alone (mlp_backward_params) and over them and x (mlp_backward), each from a function
    jitted afresh (so that its kernels are lowered now)."""
    loss_and_grad = jax.jit(lambda *args: nn.mlp_loss_and_grad(*args))(params, x, target)
    loss = _loss_around(nn.mlp_apply)
    return loss_and_grad, jax.jit(jax.grad(loss))(params, x), jax.jit(jax.grad(loss, (0, 1)))(params, x)


def _reference_gradients(params, x, target, dtype):
    """The same from the plain-JAX twin, in float32 at full precision, rounding activations to dtype."""
    params, x, target = cast((params, x, target), jnp.float32)
    loss_and_grad = jax.value_and_grad(nn.mlp_loss_reference)(params, x, target, storage_dtype=dtype)
    loss = _loss_around(functools.partial(nn.mlp_apply_reference, storage_dtype=dtype))
    return loss_and_grad, jax.grad(loss)(params, x), jax.grad(loss, (0, 1))(params, x)


# one width on every route (each dtype's tiled kernels); the others on one route, as is the digits
# network's on Vulkan in tests/test_nn.py's test_apply_and_its_gradients_match_reference
@pytest.mark.sweep
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "sizes",
    [size if size == WIDE[1] else pytest.param(size, marks=pytest.mark.one_device_kind) for size in WIDE],
    ids=_ids,
)
def test_wide_networks_match_the_reference(sizes, dtype, device_kind, lowered):
    """The fused loss and gradient and the gradients through mlp_apply (of the parameters alone, and
    with x's) of wide networks (one layer; widths off multiples of 8) agree with the reference
    (TOLERANCE). CPU-placed JAX runs the tiled kernels whatever the switch; a CUDA GPU the
    tensor-core kernels (every operation of a float16 network at most 64 wide on their warp
    tiles), unless switched off."""
    assert not kernel_layout(sizes).thread_sums
    params, x, target = _problem(sizes, dtype)
    got, want = _gradients(params, x, target), _reference_gradients(params, x, target, dtype)
    for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert relative_error(got_leaf, want_leaf) < TOLERANCE[dtype]
    forward = "mlp_forward_hidden" if hidden_width(sizes) else "mlp_forward"
    tensor_cores = device_kind == "cuda" and slax.config.tensor_cores
    if tensor_cores and wide_warp_fits(
        sizes, dtype, float32_products("mlp_apply")
    ):  # every operation on the warp tiles
        entries = ("mlp_loss_grad", "mlp_forward", "mlp_backward", "mlp_backward_params")
        assert {key[1:] for key in lowered} == {(entry, "warp tiles") for entry in entries}
        return
    assert {key[1:] for key in lowered} == {
        (entry, tensor_cores) for entry in ("mlp_loss_grad", forward, "mlp_backward", "mlp_backward_params")
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sizes", [DIGITS, (13, 21, 10)], ids=_ids)
def test_tensor_cores_match_the_reference_and_the_tiled_kernels(sizes, dtype, device_kind, lowered):
    """On a CUDA GPU, the tensor-core kernels' loss and gradients agree with the reference and with
    the tiled kernels (tensor cores off) within TOLERANCE: float32 networks keep float32's accuracy
    through the 3xTF32 split (a product misses under 3 * 2^-20 of |a b|: lo's TF32 reading in each
    operand, and lo lo, left out); float16 networks multiply exact half values and sum in float, as
    the tiled kernels do."""
    if device_kind != "cuda":
        pytest.skip("JAX on a CUDA GPU runs tensor cores; elsewhere both settings run the tiled kernels")
    params, x, target = _problem(sizes, dtype)
    results = {}
    for tensor_cores in (True, False):
        with slax.config.override(tensor_cores=tensor_cores):
            results[tensor_cores] = jax.tree.leaves(_gradients(params, x, target))
    want = jax.tree.leaves(_reference_gradients(params, x, target, dtype))
    for on, off, reference in zip(results[True], results[False], want, strict=True):
        assert relative_error(on, reference) < TOLERANCE[dtype]
        assert relative_error(on, off) < TOLERANCE[dtype]
    on = (
        "warp tiles" if wide_warp_fits(sizes, dtype, float32_products("mlp_apply")) else True
    )  # float16's every operation at most 64 wide
    assert {key[2] for key in lowered} == {on, False}


@pytest.mark.parametrize("sizes", [DIGITS, (3, 64, 64, 64, 1)], ids=_ids)
def test_float32_networks_take_one_tf32_pass_at_jaxs_default_precision(sizes, device_kind, lowered):
    """On a CUDA GPU, a float32 network at JAX's default precision (``precision="default"``) runs
    its tensor-core products as one TF32 pass, as XLA's are: its loss and gradients land within
    TF32_TOLERANCE of the float32 reference, and further from it than float32's accuracy, which
    ``precision="highest"`` keeps (3xTF32)."""
    if device_kind != "cuda":
        pytest.skip("JAX on a CUDA GPU runs tensor cores; elsewhere every float32 product is float32's")
    params, x, target = _problem(sizes, "float32")
    want = jax.tree.leaves(_reference_gradients(params, x, target, "float32"))
    errors = {}
    for precision in ("default", "highest"):
        with jax.default_matmul_precision(precision):
            got = jax.tree.leaves(_gradients(params, x, target))
        errors[precision] = max(relative_error(g, w) for g, w in zip(got, want, strict=True))
    assert errors["highest"] < TOLERANCE["float32"] < errors["default"] < TF32_TOLERANCE, errors
    assert {key[2] for key in lowered} == {True}
