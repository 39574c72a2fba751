"""docs/frameworks.md runs as written: slax's MLP and a Slang function inside a Flax NNX module and
an Equinox module, the framework owning the parameters, trained with optax; and each model trains
as its twin does, the same module with plain-JAX stand-ins for the Slang calls.

flax and equinox are in the ``test`` extra, not slax's dependencies: where one is absent its tests
skip, saying so."""

from __future__ import annotations

import pathlib
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from slax import nn
from slax.testing import RELATIVE_TOLERANCE

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "frameworks.md"
SECTIONS = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", PAGE.read_text(), flags=re.S | re.M))

pytestmark = pytest.mark.one_device_kind


def _snippets(section: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", SECTIONS[section], flags=re.S)


def _polynomial(a, b, c, x):
    return a * x * x + b * x + c


PLAIN_JAX = {
    "poly": types.SimpleNamespace(polynomial=_polynomial),
    "nn": types.SimpleNamespace(mlp_init=nn.mlp_init, mlp_apply=nn.mlp_apply_reference),
}
"""The page's names for the Slang calls, as plain JAX: the same functions, in jax.numpy."""


def _define(section: str, monkeypatch) -> dict:
    """The namespace of the section's first snippet: the model and its training step."""
    monkeypatch.chdir(PAGE.parent.parent)
    namespace: dict = {}
    exec(compile(_snippets(section)[0], f"{PAGE.name}, {section}, snippet 0", "exec"), namespace)
    return namespace


def _run(section: str, monkeypatch, plain_jax: bool) -> dict:
    """The section's snippets run in one namespace, as a reader runs them: the first defines the
    model and its training step, the second trains it. ``plain_jax`` runs the twin, the model's
    Slang calls replaced by :data:`PLAIN_JAX` before it trains."""
    namespace = _define(section, monkeypatch)
    training = _snippets(section)[1]
    if plain_jax:
        namespace.update(PLAIN_JAX)
    exec(compile(training, f"{PAGE.name}, {section}, snippet 1", "exec"), namespace)
    return namespace


@pytest.fixture(params=["Flax NNX", "Equinox"])
def section(request):
    pytest.importorskip({"Flax NNX": "flax.nnx", "Equinox": "equinox"}[request.param])
    return request.param


def test_page_has_both_frameworks():
    assert [len(_snippets(name)) for name in ("Flax NNX", "Equinox")] == [2, 2]


def test_trains_as_its_plain_jax_twin(section, monkeypatch):
    """The page's model (Slang polynomial, then slax's MLP) and its twin start from the same
    parameters: their first losses agree to float32's tolerance, and after 20 Adam steps both have
    lowered the loss alike. (Adam divides each step by the gradient's running size, so two correct
    float32 gradients a few ulps apart move the losses apart by more than an ulp: 1e-3.)"""
    slang = _run(section, monkeypatch, plain_jax=False)
    twin = _run(section, monkeypatch, plain_jax=True)
    np.testing.assert_allclose(slang["losses"][0], twin["losses"][0], rtol=RELATIVE_TOLERANCE["float32"])
    np.testing.assert_allclose(slang["losses"], twin["losses"], rtol=1e-3)
    assert slang["losses"][-1] < 0.8 * slang["losses"][0]


def test_gradients_match_the_twin(section, monkeypatch):
    """The framework's gradient of the model's loss (through Slang's derivatives of the polynomial
    and the MLP's kernels) equals the twin's, leaf by leaf, to float32's tolerance."""
    namespace = _define(section, monkeypatch)
    x = jax.random.uniform(jax.random.key(4), (64, 4), minval=-1.0, maxval=1.0)
    target = jax.random.normal(jax.random.key(5), (64, 4))

    def loss_fn(model):
        return jnp.mean((model(x) - target) ** 2)

    if section == "Flax NNX":
        from flax import nnx

        model = namespace["SlangRegressor"]((4, 16, 4), nnx.Rngs(3))
        grads = nnx.grad(loss_fn)(model)
        namespace.update(PLAIN_JAX)
        want = nnx.grad(loss_fn)(model)
    else:
        import equinox as eqx

        model = namespace["SlangRegressor"]((4, 16, 4), jax.random.key(3))
        grads = eqx.filter_grad(loss_fn)(model)
        namespace.update(PLAIN_JAX)
        want = eqx.filter_grad(loss_fn)(model)
    got_leaves, want_leaves = jax.tree.leaves(grads), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves) == 5  # the coefficients; two layers' weights and biases
    for got, expected in zip(got_leaves, want_leaves):
        scale = float(jnp.max(jnp.abs(expected)))
        assert float(jnp.max(jnp.abs(got - expected))) <= RELATIVE_TOLERANCE["float32"] * scale
