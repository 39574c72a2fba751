"""What C++ leaves undefined and GPUs define, on every route: integer division and remainder by
zero (and INT_MIN / -1), which kill the process with SIGFPE on SlangPy's CPU device unless
slax/_cpu_signals.c completes them, and indices past a fixed-size array's, a vector's or a
matrix's end, which shaders/slax/cpu.slang clamps there. Each route must give lavapipe's values.
And Ctrl-C during an endless kernel on SlangPy's CPU device and on Vulkan. The kernels run in a
fresh process, so that a regression fails the test instead of killing (or holding) pytest."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _helpers import ROOT, python_env, run_python

from slax import _cpu_signals

SOURCE = """
int quotient(int a, int b) { return a / b; }
int remainder(int a, int b) { return a % b; }
uint unsigned_quotient(uint a, uint b) { return a / b; }
uint unsigned_remainder(uint a, uint b) { return a % b; }
float array_element(float[4] v, int i) { return v[i]; }
float vector_element(float4 v, int i) { return v[i]; }
struct Holder { float4 v; float2x3 m; };
float matrix_element(float3x3 m, int i, int j) { return m[i][j]; }
float3 matrix_row(float3x3 m, int i) { return m[i]; }
float product_row(float3x3 m, int i) { return (m + m)[i].y; }
float member_element(float4 v, float2x3 m, int i, int j) { Holder h = { v, m }; return h.v[i] + h.m[j][i]; }
float3x3 matrix_write(float3x3 m, int i, int j, float value) { m[i][j] = value; return m; }
float3x3 row_write(float3x3 m, int i, float value) { m[i] = value; return m; }
float4 vector_write(float4 v, int i, float value) { v[i] += value; return v; }
"""

PROGRAM = """
import json, sys
import numpy as np
import slax

inputs = json.loads(sys.argv[1])
mod = slax.load_module_from_source("undefined_behaviour", sys.argv[2])
a, b = np.array(inputs["a"], np.int32), np.array(inputs["b"], np.int32)
ua, ub = a.view(np.uint32), b.view(np.uint32)
index, table = np.array(inputs["index"], np.int32), np.arange(1, 5, dtype=np.float32)
column, value = np.array(inputs["column"], np.int32), np.float32(inputs["value"])
matrix, wide = np.array(inputs["matrix"], np.float32), np.array(inputs["wide"], np.float32)
computations = {
    "quotient": lambda: mod.quotient(a, b),
    "remainder": lambda: mod.remainder(a, b),
    "unsigned_quotient": lambda: mod.unsigned_quotient(ua, ub),
    "unsigned_remainder": lambda: mod.unsigned_remainder(ua, ub),
    "array_element": lambda: mod.array_element(table, index),
    "vector_element": lambda: mod.vector_element(table, index),
    "matrix_element": lambda: mod.matrix_element(matrix, index, column),
    "matrix_row": lambda: mod.matrix_row(matrix, index),
    "product_row": lambda: mod.product_row(matrix, index),
    "member_element": lambda: mod.member_element(table, wide, index, column),
    "matrix_write": lambda: mod.matrix_write(matrix, index, column, value),
    "row_write": lambda: mod.row_write(matrix, index, value),
    "vector_write": lambda: mod.vector_write(table, index, value),
}
for name, compute in computations.items():  # a line each: what ran before a crash is still checked
    print(json.dumps([name, np.asarray(compute()).tolist()]), flush=True)
"""

INT_MIN, ALL_ONES = -(2**31), 2**32 - 1


def _inputs(rng: np.random.Generator) -> dict[str, list]:
    """Dividends at random and at the extremes, over zero divisors, nonzero ones and INT_MIN / -1;
    indices (and column indices, in another order) in range, just past either end and far past
    both; matrices (3x3, 2x3) and a value to write, at random."""
    dividends = [*rng.integers(INT_MIN, 2**31, 12), INT_MIN, 2**31 - 1, 0, -1]
    divisors = [0] * len(dividends) + [*rng.integers(-1000, 1000, len(dividends)) | 1, -1]
    a = dividends + dividends + [INT_MIN]
    index = [0, 1, 2, 3, 4, 5, -1, -2, *rng.integers(INT_MIN, 2**31, 8)]
    column = rng.permutation(index)
    return {
        "a": [int(v) for v in a],
        "b": [int(v) for v in divisors],
        "index": [int(v) for v in index],
        "column": [int(v) for v in column],
        "matrix": rng.uniform(-1.0, 1.0, (3, 3)).astype(np.float32).tolist(),
        "wide": rng.uniform(-1.0, 1.0, (2, 3)).astype(np.float32).tolist(),
        "value": float(np.float32(rng.uniform(2.0, 3.0))),
    }


def _expected(inputs: dict[str, list[int]]) -> dict[str, list]:
    """lavapipe's values: a zero divisor gives signed x / 0 = 0, x % 0 = -1 and unsigned x / 0 =
    x % 0 = all ones; INT_MIN / -1 = INT_MIN, remainder 0; otherwise C's truncating division. An
    array index or a matrix's row index past the end (as an unsigned number) reads and writes the
    last; a vector's element index is clamped to [0, N - 1] when read, and a write past the end is
    dropped."""
    quotient, remainder, unsigned_quotient, unsigned_remainder = [], [], [], []
    for a, b in zip(inputs["a"], inputs["b"]):
        ua, ub = a % 2**32, b % 2**32
        if b == 0:
            quotient.append(0)
            remainder.append(-1)
        elif (a, b) == (INT_MIN, -1):
            quotient.append(INT_MIN)
            remainder.append(0)
        else:
            q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
            quotient.append(q)
            remainder.append(a - q * b)
        unsigned_quotient.append(ua // ub if ub else ALL_ONES)
        unsigned_remainder.append(ua % ub if ub else ALL_ONES)
    table = [1.0, 2.0, 3.0, 4.0]
    vector = np.array(table, np.float32)
    matrix, wide = np.array(inputs["matrix"], np.float32), np.array(inputs["wide"], np.float32)
    value = np.float32(inputs["value"])
    pairs = list(zip(inputs["index"], inputs["column"]))

    def row(i: int, count: int) -> int:
        return min(i % 2**32, count - 1)

    def element(i: int, count: int) -> int:
        return min(max(i, 0), count - 1)

    def written(array: np.ndarray, where: tuple, valid: bool, new) -> list:
        array = array.copy()
        if valid:
            array[where] = new
        return array.tolist()

    return {
        "quotient": quotient,
        "remainder": remainder,
        "unsigned_quotient": unsigned_quotient,
        "unsigned_remainder": unsigned_remainder,
        "array_element": [table[min(i % 2**32, 3)] for i in inputs["index"]],
        "vector_element": [table[element(i, 4)] for i in inputs["index"]],
        "matrix_element": [float(matrix[row(i, 3), element(j, 3)]) for i, j in pairs],
        "matrix_row": [matrix[row(i, 3)].tolist() for i in inputs["index"]],
        "product_row": [float(2 * matrix[row(i, 3), 1]) for i in inputs["index"]],
        "member_element": [float(vector[element(i, 4)] + wide[row(j, 2), element(i, 3)]) for i, j in pairs],
        "matrix_write": [written(matrix, (row(i, 3), j), 0 <= j < 3, value) for i, j in pairs],
        "row_write": [written(matrix, row(i, 3), True, value) for i in inputs["index"]],
        "vector_write": [written(vector, i, 0 <= i < 4, vector[i % 4] + value) for i in inputs["index"]],
    }


def _defined(inputs: dict[str, list]) -> dict[str, list[bool]]:
    """Which of each operation's results Slang defines: a nonzero divisor, indices in range. Only
    these are compared on CUDA, where the rest are NVIDIA's own (PTX leaves division by zero
    machine-specific, and an index past a local array's end reads whatever lies there)."""
    nonzero = [b != 0 for b in inputs["b"]]
    pairs = list(zip(inputs["index"], inputs["column"]))
    return {
        "quotient": nonzero,
        "remainder": nonzero,
        "unsigned_quotient": nonzero,
        "unsigned_remainder": nonzero,
        "array_element": [0 <= i < 4 for i in inputs["index"]],
        "vector_element": [0 <= i < 4 for i in inputs["index"]],
        "matrix_element": [0 <= i < 3 and 0 <= j < 3 for i, j in pairs],
        "matrix_row": [0 <= i < 3 for i in inputs["index"]],
        "product_row": [0 <= i < 3 for i in inputs["index"]],
        "member_element": [0 <= i < 3 and 0 <= j < 2 for i, j in pairs],
        "matrix_write": [0 <= i < 3 and 0 <= j < 3 for i, j in pairs],
        "row_write": [0 <= i < 3 for i in inputs["index"]],
        "vector_write": [0 <= i < 4 for i in inputs["index"]],
    }


def test_division_by_zero_and_out_of_range_indices_give_lavapipes_values(device_kind, rng):
    """Each operation's results in the order computed, so that a route that dies partway (or gives
    other values) shows which operations did what. SlangPy's CPU device gives lavapipe's values
    everywhere; CUDA, where NVIDIA defines its own, must give them where Slang defines the result,
    and must not die on the rest."""
    inputs = _inputs(rng)
    if device_kind == "cuda":
        # An index past the end is undefined on CUDA as in CUDA C++: it may fault the GPU, which
        # ends the process (docs/limits.md). Indices there stay in range; divisions by zero remain.
        inputs["index"] = rng.integers(0, 3, len(inputs["index"])).tolist()
        inputs["column"] = rng.integers(0, 2, len(inputs["column"])).tolist()
    result = run_python("-c", PROGRAM, json.dumps(inputs), SOURCE, timeout=300)
    got = dict(json.loads(line) for line in result.stdout.splitlines() if line.startswith('["'))
    expected = _expected(inputs)
    if device_kind == "cuda":
        defined = _defined(inputs)
        assert set(defined) == set(expected)
        got = {name: [v for v, ok in zip(values, defined[name]) if ok] for name, values in got.items()}
        expected = {
            name: [v for v, ok in zip(values, defined[name]) if ok] for name, values in expected.items()
        }
    differ = {name: got[name] for name in got if got[name] != expected[name]}
    assert not differ, f"on {device_kind}, these differ from lavapipe's values: {differ}"
    killed = -result.returncode in (signal.SIGFPE, signal.SIGSEGV, signal.SIGBUS)
    assert result.returncode == 0, (
        f"the kernels' process on {device_kind} "
        + (f"died of {signal.Signals(-result.returncode).name}" if killed else f"exited {result.returncode}")
        + f" computing {next(name for name in expected if name not in got)}:\n{result.stderr[-3000:]}"
    )


SPREAD = """
import ctypes, sys
import numpy as np
import slax

module = slax.load_module_from_source("spread_division", sys.argv[1])
rng = np.random.default_rng(int(sys.argv[2]))
a = rng.integers(-1000, 1000, 1 << 16).astype(np.int32)
b = rng.integers(-3, 4, 1 << 16).astype(np.int32)  # a seventh of the divisors zero, in every group
quotient, remainder = np.asarray(module.quotient(a, b)), np.asarray(module.remainder(a, b))
# The worker threads' hooks for the division handler (slax/_cpu_dispatch.h), found by name.
hooks = all(hasattr(ctypes.CDLL(None), name) for name in ("slax_kernel_enter", "slax_kernel_leave"))
safe = np.where(b == 0, 1, b)
truncated = np.trunc(a / safe).astype(np.int32)
print(hooks, (quotient == np.where(b == 0, 0, truncated)).all(),
      (remainder == np.where(b == 0, -1, a - truncated * safe)).all())
"""


@pytest.mark.one_device_kind("cpu")
def test_division_by_zero_on_a_launchs_worker_threads_gives_lavapipes_values(device_kind, rng):
    """A launch of 2^16 threads on SlangPy's CPU device runs its groups on worker threads (four,
    whatever the cores: SLAX_CPU_THREADS), each of which the division handler covers: their
    zero divisors give lavapipe's values, and the process lives."""
    if device_kind != "cpu":
        pytest.skip("worker threads run SlangPy's CPU device's launches")
    result = run_python(
        "-c",
        SPREAD,
        SOURCE.split("uint unsigned")[0],
        str(rng.integers(1 << 30)),
        env={**os.environ, "SLAX_CPU_THREADS": "4", "SLAX_DEVICE": "cpu"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-3:] == ["True", "True", "True"], result.stdout[-2000:]


SPIN = """
float spin(float x, uint n)
{
    float a = x;
    for (uint i = 0; i < n; i++)
        for (uint j = 0; j < n; j++)
            a = a * 0.5f + 1.0f;
    return a;
}
"""

ENDLESS = """
import signal, sys
import numpy as np
import slax

signal.signal(signal.SIGINT, lambda *_: None)  # a SIGINT before the kernel starts is not an error here
spin = slax.load_module_from_source("endless", sys.argv[1]).spin
x = np.random.default_rng(5).uniform(-1.0, 1.0, 4).astype(np.float32)
assert np.asarray(spin(x, np.uint32(0))).tolist() == x.tolist()  # compiled; n = 0 loops 0 times
print("ready", flush=True)
spin(x, np.uint32(2**32 - 1))  # 2^64 iterations: never returns here
print("returned", flush=True)
"""


def test_ctrl_c_twice_ends_an_endless_kernel(device_kind):
    """A kernel runs in SlangPy's C++ dispatch (the CPU device) or in the Vulkan driver while the
    caller waits in C++, where Python's SIGINT handler cannot run: Ctrl-C would hold the process
    until the kernel returned, forever for an endless one. The first SIGINT during a kernel is noted
    (and reaches Python's handler when the kernel returns), the second ends the process as SIGINT
    does. SIGINTs are sent until the process ends: those before the kernel starts reach the
    program's own handler."""
    if device_kind == "cuda" or not _cpu_signals.applies():
        pytest.skip("SlangPy's CPU device and Vulkan on Linux x86-64; CUDA waits in the driver (README)")
    child = subprocess.Popen(
        [sys.executable, "-c", ENDLESS, SPIN],
        cwd=ROOT,
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready", child.stderr
        deadline = time.monotonic() + 60
        while child.poll() is None and time.monotonic() < deadline:
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        assert child.returncode == -signal.SIGINT, f"still running, or exited {child.returncode}"
        assert "interrupted again while a Slang kernel runs" in child.stderr.read()
    finally:
        child.kill()
        child.communicate()


LOAD = """
from slax import _cpu_signals
print(_cpu_signals._library()._name)
"""


@pytest.mark.one_device_kind  # the handlers' library is built and loaded before any device
@pytest.mark.slow
def test_a_damaged_compiled_helper_is_rebuilt(tmp_path):
    """The handlers' library, once built into the cache directory, was loaded as found: emptied or
    garbled, every later process failed with ``OSError: ... file too short``; cut inside a
    segment, loading it killed the process with SIGBUS. A library that is not whole as built is
    rebuilt (into a file of its own, renamed over it: processes that rebuild it at once, as
    pytest-xdist's workers do, each load a whole one), saying so on stderr."""
    if not _cpu_signals.applies():
        pytest.skip("the handlers are built on Linux x86-64 only")
    env = {**python_env(), "SLAX_CACHE_DIR": str(tmp_path)}
    built = run_python("-c", LOAD, env=env, timeout=120)
    assert built.returncode == 0, built.stderr[-3000:]
    library = pathlib.Path(built.stdout.strip())
    whole = library.read_bytes()
    rng = np.random.default_rng(58)
    garbled = bytearray(whole)
    at = int(rng.integers(64, len(whole) - 64))
    garbled[at : at + 16] = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
    damages = {"emptied": b"", "cut inside a segment": whole[: len(whole) // 2], "garbled": bytes(garbled)}
    for damage, content in damages.items():
        library.write_bytes(content)
        children = [
            subprocess.Popen(
                [sys.executable, "-c", LOAD],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        errors = []
        for child in children:
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0, f"{damage}: exited {child.returncode}\n{err[-3000:]}"
            assert out.strip() == str(library)
            errors.append(err)
        assert any(f"{library} is damaged" in err and "rebuilt it" in err for err in errors), errors
        again = run_python("-c", LOAD, env=env, timeout=120)
        assert again.returncode == 0 and "damaged" not in again.stderr, again.stderr[-3000:]
    assert sorted(path.name for path in library.parent.iterdir()) == [library.name]
