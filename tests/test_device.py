"""Device selection (slax/_device.py): defaults, SLAX_DEVICE, errors, the on-disk compile cache, the
include path (slax's shaders, shipped in the wheel, and SlangPy's)."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import slangpy
from _helpers import ROOT, run_python

import slax
from slax._codegen import Mode, operand_leaves
from slax._compile import KernelSpec
from slax._config import DeviceKind, LaunchRoutes
from slax._device import (
    SHADER_DIR,
    cache_dir,
    device_kind_for_platform,
    get_device,
    include_paths,
)
from slax._function_primitives import FunctionSpec, _function_kernel
from slax._gxx_wrapper import DISPATCH_SOURCE, KERNEL_FLAGS, over_cores, prelude_text
from slax._slang_c import CodeTarget, compile_entry_point
from slax.nn._kernels import mlp_source
from slax.testing import RELATIVE_TOLERANCE, check_grads


def _vulkan_available() -> bool:
    try:
        get_device(DeviceKind.VULKAN)
        return True
    except slax.DeviceUnavailableError:
        return False


class _Adapter:
    """What ``spy.Device.enumerate_adapters`` lists, as far as the automatic choice reads it."""

    def __init__(self, name: str, vendor_id: int, device_id: int = 0):
        self.name, self.vendor_id, self.device_id = name, vendor_id, device_id


LAVAPIPE = _Adapter("llvmpipe (LLVM 15.0.6, 256 bits)", 0x10005)
SWIFTSHADER = _Adapter("SwiftShader Device (Subzero)", 0x1AE0, 0xC0DE)
A_GPU = _Adapter("NVIDIA RTX 4090", 0x10DE, 0x2684)


def _choose(monkeypatch, adapters, compiler="/usr/bin/g++", vulkan_fails=False):
    """The automatic choice (uncached) on a machine with ``adapters`` and ``compiler``."""
    monkeypatch.setattr(slax._device, "_vulkan_adapters", lambda: list(adapters))
    monkeypatch.setattr(slax._device, "cpp_compiler", lambda: compiler)

    def get_device(kind, ordinal=0):
        assert kind is DeviceKind.VULKAN
        if vulkan_fails:
            raise slax.DeviceUnavailableError("no") from RuntimeError("vkCreateDevice failed")
        return object()

    monkeypatch.setattr(slax._device, "get_device", get_device)
    return slax._device.automatic_cpu_device_kind.__wrapped__()


@pytest.mark.one_device_kind
@pytest.mark.parametrize("adapters", [[], [LAVAPIPE], [SWIFTSHADER]], ids=["none", "lavapipe", "swiftshader"])
def test_without_a_gpu_the_choice_is_the_cpu_device_silently(monkeypatch, capsys, adapters):
    """SlangPy's CPU device is the faster CPU route (BENCHMARKS.md, "The CPU routes"): chosen over
    a Vulkan driver on the CPU, without a note (it is no fallback)."""
    assert _choose(monkeypatch, adapters) is DeviceKind.CPU
    assert capsys.readouterr().err == ""


@pytest.mark.one_device_kind
def test_a_gpus_vulkan_driver_is_chosen(monkeypatch, capsys):
    assert _choose(monkeypatch, [LAVAPIPE, A_GPU]) is DeviceKind.VULKAN
    assert capsys.readouterr().err == ""


@pytest.mark.one_device_kind
def test_a_failing_gpu_driver_falls_back_to_the_cpu_device_saying_so(monkeypatch, capsys):
    assert _choose(monkeypatch, [A_GPU], vulkan_fails=True) is DeviceKind.CPU
    note = capsys.readouterr().err
    assert "the Vulkan driver of NVIDIA RTX 4090 failed (vkCreateDevice failed)" in note
    assert "SLAX_DEVICE=cpu chooses it without this note" in note


@pytest.mark.one_device_kind
def test_lavapipe_without_a_compiler_is_chosen_saying_what_to_install(monkeypatch, capsys):
    assert _choose(monkeypatch, [LAVAPIPE], compiler=None) is DeviceKind.VULKAN
    note = capsys.readouterr().err
    assert "no C++ compiler (clang++ or g++)" in note and "apt-get install g++" in note
    assert f"Vulkan over {LAVAPIPE.name}" in note and "SLAX_DEVICE=vulkan" in note


@pytest.mark.one_device_kind
def test_this_machine_gets_the_cpu_device_unless_a_gpu_is_here():
    """The real choice, through SlangPy's adapter list: on a machine without a GPU's Vulkan driver
    (the development machine and CI have lavapipe or none) and with g++, the CPU device."""
    gpus = [a.name for a in slax._device._vulkan_adapters() if not slax._device._vulkan_runs_on_the_cpu(a)]
    if gpus or not slax._device.cpp_compiler():
        pytest.skip(f"this machine has a GPU's Vulkan driver ({gpus}) or no C++ compiler")
    assert device_kind_for_platform("cpu", LaunchRoutes(cpu=None)) is DeviceKind.CPU


def test_cuda_platform_uses_cuda():
    assert device_kind_for_platform("cuda", LaunchRoutes(cpu=None)) is DeviceKind.CUDA


@pytest.mark.parametrize("kind", list(DeviceKind))
def test_the_traced_device_kind_chooses_for_the_cpu(kind):
    assert device_kind_for_platform("cpu", LaunchRoutes(cpu=kind)) is kind


_SHOW_CHOICE = """
import slax
slax.set_device_kind(slax.config.device_kind)  # what SLAX_DEVICE chose, through the API
print(slax.config.device_kind.value, slax.launch_route("cpu"))
slax.set_device_kind("vulkan")
print(slax.config.device_kind.value)
"""


@pytest.mark.one_device_kind  # the fresh process's SLAX_DEVICE is the parameter, whatever the route
@pytest.mark.parametrize(
    "value, kind, route", [(" Cpu ", "cpu", "host-pointer"), ("vulkan", "vulkan", "host-copy")]
)
def test_env_var_chooses_and_the_api_overrides_it(value, kind, route, request):
    """``SLAX_DEVICE`` is read when slax is imported (a fresh process), ``set_device_kind`` after;
    JAX on the CPU, whose device kind this is."""
    if kind == "vulkan":
        request.getfixturevalue("vulkan_driver")  # the script creates the Vulkan device
    env = {**os.environ, "SLAX_DEVICE": value, "JAX_PLATFORMS": "cpu"}
    result = run_python("-c", _SHOW_CHOICE, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-2:] == [f"{kind} {route}", "vulkan"]


@pytest.mark.one_device_kind  # refused on import, before any device
def test_unknown_env_value_is_rejected():
    result = run_python("-c", "import slax", env={**os.environ, "SLAX_DEVICE": "metal"}, timeout=300)
    assert result.returncode != 0
    assert (
        "unknown device kind 'metal' from the SLAX_DEVICE variable; expected one of 'vulkan', 'cpu', 'cuda'"
        in (result.stderr)
    )


def test_unknown_argument_is_rejected():
    with pytest.raises(ValueError, match=r"unknown device kind 'gpu' from slax.set_device_kind"):
        slax.set_device_kind("gpu")


@pytest.mark.parametrize("kind", [DeviceKind.VULKAN, DeviceKind.CPU])
def test_host_devices_cannot_serve_cuda_buffers(kind):
    with pytest.raises(ValueError, match=f"CUDA GPU.*SLAX_DEVICE={kind.value}"):
        device_kind_for_platform("cuda", LaunchRoutes(cpu=kind))


_TRAIN_A_LITTLE = """
import jax, jax.numpy as jnp, slax
from slax import nn
x = jnp.linspace(-1.0, 1.0, 64).reshape(16, 4)
params = nn.mlp_init(jax.random.key(0), (4, 8, 4))
_, grads = jax.jit(nn.mlp_loss_and_grad)(params, x, x)
loss = lambda p: jnp.mean(jnp.sum((nn.mlp_apply_reference(p, x) - x) ** 2, -1))
pairs = zip(jax.tree.leaves(grads), jax.tree.leaves(jax.grad(loss)(params)))
error = max(float(jnp.max(jnp.abs(a - b))) for a, b in pairs)
value = slax.load_module("poly").polynomial(2.0, 8.0, -1.0, 3.0)
print(slax.launch_route(), slax.describe_device(), value, error < 1e-5)
"""

NO_VULKAN_DRIVER = {"VK_DRIVER_FILES": "/nonexistent", "VK_ICD_FILENAMES": "/nonexistent"}
"""Hides every Vulkan driver from the Vulkan loader (it honours either variable)."""


@pytest.mark.one_device_kind
def test_without_a_vulkan_driver_slax_uses_the_cpu_device_silently():
    env = {**os.environ, **NO_VULKAN_DRIVER, "JAX_PLATFORMS": "cpu"}
    env.pop("SLAX_DEVICE", None)
    result = run_python("-c", _TRAIN_A_LITTLE, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "host-pointer cpu (CPU) 41.0 True"
    assert "slax:" not in result.stderr, result.stderr  # the default, no fallback: no note
    assert "Failed to create Vulkan instance" not in result.stdout + result.stderr


@pytest.mark.one_device_kind  # the fresh process asks for the CPU device, whatever the route
def test_without_a_cpp_compiler_the_cpu_device_says_what_to_install(tmp_path):
    """Slang's CPU target builds kernels with the system's clang++ or g++: without one on PATH, the
    error says so and what to install, rather than Slang's "pass-through compiler not found"."""
    env = {**os.environ, "PATH": str(tmp_path), "SLAX_DEVICE": "cpu", "JAX_PLATFORMS": "cpu"}
    script = textwrap.dedent(
        """
        import slax
        try:
            slax.load_module("poly")
        except slax.DeviceUnavailableError as error:
            print(error)
        """
    )
    result = run_python("-c", script, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "neither is on PATH" in result.stdout and "apt-get install g++" in result.stdout, result.stdout


def test_device_is_created_once(device_kind):
    kind = DeviceKind(device_kind)
    assert get_device(kind) is get_device(kind)


def test_missing_cuda_device_explains():
    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(slax.DeviceUnavailableError, match="CUDA"):
        get_device(DeviceKind.CUDA, ordinal=0)


def test_second_process_reuses_compiled_modules(tmp_path):
    """A fresh process with the same cache dir finds the first one's compiled modules on disk."""
    script = textwrap.dedent(
        """
        import pathlib, sys, jax.numpy as jnp, slax
        mod = slax.load_module("poly")
        value = float(mod.polynomial(2.0, 8.0, -1.0, jnp.float32(3.0)))
        files = sorted(p for p in pathlib.Path(sys.argv[1]).rglob("*") if p.is_file())
        print(value, len(files))  # last line: SlangPy's CUDA device logs to stdout before it
        """
    )
    env = {**os.environ, "SLAX_CACHE_DIR": str(tmp_path)}  # SLAX_DEVICE: the device under test
    results = [run_python("-c", script, str(tmp_path), env=env, timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in results), [r.stderr[-3000:] for r in results]
    runs = [r.stdout.splitlines()[-1].split() for r in results]
    assert runs[0][0] == runs[1][0] == "41.0"
    assert int(runs[0][1]) > 0, "the first process wrote nothing to the cache"
    assert runs[0][1] == runs[1][1], "the second process compiled again instead of reusing the cache"


def test_every_shader_folder_ships_in_the_wheel():
    """pyproject.toml maps shaders/ to the package slax.shaders; setuptools copies only the folders
    it lists, so a new folder of Slang sources must be listed there too."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"]["slax.shaders"] == "shaders"
    assert "*.slang" in setuptools["package-data"]["*"]
    folders = {path.parent.relative_to(SHADER_DIR) for path in SHADER_DIR.rglob("*.slang")}
    listed = {".".join(("slax", "shaders", *folder.parts)) for folder in folders}
    assert listed <= set(setuptools["packages"])


def _wang_hash(seed: jax.Array) -> jax.Array:
    """SlangPy's wang_hash (slangpy/slang/wanghasharg.slang) in uint32 arithmetic, which wraps as
    Slang's uint does."""
    seed = (seed ^ 61) ^ (seed >> 16)
    seed = seed * jnp.uint32(9)
    seed = seed ^ (seed >> 4)
    seed = seed * jnp.uint32(0x27D4EB2D)
    return seed ^ (seed >> 15)


@pytest.mark.one_device_kind  # every device kind gets the same include path (_device.py's _create_device)
def test_slangpy_style_modules_load_and_differentiate(rng):
    """``import slangpy;`` resolves: SlangPy's shader directory is on every device's include path."""
    assert slangpy.SHADER_PATH in include_paths()  # where slangpy.slang lives
    function = slax.load_module(ROOT / "tests" / "slang" / "slangpy_style.slang").hashed_offset_square
    x = jnp.asarray(rng.normal(size=(64,)), jnp.float32)
    seed = jnp.asarray(rng.integers(0, 2**32, size=(64,)), jnp.uint32)

    def twin(x, seed):
        return x * x + (_wang_hash(seed) & 255).astype(jnp.float32) / 256

    report = check_grads(function, twin, x, seed)
    assert report.passed, str(report)
    assert [row.argument for row in report.rows if row.check == "rev"] == ["x"]


def test_unwritable_cache_directory_says_so(tmp_path):
    """Not 'install lavapipe': a device whose cache cannot be written is refused naming the cache.
    In a fresh process: this one's device exists already."""
    (tmp_path / "a_file").write_text("")
    script = textwrap.dedent(
        """
        import slax
        try:
            slax.load_module("poly")
        except OSError as error:
            print(error)
        """
    )
    env = {**os.environ, "SLAX_CACHE_DIR": str(tmp_path / "a_file" / "cache")}
    result = run_python("-c", script, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cannot write to its cache directory" in result.stdout and "SLAX_CACHE_DIR" in result.stdout
    assert "lavapipe" not in result.stdout


def test_a_relative_cache_directory_is_resolved_once(tmp_path, monkeypatch, rng):
    """``SLAX_CACHE_DIR=cache`` was resolved again against each new working directory: after
    ``os.chdir`` a module of ``load_module_from_source`` could not import one loaded before, and
    Slang said only "cannot open file". A relative directory is resolved against the working
    directory where slax first reads it, and stays there."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    relative = f"cache-{tmp_path.name}"  # a value of its own: this process has not resolved it
    monkeypatch.setenv("SLAX_CACHE_DIR", relative)
    assert cache_dir() == first / relative
    factor = f"{rng.uniform(2.0, 3.0):.6f}"
    slax.load_module_from_source("relative_factor", f"public float factor() {{ return {factor}; }}\n")
    monkeypatch.chdir(second)
    assert cache_dir() == first / relative and include_paths()[-1] == str(first / relative / "sources")
    user = slax.load_module_from_source(
        "relative_user", "import relative_factor;\nfloat scaled(float x) { return x * factor(); }\n"
    )
    x = rng.uniform(-1.0, 1.0, 5).astype(np.float32)
    np.testing.assert_allclose(user.scaled(x), x * np.float32(factor), rtol=1e-6)
    assert not (second / relative).exists()


@pytest.mark.one_device_kind
def test_half_kernels_on_the_cpu_device_convert_in_hardware_where_the_cpu_can(tmp_path):
    """Where the host CPU has F16C, slax defines SLAX_HOST_F16C for SlangPy's CPU device, and the C++
    Slang writes for a half kernel then tells g++ to use it: no call to libgcc's software
    conversions is left (without it, there is one per value converted on x86-64)."""
    compiler = shutil.which("g++")
    if compiler is None or platform.machine() != "x86_64":
        pytest.skip("checks g++'s x86-64 code for the CPU device's half kernels")
    spec = KernelSpec("mlp_loss_grad", source=mlp_source((4, 16, 4), "float16"))
    library_calls = {}
    for defined in (False, True):
        source = tmp_path / f"kernel-{defined}.cpp"
        defines = {"SLAX_HOST_F16C": "1"} if defined else {}
        source.write_text(compile_entry_point(spec, CodeTarget.CPP_SOURCE, defines=defines))
        assembly = tmp_path / f"kernel-{defined}.s"
        subprocess.run([compiler, "-std=c++17", "-O3", "-S", str(source), "-o", str(assembly)], check=True)
        library_calls[defined] = len(re.findall(r"call\s+__(extendhfsf2|truncsfhf2)", assembly.read_text()))
    assert library_calls[False] > 0 and library_calls[True] == 0, library_calls


@pytest.mark.one_device_kind
def test_the_cpu_devices_kernels_call_no_vector_element_or_small_function_out_of_line(tmp_path):
    """The texture sampler's kernels (float4 arithmetic throughout), in the C++ Slang writes for
    the CPU device with SLAX_HOST_F16C, spread over worker threads and built with the flags as
    slax's g++ builds them, call no vector's ``operator[]`` and no function of the sampler's: all
    inlined. With the f16c pragma ahead of the clamped ``operator[]`` (shaders/slax/cpu.slang), the
    prelude's operators called it out of line, 36 times in the cotangent kernel; without
    ``KERNEL_FLAGS``, g++ left ``lerp``, the tensor's reads and their backward propagations as
    calls, their float4s passed through the stack; with the ordered adds' log inlined into each
    add (shaders/slax/tensor.slang), the cotangent's backward propagations were calls again. Both
    kernels spread, the cotangent's adds into the texture's gradient included."""
    compiler = shutil.which("g++")
    if compiler is None or platform.machine() != "x86_64":
        pytest.skip("checks g++'s x86-64 code for the CPU device's kernels")
    texture = slax.load_module("texture")
    operands = [np.zeros((8, 8, 4), np.float32), np.zeros((5, 2), np.float32)]
    signature = texture.sample_bilinear.signature(*operands)
    function = FunctionSpec(texture.path, signature, texture.content, texture._names)
    for mode in (Mode.PRIMAL, Mode.COTANGENT):
        broadcast = tuple((False,) for _ in operand_leaves(signature, mode))
        spec = _function_kernel(function, mode, broadcast)
        source = tmp_path / f"{mode.value}.cpp"
        code = compile_entry_point(spec, CodeTarget.CPP_SOURCE, defines={"SLAX_HOST_F16C": "1"})
        spread = over_cores(code, prelude_text(code), pathlib.Path(DISPATCH_SOURCE).read_text())
        assert spread != code, mode
        source.write_text(spread)
        assembly = tmp_path / f"{mode.value}.s"
        command = [compiler, *KERNEL_FLAGS, "-std=c++17", "-O3", "-S", str(source), "-o", str(assembly)]
        subprocess.run(command, check=True)
        called = set(re.findall(r"call\s+(\S+)", assembly.read_text()))
        inlined = r"Vector.*ixE|lerp|operatorx5Bx5D_get|bwdProp"  # a vector's operator[] mangles as ...ixE...
        out_of_line = {name for name in called if re.search(inlined, name)}
        assert not out_of_line, (mode, out_of_line)


_FORK_CHILD = textwrap.dedent(
    """
    import atexit
    import os
    import signal
    import sys

    import jax
    import numpy as np

    import slax

    mod = slax.load_module("poly")
    x = np.random.default_rng(7).uniform(-2.0, 2.0, 300).astype(np.float32)
    f = jax.jit(lambda x: mod.polynomial(2.0, 8.0, -1.0, x))
    grad = jax.jit(jax.grad(lambda x: mod.polynomial(2.0, 8.0, -1.0, x).sum()))
    x_on_device = jax.device_put(x)


    def compute():
        return np.stack([f(x_on_device), mod.polynomial(2.0, 8.0, -1.0, x_on_device), grad(x_on_device)])


    parent = compute()  # compiled before fork(): XLA cannot compile in a forked child (its threads)
    statuses = []
    for computes in (True, False):
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)  # a hung child ends (killed by SIGALRM): the test fails, nothing stays behind
            try:
                if computes:
                    np.save(sys.argv[1], compute())
                atexit._run_exitfuncs()  # what a normal exit runs (SlangPy's closed every device)
            finally:
                os._exit(0)  # past the exit handlers, JAX's finalisation dies in a forked child
        statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    np.save(sys.argv[2], np.concatenate([parent, x[None]]))
    print(statuses)
    """
)


@pytest.mark.slow
def test_a_child_forked_after_kernels_ran_runs_them_on_its_own_device(device_kind, tmp_path):
    """fork() copies no driver threads: reading back the parent's Vulkan (lavapipe) buffers in the
    child, and SlangPy's exit handler closing them, waited for them forever. The child makes its
    own device, what it computes is right, and its exit handlers return, whether it ran kernels or
    not."""
    if device_kind == "cuda":
        pytest.skip("the CUDA driver refuses a child forked after it was initialised (XLA aborts there)")
    child, parent = tmp_path / "child.npy", tmp_path / "parent.npy"
    result = run_python("-c", _FORK_CHILD, str(child), str(parent), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    statuses = json.loads(result.stdout.strip().splitlines()[-1])
    assert statuses == [0, 0], f"the forked children exited {statuses} (-14: hung, killed by SIGALRM)"
    assert child.exists(), f"the forked child computed nothing: {result.stderr[-3000:]}"
    *in_parent, x = np.load(parent).astype(np.float64)
    in_child = np.load(child)
    tolerance = RELATIVE_TOLERANCE["float32"]
    expected = [2.0 * x**2 + 8.0 * x - 1.0, 2.0 * x**2 + 8.0 * x - 1.0, 4.0 * x + 8.0]
    np.testing.assert_allclose(in_parent, expected, rtol=tolerance, atol=tolerance)
    np.testing.assert_array_equal(in_child, in_parent)


@pytest.mark.slow
def test_a_truncated_shader_cache_is_set_aside_not_crashed_on(device_kind, tmp_path):
    """SlangPy's shader cache (LMDB's data.mdb) cut short below the pages its header records killed
    every later process with SIGBUS, silently. A fresh process now moves it aside, says so once,
    and computes."""
    if device_kind == "cuda":
        pytest.skip("the CPU routes' caches; CUDA's is the same code")
    x = jnp.linspace(-2.0, 2.0, 64)
    slax.load_module("poly").polynomial(2.0, 8.0, -1.0, x).block_until_ready()  # a kernel in the cache
    shaders = pathlib.Path(os.environ.get("SLAX_CACHE_DIR") or cache_dir()) / device_kind / "shaders"
    damaged = tmp_path / device_kind / "shaders" / "rhi" / "data.mdb"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes((shaders / "rhi" / "data.mdb").read_bytes()[:8192])  # its two meta pages only
    program = (
        "import json, jax.numpy as jnp, numpy as np, slax\n"
        "y = slax.load_module('poly').polynomial(2.0, 8.0, -1.0, jnp.linspace(-2.0, 2.0, 64))\n"
        "print(json.dumps(np.asarray(y).tolist()))"
    )
    env = {**os.environ, "SLAX_CACHE_DIR": str(tmp_path), "SLAX_DEVICE": device_kind}
    result = run_python("-c", program, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"shader cache .*data.mdb was damaged \(it holds 8192 bytes", result.stderr)
    expected = 2.0 * np.asarray(x, np.float64) ** 2 + 8.0 * np.asarray(x, np.float64) - 1.0
    tolerance = RELATIVE_TOLERANCE["float32"]
    computed = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(computed, expected, rtol=tolerance, atol=tolerance)
