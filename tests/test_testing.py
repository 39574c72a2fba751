"""slax.testing.check_grads: it passes matching derivatives and catches wrong ones."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import slax
import slax.examples
from slax.testing import RELATIVE_TOLERANCE, check_grads, multiply_add_results


@pytest.fixture(scope="module")
def poly():
    return slax.load_module("poly").polynomial


def _twin(a, b, c, x):
    return a * x * x + b * x + c


def test_report_passes_and_prints_a_table(poly, rng):
    x = jnp.asarray(rng.normal(size=(7,)), jnp.float32)
    report = check_grads(poly, _twin, 2.0, 8.0, -1.0, x)
    assert report.passed
    table = str(report)
    assert table.splitlines()[0].split() == [
        "check",
        "argument",
        "max",
        "abs",
        "err",
        "max",
        "rel",
        "err",
        "tolerance",
        "pass",
    ]
    assert {row.check for row in report.rows} == {"value", "rev", "fwd"}
    assert all(row.tolerance == RELATIVE_TOLERANCE["float32"] for row in report.rows)


def test_wrong_derivative_fails_and_raises_with_table(poly, rng):
    x = jnp.asarray(rng.normal(size=(7,)), jnp.float32)

    def wrong_twin(a, b, c, x):  # the same values at b = 8, but a different slope in b
        return a * x * x + b * x + c + 0.5 * (b - 8.0) * x

    report = check_grads(poly, wrong_twin, 2.0, 8.0, -1.0, x)
    failing = [row for row in report.rows if not row.passed]
    assert [(row.check, row.argument) for row in failing] == [
        ("rev", "b"),
        ("fwd", "d out"),
    ], str(report)
    with pytest.raises(AssertionError, match=r"(?s)derivatives disagree.*rev\s+b\s.*NO"):
        check_grads(poly, wrong_twin, 2.0, 8.0, -1.0, x, modes=("rev",), raises=True)


def test_rows_name_slang_parameters_or_argument_positions(rng):
    """A slax Slang function's rows carry its parameter names (struct fields as keys); a Python
    function's carry positions, as it has no Slang signature to read."""
    examples = slax.load_module(slax.examples.MODULE)
    energy = next(e for e in slax.examples.EXAMPLES if e.name == "energy")
    args = energy.draw(rng, jnp.float32)
    rev = ("rev",)
    report = check_grads(examples.energy, energy.twin, *args, modes=rev)
    names = [row.argument for row in report.rows if row.check == "rev"]
    assert names == ["particle['mass']", "particle['position']", "velocity"], str(report)
    wrapped = check_grads(lambda *a: examples.energy(*a), energy.twin, *args, modes=rev)
    names = [row.argument for row in wrapped.rows if row.check == "rev"]
    assert names == ["arg[0]['mass']", "arg[0]['position']", "arg[1]"], str(wrapped)


def test_half_tolerance(poly, rng):
    x = jnp.asarray(rng.normal(size=(7,)), jnp.float16)
    report = check_grads(
        lambda x: poly(2.0, 8.0, -1.0, x.astype(jnp.float32)).astype(jnp.float16),
        lambda x: _twin(2.0, 8.0, -1.0, x),
        x,
    )
    assert report.passed
    assert {row.tolerance for row in report.rows} == {RELATIVE_TOLERANCE["float16"]}


def test_bad_arguments():
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        check_grads(jnp.sin, jnp.sin, jnp.ones(2), order=3)
    with pytest.raises(ValueError, match="unknown modes"):
        check_grads(jnp.sin, jnp.sin, jnp.ones(2), modes=("sideways",))


def _cube(x):
    return x * x * x


def _cube_by_power(x):
    return x**3  # another primitive (integer_pow) with its own derivative rules


def _cube_with_another_curvature(x):
    """x³ in value and first derivative at every point (the added term and its derivative vanish
    there), but with second derivative 6x + 10."""
    return x**3 + 5.0 * (x - jax.lax.stop_gradient(x)) ** 2


def test_order_two_passes_a_true_twin_and_catches_a_wrong_curvature(rng):
    """Second order on pure-JAX functions (tests/test_second_order.py runs it on Slang ones): a twin
    computing x³ another way passes, and one that agrees in value and first derivative but not in
    curvature passes order 1 and fails exactly the Hessian-vector products at order 2."""
    x = jnp.asarray(rng.normal(size=(5,)), jnp.float32)
    report = check_grads(_cube, _cube_by_power, x, order=2)
    assert report.passed, str(report)
    assert [row.check for row in report.rows] == ["value", "rev", "fwd", "hvp fwd", "hvp rev"]
    assert check_grads(_cube, _cube_with_another_curvature, x).passed
    wrong = check_grads(_cube, _cube_with_another_curvature, x, order=2)
    failing = [(row.check, row.argument) for row in wrong.rows if not row.passed]
    assert failing == [("hvp fwd", "arg[0]"), ("hvp rev", "arg[0]")], str(wrong)


def test_order_two_takes_a_twin_that_keeps_float16_results(rng):
    """A twin that rounds its results to float16 as the kernels do (slax.nn.mlp_apply_reference
    with storage_dtype) gets its Hessian-vector products' cotangents in float16, as its
    reverse-mode check does: JAX refuses a float32 cotangent for a float16 output."""
    x = jnp.asarray(rng.normal(size=(5,)), jnp.float16)
    report = check_grads(_cube, lambda x: _cube_by_power(x).astype(jnp.float16), x, order=2)
    assert report.passed, str(report)
    assert [row.check for row in report.rows] == ["value", "rev", "fwd", "hvp fwd", "hvp rev"]


def test_both_functions_are_traced_at_full_float32_precision(poly, rng):
    """On GPUs with tensor cores JAX's default precision multiplies float32 matrices in TF32, and
    slax.nn's MLP follows it; check_grads traces the twin, the reference, and the function under
    test at 'highest' in every mode, whatever the caller's precision, so that the error it measures
    is the derivatives', not the precision's."""
    seen = {"twin": [], "slang": []}

    def twin(a, b, c, x):
        seen["twin"].append(jax.config.jax_default_matmul_precision)
        return _twin(a, b, c, x)

    def slang(a, b, c, x):
        seen["slang"].append(jax.config.jax_default_matmul_precision)
        return poly(a, b, c, x)

    x = jnp.asarray(rng.normal(size=(5,)), jnp.float32)
    with jax.default_matmul_precision("default"):
        assert check_grads(slang, twin, 2.0, 8.0, -1.0, x).passed
        assert jax.config.jax_default_matmul_precision == "default"  # restored afterwards
    for traced in seen.values():
        assert len(traced) >= 3 and set(traced) == {"highest"}


def test_multiply_add_results_are_numpys_and_the_fused_rounding(rng):
    """For float16, float64 holds a * x + b exactly, so the fused result is that value rounded once
    (computed here through exact rationals); the scalars are rounded to float16 first."""
    from fractions import Fraction

    x = rng.uniform(-4, 4, size=4096).astype(np.float16)
    a, b = 0.999, -0.3  # neither is a float16
    twice, once, in_float32 = multiply_add_results(a, x, b)
    a16, b16 = np.float16(a), np.float16(b)
    np.testing.assert_array_equal(twice, (a16 * x + b16).astype(np.float16))
    exact = [np.float16(float(Fraction(float(a16)) * Fraction(float(v)) + Fraction(float(b16)))) for v in x]
    np.testing.assert_array_equal(once, np.array(exact, np.float16))
    assert np.any(once != twice), "the two roundings should differ somewhere on 4096 draws"
    assert in_float32.dtype == np.float16
    (only,) = multiply_add_results(3, np.arange(5, dtype=np.int32), -7)
    np.testing.assert_array_equal(only, 3 * np.arange(5) - 7)
