"""slax/_leaf_moves.py: generated kernels move a thread's leaf of 32-bit scalars as float4s and
float2s where the address allows it, and as scalars where it does not, with the same results."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
import slangpy as spy
from _helpers import CUDA_TOOLS, NVRTC

import slax
from slax._bridge import thread_grid
from slax._codegen import Mode, operand_leaves
from slax._compile import compile_kernel
from slax._device import get_device
from slax._function_primitives import FunctionSpec, _function_kernel
from slax._leaf_moves import moves
from slax._signature import Leaf
from slax._slang_c import CodeTarget, compile_entry_point
from slax.testing import check_grads

MODULE = pathlib.Path(__file__).with_name("slang") / "vector_leaves.slang"


def _leaf(size: int, dtype: str = "float32") -> Leaf:
    return Leaf((), dtype, (size,), True, "")


@pytest.mark.parametrize(
    ("size", "step", "dtype", "expected"),
    [
        (8, 4, "float32", [(0, 4), (4, 4)]),
        (6, 4, "float32", [(0, 4), (4, 2)]),
        (6, 2, "int32", [(0, 2), (2, 2), (4, 2)]),
        (4, 2, "uint32", [(0, 2), (2, 2)]),
        (3, 4, "float32", [(0, 2), (2, 1)]),  # broadcast: every thread's leaf at scalar 0
        (3, 1, "float32", [(0, 1), (1, 1), (2, 1)]),  # odd threads' leaves start at odd scalars
        (4, 4, "float16", [(0, 1), (1, 1), (2, 1), (3, 1)]),  # 16-bit scalars move one by one
    ],
)
def test_moves_take_the_widest_vector_each_scalar_is_aligned_for(size, step, dtype, expected):
    assert moves(_leaf(size, dtype), step) == expected


@pytest.fixture(scope="module")
def vector_leaves():
    return slax.load_module(str(MODULE))


def _draw(rng, *shapes):
    return [rng.uniform(-2, 2, shape).astype(np.float32) for shape in shapes]


def _spread(a, s):
    return a[..., None, :] * (s[..., None, None] + np.arange(4, dtype=np.float32)[:, None])


CASES = {
    "scale2": (lambda r: _draw(r, (37, 2), (37,)), lambda a, s: a * s[..., None]),
    "scale3": (lambda r: _draw(r, (37, 3), (37,)), lambda a, s: a * s[..., None]),
    "scale4": (lambda r: _draw(r, (4,), (37,)), lambda a, s: a * s[..., None]),  # `a` broadcast
    "outer": (lambda r: _draw(r, (37, 2), (37, 3)), lambda a, b: a[..., :, None] * b[..., None, :]),
    "spread": (lambda r: _draw(r, (37, 2), (37,)), _spread),
    "shifted": (
        lambda r: [r.integers(-9, 9, (37, 4), np.int32), r.integers(0, 9, (37, 2), np.uint32)],
        lambda n, m: n + (m[..., :1].astype(np.int32) - m[..., 1:].astype(np.int32)),
    ),
}


def _kernel(module, name: str, operands, mode: Mode = Mode.PRIMAL):
    """The generated kernel of ``name`` in ``mode`` for ``operands`` over a 1-D grid, as a call of
    the function would make it: an operand with no grid axis is broadcast along it, the
    derivatives' operands are not."""
    signature = getattr(module, name).signature(*operands)
    function = FunctionSpec(module.path, signature, module.content, module._names)
    leaves = operand_leaves(signature, mode)
    own = [np.ndim(operand) > len(leaf.shape) for operand, leaf in zip(operands, leaves)]
    broadcast = tuple((not grid,) for grid in own + [True] * (len(leaves) - len(own)))
    return function, _function_kernel(function, mode, broadcast)


@pytest.mark.parametrize("shift", [0, 1, 2, 3])
@pytest.mark.parametrize("name", sorted(CASES))
def test_results_are_right_at_every_alignment(vector_leaves, rng, device_kind, name, shift):
    """Each buffer's pointer ``shift`` floats past a multiple of 16 bytes: 0 takes the vectors, 2
    the float2s alone (float4 leaves take scalars), odd ones scalars throughout."""
    draw, twin = CASES[name]
    operands = draw(rng)
    want = twin(*operands)
    function, spec = _kernel(vector_leaves, name, operands)
    device = get_device(slax.DeviceKind(device_kind))
    compiled = compile_kernel(device, spec)
    usage = spy.BufferUsage.shader_resource | spy.BufferUsage.unordered_access
    buffers, pointers = [], []
    for array in [*operands, np.zeros_like(want)]:
        padded = np.zeros(array.size + 8, array.dtype)
        buffer = device.create_buffer(size=padded.nbytes, usage=usage)
        start = (-buffer.device_address % 16) // 4 + shift
        padded[start : start + array.size] = array.reshape(-1)
        buffer.copy_from_numpy(padded)
        buffers.append((buffer, start, array))
        pointers.append(buffer.device_address + 4 * start)
    names = function.names
    compiled.kernel.dispatch(
        thread_grid(len(want)),
        **dict(zip([n for n, _ in compiled.parameters.pointers], pointers)),
        **{names.count: len(want), names.grid(0): len(want)},
    )
    result, start, _ = buffers[-1]
    got = result.to_numpy().view(want.dtype)[start : start + want.size].reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("name", ["scale2", "scale3", "scale4", "outer", "spread"])
def test_calls_and_their_gradients_match_their_twins(vector_leaves, rng, name):
    draw, twin = CASES[name]
    check_grads(getattr(vector_leaves, name), twin, *draw(rng), raises=True)


def _vectors(source: str, helper: str) -> set[str]:
    """The vector types of the specialisations of ``helper`` (``slax_load_vector`` or
    ``slax_store_vector``) in CUDA source: those the kernel moves."""
    pattern = rf"\b(\w+) +{helper}_\w*\(\w+ \* \w+(?:, (\w+) )?"
    return {store or load for load, store in re.findall(pattern, source)} - {"void"}


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    ("name", "loads", "stores"),
    [
        ("scale2", {"float2"}, {"float2"}),
        ("scale3", set(), set()),
        ("scale4", {"float4"}, {"float4"}),  # its broadcast float4 is at scalar 0 for every thread
        ("outer", {"float2"}, {"float2"}),  # float2x3: three float2s a thread
        ("spread", {"float2"}, {"float4"}),  # Array<float2, 4>: two float4s a thread
        ("shifted", {"int4", "uint2"}, {"int4"}),
    ],
)
def test_cuda_kernels_move_leaves_as_vectors(vector_leaves, rng, name, loads, stores):
    _, spec = _kernel(vector_leaves, name, CASES[name][0](rng))
    source = compile_entry_point(spec, CodeTarget.CUDA_SOURCE)
    assert _vectors(source, "slax_load_vector") == loads
    assert _vectors(source, "slax_store_vector") == stores


@pytest.mark.one_device_kind
@pytest.mark.skipif(not NVRTC.exists(), reason=f"needs NVRTC from the CUDA tools in {CUDA_TOOLS}")
def test_ptx_moves_leaves_with_vector_instructions(vector_leaves, rng, monkeypatch):
    """``spread``'s cotangent kernel reads the result's cotangent (8 floats) as two float4s and
    writes ``a``'s (2 floats) as a float2."""
    monkeypatch.setenv("SLAX_NVRTC", str(NVRTC))
    _, spec = _kernel(vector_leaves, "spread", CASES["spread"][0](rng), Mode.COTANGENT)
    ptx = compile_entry_point(spec, CodeTarget.PTX)
    vectors = re.findall(r"\b(?:ld|st)\.global\.v\d\.f32", ptx)
    assert sorted(vectors) == ["ld.global.v2.f32", *["ld.global.v4.f32"] * 2, "st.global.v2.f32"]
