"""An MLP's architecture: what its primitives take as one static parameter.

Everything that fixes a network's kernels but is not an array (its widths, dtype and activations) lives in one
frozen, hashable :class:`Architecture`, which every MLP primitive carries, every backend
(slax/nn/_backends.py) reads, and every cache of compiled kernels is keyed by: a further static
property of networks is one field here.
"""

from __future__ import annotations

import dataclasses

from slax.nn._activations import HIDDEN_DEFAULT, OUTPUT_DEFAULT, layer_activations


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A network's static description.

    Attributes:
      sizes: layer widths from input to output, e.g. ``(4, 16, 4)``.
      dtype: the parameters' and activations' dtype, ``"float32"`` or ``"float16"``.
      activations: each layer's activation's name (slax/nn/_activations.py), input layer first;
        default: LeakyReLU on the hidden layers, none on the output layer.
    """

    sizes: tuple[int, ...]
    dtype: str
    activations: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.activations:
            defaults = layer_activations(len(self.sizes) - 1, HIDDEN_DEFAULT, OUTPUT_DEFAULT)
            object.__setattr__(self, "activations", defaults)

    @property
    def layers(self) -> list[tuple[int, int]]:
        """Each layer's ``(in, out)`` widths, input layer first."""
        return list(zip(self.sizes[:-1], self.sizes[1:]))

    @property
    def hidden_pair(self) -> int:
        """The width of the widest pair of adjacent hidden layers (the narrower of the two; 0 for a
        network with fewer than two hidden layers): their product is the network's largest."""
        hidden = self.sizes[1:-1]
        return max((min(a, b) for a, b in zip(hidden[:-1], hidden[1:])), default=0)

    def __str__(self) -> str:
        return f"{'-'.join(map(str, self.sizes))} {self.dtype}"
