"""The PTX launch path (``slax.config.cuda_launch = "ptx"``), checked without a GPU.

What runs here: Slang compiles every kind of slax kernel to PTX through NVRTC; NVIDIA's ``ptxas``
assembles each for sm_90 (the H100); slax programs lower for CUDA to ``triton_kernel_call_ffi``
custom calls whose serialised launches (decoded by tests/scripts/ptx_lowering.py) carry the right
PTX, grid, warps and arguments, in the order the PTX entry point declares them. What cannot run
here is the launch itself: experiments/bridge_check.py compares the two CUDA launch paths on a GPU.

The CUDA tools (NVRTC, ptxas, jaxlib's CUDA plugin) are installed by scripts/test.sh into
``.venv/cuda-tools``, outside the test environment's site-packages, so they are only loaded by
the processes here that ask for them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import jax
import numpy as np
import pytest
from _helpers import CUDA_TOOLS, NVRTC, ROOT, compute_seconds, once_per_run, run_python

import slax
import slax.examples
from slax import _sources
from slax._compile import ROW_THREADS, KernelSpec, spec_content
from slax._device import SHADER_DIR
from slax._errors import SlangCompileError
from slax._ptx_compile import timeout_s
from slax._ptx_launch import (
    PtxLauncher,
    PtxLaunchError,
    _checked_ptx,
    _timed_out,
    compute_capability,
    launch_plan,
    ptx_entry_parameter_types,
)
from slax._slang_c import CodeTarget, NvrtcNotFoundError, compile_entry_point
from slax.nn._architecture import Architecture
from slax.nn._backends import Platform, TensorCores, ThreadSums
from slax.nn._kernels import mlp_source
from slax.nn._precision import Float32Products

# It lowers for CUDA (the CPU routes are not involved), through jaxlib's Triton launcher; it
# compiles every kind of kernel to PTX and assembles it, which takes minutes. CI runs on every JAX
# release the tests marked jax_version: those of the lowering through JAX (one per kind of program:
# a kernel, in place, Slang functions and their derivatives, tensors, the MLP, a route switch,
# export, the compile limit's fallback); the others check Slang's PTX (NVRTC, ptxas, the kernels'
# code) and slax's settings, which no JAX release changes.
pytestmark = [pytest.mark.one_device_kind, pytest.mark.slow]

PTXAS = CUDA_TOOLS / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
PTX_TYPE = {"array": "u64", "u32": "u32", "i32": "u32", "fp32": "f32"}
SM_90 = Platform("cuda", tensor_cores=True, capability=90)
SM_90_DEFAULT = Platform("cuda", True, 90, Float32Products.TF32)
"""An H100's or H200's tensor cores at JAX's DEFAULT precision, the report's: float32 products as
one TF32 pass."""
"""Where the report's programs lower (``SLAX_CUDA_COMPUTE_CAPABILITY=90``), tensor cores on."""

needs_tools = pytest.mark.skipif(
    not (NVRTC.exists() and PTXAS.exists()),
    reason=f"checks the PTX route without a GPU, with the CUDA 12 tools that scripts/test.sh installs "
    f"in {CUDA_TOOLS} (not there); on a GPU the route itself runs: SLAX_CUDA_LAUNCH=ptx pytest, and "
    "experiments/gradcheck.py --launch ptx",
)


@pytest.fixture
def nvrtc(monkeypatch):
    monkeypatch.setenv("SLAX_NVRTC", str(NVRTC))


@pytest.fixture
def empty_ptx_cache(nvrtc, monkeypatch, tmp_path):
    """A cache directory of the test's own, holding no PTX: its compiles reach the worker."""
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path / "cache"))


def _compile(spec: KernelSpec, defines: dict[str, str] | None = None) -> str:
    from slax import _ptx_compile

    return _ptx_compile.compile_ptx(spec, spec_content(spec), None, defines)


def _lowering_env() -> dict:
    return {
        # It lowers for CUDA, which takes no SLAX_DEVICE (the device_kind fixture's choice for
        # CPU-placed JAX): slax refuses a Vulkan or CPU device for CUDA-placed computations.
        # JAX's default precision, not the suite's (tests/conftest.py): the programs lower as a
        # user's do, and test_float32_products_follow_jax_precision asks for HIGHEST by name.
        **{k: v for k, v in os.environ.items() if k not in ("SLAX_DEVICE", "JAX_DEFAULT_MATMUL_PRECISION")},
        "PYTHONPATH": os.pathsep.join([str(CUDA_TOOLS), str(ROOT)]),
        "SLAX_NVRTC": str(NVRTC),
        "SLAX_CUDA_COMPUTE_CAPABILITY": "90",
        "JAX_PLATFORMS": "cpu",
    }


def _lower(*args: str) -> str:
    """tests/scripts/ptx_lowering.py's outcome as JSON: its exit status, the end of its error
    output, and its last line of output (the report: SlangPy's CUDA device logs before it)."""
    result = run_python("tests/scripts/ptx_lowering.py", *args, env=_lowering_env(), timeout=1200)
    last_line = (result.stdout.splitlines() or [""])[-1]
    return json.dumps({"returncode": result.returncode, "stderr": result.stderr[-5000:], "report": last_line})


def _programs_suffice(session: pytest.Session) -> bool:
    """Whether every selected test that reads the report is marked jax_version: those read one
    program of each kind, so the run lowers those alone (``ptx_lowering.py programs``), not the MLP's
    kernel variants, which take most of the minutes (CI's runs of ``-m jax_version``)."""
    readers = [item for item in session.items if "lowering_report" in getattr(item, "fixturenames", ())]
    return all(item.get_closest_marker("jax_version") for item in readers)


@pytest.fixture(scope="session")
def lowering_report(request) -> dict:
    """The report of tests/scripts/ptx_lowering.py, which takes a minute or more of lowering and
    compiling: made once per test run and read by every pytest-xdist worker that runs a test of it
    (:func:`_helpers.once_per_run`). A failed lowering is shared too: each test that reads it fails
    with the script's error, and the script is not run again."""
    if _programs_suffice(request.session):
        outcome = json.loads(once_per_run(request, "ptx_lowering_programs.json", lambda: _lower("programs")))
    else:
        outcome = json.loads(once_per_run(request, "ptx_lowering.json", _lower))
    assert outcome["returncode"] == 0, outcome["stderr"]
    return json.loads(outcome["report"])


@pytest.fixture
def report(cpu_path, lowering_report) -> dict:
    return lowering_report["launches"]


def _launches(report, case):
    return [launch for launch in report[case] if launch["target"] == "triton_kernel_call_ffi"]


@needs_tools
@pytest.mark.jax_version
def test_hand_written_kernel_launch_is_exactly_the_call(report):
    (launch,) = report["scale_shift_float"]
    assert launch["name"] == "scale_shift_float"
    assert launch["num_warps"] == 2  # numthreads(64, 1, 1)
    assert launch["compute_capability"] == 90
    assert launch["grid"] == [5, 1, 1]  # 300 threads in groups of 64
    assert launch["parameters"] == [
        ["array", 16],
        ["array", 16],
        ["u32", 300],  # x_count and y_count, which slax passes
        ["u32", 300],
        ["fp32", 2.5],
        ["fp32", -1.0],
    ]
    assert (launch["operands"], launch["results"], launch["aliases"]) == (1, 1, [])
    (int_launch,) = report["scale_shift_int"]
    assert int_launch["parameters"][2:] == [["u32", 300], ["u32", 300], ["i32", 3], ["i32", -7]]


@needs_tools
@pytest.mark.jax_version
def test_every_launch_passes_what_its_ptx_entry_declares(report):
    for case, launches in report.items():
        for launch in launches:
            assert launch["target"] == "triton_kernel_call_ffi", (case, launch["target"])
            kinds = [PTX_TYPE[kind] for kind, _ in launch["parameters"]]
            assert kinds == launch["ptx_parameters"], case
            arrays = sum(kind == "array" for kind, _ in launch["parameters"])
            assert arrays == launch["operands"] + launch["results"] - len(launch["aliases"]), case


@needs_tools
@pytest.mark.jax_version
def test_in_place_results_come_last_and_alias_their_operand(report):
    (launch,) = report["in_place"]
    # operands (x, acc); results (acc updated in place, doubled): the custom call returns
    # doubled first, then acc (aliasing operand 1), so the three pointers are x, acc, doubled.
    assert (launch["operands"], launch["results"]) == (2, 2)
    assert launch["aliases"] == [[1, 1]]
    assert [kind for kind, _ in launch["parameters"]] == ["array"] * 3 + ["u32", "fp32"]


@needs_tools
@pytest.mark.jax_version
def test_empty_grid_launches_nothing(report):
    assert report["empty"] == []


@needs_tools
@pytest.mark.jax_version
def test_slang_functions_and_their_derivatives_lower_to_their_kernels(report):
    assert [x["name"] for x in _launches(report, "poly_grad")] == ["slax_cotangent_polynomial"]
    assert [x["name"] for x in _launches(report, "poly_jvp")] == [
        "slax_primal_polynomial",
        "slax_tangent_polynomial",
    ]
    (vmapped,) = _launches(report, "poly_vmap_grid")
    assert vmapped["parameters"][5:8] == [["u32", 300], ["u32", 30], ["u32", 10]]  # count, grid
    for example in slax.examples.EXAMPLES:
        names = [x["name"] for x in _launches(report, f"{example.name}_vjp")]
        assert names == [f"slax_primal_{example.name}", f"slax_cotangent_{example.name}"]


@needs_tools
@pytest.mark.jax_version
def test_second_derivatives_lower_to_their_kernels(report):
    names = {x["name"] for x in _launches(report, "poly_grad_of_grad")}
    assert "slax_tangent_of_cotangent_polynomial" in names, names
    names = {x["name"] for x in _launches(report, "poly_jacfwd_jacfwd")}
    assert "slax_tangent_of_tangent_polynomial" in names, names
    for example in slax.examples.EXAMPLES:
        if example.second_order:
            names = {x["name"] for x in _launches(report, f"{example.name}_hvp")}
            assert f"slax_tangent_of_cotangent_{example.name}" in names, names


@needs_tools
def test_slangpy_style_modules_compile_to_ptx(report):
    """A module that imports SlangPy's Slang module finds it on the C API's search path too."""
    names = [x["name"] for x in _launches(report, "slangpy_style_grad")]
    assert names == ["slax_cotangent_hashed_offset_square"]


@needs_tools
@pytest.mark.jax_version
def test_tensor_functions_lower_to_their_kernels(report):
    """Functions with tensor parameters (shaders/slangpy_examples.slang, shaders/tensor_examples.slang):
    a written tensor and each tensor's gradient buffer are results updated in place."""
    names = lambda case: [x["name"].split("_", 1)[1] for x in _launches(report, case)]  # noqa: E731
    assert names("tensor_polynomial") == ["primal_polynomial"]
    assert names("tensor_polynomial_grad") == ["cotangent_polynomial"]
    assert names("bilinear_vjp") == ["primal_bilinear", "cotangent_bilinear"]
    assert names("custom_activation_grad") == ["cotangent_custom_activation"]
    for case in ("tensor_polynomial", "tensor_polynomial_grad", "bilinear_vjp", "custom_activation_grad"):
        assert any(launch["aliases"] for launch in _launches(report, case)), case
    # Lowered for sm_90 (SLAX_CUDA_ARCH=90): a float4 gradient element adds as one vector
    # reduction, a float3 as a pair and a float, a float2 as a pair; float elements one by one,
    # while uv's float2 and its cotangent move as vectors (slax/_leaf_moves.py).
    (gather,) = _launches(report, "gather_vectors_grad")
    assert gather["ptx"].count("red.global.add.v4.f32") == 1
    assert gather["ptx"].count("red.global.add.v2.f32") == 3  # float2, and float3's two orders
    (_, bilinear_backward) = _launches(report, "bilinear_vjp")
    assert re.search(r"\b(atom|red)\.global\.add\.f32", bilinear_backward["ptx"])
    assert not re.search(r"\b(atom|red)\.global\.add\.v2\.f32", bilinear_backward["ptx"])
    moves = set(re.findall(r"\b[ls][dt]\.global\.v2\.f32", bilinear_backward["ptx"]))
    assert moves == {"ld.global.v2.f32", "st.global.v2.f32"}


@needs_tools
@pytest.mark.jax_version
def test_mlp_kernels_lower_in_both_precisions(report):
    for dtype in ("float32", "float16"):
        (fused,) = _launches(report, f"mlp_loss_and_grad_{dtype}")
        assert fused["name"] == "mlp_loss_grad"
        # 4-16-16-4 (420 parameters) is wide and lowered for CUDA on tensor cores, at JAX's DEFAULT
        # precision on the warp tiles in both dtypes: thread groups of 4 warps, as many as their
        # launch has for 1000 samples
        arch = Architecture((4, 16, 16, 4), dtype)
        launch = TensorCores().gradient_launch(arch, SM_90_DEFAULT, "mlp_loss_grad", 1000, 1000)
        assert (
            (fused["grid"], fused["num_warps"])
            == ([launch.blocks, 1, 1], launch.threads // 32)
            == ([16, 1, 1], 4)
        )
        # the warp tiles' backward recomputes the hidden activations in registers: the forward pass
        # keeps none. The gradient of the parameters alone computes no input gradient
        forward, backward = _launches(report, f"mlp_apply_grad_{dtype}")
        assert (forward["name"], backward["name"]) == ("mlp_forward", "mlp_backward_params")
    forward, backward = _launches(report, "mlp_apply_grad_with_input_float32")
    assert (forward["name"], backward["name"]) == ("mlp_forward", "mlp_backward")


@needs_tools
@pytest.mark.jax_version
def test_the_squared_errors_gradient_lowers_to_one_warp_tile_launch(report):
    """Lowered for CUDA, ``jax.grad`` of ``slax.nn.mlp_squared_error`` in the parameters and x, on
    the warp tiles in both dtypes: one launch of ``mlp_loss_grad_input``, as the fused loss's
    (thread groups of 4 warps), writing dx beside the sums; no forward launch of its own."""
    for dtype in ("float32", "float16"):
        (fused,) = _launches(report, f"mlp_squared_error_grad_{dtype}")
        arch = Architecture((4, 16, 16, 4), dtype)
        launch = TensorCores().gradient_launch(arch, SM_90_DEFAULT, "mlp_loss_grad_input", 1000, 1000)
        assert (fused["name"], fused["grid"], fused["num_warps"]) == (
            "mlp_loss_grad_input",
            [launch.blocks, 1, 1],
            launch.threads // 32,
        )
        mma = "m16n8k8.row.col.f32.tf32" if dtype == "float32" else "m16n8k16.row.col.f32.f16"
        assert f"mma.sync.aligned.{mma}" in fused["ptx"]


@needs_tools
@pytest.mark.parametrize(
    ("sizes", "dtype", "tensor_cores"),
    [((4, 16, 4), "float16", True), ((9, 12, 3), "float16", True), ((4, 16, 4), "float32", False)],
)
def test_narrow_float16_loss_and_gradient_lowers_to_tensor_cores(report, sizes, dtype, tensor_cores):
    """Lowered for CUDA, a narrow float16 network's fused loss and gradient is the warp-per-tile
    kernel (shaders/nn/warp_mma.slang): mma.sync on halves, movmatrix, no per-sample fence; the
    float32 network's runs a sample per thread. Each launches as its layout says. The warp tiles
    apply LeakyReLU and its derivative to packed pairs of halves (max.f16x2, setp.gt.f16x2), not a
    half at a time, which with a comparison, a branch and a double's conversion per half doubles
    the tile loop's instructions (4-16-4: 258 against 127 from its first mma.sync to its last)."""
    (launch,) = _launches(report, f"narrow_loss_and_grad_{'-'.join(map(str, sizes))}_{dtype}")
    arch, thread_sums = Architecture(sizes, dtype), ThreadSums()
    assert thread_sums.on_tensor_cores(arch, SM_90) == tensor_cores
    want = thread_sums.gradient_launch(arch, SM_90, "mlp_loss_grad", 1000, 1000)
    assert (launch["name"], launch["grid"], launch["num_warps"]) == (
        "mlp_loss_grad",
        [want.blocks, 1, 1],
        want.threads // 32,
    )
    ptx = launch["ptx"]
    assert ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx) == tensor_cores
    assert ("movmatrix.sync.aligned.m8n8.trans.b16" in ptx) == tensor_cores
    fenced = re.search(r"\b(membar\.cta|fence\.sc\.cta)\b", ptx) is not None
    assert fenced != tensor_cores  # rereadStagedParameters, per sample
    if tensor_cores:
        assert "max.f16x2" in ptx and "setp.gt.f16x2" in ptx
        assert "cvt.rn.f16.f64" not in ptx


@needs_tools
def test_wide_float16_loss_and_gradient_lowers_to_warp_tiles(report):
    """Lowered for CUDA, a wide float16 network's fused loss and gradient is the warp-tile kernel
    (shaders/nn/wide_warp.slang), launched as the tensor_cores backend says: mma.sync on halves,
    the weight gradient's operands loaded turned over (ldmatrix .trans), each B fragment one 8-byte
    load, and no shuffle but the loss's five, once a kernel: shuffles in its per-tile bias gradient
    would hold its products back (BENCHMARKS.md, where the warp tiles' time goes)."""
    (launch,) = _launches(report, "wide_loss_and_grad_20-48-48-5_float16")
    want = TensorCores().gradient_launch(
        Architecture((20, 48, 48, 5), "float16"), SM_90, "mlp_loss_grad", 1000, 1000
    )
    assert (launch["name"], launch["grid"], launch["num_warps"]) == (
        "mlp_loss_grad",
        [want.blocks, 1, 1],
        want.threads // 32,
    )
    ptx = launch["ptx"]
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert "ld.global.v2.u32" in ptx
    assert "tf32" not in ptx
    assert len(re.findall(r"\bshfl\.sync", ptx)) == 5


@needs_tools
def test_wide_float32_loss_and_gradient_lowers_to_tf32_warp_tiles(report):
    """Lowered for CUDA at JAX's DEFAULT precision, a wide float32 network's fused loss and gradient
    is the warp-tile kernel in its TF32 format (shaders/nn/wide_warp_tf32.slang), launched as the
    tensor_cores backend says: one TF32 mma.sync a block, the weight gradient's operands loaded as
    they stand from the turned-over rows (ldmatrix, not .trans), each B fragment one 8-byte load, no
    tile copies and no 3xTF32 split (one rounding mask an operand, not a hi and lo part: no
    subtraction of a float's TF32 part from it)."""
    (launch,) = _launches(report, "mlp_loss_and_grad_float32")
    want = TensorCores().gradient_launch(
        Architecture((4, 16, 16, 4), "float32"), SM_90_DEFAULT, "mlp_loss_grad", 1000, 1000
    )
    assert (launch["name"], launch["grid"], launch["num_warps"]) == (
        "mlp_loss_grad",
        [want.blocks, 1, 1],
        want.threads // 32,
    )
    ptx = launch["ptx"]
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx and "f16" not in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx and ".trans" not in ptx
    assert "ld.global.v2.u32" in ptx and "cp.async" not in ptx
    assert len(re.findall(r"\bshfl\.sync", ptx)) == 5


@needs_tools
def test_float16_loss_and_gradient_of_four_128_wide_layers_lowers_to_warp_rows(report):
    """Lowered for CUDA, a float16 network of four 128-wide layers has its fused loss and gradient on
    the warp_rows backend: one kernel writing each layer's rows (shaders/nn/warp_rows.slang), a warp
    a tile of 16 samples with no barrier, launch bounds of one 256-thread group a multiprocessor,
    float16 mma.sync, and the loss's four shuffles; then XLA's products sum the rows."""
    (launch,) = _launches(report, "warp_rows_loss_and_grad_20-128x4-3_float16")
    assert (launch["name"], launch["grid"], launch["num_warps"]) == ("mlp_loss_rows", [8, 1, 1], 8)
    assert (launch["operands"], launch["results"]) == (4, 6)
    ptx = launch["ptx"]
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert ".maxntid 256, 1, 1" in ptx and ".minnctapersm 1" in ptx
    assert "bar.sync" not in ptx and "tf32" not in ptx
    assert len(re.findall(r"\bshfl\.sync", ptx)) == 4


@needs_tools
def test_an_eikonal_gradient_lowers_to_the_hessian_kernel(report):
    """The gradient of an eikonal loss of a float16 3-64x3-1 network lowers to the warp tiles'
    kernels: of its first-order parts, the forward pass, the input gradient without the
    parameters' sums (nothing reads them: a warp per tile, no barriers; x, dy, the scales of its
    dx, the parameters and their fragments in) and the parameters' gradient, and one launch of
    the Hessian kernel for the parameters' part of the second derivative: float16 mma.sync, the
    group's barriers, x, direction, dy, the parameters and their fragments in, a row of sums per
    thread group out."""
    launches = _launches(report, "eikonal_grad_3-64x3-1_float16")
    names = [launch["name"] for launch in launches]
    assert names.count("mlp_hessian_sums") == 1, names
    assert names.count("mlp_input_gradient") == 1, names
    assert {"mlp_forward", "mlp_backward_params"} <= set(names) and "mlp_backward" not in names, names
    (dx,) = [launch for launch in launches if launch["name"] == "mlp_input_gradient"]
    assert (dx["operands"], dx["results"]) == (5, 1) and "bar.sync" not in dx["ptx"]
    (hessian,) = [launch for launch in launches if launch["name"] == "mlp_hessian_sums"]
    assert (hessian["operands"], hessian["results"], hessian["num_warps"]) == (5, 1, 8)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in hessian["ptx"]
    assert "bar.sync" in hessian["ptx"] and "tf32" not in hessian["ptx"]


@needs_tools
def test_a_float32_eikonal_gradient_lowers_to_the_tensor_core_hessian_kernel(report):
    """In float32 the same gradient lowers to the tensor-core tiles' kernels, the second
    derivative's parameters' part to their Hessian kernel (the tiles' source with each layer's
    input tangent, 3xTF32 mma.sync): x, direction, dy, the parameters and the weights' fragments
    in, a row of sums per thread group out."""
    launches = _launches(report, "eikonal_grad_3-64x3-1_float32")
    names = [launch["name"] for launch in launches]
    assert names.count("mlp_hessian_sums") == 1 and names.count("mlp_input_gradient") == 1, names
    (hessian,) = [launch for launch in launches if launch["name"] == "mlp_hessian_sums"]
    assert (hessian["operands"], hessian["results"], hessian["num_warps"]) == (5, 1, 8)
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in hessian["ptx"]
    assert "bar.sync" in hessian["ptx"] and "cp.async" in hessian["ptx"]


@needs_tools
@pytest.mark.parametrize("case", ["tensor_cores", "tiles", "warp_mma"])
def test_activations_lower_in_every_cuda_kernel_family(report, case):
    """Networks with other activations lower for CUDA to the family their layout names: tanh and
    sigmoid on the wide float16 network's tensor cores (its loss and gradient in warp tiles of
    halves, its other kernels in TF32 tiles); sine, whose hidden layers keep z (which the
    tensor-core products cannot read as their input), on its SIMT tiles; sine and sigmoid in the
    narrow float16 network's warp tiles. Their PTX assembles (test_all_ptx_assembles_for_the_h100)."""
    (fused,) = _launches(report, f"activations_loss_and_grad_{case}")
    assert fused["name"] == "mlp_loss_grad"
    tensor_cores = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
    warp_tiles = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    if case == "warp_mma":  # the narrow network's gradient: its backward kernel alone, per sample
        assert warp_tiles in fused["ptx"]
        assert [launch["name"] for launch in _launches(report, f"activations_apply_grad_{case}")] == [
            "mlp_backward_params"
        ]
        return
    forward, backward = _launches(report, f"activations_apply_grad_{case}")
    kept = "mlp_forward" if case == "tensor_cores" else "mlp_forward_hidden"  # warp tiles: recomputed
    assert (forward["name"], backward["name"]) == (kept, "mlp_backward_params")
    for launch in (forward, backward):
        assert (warp_tiles in launch["ptx"]) == (case == "tensor_cores"), launch["name"]
        assert tensor_cores not in launch["ptx"], launch["name"]
    # the float16 network's loss and gradient on the wide warp tiles (shaders/nn/wide_warp.slang)
    assert (warp_tiles in fused["ptx"]) == (case == "tensor_cores")
    assert tensor_cores not in fused["ptx"]


TF32_MMA = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
TF32_SPLIT = re.compile(r"and\.b32\s+%r\d+, %r\d+, -8192;")
"""A float's TF32 part cut from it (``& 0xffffe000``, shaders/nn/tensor_cores.slang's split4 and
split2): what the 3xTF32 products do to each operand and one TF32 pass does not."""


@needs_tools
@pytest.mark.parametrize("case", ["eikonal_grad_3-64x3-1_float32"])
def test_float32_products_follow_jax_precision(report, case):
    """A float32 network's tensor-core tiles take JAX's precision rule (slax/nn/_precision.py): at
    JAX's default (DEFAULT, one TF32 pass, as XLA's products on these GPUs) mma.sync reads each
    operand as it is; at HIGHEST, asked by ``jax.default_matmul_precision``, the same kernels
    split each float into TF32 parts for three passes (3xTF32). (A network whose tiles fit the
    warp tiles' registers runs there at DEFAULT: test_wide_float32_lowers_to_tf32_warp_tiles.)"""
    default, highest = _launches(report, case), _launches(report, f"{case}_highest")
    assert [launch["name"] for launch in default] == [launch["name"] for launch in highest]
    tensor_core_kernels = 0
    for one_pass, three in zip(default, highest):
        if TF32_MMA in three["ptx"]:
            tensor_core_kernels += 1
            assert TF32_MMA in one_pass["ptx"], one_pass["name"]
            assert not TF32_SPLIT.search(one_pass["ptx"]) and TF32_SPLIT.search(three["ptx"]), three["name"]
    assert tensor_core_kernels >= 1


def _tile_copies(ptx: str) -> dict[str, int]:
    """The asynchronous tile copies in ``ptx`` by size (cp.async.cg of 16 bytes, cp.async.ca of 4),
    and its waits for them (cp.async.wait_all). Asserts that no group barrier follows a copy before
    a wait, in the PTX's order: a tile's copies are awaited before the barrier that publishes it."""
    counts = {"16": 0, "4": 0, "wait": 0}
    pending = False
    for line in ptx.splitlines():
        copy = re.search(r"cp\.async\.(?:cg|ca)\.shared\.global \[%r\d+\], \[%rd\d+\], (16|4), %r\d+;", line)
        if copy:
            counts[copy.group(1)] += 1
            pending = True
        elif "cp.async.wait_all" in line:
            counts["wait"] += 1
            pending = False
        elif re.search(r"\bbar(rier)?\.sync\b", line):
            assert not pending, "a group barrier after tile copies with no wait for them"
    return counts


@needs_tools
def test_wide_mlps_lower_to_tensor_cores_unless_switched_off(report):
    """Lowered for CUDA, a wide network's kernels run on tensor cores (TF32 mma.sync, PTX for sm_80,
    which Slang asks NVRTC for itself: both CUDA routes get it); with slax.config.tensor_cores off,
    the tiled kernels every device runs, with no mma.sync. Float tiles are filled by asynchronous
    copies (cp.async), awaited before their barrier: by 16 bytes where rows stay 16-byte aligned
    (4-16-16-4's), by 4 where a width is not a multiple of 4 floats (5-16-16-3's input and output
    gradient, the hidden tiles by 16); half ones by loads that convert them."""
    tf32 = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
    half = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    # at JAX's DEFAULT precision, 4-16-16-4 in both dtypes: the warp tiles, in registers (no copies)
    for dtype in ("float32", "float16"):
        (fused,) = _launches(report, f"mlp_loss_and_grad_{dtype}")
        assert re.search(r"^\.target sm_80$", fused["ptx"], re.MULTILINE)
        for launch in (fused, *_launches(report, f"mlp_apply_grad_{dtype}")):
            assert (tf32 if dtype == "float32" else half) in launch["ptx"], launch["name"]
            assert _tile_copies(launch["ptx"]) == {"16": 0, "4": 0, "wait": 0}, launch["name"]
    # at HIGHEST, float32: the tensor-core tiles, their tiles copied 16 bytes at a time
    for case in ("mlp_loss_and_grad_float32_highest", "mlp_apply_grad_with_input_float32_highest"):
        for launch in _launches(report, case):
            counts = _tile_copies(launch["ptx"])
            assert tf32 in launch["ptx"] and TF32_SPLIT.search(launch["ptx"]), launch["name"]
            assert counts["16"] and not counts["4"] and counts["wait"], launch["name"]
    forward, backward = _launches(report, "mlp_apply_grad_odd_widths_float32")
    assert (forward["name"], backward["name"]) == ("mlp_forward_hidden", "mlp_backward_params")
    forward_copies, backward_copies = _tile_copies(forward["ptx"]), _tile_copies(backward["ptx"])
    assert forward_copies["4"] and not forward_copies["16"] and forward_copies["wait"]  # x, 5 wide
    assert backward_copies["4"] and backward_copies["16"] and backward_copies["wait"]  # dy; hidden
    (tiled,) = _launches(report, "mlp_loss_and_grad_float32_tiled")
    assert tiled["name"] == "mlp_loss_grad"
    assert "mma.sync" not in tiled["ptx"] and "cp.async" not in tiled["ptx"]


def _loads_in_sample_loop(ptx: str) -> tuple[int, list[int]]:
    """(the line of the sample loop's fence, the lines of its loads from global memory) in a
    narrow network's gradient kernel: the loop is the one around the kernel's only fence
    (rereadStagedParameters), from the first branch after the fence back to a label above it, to
    that label."""
    lines = ptx.splitlines()
    fences = [i for i, line in enumerate(lines) if re.search(r"\b(membar\.cta|fence\.sc\.cta)\b", line)]
    assert len(fences) == 1, f"expected the one fence of rereadStagedParameters; found {len(fences)}"
    (fence,) = fences
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.match(r"^\$L\w+:$", line)}
    for end in range(fence, len(lines)):
        branch = re.search(r"\bbra(?:\.uni)?\s+(\$L\w+);", lines[end])
        if branch and labels.get(branch.group(1), end) < fence:
            start = labels[branch.group(1)]
            return fence, [i for i in range(start, end) if "ld.global" in lines[i]]
    raise AssertionError("no branch back to a label above the fence: the fence is in no loop")


@needs_tools
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("entry", ["mlp_loss_grad", "mlp_backward", "mlp_backward_params"])
def test_narrow_kernels_fence_before_loading_the_next_sample(nvrtc, entry, dtype):
    """In a narrow network's sample loop the fence that makes the staged parameters be re-read
    comes before the next sample's loads from global memory, not after them: after them, on CUDA,
    the parameter reads behind the fence waited for those loads (BENCHMARKS.md, tenth session).
    Tensor cores off: with them, float16's fused kernel runs tiles a warp (no per-sample fence)."""
    spec = KernelSpec(entry, source=mlp_source((4, 16, 4), dtype, tensor_cores=False))
    fence, loads = _loads_in_sample_loop(compile_entry_point(spec, CodeTarget.PTX))
    assert loads, "no loads of the next sample in the loop"
    assert all(line > fence for line in loads), f"loads at PTX lines {loads} before the fence at {fence}"


@needs_tools
@pytest.mark.jax_version
def test_changing_the_route_changes_the_lowering_of_a_jitted_function(cpu_path, lowering_report):
    """One jitted function lowered for CUDA under ptx, then slangpy, then ptx: the SlangPy route is
    lowered afresh (its zero-copy launcher creates the CUDA device it compiles on, which this
    machine lacks), not a cached PTX lowering reused."""
    switches = ["PTX launch", "no CUDA device for the SlangPy route", "PTX launch"]
    assert lowering_report["route_switch"] == switches


@needs_tools
@pytest.mark.jax_version
def test_export_serialises_the_ptx_routes_launches_with_their_check_disabled(cpu_path, lowering_report):
    """jax.export refuses the Triton launcher's custom call by default (no compatibility guarantee
    for its format); allowed by name (README, Limits), the artifact carries each kernel launch: a
    polynomial and its gradient, one launch each."""
    exported = lowering_report["export"]
    assert "custom calls whose targets have no compatibility guarantees" in exported["refused"]
    assert exported["platforms"] == ["cuda"]
    assert exported["launches"] == 2


@needs_tools
def test_all_ptx_assembles_for_the_h100(report, tmp_path):
    programs = {launch["ptx"] for launches in report.values() for launch in launches}
    assert len(programs) >= 20
    for k, ptx in enumerate(sorted(programs)):
        path = tmp_path / f"kernel{k}.ptx"
        path.write_text(ptx)
        result = subprocess.run(
            [str(PTXAS), "-arch=sm_90", "-o", os.devnull, str(path)], capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr


@needs_tools
def test_grids_beyond_one_row_use_the_y_dimension(nvrtc):
    spec = KernelSpec("scale_shift_float", path=str(SHADER_DIR / "kernels" / "scale_shift.slang"))
    count = 2 * ROW_THREADS + 5
    plan = launch_plan(spec, [("x_count", count), ("y_count", count), ("a", 1.0), ("b", 0.0)], count)
    assert plan.grid == (ROW_THREADS // 64, 3, 1)
    assert ptx_entry_parameter_types(plan.ptx, "scale_shift_float") == [
        "u64",
        "u64",
        "u32",
        "u32",
        "f32",
        "f32",
    ]


def _spec(tmp_path, name, source, entry):
    path = tmp_path / f"{name}.slang"
    path.write_text(source)
    return KernelSpec(entry, path=str(path))


def _square_groups(tmp_path) -> KernelSpec:
    """A kernel of 8x8 thread groups, which the PTX launcher cannot run."""
    return _spec(
        tmp_path,
        "square_groups",
        '[shader("compute")]\n[numthreads(8, 8, 1)]\n'
        "void k(uint3 t : SV_DispatchThreadID, uniform float* x, uniform uint count) { x[t.x] = 1; }\n",
        "k",
    )


@needs_tools
def test_kernels_outside_the_convention_are_refused(nvrtc, tmp_path):
    square = _square_groups(tmp_path)
    with pytest.raises(PtxLaunchError, match=r"numthreads\(8, 8, 1\).*numthreads\(32\*k, 1, 1\)"):
        launch_plan(square, [("count", 10)], 10)
    half_scalar = _spec(
        tmp_path,
        "half_scalar",
        '[shader("compute")]\n[numthreads(32, 1, 1)]\n'
        "void k(uint3 t : SV_DispatchThreadID, uniform half* x, uniform half a) { x[t.x] = a; }\n",
        "k",
    )
    with pytest.raises(PtxLaunchError, match="scalar 'a' has Slang type 'half'"):
        launch_plan(half_scalar, [("a", 1.0)], 10)


@needs_tools
def test_compile_errors_carry_file_and_line(nvrtc, tmp_path):
    broken = _spec(tmp_path, "broken", "// line 1\nvoid k( {\n", "k")
    with pytest.raises(SlangCompileError, match=r"broken\.slang:2:"):
        compile_entry_point(broken, CodeTarget.PTX)


def test_cuda_source_is_the_plain_kernel_signature():
    spec = KernelSpec("scale_shift_int", path=str(SHADER_DIR / "kernels" / "scale_shift.slang"))
    source = compile_entry_point(spec, CodeTarget.CUDA_SOURCE)
    assert 'extern "C" __global__ void scale_shift_int(int * ' in source


@needs_tools
def test_nvrtc_is_found_in_nvidias_wheel():
    """Without SLAX_NVRTC, the NVRTC that JAX's CUDA packages install (nvidia-cuda-nvrtc) is found."""
    env = {k: v for k, v in os.environ.items() if k != "SLAX_NVRTC"}
    env["PYTHONPATH"] = os.pathsep.join([str(CUDA_TOOLS), str(ROOT)])
    script = "from slax._slang_c import nvrtc_library; print(nvrtc_library())"
    result = run_python("-c", script, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(NVRTC)


def test_missing_nvrtc_is_explained(monkeypatch):
    monkeypatch.setenv("SLAX_NVRTC", "/nonexistent/libnvrtc.so")
    spec = KernelSpec("scale_shift_float", path=str(SHADER_DIR / "kernels" / "scale_shift.slang"))
    with pytest.raises(NvrtcNotFoundError, match="SLAX_NVRTC"):
        compile_entry_point(spec, CodeTarget.PTX)


@pytest.mark.parametrize("value", ["cuda", "", "PTX"])
def test_unknown_cuda_launch_is_rejected(value):
    before = slax.config.cuda_launch
    with pytest.raises(ValueError, match=r"cuda_launch must be one of \('slangpy', 'ptx'\)"):
        slax.config.cuda_launch = value
    assert slax.config.cuda_launch == before


@needs_tools
def test_ptx_compiled_after_an_edit_is_the_loaded_code(nvrtc, tmp_path):
    """The PTX route compiles a kernel when it is first lowered, which may be after its module (or
    a module it imports) was edited: it then compiles from the files as they were loaded."""
    (tmp_path / "helper.slang").write_text("module helper;\npublic float factor() { return 2.0; }\n")
    path = tmp_path / "scaled.slang"
    path.write_text(
        "import slax.kernel;\nimport helper;\n"
        '[shader("compute")]\n[numthreads(64, 1, 1)]\n'
        "void k(uint3 t : SV_DispatchThreadID, uniform float* x, uniform uint count)\n"
        "{ uint i = slax_thread_index(t); if (i < count) x[i] *= factor(); }\n"
    )
    loaded = _sources.content_of(str(path))
    spec = KernelSpec("k", path=str(path), content=loaded)
    before = compile_entry_point(spec, CodeTarget.PTX)
    assert _sources.snapshot(loaded) is None  # unchanged: compiled from disk
    (tmp_path / "helper.slang").write_text("module helper;\npublic float factor() { return 3.0; }\n")
    kept = _sources.snapshot(loaded)
    assert kept is not None and compile_entry_point(spec, CodeTarget.PTX, kept) == before
    edited = KernelSpec("k", path=str(path), content=_sources.content_of(str(path)))
    assert compile_entry_point(edited, CodeTarget.PTX) != before


@needs_tools
def test_module_path_with_a_quote_compiles_to_ptx(nvrtc, tmp_path):
    """NVRTC once failed on the #line directives Slang wrote with the path's quote unescaped."""
    folder = tmp_path / 'say "hi"'
    folder.mkdir()
    path = folder / "quoted.slang"
    path.write_text(
        "import slax.kernel;\n"
        '[shader("compute")]\n[numthreads(64, 1, 1)]\n'
        "void k(uint3 t : SV_DispatchThreadID, uniform float* x, uniform uint count) { x[t.x] = 1; }\n"
    )
    assert ".entry k(" in compile_entry_point(KernelSpec("k", path=str(path)), CodeTarget.PTX)


def test_kernels_outside_the_convention_take_the_slangpy_route(tmp_path, cpu_path):
    """The PTX launcher hands a kernel it cannot launch to its fallback (the SlangPy route on a
    GPU), saying why, instead of refusing it."""

    class Fallback:
        def lower(self, ctx, operands, **launch):
            return ("lowered by the fallback", launch["spec"].entry)

    square = _square_groups(tmp_path)
    launcher = PtxLauncher(fallback=Fallback())
    with pytest.warns(UserWarning, match=r"numthreads\(8, 8, 1\).*runs on the SlangPy route instead"):
        lowered = launcher.lower(None, [], spec=square, scalars=(("count", 10),), count=10, aliases=())
    assert lowered == ("lowered by the fallback", "k")


@needs_tools
@pytest.mark.jax_version
def test_linear_layer_vjp_lowers_or_falls_back_within_the_compile_limit(cpu_path):
    """The backward kernel of SlangPy's linear_layer, whose PTX Slang 2026.12 takes minutes, without
    end seen, to compile: lowering ends within the limit, with PTX launches or, past the limit, the kernel
    handed to the SlangPy route with a warning naming it, the limit and SLAX_CUDA_LAUNCH=slangpy."""
    env = {**_lowering_env(), "SLAX_PTX_COMPILE_TIMEOUT": "10"}
    result = run_python("tests/scripts/ptx_lowering.py", "linear_layer", env=env, timeout=180)
    assert result.returncode == 0, result.stderr[-5000:]
    found = json.loads(result.stdout.splitlines()[-1])
    if found["launches"] is not None and not found["warnings"]:
        assert any("linear_layer" in name for name in found["launches"])
    else:
        (warning,) = [w for w in found["warnings"] if "SLAX_PTX_COMPILE_TIMEOUT" in w]
        assert "'slax1_cotangent_linear_layer'" in warning and "within 10 s" in warning
        assert "SLAX_CUDA_LAUNCH=slangpy" in warning and "runs on the SlangPy route instead" in warning


@needs_tools
def test_ptx_compile_past_the_limit_is_a_launch_refusal(empty_ptx_cache, monkeypatch):
    """A compile past SLAX_PTX_COMPILE_TIMEOUT is killed and refused (the launcher then takes the
    SlangPy route); the refusal is remembered for the kernel's content, so it is not waited out
    twice."""
    monkeypatch.setenv("SLAX_PTX_COMPILE_TIMEOUT", "0.001")  # the child cannot even start
    spec = KernelSpec("scale_shift_float", path=str(SHADER_DIR / "kernels" / "scale_shift.slang"))
    content = spec_content(spec)
    with pytest.raises(PtxLaunchError, match=r"'scale_shift_float' to PTX .*within 0.001 s"):
        _checked_ptx(spec, content, ())
    monkeypatch.setenv("SLAX_PTX_COMPILE_TIMEOUT", "600")
    with pytest.raises(PtxLaunchError, match="within 0.001 s"):
        _checked_ptx(spec, content, ())
    _timed_out.pop(content)


@needs_tools
def test_one_compile_worker_serves_kernel_after_kernel(empty_ptx_cache, monkeypatch, tmp_path):
    """The PTX compiles share one worker process (its start-up paid once); a compile past the limit
    kills it, and the next compile starts another, which compiles as the first did."""
    from slax import _ptx_compile

    path = str(SHADER_DIR / "kernels" / "scale_shift.slang")
    compile_once = {
        entry: _compile(KernelSpec(entry, path=path))
        for entry in (
            "scale_shift_float",
            "scale_shift_half",
        )
    }
    worker = _ptx_compile._worker
    assert worker is not None and worker.poll() is None
    assert ".entry scale_shift_float(" in compile_once["scale_shift_float"]
    assert ".entry scale_shift_half(" in compile_once["scale_shift_half"]
    shutil.rmtree(tmp_path / "cache" / "ptx")  # compiled again, not read from the PTX cache
    monkeypatch.setenv("SLAX_PTX_COMPILE_TIMEOUT", "0.001")
    with pytest.raises(_ptx_compile.PtxCompileTimeout, match="within 0.001 s"):
        _compile(KernelSpec("scale_shift_float", path=path))
    assert _ptx_compile._worker is None and worker.poll() is not None  # killed
    monkeypatch.setenv("SLAX_PTX_COMPILE_TIMEOUT", "600")
    again = _compile(KernelSpec("scale_shift_float", path=path))
    assert again == compile_once["scale_shift_float"]
    assert _ptx_compile._worker is not None and _ptx_compile._worker is not worker


@needs_tools
def test_a_first_calls_compute_seconds_count_the_compile_workers(empty_ptx_cache, tmp_path):
    """tests/_helpers.py's compute_seconds, which bounds deep networks' first calls on a busy
    machine, counts the worker's CPU time: a compile there adds to it beyond this process's own
    (which only waits), and a worker that ended is no longer read."""
    from slax import _ptx_compile

    path = str(SHADER_DIR / "kernels" / "scale_shift.slang")
    _compile(KernelSpec("scale_shift_float", path=path))  # the worker is up
    assert _ptx_compile.worker_pid() == _ptx_compile._worker._process.pid
    shutil.rmtree(tmp_path / "cache" / "ptx")
    own, began = time.process_time(), compute_seconds()
    for entry in ("scale_shift_float", "scale_shift_half"):
        _compile(KernelSpec(entry, path=path))
    # The two compiles' Slang and NVRTC run in the worker: hundreds of CPU milliseconds.
    assert compute_seconds() - began - (time.process_time() - own) > 0.1
    _ptx_compile._close_worker()
    assert _ptx_compile.worker_pid() is None


@needs_tools
def test_the_compile_worker_follows_the_cache_directory_as_it_is_now(empty_ptx_cache, monkeypatch, tmp_path):
    """A kernel importing a module of slax.load_module_from_source by name compiles to PTX from
    the cache directory SLAX_CACHE_DIR names at the time, not when the worker started: the worker
    outlives the first compile, and a program (or a test) may point the cache elsewhere after it."""
    from slax import _ptx_compile

    path = str(SHADER_DIR / "kernels" / "scale_shift.slang")
    _compile(KernelSpec("scale_shift_float", path=path))  # the worker runs
    assert _ptx_compile._worker is not None
    factor = f"{np.random.default_rng(5).uniform(2.0, 3.0):.6f}"  # as the source writes it
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path / "later-cache"))
    slax.load_module_from_source("worker_factor", f"public float factor() {{ return {factor}; }}\n")
    ptx = _compile(_factor_user(tmp_path, "worker_factor"))
    assert ".entry k(" in ptx and f"0f{np.float32(factor).view(np.uint32):08X}" in ptx


def _factor_user(tmp_path, module: str) -> KernelSpec:
    """A kernel scaling its array by ``factor()`` of the module ``module``, imported by name."""
    return _spec(
        tmp_path,
        f"{module}_user",
        f"import slax.kernel;\nimport {module};\n"
        '[shader("compute")]\n[numthreads(64, 1, 1)]\n'
        "void k(uint3 t : SV_DispatchThreadID, uniform float* x, uniform uint count)\n"
        "{ uint i = slax_thread_index(t); if (i < count) x[i] *= factor(); }\n",
        "k",
    )


@needs_tools
def test_the_compile_worker_finds_a_relative_cache_directory_where_slax_resolved_it(
    empty_ptx_cache, monkeypatch, tmp_path
):
    """A relative SLAX_CACHE_DIR is resolved where slax first reads it (slax._device.cache_dir);
    the worker, started after an ``os.chdir``, keeps its own working directory, so it is handed the
    directory as resolved, not the variable's text: a kernel importing a module of
    load_module_from_source compiles."""
    from slax import _ptx_compile

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    monkeypatch.setenv("SLAX_CACHE_DIR", f"cache-{tmp_path.name}")  # a value of its own
    factor = f"{np.random.default_rng(58).uniform(2.0, 3.0):.6f}"
    slax.load_module_from_source("relative_worker_factor", f"public float factor() {{ return {factor}; }}\n")
    monkeypatch.chdir(second)
    _ptx_compile._close_worker()  # the next worker starts here, in the second directory
    _ptx_compile._worker = None
    ptx = _compile(_factor_user(tmp_path, "relative_worker_factor"))
    assert ".entry k(" in ptx and f"0f{np.float32(factor).view(np.uint32):08X}" in ptx


@needs_tools
def test_ptx_is_kept_by_content_for_the_next_process(empty_ptx_cache, monkeypatch, tmp_path):
    """A kernel's PTX is compiled once and read back from SLAX_CACHE_DIR/ptx afterwards, in this
    process or the next; an edit to a module the kernel imports, or other macros, compile anew."""
    from slax import _ptx_compile

    cached = tmp_path / "cache" / "ptx"
    slax.load_module_from_source("cached_factor", "public float factor() { return 2.5; }\n")
    spec = _factor_user(tmp_path, "cached_factor")
    first = _compile(spec)
    assert f"0f{np.float32(2.5).view(np.uint32):08X}" in first
    assert len(list(cached.glob("*.ptx"))) == 1
    with monkeypatch.context() as patched:
        patched.setattr(_ptx_compile, "_ask_worker", lambda *a: pytest.fail("compiled again, not read"))
        assert _compile(spec) == first
    slax.load_module_from_source("cached_factor", "public float factor() { return 3.5; }\n")
    assert f"0f{np.float32(3.5).view(np.uint32):08X}" in _compile(spec)
    _compile(spec, {"SLAX_CUDA_ARCH": "80"})
    assert len(list(cached.glob("*.ptx"))) == 3


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan", "inf"])
def test_ptx_compile_timeout_must_be_positive_seconds(monkeypatch, value):
    """``inf`` was taken, and select() then raised OverflowError at the first compile."""
    monkeypatch.setenv("SLAX_PTX_COMPILE_TIMEOUT", value)
    with pytest.raises(
        ValueError, match=f"SLAX_PTX_COMPILE_TIMEOUT must be a finite number of seconds.*{value!r}"
    ):
        timeout_s()


@pytest.mark.parametrize(("value", "capability"), [("90", 90), (" 8.6 ", 86), ("12.0", 120)])
def test_the_compute_capability_variable_takes_jaxs_spelling_and_refuses_the_rest(
    monkeypatch, value, capability
):
    """SLAX_CUDA_COMPUTE_CAPABILITY takes 90 or JAX's and nvidia-smi's 9.0; anything else was a bare
    ``invalid literal for int()`` naming no variable."""
    monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", value)
    assert compute_capability() == capability
    for bad in ("sm_90", "9.x", "0", "-90"):
        monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", bad)
        with pytest.raises(
            ValueError, match=f"SLAX_CUDA_COMPUTE_CAPABILITY={bad!r} is no compute capability"
        ):
            compute_capability()


@pytest.mark.skipif(
    not any(d.platform == "gpu" for d in jax.devices()),
    reason="launches kernels on a GPU; without one, the tests above check the fallback's lowering",
)
@pytest.mark.jax_version
def test_kernels_past_the_compile_limit_run_on_the_slangpy_route_on_a_gpu(tmp_path):
    """On a GPU with the PTX route, kernels whose PTX does not compile within
    SLAX_PTX_COMPILE_TIMEOUT (here none can) run on the SlangPy route, saying so, and give the
    twins' values and gradients. The script's cache directory is its own: PTX that another test
    compiled would be read, not compiled."""
    env = {
        **os.environ,
        "SLAX_CUDA_LAUNCH": "ptx",
        "SLAX_PTX_COMPILE_TIMEOUT": "0.001",
        "SLAX_CACHE_DIR": str(tmp_path / "cache"),
    }
    result = run_python("tests/scripts/ptx_fallback_gpu.py", env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert set(found["errors"]) == {"wave", "twist", "energy"}
    assert all(error < 1e-5 for error in found["errors"].values()), found["errors"]
    fallbacks = [w for w in found["warnings"] if "runs on the SlangPy route instead" in w]
    assert fallbacks and all("within 0.001 s" in w for w in fallbacks), found["warnings"]
