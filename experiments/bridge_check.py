"""Check the bridge where JAX runs (CPU or CUDA): results, zero-copy, and the cost of a call.

1. ``y = a * x + b`` through the hand-written kernel shaders/kernels/scale_shift.slang, compared with
   NumPy for float32, float16 and int32.
2. In place and zero-copy: a kernel writing into a donated buffer returns an array at the very
   address XLA handed to it; with JAX on CUDA the launcher must be the zero-copy one.
3. Per-call cost inside a jitted ``lax.fori_loop`` of 1000 steps, at 256 and 2^20 elements, next to
   the same update as a plain XLA op: median of several timed runs after a warm-up.

    python experiments/bridge_check.py [--steps 1000] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import slax
from slax._bridge import ZeroCopyLauncher, launcher_for
from slax._device import default_platform

KERNELS = {"float32": "scale_shift_float", "float16": "scale_shift_half", "int32": "scale_shift_int"}


def scale_shift(module, x, a, b):
    kernel = module.kernel(KERNELS[str(x.dtype)])
    return kernel(
        x, results=[jax.ShapeDtypeStruct(x.shape, x.dtype)], threads=x.size, count=x.size, a=a, b=b
    )[0]


def check_results(module) -> list[str]:
    rng = np.random.default_rng(0)
    failures = []
    for dtype in KERNELS:
        x = rng.integers(-100, 100, 4099) if dtype == "int32" else rng.uniform(-3, 3, 4099)
        x = x.astype(dtype)
        a, b = (3, -2) if dtype == "int32" else (1.5, 0.25)
        got = np.asarray(jax.jit(lambda x, a=a, b=b: scale_shift(module, x, a, b))(x))
        want = (np.asarray(a, dtype) * x + np.asarray(b, dtype)).astype(dtype)
        ok = np.array_equal(got, want)
        print(f"  {dtype:8s} 4099 elements vs NumPy: {'exact' if ok else 'MISMATCH'}")
        if not ok:
            failures.append(dtype)
    return failures


def check_in_place(module) -> bool:
    """The kernel writes into the buffer XLA hands over: a donated output buffer comes back as the
    result, at the same address, holding the kernel's values. On CUDA the zero-copy launcher passes
    that address to the kernel; on the CPU path the host-copy launcher copies into it."""
    kernel = module.kernel("scale_shift_float")

    def write_into(x, out):  # out <- 2x + 1, in place
        return kernel(
            x,
            out,
            results=[jax.ShapeDtypeStruct(x.shape, x.dtype)],
            threads=x.size,
            count=x.size,
            a=2.0,
            b=1.0,
            in_place={1: 0},
        )[0]

    x = jnp.arange(1 << 20, dtype=jnp.float32)
    out = jnp.zeros_like(x)
    address = out.unsafe_buffer_pointer()
    y = jax.jit(write_into, donate_argnums=1)(x, out)
    same = y.unsafe_buffer_pointer() == address
    exact = np.array_equal(np.asarray(y), 2 * np.arange(1 << 20, dtype=np.float32) + 1)
    launcher = launcher_for(default_platform())
    print(
        f"  launcher {type(launcher).__name__}: result at the donated buffer's address: {same}; "
        f"exact: {exact}"
    )
    zero_copy = isinstance(launcher, ZeroCopyLauncher)
    print(f"  kernel reads and writes XLA's device buffers directly (no host copy): {zero_copy}")
    return same and exact and (zero_copy or default_platform() == "cpu")


def time_per_call(fn, x, steps, repeats) -> float:
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, steps, lambda _, y: fn(y), x))
    loop(x).block_until_ready()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        loop(x).block_until_ready()
        runs.append((time.perf_counter() - start) / steps)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    module = slax.load_module("kernels/scale_shift.slang")
    print(
        f"JAX {jax.__version__} on {jax.devices()[0]}; "
        f"Slang kernels via {type(launcher_for(default_platform())).__name__}"
    )
    print("results:")
    failures = check_results(module)
    print("in place / zero-copy:")
    in_place = check_in_place(module)
    rows = []
    for size in (256, 1 << 20):
        x = jnp.linspace(-1.0, 1.0, size, dtype=jnp.float32)
        slang = time_per_call(lambda y: scale_shift(module, y, 0.5, 0.25), x, args.steps, args.repeats)
        xla = time_per_call(lambda y: 0.5 * y + 0.25, x, args.steps, args.repeats)
        rows.append({"elements": size, "slax_us": slang * 1e6, "xla_us": xla * 1e6})
    print(f"\nper call inside jit(fori_loop({args.steps})), median of {args.repeats}:")
    print(f"{'elements':>10}  {'slax kernel (us)':>16}  {'XLA op (us)':>12}")
    for row in rows:
        print(f"{row['elements']:>10}  {row['slax_us']:>16.1f}  {row['xla_us']:>12.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(jax.devices()[0]), "in_place": in_place, "rows": rows}, f, indent=2)
    return 1 if failures or not in_place else 0


if __name__ == "__main__":
    sys.exit(main())
