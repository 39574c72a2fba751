"""slax.nn's activations (slax/nn/_activations.py, shaders/nn/activations.slang): every activation,
as a hidden and as an output layer's, in each kernel family that runs on the CPU routes (a sample
per thread for narrow networks, SIMT tiles for wide ones), against the plain-JAX twin; the
parameters' pytree (slax/nn/_params.py); and the errors for unknown names."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _helpers import mlp_inputs, relative_error
from jax.flatten_util import ravel_pytree

from slax import nn
from slax.nn import _kernels as nn_kernels
from slax.nn._activations import ACTIVATIONS
from slax.testing import RELATIVE_TOLERANCE, check_grads

NARROW, WIDE = (3, 8, 8, 2), (5, 40, 40, 3)
"""One network per CPU kernel family: a sample per thread, and SIMT tiles (kernel_layout)."""
PAIRS = [("sine", "tanh"), ("tanh", "sine"), ("sigmoid", "relu"), ("relu", "sigmoid"), ("none", "leaky_relu")]
"""(hidden, output) activations: with the defaults (leaky_relu, none), which tests/test_nn.py
covers, every activation is a hidden and an output layer's once, in float32."""
HALF_PAIRS = [("sine", "tanh"), ("relu", "sigmoid"), ("none", "leaky_relu")]
"""Those of them in float16, which round as float32 does but for the storage (fewer kernels to
build): every activation once."""
CASES = [(pair, "float32") for pair in PAIRS] + [(pair, "float16") for pair in HALF_PAIRS]
ONE_ROUTE_CASES = {(pair, "float16") for pair in HALF_PAIRS}
"""The float16 cases run on one route: every route runs the narrow kernels in float16 in
tests/test_nn.py (test_samples_per_thread_change_only_the_rounding,
test_large_batch_gradients_are_race_free on Vulkan) and computes each activation in float32 here."""
WEIGHT_SCALE = 3.0
"""Weights three times mlp_init's, so that pre-activations reach past pi/2, where sine's derivative
cos z is negative (and so not sqrt(1 - sin^2 z)), and sigmoid and tanh bend."""


@pytest.mark.one_device_kind
def test_the_routes_are_those_named():
    assert nn_kernels.kernel_layout(NARROW).thread_sums
    assert not nn_kernels.kernel_layout(WIDE).thread_sums and nn_kernels.kernel_layout(WIDE).tile is not None


def _network(sizes, pair, dtype, seed):
    """Parameters of ``sizes`` with the ``pair`` of activations (weights scaled by WEIGHT_SCALE),
    and 300 inputs away from any kink."""
    keys = jax.random.split(jax.random.key(seed), 2)
    params = nn.mlp_init(keys[0], sizes, dtype, activation=pair[0], output_activation=pair[1])
    params = params.with_layers(
        [
            {"weight": (layer["weight"] * WEIGHT_SCALE).astype(dtype), "bias": layer["bias"]}
            for layer in params
        ]
    )
    return params, mlp_inputs(params, keys[1], 300, dtype)


# the wide network on one route: every route compiles each activation into the narrow kernels here
# (one Slang definition each, which the tiled kernels take too), and the tiled kernels with sine and
# tanh in test_hessian_of_a_smooth_network_matches_the_twin
@pytest.mark.sweep
@pytest.mark.parametrize(
    ("pair", "dtype"),
    [
        pytest.param(pair, dtype, marks=[pytest.mark.one_device_kind] * ((pair, dtype) in ONE_ROUTE_CASES))
        for pair, dtype in CASES
    ],
    ids=["-".join((*pair, dtype)) for pair, dtype in CASES],
)
@pytest.mark.parametrize(
    "sizes",
    [NARROW, pytest.param(WIDE, marks=pytest.mark.one_device_kind)],
    ids=lambda s: "-".join(map(str, s)),
)
def test_each_activation_matches_the_twin(sizes, pair, dtype):
    """mlp_apply, its derivatives for params and x in both modes, and mlp_loss_and_grad, against
    the twin (in float32, activations rounded to ``dtype`` as the kernels round them)."""
    params, x = _network(sizes, pair, dtype, seed=len(sizes) + PAIRS.index(pair))
    first = np.asarray(x, np.float32) @ np.asarray(params[0]["weight"], np.float32).T
    assert np.max(np.abs(first)) > 2.0  # past pi/2: sine's derivative takes both signs

    def loss(apply):  # a nonlinear JAX loss around the network
        return lambda params, x: jnp.sum(jnp.sin(apply(params, x).astype(jnp.float32) * 1.3))

    reference = functools.partial(nn.mlp_apply_reference, storage_dtype=dtype)
    check_grads(loss(nn.mlp_apply), loss(reference), params, x, raises=True)

    target = jax.random.normal(jax.random.key(7), (x.shape[0], sizes[-1])).astype(dtype)
    loss_value, grads = nn.mlp_loss_and_grad(params, x, target)
    want_loss, want_grads = jax.value_and_grad(nn.mlp_loss_reference)(params, x, target, dtype)
    assert isinstance(grads, nn.MLPParams) and grads.activation == pair[0]
    assert relative_error(loss_value, want_loss) < RELATIVE_TOLERANCE[dtype]
    assert relative_error(ravel_pytree(grads)[0], ravel_pytree(want_grads)[0]) < RELATIVE_TOLERANCE[dtype]


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("sizes", "pair"),
    [(NARROW, ("tanh", "sine")), (NARROW, ("sine", "tanh")), (WIDE, ("sine", "tanh"))],
    ids=["narrow-tanh-sine", "narrow-sine-tanh", "wide-sine-tanh"],
)
def test_hessian_of_a_smooth_network_matches_the_twin(sizes, pair):
    """Second derivatives (jax.hessian for x): a tanh or sine network's own curvature, nonzero
    unlike a LeakyReLU network's; the wide network's backward kernel reads the hidden layers' z
    that its forward kernel kept."""
    params, x = _network(sizes, pair, "float32", seed=11)
    x = x[:3]

    def total(apply):
        return lambda x: jnp.sum(apply(params, x) ** 2)

    got = jax.hessian(total(nn.mlp_apply))(x)
    want = jax.hessian(total(nn.mlp_apply_reference))(x)
    assert float(jnp.max(jnp.abs(want))) > 0.1
    assert relative_error(got, want) < RELATIVE_TOLERANCE["float32"]  # (3, in, 3, in)


@pytest.mark.one_device_kind
@pytest.mark.jax_version
def test_params_are_a_pytree_that_keeps_the_activations():
    """jax.tree.map, an optax Adam step and ravel_pytree keep MLPParams and its activations;
    ravel_pytree's order is a list of layers' (each layer's bias, then its weight: the kernels'
    flat layout). The one test here that CI runs on every JAX release (MLPParams as a pytree): the
    others differ in the activations' kernels, and the rules they go through are those
    tests/test_nn.py and tests/test_nn_second_order.py run there."""
    params = nn.mlp_init(jax.random.key(0), (3, 5, 2), activation="sine", output_activation="sigmoid")
    assert isinstance(params, nn.MLPParams) and len(params) == 2
    halved = jax.tree.map(lambda a: a.astype(jnp.float16), params)
    assert (halved.activation, halved.output_activation) == ("sine", "sigmoid")

    flat, unravel = ravel_pytree(params)
    want = jnp.concatenate([a.reshape(-1) for layer in params for a in (layer["bias"], layer["weight"])])
    np.testing.assert_array_equal(flat, want)
    assert unravel(flat).activation == "sine"

    optimizer = optax.adam(1e-2)
    state = optimizer.init(params)
    x = jax.random.uniform(jax.random.key(1), (16, 3))
    _, grads = nn.mlp_loss_and_grad(params, x, jnp.zeros((16, 2)))
    updates, state = optimizer.update(grads, state, params)
    stepped = optax.apply_updates(params, updates)
    assert isinstance(stepped, nn.MLPParams) and stepped.output_activation == "sigmoid"
    np.testing.assert_allclose(
        nn.mlp_apply(stepped, x), nn.mlp_apply_reference(stepped, x), rtol=1e-5, atol=1e-6
    )


@pytest.mark.one_device_kind
def test_a_list_of_layers_means_the_default_activations():
    params = nn.mlp_init(jax.random.key(2), (3, 5, 2))
    x = jax.random.uniform(jax.random.key(3), (8, 3), minval=-1.0, maxval=1.0)
    np.testing.assert_array_equal(nn.mlp_apply(params, x), nn.mlp_apply(list(params), x))
    assert (params.activation, params.output_activation) == ("leaky_relu", "none")


@pytest.mark.one_device_kind
@pytest.mark.parametrize("argument", ["activation", "output_activation"])
def test_unknown_activations_are_refused_listing_the_six(argument):
    with pytest.raises(ValueError, match=f"mlp_init: {argument} must be one of 'leaky_relu', 'relu', 'none'"):
        nn.mlp_init(jax.random.key(0), (3, 4), **{argument: "swish"})
    assert set(ACTIVATIONS) == {"leaky_relu", "relu", "none", "sigmoid", "tanh", "sine"}
