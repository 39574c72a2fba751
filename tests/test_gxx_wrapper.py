"""The g++ slax puts on PATH while SlangPy builds a CPU kernel (slax/_gxx_wrapper.py): each kernel
built once per cache, with Slang's C++ prelude precompiled; every other command as it came."""

import ctypes
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import slax
from slax import _gxx_wrapper
from slax._device import cpp_compiler

pytestmark = pytest.mark.one_device_kind("cpu")

PRELUDE = """#ifndef SLANG_CPP_PRELUDE_H
#define SLANG_CPP_PRELUDE_H
#  ifdef SLAX_TEST_UNDEFINED
int never();
#  endif
#if 1
inline int twice(int x) { return 2 * x; }
#endif // a comment after the directive
#endif
"""
KERNEL = 'extern "C" int entry(int x) { return twice(x) + 1; }\n'

gxx = shutil.which("g++")
needs_gxx = pytest.mark.skipif(gxx is None, reason="builds with g++")


def logging_compiler(tmp_path, then: str | None = None) -> tuple[str, str]:
    """A compiler that appends its arguments to a log, then runs ``then`` with them (or nothing):
    its path and the log's."""
    log = tmp_path / "calls.log"
    script = tmp_path / "logging-g++"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n' + (f'exec {then} "$@"\n' if then else ""))
    script.chmod(0o755)
    return str(script), str(log)


def calls(log: str) -> list[str]:
    return open(log).read().splitlines() if os.path.exists(log) else []


def test_the_prelude_runs_from_the_guard_to_the_endif_that_closes_it():
    assert _gxx_wrapper.prelude_text(PRELUDE + KERNEL) == PRELUDE
    assert _gxx_wrapper.prelude_text("// not Slang's\n" + PRELUDE + KERNEL) is None
    assert _gxx_wrapper.prelude_text(PRELUDE.rsplit("#endif", 1)[0] + KERNEL) is None  # never closed


def test_the_headers_flags_are_the_commands_but_its_source_output_and_link():
    arguments = ["-std=c++17", "-O3", "-o", "out.so", "-shared", "-fPIC", "-DX=1", "-Wl,--no-undefined"]
    arguments += ["k.cpp", "-lstdc++", "-lm"]
    assert _gxx_wrapper.header_flags(arguments, "k.cpp") == ["-std=c++17", "-O3", "-fPIC", "-DX=1"]


def test_commands_that_build_no_slang_cpp_run_as_they_came(tmp_path):
    compiler, log = logging_compiler(tmp_path)
    other = tmp_path / "other.cpp"
    other.write_text(KERNEL)
    commands = [
        ["-v"],
        ["-O2", "-c", str(other), "-o", "o.o"],
        ["-o", "x.so", "a.cpp", "b.cpp"],
        ["-c", str(tmp_path / "gone.cpp"), "-o", "g.o"],
    ]
    for arguments in commands:
        assert _gxx_wrapper.build(compiler, str(tmp_path / "cache"), arguments) == 0
    assert calls(log) == [" ".join(arguments) for arguments in commands]
    assert not (tmp_path / "cache").exists()


@needs_gxx
def test_a_slang_kernel_is_built_once_with_its_prelude_precompiled(tmp_path, capfd):
    compiler, log = logging_compiler(tmp_path, then=gxx)
    source = tmp_path / "kernel.cpp"
    source.write_text(PRELUDE + KERNEL)
    cache = str(tmp_path / "cache")

    def build(output: str) -> int:
        arguments = ["-O2", "-fPIC", "-shared", "-H", "-o", str(tmp_path / output), str(source)]
        return _gxx_wrapper.build(compiler, cache, arguments)

    assert build("first.so") == 0
    header_build, kernel_build = calls(log)
    assert "-x c++-header" in header_build
    flags = " ".join(_gxx_wrapper.KERNEL_FLAGS)
    assert header_build.startswith(flags) and kernel_build.startswith(flags)  # the header's are the build's
    assert f"-include {cache}/preludes/" in kernel_build
    assert "/prelude.h.gch" in capfd.readouterr().err.split("! ", 1)[1]  # g++ -H: "!" marks a header it used
    assert ctypes.CDLL(str(tmp_path / "first.so")).entry(20) == 41
    # The same C++ and flags again (another process, another output): the kernel kept, no g++.
    assert build("second.so") == 0
    assert len(calls(log)) == 2
    assert (tmp_path / "second.so").read_bytes() == (tmp_path / "first.so").read_bytes()
    assert ctypes.CDLL(str(tmp_path / "second.so")).entry(-3) == -5
    # A kept kernel cut short on disk is built again, and kept whole.
    (kept,) = (tmp_path / "cache" / "kernels").iterdir()
    kept.write_bytes(kept.read_bytes()[:-100])
    assert build("again.so") == 0
    assert len(calls(log)) == 3
    assert (tmp_path / "again.so").read_bytes() == (tmp_path / "first.so").read_bytes()
    assert build("whole.so") == 0 and len(calls(log)) == 3
    # Other C++: built again, with the same precompiled prelude.
    source.write_text(PRELUDE + KERNEL.replace("+ 1", "+ 2"))
    assert build("third.so") == 0
    assert len(calls(log)) == 4 and "-x c++-header" not in calls(log)[3]
    assert ctypes.CDLL(str(tmp_path / "third.so")).entry(20) == 42


@needs_gxx
def test_without_a_usable_cache_the_kernel_builds_uncached_with_slaxs_flags(tmp_path):
    compiler, log = logging_compiler(tmp_path, then=gxx)
    source = tmp_path / "kernel.cpp"
    source.write_text(PRELUDE + KERNEL)
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    arguments = ["-O2", "-fPIC", "-shared", "-o", str(tmp_path / "kernel.so"), str(source)]
    assert _gxx_wrapper.build(compiler, str(not_a_folder), arguments) == 0
    assert calls(log) == [" ".join([*_gxx_wrapper.KERNEL_FLAGS, *arguments])]
    assert ctypes.CDLL(str(tmp_path / "kernel.so")).entry(1) == 3


@needs_gxx
def test_a_failing_build_fails_and_keeps_nothing(tmp_path):
    source = tmp_path / "kernel.cpp"
    source.write_text(PRELUDE + KERNEL.replace("return", "retrun"))
    arguments = ["-O2", "-fPIC", "-shared", "-o", str(tmp_path / "kernel.so"), str(source)]
    assert _gxx_wrapper.build(gxx, str(tmp_path / "cache"), arguments) != 0
    assert not (tmp_path / "cache" / "kernels").exists()


@pytest.mark.skipif(
    cpp_compiler() is None or os.path.basename(cpp_compiler()) != "g++",
    reason="slax builds through its g++ where Slang builds with g++",
)
def test_cpu_kernels_build_through_slaxs_gxx_and_path_is_restored(device_kind, tmp_path, monkeypatch):
    if device_kind != "cpu":
        pytest.skip("slax's g++ builds SlangPy's CPU device's kernels")
    monkeypatch.setenv("SLAX_CACHE_DIR", str(tmp_path))
    path = os.environ["PATH"]
    name = f"scaled_sum_{os.urandom(4).hex()}"  # a kernel no cache holds
    module = slax.load_module_from_source(
        name, f"[Differentiable] float {name}(float a, float b) {{ return 3.0 * a + b * b; }}\n"
    )
    a, b = jnp.asarray([0.5, -1.25, 2.0]), jnp.asarray([1.5, 0.25, -3.0])
    values = jax.jit(module[name])(a, b)
    np.testing.assert_allclose(values, 3.0 * np.asarray(a) + np.asarray(b) ** 2, rtol=1e-6)
    assert os.environ["PATH"] == path
    assert _gxx_wrapper._builds == 0
    assert list(tmp_path.glob("cpu/g++/preludes/*/prelude.h.gch"))
    assert list(tmp_path.glob("cpu/g++/kernels/*"))


@needs_gxx
def test_the_same_kernel_with_other_line_directives_is_the_kept_one(tmp_path):
    """A process that loaded Slang's modules from SlangPy's module cache writes a kernel with other
    ``#line`` directives and blank lines; where nothing reads them, its kept build serves."""
    compiler, log = logging_compiler(tmp_path, then=gxx)
    cache = str(tmp_path / "cache")
    kernels = {
        "located.cpp": PRELUDE + '#line 33 "kernel.slang"\n' + KERNEL,
        "unlocated.cpp": PRELUDE + "#line 7\n\n" + KERNEL,
        "line_macro.cpp": PRELUDE + "#line 7\n" + KERNEL.replace("+ 1", "+ __LINE__ - 7"),
        "line_macro_moved.cpp": PRELUDE + "#line 9\n" + KERNEL.replace("+ 1", "+ __LINE__ - 7"),
    }
    results = {}
    for name, text in kernels.items():
        (tmp_path / name).write_text(text)
        output = str(tmp_path / (name + ".so"))
        assert (
            _gxx_wrapper.build(
                compiler, cache, ["-O2", "-fPIC", "-shared", "-o", output, str(tmp_path / name)]
            )
            == 0
        )
        results[name] = ctypes.CDLL(output).entry(20)
    builds = [c for c in calls(log) if "-x c++-header" not in c]
    assert [c.rsplit("/", 1)[1] for c in builds] == ["located.cpp", "line_macro.cpp", "line_macro_moved.cpp"]
    assert results == {
        "located.cpp": 41,
        "unlocated.cpp": 41,
        "line_macro.cpp": 40,
        "line_macro_moved.cpp": 42,
    }


@needs_gxx
def test_nested_builds_share_one_wrapper_of_the_real_gxx_and_restore_path(tmp_path):
    path = os.environ.get("PATH")
    with _gxx_wrapper.builds_through_wrapper(str(tmp_path)):
        outer = os.environ["PATH"]
        with _gxx_wrapper.builds_through_wrapper(str(tmp_path)):  # another thread's build meanwhile
            assert os.environ["PATH"] == outer
            wrapper = shutil.which("g++")
        assert os.environ["PATH"] == outer
    assert os.environ.get("PATH") == path and _gxx_wrapper._builds == 0
    assert os.path.dirname(wrapper) == outer.split(os.pathsep)[0]
    assert f" {gxx} " in open(wrapper).read()  # the real g++, never the wrapper itself


@needs_gxx
def test_without_a_folder_for_the_wrapper_builds_go_to_gxx_as_they_would(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    path = os.environ.get("PATH")
    with _gxx_wrapper.builds_through_wrapper(str(not_a_folder)):
        assert os.environ.get("PATH") == path
    assert _gxx_wrapper._builds == 0


@needs_gxx
def test_path_is_restored_when_a_build_raises(tmp_path):
    path = os.environ.get("PATH")
    with pytest.raises(RuntimeError, match="a build that failed"):
        with _gxx_wrapper.builds_through_wrapper(str(tmp_path)):
            assert os.environ["PATH"] != path
            raise RuntimeError("a build that failed")
    assert os.environ.get("PATH") == path and _gxx_wrapper._builds == 0


@needs_gxx
def test_a_build_the_precompiled_header_breaks_runs_again_as_it_came(tmp_path, monkeypatch):
    """Where the kernel does not build with the precompiled header (a prelude taken short, say), it
    builds as g++ would have without it, and is kept."""
    broken = tmp_path / "broken.h"
    broken.write_text("#define SLANG_CPP_PRELUDE_H\n#define twice(x) not C++\n")
    monkeypatch.setattr(_gxx_wrapper, "precompiled_prelude", lambda *_: str(broken))
    compiler, log = logging_compiler(tmp_path, then=gxx)
    source = tmp_path / "kernel.cpp"
    source.write_text(PRELUDE + KERNEL)
    arguments = ["-O2", "-fPIC", "-shared", "-o", str(tmp_path / "kernel.so"), str(source)]
    assert _gxx_wrapper.build(compiler, str(tmp_path / "cache"), arguments) == 0
    assert [("-include" in call) for call in calls(log)] == [True, False]
    assert ctypes.CDLL(str(tmp_path / "kernel.so")).entry(20) == 41
    assert list((tmp_path / "cache" / "kernels").iterdir())


DISPATCH_SIGNATURE = "(ComputeVaryingInput* varyingInput, void* entryPointParams, void* globalParams)"
LAUNCHES = "".join(
    f"SLANG_PRELUDE_EXPORT\nvoid {name}{DISPATCH_SIGNATURE}\n{{\n}}\n" for name in ("entry_Group", "entry")
)


def test_over_cores_spreads_each_launch_but_not_a_group_or_slangs_atomics():
    spread = _gxx_wrapper.over_cores(PRELUDE + LAUNCHES, PRELUDE, "// the dispatch\n")
    assert spread.startswith(PRELUDE)
    assert f"SLANG_PRELUDE_EXPORT\nvoid entry_Group{DISPATCH_SIGNATURE}" in spread  # a group: as it was
    assert f"static void slax_serial_entry{DISPATCH_SIGNATURE}" in spread
    assert spread.index("// the dispatch") < spread.index(
        f"SLANG_PRELUDE_EXPORT\nvoid entry{DISPATCH_SIGNATURE}"
    )
    assert "slax_dispatch(slax_serial_entry, varyingInput, entryPointParams, globalParams);" in spread
    atomic = PRELUDE + "int add(int* p) { return _slang_atomic_add_i32(p, 1); }\n" + LAUNCHES
    assert _gxx_wrapper.over_cores(atomic, PRELUDE, "// the dispatch\n") == atomic


@pytest.mark.parametrize(("threads", "log_bytes"), [("3", ""), ("8", ""), ("8", "1")])
def test_a_launch_over_worker_threads_gives_the_serial_launchs_bits(
    device_kind, monkeypatch, threads, log_bytes
):
    """The CPU device's launches spread over worker threads (slax/_cpu_dispatch.h; SLAX_CPU_THREADS
    and SLAX_CPU_ADD_LOG_BYTES are read at each launch) give the bits of the same launches in
    order: a Slang function reading a tensor, its gradient (whose adds into the texture's gradient
    take their turns in group order, logged or, past the log's limit of one byte, waiting), and
    the MLP's fused loss and gradient, at 2^14 samples (256 groups). Three threads split the groups
    unevenly."""
    if device_kind != "cpu":
        pytest.skip("worker threads run SlangPy's CPU device's launches")
    texture = slax.load_module("texture").sample_bilinear
    keys = jax.random.split(jax.random.key(int(threads)), 4)
    image = jax.random.uniform(keys[0], (32, 48, 4))
    uv = jax.random.uniform(keys[1], (1 << 14, 2))
    params = slax.nn.mlp_init(keys[2], (4, 16, 4), jnp.float32)
    x, target = jax.random.normal(keys[3], (2, 1 << 14, 4))

    def run():
        sampled = texture(image, uv)
        grad = jax.grad(lambda t: jnp.sum(texture(t, uv) ** 2))(image)
        loss, gradients = slax.nn.mlp_loss_and_grad(params, x, target)
        return [np.asarray(leaf) for leaf in jax.tree.leaves((sampled, grad, loss, gradients))]

    monkeypatch.setenv("SLAX_CPU_THREADS", "1")
    serial = run()
    monkeypatch.setenv("SLAX_CPU_THREADS", threads)
    monkeypatch.setenv("SLAX_CPU_ADD_LOG_BYTES", log_bytes)
    for got, want in zip(run(), serial, strict=True):
        np.testing.assert_array_equal(got, want)
