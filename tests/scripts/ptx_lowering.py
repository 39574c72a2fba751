"""Lowers slax programs for CUDA with the PTX launch path, on a machine without a GPU, and reports
every kernel launch in the lowered StableHLO as JSON (tests/test_ptx_launch.py checks the report):
``{"launches": {case: [launch, ...]}, "route_switch": [...], "export": {...}}``.

``ptx_lowering.py programs`` lowers one program of each kind alone (:func:`main`);
``ptx_lowering.py linear_layer`` the vjp of SlangPy's linear_layer example alone.

Run by the test in a subprocess whose PYTHONPATH carries jaxlib's CUDA plugin (its Triton kernel
launcher serialises the calls), with ``SLAX_NVRTC`` and ``SLAX_CUDA_COMPUTE_CAPABILITY`` set.
Each custom call's serialised kernel call is decoded from its protobuf wire format, so the report
shows what XLA would launch: kernel name, warps, grid, parameters, the PTX itself.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
import zlib

import jax
import jax.numpy as jnp
import numpy as np

import slax
import slax.examples
from slax._ptx_launch import PTX_LAUNCH_TARGET, ptx_entry_parameter_types
from slax.nn import _backends

# This script checks that the MLP's kernels lower: "auto" takes them wherever they fit, as the
# tests' fused_kernels fixture has it (tests/conftest.py), rather than XLA where they lose.
_backends.AUTO = tuple((name, ()) for name, _ in _backends.AUTO)

ACCUMULATE = """
import slax.kernel;
[shader("compute")]
[numthreads(64, 1, 1)]
void accumulate_and_double(uint3 tid : SV_DispatchThreadID, uniform float* x, uniform float* acc,
                           uniform float* doubled, uniform uint count, uniform float a)
{
    uint i = slax_thread_index(tid);
    if (i >= count) return;
    acc[i] += a * x[i];
    doubled[i] = 2 * x[i];
}
"""


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _fields(data: bytes) -> list[tuple[int, int, object]]:
    """Protobuf wire format: (field number, wire type, value) in order."""
    i, out = 0, []
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = data[i : i + 8], i + 8
        elif wire == 5:
            value, i = data[i : i + 4], i + 4
        elif wire == 2:
            n, i = _varint(data, i)
            value, i = data[i : i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        out.append((number, wire, value))
    return out


def _decode_parameter(data: bytes) -> list:
    ((number, _, value),) = _fields(data)
    if number == 1:
        return ["array", dict((n, v) for n, _, v in _fields(value)).get(2, 0)]
    kinds = {2: "i1", 3: "i32", 4: "u32", 5: "i64", 6: "u64", 7: "fp32", 8: "fp64"}
    if kinds[number] == "fp32":
        return ["fp32", float(np.frombuffer(value, "<f4")[0])]
    if kinds[number] == "fp64":
        return ["fp64", float(np.frombuffer(value, "<f8")[0])]
    if kinds[number] in ("i32", "i64") and value >= 1 << 63:  # negative: sign-extended varint
        value -= 1 << 64
    return [kinds[number], value]


def decode_kernel_call(opaque: bytes) -> dict:
    """TritonAnyKernelCall{kernel_call=1{kernel=1{name=1, num_warps=2, ptx=4, cc=6}, grid=2,3,4,
    parameters=5}, name=4} as jaxlib's triton.proto defines it."""
    top = {n: v for n, _, v in _fields(zlib.decompress(opaque))}
    call = _fields(top[1])
    kernel = {n: v for n, _, v in _fields(next(v for n, _, v in call if n == 1))}
    scalars = {n: v for n, _, v in call if n in (2, 3, 4)}
    return {
        "name": kernel[1].decode(),
        "num_warps": kernel[2],
        "compute_capability": kernel[6],
        "ptx": kernel[4].decode(),
        "grid": [scalars.get(2, 0), scalars.get(3, 0), scalars.get(4, 0)],
        "parameters": [_decode_parameter(v) for n, _, v in call if n == 5],
    }


def _operations(op):
    for region in op.regions:
        for block in region:
            for inner in block.operations:
                yield inner
                yield from _operations(inner)


def launches(function, *args) -> list[dict]:
    """Every ``triton_kernel_call_ffi`` custom call of ``function`` lowered for CUDA."""
    module = jax.jit(function).trace(*args).lower(lowering_platforms=("cuda",)).compiler_ir("stablehlo")
    found = []
    for op in _operations(module.operation):
        if op.operation.name != "stablehlo.custom_call":
            continue
        attributes = op.operation.attributes
        target = attributes["call_target_name"].value
        if target != "triton_kernel_call_ffi":
            found.append({"target": target})
            continue
        config = attributes["mhlo.backend_config"]
        launch = decode_kernel_call(config["opaque"].value_bytes)
        aliases = str(attributes["output_operand_aliases"]) if "output_operand_aliases" in attributes else ""
        launch.update(
            target=target,
            operands=len(op.operation.operands),
            results=len(op.operation.results),
            aliases=[
                [int(a) for a in re.findall(r"\d+", m)]
                for m in re.findall(r"output_tuple_indices = \[[^\]]*\], operand_index = \d+", aliases)
            ],
            ptx_parameters=ptx_entry_parameter_types(launch["ptx"], launch["name"]),
        )
        found.append(launch)
    return found


def route_switch(function, *args) -> list[str]:
    """What one jitted function lowers to for CUDA under the routes ptx, slangpy, ptx in turn: the
    PTX launch, or what the SlangPy route needs (on a GPU, a buffer callback; here, where there is
    none, the CUDA device it fails to create at lowering)."""
    jitted = jax.jit(function)
    lowered = []
    for route in ("ptx", "slangpy", "ptx"):
        with slax.config.override(cuda_launch=route):
            try:
                text = jitted.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
            except slax.DeviceUnavailableError:
                lowered.append("no CUDA device for the SlangPy route")
                continue
        lowered.append("PTX launch" if "triton_kernel_call_ffi" in text else "no PTX launch")
    return lowered


def export(function, *args) -> dict:
    """``jax.export`` of ``function`` for CUDA: JAX's refusal as it is, and the kernel launches of
    the artifact with the PTX route's custom call allowed (``slax._ptx_launch`` says why)."""
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
    try:
        jax.export.export(jax.jit(function), platforms=("cuda",))(*shapes)
        refused = ""
    except ValueError as error:
        refused = str(error).splitlines()[0]
    allowed = [jax.export.DisabledSafetyCheck.custom_call(PTX_LAUNCH_TARGET)]
    exported = jax.export.export(jax.jit(function), platforms=("cuda",), disabled_checks=allowed)(*shapes)
    return {
        "refused": refused,
        "platforms": list(exported.platforms),
        "launches": exported.mlir_module().count(f"stablehlo.custom_call @{PTX_LAUNCH_TARGET}("),
    }


def main(programs_only: bool = False) -> None:
    """The report: one program of each kind slax lowers (a kernel, in place, Slang functions and
    their derivatives, tensors, the MLP's two precisions, a route switch, export), and unless
    ``programs_only`` the MLP's kernel families and variants too (:func:`kernel_cases`), which take
    most of the time: they check the kernels' code, which no JAX release changes, so the tests
    marked jax_version read the programs alone."""
    slax.config.cuda_launch = "ptx"
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=300), jnp.float32)
    shift = slax.load_module("kernels/scale_shift.slang")
    poly = slax.load_module("poly").polynomial
    examples = slax.load_module(slax.examples.MODULE)
    accumulate = slax.load_module_from_source("ptx_lowering_accumulate", ACCUMULATE)

    def scale_shift(entry, **scalars):
        kernel = shift.kernel(entry)
        result = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)  # noqa: E731
        return lambda a: kernel(a, results=[result(a)], threads=a.size, **scalars)[0]

    cases = {
        "scale_shift_float": (scale_shift("scale_shift_float", a=2.5, b=-1.0), x),
        "scale_shift_half": (scale_shift("scale_shift_half", a=2.5, b=-1.0), x.astype(jnp.float16)),
        "scale_shift_int": (scale_shift("scale_shift_int", a=3, b=-7), (x * 10).astype(jnp.int32)),
        "empty": (scale_shift("scale_shift_float", a=2.5, b=-1.0), jnp.zeros((0,), jnp.float32)),
        "in_place": (
            lambda a, acc: accumulate.kernel("accumulate_and_double")(
                a,
                acc,
                results=[jax.ShapeDtypeStruct(acc.shape, acc.dtype), jax.ShapeDtypeStruct(a.shape, a.dtype)],
                threads=a.size,
                in_place={1: 0},
                count=a.size,
                a=0.5,
            ),
            x,
            x * 3,
        ),
        "poly_grad": (jax.grad(lambda v: poly(2.0, 8.0, -1.0, v).sum()), x),
        "poly_jvp": (lambda v: jax.jvp(lambda u: poly(2.0, 8.0, -1.0, u), (v,), (v,)), x),
        "poly_vmap_grid": (jax.vmap(lambda v: poly(2.0, 8.0, -1.0, v)), x.reshape(30, 10)),
        "poly_grad_of_grad": (
            jax.grad(lambda v: jnp.sum(jax.grad(lambda u: poly(2.0, 8.0, -1.0, u).sum())(v) ** 2)),
            x,
        ),
        "poly_jacfwd_jacfwd": (jax.jacfwd(jax.jacfwd(lambda v: poly(2.0, 8.0, -1.0, v).sum())), x[:4]),
    }
    slangpy_style = slax.load_module("tests/slang/slangpy_style.slang").hashed_offset_square
    seeds = jnp.arange(300, dtype=jnp.uint32)
    cases["slangpy_style_grad"] = (jax.grad(lambda v: slangpy_style(v, seeds).sum()), x)
    tensors = slax.load_module("slangpy_examples")
    bilinear = slax.load_module(slax.examples.TENSOR_MODULE).bilinear
    texture, uv = jnp.asarray(rng.uniform(size=(5, 7, 3)), jnp.float32), jnp.full((40, 2), 0.3, jnp.float32)
    tensor_polynomial = lambda v: tensors.polynomial(slax.grid((300,)), 2.0, 8.0, -1.0, v, (300,))  # noqa: E731
    cases["tensor_polynomial"] = (tensor_polynomial, x)
    cases["tensor_polynomial_grad"] = (jax.grad(lambda v: tensor_polynomial(v).sum()), x)
    cases["bilinear_vjp"] = (lambda t, u: jax.vjp(bilinear, t, u)[1](bilinear(t, u)), texture, uv)
    cases["custom_activation_grad"] = (
        jax.grad(lambda v: tensors.custom_activation(slax.grid((300,)), v).sum()),
        x,
    )
    gather_vectors = slax.load_module(slax.examples.TENSOR_MODULE).gather_vectors
    at = jnp.arange(40, dtype=jnp.int32) % 3
    weights = (jnp.full((40, 4), 0.5), jnp.full((40, 3), 0.5), jnp.full((40, 2), 0.5))
    cases["gather_vectors_grad"] = (
        jax.grad(lambda *t: gather_vectors(*t, at, at, *weights).sum(), (0, 1, 2)),
        *(jnp.ones((3, size), jnp.float32) for size in (4, 3, 2)),
    )
    for example in slax.examples.EXAMPLES:
        function = getattr(examples, example.name)
        args = example.draw(rng, jnp.float32)
        cases[f"{example.name}_vjp"] = (
            lambda *a, f=function: jax.vjp(f, *a)[1](f(*a)),
            *args,
        )
        if example.second_order:  # forward over reverse: the tangent of the vjp
            cases[f"{example.name}_hvp"] = (
                lambda *a, f=function: jax.jvp(lambda *p: jax.vjp(f, *p)[1](f(*a)), a, a)[1],
                *args,
            )
    for dtype in (jnp.float32, jnp.float16):
        params = slax.nn.mlp_init(jax.random.key(0), (4, 16, 16, 4), dtype)
        data = jnp.asarray(rng.uniform(size=(1000, 4)), dtype)
        cases[f"mlp_loss_and_grad_{jnp.dtype(dtype).name}"] = (slax.nn.mlp_loss_and_grad, params, data, data)
        cases[f"mlp_apply_grad_{jnp.dtype(dtype).name}"] = (
            jax.grad(lambda p, d: slax.nn.mlp_apply(p, d).astype(jnp.float32).sum()),
            params,
            data,
        )
    cases["mlp_apply_grad_with_input_float32"] = (
        jax.grad(lambda p, d: slax.nn.mlp_apply(p, d).sum(), (0, 1)),
        *cases["mlp_apply_grad_float32"][1:],
    )
    for dtype in ("float32", "float16"):
        _, params, data, _ = cases[f"mlp_loss_and_grad_{dtype}"]
        squared_error_grad = jax.grad(slax.nn.mlp_squared_error, (0, 1))
        cases[f"mlp_squared_error_grad_{dtype}"] = (squared_error_grad, params, data, data)
    if not programs_only:
        cases.update(kernel_cases(rng, cases))
    report = {name: launches(function, *args) for name, (function, *args) in cases.items()}
    if not programs_only:
        with slax.config.override(tensor_cores=False):  # the tiled kernels every device runs
            # traced afresh: the switch is read when mlp_loss_and_grad is traced, and JAX reuses the
            # trace of a function it has seen
            _, *args = cases["mlp_loss_and_grad_float32"]
            report["mlp_loss_and_grad_float32_tiled"] = launches(
                lambda *a: slax.nn.mlp_loss_and_grad(*a), *args
            )
    switch = route_switch(lambda v: poly(2.0, 8.0, -1.0, v), x)
    value_and_grad = jax.value_and_grad(lambda v: poly(2.0, 8.0, -1.0, v).sum())
    exported = export(value_and_grad, x)
    json.dump({"launches": report, "route_switch": switch, "export": exported}, sys.stdout)


def kernel_cases(rng: np.random.Generator, programs: dict) -> dict:
    """The MLP's kernel families and their variants (precisions, widths, activations, second
    derivatives), beyond :func:`main`'s one program of each kind; ``programs`` holds main's cases,
    whose networks some of these reuse."""
    cases = {}
    # float32 products at float32's accuracy (HIGHEST: 3xTF32), by the argument and by JAX's context
    _, *args = programs["mlp_loss_and_grad_float32"]
    cases["mlp_loss_and_grad_float32_highest"] = (
        lambda *a: slax.nn.mlp_loss_and_grad(*a, precision="highest"),
        *args,
    )
    # the tensor-core tiles' float32 kernels, at HIGHEST (at DEFAULT these networks run on the TF32
    # warp tiles): the gradient with x's; widths 5 and 3 (not multiples of 4 floats), tiles copied 4
    # bytes at a time, dy's padding rows zero-filled
    _, *args = programs["mlp_apply_grad_with_input_float32"]
    cases["mlp_apply_grad_with_input_float32_highest"] = (
        jax.grad(lambda p, d: slax.nn.mlp_apply(p, d, precision="highest").sum(), (0, 1)),
        *args,
    )
    odd = slax.nn.mlp_init(jax.random.key(1), (5, 16, 16, 3), jnp.float32)
    cases["mlp_apply_grad_odd_widths_float32"] = (
        jax.grad(lambda p, d: slax.nn.mlp_apply(p, d, precision="highest").sum()),
        odd,
        jnp.asarray(rng.uniform(size=(1000, 5)), jnp.float32),
    )
    # narrow networks: float16's fused loss and gradient on tensor cores, a warp per tile, where
    # its widths fit (4-16-4, and 9-12-3 with a layer wider than 8); float32's a sample per thread
    for sizes, dtype in [((4, 16, 4), jnp.float16), ((9, 12, 3), jnp.float16), ((4, 16, 4), jnp.float32)]:
        narrow = slax.nn.mlp_init(jax.random.key(2), sizes, dtype)
        rows = jnp.asarray(rng.uniform(size=(1000, sizes[0])), dtype)
        cases[f"narrow_loss_and_grad_{'-'.join(map(str, sizes))}_{jnp.dtype(dtype).name}"] = (
            slax.nn.mlp_loss_and_grad,
            narrow,
            rows,
            jnp.asarray(rng.uniform(size=(1000, sizes[-1])), dtype),
        )
    # a wide float16 network's fused loss and gradient in warp tiles of halves (widths off
    # multiples of 16: padded columns)
    wide = slax.nn.mlp_init(jax.random.key(4), (20, 48, 48, 5), jnp.float16)
    cases["wide_loss_and_grad_20-48-48-5_float16"] = (
        slax.nn.mlp_loss_and_grad,
        wide,
        jnp.asarray(rng.uniform(size=(1000, 20)), jnp.float16),
        jnp.asarray(rng.uniform(size=(1000, 5)), jnp.float16),
    )
    # four 128-wide float16 layers: their weight-gradient sums fit neither the tensor-core tiles
    # nor the warp tiles, so the fused loss and per-sample gradients run in warp tiles writing
    # their rows (an odd output width: rows written a half at a time)
    rows_network = slax.nn.mlp_init(jax.random.key(5), (20, 128, 128, 128, 128, 3), jnp.float16)
    cases["warp_rows_loss_and_grad_20-128x4-3_float16"] = (
        slax.nn.mlp_loss_and_grad,
        rows_network,
        jnp.asarray(rng.uniform(size=(1000, 20)), jnp.float16),
        jnp.asarray(rng.uniform(size=(1000, 3)), jnp.float16),
    )
    # the gradient of an eikonal loss of the signed distance field's float16 network: the first-order
    # kernels, and the warp tiles' Hessian kernel for the parameters' part of the second derivative
    sdf = slax.nn.mlp_init(jax.random.key(6), (3, 64, 64, 64, 1), jnp.float16)

    def eikonal(params, points):
        gradient = jax.grad(lambda p: slax.nn.mlp_apply(params, p).astype(jnp.float32).sum())(points)
        norm = jnp.linalg.norm(gradient.astype(jnp.float32), axis=-1)
        return jnp.mean(slax.nn.mlp_apply(params, points).astype(jnp.float32) ** 2) + jnp.mean(
            (norm - 1) ** 2
        )

    cases["eikonal_grad_3-64x3-1_float16"] = (
        jax.grad(eikonal),
        sdf,
        jnp.asarray(rng.uniform(-1, 1, size=(1000, 3)), jnp.float16),
    )
    # the same in float32: the tensor-core tiles' kernels, and their Hessian kernel
    cases["eikonal_grad_3-64x3-1_float32"] = (
        jax.grad(eikonal),
        slax.nn.mlp_init(jax.random.key(6), (3, 64, 64, 64, 1), jnp.float32),
        jnp.asarray(rng.uniform(-1, 1, size=(1000, 3)), jnp.float32),
    )

    def eikonal_grad_highest(*args):
        with jax.default_matmul_precision("highest"):
            return jax.grad(eikonal)(*args)

    cases["eikonal_grad_3-64x3-1_float32_highest"] = (
        eikonal_grad_highest,
        *cases["eikonal_grad_3-64x3-1_float32"][1:],
    )
    # activations besides the defaults, in each CUDA kernel family: a wide network on tensor cores
    # (tanh, then sigmoid) and on the SIMT tiles (sine, whose hidden layers keep z), a narrow
    # float16 network's warp tiles (sine, then sigmoid); each its loss and gradient, and the
    # forward and backward kernels of a gradient
    for case, sizes, dtype, hidden, output in [
        ("tensor_cores", (4, 16, 16, 4), jnp.float16, "tanh", "sigmoid"),
        ("tiles", (4, 16, 16, 4), jnp.float32, "sine", "tanh"),
        ("warp_mma", (4, 16, 4), jnp.float16, "sine", "sigmoid"),
    ]:
        network = slax.nn.mlp_init(
            jax.random.key(3), sizes, dtype, activation=hidden, output_activation=output
        )
        rows = jnp.asarray(rng.uniform(size=(1000, sizes[0])), dtype)
        targets = jnp.asarray(rng.uniform(size=(1000, sizes[-1])), dtype)
        cases[f"activations_loss_and_grad_{case}"] = (slax.nn.mlp_loss_and_grad, network, rows, targets)
        cases[f"activations_apply_grad_{case}"] = (
            jax.grad(lambda p, d: slax.nn.mlp_apply(p, d).astype(jnp.float32).sum()),
            network,
            rows,
        )
    return cases


def linear_layer_vjp() -> None:
    """Only the vjp of SlangPy's linear_layer example (``ptx_lowering.py linear_layer``), whose
    backward kernel Slang 2026.12 takes minutes, without end seen, to compile: its launches, or
    what the PTX route warned when it gave the kernel to the SlangPy route (which has no CUDA
    device here)."""
    slax.config.cuda_launch = "ptx"
    layer = slax.load_module("slangpy_examples").linear_layer
    rng = np.random.default_rng(0)
    weights, bias, x, cotangent = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(6, 9), 6, 9, 6])
    function = lambda w, b, v: layer(slax.grid((6,)), w, b, v, (6,))  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            found = [
                launch["name"]
                for launch in launches(lambda *a: jax.vjp(function, *a)[1](cotangent), weights, bias, x)
            ]
        except slax.DeviceUnavailableError:
            found = None
    json.dump({"launches": found, "warnings": [str(w.message) for w in caught]}, sys.stdout)


if __name__ == "__main__":
    if sys.argv[1:] == ["linear_layer"]:
        linear_layer_vjp()
    else:
        main(programs_only=sys.argv[1:] == ["programs"])
