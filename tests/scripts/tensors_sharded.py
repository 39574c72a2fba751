"""Run by tests/test_tensors.py in a process with two host CPU devices (XLA_FLAGS set there): a Slang
function reading a whole tensor (replicated) at per-sample coordinates (split over the devices),
inside jax.shard_map and under plain jax.jit over a batch-sharded array, equals one device's call,
and the tensor's gradient is summed over the devices exactly once."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import slax
from slax import examples

assert len(jax.devices()) == 2, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("data",))
mod = slax.load_module("slangpy_examples")
bilinear = slax.load_module(examples.TENSOR_MODULE).bilinear
keys = jax.random.split(jax.random.key(0), 3)
texture = jax.random.uniform(keys[0], (6, 5, 3))
uv = jax.random.uniform(keys[1], (64, 2))
weights = jax.random.normal(keys[2], (64, 3))


def loss(texture, uv, weights):
    return (bilinear(texture, uv) * weights).sum()


want_value = bilinear(texture, uv)
want_grads = jax.grad(loss, (0, 1))(texture, uv, weights)


def check(got_value, got_grads):
    np.testing.assert_allclose(got_value, want_value, rtol=2e-5, atol=2e-5)
    for got, want in zip(got_grads, want_grads):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


sharded = jax.shard_map(bilinear, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data"))
sharded_grads = jax.jit(jax.grad(lambda t, uv, w: (sharded(t, uv) * w).sum(), (0, 1)))(texture, uv, weights)
check(jax.jit(sharded)(texture, uv), sharded_grads)
print("shard_map: ok")

batch = NamedSharding(mesh, P("data"))
placed_uv, placed_weights = jax.device_put(uv, batch), jax.device_put(weights, batch)
replicated = jax.device_put(texture, NamedSharding(mesh, P()))
value = jax.jit(bilinear)(replicated, placed_uv)
grads = jax.jit(jax.grad(loss, (0, 1)))(replicated, placed_uv, placed_weights)
check(value, grads)
assert value.sharding.spec == P("data"), value.sharding
print("batch-sharded jit: ok")

# A written tensor: the call runs whole on each device (its grid points may write anywhere).
x = jax.device_put(jnp.arange(8.0), batch)
written = jax.jit(lambda x: mod.polynomial(slax.grid((8,)), 2.0, 8.0, -1.0, x, (8,)))(x)
np.testing.assert_allclose(written, 2 * np.arange(8.0) ** 2 + 8 * np.arange(8.0) - 1, rtol=2e-5)
print("written tensor: ok")
