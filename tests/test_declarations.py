"""slax/_declarations.py: the differentiability a function's declarations state, read from source."""

from __future__ import annotations

import pytest

from slax._declarations import Modes, derivative_modes, generic_constraints, generic_values

pytestmark = pytest.mark.one_device_kind  # source text only: no kernel runs

_SOURCE = """
#define SCALE 2.0
// [Differentiable] float commented(float x);
[Differentiable]
[ForwardDerivative(softplus_forward)]
T softplus<T : __BuiltinFloatingPointType>(T x) { return log(T(1.0) + exp(x)); }

[Differentiable]
DifferentialPair<T> softplus_forward<T : __BuiltinFloatingPointType>(DifferentialPair<T> x)
{
    return diffPair(x.p, x.d);
}

[ForwardDifferentiable]
vector<float, 3> forward_only(vector<float, 3> v) { return v * SCALE; }

float plain(float x) { return x; }

float custom(float x) { return x * x; }

[BackwardDerivativeOf(custom)]
void custom_backward(inout DifferentialPair<float> x, float dy) { x = diffPair(x.p, 2.0 * x.p * dy); }

struct Box { float value; [Differentiable] float scaled(float k) { return value * k; } };

[Differentiable]
float generic_sum<T : IArray<float>, let N : int>(T values) { return 0.0; }
"""


def test_attributes_name_the_function_not_its_return_type():
    modes = derivative_modes([_SOURCE], "softplus")
    assert modes == Modes(
        forward=True,
        backward=True,
        forward_derivative="softplus_forward",
        forward_derivative_modes=Modes(forward=True, backward=True),
    )
    assert derivative_modes([_SOURCE], "DifferentialPair") is None
    assert derivative_modes([_SOURCE], "vector") is None


def test_forward_differentiable_has_no_backward_derivative():
    assert derivative_modes([_SOURCE], "forward_only") == Modes(forward=True, backward=False)


def test_a_derivative_declared_elsewhere_makes_a_function_differentiable():
    modes = derivative_modes([_SOURCE], "custom")
    assert modes is not None and modes.backward and modes.custom_backward_only and not modes.forward


def test_undeclared_commented_and_member_functions_are_left_to_reflection():
    for name in ("plain", "commented", "scaled", "missing"):
        assert derivative_modes([_SOURCE], name) is None


def test_declarations_in_another_file_count():
    other = "[BackwardDerivativeOf(plain)]\nvoid plain_bwd(inout DifferentialPair<float> x, float dy) {}"
    modes = derivative_modes([_SOURCE, other], "plain")
    assert modes is not None and modes.backward


def test_generic_parameters():
    assert generic_constraints([_SOURCE], "generic_sum") == {"T": "IArray<float>"}
    assert generic_values([_SOURCE], "generic_sum") == ["N"]
