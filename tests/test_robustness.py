"""Robustness: concurrent calls, long runs without memory growth, and property tests of the
function API against pure-JAX twins over shapes, broadcasting patterns and dtypes."""

from __future__ import annotations

import concurrent.futures
import functools
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


SIZES = (1, 2, 17, 64, 100, 128, 255, 299)


@pytest.mark.slow
def test_concurrent_calls_from_threads(module):
    """Eight threads call eager and jitted Slang functions at once; each gets its own answer. Batch
    sizes come from eight, so that threads trace, compile and launch the same calls at once; any
    size from 1 to 300 compiled XLA's programs for 80 sizes, most of the test's time."""
    poly = slax.load_module("poly").polynomial
    jitted = jax.jit(lambda a, x: poly(a, 1.0, 0.0, x) + module.wave(x, x))

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(10):
            a = np.float32(rng.normal())
            x = rng.normal(size=(int(rng.choice(SIZES)),)).astype(np.float32)
            expected = a * x * x + x + np.asarray(EXAMPLES["wave"].twin(x, x))
            np.testing.assert_allclose(jitted(a, x), expected, rtol=FLOAT32, atol=FLOAT32 / 2)
            np.testing.assert_allclose(poly(a, 1.0, 0.0, x), a * x * x + x, rtol=1e-6, atol=1e-6)
        return True

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(8)))


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.slow
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
    """Each example is a new broadcast pattern, so a new kernel (slax generates one per pattern and
    dtype): that compile is the example's intrinsic cost. The rest runs jitted, one XLA compile an
    example where eager dispatch compiled each of the twin's operations for each new shape (half an
    example's time); slax's broadcasting runs the same under jit, when its calls are traced."""
    rng = np.random.default_rng(seed)
    x, y = (jnp.asarray(rng.uniform(-1, 1, size=s), dtype) for s in shapes.input_shapes)
    got, want, (gx, gy), (wx, wy) = _wave_and_twin(module.wave, x, y)
    assert got.shape == shapes.result_shape and got.dtype == dtype
    np.testing.assert_allclose(
        np.asarray(got, np.float32), want, rtol=RELATIVE_TOLERANCE[dtype], atol=RELATIVE_TOLERANCE[dtype]
    )
    assert gx.shape == x.shape and gy.shape == y.shape
    scale = 1 + float(np.max(np.abs(wx), initial=0) + np.max(np.abs(wy), initial=0))
    np.testing.assert_allclose(np.asarray(gx, np.float32), wx, atol=RELATIVE_TOLERANCE[dtype] * scale)
    np.testing.assert_allclose(np.asarray(gy, np.float32), wy, atol=RELATIVE_TOLERANCE[dtype] * scale)


@functools.partial(jax.jit, static_argnums=0)
def _wave_and_twin(wave, x, y):
    """wave, its twin (in float32), and the gradients of both sums."""
    twin = EXAMPLES["wave"].twin
    x32, y32 = x.astype(jnp.float32), y.astype(jnp.float32)
    grads = jax.grad(lambda x, y: wave(x, y).astype(jnp.float32).sum(), argnums=(0, 1))(x, y)
    twin_grads = jax.grad(lambda x, y: twin(x, y).sum(), argnums=(0, 1))(x32, y32)
    return wave(x, y), twin(x32, y32), grads, twin_grads


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=2, max_side=4),
    seed=st.integers(0, 2**31 - 1),
)
@pytest.mark.slow
@pytest.mark.one_device_kind  # broadcasting is slax's Python (each route's kernels: test_function.py)
def test_vector_function_over_grids(module, shapes, seed):
    """float3 arguments: the trailing 3 is the vector, the broadcast grid leads. Jitted, as the
    test above is: one XLA compile an example besides the new pattern's kernel."""
    rng = np.random.default_rng(seed)
    a, b = (jnp.asarray(rng.normal(size=s + (3,)), jnp.float32) for s in shapes.input_shapes[:2])
    s = jnp.asarray(rng.normal(size=shapes.input_shapes[2]), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=shapes.result_shape + (3,)), jnp.float32)
    got, want, grads, want_grads = _twist_and_twin(module.twist, a, b, s, cotangent)
    assert got.shape == shapes.result_shape + (3,)
    np.testing.assert_allclose(got, want, rtol=FLOAT32, atol=FLOAT32)
    for g, w, arg in zip(grads, want_grads, (a, b, s)):
        assert g.shape == arg.shape
        np.testing.assert_allclose(g, w, rtol=FLOAT32, atol=10 * FLOAT32)


@functools.partial(jax.jit, static_argnums=0)
def _twist_and_twin(twist, a, b, s, cotangent):
    """twist and its twin over the broadcast grid, and both pullbacks of the cotangent."""

    def twin(a, b, s):
        grid = jnp.broadcast_shapes(a.shape[:-1], b.shape[:-1], s.shape)
        return EXAMPLES["twist"].twin(
            jnp.broadcast_to(a, grid + (3,)), jnp.broadcast_to(b, grid + (3,)), jnp.broadcast_to(s, grid)
        )

    got, pullback = jax.vjp(twist, a, b, s)
    want, twin_pullback = jax.vjp(twin, a, b, s)
    return got, want, pullback(cotangent), twin_pullback(cotangent)
