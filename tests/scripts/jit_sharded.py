"""Run by tests/test_sharding.py in a process with several host CPU devices (XLA_FLAGS there):
slax calls under plain jax.jit over batch-sharded arrays, in both sharding modes, against the same
calls on one device. Prints one "ok" line per check; any failure raises."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
from _launches import record_launches
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import slax
from slax import nn
from slax.testing import RELATIVE_TOLERANCE, compare

DEVICES = len(jax.devices())
TOLERANCE = RELATIVE_TOLERANCE["float32"]
launches = record_launches()  # (entry point, threads) of every kernel launched


def close(got, want, what):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        error = compare("", "", g, w, TOLERANCE).max_rel_error
        assert error <= TOLERANCE, (what, error)


def no_batch_gather(jitted, *args, what):
    hlo = jitted.lower(*args).compile().as_text()
    assert "all-gather" not in hlo, (what, [line for line in hlo.splitlines() if "all-gather" in line][:3])


def each_device_runs_its_shard(entry_prefix, batch, what):
    counts = [count for entry, count in launches if entry.startswith(entry_prefix)]
    assert counts and set(counts) == {batch // DEVICES}, (what, counts)


poly = slax.load_module("poly").polynomial
examples = slax.load_module("examples")
rng = np.random.default_rng(0)
BATCH = 16 * DEVICES
x_host = rng.normal(size=(BATCH,)).astype(np.float32)
a_host = np.float32(rng.normal())
params = nn.mlp_init(jax.random.key(0), (4, 16, 4))
xb_host = rng.uniform(-1, 1, size=(64 * DEVICES, 4)).astype(np.float32)
target_host = np.sin(xb_host)


def poly_loss(a, x):
    return jnp.mean(poly(a, 8.0, -1.0, x) ** 2)


def apply_loss(p, x, t):
    return jnp.mean(jnp.sum((nn.mlp_apply(p, x) - t) ** 2, axis=-1))


# One device: the reference.
x1, xb1, t1 = jnp.asarray(x_host), jnp.asarray(xb_host), jnp.asarray(target_host)
want = {
    "poly": poly(a_host, 8.0, -1.0, x1),
    "poly grad": jax.grad(poly_loss, argnums=(0, 1))(a_host, x1),
    "poly jvp": jax.jvp(lambda x: poly(a_host, 8.0, -1.0, x), (x1,), (2 * x1,)),
    "apply": nn.mlp_apply(params, xb1),
    "apply grad": jax.grad(apply_loss)(params, xb1, t1),
    "loss and grad": nn.mlp_loss_and_grad(params, xb1, t1),
}

for mode in (AxisType.Explicit, AxisType.Auto):
    mesh = jax.make_mesh((DEVICES,), ("data",), axis_types=(mode,))
    batch = NamedSharding(mesh, P("data"))
    x, xb, t = (jax.device_put(v, batch) for v in (x_host, xb_host, target_host))
    cases = {
        "poly": (lambda x: poly(a_host, 8.0, -1.0, x), (x,)),
        "poly grad": (jax.grad(poly_loss, argnums=(0, 1)), (a_host, x)),
        "poly jvp": (lambda x: jax.jvp(lambda x: poly(a_host, 8.0, -1.0, x), (x,), (2 * x,)), (x,)),
        "apply": (nn.mlp_apply, (params, xb)),
        "apply grad": (jax.grad(apply_loss), (params, xb, t)),
        "loss and grad": (nn.mlp_loss_and_grad, (params, xb, t)),
    }
    for name, (function, args) in cases.items():
        launches.clear()
        jitted = jax.jit(function)
        close(jitted(*args), want[name], f"{mode.name} {name}")
        no_batch_gather(jitted, *args, what=f"{mode.name} {name}")
        samples = BATCH if name.startswith("poly") else xb_host.shape[0]
        entry = "slax_" if name.startswith("poly") else "mlp_"
        each_device_runs_its_shard(entry, samples, f"{mode.name} {name}")
        print(f"{mode.name} {name}: ok")

    # in_shardings and out_shardings given: host arrays placed by in_shardings carry no mesh in
    # their types, so the mesh comes from jax.set_mesh; without it the kernel is refused by name.
    given = jax.jit(nn.mlp_loss_and_grad, in_shardings=(NamedSharding(mesh, P()), batch, batch))
    with jax.set_mesh(mesh):
        launches.clear()
        close(given(params, xb_host, target_host), want["loss and grad"], f"{mode.name} in_shardings")
        each_device_runs_its_shard("mlp_", xb_host.shape[0], f"{mode.name} in_shardings")
        no_batch_gather(given, params, xb_host, target_host, what=f"{mode.name} in_shardings")
    try:
        jax.jit(nn.mlp_loss_and_grad, in_shardings=(NamedSharding(mesh, P()), batch, batch)).lower(
            params, xb_host, target_host
        )
    except ValueError as error:
        assert "jax.set_mesh" in str(error), error
    else:
        raise AssertionError("in_shardings without a mesh in types or context was not refused")
    given_out = jax.jit(lambda x: poly(a_host, 8.0, -1.0, x), out_shardings=batch)
    result = given_out(x)
    close(result, want["poly"], f"{mode.name} out_shardings")
    assert result.sharding.spec[0] == "data", result.sharding
    print(f"{mode.name} in_shardings/out_shardings: ok")

    # What cannot be partitioned runs replicated, correctly: weights sharded along a non-batch
    # axis, a vector argument sharded along its own axis, a hand-written kernel.
    rows = NamedSharding(mesh, P("data"))
    sharded_params = [
        {"weight": jax.device_put(layer["weight"], rows), "bias": layer["bias"]} for layer in params
    ]
    close(jax.jit(nn.mlp_apply)(sharded_params, xb), want["apply"], f"{mode.name} sharded weights")
    gathered = jax.jit(nn.mlp_apply).lower(sharded_params, xb).compile().as_text()
    assert "all-gather" in gathered, "the weights are gathered (and the check above can see a gather)"
    matrices = rng.normal(size=(BATCH, 3, 4)).astype(np.float32)
    vectors = jax.device_put(
        rng.normal(size=(BATCH, 4)).astype(np.float32), NamedSharding(mesh, P(None, "data"))
    )
    close(
        jax.jit(examples.matvec)(jax.device_put(matrices, batch), vectors),
        np.einsum("bij,bj->bi", matrices, np.asarray(vectors)),
        f"{mode.name} vector argument sharded along its own axis",
    )
    kernel = slax.load_module("kernels/scale_shift.slang").kernel("scale_shift_float")
    hand = jax.jit(
        lambda x, kernel=kernel: kernel(
            x, results=[jax.ShapeDtypeStruct(x.shape, x.dtype)], threads=x.size, a=2.0, b=1.0
        )[0]
    )
    close(hand(x), 2 * x_host + 1, f"{mode.name} hand-written kernel")
    print(f"{mode.name} fallbacks: ok")

print(f"jit over sharded batches on {DEVICES} devices: ok", file=sys.stdout)
