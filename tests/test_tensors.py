"""Slang functions with tensor parameters (slax/_tensors.py, shaders/slax/tensor.slang): SlangPy's
differentiable-tensor examples run from JAX with jax.grad equal to pure-JAX twins', under every
transformation, and bad input explained (shaders/slangpy_examples.slang)."""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import run_python

import slax
from slax.examples import TENSOR_EXAMPLES, TENSOR_MODULE, bilinear_twin
from slax.testing import RELATIVE_TOLERANCE, check_grads

TOLERANCE = RELATIVE_TOLERANCE["float32"]


@pytest.fixture(scope="module")
def mod():
    return slax.load_module("slangpy_examples")


@pytest.fixture(scope="module")
def bilinear():
    return slax.load_module(TENSOR_MODULE).bilinear


def close(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=TOLERANCE, atol=TOLERANCE)


def polynomial(mod, a, b, c, x):
    n = x.shape[0]
    return mod.polynomial(slax.grid((n,)), a, b, c, x, jax.ShapeDtypeStruct((n,), jnp.float32))


def test_polynomial_is_slangpys_example(mod):
    """SlangPy's documented numbers, then random inputs against the JAX twin (values, gradients of
    the scalars and of the tensor)."""
    x = jnp.array([1.0, 2.0, 3.0, 4.0])
    close(polynomial(mod, 2.0, 8.0, -1.0, x), [9.0, 23.0, 41.0, 63.0])
    close(jax.grad(lambda x: polynomial(mod, 2.0, 8.0, -1.0, x).sum())(x), [12.0, 16.0, 20.0, 24.0])
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (37,))
    a, b, c = jax.random.normal(keys[1], (3,))
    weights = jax.random.normal(keys[2], (37,))

    def loss(f):
        return lambda a, b, c, x: (f(a, b, c, x) * weights).sum()

    twin = lambda a, b, c, x: a * x * x + b * x + c  # noqa: E731
    slang = loss(lambda *args: polynomial(mod, *args))
    close(slang(a, b, c, x), loss(twin)(a, b, c, x))
    for got, want in zip(
        jax.grad(slang, (0, 1, 2, 3))(a, b, c, x), jax.grad(loss(twin), (0, 1, 2, 3))(a, b, c, x)
    ):
        close(got, want)


def test_linear_layer_is_slangpys_example(mod):
    keys = jax.random.split(jax.random.key(1), 4)
    weights, bias = jax.random.normal(keys[0], (6, 9)), jax.random.normal(keys[1], (6,))
    x, cotangent = jax.random.normal(keys[2], (9,)), jax.random.normal(keys[3], (6,))

    def slang(weights, bias, x):
        return mod.linear_layer(slax.grid((6,)), weights, bias, x, (6,))

    def twin(weights, bias, x):
        return jnp.dot(weights, x, precision="highest") + bias

    close(slang(weights, bias, x), twin(weights, bias, x))
    got = jax.vjp(slang, weights, bias, x)[1](cotangent)
    want = jax.vjp(twin, weights, bias, x)[1](cotangent)
    for g, w in zip(got, want):
        close(g, w)


def test_custom_activation_writes_its_gradient_buffer(mod):
    """SlangPy's custom_activation: a custom backward derivative adding into `input._grad_out`."""
    x = jax.random.uniform(jax.random.key(2), (64,), minval=-0.5, maxval=1.5)
    weights = jax.random.normal(jax.random.key(3), (64,))

    def twin(x):
        return jnp.where(x <= 0, 0.0, jnp.where(x >= 1, 1.0, x * x * (3 - 2 * x)))

    def slang(x):
        return mod.custom_activation(slax.grid((64,)), x)

    close(slang(x), twin(x))
    close(jax.grad(lambda x: (slang(x) * weights).sum())(x), jax.grad(lambda x: (twin(x) * weights).sum())(x))


def test_buffer_read_through_a_custom_derivative(mod):
    """Slang's autodiff guide's pattern: parameters read by getParam, whose backward derivative adds
    into the gradient buffer and whose forward derivative reads the tangent buffer; every grid
    point reads the same two parameters."""
    params, tangent = jnp.array([0.7, -1.3]), jnp.array([0.4, 1.1])
    x = jax.random.normal(jax.random.key(4), (100,))
    target = 3.0 * x - 2.0
    loss = lambda f: lambda p: ((f(p) - target) ** 2).mean()  # noqa: E731
    slang, twin = loss(lambda p: mod.fit_line(p, x)), loss(lambda p: p[0] * x + p[1])
    close(slang(params), twin(params))
    close(jax.grad(slang)(params), jax.grad(twin)(params))
    close(jax.jvp(slang, (params,), (tangent,))[1], jax.jvp(twin, (params,), (tangent,))[1])


@pytest.fixture(scope="module")
def texture_and_uv():
    keys = jax.random.split(jax.random.key(5), 3)
    return (
        jax.random.uniform(keys[0], (5, 7, 3)),
        jax.random.uniform(keys[1], (50, 2)),
        jax.random.normal(keys[2], (50, 3)),
    )


def test_tensor_and_elementwise_arguments_mix(bilinear, texture_and_uv):
    """A texture (H, W, 3) read whole, uv (N, 2) over the grid: (N, 3); gradients of both."""
    texture, uv, weights = texture_and_uv
    close(bilinear(texture, uv), bilinear_twin(texture, uv))
    slang = jax.grad(lambda t, uv: (bilinear(t, uv) * weights).sum(), (0, 1))(texture, uv)
    twin = jax.grad(lambda t, uv: (bilinear_twin(t, uv) * weights).sum(), (0, 1))(texture, uv)
    for got, want in zip(slang, twin):
        close(got, want)


def test_vector_elements_vector_call_id_and_plain_tensors(mod):
    """float3 elements ((H, W, 3) arrays), an int2 call id (x is the last axis), and an ITensor
    input, whose gradient is zero."""
    keys = jax.random.split(jax.random.key(6), 3)
    albedo, light = jax.random.uniform(keys[0], (4, 6, 3)), jax.random.uniform(keys[1], (4, 6, 3))
    weights = jax.random.normal(keys[2], (4, 6, 3))

    def shade(albedo, light):
        return mod.shade(slax.grid((4, 6)), albedo, light, jax.ShapeDtypeStruct((4, 6, 3), jnp.float32))

    close(shade(albedo, light), albedo * light)
    d_albedo, d_light = jax.grad(lambda a, b: (shade(a, b) * weights).sum(), (0, 1))(albedo, light)
    close(d_light, albedo * weights)
    close(d_albedo, jnp.zeros_like(albedo))


def test_vector_elements_gradients_add_whole_elements():
    """float4, float3 and float2 elements gathered by 4096 calls at 16, 9 and 9 indices (hundreds of
    calls adding into each element, atomically on a GPU; float3 elements at odd indices start 4
    bytes past an 8-byte boundary): the gradients are JAX's scatter-add, under jit."""
    gather = slax.load_module(TENSOR_MODULE).gather_vectors
    keys = jax.random.split(jax.random.key(8), 8)
    n = 4096
    tensors = [jax.random.normal(k, shape) for k, shape in zip(keys, [(16, 4), (9, 3), (9, 2)])]
    i, j = jax.random.randint(keys[3], (n,), 0, 16), jax.random.randint(keys[4], (n,), 0, 9)
    weights = [jax.random.normal(k, (n, size)) for k, size in zip(keys[5:], (4, 3, 2))]

    def twin(colours, normals, pairs):
        return sum((t[at] * w).sum(-1) for t, at, w in zip((colours, normals, pairs), (i, j, j), weights))

    def slang(colours, normals, pairs):
        return gather(colours, normals, pairs, i, j, *weights)

    close(slang(*tensors), twin(*tensors))
    got = jax.jit(jax.grad(lambda *t: slang(*t).sum(), (0, 1, 2)))(*tensors)
    want = jax.grad(lambda *t: twin(*t).sum(), (0, 1, 2))(*tensors)
    for g, w in zip(got, want):
        close(g, w)


def test_jit_vmap_scan_and_pytrees(mod, bilinear, texture_and_uv):
    """vmap over the tensor and over the element-wise argument (one launch each), lax.scan, and a
    dict of parameters through jax.grad, all under jit."""
    texture, uv, weights = texture_and_uv
    textures = jnp.stack([texture, 1.0 - texture])
    batched = jax.jit(jax.vmap(bilinear, in_axes=(0, None)))(textures, uv)
    close(batched, jax.vmap(bilinear_twin, in_axes=(0, None))(textures, uv))
    per_uv = jax.jit(jax.vmap(bilinear, in_axes=(None, 0)))(texture, uv.reshape(5, 10, 2))
    close(per_uv, bilinear_twin(texture, uv).reshape(5, 10, 3))
    # per-example gradients of a shared tensor, and a vmapped written tensor
    grads = jax.vmap(jax.grad(lambda t, uv: (bilinear(t, uv) * weights[:10]).sum()), (None, 0))(
        texture, uv.reshape(5, 10, 2)
    )
    want = jax.vmap(jax.grad(lambda t, uv: (bilinear_twin(t, uv) * weights[:10]).sum()), (None, 0))(
        texture, uv.reshape(5, 10, 2)
    )
    close(grads, want)
    xs = jax.random.normal(jax.random.key(7), (3, 8))
    close(jax.vmap(lambda x: polynomial(mod, 2.0, 8.0, -1.0, x))(xs), 2 * xs * xs + 8 * xs - 1)

    def step(params, uv):
        loss = lambda p: ((bilinear(p["texture"], uv) - 0.5) ** 2).sum()  # noqa: E731
        grad = jax.grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grad), loss(params)

    def twin_step(params, uv):
        loss = lambda p: ((bilinear_twin(p["texture"], uv) - 0.5) ** 2).sum()  # noqa: E731
        grad = jax.grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grad), loss(params)

    batches = uv.reshape(5, 10, 2)
    got = jax.jit(lambda p: jax.lax.scan(step, p, batches))({"texture": texture})
    want = jax.lax.scan(twin_step, {"texture": texture}, batches)
    close(got[1], want[1])
    close(got[0]["texture"], want[0]["texture"])


@pytest.mark.one_device_kind  # slax.testing's Python around bilinear, whose kernels run on every route in
# test_tensor_and_elementwise_arguments_mix (reverse mode) and test_jvp_through_tensors_matches_twins
def test_check_grads_covers_tensor_examples(rng):
    """slax.testing.check_grads on each function of shaders/tensor_examples.slang (forward and
    reverse mode), as experiments/gradcheck.py runs it."""
    module = slax.load_module(TENSOR_MODULE)
    for example in TENSOR_EXAMPLES:
        args = example.draw(rng, jnp.float32)
        report = check_grads(getattr(module, example.name), example.twin, *args)
        assert report.passed, report
        assert {row.argument for row in report.rows if row.check == "rev"} == {"texture", "uv"}
        assert any(row.check == "fwd" for row in report.rows)


def test_indices_outside_a_tensor_are_clamped(mod):
    """No route reads outside the array: an index past an axis's end, or negative, reads the last
    element along that axis."""
    values = jax.random.normal(jax.random.key(8), (3, 4))
    at = jnp.array([[1, 2], [7, 1], [-1, 0], [2, 9], [-5, -5]], jnp.int32)  # (x: column, y: row)
    want = values[jnp.array([2, 1, 0, 2, 2]), jnp.array([1, 3, 3, 2, 3])]
    close(mod.read_at(values, at), want)


def test_debug_bounds_names_the_parameter_and_the_index(mod, monkeypatch):
    values = jax.random.normal(jax.random.key(9), (3, 4))
    inside = jnp.array([[1, 2], [3, 0]], jnp.int32)
    outside = jnp.array([[1, 2], [3, 5]], jnp.int32)  # row 5 of 3
    with slax.config.override(debug_bounds=True):
        close(mod.read_at(values, inside), values[inside[:, 1], inside[:, 0]])
        with pytest.raises(
            IndexError,
            match=r"'read_at' indexed its tensor parameter 'values' \(shape \(3, 4\)\) at 5 on axis 0",
        ):
            jax.block_until_ready(mod.read_at(values, outside))
        message = r"IndexError: slax: Slang function 'read_at'"
        with pytest.raises(jax.errors.JaxRuntimeError, match=message):
            jax.block_until_ready(jax.jit(jax.vmap(mod.read_at, (None, 0)))(values, outside[None]))
    close(mod.read_at(values, outside), values[jnp.array([2, 2]), jnp.array([1, 3])])  # off: clamped


def test_debug_bounds_records_one_whole_fault_of_many(mod, rng):
    """2^14 threads, a third of them indexing outside on one axis or the other, in a launch that
    SlangPy's CPU device runs over several worker threads (slax/_cpu_dispatch.h): the error names
    one of the faults as it happened, its index outside the axis it names, never one fault's axis
    with another's index."""
    values = jax.random.normal(jax.random.key(11), (3, 4))
    at = np.stack([rng.integers(0, 4, 1 << 14), rng.integers(0, 3, 1 << 14)], axis=1).astype(np.int32)
    faulty = rng.random(1 << 14) < 1 / 3
    at[faulty, 0] = rng.integers(4, 1000, faulty.sum())  # x past its 4 columns ...
    rows = faulty & (rng.random(1 << 14) < 0.5)
    at[rows, 0] = rng.integers(0, 4, rows.sum())
    at[rows, 1] = rng.integers(1000, 2000, rows.sum())  # ... or y past its 3 rows, far from any x
    with slax.config.override(debug_bounds=True), pytest.raises(IndexError) as raised:
        jax.block_until_ready(mod.read_at(values, jnp.asarray(at)))
    index, axis = map(int, re.search(r"at (-?\d+) on axis (\d)", str(raised.value)).groups())
    faults = {(int(y), 0) for x, y in at if y >= 3} | {(int(x), 1) for x, y in at if x >= 4}
    assert (index, axis) in faults, str(raised.value)


def test_jvp_through_tensors_matches_twins(mod, bilinear, texture_and_uv):
    """jax.jvp carries tangent tensors through fwd_diff: an input tensor's tangent is read where
    the function reads it, a written tensor's tangent written where it writes; under jit and vmap."""
    texture, uv, _ = texture_and_uv
    keys = jax.random.split(jax.random.key(10), 4)
    dtexture, duv = jax.random.normal(keys[0], texture.shape), jax.random.normal(keys[1], uv.shape)
    jvp = jax.jit(jax.jvp, static_argnums=0)
    for got, want in zip(
        jvp(bilinear, (texture, uv), (dtexture, duv)), jax.jvp(bilinear_twin, (texture, uv), (dtexture, duv))
    ):
        close(got, want)
    textures, dtextures = jnp.stack([texture, 1.0 - texture]), jnp.stack([dtexture, -dtexture])
    batched = jax.vmap(lambda t, dt: jvp(lambda t: bilinear(t, uv), (t,), (dt,)))(textures, dtextures)
    want = jax.vmap(lambda t, dt: jax.jvp(lambda t: bilinear_twin(t, uv), (t,), (dt,)))(textures, dtextures)
    for got, expected in zip(batched, want):
        close(got, expected)

    x, dx = jax.random.normal(keys[2], (37,)), jax.random.normal(keys[3], (37,))
    scalars, dscalars = (0.7, -1.3, 0.4), (0.2, 1.1, -0.6)

    def slang(a, b, c, x):
        n = x.shape[0]
        return mod.polynomial_by_array(slax.grid((n,)), a, b, c, x, jax.ShapeDtypeStruct((n,), jnp.float32))

    twin = lambda a, b, c, x: a * x * x + b * x + c  # noqa: E731
    primals, tangents = (*scalars, x), (*dscalars, dx)
    for got, want in zip(jvp(slang, primals, tangents), jax.jvp(twin, primals, tangents)):
        close(got, want)
    close(jax.jacfwd(slang, 3)(*scalars, x[:5]), jax.jacfwd(twin, 3)(*scalars, x[:5]))

    albedo, light = jax.random.uniform(keys[0], (4, 6, 3)), jax.random.uniform(keys[1], (4, 6, 3))
    dalbedo, dlight = jax.random.normal(keys[2], (4, 6, 3)), jax.random.normal(keys[3], (4, 6, 3))
    shade = lambda a, b: mod.shade(slax.grid((4, 6)), a, b, (4, 6, 3))  # noqa: E731
    close(jvp(shade, (albedo, light), (dalbedo, dlight))[1], albedo * dlight)  # albedo is an ITensor


@pytest.mark.one_device_kind
def test_forward_mode_that_would_drop_a_tangent_raises(mod):
    """SlangPy's rank-specific index forms (`x[idx]`, `result[idx] = ...`) have no forward
    derivative that carries a tangent: jax.jvp raises, naming the function and the parameter,
    rather than return zeros, whether the load's tangent or the store's would be lost."""
    x = jnp.array([1.0, 2.0, 3.0, 4.0])
    message = r"'polynomial' would drop the tangent of its tensor parameter 'x'"
    with pytest.raises(NotImplementedError, match=message):
        jax.jvp(lambda x: polynomial(mod, 2.0, 8.0, -1.0, x), (x,), (x,))
    with pytest.raises(NotImplementedError, match=r"'polynomial' would drop the tangent"):
        jax.jvp(lambda a: polynomial(mod, a, 8.0, -1.0, x), (2.0,), (1.0,))


@pytest.mark.one_device_kind
def test_second_derivatives_through_tensors_are_refused(bilinear, texture_and_uv):
    texture, uv, _ = texture_and_uv
    message = r"second derivatives .* 'bilinear' .* tensor parameter\(s\) 'texture'"
    with pytest.raises(NotImplementedError, match=message):
        jax.jacfwd(jax.grad(lambda t: bilinear(t, uv[:2]).sum()))(texture)


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda m, b, x: b(x[..., None], x[0, :, :2]),
            ValueError,
            r"'texture'.*must have 3 dims \(a tensor",
        ),
        (
            lambda m, b, x: b(x.astype(jnp.int32), x[0, :, :2]),
            TypeError,
            r"dtype must be float32; got int32",
        ),
        (lambda m, b, x: b(x[0], x[0, :, :2]), ValueError, r"'texture'.*got shape \(7, 3\)"),
        (
            lambda m, b, x: m.polynomial(slax.grid((4,)), 1.0, 1.0, 1.0, x[0, :4, 0], x[0, :4, 0]),
            TypeError,
            "'result'.*pass its shape",
        ),
        (
            lambda m, b, x: m.polynomial(slax.grid((4, 2)), 1.0, 1.0, 1.0, x[0, :4, 0], (4,)),
            TypeError,
            r"'idx'.*slax.grid\(\(4, 2\)\)",
        ),
        (
            lambda m, b, x: m.scale_in_place(slax.grid((4,)), x[0, :4, 0]),
            TypeError,
            "'data' of Slang function 'scale_in_place'.*in place",
        ),
        (
            lambda m, b, x: m.concrete_tensor(slax.grid((5, 7)), x, (5, 7, 3)),
            TypeError,
            "'albedo'.*StructuredBuffer",
        ),
        (
            lambda m, b, x: m.concrete_activation(slax.grid((4,)), x[0, :4, 0]),
            TypeError,
            r"'input' of Slang function 'concrete_activation' has type 'DiffTensor<float, 1>'.*"
            r"Declare it SlaxDiffTensor<float, 1> instead",
        ),
    ],
)
def test_bad_input_explains_itself(mod, bilinear, texture_and_uv, call, error, message):
    with pytest.raises(error, match=message):
        call(mod, bilinear, texture_and_uv[0])


@pytest.mark.one_device_kind
def test_a_grid_past_uint_indices_is_refused_before_its_coordinates_exist(mod):
    """A launch numbers its threads with a 32-bit uint (docs/functions.md, Sizes): under jax.jit a
    grid of 2**32 points was refused, but outside it the call first built the grid's coordinates
    (16 GiB of int32) and the process was killed. slax.grid refuses more points than a launch
    reaches, and a call refuses a grid whose coordinates (two per point of an ``int2``) would pass
    2**32 - 1 elements, before building them, eagerly and under jax.jit."""
    for shape in [(2**32,), (2**16, 2**16), (3, 2**31)]:
        with pytest.raises(ValueError, match=r"slax.grid: shape .* points, more than one launch reaches"):
            slax.grid(shape)
    slax.grid((2**32 - 1,))  # the largest grid: only its description exists
    grid = slax.grid((2**15, 2**16))  # 2**31 points, each two int32 coordinates: 2**32 of them
    albedo, light = jnp.ones((4, 6, 3)), jnp.ones((4, 6, 3))
    message = r"argument 'pixel' of shade\(\).*slax.grid\(\(32768, 65536\)\).*4,294,967,296 coordinates"
    with pytest.raises(ValueError, match=message):
        mod.shade(grid, albedo, light, (4, 6, 3))
    with pytest.raises(ValueError, match=message):
        jax.jit(lambda a, b: mod.shade(grid, a, b, (4, 6, 3))).lower(albedo, light)


@pytest.mark.one_device_kind
def test_a_grid_of_no_axes_is_refused():
    """``slax.grid(())`` was taken, and its call then asked for a parameter 'int0, uint0, int[0] or
    uint[0]', types Slang does not have."""
    with pytest.raises(ValueError, match=r"slax.grid: shape must have at least one axis; got \(\)"):
        slax.grid(())


@pytest.mark.jax_version
@pytest.mark.one_device_kind  # replicating tensors and summing their gradients is slax's Python and XLA's
# partitioning; each route's tensor kernels: the tests above, and sharded values reach them as tensor
# arguments in tests/test_sharding.py's test_sharded_values_reach_slang_by_every_path
@pytest.mark.slow
def test_sharded_calls_replicate_tensors_and_sum_their_gradients_once(cpu_path):
    """shard_map and plain jit over a batch-sharded array on two host devices
    (tests/scripts/tensors_sharded.py)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    result = run_python("tests/scripts/tensors_sharded.py", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ("shard_map: ok", "batch-sharded jit: ok", "written tensor: ok"):
        assert line in result.stdout


_CALL_A_TENSOR_FUNCTION = """
import jax, jax.numpy as jnp, slax
mod = slax.load_module("slangpy_examples")
x = jnp.arange(4.0)
print(mod.polynomial(slax.grid((4,)), 2.0, 8.0, -1.0, x, jax.ShapeDtypeStruct((4,), jnp.float32)))
"""


@pytest.mark.slow
@pytest.mark.one_device_kind
def test_tensor_kernels_compile_without_slang_warnings(tmp_path):
    """shaders/slax/tensor.slang, which every kernel with a tensor parameter imports, compiles
    without a Slang warning where SLAX_CUDA_ARCH is not defined (Slang's preprocessor evaluates both
    sides of `&&` in an `#if` and warns of the undefined name, E15205): a fresh cache, so the
    kernel compiles in the child."""
    env = {**os.environ, "SLAX_CACHE_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    result = run_python("-c", _CALL_A_TENSOR_FUNCTION, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[-1.  9. 23. 41.]" in result.stdout, result.stdout
    assert "warning" not in (result.stdout + result.stderr).lower(), result.stderr
