"""Second derivatives of Slang functions (slax/_function_primitives.py's second-order primitives,
slax/_codegen.py's ``tangent_of_tangent`` and ``tangent_of_cotangent`` kernels), against JAX's
second derivatives of pure-JAX twins: forward over forward, reverse over forward, forward over
reverse and reverse over reverse, under jit and vmap, and the second derivatives slax refuses."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import slax
from slax import examples
from slax.testing import RELATIVE_TOLERANCE, check_grads, compare

TOLERANCE = 4 * RELATIVE_TOLERANCE["float32"]
"""Second derivatives run twice the operations of first ones; each is compared normwise."""


@pytest.fixture(scope="module")
def fns():
    return slax.load_module(examples.MODULE)


@pytest.fixture(scope="module")
def second():
    return slax.load_module(pathlib.Path(__file__).with_name("slang") / "second_order.slang")


def _random_like(rng: np.random.Generator, tree):
    """Random normal floating leaves; integer leaves get float0 (no) tangents or cotangents."""

    def draw(leaf):
        leaf = jnp.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.asarray(rng.normal(size=leaf.shape), leaf.dtype)
        return np.zeros(leaf.shape, jax.dtypes.float0)

    return jax.tree.map(draw, tree)


COMPOSITIONS = ("fwd over fwd", "rev over fwd", "fwd over rev", "rev over rev")


def second_derivatives(fn, args, rng: np.random.Generator, transform, only) -> dict:
    """The compositions ``only`` of JAX's two modes over ``fn`` at ``args``, along random
    directions drawn from ``rng`` (the same for the Slang function and its twin when ``rng`` is
    seeded alike), each wrapped in ``transform`` (e.g. ``jax.jit``)."""
    tangent, other = _random_like(rng, args), _random_like(rng, args)
    cotangent = _random_like(rng, fn(*args))

    def tangent_of(*primals):
        return jax.jvp(fn, primals, tangent)[1]

    def cotangent_of(*primals):
        return jax.vjp(fn, *primals)[1](cotangent)

    compositions = {
        "fwd over fwd": lambda *a: jax.jvp(tangent_of, a, other)[1],
        "rev over fwd": lambda *a: jax.vjp(tangent_of, *a)[1](cotangent),
        "fwd over rev": lambda *a: jax.jvp(cotangent_of, a, tangent)[1],
        "rev over rev": lambda *a: jax.vjp(cotangent_of, *a)[1](other),
    }
    return {name: transform(compositions[name])(*args) for name in only}


def assert_second_derivatives_match(slang_fn, twin, args, seed=0, transform=jax.jit, only=COMPOSITIONS):
    """Each composition runs jitted by default: one XLA compile per composition rather than one per
    operation of it (eager dispatch compiles each primitive alone, and those compiles, not the
    kernels', dominated these tests' time); :func:`test_eagerly` runs them op by op."""
    got = second_derivatives(slang_fn, args, np.random.default_rng(seed), transform, only)
    want = second_derivatives(twin, args, np.random.default_rng(seed), transform, only)
    rows = []
    for combination in only:
        got_leaves, want_leaves = jax.tree.leaves(got[combination]), jax.tree.leaves(want[combination])
        assert len(got_leaves) == len(want_leaves), combination
        for k, (a, b) in enumerate(zip(got_leaves, want_leaves)):
            if a.dtype == jax.dtypes.float0:
                continue
            assert a.shape == b.shape, (combination, k, a.shape, b.shape)
            rows.append(compare(combination, f"leaf {k}", a, b, TOLERANCE))
    failed = [row for row in rows if not row.passed]
    assert not failed, failed


# --- every example function: scalars, vectors, matrices, structs, no_diff, out, inout, broadcast ---


SECOND_ORDER_EXAMPLES = [example for example in examples.EXAMPLES if example.second_order]


@pytest.mark.parametrize(
    "example",
    [
        pytest.param(example, marks=pytest.mark.jax_version) if example.name == "energy" else example
        for example in SECOND_ORDER_EXAMPLES
    ],
    ids=lambda e: e.name,
)
def test_examples_match_their_twins_in_every_composition(fns, example):
    """Reverse over forward and reverse over reverse run all four second-order kernels: each
    linearises one second-order primitive and transposes it into the other (and a first-order one)."""
    args = example.draw(np.random.default_rng(1), jnp.float32)
    assert_second_derivatives_match(
        getattr(fns, example.name), example.twin, args, only=("rev over fwd", "rev over rev")
    )


def test_fixed_array_and_int_argument(fns, rng):
    values = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)
    count = jnp.asarray([0, 1, 2, 3, 4, 3], jnp.int32)

    def twin(values, count):
        return jnp.sum(jnp.where(jnp.arange(4) < count[:, None], values * values, 0.0), -1)

    assert_second_derivatives_match(fns.fixed_sum, twin, (values, count))


def _spin_twin(body, m, scale, power):
    p = body["position"]
    scale = jax.lax.stop_gradient(scale)
    s = jnp.sin(p[..., 0] * p[..., 1]) + power.astype(jnp.float32) * p[..., 2] ** 2
    moved = {
        "position": p * (s * scale)[..., None],
        "frame": (m @ body["frame"]) * p[..., 2, None, None],
        "tag": jax.lax.stop_gradient(body["tag"]),
        "id": body["id"],
    }
    return moved, jnp.sum(p * p, -1) * m[..., 0, 1]


@pytest.mark.one_device_kind  # mixes of the pieces whose second-order kernels run on every route in
# test_examples_match_their_twins_in_every_composition (a struct: energy, a matrix: matvec, out: to_polar)
def test_struct_matrix_no_diff_int_and_out(second, rng):
    body = {
        "position": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32),
        "frame": jnp.asarray(rng.normal(size=(5, 2, 2)), jnp.float32),
        "tag": jnp.asarray(rng.normal(size=5), jnp.float32),
        "id": jnp.arange(5, dtype=jnp.int32),
    }
    m = jnp.asarray(rng.normal(size=(2, 2)), jnp.float32)  # broadcast over the grid
    power = jnp.asarray([1, 2, 0, 3, 1], jnp.int32)
    args = (body, m, jnp.float32(0.7), power)
    assert_second_derivatives_match(second.spin, _spin_twin, args)


def _blend_twin(state, weights):
    echo = weights * weights * state[..., :1]
    x, y = state[..., 0], state[..., 1]
    next_state = jnp.stack([x * y + weights[..., 2], jnp.exp(0.3 * y) * weights[..., 0]], -1)
    result = jnp.sum(weights * weights, -1) * next_state[..., 1] + jnp.cos(next_state[..., 0])
    return result, echo, next_state


@pytest.mark.one_device_kind  # out parameters' second-order kernels run on every route in
# test_examples_match_their_twins_in_every_composition (to_polar)
def test_out_parameters_beside_the_result(second, rng):
    state = jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)
    weights = jnp.asarray(rng.normal(size=(3, 1, 3)), jnp.float32)  # broadcast: grid (3, 4)
    assert_second_derivatives_match(second.blend, _blend_twin, (state, weights))


# --- declared derivatives -------------------------------------------------------------------------


@jax.custom_jvp
def _surrogate_twin(x):
    return x * x * x


@_surrogate_twin.defjvp
def _surrogate_twin_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return x * x * x, 2.0 * jnp.sin(x) * dx


def test_declared_derivatives_are_differentiated_not_the_body(second, rng):
    x = jnp.asarray(rng.normal(size=7), jnp.float32)
    assert_second_derivatives_match(second.surrogate, _surrogate_twin, (x,))
    hessian = jax.hessian(lambda v: second.surrogate(v).sum())(x)
    np.testing.assert_allclose(np.diag(hessian), 2 * np.cos(x), rtol=1e-5, atol=1e-6)


@pytest.mark.jax_version
def test_forward_only_function_goes_forward_over_forward(second, rng):
    x, y = (jnp.asarray(rng.normal(size=6), jnp.float32) for _ in range(2))
    twin = lambda x, y: jnp.sin(x * y) + x * x * y  # noqa: E731
    args, (t1, t2) = (x, y), (_random_like(rng, (x, y)) for _ in range(2))
    got = jax.jvp(lambda *a: jax.jvp(second.forward_wave, a, t1)[1], args, t2)[1]
    want = jax.jvp(lambda *a: jax.jvp(twin, a, t1)[1], args, t2)[1]
    assert compare("fwd over fwd", "forward_wave", got, want, TOLERANCE).passed


# --- jit, vmap, check_grads ------------------------------------------------------------------------


ONE_ROUTE = pytest.mark.one_device_kind
"""For the tests of JAX's transformations and slax.testing around the examples: the rules are slax's
Python and JAX's, the same on every route, and each example's four second-order kernels run on every
route in test_examples_match_their_twins_in_every_composition."""


@pytest.mark.jax_version
@ONE_ROUTE
def test_eagerly(fns):
    args = examples.EXAMPLES[1].draw(np.random.default_rng(2), jnp.float32)  # twist: vectors
    assert_second_derivatives_match(fns.twist, examples.EXAMPLES[1].twin, args, transform=lambda f: f)


@pytest.mark.jax_version
@ONE_ROUTE
def test_vmap_of_hessian_and_grad_of_grad_under_jit(fns, rng):
    x = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
    wave = examples.EXAMPLES[0].twin

    def hessians(f):
        return jax.jit(jax.vmap(jax.hessian(lambda x, y: f(x, y).sum(), argnums=(0, 1))))(x, y)

    for got, want in zip(jax.tree.leaves(hessians(fns.wave)), jax.tree.leaves(hessians(wave))):
        assert compare("vmap hessian", "wave", got, want, TOLERANCE).passed

    def eikonal(f):  # a loss holding a gradient, differentiated again (reverse over reverse)
        def loss(x):
            return jnp.sum((jax.grad(lambda x: f(x, y).sum())(x) - 1.0) ** 2)

        return jax.jit(jax.grad(loss))(x)

    assert compare("grad of grad", "wave", eikonal(fns.wave), eikonal(wave), TOLERANCE).passed


@pytest.mark.jax_version
@ONE_ROUTE
def test_cotangent_that_depends_on_the_primal(fns, rng):
    """In a loss of f(x) (here its square), bwd_diff's cotangent depends on x: forward over
    reverse takes the cotangent's tangent (dct), reverse over reverse transposes it (fwd_diff)."""
    example = next(e for e in examples.EXAMPLES if e.name == "twist")
    a, b, s = example.draw(rng, jnp.float32)

    def losses(f):
        loss = lambda a: jnp.sum(f(a, b, s) ** 2)  # noqa: E731
        hessian = jax.hessian(loss)(a)
        grad_of_grad = jax.grad(lambda a: jnp.sum(jnp.sin(jax.grad(loss)(a))))(a)
        return hessian, grad_of_grad

    for got, want in zip(losses(fns.twist), losses(example.twin)):
        assert compare("dct", "a", got, want, TOLERANCE).passed


@pytest.mark.jax_version
@ONE_ROUTE
def test_check_grads_order_two_compares_hessian_vector_products(fns):
    example = next(e for e in examples.EXAMPLES if e.name == "energy")  # a struct and a vector
    args = example.draw(np.random.default_rng(3), jnp.float32)
    report = check_grads(fns.energy, example.twin, *args, order=2)
    hvp_rows = [(row.check, row.argument) for row in report.rows if row.check.startswith("hvp")]
    assert hvp_rows == [
        (check, argument)
        for check in ("hvp fwd", "hvp rev")
        for argument in ("particle['mass']", "particle['position']", "velocity")
    ], hvp_rows
    report.assert_passed()


# --- refusals --------------------------------------------------------------------------------------


@pytest.mark.one_device_kind
def test_declared_backward_derivative_without_forward_one_is_refused(second, rng):
    x = jnp.asarray(rng.normal(size=3), jnp.float32)
    f = lambda v: second.logistic(v).sum()  # noqa: E731
    with pytest.raises(
        TypeError, match=r"'logistic' declares a backward derivative and no forward one.*ForwardDerivative"
    ):
        jax.hessian(f)(x)
    with pytest.raises(TypeError, match=r"'logistic' declares a backward derivative"):
        jax.grad(lambda v: jnp.sum(jax.grad(f)(v) ** 2))(x)
    sigmoid = jax.nn.sigmoid(x)
    np.testing.assert_allclose(jax.grad(f)(x), sigmoid * (1 - sigmoid), rtol=1e-5)


@pytest.mark.one_device_kind
def test_undifferentiable_declared_forward_derivative_is_named(second, rng):
    x = jnp.asarray(rng.normal(size=3), jnp.float32)
    with pytest.raises(
        TypeError, match=r"'cube' run fwd_diff\(cube_forward\).*mark cube_forward \[Differentiable\]"
    ):
        jax.jacfwd(jax.jacfwd(lambda v: second.cube(v).sum()))(x)
    declared = slax.load_module(pathlib.Path(__file__).with_name("slang") / "declared_derivatives.slang")
    with pytest.raises(TypeError, match=r"'square' run fwd_diff\(square_forward\)"):  # [ForwardDerivativeOf]
        jax.jacfwd(jax.jacfwd(lambda v: declared.square(v).sum()))(x)


@pytest.mark.jax_version
@pytest.mark.one_device_kind
def test_inout_parameters_are_refused_naming_them(fns, rng):
    total, x = (jnp.asarray(rng.normal(size=4), jnp.float32) for _ in range(2))
    f = lambda t: fns.accumulate(t, x).sum()  # noqa: E731
    for second_derivative in (jax.hessian, lambda g: jax.jacfwd(jax.jacfwd(g))):
        with pytest.raises(TypeError, match=r"'accumulate'.*'total' are inout.*'out' parameter"):
            second_derivative(f)(total)
    np.testing.assert_allclose(jax.grad(f)(total), x, rtol=1e-6)  # first order is unaffected


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    "third",
    [
        pytest.param(lambda f: jax.jacfwd(jax.hessian(f)), marks=pytest.mark.jax_version),
        lambda f: jax.jacrev(jax.hessian(f)),
        lambda f: jax.jacfwd(jax.jacfwd(jax.jacfwd(f))),
        lambda f: jax.grad(lambda x: jax.grad(lambda y: jax.grad(f)(y).sum())(x).sum()),
    ],
    ids=["fwd-fwd-rev", "rev-fwd-rev", "fwd-fwd-fwd", "rev-rev-rev"],
)
def test_third_order_is_refused_naming_the_order_and_function(fns, third):
    x = jnp.asarray(np.random.default_rng(4).normal(size=3), jnp.float32)
    with pytest.raises(NotImplementedError, match=r"order 3 and beyond of Slang function 'softplus'"):
        third(lambda v: fns.softplus(v).sum())(x)
