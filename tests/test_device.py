"""Device selection (slax/_device.py): defaults, SLAX_DEVICE, errors, the on-disk compile cache, the
include path (slax's shaders, shipped in the wheel, and SlangPy's)."""

from __future__ import annotations

import os
import textwrap

import jax
import jax.numpy as jnp
import pytest
import slangpy
from _helpers import ROOT, run_python

import slax
from slax._device import SHADER_DIR, DeviceKind, device_kind_for_platform, get_device, include_paths
from slax.testing import check_grads


def test_cpu_defaults_to_vulkan(monkeypatch):
    monkeypatch.delenv("SLAX_DEVICE", raising=False)
    slax.set_device_kind(None)
    assert device_kind_for_platform("cpu") is DeviceKind.VULKAN


def test_cuda_platform_uses_cuda(monkeypatch):
    monkeypatch.delenv("SLAX_DEVICE", raising=False)
    slax.set_device_kind(None)
    assert device_kind_for_platform("cuda") is DeviceKind.CUDA


@pytest.mark.parametrize("value, kind", [("cuda", DeviceKind.CUDA), (" Vulkan ", DeviceKind.VULKAN)])
def test_env_var_is_honoured(monkeypatch, value, kind):
    slax.set_device_kind(None)
    monkeypatch.setenv("SLAX_DEVICE", value)
    assert device_kind_for_platform("cpu") is kind


def test_argument_overrides_env_var(monkeypatch):
    monkeypatch.setenv("SLAX_DEVICE", "cuda")
    slax.set_device_kind("vulkan")
    assert device_kind_for_platform("cpu") is DeviceKind.VULKAN


def test_unknown_env_value_is_rejected(monkeypatch):
    slax.set_device_kind(None)
    monkeypatch.setenv("SLAX_DEVICE", "metal")
    with pytest.raises(
        ValueError, match=r"unknown device kind 'metal' from the SLAX_DEVICE .*'vulkan', 'cuda'"
    ):
        device_kind_for_platform("cpu")


def test_unknown_argument_is_rejected():
    with pytest.raises(ValueError, match=r"unknown device kind 'gpu' from slax.set_device_kind"):
        slax.set_device_kind("gpu")


def test_vulkan_cannot_serve_cuda_buffers(monkeypatch):
    monkeypatch.setenv("SLAX_DEVICE", "vulkan")
    slax.set_device_kind(None)
    with pytest.raises(ValueError, match="CUDA GPU.*SLAX_DEVICE=vulkan"):
        device_kind_for_platform("cuda")


def test_device_is_created_once(device_kind):
    kind = DeviceKind(device_kind)
    assert get_device(kind) is get_device(kind)


def test_missing_cuda_device_explains(monkeypatch):
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
    env = {**os.environ, "SLAX_CACHE_DIR": str(tmp_path)}
    env.pop("SLAX_DEVICE", None)
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
    env.pop("SLAX_DEVICE", None)
    result = run_python("-c", script, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cannot write to its cache directory" in result.stdout and "SLAX_CACHE_DIR" in result.stdout
    assert "lavapipe" not in result.stdout
