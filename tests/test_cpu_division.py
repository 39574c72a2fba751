"""What C++ leaves undefined and GPUs define, on every route: integer division and remainder by
zero (and INT_MIN / -1), which kill the process with SIGFPE on SlangPy's CPU device unless
slax/_cpu_division.c completes them, and indices past a fixed-size array's or a vector's end,
which shaders/slax/cpu.slang clamps there. Each route must give lavapipe's values. The kernels run
in a fresh process, so that a regression fails the test instead of killing pytest."""

from __future__ import annotations

import json
import signal

import numpy as np
from _helpers import run_python

SOURCE = """
int quotient(int a, int b) { return a / b; }
int remainder(int a, int b) { return a % b; }
uint unsigned_quotient(uint a, uint b) { return a / b; }
uint unsigned_remainder(uint a, uint b) { return a % b; }
float array_element(float[4] v, int i) { return v[i]; }
float vector_element(float4 v, int i) { return v[i]; }
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
results = {
    "quotient": mod.quotient(a, b), "remainder": mod.remainder(a, b),
    "unsigned_quotient": mod.unsigned_quotient(ua, ub), "unsigned_remainder": mod.unsigned_remainder(ua, ub),
    "array_element": mod.array_element(table, index), "vector_element": mod.vector_element(table, index),
}
print(json.dumps({name: np.asarray(value).tolist() for name, value in results.items()}))
"""

INT_MIN, ALL_ONES = -(2**31), 2**32 - 1


def _inputs(rng: np.random.Generator) -> dict[str, list[int]]:
    """Dividends at random and at the extremes, over zero divisors, nonzero ones and INT_MIN / -1;
    indices in range, just past either end and far past both."""
    dividends = [*rng.integers(INT_MIN, 2**31, 12), INT_MIN, 2**31 - 1, 0, -1]
    divisors = [0] * len(dividends) + [*rng.integers(-1000, 1000, len(dividends)) | 1, -1]
    a = dividends + dividends + [INT_MIN]
    index = [0, 1, 2, 3, 4, 5, -1, -2, *rng.integers(INT_MIN, 2**31, 8)]
    return {"a": [int(v) for v in a], "b": [int(v) for v in divisors], "index": [int(v) for v in index]}


def _expected(inputs: dict[str, list[int]]) -> dict[str, list]:
    """lavapipe's values: a zero divisor gives signed x / 0 = 0, x % 0 = -1 and unsigned x / 0 =
    x % 0 = all ones; INT_MIN / -1 = INT_MIN, remainder 0; otherwise C's truncating division. An
    array index past the end (as an unsigned number) reads the last element; a vector index is
    clamped to [0, 3]."""
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
    return {
        "quotient": quotient,
        "remainder": remainder,
        "unsigned_quotient": unsigned_quotient,
        "unsigned_remainder": unsigned_remainder,
        "array_element": [table[min(i % 2**32, 3)] for i in inputs["index"]],
        "vector_element": [table[min(max(i, 0), 3)] for i in inputs["index"]],
    }


def test_division_by_zero_and_out_of_range_indices_give_lavapipes_values(device_kind, rng):
    inputs = _inputs(rng)
    result = run_python("-c", PROGRAM, json.dumps(inputs), SOURCE, timeout=300)
    killed = -result.returncode in (signal.SIGFPE, signal.SIGSEGV, signal.SIGBUS)
    assert result.returncode == 0, (
        f"the kernels' process on {device_kind} "
        + (f"died of {signal.Signals(-result.returncode).name}" if killed else f"exited {result.returncode}")
        + f":\n{result.stderr[-3000:]}"
    )
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got == _expected(inputs)
