"""Run by tests/test_hash_encoding.py in a process with two host CPU devices (XLA_FLAGS set there):
the hash encoding behind an MLP under plain jax.jit over a batch of points split across the devices,
tables and network replicated: the loss, its gradient in the tables (scattered on each device, the
small dense levels through their copies) and in the network, and an eikonal loss's gradient, equal
one device's."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from slax import nn

assert len(jax.devices()) == 2, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("data",))
config = nn.HashEncodingConfig(
    dimensions=3, levels=4, log2_table_size=8, coarsest_resolution=2, finest_resolution=24
)
keys = jax.random.split(jax.random.key(0), 4)
params = {
    "tables": jax.random.normal(keys[0], config.table_shape),
    "mlp": nn.mlp_init(keys[1], (config.output_features, 16, 1), activation="tanh"),
}
x = jax.random.uniform(keys[2], (64, 3))
target = jax.random.normal(keys[3], (64, 1))


def field(params, x):
    return nn.mlp_apply(params["mlp"], nn.hash_encode(params["tables"], x, config))


def loss(params, x, target):
    return jnp.mean((field(params, x) - target) ** 2)


def eikonal(params, x):
    norm = jnp.linalg.norm(jax.grad(lambda x: jnp.sum(field(params, x)))(x), axis=-1)
    return jnp.mean((norm - 1.0) ** 2)


def check(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


batch = NamedSharding(mesh, P("data"))
replicated = jax.device_put(params, NamedSharding(mesh, P()))
placed_x, placed_target = jax.device_put(x, batch), jax.device_put(target, batch)
check(
    jax.jit(jax.value_and_grad(loss))(replicated, placed_x, placed_target),
    jax.value_and_grad(loss)(params, x, target),
)
print("batch-sharded loss and gradient: ok")
check(jax.jit(jax.grad(eikonal))(replicated, placed_x), jax.grad(eikonal)(params, x))
print("batch-sharded eikonal gradient: ok")
