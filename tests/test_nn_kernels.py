"""The networks' Slang source (slax/nn/_kernels.py): only a descriptor of the architecture ahead of
the file whose entry points are written once, shaders/nn/thread_sums.slang for narrow networks,
shaders/nn/tile_kernels.slang for wide ones (both tile families); their results are
tests/test_nn.py's and tests/test_tensor_cores.py's, their PTX tests/test_ptx_launch.py's."""

from __future__ import annotations

import re
import time

import pytest
from _helpers import assert_float32_mlp_matches_reference, compute_seconds

from slax._slang_c import dependency_files
from slax.nn._activations import ACTIVATIONS, HIDDEN_DEFAULT, OUTPUT_DEFAULT, layer_activations
from slax.nn._kernels import kernel_layout, layer_pairs, mlp_source, parameter_offsets
from slax.nn._warp_rows_kernels import warp_rows_source
from slax.nn._wide_warp_kernels import wide_warp_source


def _assert_only_a_descriptor(source: str, include: str) -> None:
    """No entry point, loop or function body: type aliases, constants, imports and the include."""
    assert "[shader(" not in source and "for (" not in source and "{" not in source, source
    assert source.rstrip().endswith(f'#include "{include}"'), source


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
    _assert_only_a_descriptor(source, "nn/thread_sums.slang")
    layers = re.findall(r"FeedForwardLayer<T, (\d+), (\d+), (\d+), Parameters, Sums, (\w+)>", source)
    assert [(int(i), int(o)) for i, o, _, _ in layers] == list(zip(sizes[:-1], sizes[1:]))
    assert f"static const int Inputs = {sizes[0]};" in source
    assert f"static const int Outputs = {sizes[-1]};" in source


@pytest.mark.one_device_kind
def test_a_narrow_float16_networks_warp_tiles_are_named_by_its_descriptor():
    """On tensor cores, the warp tiles' loss and gradient (shaders/nn/warp_mma.slang) come from the
    same file, over the descriptor's WarpNetwork."""
    source = mlp_source((5, 9, 6, 2), "float16", tensor_cores=True)
    _assert_only_a_descriptor(source, "nn/thread_sums.slang")
    assert "#define SLAX_WARP_MMA_LOSS_GRAD" in source
    layers = re.findall(r"WarpLayer<(\d+), (\d+), (\d+), (\w+)>", source)
    assert [(int(i), int(o), int(w)) for i, o, w, _ in layers] == [(5, 9, 0), (9, 6, 54), (6, 2, 114)]


# three layers on one route: every route compiles the chain of 3-8-8-2 in
# tests/test_nn_activations.py's test_each_activation_matches_the_twin
@pytest.mark.parametrize(
    "sizes",
    [(5, 3), pytest.param((3, 8, 8, 2), marks=pytest.mark.one_device_kind)],
    ids=lambda s: "-".join(map(str, s)),
)
def test_chains_of_one_and_three_layers_match_the_reference(sizes):
    """The chain's ends: a network of one layer (no Chain) and one of three (a Chain in a Chain)."""
    assert_float32_mlp_matches_reference(sizes, seed=5)


def _sixteen_hidden(width: int, inputs: int = 32, outputs: int = 16) -> tuple[int, ...]:
    return (inputs, *(width,) * 16, outputs)


def _activations(sizes: tuple[int, ...]) -> tuple[str, ...]:
    names = layer_activations(len(sizes) - 1, HIDDEN_DEFAULT, OUTPUT_DEFAULT)
    return tuple(ACTIVATIONS[name].slang for name in names)


DEEP_SOURCES = {
    "thread_sums": lambda: mlp_source(_sixteen_hidden(2, 3, 2), "float32"),
    "warp_mma": lambda: mlp_source(_sixteen_hidden(2, 3, 2), "float16", tensor_cores=True),
    "tiled": lambda: mlp_source(_sixteen_hidden(64), "float32"),
    "tiled_hessian": lambda: mlp_source(_sixteen_hidden(64), "float32", tangents=True),
    "tensor_cores": lambda: mlp_source(_sixteen_hidden(16), "float16", tensor_cores=True),
    "wide_warp": lambda: wide_warp_source(_sixteen_hidden(64), _activations(_sixteen_hidden(64))),
    "wide_warp_tf32": lambda: wide_warp_source(
        _sixteen_hidden(64), _activations(_sixteen_hidden(64)), "float32"
    ),
    "warp_rows": lambda: warp_rows_source(_sixteen_hidden(128), _activations(_sixteen_hidden(128))),
}


@pytest.mark.one_device_kind
@pytest.mark.parametrize("family", DEEP_SOURCES)
def test_every_familys_network_of_sixteen_hidden_layers_passes_slangs_front_end_in_seconds(family):
    """Slang checks each level of a network's chain type once (each chain's extension in shaders/nn,
    each level named in the descriptor: slax/nn/_slang_types.py), so its front end takes time
    linear in depth: under a second here for every family, the CUDA-only ones included, where a
    chain nested in the type's text and constrained on its struct took about 2.8x longer a layer
    (a 4-(16 x d)-4 network: 3.5 s at six hidden layers, 10 s at seven)."""
    source = DEEP_SOURCES[family]()
    began = time.perf_counter()
    dependency_files(source=source, name=f"sixteen_hidden_{family}.slang")
    assert time.perf_counter() - began < 30


@pytest.mark.slow
@pytest.mark.one_device_kind  # the Slang front end's time, the same on every route: lavapipe's JIT of
# the 16-layer tiled kernels alone took 642 s on CI's 2 cores
@pytest.mark.parametrize("width", [2, 16], ids=["thread_sums", "tiled"])
def test_chains_of_sixteen_hidden_layers_compile_in_bounded_time_and_match_the_reference(width):
    """The first calls of a network of sixteen hidden layers (its forward, backward and loss kernels
    compiled) within two minutes of CPU time, the compilers' included (compute_seconds: on a busy
    GPU machine's suite the wall time of the CUDA routes' compiles, about 35 s idle, passed 120 s):
    2-wide layers run a sample per thread, 16-wide ones in tiles. Its hidden layers are tanh: so
    deep a LeakyReLU network leaves few samples away from its kinks (slax.testing.away_from_kinks),
    where gradients compare."""
    sizes = _sixteen_hidden(width, 3, 2)
    assert kernel_layout(sizes).thread_sums == (width == 2)
    began = compute_seconds()
    assert_float32_mlp_matches_reference(sizes, seed=12, activation="tanh")
    seconds = compute_seconds() - began
    assert seconds < 120, f"the first calls took {seconds:.0f} CPU seconds"


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    ("sizes", "dtype", "tensor_cores", "activations", "layer"),
    [
        ((64, 128, 64, 10), "float32", False, None, "TiledLayer"),
        ((64, 128, 64, 10), "float16", False, ("tanh", "sigmoid", "sigmoid"), "TiledLayer"),
        ((13, 21, 10), "float32", False, ("sine", "relu"), "TiledLayer"),
        ((40, 10), "float16", False, None, "TiledLayer"),
        ((64, 128, 64, 10), "float32", True, None, "TensorCoreLayer"),
        ((32, 64, 64, 64, 64, 16), "float16", True, None, "TensorCoreLayer"),
        ((40, 10), "float32", True, None, "TensorCoreLayer"),
    ],
    ids=str,
)
def test_a_wide_networks_source_is_only_its_descriptor(sizes, dtype, tensor_cores, activations, layer):
    """Both families of tile kernels: the network is a TileChain of its layer types, each with its
    widths, parameter offset and activations as generic arguments, ahead of
    shaders/nn/tile_kernels.slang; a network of one layer has no hidden pointer."""
    layout = kernel_layout(sizes, tensor_cores, dtype)
    assert not layout.thread_sums and layout.tensor_cores == tensor_cores
    source = mlp_source(sizes, dtype, tensor_cores=tensor_cores, activations=activations)
    _assert_only_a_descriptor(source, "nn/tile_kernels.slang")
    assert ("import nn.tensor_cores;" in source) == tensor_cores
    found = re.findall(rf"{layer}<T, (\d+), (\d+), (\d+), (\d+), ", source)
    assert [(int(i), int(o), int(w)) for _, i, o, w in found] == [
        (i, o, w) for (i, o), w in zip(layer_pairs(sizes), parameter_offsets(sizes)[0])
    ]
    assert len({samples for samples, *_ in found}) == 1
    assert source.count("TileChain<T,") == len(sizes) - 2
    assert f"static const int Inputs = {sizes[0]};" in source
    assert f"static const int Outputs = {sizes[-1]};" in source
    assert f"static const int ParameterCount = {layout.parameters};" in source
    assert ("#define SLAX_TILE_HIDDEN" in source) == (len(sizes) > 2)
