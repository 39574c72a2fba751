"""Run by tests/test_sharding.py in a process with two host CPU devices (XLA_FLAGS set there), with
experiments/ on the import path (tests/_helpers.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _training import training_step
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import slax
from slax import data_parallel, nn
from slax._config import current_routes
from slax._launch import launcher_for

assert len(jax.devices()) == 2, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("data",))
launches = []
# Count the launches of the launcher CPU-placed JAX takes (host copies or host pointers).
launcher_type = type(launcher_for("cpu", current_routes()))
original = launcher_type.callback


def recording_callback(self, spec, scalars, count, aliases):
    run = original(self, spec, scalars, count, aliases)

    def recorded(ctx, outs, *ins):
        launches.append((spec.entry, count, [np.asarray(b).copy() for b in ins]))
        return run(ctx, outs, *ins)

    return recorded


launcher_type.callback = recording_callback
poly = slax.load_module("poly").polynomial
rng = np.random.default_rng(0)
x = jnp.asarray(rng.normal(size=(8,)), jnp.float32)

# Forward: each device runs the kernel on its own half.
sharded = jax.jit(
    jax.shard_map(lambda x: poly(2.0, 8.0, -1.0, x), mesh=mesh, in_specs=P("data"), out_specs=P("data"))
)
np.testing.assert_allclose(sharded(x), poly(2.0, 8.0, -1.0, x), rtol=1e-6)
forward = [launch for launch in launches if launch[0].startswith("slax_primal")][:2]
assert [count for _, count, _ in forward] == [4, 4], forward
seen = sorted(tuple(ins[-1].tolist()) for _, _, ins in forward)
assert seen == sorted([tuple(np.asarray(x[:4]).tolist()), tuple(np.asarray(x[4:]).tolist())]), seen

# Gradients through bwd_diff, sharded.
grad = jax.jit(jax.grad(lambda x: sharded(x).sum()))(x)
np.testing.assert_allclose(grad, 4 * np.asarray(x) + 8, rtol=1e-6)

# The MLP: forward, and the fused loss-and-gradient averaged over devices.
params = nn.mlp_init(jax.random.key(0), (4, 16, 4))
xb = jax.random.uniform(jax.random.key(1), (64, 4), minval=-1, maxval=1)
target = jnp.sin(xb)
apply = jax.jit(jax.shard_map(nn.mlp_apply, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data")))
np.testing.assert_allclose(apply(params, xb), nn.mlp_apply(params, xb), rtol=1e-6, atol=1e-6)


# jax.grad inside shard_map with respect to replicated arguments: as for any JAX function, the
# gradient of the local losses summed over devices (slax casts replicated operands to varying, whose
# transpose is that sum). float32 sums in another order: ~1e-6 relative.
def grad_of_local_sums(loss, args, in_specs):
    def local(*args):
        value, grads = jax.value_and_grad(loss)(*args)
        return jax.lax.psum(value, "data"), grads

    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=(P(), P())))(*args)


def assert_trees_close(got, want, rtol):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(jnp.max(jnp.abs(w))))


a = jnp.float32(rng.normal())
poly_loss = lambda a, x: jnp.sum(poly(a, 8.0, -1.0, x))  # noqa: E731
assert_trees_close(
    grad_of_local_sums(poly_loss, (a, x), (P(), P("data"))), jax.value_and_grad(poly_loss)(a, x), 1e-5
)
apply_loss = lambda p, x: jnp.sum((nn.mlp_apply(p, x) - jnp.sin(x)) ** 2)  # noqa: E731
assert_trees_close(
    grad_of_local_sums(apply_loss, (params, xb), (P(), P("data"))),
    jax.value_and_grad(apply_loss)(params, xb),
    1e-5,
)

# data_parallel averages the same way whether gradients come from jax.grad (of slax or of plain JAX)
# or from the fused kernel: each equals the single-device gradient of the whole batch.
whole = jax.value_and_grad(nn.mlp_loss_reference)(params, xb, target)
mean_loss = lambda p, x, t: jnp.mean(jnp.sum((nn.mlp_apply(p, x) - t) ** 2, axis=-1))  # noqa: E731
for loss_and_grad in (
    jax.value_and_grad(nn.mlp_loss_reference),
    jax.value_and_grad(mean_loss),
    nn.mlp_loss_and_grad,
):
    assert_trees_close(jax.jit(data_parallel(loss_and_grad, 2))(params, xb, target), whole, 1e-5)
with slax.config.override(mlp_backend="xla"):  # the xla backend's twins over the mesh alike
    for loss_and_grad in (jax.value_and_grad(mean_loss), nn.mlp_loss_and_grad):
        traced_afresh = jax.jit(data_parallel(lambda *args, f=loss_and_grad: f(*args), 2))
        assert_trees_close(traced_afresh(params, xb, target), whole, 1e-5)
print("grad of replicated arguments: ok")
loss, grads = jax.jit(data_parallel(nn.mlp_loss_and_grad, 2))(params, xb, target)
loss_1, grads_1 = nn.mlp_loss_and_grad(params, xb, target)
np.testing.assert_allclose(loss, loss_1, rtol=1e-6)
for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_1)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
# A one-device mesh runs the same kernel on the whole batch: the same bits as no mesh.
loss_m, grads_m = jax.jit(data_parallel(nn.mlp_loss_and_grad, 1))(params, xb, target)
assert all(
    np.array_equal(a, b)
    for a, b in zip(jax.tree.leaves((loss_m, grads_m)), jax.tree.leaves((loss_1, grads_1)))
)

# A short training run: two devices follow the single-device run.
optimizer = optax.adam(1e-2)


def train(loss_and_grad):
    def draw_batch(key):
        x = jax.random.uniform(key, (64, 4), minval=-1, maxval=1)
        return x, jnp.sin(x)

    step = training_step(loss_and_grad, optimizer, draw_batch)
    keys = jax.random.split(jax.random.key(2), 100)
    return jax.jit(lambda s: jax.lax.scan(step, s, keys))((params, optimizer.init(params)))[1]


one, two = train(nn.mlp_loss_and_grad), train(data_parallel(nn.mlp_loss_and_grad, 2))
assert float(one[-1]) < float(one[0]) / 5
np.testing.assert_allclose(two, one, rtol=1e-4)
print("sharded: ok")
