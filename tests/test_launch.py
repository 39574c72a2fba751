"""The launch route (slax/_launch.py, slax/_config.py): chosen in one place, from the platform and the
routes a computation was traced with; part of what JAX traces, so changing it retraces.

Lowering for CUDA itself is checked without a GPU in tests/test_ptx_launch.py (a jitted function
lowered under each route in turn)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import equations

import slax
from slax import nn
from slax._bridge import HostCopyLauncher, HostPointerLauncher, ZeroCopyLauncher
from slax._config import DeviceKind, LaunchRoutes
from slax._launch import launcher_for
from slax._ptx_launch import PTX_LAUNCH_TARGET, PtxLauncher
from slax.testing import RELATIVE_TOLERANCE

JAX = pytest.mark.jax_version
"""Marks the tests CI runs on every JAX release: the routes in what JAX traces, its retracing,
lowering and export; one route of those parametrized over them (the same static parameter)."""

SLAX_PRIMITIVES = {
    "slang_call",
    "slang_cotangent",
    "slang_kernel",
    "slang_mlp_forward",
    "slang_mlp_loss_grad",
    "slang_mlp_tangent",
}


@pytest.fixture(scope="module")
def poly():
    return slax.load_module("poly").polynomial


@pytest.fixture(scope="module")
def scale_shift():
    kernel = slax.load_module("kernels/scale_shift.slang").kernel("scale_shift_float")
    return lambda x: kernel(
        x, results=[jax.ShapeDtypeStruct(x.shape, x.dtype)], threads=x.size, a=2.0, b=1.0
    )[0]


@pytest.fixture
def default_devices():
    """slax's own choice of device per platform (a CUDA device for JAX on CUDA), whatever the
    device fixture chose for CPU-placed JAX."""
    with slax.config.override(device_kind=None):
        yield


def _slax_equations(jaxpr):
    """Every equation of a slax primitive in ``jaxpr``, nested jaxprs (grad, custom_vjp) included."""
    return equations(jaxpr, lambda equation: equation.primitive.name in SLAX_PRIMITIVES)


@pytest.mark.parametrize("route", ["slangpy", pytest.param("ptx", marks=JAX)])
def test_every_slax_primitive_is_traced_with_the_route(poly, scale_shift, route):
    params = nn.mlp_init(jax.random.key(0), (4, 8, 4))

    def program(x):
        y = poly(2.0, 8.0, -1.0, x) + scale_shift(x)
        loss, _ = nn.mlp_loss_and_grad(params, y.reshape(2, 4), y.reshape(2, 4))
        return (
            loss
            + jax.grad(lambda x: poly(1.0, 2.0, 3.0, x).sum())(x).sum()
            + nn.mlp_apply(params, x[:4]).sum()
            + jax.jvp(lambda x: nn.mlp_apply(params, x).sum(), (x[:4],), (x[4:],))[1]
        )

    with slax.config.override(cuda_launch=route):
        jaxpr = jax.make_jaxpr(program)(jnp.linspace(-1, 1, 8))
    equations = list(_slax_equations(jaxpr.jaxpr))
    assert {e.primitive.name for e in equations} == SLAX_PRIMITIVES
    assert {e.params["routes"] for e in equations} == {LaunchRoutes(cuda=route, cpu=slax.config.device_kind)}


@JAX
def test_changing_cuda_launch_retraces_a_jitted_function(poly):
    """A jitted function traced under one route is traced again under the other (JAX's caches are
    keyed by the routes), and reused when the first route comes back."""
    traced = []

    @jax.jit
    def f(x):
        traced.append(slax.config.cuda_launch)
        return poly(2.0, 8.0, -1.0, x)

    x = jnp.arange(4.0)
    other = "ptx" if slax.config.cuda_launch == "slangpy" else "slangpy"
    first = slax.config.cuda_launch
    f(x)
    f(x)
    with slax.config.override(cuda_launch=other):
        f(x)
        routes = [e.params["routes"] for e in _slax_equations(f.trace(x).jaxpr.jaxpr)]
    f(x)
    assert traced == [first, other]
    assert routes == [LaunchRoutes(cuda=other, cpu=slax.config.device_kind)]


@JAX
def test_changing_the_device_kind_retraces_a_jitted_function(poly, device_kind, request):
    """The device kind for CPU-placed JAX is traced too: a jitted function runs on the device it
    was traced for, and is traced again (not reused) for the other."""
    if device_kind == "cuda":
        pytest.skip("JAX on CUDA always uses the CUDA device")
    if device_kind == "cpu":
        request.getfixturevalue("vulkan_driver")  # the other kind
    traced = []

    @jax.jit
    def f(x):
        traced.append(slax.config.device_kind)
        return poly(2.0, 8.0, -1.0, x)

    x = jnp.arange(4.0)
    other = DeviceKind.CPU if device_kind == "vulkan" else DeviceKind.VULKAN
    results = [f(x)]
    with slax.config.override(device_kind=other):
        results.append(f(x))
        assert slax.launch_route("cpu") == ("host-pointer" if other is DeviceKind.CPU else "host-copy")
    results.append(f(x))
    assert traced == [DeviceKind(device_kind), other]
    assert all(np.array_equal(r, [-1.0, 9.0, 23.0, 41.0]) for r in results)


@JAX
def test_the_launcher_follows_the_platform_and_the_routes(default_devices, device_kind):
    for route in slax.config.CUDA_LAUNCHES:
        if device_kind != "cuda":
            assert isinstance(launcher_for("cpu", LaunchRoutes(route, DeviceKind.CPU)), HostPointerLauncher)
    assert isinstance(launcher_for("cuda", LaunchRoutes(cuda="slangpy")), ZeroCopyLauncher)
    assert isinstance(launcher_for("cuda", LaunchRoutes(cuda="ptx")), PtxLauncher)
    assert launcher_for("cuda", LaunchRoutes(cuda="ptx")) is launcher_for("cuda", LaunchRoutes(cuda="ptx"))


def test_cpu_placed_jax_on_vulkan_copies_through_the_host(default_devices, device_kind, vulkan_driver):
    if device_kind == "cuda":
        pytest.skip("JAX on CUDA launches on the CUDA device")
    for route in slax.config.CUDA_LAUNCHES:
        assert isinstance(launcher_for("cpu", LaunchRoutes(route, DeviceKind.VULKAN)), HostCopyLauncher)


@pytest.mark.parametrize("route", slax.config.CUDA_LAUNCHES)
def test_launch_route_names_the_route_taken(device_kind, route):
    on_cpu = {"cpu": "host-pointer", "vulkan": "host-copy", "cuda": None}[device_kind]
    with slax.config.override(cuda_launch=route):
        if on_cpu:
            assert slax.launch_route("cpu") == on_cpu
        with slax.config.override(device_kind=None):
            assert slax.launch_route("cuda") == route
        assert slax.launch_route() == (on_cpu or route)


@JAX
def test_export_on_a_host_callback_route_says_which_route_exports(poly):
    """jax.export of a kernel that runs as a host callback (the CPU routes) fails with slax's
    reason and what to do, not JAX's 'serialization of host_callbacks is not yet implemented'."""
    f = jax.jit(lambda x: poly(2.0, 8.0, -1.0, x))
    with slax.config.override(cuda_launch="slangpy"):  # on CUDA, the host-callback route
        with pytest.raises(
            NotImplementedError, match=r"jax\.export cannot serialise Slang kernel .*PTX route"
        ):
            jax.export.export(f)(jax.ShapeDtypeStruct((4,), jnp.float32))


@JAX
def test_an_exported_ptx_route_computation_runs(device_kind, poly, rng):
    """jax.export of the PTX route, its launcher's custom call allowed (README, Limits), runs the
    kernels: a polynomial and its gradient, against their closed forms."""
    if device_kind != "cuda":
        pytest.skip("runs the PTX route on a CUDA GPU; tests/test_ptx_launch.py lowers its export anywhere")
    value_and_grad = jax.jit(jax.value_and_grad(lambda x: poly(2.0, 8.0, -1.0, x).sum()))
    allowed = [jax.export.DisabledSafetyCheck.custom_call(PTX_LAUNCH_TARGET)]
    x = rng.uniform(-2.0, 2.0, 300).astype(np.float32)
    with slax.config.override(cuda_launch="ptx"):
        exported = jax.export.export(value_and_grad, disabled_checks=allowed)(
            jax.ShapeDtypeStruct(x.shape, x.dtype)
        )
    value, grad = exported.call(x)
    x64 = x.astype(np.float64)
    tolerance = RELATIVE_TOLERANCE["float32"]
    np.testing.assert_allclose(
        value, np.sum(2.0 * x64**2 + 8.0 * x64 - 1.0), rtol=tolerance, atol=tolerance * x.size
    )
    np.testing.assert_allclose(grad, 4.0 * x64 + 8.0, rtol=tolerance, atol=tolerance)
