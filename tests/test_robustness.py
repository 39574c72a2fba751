"""Robustness: concurrent calls, long runs without memory growth, and property tests of the
function API against pure-JAX twins over shapes, broadcasting patterns and dtypes."""

from __future__ import annotations

import concurrent.futures
import resource

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import slax
from slax import examples, nn
from slax.testing import RELATIVE_TOLERANCE

FLOAT32 = RELATIVE_TOLERANCE["float32"]

EXAMPLES = {example.name: example for example in examples.EXAMPLES}


@pytest.fixture(scope="module")
def module():
    return slax.load_module(examples.MODULE)


@pytest.mark.slow
def test_concurrent_calls_from_threads(module):
    """Eight threads call eager and jitted Slang functions at once; each gets its own answer."""
    poly = slax.load_module("poly").polynomial
    jitted = jax.jit(lambda a, x: poly(a, 1.0, 0.0, x) + module.wave(x, x))

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(10):
            a = np.float32(rng.normal())
            x = rng.normal(size=(int(rng.integers(1, 300)),)).astype(np.float32)
            expected = a * x * x + x + np.asarray(EXAMPLES["wave"].twin(x, x))
            np.testing.assert_allclose(jitted(a, x), expected, rtol=FLOAT32, atol=FLOAT32 / 2)
            np.testing.assert_allclose(poly(a, 1.0, 0.0, x), a * x * x + x, rtol=1e-6, atol=1e-6)
        return True

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(8)))


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_ten_thousand_jitted_steps_do_not_grow_memory():
    """On the CPU path device memory is host memory (lavapipe), so peak RSS covers both."""
    params = nn.mlp_init(jax.random.key(0), (4, 16, 4))
    x = jax.random.uniform(jax.random.key(1), (256, 4))
    target = jnp.roll(x, 1, axis=-1)

    def step(params, _):
        loss, grads = nn.mlp_loss_and_grad(params, x, target)
        return jax.tree.map(lambda p, g: p - 1e-2 * g, params, grads), loss

    run = jax.jit(lambda p: jax.lax.scan(step, p, None, length=1000))
    params, _ = run(params)  # compile and warm up
    jax.block_until_ready(params)
    before = _peak_rss_mb()
    for _ in range(10):
        params, losses = run(params)
    jax.block_until_ready(params)
    growth = _peak_rss_mb() - before
    assert growth < 16, f"peak RSS grew by {growth:.1f} MB over 10,000 steps"
    assert np.isfinite(np.asarray(losses)).all()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=5),
    dtype=st.sampled_from(["float32", "float16"]),
    seed=st.integers(0, 2**31 - 1),
)
@pytest.mark.slow
@pytest.mark.one_device_kind  # broadcasting is slax's Python (each route's kernels: test_function.py)
def test_wave_broadcasts_like_numpy(module, shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    x, y = (jnp.asarray(rng.uniform(-1, 1, size=s), dtype) for s in shapes.input_shapes)
    got = module.wave(x, y)
    want = EXAMPLES["wave"].twin(x.astype(jnp.float32), y.astype(jnp.float32))
    assert got.shape == shapes.result_shape and got.dtype == dtype
    np.testing.assert_allclose(
        np.asarray(got, np.float32), want, rtol=RELATIVE_TOLERANCE[dtype], atol=RELATIVE_TOLERANCE[dtype]
    )
    gx, gy = jax.grad(lambda x, y: module.wave(x, y).astype(jnp.float32).sum(), argnums=(0, 1))(x, y)
    wx, wy = jax.grad(lambda x, y: EXAMPLES["wave"].twin(x, y).sum(), argnums=(0, 1))(
        x.astype(jnp.float32), y.astype(jnp.float32)
    )
    assert gx.shape == x.shape and gy.shape == y.shape
    scale = 1 + float(np.max(np.abs(wx), initial=0) + np.max(np.abs(wy), initial=0))
    np.testing.assert_allclose(np.asarray(gx, np.float32), wx, atol=RELATIVE_TOLERANCE[dtype] * scale)
    np.testing.assert_allclose(np.asarray(gy, np.float32), wy, atol=RELATIVE_TOLERANCE[dtype] * scale)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=2, max_side=4),
    seed=st.integers(0, 2**31 - 1),
)
@pytest.mark.slow
@pytest.mark.one_device_kind  # broadcasting is slax's Python (each route's kernels: test_function.py)
def test_vector_function_over_grids(module, shapes, seed):
    """float3 arguments: the trailing 3 is the vector, the broadcast grid leads."""
    rng = np.random.default_rng(seed)
    a, b = (jnp.asarray(rng.normal(size=s + (3,)), jnp.float32) for s in shapes.input_shapes[:2])
    s = jnp.asarray(rng.normal(size=shapes.input_shapes[2]), jnp.float32)
    got = module.twist(a, b, s)
    assert got.shape == shapes.result_shape + (3,)
    want = EXAMPLES["twist"].twin(*jnp.broadcast_arrays(a, b), jnp.broadcast_to(s, shapes.result_shape))
    np.testing.assert_allclose(got, want, rtol=FLOAT32, atol=FLOAT32)
    cotangent = jnp.asarray(rng.normal(size=got.shape), jnp.float32)
    grads = jax.vjp(module.twist, a, b, s)[1](cotangent)

    def twin(a, b, s):
        return EXAMPLES["twist"].twin(*jnp.broadcast_arrays(a, b), jnp.broadcast_to(s, shapes.result_shape))

    want_grads = jax.vjp(twin, a, b, s)[1](cotangent)
    for g, w, arg in zip(grads, want_grads, (a, b, s)):
        assert g.shape == arg.shape
        np.testing.assert_allclose(g, w, rtol=FLOAT32, atol=10 * FLOAT32)
