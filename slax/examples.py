"""The example Slang functions of ``shaders/examples.slang``, each with a pure-JAX twin and inputs.

The tests and ``experiments/gradcheck.py`` compare each function's Slang derivatives with JAX's
derivatives of its twin (:func:`slax.testing.check_grads`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MODULE = "examples"
"""Module name of shaders/examples.slang on slax's include path."""
TENSOR_MODULE = "tensor_examples"
"""Module name of shaders/tensor_examples.slang: functions with tensor parameters."""


@dataclasses.dataclass(frozen=True)
class Example:
    """A Slang function name, its JAX twin, and how to draw random arguments for it.

    Attributes:
      name: the function's name in ``shaders/examples.slang``.
      twin: the same function in plain JAX.
      draw: ``(rng, dtype) -> args``: random arguments of that dtype for both.
    """

    name: str
    twin: Callable[..., Any]
    draw: Callable[[np.random.Generator, Any], tuple[Any, ...]]
    second_order: bool = True
    """Whether slax takes its second derivatives (Slang cannot nest ``fwd_diff`` through
    ``inout`` parameters)."""


def _uniform(rng: np.random.Generator, dtype, *shape: int, low: float = -1.0, high: float = 1.0):
    return jnp.asarray(rng.uniform(low, high, size=shape), dtype)


def _wave(x, y):
    return jnp.sin(x) * jnp.exp(-y * y) + jnp.log(1 + x * x) + jnp.tanh(y) + jnp.sqrt(2 + jnp.cos(x * y))


def _twist(a, b, s):
    return jnp.cross(a, b) * s[..., None] + a * jnp.sum(a * b, -1, keepdims=True)


def _energy(particle, velocity):
    mass = particle["mass"]
    return 0.5 * mass * jnp.sum(velocity * velocity, -1) + mass * 9.81 * particle["position"][..., 1]


EXAMPLES = (
    Example("wave", _wave, lambda r, d: (_uniform(r, d, 5), _uniform(r, d, 3, 5))),
    Example("twist", _twist, lambda r, d: (_uniform(r, d, 4, 3), _uniform(r, d, 4, 3), _uniform(r, d, 4))),
    Example(
        "energy",
        _energy,
        lambda r, d: (
            {"position": _uniform(r, d, 6, 3), "mass": _uniform(r, d, 6, low=0.5, high=2.0)},
            _uniform(r, d, 6, 3),
        ),
    ),
    Example(
        "matvec",
        lambda m, v: jnp.einsum("...ij,...j->...i", m, v),
        lambda r, d: (_uniform(r, d, 2, 3, 4), _uniform(r, d, 4)),
    ),
    Example("softplus", jax.nn.softplus, lambda r, d: (_uniform(r, d, 3, 7, low=-3.0, high=3.0),)),
    Example(
        "power_of",
        lambda e, x: (1.5 + x * x) ** jax.lax.stop_gradient(e),
        lambda r, d: (_uniform(r, d, low=0.5, high=2.0), _uniform(r, d, 9)),
    ),
    Example(
        "to_polar",
        lambda x, y: (jnp.sqrt(x * x + y * y), jnp.arctan2(y, x)),
        lambda r, d: (_uniform(r, d, 8), _uniform(r, d, 8)),
    ),
    Example(
        "accumulate",
        lambda t, x: t * x + x * x,
        lambda r, d: (_uniform(r, d, 2, 5), _uniform(r, d, 5)),
        second_order=False,
    ),
)
"""The functions of ``shaders/examples.slang`` that the tests and ``experiments/gradcheck.py``
check, each with its twin and how to draw its arguments."""


def bilinear_twin(texture, uv):
    """``bilinear`` of shaders/tensor_examples.slang in plain JAX: texture ``(H, W, 3)``, uv
    ``(N, 2)`` (u along W) -> ``(N, 3)``; a gather, whose gradient is a scatter-add."""
    height, width = texture.shape[:2]
    position = jnp.clip(uv, 0.0, 1.0) * jnp.array([width - 1, height - 1], uv.dtype)
    low = jnp.floor(position).astype(jnp.int32)
    high = jnp.minimum(low + 1, jnp.array([width - 1, height - 1]))
    t = (position - low)[:, None, :]
    top = texture[low[:, 1], low[:, 0]] * (1 - t[..., 0]) + texture[low[:, 1], high[:, 0]] * t[..., 0]
    bottom = texture[high[:, 1], low[:, 0]] * (1 - t[..., 0]) + texture[high[:, 1], high[:, 0]] * t[..., 0]
    return top * (1 - t[..., 1]) + bottom * t[..., 1]


TENSOR_EXAMPLES = (
    Example(
        "bilinear",
        bilinear_twin,
        lambda r, d: (_uniform(r, d, 5, 7, 3), _uniform(r, d, 40, 2, low=0.0, high=1.0)),
    ),
)
"""Functions of :data:`TENSOR_MODULE`, which differentiate in forward and reverse mode (first order)."""
