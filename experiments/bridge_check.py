"""Check the bridge where JAX runs (CPU or CUDA): results, zero-copy, and the cost of a call.

For each launch route (on CUDA both ``slangpy``, SlangPy dispatching from a buffer callback, and
``ptx``, XLA launching Slang's PTX itself; on CPU the route of the device kind chosen, ``host-copy``
for Vulkan or ``host-pointer`` for SlangPy's CPU device: ``SLAX_DEVICE`` picks it):

1. ``y = a * x + b`` through the hand-written kernel shaders/kernels/scale_shift.slang, compared with
   NumPy for float32, float16 and int32.
2. In place and zero-copy: a kernel writing into a donated buffer returns an array at the very
   address XLA handed to it; with JAX on CUDA no route may copy through the host.
3. Per-call cost inside a jitted ``lax.fori_loop`` of 1000 steps, at 256 and 2^20 elements
   (``--sizes``), next to the same update as a plain XLA op: median of several timed runs after a
   warm-up. Twice: writing a fresh result, for which XLA copies the result into the loop's state
   after every call (a custom call's output cannot share its operand's buffer), and in place
   (``scale_shift_float_in_place``, ``in_place={0: 0}``), as XLA's own elementwise op runs.

With several GPUs, each route also runs the kernel under ``jax.shard_map`` over all of them: every
shard must be exact and stay on its GPU, and the SlangPy route must have launched on each GPU (the
SlangPy device of the GPU that holds the buffer, found by ``cuda_device_ordinal``).

On CUDA, then: the PTX route against the SlangPy route (the reference) on the Slang functions'
derivatives, both MLPs' apply, its VJP and the fused loss and gradient, and the polynomial network's
parameters and losses over 100 Adam steps, in float32 and float16; the results must be bitwise
identical.

    python experiments/bridge_check.py [--steps 1000] [--repeats 5] [--sizes 256 1048576] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import _harness as harness


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=harness.HelpFormatter,
        epilog=harness.exit_status_help(
            "a result is wrong, a kernel did not write in place, or (on CUDA) the routes differ"
        ),
    )
    parser.add_argument("--steps", type=harness.positive_int, default=1000, help="loop steps per timed run")
    parser.add_argument(
        "--repeats", type=harness.positive_int, default=5, help="timed runs per case (median)"
    )
    parser.add_argument(
        "--sizes",
        type=harness.positive_int,
        nargs="+",
        default=[256, 1 << 20],
        help="elements per timed call (default %(default)s)",
    )
    parser.add_argument("--json", default=None, help="also write the tables here (default: not written)")
    args = parser.parse_args(argv)
    return args


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "bridge_check")

# After the flags: JAX and slax take seconds to import.
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _training import cast, training_step

import slax
import slax.examples
import slax.testing

KERNELS = {"float32": "scale_shift_float", "float16": "scale_shift_half", "int32": "scale_shift_int"}


def scale_shift(module, x, a, b):
    kernel = module.kernel(KERNELS[str(x.dtype)])
    return kernel(x, results=[jax.ShapeDtypeStruct(x.shape, x.dtype)], threads=x.size, a=a, b=b)[0]


def scale_shift_in_place(module, y, a, b):
    kernel = module.kernel("scale_shift_float_in_place")
    results = [jax.ShapeDtypeStruct(y.shape, y.dtype)]
    return kernel(y, results=results, threads=-(-y.size // 4), a=a, b=b, in_place={0: 0})[0]


def check_results(module) -> list[str]:
    rng = np.random.default_rng(0)
    failures = []
    cases = [(dtype, dtype, scale_shift) for dtype in KERNELS]
    cases.append(("float32 in place", "float32", scale_shift_in_place))
    for name, dtype, call in cases:
        x = rng.integers(-100, 100, 4099) if dtype == "int32" else rng.uniform(-3, 3, 4099)
        x = x.astype(dtype)
        a, b = (3, -2) if dtype == "int32" else (1.5, 0.25)
        got = np.asarray(jax.jit(lambda x, a=a, b=b, call=call: call(module, x, a, b))(x))
        rounded_twice, *fused = slax.testing.multiply_add_results(a, x, b)
        ok = bool(np.logical_or.reduce([got == r for r in (rounded_twice, *fused)]).all())
        contracted = int(np.sum(got != rounded_twice))
        verdict = f"exact ({contracted} elements rounded once: fused multiply-add)" if contracted else "exact"
        print(f"  {name:16s} 4099 elements vs NumPy: {verdict if ok else 'MISMATCH'}")
        if not ok:
            failures.append(name)
    return failures


def check_in_place(module, route: str) -> bool:
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
    print(f"  result at the donated buffer's address: {same}; exact: {exact}")
    taken = slax.launch_route()
    zero_copy = taken != "host-copy"
    print(f"  kernel reads and writes XLA's buffers directly (no copy): {zero_copy}")
    return same and exact and taken == route and (zero_copy or route == "host-copy")


def check_each_gpu(module, route: str) -> bool:
    """The kernel over a batch split across every GPU with ``jax.shard_map``: each GPU computes its
    own shard (exact, left on that GPU); on the SlangPy route, each GPU's launches went to the
    SlangPy device of that GPU."""
    from jax.sharding import PartitionSpec as P

    from slax._bridge import cuda_device_ordinal, launches_per_gpu

    gpus = jax.devices()
    mesh = jax.make_mesh((len(gpus),), ("gpu",), devices=gpus)
    shards = jax.jit(
        jax.shard_map(
            lambda x: scale_shift(module, x, 1.5, 0.25), mesh=mesh, in_specs=P("gpu"), out_specs=P("gpu")
        )
    )
    x = np.random.default_rng(2).uniform(-3, 3, 4096 * len(gpus)).astype(np.float32)
    x_split = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("gpu")))
    before = launches_per_gpu.copy()
    y = jax.block_until_ready(shards(x_split))
    launched = launches_per_gpu - before
    expected = slax.testing.multiply_add_results(1.5, x, 0.25)
    ok = bool(np.logical_or.reduce([np.asarray(y) == r for r in expected]).all())
    for shard in sorted(y.addressable_shards, key=lambda shard: shard.device.id):
        ordinal = shard.device.local_hardware_id
        held_by = cuda_device_ordinal(shard.data.unsafe_buffer_pointer())
        exact = np.array_equal(np.asarray(shard.data), np.asarray(y)[shard.index])
        line = f"  {shard.device}: rows {shard.index[0].start}-{shard.index[0].stop}, buffer on GPU {held_by}"
        if route == "slangpy":
            line += f", SlangPy launches on GPU {ordinal}: {launched[ordinal]}"
            ok &= launched[ordinal] >= 1
        print(line)
        ok &= held_by == ordinal and exact
    print(f"  every shard exact and computed on its own GPU: {ok}")
    return ok


def time_per_call(fn, x, steps, repeats) -> float:
    loop = jax.jit(lambda x: jax.lax.fori_loop(0, steps, lambda _, y: fn(y), x))
    loop(x).block_until_ready()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        loop(x).block_until_ready()
        runs.append((time.perf_counter() - start) / steps)
    return statistics.median(runs)


def routes() -> list[str]:
    """The launch routes where JAX runs: both CUDA routes on a GPU, on the CPU the one of the device
    kind chosen (``host-copy`` or ``host-pointer``)."""
    return ["slangpy", "ptx"] if harness.on_cuda() else [slax.launch_route()]


def _training_trajectory(dtype, steps: int = 100, batch: int = 4096) -> Callable[[jax.Array], Any]:
    """``key -> (final params, losses)``: the polynomial network trained with the fused kernel and
    Adam for ``steps`` steps on fresh batches, in one ``lax.scan`` (float32 parameters, kernels in
    ``dtype``, as in experiments/polynomial.py)."""
    optimizer = optax.adam(1e-2)
    params = slax.nn.mlp_init(jax.random.key(0), (4, 16, 4), jnp.float32)

    def draw_batch(key):
        x = jax.random.uniform(key, (batch, 4), minval=-1, maxval=1).astype(dtype)
        return x, jnp.sin(3 * x)

    def loss_and_grad(params, x, target):
        return slax.nn.mlp_loss_and_grad(cast(params, dtype), x, target)

    step = training_step(loss_and_grad, optimizer, draw_batch)

    def train(key):
        (final, _), losses = jax.lax.scan(
            step, (params, optimizer.init(params)), jax.random.split(key, steps)
        )
        return final, losses

    return train


def compare_routes(rng: np.random.Generator) -> list[dict]:
    """The PTX route against the SlangPy route on derivatives, both MLPs (apply and its VJP, the
    fused loss and gradient) and 100 steps of training: max |difference|."""
    poly = slax.load_module("poly").polynomial
    examples = slax.load_module(slax.examples.MODULE)
    x = jnp.asarray(rng.normal(size=(1 << 16,)), jnp.float32)
    cases: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
        "polynomial grad": (jax.grad(lambda v: poly(2.0, 8.0, -1.0, v).sum()), (x,))
    }
    for example in slax.examples.EXAMPLES:
        function = getattr(examples, example.name)
        args = example.draw(rng, jnp.float32)
        cases[f"{example.name} vjp"] = (lambda *a, f=function: jax.vjp(f, *a)[1](f(*a)), args)
        cases[f"{example.name} jvp"] = (lambda *a, f=function: jax.jvp(f, a, a), args)
    for dtype in (jnp.float32, jnp.float16):
        name = jnp.dtype(dtype).name
        for sizes in ((4, 16, 16, 4), (64, 128, 64, 10)):
            params = slax.nn.mlp_init(jax.random.key(0), sizes, dtype)
            data = jnp.asarray(rng.uniform(-1, 1, size=(1 << 14, sizes[0])), dtype)
            target = jnp.asarray(rng.uniform(-1, 1, size=(1 << 14, sizes[-1])), dtype)
            label = "-".join(map(str, sizes))
            cases[f"mlp {label} apply+vjp {name}"] = (
                lambda p, x: jax.vjp(slax.nn.mlp_apply, p, x)[1](slax.nn.mlp_apply(p, x)),
                (params, data),
            )
            cases[f"mlp {label} loss+grad {name}"] = (slax.nn.mlp_loss_and_grad, (params, data, target))
        cases[f"mlp 100 Adam steps {name}"] = (_training_trajectory(dtype), (jax.random.key(2),))
    rows: list[dict[str, Any]] = []
    for name, (function, args) in cases.items():
        outputs = {}
        for route in ("slangpy", "ptx"):
            with slax.config.override(cuda_launch=route):
                leaves = jax.tree.leaves(jax.jit(function)(*args))
            outputs[route] = [np.asarray(leaf, np.float64) for leaf in leaves]
        diff = max(float(np.max(np.abs(a - b), initial=0.0)) for a, b in zip(*outputs.values()))
        rows.append({"case": name, "max_abs_diff": diff, "identical": diff == 0.0})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    module = slax.load_module("kernels/scale_shift.slang")
    print(f"{harness.describe_platform()}; launch routes checked: {', '.join(routes())}")
    failures: list[str] = []
    in_place = {}
    rows: list[dict[str, Any]] = []
    for route in routes():
        launch = {"cuda_launch": route} if harness.on_cuda() else {}
        with slax.config.override(**launch):
            print(f"\n[{route}] results:")
            failures += [f"{route} {dtype}" for dtype in check_results(module)]
            print(f"[{route}] in place / zero-copy:")
            in_place[route] = check_in_place(module, route)
            if harness.on_cuda() and jax.device_count() > 1:
                print(f"[{route}] on each of {jax.device_count()} GPUs:")
                failures += [] if check_each_gpu(module, route) else [f"{route} on each GPU"]
            for size in args.sizes:
                x = jnp.linspace(-1.0, 1.0, size, dtype=jnp.float32)
                fresh, in_place_call = (
                    time_per_call(lambda y, f=f: f(module, y, 0.5, 0.25), x, args.steps, args.repeats)
                    for f in (scale_shift, scale_shift_in_place)
                )
                rows.append(
                    {
                        "route": route,
                        "elements": size,
                        "slax_us": fresh * 1e6,
                        "slax_in_place_us": in_place_call * 1e6,
                    }
                )
    xla_us = {
        size: time_per_call(
            lambda y: 0.5 * y + 0.25,
            jnp.linspace(-1.0, 1.0, size, dtype=jnp.float32),
            args.steps,
            args.repeats,
        )
        * 1e6
        for size in args.sizes
    }
    for row in rows:
        row["xla_us"] = xla_us[row["elements"]]
    print(f"\nper call inside jit(fori_loop({args.steps})), median of {args.repeats}:")
    print(
        f"{'route':>12}  {'elements':>10}  {'slax, fresh result':>18}  {'slax, in place':>14}  "
        f"{'XLA op':>8}  {'in place / XLA':>14}   (us per call)"
    )
    for row in rows:
        print(
            f"{row['route']:>12}  {row['elements']:>10}  {row['slax_us']:>18.1f}  "
            f"{row['slax_in_place_us']:>14.1f}  {row['xla_us']:>8.2f}  "
            f"{row['slax_in_place_us'] / row['xla_us']:>13.2f}x"
        )
    parity = []
    if "ptx" in routes():
        parity = compare_routes(np.random.default_rng(1))
        print("\nPTX route vs SlangPy route (reference), bitwise:")
        print(f"{'case':>36}  {'max |diff|':>11}  identical")
        for row in parity:
            print(f"{row['case']:>36}  {row['max_abs_diff']:>11.3g}  {row['identical']}")
        failures += [row["case"] for row in parity if not row["identical"]]
    if args.json:
        summary = {**harness.provenance(), "in_place": in_place}
        harness.write_json(args.json, {**summary, "rows": rows, "parity": parity})
    if failures or not all(in_place.values()):
        print(f"\nFAILED: {failures or 'in place'}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
