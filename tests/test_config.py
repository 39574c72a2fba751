"""slax.config: debug_nans names the first Slang kernel that turns finite inputs into NaN/Inf, raising
FloatingPointError (inside jax.jit, carried by the JaxRuntimeError XLA reports); override sets
switches for a block, in its thread or asyncio task only, and restores them; reflection_device
describes modules on another device."""

from __future__ import annotations

import asyncio
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import slangpy as spy

import slax
from slax._config import DeviceKind, current_routes
from slax._device import reflection_device
from slax.nn._backends import BackendRequest


@pytest.fixture
def debug_nans():
    with slax.config.override(debug_nans=True):
        yield


def _switches():
    return slax.config.cuda_launch, slax.config.debug_nans


def test_override_restores_the_previous_values_also_on_error():
    before = _switches()  # the suite may run under SLAX_CUDA_LAUNCH=ptx
    other = "slangpy" if before[0] == "ptx" else "ptx"
    with pytest.raises(RuntimeError, match="inside"):
        with slax.config.override(cuda_launch=other, debug_nans=not before[1]) as config:
            assert (config.cuda_launch, config.debug_nans) == (other, not before[1])
            raise RuntimeError("inside")
    assert _switches() == before


def test_override_validates_like_assignment():
    before = _switches()
    with pytest.raises(ValueError, match="cuda_launch must be one of"):
        with slax.config.override(debug_nans=not before[1], cuda_launch="cuda"):
            pass
    assert _switches() == before


@pytest.fixture(scope="module")
def examples():
    return slax.load_module("examples")


def _raises_floating_point_error(match: str, jitted: bool = False):
    """Eager calls raise FloatingPointError. Inside jax.jit the check runs in XLA, which reports the
    callback's exception as a JaxRuntimeError whose message carries it."""
    if jitted:
        return pytest.raises(jax.errors.JaxRuntimeError, match=f"FloatingPointError: slax: {match}")
    return pytest.raises(FloatingPointError, match=f"^slax: {match}")


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_names_the_kernel_that_overflowed(examples, debug_nans, jitted):
    x = jnp.array([0.5, 1.0, 20.0], jnp.float16)  # exp(20) overflows half: softplus gives inf

    def f(x):
        return examples.wave(examples.softplus(x), x)

    message = r"Slang function 'softplus'.*non-finite value \(inf\).*index \(2,\)"
    with _raises_floating_point_error(message, jitted):
        jax.block_until_ready(jax.jit(f)(x) if jitted else f(x))


def test_upstream_nan_is_not_blamed_on_slang(examples, debug_nans):
    x = jnp.array([1.0, -1.0], jnp.float32)
    y = examples.wave(jnp.log(x), x)  # log(-1) is NaN before the kernel runs
    assert np.isnan(np.asarray(y)[1])


def test_off_by_default_and_finite_results_pass(examples):
    assert slax.config.debug_nans is False
    assert np.isinf(np.asarray(examples.softplus(jnp.array([20.0], jnp.float16))))[0]
    slax.config.debug_nans = True
    try:
        np.testing.assert_allclose(examples.softplus(jnp.array([0.0])), [np.log(2.0)], rtol=1e-6)
    finally:
        slax.config.debug_nans = False


def test_jax_debug_nans_is_honoured(examples):
    with jax.debug_nans(True), _raises_floating_point_error("Slang function 'softplus'"):
        jax.block_until_ready(examples.softplus(jnp.array([20.0], jnp.float16)))


def test_backward_kernel_is_checked(examples, debug_nans):
    # d/dx sqrt(x^2 + y^2) at the origin: 0/0 in Slang's bwd_diff, from finite inputs.
    with _raises_floating_point_error("bwd_diff of Slang function 'to_polar'"):
        jax.block_until_ready(jax.grad(lambda x: examples.to_polar(x, 0.0)[0])(0.0))


def test_reflection_device_is_read_from_its_variable(monkeypatch):
    monkeypatch.setenv("SLAX_REFLECTION_DEVICE", "cpu")
    assert type(slax.config)().reflection_device is DeviceKind.CPU
    monkeypatch.setenv("SLAX_REFLECTION_DEVICE", "gpu")
    with pytest.raises(ValueError, match="'gpu' from the SLAX_REFLECTION_DEVICE variable"):
        type(slax.config)()


def test_functions_reflected_on_another_device_compute_where_jax_runs(tmp_path):
    """slax.config.reflection_device: a module is described by the device it names (on the PTX
    route, SlangPy's CPU device in place of its CUDA device, for profilers), while its kernels run
    on the device of JAX's computation, with the same results and gradients."""
    path = tmp_path / "reflected_elsewhere.slang"  # a fresh module: no reflection cached for it
    path.write_text("[Differentiable]\nfloat cubic(float a, float x) { return a * x * x * x + x; }\n")
    if reflection_device().info.type == spy.DeviceType.cpu:
        pytest.skip("the CPU device already reflects modules here (it runs the kernels)")
    x = jax.random.uniform(jax.random.key(5), (300,), minval=-2.0, maxval=2.0)
    with slax.config.override(reflection_device="cpu"):
        assert reflection_device().info.type == spy.DeviceType.cpu
        module = slax.load_module(path)
        y = jax.jit(module.cubic)(1.5, x)
        dx = jax.grad(lambda x: module.cubic(1.5, x).sum())(x)
    expected = 1.5 * np.asarray(x, np.float64) ** 3 + np.asarray(x, np.float64)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, 4.5 * np.asarray(x, np.float64) ** 2 + 1.0, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value", [3, True])
def test_a_device_kind_that_is_no_name_is_refused(value):
    before = slax.config.reflection_device  # None, or what SLAX_REFLECTION_DEVICE set
    with pytest.raises(
        TypeError, match="from slax.config.reflection_device must be one of 'vulkan', 'cpu', 'cuda'"
    ):
        slax.config.reflection_device = value
    with pytest.raises(TypeError, match="from slax.set_device_kind must be one of"):
        slax.set_device_kind(value)
    assert slax.config.reflection_device is before


def test_a_module_the_reflection_device_cannot_compile_says_why(tmp_path):
    if reflection_device().info.type == spy.DeviceType.cpu:
        pytest.skip("the CPU device reflects modules here anyway (it runs the kernels)")
    path = tmp_path / "barrier.slang"  # group barriers: not on the CPU target
    path.write_text(
        'import slax.kernel;\ngroupshared float tile[64];\n[shader("compute")]\n[numthreads(64, 1, 1)]\n'
        "void reverse(uint3 id : SV_DispatchThreadID, uniform float* x, uniform float* y,\n"
        "             uniform uint count)\n"
        "{\n    uint i = slax_thread_index(id);\n    tile[i % 64] = x[i];\n"
        "    GroupMemoryBarrierWithGroupSync();\n    y[i] = tile[63 - i % 64];\n}\n"
    )
    with slax.config.override(reflection_device="cpu"):
        with pytest.raises(slax.SlangCompileError, match=r"(?s)barrier.slang.*SLAX_REFLECTION_DEVICE asks"):
            slax.load_module(path)


def _other_launch(launch: str) -> str:
    return "slangpy" if launch == "ptx" else "ptx"


def _in_threads(*bodies):
    """Runs each body in a thread of its own and re-raises the first failure."""
    failures = []

    def run(body):
        try:
            body()
        except BaseException as failure:  # re-raised by the main thread
            failures.append(failure)

    threads = [threading.Thread(target=run, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


@pytest.mark.one_device_kind
def test_overlapping_overrides_in_two_threads_each_see_their_own():
    """Thread A enters its block, then B enters its own, then A leaves while B is inside, then B
    leaves: each sees only its values, and the global values are what they were."""
    before = repr(slax.config), current_routes()
    global_launch = slax.config.cuda_launch
    values = {"A": (_other_launch(global_launch), True), "B": (global_launch, False)}
    a_entered, b_entered, a_left = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def look(name):
        seen.setdefault(name, []).append((slax.config.cuda_launch, slax.config.tensor_cores))
        assert (current_routes().cuda, BackendRequest.current().tensor_cores) == values[name]

    def thread_a():
        with slax.config.override(cuda_launch=values["A"][0], tensor_cores=values["A"][1]):
            a_entered.set()
            assert b_entered.wait(10)
            look("A")
        a_left.set()

    def thread_b():
        assert a_entered.wait(10)
        with slax.config.override(cuda_launch=values["B"][0], tensor_cores=values["B"][1]):
            b_entered.set()
            assert a_left.wait(10)
            look("B")

    _in_threads(thread_a, thread_b)
    assert seen == {"A": [values["A"]], "B": [values["B"]]}
    assert (repr(slax.config), current_routes()) == before


@pytest.mark.one_device_kind
def test_a_function_jitted_in_two_threads_traces_each_threads_routes():
    """Both threads inside their blocks call one jitted function: each trace sees its thread's
    routes, so the function is traced once per route, and outside the blocks with the global ones."""
    barrier = threading.Barrier(2, timeout=10)
    launches = {"A": "ptx", "B": "slangpy"}
    traced = []

    @jax.jit
    def f(x):
        traced.append(current_routes().cuda)
        return x + 1

    def body(name):
        def run():
            with slax.config.override(cuda_launch=launches[name]):
                barrier.wait()  # both blocks entered
                assert float(f(jnp.float32(1.0))) == 2.0
                assert current_routes().cuda == launches[name]
                barrier.wait()  # both calls made

        return run

    _in_threads(body("A"), body("B"))
    assert sorted(traced) == ["ptx", "slangpy"]
    f(jnp.float32(1.0))
    assert traced[2:] in ([], [slax.config.cuda_launch]) and current_routes().cuda == slax.config.cuda_launch


@pytest.mark.one_device_kind
def test_overlapping_overrides_in_two_asyncio_tasks_each_see_their_own():
    before = repr(slax.config), current_routes()

    async def main():
        a_entered, b_entered, a_left = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def task_a():
            with slax.config.override(debug_nans=True, tensor_cores=False):
                a_entered.set()
                await b_entered.wait()
                seen_a = slax.config.debug_nans, slax.config.tensor_cores
            a_left.set()
            return seen_a

        async def task_b():
            await a_entered.wait()
            with slax.config.override(debug_nans=False, tensor_cores=True):
                b_entered.set()
                await a_left.wait()
                return slax.config.debug_nans, slax.config.tensor_cores, BackendRequest.current().tensor_cores

        return await asyncio.gather(task_a(), task_b())

    assert asyncio.run(main()) == [(True, False), (False, True, True)]
    assert (repr(slax.config), current_routes()) == before


@pytest.mark.one_device_kind
def test_nested_overrides_restore_in_order_and_assignment_stays_global():
    launch, debug = slax.config.cuda_launch, slax.config.debug_nans
    with slax.config.override(cuda_launch=_other_launch(launch)):
        with slax.config.override(debug_nans=not debug, cuda_launch=launch):
            assert (slax.config.cuda_launch, slax.config.debug_nans) == (launch, not debug)
            assert current_routes().cuda == launch
        assert (slax.config.cuda_launch, slax.config.debug_nans) == (_other_launch(launch), debug)
        assert current_routes().cuda == _other_launch(launch)
    assert (slax.config.cuda_launch, current_routes().cuda) == (launch, launch)
    slax.config.cuda_launch = _other_launch(launch)
    try:
        seen = []
        _in_threads(lambda: seen.append((slax.config.cuda_launch, current_routes().cuda)))
        assert seen == [(_other_launch(launch), _other_launch(launch))]
    finally:
        slax.config.cuda_launch = launch
    assert current_routes().cuda == launch


def test_monkeypatch_restores_a_setting():
    """Settings are class-level data descriptors, so pytest's monkeypatch (which restores what it
    read through them) gives back the value before it, where restoring into the instance's
    ``__dict__`` deleted the setting and left the patched value behind."""
    before = slax.config.tensor_cores
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slax.config, "tensor_cores", not before)
        assert slax.config.tensor_cores is (not before)
    assert slax.config.tensor_cores is before


SWITCHES = {
    "debug_nans": "SLAX_DEBUG_NANS",
    "debug_bounds": "SLAX_DEBUG_BOUNDS",
    "tensor_cores": "SLAX_TENSOR_CORES",
}
"""Every on/off setting and the environment variable that sets it."""


@pytest.mark.one_device_kind
@pytest.mark.parametrize("setting", list(SWITCHES))
def test_every_switch_reads_its_variable_with_one_parser(setting, monkeypatch):
    """``SLAX_DEBUG_NANS=false`` turned the check on (every value but '' and '0' was on): each
    on/off variable takes 1/0, true/false, on/off, yes/no in any case, and refuses the rest naming
    the variable."""
    variable = SWITCHES[setting]
    for value, on in [("0", False), ("false", False), (" OFF ", False), ("no", False)] + [
        ("1", True),
        ("True", True),
        ("on", True),
        ("YES", True),
    ]:
        monkeypatch.setenv(variable, value)
        assert getattr(type(slax.config)(), setting) is on, (variable, value)
    monkeypatch.setenv(variable, "disabled")
    with pytest.raises(ValueError, match=f"{variable}='disabled' is not a switch; expected 1 or 0"):
        type(slax.config)()


@pytest.mark.one_device_kind
@pytest.mark.parametrize("setting", list(SWITCHES))
def test_every_switch_takes_only_booleans(setting):
    """``slax.config.debug_nans = "false"`` was kept as the truthy string (checks on); each
    switch refuses what is not True or False, naming the setting and its variable."""
    before = getattr(slax.config, setting)
    for value in ("false", 0, None):
        with pytest.raises(
            TypeError,
            match=rf"{setting} must be True or False \(slax.config.{setting} or {SWITCHES[setting]}\); "
            f"got {value!r}",
        ):
            setattr(slax.config, setting, value)
        with pytest.raises(TypeError, match=f"{setting} must be True or False"):
            with slax.config.override(**{setting: value}):
                pass
    assert getattr(slax.config, setting) is before


@pytest.mark.one_device_kind
@pytest.mark.parametrize(
    ("setting", "variable", "given", "value"),
    [
        ("cuda_launch", "SLAX_CUDA_LAUNCH", " SlangPy ", "slangpy"),
        ("mlp_backend", "SLAX_MLP_BACKEND", "XLA", "xla"),
    ],
)
def test_choices_read_from_the_environment_as_device_kinds_are(setting, variable, given, value, monkeypatch):
    """A choice's variable takes its value in any case with spaces around (as SLAX_DEVICE and the
    switches do); unset or empty, the default; an unknown value is refused naming the variable."""
    monkeypatch.setenv(variable, given)
    assert getattr(type(slax.config)(), setting) == value
    monkeypatch.setenv(variable, "  ")
    assert getattr(type(slax.config)(), setting) == {"cuda_launch": "ptx", "mlp_backend": "auto"}[setting]
    monkeypatch.setenv(variable, "fastest")
    with pytest.raises(ValueError, match=f"{setting} must be one of .*{variable}\\); got 'fastest'"):
        type(slax.config)()
