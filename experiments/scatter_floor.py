"""How fast a GPU adds a hash grid's scatter, with nothing else in the kernel: the floor under
slax's ``scatter_values``/``scatter_jacobian`` (``shaders/nn/fused_encoding.slang``).

Each of --batch points adds into 16 levels of 2^19 rows of 2 float32 features (a 64 MB gradient,
the issue's grid), 8 corners a point and level, each corner's 2 features at a row a hash picks,
through slax's ``jax.grad`` of a Slang read of an ``IDiffTensor`` (``scatter_floor.slang``). Three
ways, timed as the mean of --repeats jitted calls (zeroing the gradient included):

- ``random``: 8 float2 reductions at independent random rows;
- ``pairs``: 8 float2 reductions, the corners in pairs of neighbouring rows (as the spatial hash
  makes a cell's edge along x: its first prime is 1);
- ``pairs merged``: the same pairs as 4 float4 reductions, one a pair.

The L2 cache performs each reduction; the three show what a request costs against what it adds.

    python experiments/scatter_floor.py --json runs/scatter-floor.json
"""

from __future__ import annotations

import argparse

import _harness as harness


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=harness.HelpFormatter, epilog=harness.exit_status_help(None)
    )
    parser.add_argument("--batch", type=harness.positive_int, default=1 << 18, help="points")
    parser.add_argument("--repeats", type=harness.positive_int, default=30, help="timed calls a way")
    parser.add_argument(
        "--json", default=None, help="write the rows and provenance to this file (default: not written)"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "scatter_floor")

# After the flags: JAX and slax take seconds to import.
import pathlib

import jax
import jax.numpy as jnp

import slax

LEVELS, ROWS = 16, 1 << 19


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    kernels = slax.load_module(str(pathlib.Path(__file__).with_name("scatter_floor.slang")))
    points = jnp.arange(args.batch, dtype=jnp.int32)[:, None]
    levels = jnp.arange(LEVELS, dtype=jnp.int32)[None, :]

    def corner_adds(paired):
        return lambda g: jax.grad(lambda g: kernels.corner_adds(g, points, levels, ROWS, paired).sum())(g)

    def pair_adds(g):
        return jax.grad(lambda g: kernels.pair_adds(g, points, levels, ROWS).sum())(g)

    rows = jnp.zeros((LEVELS * ROWS, 2), jnp.float32)
    pairs = jnp.zeros((LEVELS * ROWS // 2, 4), jnp.float32)
    ways = [
        ("zeroing the gradient alone", lambda g: jnp.zeros_like(g) + 0.0, rows, 0),
        ("random: 8 float2 reductions", corner_adds(0), rows, 8),
        ("pairs: 8 float2 reductions", corner_adds(1), rows, 8),
        ("pairs merged: 4 float4 reductions", pair_adds, pairs, 4),
    ]
    print(f"scatter_floor: batch {args.batch} x {LEVELS} levels, {harness.describe_platform()}", flush=True)
    print(f"{'way':40s} {'us':>9s} {'G reductions/s':>15s}")
    results = []
    for name, function, gradient, per_corner_set in ways:
        us = harness.mean_call_seconds(function, gradient, repeats=args.repeats, warm_calls=2) * 1e6
        reductions = args.batch * LEVELS * per_corner_set
        rate = reductions / us / 1e3 if reductions else None
        print(f"{name:40s} {us:9.1f} {rate if rate else float('nan'):15.1f}", flush=True)
        results.append({"way": name, "us": us, "reductions": reductions, "g_reductions_per_s": rate})
    if args.json:
        harness.write_json(args.json, {**harness.provenance(), "batch": args.batch, "rows": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
