"""The MLP's activations by name: the Slang type that implements each (``shaders/nn/activations.slang``,
written once for every kernel family) and its plain-JAX twin (slax/nn/_reference.py).

A network chooses one activation for its hidden layers and one for its output layer
(:func:`slax.nn.mlp_init`); the primitives carry them as a tuple of names, one per layer
(:func:`layer_activations`), and the kernel generators name each layer's Slang type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

HIDDEN_DEFAULT = "leaky_relu"
OUTPUT_DEFAULT = "none"


@dataclasses.dataclass(frozen=True)
class Activation:
    """One activation.

    Attributes:
      slang: the type implementing ``IActivation`` in ``shaders/nn/activations.slang``.
      function: the same function of float32 values in jax.numpy, with the derivative the kernels
        take (ReLU's and LeakyReLU's at 0 that of the negative side).
      keeps_input: kernels keep a layer's pre-activation z rather than its output (``keepsInput``:
        the derivative does not follow from the output).
      kink: it has no derivative at 0 (two correct implementations may take either side's).
      linear_pieces: its second derivative is zero wherever it has one (the Hessian kernel,
        ``mlp_hessian_sums``, runs only networks of such activations).
    """

    slang: str
    function: Callable[[jax.Array], jax.Array]
    keeps_input: bool = False
    kink: bool = False
    linear_pieces: bool = False


ACTIVATIONS = {
    "leaky_relu": Activation(
        "LeakyReLU", lambda z: jnp.where(z > 0, z, 0.01 * z), kink=True, linear_pieces=True
    ),
    "relu": Activation("ReLU", lambda z: jnp.where(z > 0, z, 0.0), kink=True, linear_pieces=True),
    "none": Activation("Identity", lambda z: z, linear_pieces=True),
    "sigmoid": Activation("Sigmoid", jax.nn.sigmoid),
    "tanh": Activation("Tanh", jnp.tanh),
    "sine": Activation("Sine", jnp.sin, keeps_input=True),
}


def check_activation(function: str, argument: str, name: object) -> str:
    """``name`` if it names an activation, else a ValueError naming ``function``'s ``argument``."""
    if not isinstance(name, str) or name not in ACTIVATIONS:
        names = ", ".join(map(repr, ACTIVATIONS))
        raise ValueError(f"slax.nn.{function}: {argument} must be one of {names}; got {name!r}.")
    return name


def layer_activations(layers: int, activation: str, output_activation: str) -> tuple[str, ...]:
    """Each of ``layers`` layers' activation: ``activation`` on the hidden ones, then
    ``output_activation``."""
    return (activation,) * (layers - 1) + (output_activation,)
