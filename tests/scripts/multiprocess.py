"""Run by tests/test_multiprocess.py: one process of a ``jax.distributed`` job on the CPU, or the
one-process reference. Usage:

    python multiprocess.py OUT.json PROCESS_ID NUM_PROCESSES COORDINATOR_PORT

Each process has two host CPU devices (``jax_num_cpu_devices``); the mesh spans every device of
every process, and the global batch is sharded over all of them, each process holding its own
rows. A jitted step computes the MLP's fused loss and gradient, a Slang function's values and its
gradient with respect to a replicated scalar and the sharded batch. With ``NUM_PROCESSES`` 1 there
is no ``jax.distributed``: one process holds the whole batch on one device. Process 0 writes what
it computed, gathered to the host, to ``OUT.json`` (each result by its pytree path).
"""

import json
import sys

import jax

out_path, process_id, num_processes, port = sys.argv[1], *map(int, sys.argv[2:5])
if num_processes > 1:
    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=[0, 1],
    )

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _launches import record_launches  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import slax  # noqa: E402
from slax import nn  # noqa: E402

launched = record_launches()  # (entry point, threads) of every kernel this process runs

BATCH = 256
rng = np.random.default_rng(7)
x_host = rng.uniform(-1, 1, size=(BATCH, 4)).astype(np.float32)
target_host = np.sin(3 * x_host).astype(np.float32)
t_host = rng.normal(size=(BATCH,)).astype(np.float32)
a_host = np.float32(rng.normal())
params = nn.mlp_init(jax.random.key(0), (4, 16, 4))
poly = slax.load_module("poly").polynomial

if num_processes > 1:
    assert jax.process_count() == num_processes and jax.local_device_count() == 2
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    rows = NamedSharding(mesh, P("data"))

    def global_batch(host):
        """The process's own rows of ``host``, as one array sharded over every process's devices."""
        per_process = host.shape[0] // num_processes
        local = host[process_id * per_process : (process_id + 1) * per_process]
        return jax.make_array_from_process_local_data(rows, local, host.shape)

    x, target, t = (global_batch(h) for h in (x_host, target_host, t_host))
    params = jax.device_put(params, NamedSharding(mesh, P()))
else:
    x, target, t = (jnp.asarray(h) for h in (x_host, target_host, t_host))


def poly_loss(a, t):
    return jnp.mean(poly(a, 8.0, -1.0, t) ** 2)


@jax.jit
def step(params, x, target, a, t):
    loss, grads = nn.mlp_loss_and_grad(params, x, target)
    values = poly(a, 8.0, -1.0, t)
    grad_a, grad_t = jax.grad(poly_loss, argnums=(0, 1))(a, t)
    return {"loss": loss, "grads": grads, "poly": values, "poly_grad_a": grad_a, "poly_grad_t": grad_t}


results = step(params, x, target, a_host, t)
jax.block_until_ready(results)
# Every kernel runs on one of this process's devices, over that device's rows only.
assert {count for _, count in launched} == {BATCH // jax.device_count()}, launched
for entry in ("slax_primal_polynomial", "slax_cotangent_polynomial", "mlp_loss_grad"):
    assert sum(e == entry for e, _ in launched) == jax.local_device_count(), (entry, launched)
if num_processes > 1:
    results = multihost_utils.process_allgather(results, tiled=True)
results = {
    jax.tree_util.keystr(k): np.asarray(v).tolist() for k, v in jax.tree_util.tree_leaves_with_path(results)
}
if process_id == 0:
    with open(out_path, "w") as f:
        json.dump({"devices": jax.device_count(), "processes": jax.process_count(), "results": results}, f)
print(f"process {process_id} of {num_processes}: ok")
