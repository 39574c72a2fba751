"""An MLP's parameters as a pytree that remembers the network's activations.

:class:`MLPParams` is a registered pytree node: its children are the layers (a list of
``{"bias", "weight"}`` dicts, as before), its static data the two activation names. So
``jax.tree.map``, optax, ``ravel_pytree`` (the same flat order as the list of layers: each layer's
bias, then its weight, the kernels' own layout, slax/nn/_kernels.py), checkpoints that store
``jax.tree.leaves`` and frameworks that hold pytrees (Flax NNX, Equinox) treat it as the list of
layers it holds, and what they build from it keeps the activations. A plain list of layer dicts is
still a network's parameters, with the default activations (LeakyReLU, then an affine output).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import jax

from slax.nn._activations import HIDDEN_DEFAULT, OUTPUT_DEFAULT, check_activation, layer_activations


@dataclasses.dataclass(frozen=True)
class MLPParams:
    """An MLP's parameters and activations (from :func:`slax.nn.mlp_init`).

    Indexing, ``len`` and iteration reach the layers, as on a list of them: ``params[0]["weight"]``.

    Attributes:
      layers: one ``{"weight": (out, in), "bias": (out,)}`` dict per layer, input first, all of one
        dtype (float32 or float16).
      activation: the hidden layers' activation: ``"leaky_relu"`` (slope 0.01), ``"relu"``,
        ``"none"``, ``"sigmoid"``, ``"tanh"`` or ``"sine"``.
      output_activation: the output layer's, one of the same names.
    """

    layers: list[dict[str, jax.Array]]
    activation: str = HIDDEN_DEFAULT
    output_activation: str = OUTPUT_DEFAULT

    def __post_init__(self):
        check_activation("MLPParams", "activation", self.activation)
        check_activation("MLPParams", "output_activation", self.output_activation)

    def __getitem__(self, index: int | slice) -> Any:
        """The layers, as on a list of them.

        Args:
          index: a layer's index, or a slice.

        Returns:
          That layer's ``{"weight", "bias"}`` dict, or a list of them.
        """
        return self.layers[index]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[dict[str, jax.Array]]:
        return iter(self.layers)

    def with_layers(self, layers: list[dict[str, jax.Array]]) -> MLPParams:
        """The same activations on other layers (gradients, updates, rescaled weights).

        Args:
          layers: one ``{"weight", "bias"}`` dict per layer.

        Returns:
          :class:`MLPParams` holding ``layers`` and this network's activations.
        """
        return dataclasses.replace(self, layers=layers)


jax.tree_util.register_dataclass(
    MLPParams, data_fields=["layers"], meta_fields=["activation", "output_activation"]
)


def split_params(params) -> tuple[list[dict[str, jax.Array]], tuple[str, ...]]:
    """The layers and each layer's activation name of :class:`MLPParams`, or of a list of layers
    (the default activations)."""
    if isinstance(params, MLPParams):
        layers = params.layers
        return layers, layer_activations(len(layers), params.activation, params.output_activation)
    return params, layer_activations(len(params), HIDDEN_DEFAULT, OUTPUT_DEFAULT)


def flat_layers(layers) -> list[jax.Array]:
    """Each layer's bias, then its weight: the order of ``jax.tree.leaves`` of the layers, of the
    MLP primitives' operands and results, and of the kernels' flat layout (slax/nn/_kernels.py)."""
    return [a for layer in layers for a in (layer["bias"], layer["weight"])]
