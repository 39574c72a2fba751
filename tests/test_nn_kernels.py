"""The narrow networks' Slang source (slax/nn/_kernels.py): only a descriptor of the architecture
ahead of shaders/nn/thread_sums.slang, whose entry points are written once; their results are
tests/test_nn.py's, their PTX tests/test_ptx_launch.py's."""

from __future__ import annotations

import re

import pytest
from _helpers import assert_float32_mlp_matches_reference

from slax.nn._kernels import kernel_layout, mlp_source


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    ("sizes", "dtype", "activations"),
    [
        ((4, 16, 4), "float32", None),
        ((4, 16, 4), "float16", None),
        ((5, 9, 6, 2), "float32", ("tanh", "sine", "none")),
        ((3, 1), "float32", None),
    ],
)
def test_a_narrow_networks_source_is_only_its_descriptor(sizes, dtype, activations):
    assert kernel_layout(sizes).thread_sums
    source = mlp_source(sizes, dtype, activations=activations)
    assert "[shader(" not in source and "for (" not in source and "{" not in source, source
    assert source.rstrip().endswith('#include "nn/thread_sums.slang"'), source
    layers = re.findall(r"FeedForwardLayer<T, (\d+), (\d+), (\d+), Parameters, Sums, (\w+)>", source)
    assert [(int(i), int(o)) for i, o, _, _ in layers] == list(zip(sizes[:-1], sizes[1:]))
    assert f"static const int Inputs = {sizes[0]};" in source
    assert f"static const int Outputs = {sizes[-1]};" in source


@pytest.mark.one_device_kind
def test_a_narrow_float16_networks_warp_tiles_are_named_by_its_descriptor():
    """On tensor cores, the warp tiles' loss and gradient (shaders/nn/warp_mma.slang) come from the
    same file, over the descriptor's WarpNetwork."""
    source = mlp_source((5, 9, 6, 2), "float16", tensor_cores=True)
    assert "[shader(" not in source and "for (" not in source and "{" not in source, source
    assert "#define SLAX_WARP_MMA_LOSS_GRAD" in source
    layers = re.findall(r"WarpLayer<(\d+), (\d+), (\d+), (\w+)>", source)
    assert [(int(i), int(o), int(w)) for i, o, w, _ in layers] == [(5, 9, 0), (9, 6, 54), (6, 2, 114)]


@pytest.mark.parametrize("sizes", [(5, 3), (3, 8, 8, 2)], ids=lambda s: "-".join(map(str, s)))
def test_chains_of_one_and_three_layers_match_the_reference(sizes):
    """The chain's ends: a network of one layer (no Chain) and one of three (a Chain in a Chain)."""
    assert_float32_mlp_matches_reference(sizes, seed=5)
