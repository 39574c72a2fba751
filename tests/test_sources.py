"""Content keys (slax/_sources.py, slax/_compile.py): edited Slang code runs, in the same process,
and no load, retry or edit sequence crashes it."""

from __future__ import annotations

import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import run_python

import slax
from slax import _sources

SQUARE = "[Differentiable]\nfloat f(float x) { return x * x; }\n"
CUBE = "[Differentiable]\nfloat f(float x) { return x * x * x; }\n"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path / "cache"))


def _value_and_grad(module, x=3.0):
    return float(module.f(x)), float(jax.grad(module.f)(x))


def test_edited_file_runs_the_new_code(tmp_path):
    path = tmp_path / "edited.slang"
    path.write_text(SQUARE)
    old = slax.load_module(path)
    assert _value_and_grad(old) == (9.0, 6.0)
    path.write_text(CUBE)
    new = slax.load_module(path)
    assert new.content != old.content
    assert _value_and_grad(new) == (27.0, 27.0)
    assert _value_and_grad(old) == (9.0, 6.0), "a module keeps running the code it was loaded with"
    path.write_text(SQUARE)
    assert slax.load_module(path).content == old.content


def test_edited_signature_is_the_new_one(tmp_path):
    path = tmp_path / "signature.slang"
    path.write_text(SQUARE)
    slax.load_module(path).f(1.0)
    path.write_text("[Differentiable]\nfloat f(float x, float y) { return x * y; }\n")
    module = slax.load_module(path)
    assert float(module.f(3.0, 4.0)) == 12.0
    assert float(jax.grad(module.f, argnums=1)(3.0, 4.0)) == 3.0
    with pytest.raises(TypeError, match=r"missing argument\(s\): y"):
        module.f(3.0)


def test_edited_import_runs_the_new_code(tmp_path):
    helper = tmp_path / "helper.slang"
    helper.write_text("module helper;\n[Differentiable]\npublic float g(float x) { return x * x; }\n")
    path = tmp_path / "user.slang"
    path.write_text('import "helper.slang";\n[Differentiable]\nfloat f(float x) { return g(x) + 1; }\n')
    assert _value_and_grad(slax.load_module(path)) == (10.0, 6.0)
    helper.write_text("module helper;\n[Differentiable]\npublic float g(float x) { return x * x * x; }\n")
    assert _value_and_grad(slax.load_module(path)) == (28.0, 27.0)


def test_source_under_a_used_name_runs_the_new_code():
    assert _value_and_grad(slax.load_module_from_source("reused", SQUARE)) == (9.0, 6.0)
    assert _value_and_grad(slax.load_module_from_source("reused", CUBE)) == (27.0, 27.0)


def test_derivatives_first_taken_after_an_edit_are_the_old_codes(tmp_path):
    """Kernels compiled after the file changed still run the code their module was loaded with."""
    path = tmp_path / "late.slang"
    path.write_text(SQUARE)
    old = slax.load_module(path)
    assert float(old.f(3.0)) == 9.0
    path.write_text(CUBE)
    new = slax.load_module(path)
    assert float(jax.grad(old.f)(3.0)) == 6.0
    assert float(jax.jvp(old.f, (3.0,), (1.0,))[1]) == 6.0
    assert float(jax.grad(new.f)(3.0)) == 27.0


def test_edited_kernel_runs_the_new_code(tmp_path):
    path = tmp_path / "kernel.slang"
    kernel = (
        "import slax.kernel;\n"
        '[shader("compute")]\n[numthreads(64, 1, 1)]\n'
        "void scale(uint3 t : SV_DispatchThreadID, uniform float* x, uniform float* y, uniform uint count)\n"
        "{{ uint i = slax_thread_index(t); if (i < count) y[i] = x[i] * {factor}; }}\n"
    )
    x = jnp.arange(4.0)
    results = [jax.ShapeDtypeStruct((4,), jnp.float32)]
    for factor in (2, 3):
        path.write_text(kernel.format(factor=factor))
        (y,) = slax.load_module(path).kernel("scale")(x, results=results, threads=4, count=4)
        np.testing.assert_array_equal(y, np.arange(4.0) * factor)


def test_module_fixed_after_a_compile_error_loads(tmp_path):
    path = tmp_path / "fixed.slang"
    path.write_text("[Differentiable]\nfloat f(float x) { return x * ; }\n")
    for _ in range(2):
        with pytest.raises(slax.SlangCompileError, match=r"fixed\.slang[:(]2"):
            slax.load_module(path)
    path.write_text(CUBE)
    assert _value_and_grad(slax.load_module(path)) == (27.0, 27.0)


def test_failed_import_fails_again_and_never_crashes(tmp_path):
    """Once, a module whose import failed loaded the second time and crashed the process on its first
    call (in link_program); in a subprocess, so that a crash fails this test, not pytest."""
    script = textwrap.dedent(
        f"""
        import pathlib
        import jax
        import slax

        folder = pathlib.Path({str(tmp_path)!r})
        path = folder / "user.slang"
        path.write_text('import missing_helper;\\n[Differentiable]\\nfloat f(float x) {{ return h(x); }}\\n')
        messages = []
        for attempt in range(3):
            try:
                slax.load_module(path).f(1.0)
            except slax.SlangCompileError as error:
                messages.append(str(error))
        assert len(messages) == 3 and len(set(messages)) == 1, messages
        assert "missing_helper" in messages[0], messages[0]
        (folder / "missing_helper.slang").write_text(
            "module missing_helper;\\n[Differentiable]\\npublic float h(float x) {{ return x * x; }}\\n"
        )
        module = slax.load_module(path)
        print(float(module.f(3.0)), float(jax.grad(module.f)(3.0)))
        """
    )
    result = run_python("-c", script, timeout=300)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    assert result.stdout.split() == ["9.0", "6.0"]


@pytest.mark.slow
def test_edit_sequences_never_crash(tmp_path):
    """Good, broken (syntax, import, type) and good again, in every order here, each loaded and
    called twice, and a kernel whose code generation fails traced twice; in a subprocess."""
    script = textwrap.dedent(
        f"""
        import pathlib
        import jax
        import jax.numpy as jnp
        import slax

        path = pathlib.Path({str(tmp_path)!r}) / "edited.slang"
        versions = {{
            "square": {SQUARE!r},
            "cube": {CUBE!r},
            "syntax": "[Differentiable]\\nfloat f(float x) {{ return x * ; }}\\n",
            "import": "import no_such_module;\\n[Differentiable]\\nfloat f(float x) {{ return x; }}\\n",
            "type": "[Differentiable]\\nfloat f(float x) {{ return undefined_name(x); }}\\n",
        }}
        expected = {{"square": (9.0, 6.0), "cube": (27.0, 27.0)}}
        order = ["square", "syntax", "cube", "import", "import", "square", "type", "cube", "syntax", "square"]
        for name in order:
            path.write_text(versions[name])
            for attempt in range(2):
                try:
                    module = slax.load_module(path)
                except slax.SlangCompileError:
                    assert name not in expected, name
                    continue
                got = (float(module.f(3.0)), float(jax.grad(module.f)(3.0)))
                assert got == expected[name], (name, got)
                assert float(jax.jvp(module.f, (3.0,), (1.0,))[1]) == expected[name][1]
        unrollable = pathlib.Path({str(tmp_path)!r}) / "unrollable.slang"
        unrollable.write_text(
            '[shader("compute")]\\n[numthreads(64, 1, 1)]\\n'
            "void k(uint3 t : SV_DispatchThreadID, uniform float* x, uniform uint count)\\n{{\\n"
            "    [ForceUnroll]\\n    for (uint i = 0; i < count; i++) x[i] = 0;\\n}}\\n"
        )
        for attempt in range(2):
            kernel = slax.load_module(unrollable).kernel("k")
            result = [jax.ShapeDtypeStruct((4,), jnp.float32)]
            try:
                jax.jit(lambda x: kernel(x, results=result, threads=1, in_place={{0: 0}}, count=4)).trace(
                    jnp.ones(4)
                ).lower()
                raise AssertionError("an unrollable loop compiled")
            except slax.SlangCompileError:
                pass
        print("survived")
        """
    )
    result = run_python("-c", script)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    assert result.stdout.split()[-1] == "survived"


def test_content_key_covers_imports_and_says_what_changed(tmp_path):
    helper = tmp_path / "helper.slang"
    helper.write_text("module helper;\npublic float g(float x) { return x; }\n")
    path = tmp_path / "user.slang"
    path.write_text('import "helper.slang";\nfloat f(float x) { return g(x); }\n')
    before = _sources.content_of(str(path))
    assert _sources.known_content(str(path)) == before
    assert {"f", "g", "helper"} <= _sources.identifiers(before)
    helper.write_text("module helper;\npublic float g(float x) { return -x; }\n")
    assert _sources.known_content(str(path)) is None
    with pytest.raises(RuntimeError, match=r"helper\.slang.*load_module again"):
        _sources.require_unchanged(before, "the test module")
    assert _sources.content_of(str(path)) != before


@pytest.mark.one_device_kind
@pytest.mark.skipif(sys.platform != "linux", reason="reads the resident size from /proc")
def test_dropped_sessions_are_freed():
    """A Slang session slax drops (here as the quick run drops every file's) leaves no memory
    behind once its module, its functions' reflection and a kernel's parameters were read: slax
    reads them through a linked program's layout (slax._compile.module_layout), as SlangPy's
    ``SlangModule.layout`` would keep the session alive. In a subprocess, whose size is its own."""
    script = textwrap.dedent(
        """
        import ctypes, gc
        import slax
        from slax import _compile

        def resident_mb():
            with open("/proc/self/status") as status:
                line = next(line for line in status if line.startswith("VmRSS:"))
            return int(line.split()[1]) / 1024

        sizes = []
        for _ in range(12):
            module = slax.load_module("kernels/scale_shift")
            module.function_names()
            module.kernel("scale_shift_float")
            del module
            with _compile._lock:
                _compile._sessions.clear()
            gc.collect()
            ctypes.CDLL(None).malloc_trim(0)
            sizes.append(resident_mb())
        print(sizes[-1] - sizes[1])
        """
    )
    result = run_python("-c", script, timeout=300)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    assert float(result.stdout.split()[-1]) < 10, result.stdout
