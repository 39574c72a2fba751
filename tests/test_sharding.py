"""slax over several devices: inside jax.shard_map, and under plain jax.jit over batch-sharded
arrays (host CPU devices, in a subprocess because XLA's device count is fixed when JAX starts)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from _helpers import run_python

JAX = pytest.mark.jax_version
"""Marks the tests CI runs on every JAX release: shard_map, plain jit over sharded batches (on two
devices), the flat all-reduce and the data-parallel step's lowering; the experiments' runs over
devices go through those same paths."""

TWO_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}


def _run(*command: str) -> subprocess.CompletedProcess:
    return run_python(*command, env={**os.environ, **TWO_DEVICES})


@JAX
def test_shard_map_runs_each_shard_on_its_device(cpu_path):
    result = _run("tests/scripts/sharded.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "grad of replicated arguments: ok" in result.stdout and "sharded: ok" in result.stdout


# two devices on one route, four on the other (Vulkan, the faster here): the partitioning is slax's
# and XLA's, and each route runs its kernels on the shards of one of them; --quick runs two (40 s)
@pytest.mark.parametrize(
    "devices",
    [
        pytest.param(2, marks=[JAX, pytest.mark.one_device_kind]),
        pytest.param(4, marks=[pytest.mark.one_device_kind("vulkan"), pytest.mark.slow]),
    ],
)
def test_plain_jit_over_sharded_batches_partitions_each_call(cpu_path, devices):
    """Explicit and automatic sharding, given shardings or not: values, jax.grad and jax.jvp equal
    one device's, each device launches its own shard's kernels, no all-gather of the batch, and what
    cannot be partitioned runs replicated (tests/scripts/jit_sharded.py)."""
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    result = run_python("tests/scripts/jit_sharded.py", env={**os.environ, **env})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"jit over sharded batches on {devices} devices: ok" in result.stdout


ON_ONE_ROUTE = pytest.mark.one_device_kind("vulkan")
"""For the experiments' runs over devices: their launches on each route are those that
test_plain_jit_over_sharded_batches_partitions_each_call checks on every route, so they run on one
(Vulkan where it is under test: the faster of the two for these runs, but for the polynomial's
training, which runs on the CPU device)."""


@pytest.mark.slow
@pytest.mark.one_device_kind  # the CPU device: the faster route for these three training runs
def test_polynomial_data_parallel_matches_one_device(cpu_path, tmp_path):
    """The same global batch and seed on no mesh, a one-device mesh and two devices (plain jit over
    the sharded batch): the same training, to the rounding of summing the gradient in two halves
    (float32), carried through 200 Adam steps."""
    metrics = {}
    for devices in (None, 1, 2):
        out = tmp_path / f"devices-{devices}"
        flags = ["--steps", "200", "--chunk", "100", "--batch", "256", "--target-mse", "1", "--out", str(out)]
        result = _run("experiments/polynomial.py", *flags, *(["--devices", str(devices)] if devices else []))
        assert result.returncode == 0, result.stdout + result.stderr
        metrics[devices] = json.loads((out / "metrics.json").read_text())
    assert metrics[2]["config"]["devices"] == 2 and metrics[2]["slax"]["samples_per_s"] > 0
    for model in ("slax", "jax"):
        for devices in (1, 2):
            one, split = metrics[None][model]["test_mse"], metrics[devices][model]["test_mse"]
            assert abs(split - one) <= 1e-4 * one, (model, devices, one, split)


_MEAN_OVER_DEVICES = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
from slax._sharding import mean_over_devices

mesh = jax.make_mesh((2,), ("d",))

def local(x):
    i = jax.lax.axis_index("d").astype(jnp.float32)
    values = [x * (i + 1), (x[:3] * (i - 2)).astype(jnp.float16), jnp.sum(x) * i, {"w": jnp.sin(x + i)}]
    return mean_over_devices(values, "d"), jax.tree.map(lambda v: jax.lax.pmean(v, "d"), values)

fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P(), out_specs=P()))
x = np.random.default_rng(0).normal(size=5).astype(np.float32)
flat, separate = fn(x)
equal = lambda a, b: a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
same = all(jax.tree.leaves(jax.tree.map(equal, flat, separate)))
flat_only = jax.shard_map(lambda x: local(x)[0], mesh=mesh, in_specs=P(), out_specs=P())
all_reduces = jax.jit(flat_only).lower(x).as_text().count("stablehlo.all_reduce")
print(same, all_reduces, mean_over_devices([x], ())[0] is x)
"""


@JAX
@pytest.mark.one_device_kind  # no Slang kernel: JAX's all-reduces alone
def test_mean_over_devices_is_one_all_reduce_per_dtype(cpu_path):
    """The losses and gradients of a data-parallel step are averaged over the devices as one flat
    all-reduce per dtype: the same values, bit for bit, as a pmean per leaf (each is the same
    two-term mean), and no all-reduce where the batch is not split."""
    result = _run("-c", _MEAN_OVER_DEVICES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["True", "2", "True"], result.stdout


_STEP_OVER_TWO_DEVICES = """
import re, jax, jax.numpy as jnp
from _training import batch_sharding, on_every_device
from slax import nn

sharding = batch_sharding(2)
params = nn.mlp_init(jax.random.key(0), (4, 16, 4))
x = jax.device_put(jax.random.uniform(jax.random.key(1), (65536, 4)), sharding)  # many thread groups
hlo = jax.jit(nn.mlp_loss_and_grad).lower(params, x, jnp.sin(x)).compile().as_text()
(operand,) = re.findall(r"= f32\\[149\\]\\S* all-reduce\\((%[\\w.-]+)\\)", hlo)
(producer,) = [line for line in hlo.splitlines() if line.strip().startswith(operand + " = ")]
placed = on_every_device({"p": params, "k": jax.random.split(jax.random.key(2), 3)}, sharding)
print("concatenate" in producer, {leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(placed)},
      {len(leaf.devices()) for leaf in jax.tree.leaves(placed)}, on_every_device(params, None) is params)
"""


@JAX
@pytest.mark.one_device_kind  # compiled, never run: XLA's partitioning (each route's launches per shard:
# test_plain_jit_over_sharded_batches_partitions_each_call)
def test_data_parallel_step_all_reduces_the_kernels_row_and_keeps_its_state_on_every_device(cpu_path):
    """Over two devices, ``mlp_loss_and_grad`` all-reduces the sum of the kernel's partial rows
    (gradients, then the loss) as it is, with no kernel repacking it each step (compiled only: the
    batch is one of many thread groups, as in training); the experiments' training loops
    place their state and keys on every device of the mesh once (``on_every_device``), not on one
    device to be copied to the others every call (BENCHMARKS.md, "Two GPUs after the rewrite")."""
    result = _run("-c", _STEP_OVER_TWO_DEVICES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["False", "{True}", "{2}", "True"], result.stdout


_SQUARED_ERROR_OVER_TWO_DEVICES = """
import jax, jax.numpy as jnp, numpy as np
from _training import batch_sharding
from slax import nn

params = nn.mlp_init(jax.random.key(0), (4, 16, 4))
x = jax.random.uniform(jax.random.key(1), (64, 4))
target = jnp.sin(3 * x)
grad = jax.jit(jax.value_and_grad(nn.mlp_squared_error, (0, 1)))
one = grad(params, x, target)
sharding = batch_sharding(2)
two = grad(params, jax.device_put(x, sharding), jax.device_put(target, sharding))
close = [np.allclose(a, b, rtol=1e-5, atol=1e-8) for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two))]
print(all(close), len(two[1][1].sharding.device_set))
"""


@JAX
@pytest.mark.one_device_kind  # a shard's kernels: test_plain_jit_over_sharded_batches_partitions_each_call
def test_the_squared_errors_gradient_over_two_devices_is_the_whole_batchs(cpu_path):
    """``jax.value_and_grad`` of ``mlp_squared_error`` over a batch split between two devices: the
    loss, the parameters' gradients (means over the devices) and x's gradient (each device's share
    of the whole batch's mean, left split) equal one device's."""
    result = _run("-c", _SQUARED_ERROR_OVER_TWO_DEVICES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["True", "2"], result.stdout


@pytest.mark.slow
@ON_ONE_ROUTE
def test_benchmark_times_each_device_count_in_one_run(cpu_path, tmp_path):
    """``benchmark.py --devices 1 2``: a row per model and device count, the floor split over the
    devices; a count beyond the devices there is refused by name."""
    flags = ["--network", "polynomial", "--batch", "64", "--steps", "2", "--repeats", "1"]
    flags += ["--peak-tflops", "1", "--peak-gbps", "10", "--json", str(tmp_path / "bench.json")]
    result = _run("experiments/benchmark.py", *flags, "--devices", "1", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [(r["devices"], "slax" if r["model"].startswith("slax/") else r["model"]) for r in rows] == [
        (devices, model) for devices in (1, 2) for model in ("slax", "jax", "jax/flat", "jax-f32")
    ]
    assert rows[4]["floor_us"] == pytest.approx(rows[0]["floor_us"] / 2)
    refused = _run("experiments/benchmark.py", *flags, "--devices", "3")
    assert refused.returncode == 2 and "--devices 3: JAX has 2 device(s) here" in refused.stderr


@ON_ONE_ROUTE
def test_profile_step_refuses_more_devices_than_there_are(cpu_path):
    """``profile_step.py --devices`` takes the first N devices: a count beyond those present is
    refused by name (bad flags), as benchmark.py and the training scripts refuse it, not run on fewer."""
    refused = _run("experiments/profile_step.py", "--devices", "3")
    assert refused.returncode == 2 and "--devices 3: JAX has 2 device(s) here" in refused.stderr


@pytest.mark.slow
@JAX
@pytest.mark.one_device_kind  # where a sharded value goes is slax's Python and XLA's partitioning; each
# route's kernels on shards: test_shard_map_runs_each_shard_on_its_device and
# test_plain_jit_over_sharded_batches_partitions_each_call
def test_sharded_values_reach_slang_by_every_path(cpu_path):
    """A batch-sharded array passed as an argument, closed over, computed from a closure, inside
    vmap and scan, under grad and jvp, as a tensor argument, under jit in both sharding modes on
    four devices: each equals its pure-JAX twin, or is refused saying what to change; a closed-over
    array's call computes (tests/scripts/sharded_paths.py)."""
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    result = run_python("tests/scripts/sharded_paths.py", env={**os.environ, **env})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sharded values by every path on 4 devices: ok" in result.stdout
    for mode in ("Explicit", "Auto"):
        for case in ("closure grad", "closure jvp", "tensor argument, closure"):
            assert f"{mode} {case}: ok" in result.stdout, result.stdout
