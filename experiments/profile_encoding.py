"""Where the hash-encoded image step's time goes: its parts timed alone, slax's and plain JAX's.

The step is ngp_image.py's (instant-NGP's 2-D grid, 16 levels of 2 features, 2^19 entries a level,
16 to 2048 cells a side; a 32-64-64-3 ReLU MLP; optax Adam on tables and MLP). Each part is jitted
alone on the same inputs and timed as the mean of --repeats calls after one warm call:

- encode: the encoding of --batch points (slax: the fused kernel, cells, rows and weights in
  registers; plain JAX: ``hash_encode_reference``'s gathers and sums);
- scatter: the gradient in the tables (slax: the fused kernel's atomic adds; plain JAX: XLA's
  scatter-add of the same shares);
- the rows/weights path slax keeps for second derivatives in the points: corners (Slang's
  ``level_corners_2d``), their blend, and their scatter over all levels and over the four
  coarsest or the four finest levels alone (the coarse dense levels' contention);
- the MLP's value and gradient (``slax.nn.mlp_apply``, plain JAX ``mlp_apply_reference``);
- Adam over the tables, and the whole step of each model.

The last rows are the step's memory-traffic floor at --bandwidth GB/s: one 32-byte sector per
corner read, the tables' Adam pass (parameters, gradient, two moments read; three written) and the
gradient's zeroing; the scatter's atomic adds are L2-cache requests, not counted.

    python experiments/profile_encoding.py --json benchmarks/encoding-profile-h200.json
"""

from __future__ import annotations

import argparse
import sys

import _harness as harness


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=harness.HelpFormatter, epilog=harness.exit_status_help(None)
    )
    parser.add_argument("--batch", type=harness.positive_int, default=1 << 18, help="points a step")
    parser.add_argument("--repeats", type=harness.positive_int, default=30, help="timed calls a part")
    parser.add_argument(
        "--bandwidth", type=harness.positive_float, default=4800.0, help="memory bandwidth in GB/s"
    )
    parser.add_argument(
        "--json", default=None, help="write the rows and provenance to this file (default: not written)"
    )
    harness.add_launch_argument(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "profile_encoding")

# After the flags: JAX and slax take seconds to import.
import _ngp as ngp
import jax
import jax.numpy as jnp
import ngp_image
import optax

from slax import nn
from slax.nn import _blend, _fused_encoding, _hash_encoding

LEVELS, LOG2_TABLE_SIZE, FINEST = 16, 19, 2048


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    harness.apply_launch(args)
    config = nn.HashEncodingConfig(
        dimensions=2, levels=LEVELS, log2_table_size=LOG2_TABLE_SIZE, finest_resolution=FINEST
    )
    init_key, point_key, value_key = jax.random.split(jax.random.key(0), 3)
    params = ngp.init_params(init_key, config, outputs=3)
    x = jax.random.uniform(point_key, (args.batch, 2))
    target = jax.random.uniform(value_key, (args.batch, 3))

    def find_corners(x):
        return _fused_encoding.level_corners(x, config)

    rows, weights = jax.jit(find_corners)(x)
    table = params["tables"]
    values = jax.random.normal(value_key, (args.batch, LEVELS, config.features_per_level))
    spread = _hash_encoding._spread(config)

    def slax_scatter(levels_taken):
        return lambda v: _blend.scatter_p.bind(
            rows[:, levels_taken], v[:, levels_taken], weights[:, levels_taken],
            table_rows=table.shape[0], spread=spread,
        )  # fmt: skip

    def xla_scatter(v):
        update = (weights[..., None] * v[..., None, :]).reshape(-1, config.features_per_level)
        return jnp.zeros_like(table).at[rows.reshape(-1)].add(update)

    encoded = jax.random.normal(value_key, (args.batch, config.output_features))
    optimizer = optax.adam(1e-2, eps=1e-15)

    def adam(tables, state, gradient):
        updates, state = optimizer.update(gradient, state, tables)
        return optax.apply_updates(tables, updates), state

    def step(name):
        gradient = ngp_image.loss_and_grad(name, config, jnp.float32)

        def run(params, state):
            loss, grads = gradient(params, x, target)
            updates, state = optimizer.update(grads, state, params)
            return optax.apply_updates(params, updates), state, loss

        return run

    def mlp_gradient(apply):
        return jax.grad(lambda p, e: jnp.sum(apply(p, e) ** 2), argnums=(0, 1))

    coarse, fine = slice(0, 4), slice(LEVELS - 4, LEVELS)
    tables_adam = (params["tables"], optimizer.init(params["tables"]), params["tables"])

    def fused_scatter(v):
        return _fused_encoding.scatter_p.bind(
            x, v, config=config, stacked=0, spread=spread, dtype="float32", table_rows=table.shape[0]
        )

    parts = [
        ("encode (fused)", lambda t: _fused_encoding.encode(x, t, config), (table,),
         lambda t: nn.hash_encode_reference(t, x, config)),
        ("scatter (fused), 16 levels", fused_scatter, (values,), xla_scatter),
        ("corners (Slang)", find_corners, (x,), None),
        ("blend", lambda t: _blend.blend(rows, t, weights), (table,),
         lambda t: jnp.einsum("blc,blcf->blf", weights, t[rows])),
        ("scatter, 16 levels", slax_scatter(slice(None)), (values,), xla_scatter),
        ("scatter, 4 coarsest levels", slax_scatter(coarse), (values,), None),
        ("scatter, 4 finest levels", slax_scatter(fine), (values,), None),
        ("MLP value", nn.mlp_apply, (params["mlp"], encoded), nn.mlp_apply_reference),
        ("MLP gradient (weights and input)", mlp_gradient(nn.mlp_apply), (params["mlp"], encoded),
         mlp_gradient(nn.mlp_apply_reference)),
        ("Adam over the tables", adam, tables_adam, adam),  # the same optax update in both
        ("whole step", step("slax"), (params, optimizer.init(params)), step("jax")),
    ]  # fmt: skip
    rows_out = []
    print(f"profile_encoding: batch {args.batch}, {harness.describe_platform()}", flush=True)
    print(f"{'part':36s} {'slax ms':>9s} {'plain JAX ms':>13s}")
    for name, slax_part, part_args, jax_part in parts:
        slax_ms = harness.mean_call_seconds(slax_part, *part_args, repeats=args.repeats) * 1e3
        jax_ms = None
        if jax_part is not None:
            jax_ms = harness.mean_call_seconds(jax_part, *part_args, repeats=args.repeats) * 1e3
        rows_out.append({"part": name, "slax_ms": slax_ms, "jax_ms": jax_ms})
        print(f"{name:36s} {slax_ms:9.3f} {'' if jax_ms is None else f'{jax_ms:13.3f}'}", flush=True)

    entries = config.table_rows * config.features_per_level
    floor_bytes = {
        "corner reads (a 32-byte sector each)": args.batch * LEVELS * 4 * 32,
        "Adam over the tables (4 reads, 3 writes)": entries * 4 * 7,
        "the gradient's zeroing": entries * 4,
    }
    floor_ms = sum(floor_bytes.values()) / (args.bandwidth * 1e9) * 1e3
    for what, size in floor_bytes.items():
        print(f"floor: {what:44s} {size / 1e6:8.1f} MB")
    print(f"floor: the step's memory traffic at {args.bandwidth:.0f} GB/s: {floor_ms:.3f} ms")
    if args.json:
        harness.write_json(
            args.json,
            {
                **harness.provenance(),
                "batch": args.batch,
                "encoding": {"levels": LEVELS, "log2_table_size": LOG2_TABLE_SIZE, "finest": FINEST},
                "rows": rows_out,
                "floor_bytes": floor_bytes,
                "floor_ms": floor_ms,
                "bandwidth_gb_s": args.bandwidth,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
