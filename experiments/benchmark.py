"""Training-step throughput of slax vs the same network in plain jitted JAX.

Networks: the tutorial's polynomial MLP (4 -> 16 -> 4, squared-error loss; slax uses the fused
mlp_loss_and_grad kernel) and the digits MLP (64 -> 128 -> 64 -> 10, softmax cross-entropy in JAX
around slax.nn.mlp_apply). One step = sample a batch, forward, backward, Adam update. Each
configuration runs a jitted lax.scan of --steps steps: one warm-up call, then the median wall time
of --repeats timed calls with block_until_ready.

    python experiments/benchmark.py --batch 4096 65536 --dtype float32 float16 --json runs/bench.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

from slax import nn
from slax.experiment import describe_platform

NETWORKS = {"polynomial": (4, 16, 4), "digits": (64, 128, 64, 10)}


def loss_and_grad(network: str, model: str, dtype):
    """(params, x, labels-or-targets) -> (loss, grads), params float32, kernels in ``dtype``."""

    def cast(params):
        return jax.tree.map(lambda p: p.astype(dtype), params)

    if network == "polynomial":
        if model == "slax":
            return lambda p, x, t: nn.mlp_loss_and_grad(cast(p), x.astype(dtype), t.astype(dtype))
        return jax.value_and_grad(
            lambda p, x, t: nn.mlp_loss_reference(cast(p), x.astype(dtype), t.astype(dtype))
        )
    apply = nn.mlp_apply if model == "slax" else nn.mlp_apply_reference

    def cross_entropy(p, x, labels):
        logits = apply(cast(p), x.astype(dtype)).astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return jax.value_and_grad(cross_entropy)


def make_batch(network, key, batch):
    sizes = NETWORKS[network]
    x = jax.random.uniform(key, (batch, sizes[0]), minval=-1.0, maxval=1.0)
    if network == "polynomial":
        return x, jnp.stack([x[:, 0] + x[:, 1], 2 * x[:, 0], x[:, 2], x[:, 3] * 0.5], axis=-1)
    return x, jax.random.randint(key, (batch,), 0, sizes[-1])


def steps_per_second(network, model, dtype, batch, steps, repeats) -> float:
    params = nn.mlp_init(jax.random.key(0), NETWORKS[network])
    optimizer = optax.adam(1e-3)
    fn = loss_and_grad(network, model, jnp.dtype(dtype))

    def step(state, key):
        params, opt_state = state
        loss, grads = fn(params, *make_batch(network, key, batch))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    run = jax.jit(lambda state, keys: jax.lax.scan(step, state, keys))
    state = (params, optimizer.init(params))
    keys = jax.random.split(jax.random.key(1), steps)
    jax.block_until_ready(run(state, keys))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(state, keys))
        times.append(time.perf_counter() - start)
    return steps / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--network", nargs="+", choices=tuple(NETWORKS), default=list(NETWORKS))
    parser.add_argument("--batch", nargs="+", type=int, default=[256, 4096])
    parser.add_argument("--dtype", nargs="+", choices=("float32", "float16"), default=["float32"])
    parser.add_argument("--steps", type=int, default=50, help="steps per timed call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    print(describe_platform())
    header = (
        f"{'network':<11} {'dtype':<8} {'batch':>8} {'slax steps/s':>13} {'jax steps/s':>12} "
        f"{'slax samples/s':>15} {'jax samples/s':>14} {'slax/jax':>9}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for network in args.network:
        for dtype in args.dtype:
            for batch in args.batch:
                rates = {
                    m: steps_per_second(network, m, dtype, batch, args.steps, args.repeats)
                    for m in ("slax", "jax")
                }
                row = {
                    "network": network,
                    "dtype": dtype,
                    "batch": batch,
                    **{f"{m}_steps_per_s": r for m, r in rates.items()},
                    **{f"{m}_samples_per_s": r * batch for m, r in rates.items()},
                    "speedup": rates["slax"] / rates["jax"],
                }
                rows.append(row)
                print(
                    f"{network:<11} {dtype:<8} {batch:>8} {rates['slax']:>13.1f} {rates['jax']:>12.1f} "
                    f"{rates['slax'] * batch:>15.3g} {rates['jax'] * batch:>14.3g} {row['speedup']:>8.2f}x",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"platform": describe_platform(), "args": vars(args), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
