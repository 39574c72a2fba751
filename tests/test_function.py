"""Slang functions as JAX functions (slax/_function.py, slax/_function_primitives.py): values, grad, jvp,
vmap."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import parameter_product

import slax
from slax import _compile, examples
from slax.testing import check_grads

JAX_VERSION_EXAMPLE = "energy"
"""The example whose comparisons with its twin CI runs on every JAX release, in float32 (a struct, a
vector and a scalar: every kind of leaf the rules move); the other examples and float16 exercise the
same rules, and differ in the kernels slax generates, which no JAX release changes."""


@pytest.fixture(scope="module")
def poly():
    return slax.load_module("poly").polynomial


@pytest.fixture(scope="module")
def fns():
    return slax.load_module(examples.MODULE)


# --- the SlangPy tutorial polynomial -------------------------------------------------------------


@pytest.mark.jax_version
def test_polynomial_values_and_gradient(poly):
    x = jnp.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(poly(2.0, 8.0, -1.0, x), [9, 23, 41, 63])
    np.testing.assert_array_equal(poly(a=2.0, b=8.0, c=-1.0, x=x), [9, 23, 41, 63])
    dx = jax.grad(lambda x: poly(2.0, 8.0, -1.0, x).sum())(x)
    np.testing.assert_array_equal(dx, [12, 16, 20, 24])


@pytest.mark.parametrize("shape", [(), (5,), (3, 4, 5)])
def test_polynomial_random_shapes(poly, rng, shape):
    x = rng.normal(size=shape).astype(np.float32)
    a, b, c = rng.normal(size=3).astype(np.float32)
    np.testing.assert_allclose(poly(a, b, c, x), a * x * x + b * x + c, rtol=1e-6, atol=1e-6)
    grads = jax.grad(lambda *args: poly(*args).sum(), argnums=(0, 1, 2, 3))(a, b, c, jnp.asarray(x))
    expected = [np.sum(x * x), np.sum(x), np.float32(x.size), 2 * a * x + b]
    for got, want in zip(grads, expected):
        assert np.shape(got) == np.shape(want)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.jax_version
def test_broadcast_argument_gradient_is_reduced(poly, rng):
    a = jnp.asarray(rng.normal(size=(3, 1)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(4,)), jnp.float32)
    y = poly(a, 1.0, 0.5, x)
    assert y.shape == (3, 4)
    da, dx = jax.grad(lambda a, x: poly(a, 1.0, 0.5, x).sum(), argnums=(0, 1))(a, x)
    assert da.shape == (3, 1) and dx.shape == (4,)
    np.testing.assert_allclose(da, np.broadcast_to(np.sum(x * x), (3, 1)), rtol=1e-5)
    np.testing.assert_allclose(dx, np.sum(2 * a * x + 1.0, axis=0), rtol=1e-5)


@pytest.mark.jax_version
def test_jvp_and_jacobians(poly, rng):
    x = jnp.asarray(rng.normal(size=(6,)), jnp.float32)
    t = jnp.asarray(rng.normal(size=(6,)), jnp.float32)
    _, tangent = jax.jvp(lambda x: poly(2.0, 8.0, -1.0, x), (x,), (t,))
    np.testing.assert_allclose(tangent, (4 * x + 8) * t, rtol=1e-6)
    np.testing.assert_allclose(
        jax.jacfwd(lambda x: poly(2.0, 8.0, -1.0, x))(x), np.diag(4 * x + 8), rtol=1e-6
    )
    np.testing.assert_allclose(
        jax.jacrev(lambda x: poly(2.0, 8.0, -1.0, x))(x), np.diag(4 * x + 8), rtol=1e-6
    )


@pytest.mark.jax_version
def test_vmap_in_axes_and_nesting(poly, rng):
    a = jnp.asarray(rng.normal(size=(3,)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
    y = jax.vmap(lambda a, x: poly(a, 1.0, 2.0, x), in_axes=(0, 1))(a, x)
    np.testing.assert_allclose(y, (a[:, None] * x.T**2 + x.T + 2.0), rtol=1e-6)
    nested = jax.vmap(jax.vmap(lambda a, x: poly(a, 1.0, 2.0, x), in_axes=(None, 0)), in_axes=(0, None))(
        a, x[:, 0]
    )
    np.testing.assert_allclose(nested, a[:, None] * x[None, :, 0] ** 2 + x[None, :, 0] + 2.0, rtol=1e-6)
    grad = jax.vmap(jax.grad(lambda a, x: poly(a, 1.0, 2.0, x).sum()), in_axes=(0, 1))(a, x)
    np.testing.assert_allclose(grad, np.sum(x.T**2, axis=1), rtol=1e-5)


@pytest.mark.jax_version
def test_scan_and_compile_once(poly, rng):
    x = jnp.asarray(rng.uniform(-1, 1, size=(8,)), jnp.float32)
    run = jax.jit(lambda x: jax.lax.scan(lambda y, _: (poly(0.1, 0.5, 0.0, y), None), x, None, length=50)[0])
    expected = np.asarray(x)
    for _ in range(50):
        expected = 0.1 * expected**2 + 0.5 * expected
    np.testing.assert_allclose(run(x), expected, rtol=1e-5, atol=1e-7)
    compiled = len(_compile._kernels)
    poly(0.1, 0.5, 0.0, x)
    poly(0.2, 0.5, 0.0, x + 1)
    poly(0.2, 0.5, 0.0, jnp.ones(13))
    assert len(_compile._kernels) <= compiled + 1, "same-rank calls compiled new kernels"
    poly(0.3, 0.5, 0.0, jnp.ones(13))
    assert len(_compile._kernels) <= compiled + 1


# --- the test functions against pure-JAX twins -----------------------------------------------------


EXAMPLES = {example.name: example for example in examples.EXAMPLES}


TRANSFORMS, DTYPES = ["eager", "jit", "vmap"], [jnp.float32, jnp.float16]
ON_EVERY_ROUTE = {
    (TRANSFORMS[i % len(TRANSFORMS)], name, DTYPES[i % len(DTYPES)]) for i, name in enumerate(EXAMPLES)
}
"""The twin comparisons that run on every device kind: each example once, every transform and dtype
among them. The others run on one kind, Vulkan where it is under test (lavapipe compiles these
kernels several times faster than the CPU device's C++ compiler): they differ by route only in the
kernels each route compiles from the same Slang, which these compile for every example on every
route (and the rules around them are the same on every route)."""


def _twin_marks(case):
    transform, name, dtype = case
    marks = [pytest.mark.jax_version] * ((name, dtype) == (JAX_VERSION_EXAMPLE, jnp.float32))
    return marks + [pytest.mark.one_device_kind("vulkan")] * (case not in ON_EVERY_ROUTE)


@pytest.mark.parametrize(
    ("transform", "name", "dtype"), parameter_product(TRANSFORMS, list(EXAMPLES), DTYPES, marks=_twin_marks)
)
def test_against_jax_twin(fns, rng, name, dtype, transform):
    example = EXAMPLES[name]
    twin, args = example.twin, example.draw(rng, dtype)
    slang = getattr(fns, name)
    if transform == "jit":
        slang, twin = jax.jit(slang), jax.jit(twin)
    elif transform == "vmap":
        args = jax.tree.map(lambda leaf: jnp.stack([leaf, leaf * 0.75]), args)
        slang, twin = jax.vmap(slang), jax.vmap(twin)
    report = check_grads(slang, twin, *args, modes=("fwd", "rev"), raises=True)
    assert len(report.rows) >= 3


def test_custom_backward_derivative_is_used(fns):
    """softplus_backward returns dy * sigmoid(x): a wrong body here would fail the twin test too,
    and this pins a value: d/dx softplus(0) = 0.5."""
    np.testing.assert_allclose(jax.grad(lambda x: fns.softplus(x))(jnp.float32(0.0)), 0.5, rtol=1e-7)


@pytest.mark.jax_version
def test_no_diff_argument_gets_zero_gradient(fns):
    d_exponent, d_x = jax.grad(lambda e, x: fns.power_of(e, x).sum(), argnums=(0, 1))(1.7, jnp.ones(3))
    assert d_exponent == 0.0 and np.all(np.asarray(d_x) != 0.0)


@pytest.mark.jax_version
def test_out_parameter_comes_back_as_tuple(fns, rng):
    x, y = rng.normal(size=(2, 10)).astype(np.float32)
    radius, angle = fns.to_polar(x, y)
    np.testing.assert_allclose(radius, np.hypot(x, y), rtol=1e-6)
    np.testing.assert_allclose(angle, np.arctan2(y, x), rtol=1e-5, atol=1e-6)


@pytest.mark.jax_version
def test_integer_and_fixed_array_arguments(fns, rng):
    values = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
    count = jnp.array([1, 2, 4], jnp.int32)
    expected = [np.sum(np.asarray(values)[i, :c] ** 2) for i, c in enumerate([1, 2, 4])]
    np.testing.assert_allclose(fns.fixed_sum(values, count), expected, rtol=1e-6)
    grad_values, grad_count = jax.grad(
        lambda v, c: fns.fixed_sum(v, c).sum(), argnums=(0, 1), allow_int=True
    )(values, count)
    mask = np.arange(4)[None, :] < np.array([1, 2, 4])[:, None]
    np.testing.assert_allclose(grad_values, 2 * np.asarray(values) * mask, rtol=1e-6)
    assert grad_count.dtype == jax.dtypes.float0
    np.testing.assert_array_equal(fns.add_ints(jnp.arange(4, dtype=jnp.int32), 10), [10, 11, 12, 13])


@pytest.mark.jax_version
def test_non_differentiable_function(fns):
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(fns.plain_square(x), [0, 1, 4])
    with pytest.raises(TypeError, match="'plain_square' is not differentiable.*\\[Differentiable\\]"):
        jax.grad(lambda x: fns.plain_square(x).sum())(x)


@pytest.mark.jax_version
def test_empty_grid_returns_empty(poly):
    assert poly(1.0, 2.0, 3.0, jnp.zeros((0, 4))).shape == (0, 4)
    assert jax.jit(poly)(1.0, 2.0, 3.0, jnp.zeros((0, 4))).shape == (0, 4)
    assert jax.grad(lambda x: poly(1.0, 2.0, 3.0, x).sum())(jnp.zeros((0, 4))).shape == (0, 4)


# --- errors ---------------------------------------------------------------------------------------


REFUSED = pytest.mark.one_device_kind
"""For the refusals slax's Python makes before any kernel runs: the same on every route."""


@REFUSED
def test_shapes_that_do_not_broadcast(poly):
    with pytest.raises(ValueError, match=r"do not broadcast.*a: \(3,\).*x: \(4,\)"):
        poly(jnp.ones(3), 1.0, 1.0, jnp.ones(4))


@REFUSED
def test_wrong_trailing_dim_for_float3(fns):
    with pytest.raises(
        ValueError,
        match=r"argument 'a' of twist\(\) is Slang 'vector<float,3>'.*end in \(3,\).*\(5, 4\)",
    ):
        fns.twist(jnp.ones((5, 4)), jnp.ones((5, 3)), 1.0)


@REFUSED
def test_wrong_rank(fns):
    with pytest.raises(ValueError, match=r"argument 'm' of matvec\(\).*end in \(3, 4\).*got shape \(4,\)"):
        fns.matvec(jnp.ones(4), jnp.ones(4))


@REFUSED
def test_wrong_dtype(poly):
    with pytest.raises(TypeError, match=r"argument 'x' of polynomial\(\).*needs dtype float32; got int32"):
        poly(1.0, 1.0, 1.0, jnp.arange(3))


@REFUSED
@pytest.mark.parametrize(
    ("argument", "error", "message"),
    [
        (3.9, TypeError, r"'b' of add_ints\(\) \(Slang 'int'\) is an integer .* non-integral value 3.9"),
        (np.float32(2.5), TypeError, r"'b' of add_ints\(\).*non-integral value 2.5"),
        (jnp.asarray(0.5), TypeError, r"'b' of add_ints\(\).*non-integral value 0.5"),
        (
            2**31,
            ValueError,
            r"'b' of add_ints\(\).*int32 values from -2147483648 to 2147483647; got 2147483648",
        ),
        (None, TypeError, r"'b' of add_ints\(\) \(Slang 'int'\) is None"),
        (1j, TypeError, r"'b' of add_ints\(\).*real numbers"),
    ],
)
def test_numbers_an_int_parameter_would_change_are_refused(fns, argument, error, message):
    """A Python float for a Slang int once ran truncated (3.9 as 3) while a float array was refused."""
    with pytest.raises(error, match=message):
        fns.add_ints(jnp.arange(3, dtype=jnp.int32), argument)


def test_whole_numbers_of_any_type_are_taken_exactly(fns):
    for whole in (4, 4.0, np.float32(4.0), np.int64(4), jnp.asarray(4.0)):
        np.testing.assert_array_equal(fns.add_ints(jnp.arange(3, dtype=jnp.int32), whole), [4, 5, 6])


@pytest.mark.jax_version
def test_traced_float_for_an_int_parameter_is_refused(fns):
    with pytest.raises(TypeError, match=r"'b' of add_ints\(\).*float traced by JAX"):
        jax.jit(lambda b: fns.add_ints(jnp.arange(3, dtype=jnp.int32), b))(3.9)
    np.testing.assert_array_equal(
        jax.jit(lambda b: fns.add_ints(jnp.arange(2, dtype=jnp.int32), b))(3), [3, 4]
    )


def test_negative_uint_none_and_overflow_name_the_argument(tmp_path, monkeypatch):
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path))
    module = slax.load_module_from_source(
        "uint_half_for_test",
        "uint add(uint a, uint b) { return a + b; }\nhalf twice(half h) { return h * 2; }\n",
    )
    with pytest.raises(
        ValueError, match=r"'b' of add\(\) \(Slang 'uint'\) takes uint32 values from 0 .* got -1"
    ):
        module.add(jnp.arange(3, dtype=jnp.uint32), -1)
    with pytest.raises(TypeError, match=r"'a' of add\(\) \(Slang 'uint'\) is None"):
        module.add(None, 1)
    with pytest.raises(
        ValueError, match=r"'h' of twice\(\).*float16, whose largest value is 65504.*got 100000.0"
    ):
        module.twice(1e5)
    np.testing.assert_array_equal(module.add(jnp.arange(3, dtype=jnp.uint32), 2**32 - 1), [2**32 - 1, 0, 1])
    # Traced, a Python int converts as JAX converts it: a loop index for a uint parameter runs.
    total = jax.lax.fori_loop(1, 4, lambda i, acc: module.add(acc, i), jnp.zeros(3, jnp.uint32))
    np.testing.assert_array_equal(total, [6, 6, 6])


@REFUSED
def test_struct_field_none_names_the_field(fns):
    with pytest.raises(TypeError, match=r"argument \"particle\['mass'\]\" of energy\(\).* is None"):
        fns.energy({"position": jnp.ones(3), "mass": None}, jnp.ones(3))


@REFUSED
def test_unknown_function(fns):
    with pytest.raises(AttributeError, match="has no function 'nonexistent'"):
        _ = fns.nonexistent


@REFUSED
def test_too_many_and_too_few_arguments(poly):
    with pytest.raises(TypeError, match=r"takes 4 argument\(s\) \(a, b, c, x\) but 5 were given"):
        poly(1.0, 2.0, 3.0, 4.0, 5.0)
    with pytest.raises(TypeError, match=r"missing argument\(s\): c, x"):
        poly(1.0, 2.0)


@REFUSED
def test_unknown_keyword(poly, fns):
    with pytest.raises(TypeError, match="unexpected keyword argument 'y'; its inputs are a, b, c, x"):
        poly(1.0, 2.0, 3.0, y=4.0)
    with pytest.raises(TypeError, match="'angle'.*`out` parameter"):
        fns.to_polar(1.0, 2.0, angle=3.0)


@REFUSED
def test_struct_field_errors_name_the_fields_own_type(fns):
    with pytest.raises(
        ValueError, match=r"\"particle\['position'\]\" of energy\(\) is Slang 'vector<float,3>', so its shape"
    ):
        fns.energy({"position": jnp.ones((2, 2)), "mass": jnp.ones(2)}, jnp.ones(3))
    with pytest.raises(
        TypeError, match=r"\"particle\['mass'\]\" of energy\(\) is Slang 'float', which needs"
    ):
        fns.energy({"position": jnp.ones((2, 3)), "mass": jnp.ones(2, jnp.int32)}, jnp.ones(3))


@pytest.mark.one_device_kind  # which fields Slang differentiates is its front end's, for every target;
# each route's kernels of a differentiable struct: test_against_jax_twin's energy
def test_a_struct_not_idifferentiable_is_constant_to_slang(tmp_path, monkeypatch):
    """README: Slang differentiates no field of a struct that does not conform to IDifferentiable;
    its gradients are zero, as a no_diff argument's, while a conforming twin's match jax.grad."""
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path))
    module = slax.load_module_from_source(
        "plain_struct_for_test",
        "struct Plain { float3 pos; float mass; };\n"
        "struct Body : IDifferentiable { float3 pos; float mass; };\n"
        "[Differentiable] float plain(Plain p) { return p.mass * dot(p.pos, p.pos); }\n"
        "[Differentiable] float body(Body b) { return b.mass * dot(b.pos, b.pos); }\n",
    )
    key_pos, key_mass = jax.random.split(jax.random.key(3))
    p = {"pos": jax.random.normal(key_pos, (5, 3)), "mass": jax.random.uniform(key_mass, (5,))}
    plain = jax.grad(lambda p: module.plain(p).sum())(p)
    assert not np.any(plain["pos"]) and not np.any(plain["mass"])
    body = jax.grad(lambda p: module.body(p).sum())(p)
    twin = jax.grad(lambda p: (p["mass"] * jnp.sum(p["pos"] ** 2, -1)).sum())(p)
    np.testing.assert_allclose(body["pos"], twin["pos"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(body["mass"], twin["mass"], rtol=1e-5, atol=1e-6)


@REFUSED
def test_struct_needs_its_fields(fns):
    with pytest.raises(TypeError, match=r"expected keys \['mass', 'position'\], got \['position'\]"):
        fns.energy({"position": jnp.ones(3)}, jnp.ones(3))


def test_module_from_source_and_item_access(tmp_path, monkeypatch):
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path))
    module = slax.load_module_from_source(
        "cube_for_test", "[Differentiable]\nfloat cube(float x) { return x * x * x; }\n"
    )
    x = jnp.array([1.0, 2.0, -3.0])
    np.testing.assert_array_equal(module["cube"](x), [1.0, 8.0, -27.0])
    np.testing.assert_array_equal(jax.grad(lambda x: module.cube(x).sum())(x), [3.0, 12.0, 27.0])
    signature = module.cube.signature(x)
    assert [p.name for p in signature.inputs] == ["x"] and signature.result is not None
    with pytest.raises(slax.SlangCompileError, match=r"broken_for_test\.slang[:(]2"):
        slax.load_module_from_source("broken_for_test", "float ok(float x) { return x; }\nfloat bad( {\n")


@pytest.mark.one_device_kind  # refused by slax's Python; the wrapper's kernel is a plain one
def test_overloaded_function_is_refused_naming_its_overloads(tmp_path, monkeypatch):
    """slax does not choose between overloads (an array of shape (n, 2) fits both of these); the
    refusal lists them, and a wrapper with a name of its own, as it advises, calls one."""
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path))
    module = slax.load_module_from_source(
        "overloaded_for_test",
        "[Differentiable] float twice(float x) { return x * 2; }\n"
        "[Differentiable] float twice(float2 x) { return x.x * 2 + x.y; }\n"
        "void twice(int x, out int y, inout float3 z) { y = x * 2; }\n"
        "[Differentiable] float twice_pair(float2 x) { return twice(x); }\n",
    )
    overloads = (
        r"float twice\(float x\); float twice\(vector<float,2> x\); "
        r"void twice\(int x, out int y, inout vector<float,3> z\)"
    )
    for access in (lambda: module.twice, lambda: module["twice"]):
        with pytest.raises(TypeError, match=rf"'twice' .* is overloaded \({overloads}\).*a name of its own"):
            access()
    x = jax.random.normal(jax.random.key(5), (4, 2))
    check_grads(module.twice_pair, lambda x: x[..., 0] * 2 + x[..., 1], x, raises=True)


@REFUSED
@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "", "1st", "with space", "-x", "c:\\x"])
def test_module_from_source_name_is_never_a_path(tmp_path, monkeypatch, name):
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"load_module_from_source: name must be a module name.*got"):
        slax.load_module_from_source(name, "float f(float x) { return x; }\n")
    assert not any(tmp_path.rglob("*.slang")), "a file was written"


@REFUSED
def test_module_from_source_needs_source_text(tmp_path, monkeypatch):
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path))
    with pytest.raises(TypeError, match="source must be Slang source text .* got NoneType"):
        slax.load_module_from_source("no_source", None)


@REFUSED
def test_unwritable_cache_directory_is_named(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path / "a_file" / "cache"))
    with pytest.raises(
        OSError, match=r"cannot write to its cache directory .*a_file/cache/sources.*SLAX_CACHE_DIR"
    ):
        slax.load_module_from_source("unwritable", "float f(float x) { return x; }\n")


@REFUSED
def test_module_path_with_a_backslash_is_refused_naming_it(tmp_path):
    folder = tmp_path / "back\\slash"
    folder.mkdir()
    (folder / "m.slang").write_text("float f(float x) { return x; }\n")
    with pytest.raises(ValueError, match=r"cannot open '.*back\\\\slash/m\.slang'"):
        slax.load_module(folder / "m.slang")


def test_grid_beyond_one_dispatch_row(poly):
    """More threads than one dispatch row (slax/kernel.slang: SLAX_ROW_THREADS) use a second row."""
    from slax._compile import ROW_THREADS

    x = jnp.arange(ROW_THREADS + 77, dtype=jnp.float32) * 1e-6
    y = np.asarray(poly(1.0, 2.0, 3.0, x))
    expected = np.asarray(x) ** 2 + 2 * np.asarray(x) + 3
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    np.testing.assert_allclose(y[ROW_THREADS:], expected[ROW_THREADS:], rtol=1e-6)


@REFUSED
def test_grids_past_uint_indices_are_refused_before_they_run(fns):
    """Generated kernels number threads and index elements with 32-bit uints: a grid of 2**32
    points, or 2**31 points of a float3 (2**32 * 3 / 2 elements), would wrap and compute the wrong
    elements. Refused when lowered (no memory is touched), naming the kernel and the shape; the
    largest buffer that fits lowers."""
    floats = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    with pytest.raises(ValueError, match=r"'slax_primal_softplus' would launch 4,294,967,296 threads"):
        jax.jit(fns.softplus).lower(floats(2**32))
    with pytest.raises(
        ValueError,
        match=r"'slax_primal_twist': its operand 0 has shape \(2147483648, 3\), 6,442,450,944 "
        r"elements, .* at most 4,294,967,295 elements each",
    ):
        jax.jit(fns.twist).lower(floats(2**31, 3), floats(2**31, 3), 1.0)
    jax.jit(fns.twist).lower(floats(2**32 // 3, 3), floats(2**32 // 3, 3), 1.0)


def test_dir_lists_the_modules_functions(fns, tmp_path, monkeypatch):
    """Tab completion: dir() holds every module-scope function, generic or not, and no struct
    member, call or attribute; each listed name is callable through the module."""
    declared = {example.name for example in examples.EXAMPLES}
    declared |= {"softplus_backward", "softplus_forward", "fixed_sum", "plain_square", "add_ints"}
    assert set(fns.function_names()) == declared
    assert declared <= set(dir(fns)) and {"kernel", "path"} <= set(dir(fns))
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path))
    source = (
        "struct Spring { float k; float energy(float x) { return 0.5 * k * x * x; } }\n"
        "/* float commented_out(float x); */\n"
        "[ForceInline]\n"
        "float spring_energy(Spring s, float x) { return s.energy(max(x, 0.0)); }\n"
    )
    module = slax.load_module_from_source("dir_for_test", source)
    assert module.function_names() == ["spring_energy"]
    assert isinstance(module.spring_energy, slax.SlangFunction)


def _sum_of_products(arity: int) -> str:
    params = ", ".join(f"float a{k}" for k in range(arity))
    body = " + ".join(f"a{k} * a{(k + 1) % arity}" for k in range(arity))
    return f"[Differentiable]\nfloat products({params}) {{ return {body}; }}\n"


def _products_twin(*args):
    return sum(args[k] * args[(k + 1) % len(args)] for k in range(len(args)))


def test_eight_arguments_differentiate_on_a_two_dimensional_grid(rng):
    """Arguments do not pay for the grid's rank: which axes an argument is broadcast along is
    compiled into the kernel, not passed per argument and axis (jvp here needs 17 pointers, which
    with strides overflowed Vulkan's 256 bytes of push constants)."""
    products = slax.load_module_from_source("products8", _sum_of_products(8)).products
    shapes = [(3, 5), (5,), (3, 1), (), (3, 5), (1, 5), (3, 5), (5,)]
    args = [jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in shapes]
    check_grads(products, _products_twin, *args, raises=True)


def test_too_many_arguments_for_push_constants_say_so(device_kind, rng):
    """Where a limit remains, the error names it: 24 arguments' jvp takes 49 pointers, beyond any
    Vulkan device's push constants; CUDA kernels take 4 KiB of arguments and the CPU device's are
    a C struct in memory, so there it runs."""
    products = slax.load_module_from_source("products24", _sum_of_products(24)).products
    args = [jnp.asarray(rng.normal(size=(4,)), jnp.float32) for _ in range(24)]
    if device_kind in ("cuda", "cpu"):
        check_grads(products, _products_twin, *args, raises=True)
        return
    assert np.allclose(products(*args), _products_twin(*args), rtol=1e-5)  # 25 pointers still fit
    with pytest.raises(
        slax.SlangCompileError, match=r"49 pointers and 2 scalars: \d+ bytes .* push constants"
    ):
        jax.jvp(products, tuple(args), tuple(args))


# --- derivatives declared elsewhere, one mode only, and generics over an interface ---------------


@pytest.fixture(scope="module")
def declared():
    return slax.load_module(pathlib.Path(__file__).with_name("slang") / "declared_derivatives.slang")


def _uniform(rng, *shape):
    return jnp.asarray(rng.uniform(-1, 1, size=shape), jnp.float32)


def test_derivatives_declared_by_other_functions_are_used(declared, rng):
    """``cube`` has a ``[BackwardDerivativeOf(cube)]`` and ``square`` a ``[ForwardDerivativeOf(square)]``
    elsewhere, and no attribute of their own: Slang differentiates each in that mode, and so does
    slax; the other mode is refused, naming the function and what to declare."""
    x = _uniform(rng, 6)
    check_grads(declared.cube, lambda x: x**3, x, modes=("rev",), raises=True)
    check_grads(declared.square, lambda x: x**2, x, modes=("fwd",), raises=True)
    with pytest.raises(
        TypeError, match=r"'cube' has reverse-mode derivatives only.*\[ForwardDerivativeOf\(cube\)\]"
    ):
        jax.jvp(declared.cube, (x,), (x,))
    with pytest.raises(
        TypeError, match=r"'square' has forward-mode derivatives only.*\[BackwardDerivativeOf\(square\)\]"
    ):
        jax.grad(lambda x: declared.square(x).sum())(x)


def test_forward_differentiable_function_says_it_has_no_reverse_mode(declared, rng):
    x = _uniform(rng, 6)
    check_grads(declared.forward_sine, jnp.sin, x, modes=("fwd",), raises=True)
    with pytest.raises(
        TypeError, match=r"'forward_sine' has forward-mode derivatives only \(it is \[ForwardDifferentiable\]"
    ):
        jax.grad(lambda x: declared.forward_sine(x).sum())(x)


def test_generic_over_an_interface_specialises_to_the_struct_named(declared, rng):
    """``scaled_area<T : IShape>``: a dict cannot say which struct it is, so the call names it
    (``specialize(T="Rectangle")``); without it the error names the interface and the remedy."""
    shape = {"width": _uniform(rng, 5), "height": _uniform(rng, 5)}
    scale = _uniform(rng, 5)
    with pytest.raises(
        TypeError, match=r"T is constrained to 'IShape'.*scaled_area\.specialize\(T=\"MyStruct\"\)"
    ):
        declared.scaled_area(shape, scale)
    rectangle = declared.scaled_area.specialize(T="Rectangle")
    check_grads(rectangle, lambda r, s: r["width"] * r["height"] * s, shape, scale, raises=True)
    with pytest.raises(
        TypeError, match=r"got U='Rectangle', but scaled_area's generic type parameters are \['T'\]"
    ):
        declared.scaled_area.specialize(U="Rectangle")
    with pytest.raises(TypeError, match=r"specialize\(T='Circle'\).*has no such type"):
        declared.scaled_area.specialize(T="Circle")


def test_generic_value_parameter_is_bound_by_specialize(declared, rng):
    """``scaled_vector<T, let N : int>``: no dtype decides N, so a call without ``specialize(N=...)``
    is refused (naming the remedy) and one with it runs and differentiates; the dtype still
    decides T."""
    v, scale = _uniform(rng, 5, 3), _uniform(rng, 5)
    with pytest.raises(TypeError, match=r"value parameter\(s\) N.*scaled_vector\.specialize\(N=4\)"):
        declared.scaled_vector(v, scale)
    with pytest.raises(TypeError, match=r"specialize\(N='3'\): N is a generic value parameter"):
        declared.scaled_vector.specialize(N="3")
    three = declared.scaled_vector.specialize(N=3)
    check_grads(three, lambda v, s: v * s[:, None], v, scale, raises=True)
    half = three(v.astype(jnp.float16), scale.astype(jnp.float16))
    assert half.dtype == jnp.float16
