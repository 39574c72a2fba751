"""Loading Slang modules (slax/_module.py): every function a module declares is reachable, and a
module loaded from source runs that source, whoever else loads another one under its name."""

from __future__ import annotations

import logging
import select
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import ROOT, python_env

import slax
from slax.testing import RELATIVE_TOLERANCE

SHADOWED = (
    "[Differentiable] float _private(float x) { return x * 2; }\n"
    "[Differentiable] float kernel(float x) { return x * 3; }\n"
    "[Differentiable] float path(float x) { return x * 4; }\n"
    "[Differentiable] float content(float x) { return x * 5; }\n"
    "[Differentiable] float function_names(float x) { return x * 6; }\n"
    "[Differentiable] float plain(float x) { return x * 7; }\n"
)
FACTORS = {"_private": 2, "kernel": 3, "path": 4, "content": 5, "function_names": 6, "plain": 7}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path / "cache"))


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=RELATIVE_TOLERANCE["float32"])


def test_item_access_reaches_every_function():
    """Names slax's own attributes take, and names beginning with '_', are Slang functions too."""
    module = slax.load_module_from_source("shadowed_names", SHADOWED)
    x = jax.random.normal(jax.random.key(0), (5,))
    assert module.function_names() == sorted(FACTORS)
    for name, factor in FACTORS.items():
        assert module[name].name == name
        _close(module[name](x), x * factor)
        _close(jax.grad(lambda x, name=name: module[name](x).sum())(x), jnp.full(5, float(factor)))
    with pytest.raises(KeyError, match="has no function 'missing'"):
        module["missing"]


@pytest.mark.one_device_kind
def test_attributes_prefer_slax_and_dir_says_which_is_which():
    module = slax.load_module_from_source("shadowed_names", SHADOWED)
    assert module.plain is module["plain"]
    assert isinstance(module.path, str) and isinstance(module.content, str)
    listed = dir(module)
    assert "plain" in listed and "kernel" in listed and "_private" not in listed
    with pytest.raises(AttributeError, match=r"'_private' of .* begins with '_'.*module\['_private'\]"):
        _ = module._private
    with pytest.raises(TypeError, match=r"kernel\(\) takes the name .* got ArrayImpl.*module\['kernel'\]"):
        module.kernel(jnp.ones(3))
    with pytest.raises(AttributeError, match="has no function 'missing'"):
        _ = module.missing


def _scaled(factor: int) -> str:
    return f"[Differentiable]\nfloat f(float x) {{ return x * {factor}; }}\n"


def _load_and_check(name: str, factor: int, rounds: int) -> None:
    """Loads ``name`` from the source that scales by ``factor`` ``rounds`` times, checking each
    module's results against that factor."""
    x = jax.random.normal(jax.random.key(factor), (8,))
    for _ in range(rounds):
        module = slax.load_module_from_source(name, _scaled(factor))
        _close(module.f(x), x * factor)


@pytest.mark.one_device_kind
def test_same_name_in_two_threads_runs_each_threads_source():
    errors: list[BaseException] = []

    def run(factor: int) -> None:
        try:
            _load_and_check("raced", factor, rounds=200)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(factor,)) for factor in (2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]


_OTHER_PROCESS = textwrap.dedent(
    """
    import sys
    from test_module import _load_and_check
    _load_and_check("raced", 3, rounds=1)
    print("ready", flush=True)
    sys.stdin.readline()
    _load_and_check("raced", 3, rounds=300)
    """
)


@pytest.mark.one_device_kind
@pytest.mark.slow
def test_same_name_in_two_processes_runs_each_processes_source():
    env = python_env()
    env["PYTHONPATH"] = f"{ROOT / 'tests'}:{env['PYTHONPATH']}"
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_PROCESS],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _load_and_check("raced", 2, rounds=1)
        ready, _, _ = select.select([other.stdout], [], [], 300)
        assert ready and other.stdout.readline() == "ready\n", other.stderr.read()
        other.stdin.write("go\n")
        other.stdin.flush()
        _load_and_check("raced", 2, rounds=300)
        _, stderr = other.communicate(timeout=300)
    finally:
        other.kill()
    assert other.returncode == 0, stderr


def test_other_modules_import_a_source_module_by_name(tmp_path):
    """Source modules, and modules on disk, import a module loaded from source by its name: the
    source last loaded under it."""
    slax.load_module_from_source("scaling_helper", "[Differentiable]\nfloat g(float x) { return x * 2; }\n")
    user = "import scaling_helper;\n[Differentiable]\nfloat f(float x) { return g(x) + 1; }\n"
    from_source = slax.load_module_from_source("scaling_user", user)
    (tmp_path / "on_disk.slang").write_text(user)
    on_disk = slax.load_module(tmp_path / "on_disk.slang")
    x = jax.random.normal(jax.random.key(1), (6,))
    for module in (from_source, on_disk):
        _close(module.f(x), x * 2 + 1)
        _close(jax.grad(lambda x, module=module: module.f(x).sum())(x), jnp.full(6, 2.0))
    slax.load_module_from_source("scaling_helper", "[Differentiable]\nfloat g(float x) { return x * 3; }\n")
    _close(slax.load_module(tmp_path / "on_disk.slang").f(x), x * 3 + 1)
    _close(on_disk.f(x), x * 2 + 1)


def test_compiling_says_so_in_slax_log(caplog, device_kind, tmp_path, monkeypatch):
    """Each Slang compile (the module, the kernel slax generates, the entry point) is announced in
    slax's log at INFO before it starts, and its time after (at INFO from a second up, else at
    DEBUG): seconds each on a first run, which a program can show (the experiments print them)."""
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path))  # a cold cache: everything compiles
    scale = np.random.default_rng(7).uniform(1.5, 2.5)
    source = f"[Differentiable] float scaled(float x) {{ return x * {scale:.6f}; }}"
    with caplog.at_level(logging.DEBUG, logger="slax"):
        module = slax.load_module_from_source("log_probe", source)
        x = jnp.asarray(np.random.default_rng(8).normal(size=5), jnp.float32)
        np.testing.assert_allclose(
            module.scaled(x), x * np.float32(f"{scale:.6f}"), rtol=RELATIVE_TOLERANCE["float32"]
        )
    messages = [record.getMessage() for record in caplog.records if record.name == "slax"]
    compiling = [
        record.getMessage()
        for record in caplog.records
        if record.name == "slax" and record.getMessage().startswith("compiling ")
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.getMessage() in compiling)
    assert compiling and all(m.endswith(" ...") for m in compiling), messages
    for message in compiling:
        done = message.removeprefix("compiling ").removesuffix(" ...")
        assert any(m.startswith(f"compiled {done} in ") and m.endswith(" s") for m in messages), messages
