"""Long runs hold their memory: thousands of jitted slax training steps, memory read throughout.

Trains a network of benchmark.py (default: the polynomial MLP with the fused Slang loss-and-gradient
kernel and optax Adam) in jitted lax.scan chunks of --chunk steps, and after a warm-up chunk and
after every chunk reads:

- host: the process's resident memory (/proc/self/statm);
- JAX: device bytes in use by XLA's allocator (``Device.memory_stats()``; absent on the CPU, where
  lavapipe's device memory is host memory and the RSS covers it);
- CUDA: memory in use on the GPU as its driver counts it (``cuMemGetInfo``), which also sees what
  SlangPy allocates outside XLA's allocator.

Prints one row per reading and the growth of each since warm-up; writes JSON; exits 1 if any
grew by more than --max-growth-mb.

    python experiments/soak.py [--steps 10000] [--chunk 1000] [--batch 1024] [--launch slangpy|ptx]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import sys

import _harness as harness


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=harness.HelpFormatter,
        epilog=harness.exit_status_help(
            "a memory reading grew more than --max-growth-mb, or a loss was not finite"
        ),
    )
    parser.add_argument(
        "--network",
        choices=tuple(harness.NETWORKS),
        default="polynomial",
        help="network of benchmark.py to train",
    )
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="kernel precision")
    parser.add_argument("--batch", type=harness.positive_int, default=1024, help="samples per step")
    parser.add_argument(
        "--steps", type=harness.positive_int, default=10_000, help="steps after the warm-up chunk"
    )
    parser.add_argument(
        "--chunk", type=harness.positive_int, default=1000, help="steps per jitted call; must divide --steps"
    )
    harness.add_launch_argument(parser)
    parser.add_argument(
        "--max-growth-mb",
        type=harness.finite_float,
        default=16.0,
        help="largest growth of any reading that passes, MB",
    )
    parser.add_argument("--json", default=None, help="also write the readings here (default: not written)")
    args = parser.parse_args(argv)
    if args.steps % args.chunk:
        parser.error(f"--steps {args.steps} is not a multiple of --chunk {args.chunk}")
    return args


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "soak")

# After the flags: JAX and slax take seconds to import.
import jax
import numpy as np
from benchmark import training_run


def host_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def jax_device_mb() -> float | None:
    stats = jax.devices()[0].memory_stats()
    return stats["bytes_in_use"] / 2**20 if stats and "bytes_in_use" in stats else None


@functools.cache
def _cuda_driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def cuda_used_mb(ordinal: int = 0) -> float:
    """Total minus free memory of GPU ``ordinal``, read in its primary context (the one JAX and
    SlangPy share)."""
    cuda = _cuda_driver()

    def check(status: int, call: str) -> None:
        if status != 0:
            raise RuntimeError(f"soak: {call} failed with CUresult {status}")

    device, context, popped = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cuda.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    try:
        check(cuda.cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")
        try:
            check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        finally:
            cuda.cuCtxPopCurrent_v2(ctypes.byref(popped))
    finally:
        cuda.cuDevicePrimaryCtxRelease_v2(device)
    return (total.value - free.value) / 2**20


def reading(step: int, loss: float) -> dict:
    on_cuda = harness.on_cuda()
    return {
        "step": step,
        "loss": loss,
        "host_rss_mb": host_rss_mb(),
        "jax_device_mb": jax_device_mb(),
        "cuda_used_mb": cuda_used_mb() if on_cuda else None,
    }


MEASURES = ("host_rss_mb", "jax_device_mb", "cuda_used_mb")


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    harness.apply_launch(args)
    print(harness.describe_platform())

    run, state = training_run(args.network, "slax", args.dtype, args.batch)
    key = jax.random.key(1)

    def chunk(state, key):
        key, sub = jax.random.split(key)
        state, losses = run(state, jax.random.split(sub, args.chunk))
        return jax.block_until_ready(state), float(np.asarray(losses)[-1]), key

    state, loss, key = chunk(state, key)  # compiles, allocates, warms caches
    readings = [reading(0, loss)]
    header = f"{'step':>8} {'loss':>10} {'host RSS MB':>12} {'JAX device MB':>14} {'CUDA used MB':>13}"
    print(header + "\n" + "-" * len(header))

    def show(r: dict) -> None:
        cells = [f"{r[m]:.1f}" if r[m] is not None else "-" for m in MEASURES]
        print(f"{r['step']:>8} {r['loss']:>10.3e} {cells[0]:>12} {cells[1]:>14} {cells[2]:>13}", flush=True)

    show(readings[0])
    for done in range(args.chunk, args.steps + 1, args.chunk):
        state, loss, key = chunk(state, key)
        readings.append(reading(done, loss))
        show(readings[-1])

    growth = {m: readings[-1][m] - readings[0][m] for m in MEASURES if readings[0][m] is not None}
    grown = {m: g for m, g in growth.items() if g > args.max_growth_mb}
    print("\ngrowth over", args.steps, "steps:", ", ".join(f"{m} {g:+.1f} MB" for m, g in growth.items()))
    finite = bool(np.isfinite([r["loss"] for r in readings]).all())
    if args.json:
        harness.write_json(
            args.json,
            {
                "platform": harness.describe_platform(),
                "args": vars(args),
                "readings": readings,
                "growth_mb": growth,
                "finite": finite,
            },
        )
    if grown or not finite:
        print(f"FAIL: grew more than {args.max_growth_mb} MB: {grown}" if grown else "FAIL: non-finite loss")
        return 1
    print(f"ok: nothing grew more than {args.max_growth_mb} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
