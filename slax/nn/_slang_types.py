"""Slang type names that the MLP kernels' descriptors write."""

from __future__ import annotations


def chain_aliases(name: str, chains: list[str], layers: list[str]) -> str:
    """Slang ``typealias`` declarations that name ``name`` the chain of the layer types ``layers``,
    as each family's ``First, Rest`` chain recurses: ``{name}{k}`` is layers k onwards (the last
    layer alone), ``{name}`` the whole chain; ``chains[k]`` is the chain type's name and leading
    generic arguments at layer k (``"TileChain<T, "``), one for each layer but the last.

    Each level names the next rather than holding its text: Slang checks a type written nested
    inside another in time that doubles with each level of nesting (a 20-layer tile chain: 100 s
    nested, 0.5 s named level by level), and a network's depth is not limited."""
    names = [name] + [f"{name}{k}" for k in range(1, len(layers))]
    levels = [f"{chain}{layer}, {rest}>" for chain, layer, rest in zip(chains, layers, names[1:])]
    return "".join(f"typealias {n} = {t};\n" for n, t in zip(names, [*levels, layers[-1]]))
