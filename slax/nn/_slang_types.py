"""Slang type names that the MLP kernels' descriptors write."""

from __future__ import annotations


def nested_chain(chain: str, layers: list[str]) -> str:
    """The layer types ``layers`` nested in a chain type whose name and leading generic arguments
    are ``chain`` (``"WarpChain<"``, ``"TileChain<T,\\n    "``): ``chain L0, chain L1, ... Ln>>``,
    the last layer alone where one is left, as each family's ``First, Rest`` chain recurses."""
    nested = layers[-1]
    for layer in reversed(layers[:-1]):
        nested = f"{chain}{layer},\n    {nested}>"
    return nested
