"""The MLP's backends (slax/nn/_backends.py): the xla backend against the plain-JAX reference under
every transformation, forcing a backend and the refusal of one that does not fit, the choice that
``slax.nn.describe`` reports, and the settings that choose, which retrace no other function.
The kernel backends' values: tests/test_nn.py, test_tensor_cores.py, test_warp_mma.py."""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import pytest
from _helpers import draw_uniform, equations, mlp_inputs, relative_error, run_python
from _training import cast

import slax
from slax import nn
from slax._config import MLP_BACKENDS, current_routes
from slax.nn import _backends
from slax.nn._architecture import Architecture
from slax.nn._precision import Float32Products
from slax.testing import RELATIVE_TOLERANCE

NARROW, WIDE = (4, 16, 4), (13, 21, 10)
"""A network of each kind the CPU routes' kernels run: a sample per thread (148 parameters), and
tiles (514)."""


def _ids(sizes):
    return "-".join(map(str, sizes))


@functools.cache
def _problem(sizes, dtype, batch=37):
    keys = jax.random.split(jax.random.key(sum(sizes)), 3)
    params = nn.mlp_init(keys[0], sizes, dtype)
    x = mlp_inputs(params, keys[1], batch, dtype)
    return params, x, draw_uniform(keys[2], (batch, sizes[-1]), dtype)


def _assert_close(got, want, dtype):
    for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert got_leaf.shape == want_leaf.shape
        assert relative_error(got_leaf, want_leaf) < RELATIVE_TOLERANCE[dtype]


def _wavy(apply):
    return lambda params, x: jnp.sum(jnp.sin(1.3 * apply(params, x).astype(jnp.float32)))


def _eikonal(apply):
    """A loss of the network's input gradient: its gradient is second order in the network."""

    def loss(params, x):
        gradient = jax.grad(lambda x: apply(params, x).astype(jnp.float32).sum())(x)
        return jnp.mean((jnp.linalg.norm(gradient.astype(jnp.float32), axis=-1) - 1.0) ** 2)

    return loss


# --- the xla backend ---------------------------------------------------------------------------


@pytest.mark.one_device_kind  # no Slang kernel runs: the same XLA on every route
@pytest.mark.quick_sample
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("sizes", [NARROW, WIDE], ids=_ids)
def test_the_xla_backend_matches_the_reference_under_every_transformation(sizes, dtype, lowered):
    """Forced, the xla backend runs every operation with XLA's products, no Slang kernel lowered:
    mlp_apply under jit, its gradients in the parameters and in x (mlp_backward and
    mlp_backward_params), per example under vmap, mlp_loss_and_grad plain and vmapped, and the
    gradient of a loss of the network's input gradient (second order) all match the float32
    reference (activations rounded to the dtype) within the dtype's tolerance."""
    params, x, target = _problem(sizes, dtype)
    reference = functools.partial(nn.mlp_apply_reference, storage_dtype=dtype)
    twin_params, twin_x, twin_target = cast((params, x, target), jnp.float32)
    with slax.config.override(mlp_backend="xla"):
        _assert_close(jax.jit(nn.mlp_apply)(params, x), reference(params, x), dtype)
        for argnums in (0, (0, 1)):
            got = jax.jit(jax.grad(_wavy(nn.mlp_apply), argnums))(params, x)
            _assert_close(got, jax.grad(_wavy(reference), argnums)(twin_params, twin_x), dtype)
        per_example = jax.jit(jax.vmap(jax.grad(_wavy(nn.mlp_apply)), (None, 0)))(params, x[:5, None])
        want = jax.vmap(jax.grad(_wavy(reference)), (None, 0))(twin_params, twin_x[:5, None])
        _assert_close(per_example, want, dtype)
        loss_and_grad = jax.jit(lambda *args: nn.mlp_loss_and_grad(*args))
        want = jax.value_and_grad(nn.mlp_loss_reference)(
            twin_params, twin_x, twin_target, storage_dtype=dtype
        )
        _assert_close(loss_and_grad(params, x, target), want, dtype)
        grouped = jax.vmap(loss_and_grad, (None, 0, 0))(
            params, x[:36].reshape(2, 18, -1), target[:36].reshape(2, 18, -1)
        )
        for k in range(2):
            part = slice(18 * k, 18 * (k + 1))
            want = jax.value_and_grad(nn.mlp_loss_reference)(
                twin_params, twin_x[part], twin_target[part], storage_dtype=dtype
            )
            _assert_close(jax.tree.map(lambda leaf, k=k: leaf[k], grouped), want, dtype)
        got = jax.jit(jax.grad(_eikonal(nn.mlp_apply), (0, 1)))(params, x)
        _assert_close(got, jax.grad(_eikonal(reference), (0, 1))(twin_params, twin_x), dtype)
    assert lowered == []


# --- forcing and refusing -------------------------------------------------------------------------


@pytest.mark.parametrize(("sizes", "backend"), [(NARROW, "thread_sums"), (WIDE, "tiled")], ids=_ids)
def test_a_forced_backend_runs_every_operation(sizes, backend, lowered):
    """Forcing the backend that fits runs each operation on its kernels (and describe says it was
    forced), with the reference's loss and gradients."""
    params, x, target = _problem(sizes, "float32")
    with slax.config.override(mlp_backend=backend):
        assert all(line.startswith(f"{backend}: ") for line in nn.describe(params, x, "cpu").values())
        assert "forced by slax.config.mlp_backend" in nn.describe(params, x, "cpu")["mlp_apply"]
        got = jax.jit(lambda *args: nn.mlp_loss_and_grad(*args))(params, x, target)
    want = jax.value_and_grad(nn.mlp_loss_reference)(params, x, target)
    _assert_close(got, want, "float32")
    assert {key[1:] for key in lowered} == {("mlp_loss_grad", False)}


@pytest.mark.one_device_kind  # refused when traced or described: no kernel runs
@pytest.mark.parametrize(
    ("sizes", "dtype", "backend", "platform", "capability", "tensor_cores", "why"),
    [
        (
            NARROW,
            "float32",
            "tiled",
            "cpu",
            None,
            True,
            r"148 parameters' gradient sums fit a thread's registers",
        ),
        (WIDE, "float32", "thread_sums", "cpu", None, True, r"514 parameters' gradient sums exceed"),
        (
            WIDE,
            "float32",
            "tensor_cores",
            "cpu",
            None,
            True,
            r"it runs on CUDA GPUs, and this call runs on CPU",
        ),
        (
            WIDE,
            "float16",
            "tensor_cores",
            "cuda",
            "75",
            True,
            r"compute capability 8.0 or newer, and this is sm_75",
        ),
        (WIDE, "float16", "tensor_cores", "cuda", "90", False, r"slax.config.tensor_cores is off"),
        (NARROW, "float16", "tensor_cores", "cuda", "90", True, r"thread_sums runs narrow networks"),
    ],
)
def test_forcing_a_backend_that_does_not_fit_is_refused(
    monkeypatch, sizes, dtype, backend, platform, capability, tensor_cores, why
):
    """A forced backend that cannot run the network on the platform is refused naming the backend,
    the network and why, and what to set instead; where JAX runs (the CPU here) when the call is
    traced, and for another platform when describe asks for it (as lowering for it would)."""
    if capability:
        monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", capability)
    monkeypatch.setattr(slax.config, "mlp_backend", backend)
    monkeypatch.setattr(slax.config, "tensor_cores", tensor_cores)
    params, x, target = _problem(sizes, dtype)
    where = "CPU" if platform == "cpu" else f"CUDA sm_{capability}"
    message = (
        rf"slax.nn: the '{backend}' backend \(slax.config.mlp_backend\) cannot run the network "
        rf"{_ids(sizes)} {dtype} on {where}: .*{why}.*Set slax.config.mlp_backend = 'auto'"
    )
    with pytest.raises(ValueError, match=message):
        nn.describe(params, x, platform)
    if platform == "cpu" and jax.default_backend() == "cpu":  # where JAX runs the call it traces
        with pytest.raises(ValueError, match=message):  # a function JAX has not traced yet
            jax.jit(lambda params, x: nn.mlp_apply(params, x)).trace(params, x)
        with pytest.raises(ValueError, match=message):
            nn.mlp_loss_and_grad(params, x, target)


# --- the choice ---------------------------------------------------------------------------------


@pytest.mark.one_device_kind  # describe's rule, the same on every route: no kernel runs
@pytest.mark.parametrize(
    ("sizes", "dtype", "platform", "capability", "tensor_cores", "apply", "loss_and_grad", "says"),
    [
        (NARROW, "float32", "cpu", None, True, "thread_sums", "thread_sums", "a sample per thread"),
        (WIDE, "float16", "cpu", None, True, "tiled", "tiled", "tensor_cores: it runs on CUDA GPUs"),
        (NARROW, "float16", "cuda", "90", True, "thread_sums", "thread_sums", "a warp per tile of 16"),
        (NARROW, "float16", "cuda", "90", False, "thread_sums", "thread_sums", "a sample per thread"),
        (WIDE, "float16", "cuda", "90", True, "tensor_cores", "tensor_cores", "16 samples in registers"),
        (WIDE, "float32", "cuda", "90", True, "tensor_cores", "tensor_cores", "as mma.sync"),
        (WIDE, "float32", "cuda", "75", True, "tiled", "tiled", "compute capability 8.0"),
        ((32, *[64] * 8, 16), "float32", "cuda", "90", True, "xla", "xla", "tiled: slower than XLA"),
        ((32, *[64] * 8, 16), "float16", "cuda", "90", True, "warp_rows", "warp_rows", "written out for XLA"),
        ((32, 128, 128, 16), "float16", "cuda", "90", True, "warp_rows", "warp_rows", "written out for XLA"),
        ((64, 128, 64, 10), "float16", "cuda", "90", True, "tensor_cores", "tensor_cores", "as mma.sync"),
        ((64, 128, 64, 10), "float32", "cpu", None, True, "tiled", "tiled", "SIMT"),
    ],
)
def test_describe_names_the_backend_of_each_operation_and_why(
    monkeypatch, sizes, dtype, platform, capability, tensor_cores, apply, loss_and_grad, says
):
    """describe applies the rule lowering applies: on the CPU the Slang kernels that fit; on CUDA
    tensor cores where they fit and are allowed (a float16 network's fused loss and gradient as
    warp tiles, a narrow one's other operations a sample per thread, a wide one's in tiles), else
    the tiled kernels, and XLA where the rule's table (AUTO) says XLA's products win. Each line
    names the backend, the network and the platform; a batch's shape gives the same answer as the
    batch."""
    if capability:
        monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", capability)
    monkeypatch.setattr(slax.config, "tensor_cores", tensor_cores)
    params = nn.mlp_init(jax.random.key(0), sizes, dtype)
    x = jnp.zeros((1 << 18, sizes[0]), dtype)
    answer = nn.describe(params, x, platform)
    assert answer == nn.describe(params, x.shape, platform)
    assert list(answer) == [
        "mlp_apply",
        "jax.grad of mlp_apply",
        "mlp_loss_and_grad",
        "second derivatives of mlp_apply",
    ]
    where = "CPU" if platform == "cpu" else f"CUDA sm_{capability}"
    assert answer["mlp_apply"].startswith(f"{apply}: {_ids(sizes)} {dtype} on {where}, ")
    assert answer["jax.grad of mlp_apply"].startswith(f"{apply}: ")
    assert answer["mlp_loss_and_grad"].startswith(f"{loss_and_grad}: ")
    assert says in answer["mlp_loss_and_grad"]
    second = answer["second derivatives of mlp_apply"]
    assert second.startswith(f"{apply}: ")
    # the warp tiles' Hessian kernel: float16 networks at most 64 wide, on tensor cores
    assert ("warp tiles' Hessian kernel" in second) == (says == "16 samples in registers")


def _tangent_params(function, *args):
    """The static parameters of every mlp_backward_tangent in ``function``'s jaxpr (transposes
    included: the gradient is traced)."""
    jaxpr = jax.make_jaxpr(function)(*args).jaxpr
    found = equations(jaxpr, lambda e: e.primitive.name == "slang_mlp_backward_tangent")
    keys = ("input_gradient", "x_direction", "param_direction", "param_output")
    return [tuple(e.params[key] for key in keys) for e in found]


@pytest.mark.one_device_kind
def test_second_derivatives_bind_the_hessian_vector_product():
    """The backward launch's JVP in x and the parameters is mlp_backward_tangent, its own transpose:
    an eikonal loss's gradient in the parameters transposes it into the parameters' part along a
    direction in x alone (what a backend's Hessian kernel runs); the Hessian in x asks for the
    part in x along x; a first-order gradient binds none."""
    params, x, _ = _problem(WIDE, "float32")
    assert _tangent_params(jax.grad(_wavy(nn.mlp_apply), (0, 1)), params, x) == []
    eikonal = _tangent_params(jax.grad(_eikonal(nn.mlp_apply)), params, x)
    assert (False, True, False, True) in eikonal, eikonal
    hessian = _tangent_params(jax.hessian(lambda x: _wavy(nn.mlp_apply)(params, x)), x[:3])
    assert hessian and all(key[:2] == (True, True) for key in hessian), hessian


# xla on one route: no Slang kernel runs, the same XLA on every route
@pytest.mark.parametrize("backend", ["auto", pytest.param("xla", marks=pytest.mark.one_device_kind)])
def test_an_input_gradient_nothing_differentiates_in_the_parameters_drops_their_sums(
    monkeypatch, backend, lowered
):
    """jax.jit's dead-code elimination: where nothing reads the parameters' gradients of a backward
    launch (the input gradient inside an eikonal loss, or jax.grad in x alone), the launch runs
    with ``param_output`` off, which a backend may run without the sums (the tile families' and
    the warp tiles' mlp_input_gradient); where they are read, with it on. The gradients are the
    reference's."""
    calls = []

    def recording(cls):
        original = cls.backward

        def backward(self, arch, platform, data, params, group_ndim, input_gradient, param_output, routes):
            calls.append((input_gradient, param_output))
            return original(
                self, arch, platform, data, params, group_ndim, input_gradient, param_output, routes
            )

        monkeypatch.setattr(cls, "backward", backward)

    recording(_backends.KernelBackend)
    recording(_backends.Xla)
    monkeypatch.setattr(slax.config, "mlp_backend", backend)
    params, x, _ = _problem(WIDE, "float32")
    reference = functools.partial(nn.mlp_apply_reference, storage_dtype="float32")
    cases = [
        (jax.grad(_eikonal(nn.mlp_apply)), jax.grad(_eikonal(reference)), (True, False)),
        (jax.grad(_wavy(nn.mlp_apply), 1), jax.grad(_wavy(reference), 1), (True, False)),
        (jax.grad(_wavy(nn.mlp_apply), (0, 1)), jax.grad(_wavy(reference), (0, 1)), (True, True)),
        (jax.grad(_wavy(nn.mlp_apply)), jax.grad(_wavy(reference)), (False, True)),
    ]
    for got, want, launched in cases:
        calls.clear()
        lowered.clear()
        _assert_close(jax.jit(got)(params, x), want(params, x), "float32")
        assert calls[:1] == [launched], calls
        dx_alone = [key[1] for key in lowered if key[1] == "mlp_input_gradient"]
        assert dx_alone == (["mlp_input_gradient"] if launched == (True, False) and backend == "auto" else [])


def test_describe_refuses_a_platform_it_does_not_lower_for():
    params, x, _ = _problem(NARROW, "float32")
    with pytest.raises(
        ValueError, match=r"slax.nn.describe: platform must be one of \('cpu', 'cuda'\); got 'tpu'"
    ):
        nn.describe(params, x, "tpu")
    with pytest.raises(ValueError, match=r"slax.nn.describe: x must have shape \(..., 4\); got \(3, 5\)"):
        nn.describe(params, (3, 5))


def test_the_rule_sends_wide_networks_to_xla_only_on_cuda():
    """The rule's table passes over the tensor-core tiles on CUDA for networks with two adjacent
    128-wide hidden layers, in float16 at every batch, in float32 below 2^16 samples; nowhere on
    the CPU; not for 64-128-64-10, whose one 128-wide layer the kernels run faster."""
    (cases,) = [passed_over for name, passed_over in _backends.AUTO if name == "tensor_cores"]
    gpu, cpu = _backends.Platform("cuda", True, 90), _backends.Platform("cpu")

    def passed_over(arch, platform, samples):
        return any(case.applies(arch, platform, samples) for case in cases)

    wide = Architecture((32, 128, 128, 16), "float32")
    assert passed_over(wide, gpu, 1 << 14)
    assert not passed_over(wide, gpu, 1 << 18)
    assert passed_over(Architecture((32, 128, 128, 16), "float16"), gpu, 1 << 20)
    assert not passed_over(wide, cpu, 1 << 14)
    assert not passed_over(Architecture((64, 128, 64, 10), "float32"), gpu, 1 << 12)
    assert not passed_over(Architecture((32, 64, 64, 16), "float16"), gpu, 1 << 14)


def test_auto_takes_xla_not_the_tiled_kernels_on_a_gpu_with_tensor_cores(monkeypatch):
    """A float32 network the tensor-core kernels do not run (eight 64-wide hidden layers: their
    weight gradients overflow a thread's registers) runs on XLA on such a GPU, the tiled kernels
    where tensor cores are off: the tiled kernels lost to XLA wherever measured on an H100."""
    monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", "90")
    deep = Architecture((32,) + (64,) * 8 + (16,), "float32")
    on = _backends.choose(deep, "cuda", 1 << 18, _backends.BackendRequest("auto", True))
    assert on.backend.name == "xla" and "tiled: slower than XLA" in on.why
    off = _backends.choose(deep, "cuda", 1 << 18, _backends.BackendRequest("auto", False))
    assert off.backend.name == "tiled"


def test_xla_runs_float32_products_as_the_precision_asks_where_tensor_cores_may_run(monkeypatch):
    """float32 networks on XLA take JAX's precision on a GPU whose tensor cores slax may use: one
    TF32 pass (XLA's DEFAULT) where the call asks for TF32, 3xTF32 at HIGHEST, and describe says
    which; full float32 on the CPU, with tensor cores off, and below sm_80, whatever the call asks;
    float16 networks XLA's default everywhere. Which GPU runs the 3xTF32 products, and their
    accuracy: test_the_xla_backend_matches_the_reference_under_every_transformation on a GPU."""
    monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", "90")
    deep = Architecture((32,) + (64,) * 8 + (16,), "float32")
    xla = _backends.BACKENDS["xla"]
    tf32, float32 = Float32Products.TF32, Float32Products.FLOAT32

    def request(products, tensor_cores=True):
        return _backends.BackendRequest("xla", tensor_cores, products)

    def products(arch, platform, asked, tensor_cores=True):
        return _backends.xla_products(arch, _backends.Platform.of(platform, request(asked, tensor_cores)))

    three = jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3
    assert products(deep, "cuda", float32) is three
    assert products(deep, "cuda", tf32) == jax.lax.Precision.DEFAULT
    for asked in (tf32, float32):
        assert products(deep, "cuda", asked, tensor_cores=False) == jax.lax.Precision.HIGHEST
        assert products(deep, "cpu", asked) == jax.lax.Precision.HIGHEST
        assert products(Architecture(deep.sizes, "float16"), "cuda", asked) == jax.lax.Precision.DEFAULT
    for asked in (tf32, float32):
        choice = _backends.choose(deep, "cuda", 1 << 18, _backends.BackendRequest("auto", True, asked))
        assert f"XLA's own matrix products in {asked.value}" in choice.describe(deep, "backward")
    assert "TF32" not in xla.summary(deep, _backends.Platform("cpu"), "backward")
    monkeypatch.setenv("SLAX_CUDA_COMPUTE_CAPABILITY", "75")
    assert products(deep, "cuda", tf32) == jax.lax.Precision.HIGHEST


# --- the settings -------------------------------------------------------------------------------


def test_the_registry_holds_the_backends_the_setting_names():
    assert tuple(_backends.BACKENDS) == MLP_BACKENDS[1:] and MLP_BACKENDS[0] == "auto"
    with pytest.raises(ValueError, match=r"mlp_backend must be one of \('auto', 'thread_sums'.*; got 'fast'"):
        slax.config.mlp_backend = "fast"
    assert slax.config.mlp_backend == "auto"


@pytest.mark.one_device_kind
def test_the_environment_variable_is_read_at_import():
    """``SLAX_MLP_BACKEND`` sets the setting when slax is imported; a name no backend has stops the
    import, listing the names."""
    show = (
        "import slax, slax.nn._backends as b; "
        "print(slax.config.mlp_backend, b.BackendRequest.current().backend)"
    )
    result = run_python("-c", show, env={**os.environ, "SLAX_MLP_BACKEND": "xla"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["xla", "xla"]
    result = run_python("-c", "import slax", env={**os.environ, "SLAX_MLP_BACKEND": "cuda"}, timeout=300)
    assert result.returncode != 0 and "mlp_backend must be one of ('auto'" in result.stderr


@pytest.fixture(scope="module")
def poly():
    return slax.load_module("poly").polynomial


def test_switching_the_mlp_backend_retraces_no_plain_slang_function(poly, monkeypatch):
    """The MLP's settings are no launch route: a jitted function of a plain Slang function is
    traced once however they change, while an MLP call traced afresh carries the new request."""
    traced = []

    @jax.jit
    def f(x):
        traced.append(1)
        return poly(2.0, 8.0, -1.0, x)

    x = jnp.arange(4.0)
    routes = current_routes()
    f(x)
    with slax.config.override(mlp_backend="xla", tensor_cores=not slax.config.tensor_cores):
        f(x)
        assert current_routes() == routes
    monkeypatch.setattr(slax.config, "mlp_backend", "xla")
    monkeypatch.setattr(slax.config, "tensor_cores", not slax.config.tensor_cores)
    f(x)
    assert len(traced) == 1 and f._cache_size() == 1
    params, data, _ = _problem(NARROW, "float32")
    jaxpr = jax.make_jaxpr(lambda x: nn.mlp_apply(params, x))(data)
    (forward,) = [e for e in jaxpr.eqns if e.primitive.name == "slang_mlp_forward"]
    products = _backends.BackendRequest.current().products  # JAX's matmul precision now
    assert forward.params["request"] == _backends.BackendRequest("xla", slax.config.tensor_cores, products)
