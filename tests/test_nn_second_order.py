"""slax.nn: derivatives of the MLP beyond the first (slax/nn/_primitives.py, "derivatives") against
those of its plain-JAX twin, for a narrow network (a sample per thread) and a wide one (tiles), in
float32 and float16.

On one device kind (``one_device_kind``): the rules compose the first-order kernels (which
tests/test_nn.py runs on every route, narrow and tiled, in both dtypes) with the twin's
derivatives, so a route changes nothing here that test_nn does not catch. The gradient of an
eikonal loss in the parameters (and in x too) also runs a wide network's Hessian kernel, which
tests/test_tile_hessian.py (the tile families') and tests/test_wide_warp.py (the warp tiles') test
on every route."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from _helpers import eikonal_loss, mlp_inputs, relative_error
from _training import cast

from slax import nn
from slax.testing import RELATIVE_TOLERANCE, check_grads

pytestmark = [pytest.mark.one_device_kind, pytest.mark.usefixtures("fused_kernels")]

SIZES = [(3, 7, 5), (3, 16, 16, 1)]  # 68 parameters run a sample per thread; 353 run in tiles
DTYPES = ["float32", "float16"]
JAX_VERSION_NETWORK = (SIZES[1], "float32")
"""The network CI's other JAX releases run these tests on: the rules are the same for every size and
dtype, which choose the kernels alone."""


QUICK_NETWORKS = [(SIZES[0], "float16"), JAX_VERSION_NETWORK]
"""The networks --quick runs these tests on: each kernel family (a sample per thread, tiles) and
each dtype once; the full run takes every pair."""


def _network_marks(network) -> list:
    return [pytest.mark.jax_version] * (network == JAX_VERSION_NETWORK) + [pytest.mark.slow] * (
        network not in QUICK_NETWORKS
    )


@pytest.fixture(
    scope="module",
    params=[pytest.param((s, d), marks=_network_marks((s, d))) for s in SIZES for d in DTYPES],
    ids=lambda p: f"{p[1]}-{'-'.join(map(str, p[0]))}",
)
def network(request):
    """Parameters, inputs away from LeakyReLU's kinks, and the plain-JAX twin: ``(slax, twin)``
    callables ``(params, x) -> y`` and float32 copies of the arguments for the twin."""
    sizes, dtype = request.param
    keys = jax.random.split(jax.random.key(len(sizes) + len(dtype)), 2)
    params = nn.mlp_init(keys[0], sizes, dtype)
    x = mlp_inputs(params, keys[1], 9, dtype)
    twin = functools.partial(nn.mlp_apply_reference, storage_dtype=dtype)
    return params, x, twin, cast((params, x), jnp.float32), dtype


def assert_close(got, want, dtype):
    for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert got_leaf.shape == want_leaf.shape
        assert relative_error(got_leaf, want_leaf) < RELATIVE_TOLERANCE[dtype]


def wavy(apply):
    """A loss nonlinear in the outputs: the Hessian of a LeakyReLU network alone is zero."""
    return lambda params, x: jnp.sum(jnp.sin(1.3 * apply(params, x).astype(jnp.float32)))


def test_gradient_of_an_eikonal_loss(network, lowered):
    """jax.grad of a loss that holds jax.grad of the network with respect to x, under jit, in the
    parameters and in x (as when x is a trained encoding's features); its first-order parts run
    the forward and backward kernels. For the tiled network (LeakyReLU: linear pieces), the
    second derivative's part in the parameters runs the Hessian kernel although x's is asked for
    too: along x, that part is zero."""
    params, x, twin, twin_args, dtype = network
    got = jax.jit(jax.grad(eikonal_loss(nn.mlp_apply), argnums=(0, 1)))(params, x)
    assert_close(got, jax.grad(eikonal_loss(twin), argnums=(0, 1))(*twin_args), dtype)
    entries = {key[1] for key in lowered}
    assert "mlp_backward" in entries and entries & {"mlp_forward", "mlp_forward_hidden"}
    assert ("mlp_hessian_sums" in entries) == (len(params) == 3), entries  # layers


def test_gradient_through_per_sample_input_gradients(network):
    """The inner gradient per sample under vmap (the backward kernel's vmapped groups), of a loss
    nonlinear in the outputs, so the outer gradient also transposes the backward kernel's
    cotangent: reverse over reverse through both of its JVP terms."""
    params, x, twin, twin_args, dtype = network

    def loss(apply):
        def per_sample(params, x):
            return jax.grad(lambda x: wavy(apply)(params, x))(x)

        def outer(params, x):
            return jnp.sum(jnp.cos(jax.vmap(per_sample, (None, 0))(params, x).astype(jnp.float32)))

        return outer

    got = jax.jit(jax.grad(loss(nn.mlp_apply), argnums=(0, 1)))(params, x)
    assert_close(got, jax.grad(loss(twin), argnums=(0, 1))(*twin_args), dtype)


def test_check_grads_second_order(network):
    """slax.testing.check_grads's Hessian-vector products, in both modes, in params and x."""
    params, x, twin, _, _ = network
    check_grads(wavy(nn.mlp_apply), wavy(twin), params, x, order=2, raises=True)


def test_hessian_with_respect_to_the_input(network):
    params, x, twin, twin_args, dtype = network
    hessian = jax.hessian(lambda x, apply: wavy(apply)(params, x))
    got = jax.jit(hessian, static_argnums=1)(x[:2], nn.mlp_apply)
    want = jax.hessian(lambda x: wavy(twin)(twin_args[0], x))(twin_args[1][:2])
    assert got.shape == (2, x.shape[1], 2, x.shape[1])
    assert_close(got, want, dtype)
    # the network alone is piecewise linear: its own Hessian is zero, and so is slax's
    zero = jax.hessian(lambda x: jnp.sum(nn.mlp_apply(params, x).astype(jnp.float32)))(x[:2])
    assert not jnp.any(zero)


def test_jvp_and_linearize_of_apply_and_of_its_gradient(network):
    """Forward mode in params and x together: of the network, and of its gradient (forward over
    reverse), the linearization applied twice."""
    params, x, twin, twin_args, dtype = network
    directions = jax.tree.map(lambda a: jnp.flip(a), (params, x))
    twin_directions = cast(directions, jnp.float32)

    def gradient(apply):
        return jax.grad(wavy(apply), argnums=(0, 1))

    got = jax.jit(lambda *a: jax.jvp(nn.mlp_apply, a, directions))(params, x)
    assert_close(got, jax.jvp(twin, twin_args, twin_directions), dtype)
    got = jax.jvp(gradient(nn.mlp_apply), (params, x), directions)
    assert_close(got, jax.jvp(gradient(twin), twin_args, twin_directions), dtype)
    _, linear = jax.linearize(gradient(nn.mlp_apply), params, x)
    _, twin_linear = jax.linearize(gradient(twin), *twin_args)
    for scale in (1.0, -0.5):
        scaled = jax.tree.map(lambda a, s=scale: (s * a.astype(jnp.float32)).astype(a.dtype), directions)
        assert_close(linear(*scaled), twin_linear(*cast(scaled, jnp.float32)), dtype)


@pytest.mark.jax_version
def test_hessian_with_respect_to_the_parameters():
    """Second derivatives in the parameters: the backward kernel's JVP in the parameters' own
    direction (its curvature term) and in dy's (the kernel again)."""
    params = nn.mlp_init(jax.random.key(3), (2, 5, 3))
    x = mlp_inputs(params, jax.random.key(4), 6, "float32")
    twin = functools.partial(nn.mlp_apply_reference, storage_dtype="float32")
    got = jax.jit(jax.hessian(wavy(nn.mlp_apply)))(params, x)
    assert_close(got, jax.hessian(wavy(twin))(params, x), "float32")


@pytest.mark.parametrize(
    "sizes",
    [
        pytest.param(sizes, marks=[pytest.mark.jax_version] * (sizes == JAX_VERSION_NETWORK[0]))
        for sizes in SIZES
    ],
    ids=lambda s: "-".join(map(str, s)),
)
def test_third_order_recurses(sizes):
    """Third derivatives in x: each order's JVP is the primitive again along the linear operands
    plus the twin's derivative, so the recursion has no last order."""
    params = nn.mlp_init(jax.random.key(5), sizes)
    x = mlp_inputs(params, jax.random.key(6), 2, "float32")
    twin = functools.partial(nn.mlp_apply_reference, storage_dtype="float32")

    def third(apply):
        return jax.jit(jax.jacfwd(jax.hessian(lambda x: wavy(apply)(params, x))))(x)

    assert_close(third(nn.mlp_apply), third(twin), "float32")
