"""Training-step throughput of slax vs the same network in plain jitted JAX.

Networks: the tutorial's polynomial MLP (4 -> 16 -> 4, squared-error loss; slax uses the fused
mlp_loss_and_grad kernel) and the digits MLP (64 -> 128 -> 64 -> 10, softmax cross-entropy in JAX
around slax.nn.mlp_apply), and with ``--network sdf`` the signed distance field's (3 -> 64 -> 64 ->
64 -> 1, squared distance error plus 0.1 times the eikonal loss of experiments/sdf.py: a gradient
through the network's input gradient, second derivatives of slax.nn.mlp_apply), against plain JAX
at its default matmul precision (``jax``: TF32 on GPUs with tensor cores) and at full float32
(``jax-f32``, the arithmetic of slax's kernels). slax trains its parameters kept as one flat vector,
its kernels' layout (``_training.parameter_state``); plain JAX keeps its per-layer arrays, and
``jax/flat`` times it kept flat too: the ratio column compares with the faster of ``jax`` and
``jax/flat``. One step = sample a batch, forward, backward,
Adam update. Each configuration runs a jitted lax.scan of --steps steps (--unroll of them per
iteration of its loop): one warm-up call, then the median wall time of --repeats timed calls with
block_until_ready; ``--rounds N`` times them all N times over, in turn, compiled once (small
differences, such as float16 against float32, show whether they hold across rounds). On CUDA,
``--launch slangpy ptx`` times slax once per launch route (slax.config.cuda_launch), and
``--tensor-cores on off`` once with wide networks on tensor cores and once on the tiled kernels
(slax.config.tensor_cores; rows ``slax/<route>/simt``). Where JAX runs on the CPU, ``--device
cpu vulkan`` times slax on SlangPy's CPU device (row ``slax/host-pointer``) and on Vulkan
(``slax/host-copy``: lavapipe without a GPU) in one run.
``--harness`` adds a row timing the step with no model at all (``harness``: the batch sampled and
kept, Adam on zero gradients of the flat parameters, the loop; no ratio to plain JAX): a lower bound
on the step of any model that reads a batch sampled and stored in full, as slax's kernels do.
``--devices 1 2`` times every configuration over a mesh of 1 and of 2 devices (the batch split along
its first axis under plain ``jax.jit``, as ``polynomial.py --devices``); each row's ratio compares
with the faster plain JAX on as many devices.

``--precision default highest`` times every configuration under each of JAX's matmul precisions
(``jax.default_matmul_precision``), slax's rows and plain JAX's alike: float32 products as one
TF32 pass on GPUs with tensor cores at ``default``, at float32's accuracy at ``highest``
(``jax-f32``, plain JAX at HIGHEST whatever the setting, is left out there: it is ``jax``); by
default the setting as it is (JAX's default unless ``JAX_DEFAULT_MATMUL_PRECISION`` says otherwise).

The floor of a step is the larger of its matmul FLOPs at the device's dense tensor-core rate for
the row's products (float16: FP16 ``mma``; float32 at JAX's default: TF32; at ``highest``: a third
of TF32's, the 3xTF32 split, which beats the FP32 SIMT rate) and the bytes it must move at the
device's memory bandwidth: the sampled batch written once and read once. Peaks are known for
H100s and H200s (``PEAKS``, the vendor's datasheet) or given with --peak-tflops (one matrix rate
for every row) and --peak-gbps; the table shows each step time as a multiple of its floor (over N
devices, a Nth of one device's).

``--network wide`` times tiny-cuda-nn's class of networks, trained as its benchmarks train them:
one architecture per ``--width`` and ``--hidden-layers`` (``--wide-input`` inputs, as many hidden
layers of that width, ``--wide-output`` outputs; rows name it ``wide-<in>-<width>x<layers>-<out>``
and record its ``sizes``), fitted by squared error to random targets of the output width on random
inputs, slax through the fused ``mlp_loss_and_grad`` and plain JAX through ``jax.value_and_grad``
of ``mlp_loss_reference``, as the polynomial network is. scripts/benchmark_table.py renders its
rows as a table per width and dtype:

    python experiments/benchmark.py --network wide --width 16 32 64 128 --hidden-layers 2 4 \
        --batch 16384 262144 1048576 --dtype float16 float32 --json runs/bench-wide.json

``--network texture`` (not run unless named) times experiments/texture.py's step instead: a
512x512 RGBA texture fitted through a bilinear sampler at ``--batch`` random points a step, the
target sampled from a fixed random image by the same sampler; slax's sampler reads the texture as a
SlangPy ``IDiffTensor`` and adds its gradient with atomic adds, plain JAX's (row ``jax``, the only
plain-JAX row: it has no matmuls and no layers) gathers and scatter-adds. Its floor counts no
FLOPs: the batch (uv and targets) written and read, and Adam's pass over the texture.

``--network ngp_image ngp_sdf`` times instant-NGP's hash-encoded steps, ngp_image.py's and
ngp_sdf.py's, with their model, loss and Adam (the same functions; slax's tables and MLP each kept
as one vector, as the scripts train them): ``--levels`` levels of 2^``--log2-table-size``
entries, resolutions 16 to 2048 (default: the issue's 16 levels of 2^19), then a 64-64 MLP to 3
colours or 1 distance; the image a procedural 2048x2048 one, the SDF the torus under the eikonal
loss. Rows name them ``ngp_sdf-16x2^19``; their plain-JAX rows are ``jax`` and ``jax/flat`` (the
scripts' plain JAX, its tables and MLP as arrays and kept flat). Their floor's bytes add Adam's
pass over every parameter (the tables' dense gradient, the parameters and both moments read, the
parameters and moments written), which bounds them:

    python experiments/benchmark.py --network ngp_image ngp_sdf --batch 262144 --dtype float16 \
        --launch ptx --json runs/bench-ngp.json

    python experiments/benchmark.py --batch 4096 65536 --dtype float32 float16 --json runs/bench.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import sys
import time

import _harness as harness


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=harness.HelpFormatter,
        epilog=harness.exit_status_help(None),
    )
    parser.add_argument(
        "--network",
        nargs="+",
        choices=harness.WORKLOADS,
        default=["polynomial", "digits"],
        help="networks to time (sdf: the eikonal step; wide: the architectures --width and "
        "--hidden-layers name; texture: the texture fit, float32 only; ngp_image, ngp_sdf: the "
        "hash-encoded steps of --levels and --log2-table-size; default: the polynomial and digits MLPs)",
    )
    harness.add_wide_arguments(parser)
    harness.add_ngp_workload_arguments(parser)
    parser.add_argument(
        "--batch", nargs="+", type=harness.positive_int, default=[256, 4096], help="batch sizes to time"
    )
    parser.add_argument(
        "--dtype", nargs="+", choices=("float32", "float16"), default=["float32"], help="kernel precisions"
    )
    parser.add_argument("--steps", type=harness.positive_int, default=50, help="steps per timed call")
    parser.add_argument(
        "--repeats", type=harness.positive_int, default=5, help="timed calls per configuration (median)"
    )
    parser.add_argument(
        "--unroll",
        type=harness.positive_int,
        default=1,
        help="training steps per iteration of the scan's loop, for every model (lax.scan's unroll): "
        "on a GPU each iteration costs XLA a host round trip, a few us of a small batch's step",
    )
    parser.add_argument(
        "--launch",
        nargs="+",
        choices=harness.CUDA_LAUNCHES,
        default=None,
        help="CUDA launch routes to time slax with (ignored on CPU; default: slax.config.cuda_launch)",
    )
    parser.add_argument(
        "--tensor-cores",
        nargs="+",
        choices=("on", "off"),
        default=None,
        help="on CUDA, time slax with wide networks on tensor cores (on) and on the tiled kernels "
        "(off, rows slax/<route>/simt), slax.config.tensor_cores (ignored on CPU; default: its value)",
    )
    parser.add_argument(
        "--mlp-backend",
        nargs="+",
        choices=harness.MLP_BACKENDS,
        default=None,
        help="time slax's MLPs with each of these backends, one row each (slax/<route>/<backend>; "
        "auto: slax's choice, slax.nn.describe says which; default: slax.config.mlp_backend)",
    )
    parser.add_argument(
        "--device",
        nargs="+",
        choices=("cpu", "vulkan"),
        default=None,
        help="where JAX runs on the CPU, the SlangPy devices to time slax on, one row each "
        "(slax/host-pointer: SlangPy's CPU device; slax/host-copy: Vulkan), in turn in each round "
        "(ignored on CUDA; default: slax's choice, SLAX_DEVICE or automatic)",
    )
    parser.add_argument(
        "--precision",
        nargs="+",
        choices=("default", "highest"),
        default=[None],
        help="JAX's matmul precisions to time every configuration under, slax and plain JAX alike "
        "(jax.default_matmul_precision; default: the setting as it is)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=harness.positive_float,
        default=None,
        help="the device's matrix rate for every row, TFLOP/s (default: from PEAKS for known GPUs, by "
        "dtype and precision, else no floor column)",
    )
    parser.add_argument(
        "--peak-gbps",
        type=harness.positive_float,
        default=None,
        help="device memory bandwidth, GB/s (default: from PEAKS, as --peak-tflops)",
    )
    parser.add_argument(
        "--devices",
        nargs="+",
        type=harness.positive_int,
        default=[None],
        help="split each batch over a mesh of this many devices, one set of rows per count "
        "(default: no mesh)",
    )
    parser.add_argument(
        "--rounds",
        type=harness.positive_int,
        default=1,
        help="time every configuration this many times, all of them in each round in turn, "
        "compiled once (a column names the round): the spread of each row over the rounds shows "
        "the machine's noise, and rows of one round, timed close together, compare fairly",
    )
    parser.add_argument(
        "--harness",
        action="store_true",
        help="also time the step with no model (row harness: sampling, Adam on zero gradients, the "
        "loop), a lower bound on the step of a model that reads the whole sampled batch",
    )
    parser.add_argument("--json", default=None, help="also write the rows here (default: not written)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "benchmark")

# After the flags: JAX and slax take seconds to import.
import _ngp as ngp
import jax
import jax.numpy as jnp
import ngp_image
import ngp_sdf
import optax
import sdf
import texture
from _training import (
    PARTS,
    batch_sharding,
    cast,
    keeps_parameters_flat,
    on_every_device,
    parameter_state,
    training_step,
)

import slax
from slax import nn

TEXTURE_SHAPE = (512, 512, 4)
"""The ``texture`` workload's texture: the issue's size, RGBA as experiments/texture.py's."""
PEAKS = {
    "H100 80GB HBM3": ({"float16": 989.4e12, "tf32": 494.7e12}, 3.35e12),  # H100 SXM5, dense
    "H100 PCIe": ({"float16": 756.5e12, "tf32": 378e12}, 2.0e12),
    "H100 NVL": ({"float16": 835.5e12, "tf32": 417.5e12}, 3.9e12),
    "H200": ({"float16": 989.4e12, "tf32": 494.7e12}, 4.8e12),  # H200 SXM: the H100 SXM5's rates
}
"""Device kind (as JAX names it, without the vendor) -> (dense tensor-core FLOP/s by the products'
kind, memory bytes/s), from the vendor's datasheets."""


def step_floor(network: str, dtype: str, batch: int) -> tuple[float, float]:
    """(FLOPs, bytes) a training step cannot do without: forward 2*B*n_in*n_out per layer, backward
    twice that except no input gradient for the first layer (sdf: the forward pass, the input
    gradient, and the backward pass of each, twice their products); the batch (inputs and targets
    or int32 labels) written by the sampler and read by the model. The hash-encoded steps: their
    MLP's products as the others' (the first layer's input gradient too: the encoding's gradient
    needs it), the float32 batch, and Adam's pass over every parameter (the tables' gradient is
    dense), as the texture fit's. The texture fit: no FLOPs to
    speak of; its batch (uv and four-channel targets) written and read, and Adam's pass over the
    texture (its gradient, the texture and both moments read, the texture and both moments
    written)."""
    if network == "texture":
        texels = TEXTURE_SHAPE[0] * TEXTURE_SHAPE[1] * TEXTURE_SHAPE[2]
        channels = TEXTURE_SHAPE[2]
        return 0.0, float(2 * batch * (2 + channels) * jnp.dtype(dtype).itemsize + 7 * texels * 4)
    sizes = harness.network_sizes(network)
    pairs = list(zip(sizes[:-1], sizes[1:]))
    products = batch * sum(a * b for a, b in pairs)
    ngp_workload = harness.ngp_architecture(network)
    if ngp_workload is not None:  # the encoding's gradient needs the first layer's input gradient
        dimensions, outputs = harness.NGP_TASKS[ngp_workload["task"]]
        second_order = ngp_workload["task"] == "ngp_sdf"
        shapes = jax.eval_shape(lambda: _ngp_parameters(network))
        parameters = sum(leaf.size for leaf in jax.tree.leaves(shapes))
        batch_bytes = 2 * batch * (dimensions + outputs) * 4  # float32 points and targets
        return float((12 if second_order else 6) * products), float(batch_bytes + 7 * parameters * 4)
    flops = 12 * products if network == "sdf" else 6 * products - 2 * batch * pairs[0][0] * pairs[0][1]
    item = jnp.dtype(dtype).itemsize
    target = 4 if network == "digits" else sizes[-1] * item
    return float(flops), float(2 * batch * (sizes[0] * item + target))


def device_peaks(tflops: float | None, gbps: float | None) -> tuple[dict[str, float], float] | None:
    """(matrix FLOP/s by products, bytes/s) of the device: the flags (one rate for every row),
    else the table for known GPUs, else None."""
    if tflops and gbps:
        return {"float16": tflops * 1e12, "tf32": tflops * 1e12}, gbps * 1e9
    kind = jax.devices()[0].device_kind.removeprefix("NVIDIA ").strip()
    return PEAKS.get(kind)


def matrix_rate(rates: dict[str, float], dtype: str) -> float:
    """FLOP/s of the tensor cores for a ``dtype`` network's products at JAX's matmul precision now:
    float16's, TF32's, or a third of TF32's at HIGHEST (3xTF32; float32's own SIMT rate is lower)."""
    if dtype == "float16":
        return rates["float16"]
    highest = jax.config.jax_default_matmul_precision in ("highest", "float32")
    return rates["tf32"] / 3 if highest else rates["tf32"]


JAX_PRECISIONS = {"jax": None, "jax-f32": jax.lax.Precision.HIGHEST}
"""The plain-JAX models: JAX's default matmul precision (what a JAX program gets; TF32 on GPUs with
tensor cores) and full float32, the arithmetic slax's kernels do."""
JAX_ROWS = (("jax", "jax", False), ("jax/flat", "jax", True), ("jax-f32", "jax-f32", False))
"""The plain-JAX rows of an MLP after slax's, as (row, model, parameters kept flat): the default
precision with per-layer arrays and kept as one vector (each row's ratio is to the faster of these
two), then full float32 with per-layer arrays."""
SINGLE_JAX_ROWS = (("jax", "jax", False),)
"""The plain-JAX row of the texture fit (its one array has no layers to keep flat, and no matmuls)."""
NGP_JAX_ROWS = (("jax", "jax", False), ("jax/flat", "jax", PARTS))
"""The plain-JAX rows of the hash-encoded steps: the scripts' twin (whose products are the
default precision's; its full float32 is not the task's), its parameters as arrays and kept flat."""


def _ngp_config(network: str) -> tuple[nn.HashEncodingConfig, int]:
    """(encoding, outputs) of an :func:`_harness.ngp_name` workload."""
    workload = harness.ngp_architecture(network)
    dimensions, outputs = harness.NGP_TASKS[workload["task"]]
    levels, log2_table_size = workload["levels"], workload["log2_table_size"]
    config = ngp.encoding_config(levels, log2_table_size, dimensions, harness.NGP_FINEST_RESOLUTION)
    return config, outputs


def _ngp_parameters(network: str):
    """The initial parameters of a hash-encoded step, ``{"tables", "mlp"}`` (:func:`_ngp.init_params`)."""
    config, outputs = _ngp_config(network)
    return ngp.init_params(jax.random.key(0), config, outputs)


def _ngp_batch_drawer(network: str, batch: int):
    """``key -> (points, targets)`` of a hash-encoded step, as its script draws them for both
    models: sdf.py's points and distances, or ngp_image.py's image sampled bilinearly by plain JAX
    (its procedural image at the finest resolution)."""
    if harness.ngp_architecture(network)["task"] == "ngp_sdf":
        return functools.partial(sdf.sample, batch=batch)
    image = jnp.asarray(ngp_image.procedural_image(harness.NGP_FINEST_RESOLUTION))
    return texture.batch_drawer(texture.bilinear_reference, image, batch)


def trains_flat(network: str, model: str) -> bool | str:
    """Whether ``model``'s parameters of ``network`` are trained as one vector, as the experiments
    keep them (``_training.keeps_parameters_flat``; ``PARTS``, one a part, for the hash-encoded
    steps' tables and MLP), except the texture fit's one array."""
    if harness.ngp_architecture(network):
        return ngp.kept_flat(model)
    return keeps_parameters_flat(model) and network != "texture"


def loss_and_grad(network: str, model: str, dtype):
    """(params, x, labels-or-targets) -> (loss, grads), params float32, kernels in ``dtype``;
    ``model`` is "slax" or a key of ``JAX_PRECISIONS``."""

    if model == "harness":
        return functools.partial(harness_loss_and_grad, dtype=dtype)
    if network == "texture":
        return texture.loss_and_grad(texture.sampler(model))
    ngp_workload = harness.ngp_architecture(network)
    if ngp_workload is not None:
        config, _ = _ngp_config(network)
        if ngp_workload["task"] == "ngp_image":
            return ngp_image.loss_and_grad(model, config, dtype)
        return jax.value_and_grad(sdf.sdf_loss(ngp_sdf.field_with_gradient(model, config, dtype)))
    precision = JAX_PRECISIONS.get(model)
    if network == "polynomial" or harness.wide_architecture(network):  # squared error
        if model == "slax":
            return lambda p, x, t: nn.mlp_loss_and_grad(*cast((p, x, t), dtype))
        return jax.value_and_grad(
            lambda p, x, t: nn.mlp_loss_reference(*cast((p, x, t), dtype), precision=precision)
        )

    def apply(params, x):
        if model == "slax":
            return nn.mlp_apply(params, x)
        return nn.mlp_apply_reference(params, x, precision=precision)

    def forward(p, x):  # the network in dtype, its output float32
        return apply(*cast((p, x), dtype)).astype(jnp.float32)

    if network == "sdf":
        return jax.value_and_grad(sdf.sdf_loss(sdf.with_gradient(forward)))

    def cross_entropy(p, x, labels):
        logits = forward(p, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return jax.value_and_grad(cross_entropy)


def harness_loss_and_grad(params, x, labels_or_targets, dtype):
    """The ``harness`` row's "model": zero gradients, and one element of the batch as its loss.
    The batch is cast to ``dtype`` as the models cast it, and the optimization barrier keeps XLA
    from computing only that element (or nothing) of it: the sampler writes all of it, as it does
    for a model, which reads it."""
    if jnp.issubdtype(labels_or_targets.dtype, jnp.floating):
        labels_or_targets = labels_or_targets.astype(dtype)  # targets; labels stay integers
    x, labels_or_targets = jax.lax.optimization_barrier((x.astype(dtype), labels_or_targets))
    loss = x.ravel()[0].astype(jnp.float32) + labels_or_targets.ravel()[0].astype(jnp.float32)
    return loss, jax.tree.map(jnp.zeros_like, params)


def make_batch(network, key, batch):
    """``(inputs, targets or labels)`` of one step: for the wide family, random targets of the
    output width, as tiny-cuda-nn's benchmarks fit."""
    if network == "sdf":
        return sdf.sample(key, batch)
    sizes = harness.network_sizes(network)
    if harness.wide_architecture(network):
        input_key, target_key = jax.random.split(key)
        x = jax.random.uniform(input_key, (batch, sizes[0]), minval=-1.0, maxval=1.0)
        return x, jax.random.uniform(target_key, (batch, sizes[-1]), minval=-1.0, maxval=1.0)
    x = jax.random.uniform(key, (batch, sizes[0]), minval=-1.0, maxval=1.0)
    if network == "polynomial":
        return x, jnp.stack([x[:, 0] + x[:, 1], 2 * x[:, 0], x[:, 2], x[:, 3] * 0.5], axis=-1)
    return x, jax.random.randint(key, (batch,), 0, sizes[-1])


def training_run(
    network: str,
    model: str,
    dtype: str,
    batch: int,
    devices: int | None = None,
    flat: bool | None = None,
    unroll: int = 1,
):
    """(run, state): ``run(state, keys) -> (state, losses)`` is a jitted lax.scan of one training
    step per key (sample a batch, forward, backward, Adam update), from the initial ``state``; with
    ``devices``, each batch is split over a mesh of that many devices (:func:`batch_sharding`).
    ``flat``: keep the parameters as one vector (``_training.parameter_state``; default:
    :func:`trains_flat`). ``unroll``: steps per iteration of the scan's loop
    (``lax.scan(unroll=)``)."""
    if network == "texture":
        # The image the targets are sampled from is random: a step's cost does not depend on the
        # texels' values (experiments/texture.py fits a photograph).
        params = jax.random.uniform(jax.random.key(0), TEXTURE_SHAPE)
        image = jax.random.uniform(jax.random.key(2), TEXTURE_SHAPE)
        draw_batch = texture.batch_drawer(texture.sampler("slax" if model == "slax" else "jax"), image, batch)
        optimizer = optax.adam(1e-3)
    elif harness.ngp_architecture(network):  # the scripts' Adam (its schedule's length costs nothing)
        params, optimizer = _ngp_parameters(network), ngp.optimizer(1e-2, steps=2000)
        draw_batch = _ngp_batch_drawer(network, batch)
    else:
        params = nn.mlp_init(jax.random.key(0), harness.network_sizes(network))
        draw_batch = functools.partial(make_batch, network, batch=batch)
        optimizer = optax.adam(1e-3)
    flat = trains_flat(network, model) if flat is None else flat
    stored, fn, _ = parameter_state(params, loss_and_grad(network, model, jnp.dtype(dtype)), flat)
    sharding = batch_sharding(devices)
    step = training_step(fn, optimizer, draw_batch, sharding)
    run = jax.jit(lambda state, keys: jax.lax.scan(step, state, keys, unroll=unroll))
    return run, on_every_device((stored, optimizer.init(stored)), sharding)


def step_keys(steps: int, devices: int | None = None) -> jax.Array:
    """The keys of a timed call of ``steps`` steps, on every device the step runs on, as the
    state :func:`training_run` returns."""
    return on_every_device(jax.random.split(jax.random.key(1), steps), batch_sharding(devices))


@functools.cache
def _compiled_run(network, model, dtype, batch, steps, devices, flat, unroll, settings):
    """:func:`training_run` and the keys of a call of ``steps`` steps, traced, compiled and run once
    (the warm-up) under ``settings`` (:func:`_settings`); kept, so that the rounds of ``--rounds``
    time the same executable again."""
    launch, tensor_cores, device, backend, precision = settings
    overrides = dict(cuda_launch=launch, tensor_cores=tensor_cores, device_kind=device, mlp_backend=backend)
    with slax.config.override(**overrides), jax.default_matmul_precision(precision):
        run, state = training_run(network, model, dtype, batch, devices, flat, unroll)
        keys = step_keys(steps, devices)
        jax.block_until_ready(run(state, keys))
    return run, state, keys


def _settings() -> tuple:
    """What a compiled step depends on beyond its arguments: slax.config's CUDA launch route,
    tensor-core setting, device kind and MLP backend, and JAX's matmul precision, as they are now."""
    config = slax.config
    return (
        config.cuda_launch,
        config.tensor_cores,
        config.device_kind,
        config.mlp_backend,
        jax.config.jax_default_matmul_precision,
    )


def steps_per_second(
    network, model, dtype, batch, steps, repeats, devices=None, flat=None, unroll=1
) -> float:
    """Steps a second: ``steps`` over the median of ``repeats`` timed calls, after one warm-up
    call the first time a configuration (with :func:`_settings`) runs."""
    run, state, keys = _compiled_run(network, model, dtype, batch, steps, devices, flat, unroll, _settings())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(run(state, keys))
        times.append(time.perf_counter() - start)
    return steps / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    for problem in filter(None, map(harness.device_count_problem, args.devices)):
        harness.refuse_flags("benchmark", problem)
    # slax's rows: one per CUDA launch route and tensor-core setting on a GPU; elsewhere the one
    # route there is, by its name, as slax.config has it.
    tensor_cores, kind, backend = slax.config.tensor_cores, slax.config.device_kind, slax.config.mlp_backend
    backends = args.mlp_backend or [backend]

    def backend_suffix(name: str) -> str:
        return f"/{name}" if args.mlp_backend else ""

    if harness.on_cuda():
        args.launch = args.launch or [slax.config.cuda_launch]
        args.tensor_cores = args.tensor_cores or ["on" if tensor_cores else "off"]
        args.device = None
        slax_rows = [
            (
                f"slax/{launch}" + ("" if cores == "on" else "/simt") + backend_suffix(name),
                launch,
                cores == "on",
                kind,
                name,
            )
            for launch, cores, name in itertools.product(args.launch, args.tensor_cores, backends)
        ]
    else:  # no CUDA route applies: the JSON records none
        args.launch = args.tensor_cores = None
        slax_rows = [
            (
                f"slax/{route_of(device)}" + backend_suffix(name),
                slax.config.cuda_launch,
                tensor_cores,
                device,
                name,
            )
            for device, name in itertools.product(args.device or [kind], backends)
        ]

    # (row, model, parameters kept flat, CUDA launch route, tensor cores, device kind for CPU-placed
    # JAX, MLP backend): slax once per route, tensor-core setting, device and backend, then plain JAX.
    def table_of(
        network: str, precision: str | None
    ) -> list[tuple[str, str, bool, str, bool, str | None, str]]:
        table = [
            (row, "slax", trains_flat(network, "slax"), launch, cores, device, name)
            for row, launch, cores, device, name in slax_rows
        ]
        jax_rows = JAX_ROWS
        if network == "texture":
            jax_rows = SINGLE_JAX_ROWS
        elif harness.ngp_architecture(network):
            jax_rows = NGP_JAX_ROWS
        if precision == "highest":  # jax-f32 is jax
            jax_rows = tuple(row for row in jax_rows if row[1] != "jax-f32")
        table += [
            (row, model, flat, slax.config.cuda_launch, tensor_cores, kind, backend)
            for row, model, flat in jax_rows
        ]
        if args.harness:  # its parameters one vector, as slax's: Adam's cheapest form (two fusions)
            table.append(("harness", "harness", True, slax.config.cuda_launch, tensor_cores, kind, backend))
        return table

    networks = harness.workloads(args)
    if "texture" in networks and set(args.dtype) != {"float32"}:
        print(
            "the texture fit runs in float32 only (its sampler reads IDiffTensor<float4, 2>): no float16 rows"
        )
    peaks = device_peaks(args.peak_tflops, args.peak_gbps)
    print(harness.describe_platform(args.device))
    if args.unroll > 1:
        print(f"every model's scan runs {args.unroll} training steps per loop iteration (--unroll)")
    if peaks:
        rates = ", ".join(f"{kind} {rate / 1e12:.4g}" for kind, rate in peaks[0].items())
        print(
            f"floor at dense tensor-core TFLOP/s {rates} (3xTF32 a third of TF32) and "
            f"{peaks[1] / 1e9:.4g} GB/s"
        )
    round_column = f"{'round':>5} " if args.rounds > 1 else ""
    header = (
        f"{round_column}{'network':<16} {'dtype':<8} {'precision':<9} {'batch':>8} {'devices':>7} "
        f"{'model':<12} "
        f"{'steps/s':>10} {'samples/s':>10} {'us/step':>10} {'x floor':>8} {'vs jax':>7}"
    )
    print(header)
    print("-" * len(header))

    def time_rows(round_index, network, dtype, precision, batch, devices) -> list[dict]:
        """Each model's row of one configuration, timed under JAX's matmul precision now."""
        rows = []
        table = table_of(network, precision)
        flops, nbytes = step_floor(network, dtype, batch)
        rate_bound = flops / matrix_rate(peaks[0], dtype) if peaks else 0.0
        floor = max(rate_bound, nbytes / peaks[1]) / (devices or 1) if peaks else None
        time_steps = functools.partial(
            steps_per_second,
            network,
            dtype=dtype,
            batch=batch,
            steps=args.steps,
            repeats=args.repeats,
            devices=devices,
            unroll=args.unroll,
        )
        rates, chosen = {}, {}
        for row, model, flat, launch, cores, device, name in table:
            settings = dict(cuda_launch=launch, tensor_cores=cores, device_kind=device, mlp_backend=name)
            with slax.config.override(**settings):
                rates[row] = time_steps(model=model, flat=flat)
                if model == "slax":
                    chosen[row] = backend_taken(network, dtype, batch)
        jax_rate = max(rates[row] for row in ("jax", "jax/flat") if row in rates)
        for model, _, flat, _, _, _, _ in table:
            rate = rates[model]
            row = {
                "round": round_index,
                "network": network,
                "sizes": harness.network_sizes(network),
                **(harness.wide_architecture(network) or {}),
                **(harness.ngp_architecture(network) or {}),
                "dtype": dtype,
                "precision": precision,
                "batch": batch,
                "devices": devices,
                "model": model,
                "flat_parameters": flat,
                "unroll": args.unroll,
                "steps_per_s": rate,
                "samples_per_s": rate * batch,
                "step_us": 1e6 / rate,
                "floor_us": floor * 1e6 if floor else None,
                "flops": flops,
                "bytes": nbytes,
                "times_floor": 1 / (rate * floor) if floor else None,
                "speedup_vs_jax": None if model == "harness" else rate / jax_rate,
                "mlp_backend": chosen.get(model),
            }
            rows.append(row)
            times_floor = f"{row['times_floor']:>7.1f}x" if floor else f"{'-':>8}"
            speedup = row["speedup_vs_jax"]
            speedup = f"{speedup:>6.2f}x" if speedup is not None else f"{'-':>7}"
            round_cell = f"{round_index:>5} " if args.rounds > 1 else ""
            print(
                f"{round_cell}{network:<16} {dtype:<8} {precision or '-':<9} {batch:>8} "
                f"{devices or '-':>7} {model:<12} "
                f"{rate:>10.1f} {rate * batch:>10.3g} {row['step_us']:>10.1f} {times_floor} {speedup}",
                flush=True,
            )
        return rows

    rows = []
    for round_index, network, dtype, precision, batch, devices in itertools.product(
        range(1, args.rounds + 1), networks, args.dtype, args.precision, args.batch, args.devices
    ):
        if network == "texture" and dtype != "float32":
            continue
        with jax.default_matmul_precision(precision):
            rows += time_rows(round_index, network, dtype, precision, batch, devices)
    if args.json:
        summary = {**harness.provenance(args.device), "peaks": peaks, "args": vars(args)}
        harness.write_json(args.json, {**summary, "rows": rows})
    return 0


def backend_taken(network: str, dtype: str, batch: int) -> str | None:
    """The MLP backend slax's training step of ``network`` takes at ``batch`` with slax.config's
    settings (slax.nn.describe's first word; the call the step makes: the fused loss and gradient
    of a squared error, else the gradient of mlp_apply); None for the texture fit."""
    sizes = harness.network_sizes(network)
    if sizes is None:
        return None
    params = nn.mlp_init(jax.random.key(0), sizes, dtype)
    fused = network == "polynomial" or harness.wide_architecture(network) is not None
    line = nn.describe(params, (batch, sizes[0]))["mlp_loss_and_grad" if fused else "jax.grad of mlp_apply"]
    return line.split(":", 1)[0]


def route_of(device: str | None) -> str:
    """The launch route of slax's kernels in CPU-placed JAX on SlangPy device kind ``device``
    (None: slax's choice)."""
    with slax.config.override(device_kind=device):
        return slax.launch_route("cpu")


if __name__ == "__main__":
    sys.exit(main())
