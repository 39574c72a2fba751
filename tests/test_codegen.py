"""slax/_codegen.py: the kernels generated for Slang functions; and the Python side of the kernel
calling convention (shaders/slax/kernel.slang), whose constants slax/_compile.py keeps beside KernelSpec."""

from __future__ import annotations

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import slax
from slax._codegen import name_prefix
from slax._compile import GROUP_SIZE, ROW_THREADS
from slax._device import SHADER_DIR
from slax.testing import check_grads


def test_launch_constants_match_the_slang_convention():
    source = (SHADER_DIR / "slax" / "kernel.slang").read_text()
    constants = {
        name: eval(value, {})  # simple integer products such as 64 * 32768
        for name, value in re.findall(r"static const uint (\w+) = ([\d\s*]+);", source)
    }
    assert constants == {"SLAX_GROUP_SIZE": GROUP_SIZE, "SLAX_ROW_THREADS": ROW_THREADS}


# --- every signature differentiates, whatever its names ---------------------------------------------

SIGNATURES = pathlib.Path(__file__).with_name("signatures.slang")


def _body_twin(v, m):
    return {"mass": m * m, "position": v * m[..., None]}


def _draw(rng, *shapes):
    return tuple(jnp.asarray(rng.uniform(-1, 1, size=s), jnp.float32) for s in shapes)


SIGNATURE_TWINS = {
    "returns": (lambda a, b: a * jnp.sin(b), lambda r: _draw(r, (5,), (3, 5))),
    "out_only": (lambda a, b: a * b + jnp.sin(a), lambda r: _draw(r, (4,), (4,))),
    "out_named_result": (lambda a, b: a * jnp.exp(b), lambda r: _draw(r, (4,), (4,))),
    "returns_and_out": (lambda a: (jnp.exp(a), a * a), lambda r: _draw(r, (6,))),
    "input_named_result": (lambda a: (a * a, a * 3), lambda r: _draw(r, (6,))),
    "inout_only": (lambda t, x: t * x + x, lambda r: _draw(r, (4,), (4,))),
    "returns_and_inout": (lambda t, x: (t + x * x, t * x), lambda r: _draw(r, (4,), (4,))),
    "inout_and_out": (lambda t, x: (jnp.sin(t) + x, t * x), lambda r: _draw(r, (4,), (4,))),
    "all_three": (
        lambda v, m: (
            2 * jnp.einsum("...ij,...j->...i", m, v),
            jnp.einsum("...ij,...j->...i", m, v),
            jnp.sum(jnp.einsum("...ij,...j->...i", m, v) ** 2, -1),
        ),
        lambda r: _draw(r, (2, 3), (2, 3, 3)),
    ),
    "struct_out": (_body_twin, lambda r: _draw(r, (3, 3), (3,))),
    "struct_inout": (
        lambda body, s: (
            {"mass": body["mass"] * s, "position": body["position"]},
            {"mass": body["mass"] + s, "position": body["position"] * s[..., None]},
        ),
        lambda r: ({"mass": _draw(r, (3,))[0], "position": _draw(r, (3, 3))[0]}, *_draw(r, (3,))),
    ),
    "no_diff_out": (lambda a: (jax.lax.stop_gradient(a) * 2, a * a), lambda r: _draw(r, (5,))),
    "no_diff_inout": (
        lambda t, x: (jax.lax.stop_gradient(t) + 1, jax.lax.stop_gradient(t) * x),
        lambda r: _draw(r, (5,), (5,)),
    ),
    "int_inout": (
        lambda n, x: (x * (n + 1).astype(jnp.float32), n + 1),
        lambda r: (jnp.arange(4, dtype=jnp.int32), *_draw(r, (4,))),
    ),
    "int_out": (lambda x: (jnp.floor(x).astype(jnp.int32), x * x), lambda r: _draw(r, (5,))),
    "tangent_names": (lambda x, t, c, p: x * t + c * p, lambda r: _draw(r, (3,), (3,), (3,), (3,))),
    "count": (
        lambda index, rest, thread, in0, out0, pair: index * rest + thread * in0 + out0 * pair,
        lambda r: _draw(r, (2,), (2,), (2,), (2,), (2,), (2,)),
    ),
}


@pytest.fixture(scope="module")
def signatures():
    return slax.load_module(SIGNATURES)


ON_EVERY_ROUTE = {"all_three", "struct_inout", "no_diff_out", "no_diff_inout", "int_inout", "int_out"}
"""The signatures whose kernels every route compiles: between them a result, ``out`` and ``inout``
parameters of vectors, a matrix, a struct, ``no_diff`` and integers. The others are the same
pieces in other mixes and under other names, which slax's Python generates alike for every route:
they run on one route (the CPU device, whose C++ is the stricter about names)."""


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[] if name in ON_EVERY_ROUTE else pytest.mark.one_device_kind)
        for name in SIGNATURE_TWINS
    ],
)
def test_every_signature_differentiates_in_both_modes(signatures, rng, name):
    """Return values, ``out``, ``inout``, ``no_diff`` and non-differentiable outputs, and their mixes,
    match a pure-JAX twin in value, jax.jvp and jax.vjp; parameter and function names that the
    generated kernel once used itself (``result``, ``x_t``, ``count``, ...) change nothing."""
    twin, draw = SIGNATURE_TWINS[name]
    report = check_grads(signatures[name], twin, *draw(rng), modes=("fwd", "rev"))
    assert report.rows and report.passed, f"{name}:\n{report}"


def test_generated_names_avoid_every_identifier_in_the_users_sources(tmp_path, monkeypatch):
    """A user may name things ``slax_...`` too: the generated kernel's prefix then moves on."""
    assert name_prefix(["x", "slaxative"]) == "slax_"
    assert name_prefix(["slax_count", "slax1_in0", "slax3_"]) == "slax2_"
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path))
    source = (
        "[Differentiable] float slax_primal_slax_count(float x) { return x; }\n"
        "[Differentiable] float slax_count(float slax_in0, float slax_index, out float slax_result)\n"
        "{ slax_result = slax_in0 * slax_index; return slax_in0 + slax_primal_slax_count(slax_index); }\n"
    )
    module = slax.load_module_from_source("reserved_looking_names", source)
    x, y = jnp.linspace(-1, 1, 5), jnp.linspace(2, 3, 5)
    check_grads(module.slax_count, lambda a, b: (a + b, a * b), x, y, raises=True)


def test_module_path_with_quotes(tmp_path, device_kind):
    """The generated kernel imports the module by path, as a Slang string literal. SlangPy's CPU
    device cannot build such a module: Slang's C++ carries the path in ``#line`` directives without
    escaping its quotes, and the C++ compiler rejects them (Slang 2026.12); the error says so. The
    same holds for SlangPy's CUDA route (NVRTC); the PTX route compiles without line directives."""
    folder = tmp_path / 'say "hi"'
    folder.mkdir()
    path = folder / "quoted.slang"
    path.write_text("[Differentiable]\nfloat f(float x) { return x * x; }\n")
    module = slax.load_module(path)
    if slax.launch_route() == "slangpy":  # SlangPy's CUDA compile cannot: it says so
        with pytest.raises(slax.SlangCompileError, match="holds a double quote.*PTX route"):
            module.f(3.0)
        return
    if device_kind == "cpu":
        with pytest.raises(slax.SlangCompileError, match=r"say \"hi\"(.|\n)*is not a valid filename"):
            module.f(3.0)
        return
    assert float(module.f(3.0)) == 9.0 and float(jax.grad(module.f)(3.0)) == 6.0


# --- structs whose differential is not their fields ------------------------------------------------

STRUCTS = pathlib.Path(__file__).with_name("slang") / "struct_differentials.slang"


@pytest.fixture(scope="module")
def structs():
    return slax.load_module(STRUCTS)


def _custom(rng, n=4):
    """A ``Custom`` (tests/slang/struct_differentials.slang): a dict of its fields, as JAX sees it."""
    x, y = _draw(rng, (n, 3), (n,))
    return {"x": x, "y": y, "n": jnp.asarray(rng.integers(-3, 4, size=n), jnp.int32)}


def _custom_energy(c, s):
    return jnp.sum(c["x"] ** 2, -1) * s + jax.lax.stop_gradient(c["y"]) * c["n"]


def _custom_scaled(c, s):
    y = jax.lax.stop_gradient(c["y"])
    old = {"x": jnp.sin(c["x"]), "y": jax.lax.stop_gradient(y + s), "n": c["n"]}
    return old, {"x": c["x"] * s[..., None], "y": y, "n": c["n"]}


def test_user_defined_differential_maps_through_its_derivative_members(structs, rng):
    """``typedef Tangent Differential`` with ``[DerivativeMember(Tangent.dx)] float3 x``: JAX's
    tangent of the struct is a dict of its fields (``x``, the ``no_diff`` ``y``, the integer
    ``n``), which the kernels map to and from ``Tangent`` as Slang's own derivatives do; as an
    argument, an ``inout`` parameter and a return value, in both modes."""
    (s,) = _draw(rng, (4,))
    check_grads(structs.custom_energy, _custom_energy, _custom(rng), s, raises=True)
    check_grads(structs.custom_scaled, _custom_scaled, _custom(rng), s, raises=True)


def test_a_differential_member_without_a_field_is_refused_naming_it(structs, rng):
    """``Wider.w`` belongs to no field of ``Narrow``: values run, derivatives are refused."""
    (x,) = _draw(rng, (3,))
    np.testing.assert_allclose(
        structs.narrow_twice({"x": x}), 2 * x, rtol=slax.testing.RELATIVE_TOLERANCE["float32"]
    )
    message = (
        r"'narrow_twice': 'n' is the struct 'Narrow', and its Differential type 'Wider' holds 2 "
        r"numbers \(z, w\), more than its differentiable fields \(x\) hold.*\[DerivativeMember"
    )
    with pytest.raises(TypeError, match=message):
        jax.grad(lambda x: structs.narrow_twice({"x": x}).sum())(x)
    with pytest.raises(TypeError, match=message):
        jax.jvp(lambda x: structs.narrow_twice({"x": x}), (x,), (x,))


def _particle_moved(p, v):
    moved = {"position": p["position"] + v * p["mass"][..., None], "mass": p["mass"]}
    return moved, {"position": p["position"], "mass": p["mass"] * 2}


@pytest.mark.one_device_kind  # the CPU device's C++ is where a missing default constructor can fail;
# each route's kernels of structs with a differential of their own:
# test_user_defined_differential_maps_through_its_derivative_members
def test_struct_without_a_default_constructor(structs, rng):
    """``Particle`` has only ``__init(float2, float)``: taken, returned and written to an ``out``
    parameter, in value and both modes of differentiation."""
    position, mass, v = _draw(rng, (5, 2), (5,), (5, 2))
    particle = {"position": position, "mass": mass}
    check_grads(
        structs.particle_energy,
        lambda p, v: 0.5 * p["mass"] * jnp.sum((v - p["position"]) ** 2, -1),
        particle,
        v,
        raises=True,
    )
    check_grads(structs.particle_moved, _particle_moved, particle, v, raises=True)
