"""slax.nn: the Slang MLP against its plain-JAX twin, in float32 and float16."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _helpers import (
    assert_float32_mlp_matches_reference,
    assert_loss_and_grad_match_reference,
    draw_uniform,
    mlp_inputs,
    parameter_product,
    relative_error,
)
from _training import cast, parameter_state, training_step
from jax.flatten_util import ravel_pytree

import slax
from slax import nn
from slax.nn import _backends as nn_backends
from slax.nn import _kernels as nn_kernels
from slax.nn import _tiled_kernels as nn_tiled
from slax.nn._architecture import Architecture
from slax.nn._params import flat_layers
from slax.nn._primitives import mlp_forward_p, mlp_loss_grad_p
from slax.testing import RELATIVE_TOLERANCE, check_grads

SIZES = [(4, 16, 4), (3, 7, 5), (64, 128, 64, 10)]
FLOAT32_ON_EVERY_JAX = pytest.param("float32", marks=pytest.mark.jax_version)
"""A dtype parameter whose tests CI runs on every JAX release: the rules are the same for float16,
which changes the kernels alone."""


NO_KERNEL_RUNS = pytest.mark.one_device_kind
"""For tests of slax.nn's Python that run no kernel: argument checks and their messages, what is
refused when traced or lowered, the launch arithmetic, the twin: the same on every route."""

JAX_VERSION_SIZES = SIZES[1]
"""The network of the size-parametrized tests CI runs on every JAX release: the rules are the same
for every size and dtype, which choose the kernels alone."""


def _apply_marks(case):
    """CI's every-JAX case, and one route for all cases but a narrow network's and a wide one's in
    float32: each route runs both kernel families' forward, tangent and backward kernels here;
    float16 and the batch change what the kernels hold and how many threads run, and each route
    runs both families in float16 (test_samples_per_thread_change_only_the_rounding,
    test_tiles_change_only_the_rounding)."""
    marks = [pytest.mark.jax_version] * (case == (JAX_VERSION_SIZES, 31, "float32"))
    on_every_route = case in [(SIZES[0], 1, "float32"), (SIZES[2], 1000, "float32")]
    return marks + [pytest.mark.one_device_kind] * (not on_every_route)


@pytest.mark.parametrize(
    ("sizes", "batch", "dtype"),
    parameter_product(SIZES, [1, 31, 1000], ["float32", "float16"], marks=_apply_marks),
)
def test_apply_and_its_gradients_match_reference(sizes, batch, dtype):
    keys = jax.random.split(jax.random.key(batch + len(sizes)), 3)
    params = nn.mlp_init(keys[0], sizes, dtype)
    x = mlp_inputs(params, keys[1], batch, dtype)

    def loss(apply):  # a nonlinear JAX loss around the network
        return lambda params, x: jnp.sum(jnp.sin(apply(params, x).astype(jnp.float32) * 1.3))

    # check_grads runs the twin in float32; storing activations in the kernels' dtype keeps the
    # twin's rounding (and so its LeakyReLU kinks) where the half network has them.
    reference = functools.partial(nn.mlp_apply_reference, storage_dtype=dtype)
    check_grads(loss(nn.mlp_apply), loss(reference), params, x, raises=True)


def _parameters_alone_marks(case):
    """CI's every-JAX case, and one route for all cases but the narrow float32 network's: which
    backward kernel lowers is slax's Python and JAX's dead-code elimination, the same on every
    route; the narrow kernels' mlp_backward_params runs on every route here, the tiled kernels' in
    tests/test_tensor_cores.py's test_wide_networks_match_the_reference, and each dtype's
    mlp_backward in test_apply_and_its_gradients_match_reference."""
    marks = [pytest.mark.jax_version] * (case == (JAX_VERSION_SIZES, "float32"))
    return marks + [pytest.mark.one_device_kind] * (case != (SIZES[0], "float32"))


@pytest.mark.parametrize(
    ("sizes", "dtype"), parameter_product(SIZES, ["float32", "float16"], marks=_parameters_alone_marks)
)
def test_gradients_of_the_parameters_alone_compute_no_input_gradient(sizes, dtype, lowered):
    """A training step differentiates the parameters only: nothing reads x's cotangent, and
    jax.jit's dead-code elimination lowers mlp_backward_params, which computes and stores no dx
    (for wide networks, a quarter of the backward products fewer), in a jitted gradient, under
    vmap and in a scanned training step. Its gradients are the reference's, as are those of
    mlp_backward, which runs where x is differentiated too."""
    keys = jax.random.split(jax.random.key(len(sizes) + 40), 2)
    params = nn.mlp_init(keys[0], sizes, dtype)
    x = mlp_inputs(params, keys[1], 300, dtype)

    def loss(apply):
        return lambda params, x: jnp.sum(jnp.sin(apply(params, x).astype(jnp.float32) * 1.3))

    def backward_kernels():
        return [key[1] for key in lowered if key[1].startswith("mlp_backward")]

    def assert_close(got, want):
        for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert relative_error(got_leaf, want_leaf) < RELATIVE_TOLERANCE[dtype]

    reference = loss(functools.partial(nn.mlp_apply_reference, storage_dtype=dtype))
    for argnums, backward in [(0, "mlp_backward_params"), ((0, 1), "mlp_backward")]:
        lowered.clear()
        got = jax.jit(jax.grad(loss(nn.mlp_apply), argnums))(params, x)
        assert backward_kernels() == [backward]
        assert_close(got, jax.grad(reference, argnums)(*cast((params, x), jnp.float32)))
    lowered.clear()
    examples = x[:5, None]
    per_example = jax.jit(jax.vmap(jax.grad(loss(nn.mlp_apply)), in_axes=(None, 0)))(params, examples)
    assert backward_kernels() == ["mlp_backward_params"]
    per_example_reference = jax.vmap(jax.grad(reference), in_axes=(None, 0))
    assert_close(per_example, per_example_reference(*cast((params, examples), jnp.float32)))
    lowered.clear()
    target = jnp.zeros((len(x), sizes[-1]), jnp.float32)

    def squared_error(params, x, target):
        return jnp.sum((nn.mlp_apply(params, x).astype(jnp.float32) - target) ** 2)

    optimizer = optax.adam(1e-3)
    step = training_step(jax.value_and_grad(squared_error), optimizer, lambda key: (x, target))
    jax.jit(lambda state, keys: jax.lax.scan(step, state, keys)).lower((params, optimizer.init(params)), keys)
    assert backward_kernels() == ["mlp_backward_params"]


# the narrow kernels' mlp_loss_grad in each dtype runs on every route in
# test_samples_per_thread_change_only_the_rounding and on Vulkan in
# test_large_batch_gradients_are_race_free
@pytest.mark.one_device_kind
@pytest.mark.parametrize("dtype", [FLOAT32_ON_EVERY_JAX, "float16"])
def test_loss_and_grad_matches_reference(dtype):
    keys = jax.random.split(jax.random.key(7), 4)
    params = nn.mlp_init(keys[0], (3, 7, 5), dtype)
    x, target = mlp_inputs(params, keys[1], 257, dtype), draw_uniform(keys[2], (257, 5), dtype)
    loss, grads = jax.jit(nn.mlp_loss_and_grad)(params, x, target)
    loss_ref, grads_ref = jax.value_and_grad(nn.mlp_loss_reference)(
        *cast((params, x, target), jnp.float32), storage_dtype=dtype
    )
    tolerance = RELATIVE_TOLERANCE[dtype]
    assert relative_error(loss, loss_ref) < tolerance
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
        assert got.dtype == jnp.float32
        assert relative_error(got, want) < tolerance


@pytest.mark.parametrize("dtype", [FLOAT32_ON_EVERY_JAX, "float16"])
@pytest.mark.parametrize("sizes", [(3, 7, 5), (4, 16, 16, 4)])
def test_the_squared_error_and_its_gradients_match_the_reference(sizes, dtype):
    """``jax.value_and_grad`` of ``mlp_squared_error`` in the parameters and x (here the backend's
    forward and backward kernels; on the warp tiles one launch, tests/test_wide_warp.py), vmapped
    over groups of 1000, 333 and 5 samples: each group's loss and gradients within the dtype's
    tolerance of the float32 reference's."""
    params = nn.mlp_init(jax.random.key(sum(sizes)), sizes, dtype)
    assert_loss_and_grad_match_reference(params, 3, RELATIVE_TOLERANCE[dtype], input_gradient=True)


@pytest.mark.one_device_kind  # its kernels run on every route in
# test_the_squared_error_and_its_gradients_match_the_reference
def test_the_squared_errors_gradient_flows_into_what_computed_x_and_the_target():
    """The gradient in x continues into the JAX code that computed x (an encoding's place), and
    the target's gradient is the reference's; its dtypes are the arguments'."""
    keys = jax.random.split(jax.random.key(9), 4)
    params = nn.mlp_init(keys[0], (3, 7, 5))
    z, a = draw_uniform(keys[1], (64, 4), "float32"), draw_uniform(keys[2], (4, 3), "float32")
    target = draw_uniform(keys[3], (64, 5), "float32")

    def loss(apply_loss, a, target):
        return apply_loss(params, jnp.tanh(z @ a), target)

    got = jax.jit(jax.grad(functools.partial(loss, nn.mlp_squared_error), (0, 1)))(a, target)
    want = jax.grad(functools.partial(loss, nn.mlp_loss_reference), (0, 1))(a, target)
    for g, w in zip(got, want):
        assert g.dtype == jnp.float32 and relative_error(g, w) < RELATIVE_TOLERANCE["float32"]


@NO_KERNEL_RUNS
def test_the_squared_errors_launch_writes_dx_only_where_x_is_differentiated():
    """``jax.grad`` in the parameters alone launches the fused loss without dx (and nothing for the
    target's gradient); in x too, with it."""
    params = nn.mlp_init(jax.random.key(0), (3, 7, 5))
    x = draw_uniform(jax.random.key(1), (16, 3), "float32")
    target = draw_uniform(jax.random.key(2), (16, 5), "float32")
    for argnums, input_gradient in [(0, False), ((0, 1), True)]:
        jaxpr = jax.make_jaxpr(jax.grad(nn.mlp_squared_error, argnums))(params, x, target).jaxpr
        launches = [e for e in jaxpr.eqns if e.primitive is mlp_loss_grad_p]
        assert [e.params["input_gradient"] for e in launches] == [input_gradient]
        assert not [e for e in jaxpr.eqns if e.primitive is mlp_forward_p]


@NO_KERNEL_RUNS
def test_the_squared_error_refuses_forward_mode_second_derivatives_and_unmatched_targets():
    params = nn.mlp_init(jax.random.key(0), (3, 7, 5))
    x = draw_uniform(jax.random.key(1), (16, 3), "float32")
    target = draw_uniform(jax.random.key(2), (16, 5), "float32")

    def loss(x):
        return nn.mlp_squared_error(params, x, target)

    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(loss, (x,), (x,))
    with pytest.raises(TypeError, match="mlp_squared_error is differentiable once"):
        jax.grad(lambda x: jnp.sum(jax.grad(loss)(x) ** 2))(x)
    with pytest.raises(ValueError, match=r"slax.nn.mlp_squared_error: target must have shape \(16, 5\)"):
        nn.mlp_squared_error(params, x, target[:, :4])
    with pytest.raises(TypeError, match="slax.nn.mlp_squared_error: x has dtype float16"):
        nn.mlp_squared_error(params, x.astype(jnp.float16), target)


# push constants are Vulkan's
@pytest.mark.one_device_kind("vulkan")
@pytest.mark.slow
def test_depth_is_not_capped_by_push_constants():
    """Eight layers: four pointers per layer would overflow Vulkan's 256 bytes of push constants at
    seven; the kernels take all parameters through one pointer and all gradients through another."""
    assert_float32_mlp_matches_reference((3, 6, 5, 6, 5, 6, 5, 6, 2), seed=11)


@NO_KERNEL_RUNS
def test_layers_too_wide_for_the_kernels_run_on_xla_and_forcing_a_kernel_is_refused(monkeypatch):
    """A wide network runs a tile of samples per thread group with every layer's activations in
    group-shared memory: when even one sample's do not fit (3-4000-4000: 12,263 floats in 8192),
    no fused kernel runs it, and "auto" takes XLA's products (describe says why); forcing the
    tiled kernels is refused when traced, naming the backend, the network, the widths and the
    limit, rather than launching a kernel that cannot run."""
    shapes = jax.eval_shape(lambda: nn.mlp_init(jax.random.key(0), (3, 4000, 4000)))
    params = jax.tree.map(lambda s: np.broadcast_to(np.zeros((), s.dtype), s.shape), shapes)  # no memory
    x = jnp.ones((4, 3))
    assert nn.describe(params, x, "cpu")["mlp_apply"].startswith("xla: 3-4000-4000 float32 on CPU")
    assert "tiled: layers 3-4000-4000 are too wide" in nn.describe(params, x, "cpu")["mlp_apply"]
    jax.jit(nn.mlp_apply).trace(shapes, x)
    # the setting is read when the call is traced: functions JAX has not traced yet
    monkeypatch.setattr(slax.config, "mlp_backend", "tiled")
    too_wide = (
        r"the 'tiled' backend \(slax.config.mlp_backend\) cannot run the network 3-4000-4000 float32 on "
        r".*: layers 3-4000-4000 are too wide for the kernels: .* 12263 floats, in 8192 floats \(32 KiB\)"
    )
    with pytest.raises(ValueError, match=too_wide):
        jax.jit(lambda *args: nn.mlp_loss_and_grad(*args)).trace(shapes, x, jnp.ones((4, 4000)))
    with pytest.raises(ValueError, match=too_wide):
        jax.jit(lambda *args: nn.mlp_apply(*args)).trace(shapes, x)
    with pytest.raises(ValueError, match=too_wide):
        jax.jit(jax.grad(lambda p: nn.mlp_apply(p, x).sum())).trace(shapes)


@NO_KERNEL_RUNS
@pytest.mark.jax_version
def test_batches_past_uint_indices_are_refused_before_they_run(fused_kernels):
    """The kernels number threads and index samples' elements with 32-bit uints. A wide network
    runs a thread group of 256 threads per tile, one sample a tile at 3-2048-2048-3, so 2**24
    samples would launch 2**32 threads, whose numbers wrap to 0: the kernel would skip every sample
    and return uninitialised memory. Under jax.grad it keeps 4096 hidden values a sample: 2**20
    samples' would wrap. 2**30 samples of 4 inputs would wrap the inputs' indices. All refused when
    lowered, before anything runs (nothing is allocated); batches within the limits lower."""
    wide = jax.eval_shape(lambda: nn.mlp_init(jax.random.key(0), (3, 2048, 2048, 3)))
    with pytest.raises(ValueError, match=r"'mlp_forward' would launch 4,294,967,296 threads, .* Split"):
        jax.jit(nn.mlp_apply).lower(wide, jax.ShapeDtypeStruct((1 << 24, 3), jnp.float32))
    grad = jax.jit(jax.grad(lambda p, x: nn.mlp_apply(p, x).sum()))
    grad.lower(wide, jax.ShapeDtypeStruct(((1 << 20) - 1, 3), jnp.float32))
    with pytest.raises(ValueError, match=r"'mlp_forward_hidden': its result 1 has shape \(1048576, 4096\)"):
        grad.lower(wide, jax.ShapeDtypeStruct((1 << 20, 3), jnp.float32))
    narrow = nn.mlp_init(jax.random.key(0), (4, 16, 4))
    loss_and_grad = jax.jit(nn.mlp_loss_and_grad)
    most = jax.ShapeDtypeStruct(((1 << 30) - 1, 4), jnp.float32)
    loss_and_grad.lower(narrow, most, most)
    too_many = jax.ShapeDtypeStruct((1 << 30, 4), jnp.float32)
    with pytest.raises(ValueError, match=r"'mlp_loss_grad': its operand 0 has shape \(1073741824, 4\)"):
        loss_and_grad.lower(narrow, too_many, too_many)


@NO_KERNEL_RUNS
def test_gradient_thread_groups_past_uint_sample_positions_are_refused():
    """A wide network's gradient kernels step through whole tiles: with one input and one output,
    2**32 - 1 samples fit every buffer, but the last thread group's tiles reach past sample 2**32,
    whose uint position would wrap to sample 0 and count the first samples twice. Refused when
    lowered, saying so."""
    params = jax.eval_shape(lambda: nn.mlp_init(jax.random.key(0), (1, 32, 32, 1)))
    data = jax.ShapeDtypeStruct(((1 << 32) - 1, 1), jnp.float32)
    past = r"'mlp_loss_grad': its thread groups step through 4,29\d,\d{3},\d{3} sample positions"
    with pytest.raises(ValueError, match=past):
        jax.jit(nn.mlp_loss_and_grad).lower(params, data, data)


# threads race on Vulkan (lavapipe runs a launch's groups in parallel); the CPU
# device runs a launch on one thread
@pytest.mark.one_device_kind("vulkan")
@pytest.mark.quick_sample
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("sizes", "batch"), [((4, 16, 4), 1 << 16), ((64, 128, 64, 10), 1 << 12)])
def test_large_batch_gradients_are_race_free(sizes, batch, dtype, fused_kernels):
    """Many samples' gradients summed in thread groups (narrow: per thread, then per group; wide:
    per tile, then over a group's tiles): every run matches the reference, bit for bit."""
    keys = jax.random.split(jax.random.key(3), 4)
    params = nn.mlp_init(keys[0], sizes, dtype)
    x, target = mlp_inputs(params, keys[1], batch, dtype), draw_uniform(keys[2], (batch, sizes[-1]), dtype)
    _, reference = jax.value_and_grad(nn.mlp_loss_reference)(
        *cast((params, x, target), jnp.float32), storage_dtype=dtype
    )
    run = jax.jit(nn.mlp_loss_and_grad)
    runs = [jax.tree.leaves(run(params, x, target)[1]) for _ in range(3)]
    for leaves in runs:
        for got, want in zip(leaves, jax.tree.leaves(reference)):
            assert relative_error(got, want) < RELATIVE_TOLERANCE[dtype]
    for first, again in zip(runs[0], runs[1]):
        assert np.array_equal(again, first), "the reduction is not deterministic"


@pytest.mark.sweep
@pytest.mark.parametrize("threads_wanted", [1 << 15, 64, 1])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_samples_per_thread_change_only_the_rounding(monkeypatch, dtype, threads_wanted):
    """Narrow networks sum each thread's samples in registers, several per thread when the launch
    would otherwise exceed THREADS_WANTED threads (1000 samples: 1, 16 and 64 per thread here, with
    padding past the batch's end); vmapped groups sum apart. Every split gives the reference's loss
    and gradients within the dtype's tolerance. Tensor cores off: with them, a float16 network's
    fused kernel on a CUDA GPU runs warp tiles (tests/test_warp_mma.py)."""
    monkeypatch.setattr(nn_kernels, "THREADS_WANTED", threads_wanted)
    monkeypatch.setattr(slax.config, "tensor_cores", False)
    keys = jax.random.split(jax.random.key(12), 4)
    params = nn.mlp_init(keys[0], (4, 16, 4), dtype)
    x = mlp_inputs(params, keys[1], 1000, dtype).reshape(2, 500, 4)
    target = draw_uniform(keys[2], (2, 500, 4), dtype)
    loss, grads = jax.jit(jax.vmap(nn.mlp_loss_and_grad, in_axes=(None, 0, 0)))(params, x, target)
    for k in range(2):
        loss_ref, grads_ref = jax.value_and_grad(nn.mlp_loss_reference)(
            *cast((params, x[k], target[k]), jnp.float32), storage_dtype=dtype
        )
        assert relative_error(loss[k], loss_ref) < RELATIVE_TOLERANCE[dtype]
        for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
            assert relative_error(got[k], want) < RELATIVE_TOLERANCE[dtype]


@NO_KERNEL_RUNS
@pytest.mark.jax_version
def test_an_empty_batch_launches_nothing_and_gives_zeros():
    """No samples: no kernel runs (a launch would read past the empty buffers), the output is empty,
    and the gradients of its sum are zero, as plain JAX's are."""
    params = nn.mlp_init(jax.random.key(13), (4, 16, 4))
    for x in (jnp.zeros((0, 4)), jnp.zeros((3, 0, 4))):
        assert nn.mlp_apply(params, x).shape == x.shape
        assert jax.jit(nn.mlp_apply)(params, x).shape == x.shape
        grads = jax.grad(lambda p, x: jnp.sum(nn.mlp_apply(p, x)))(params, x)
        assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(grads))
        jacobian = jax.jacrev(lambda x: nn.mlp_apply(params, x))(x)
        assert jacobian.shape == x.shape + x.shape


@NO_KERNEL_RUNS
@pytest.mark.parametrize("batch", [(0,), (3, 0)], ids=["empty", "empty-groups"])
@pytest.mark.parametrize("loss", [nn.mlp_loss_and_grad, nn.mlp_loss_reference], ids=lambda f: f.__name__)
def test_the_loss_of_an_empty_batch_is_refused(loss, batch):
    """The loss is the batch mean: over no samples it has no value. The fused kernel returned 0.0
    and zero gradients while its twin, the reference, returned jnp.mean's nan, so a data pipeline
    that lost its samples trained silently at loss 0. Both refuse it when traced, naming the
    function, the argument and its shape."""
    params = nn.mlp_init(jax.random.key(14), (4, 16, 3))
    x, target = jnp.zeros((*batch, 4)), jnp.zeros((*batch, 3))
    message = rf"slax.nn.{loss.__name__}: x has shape \({batch[0]}, .*no samples.*at least one sample"
    for call in (loss, jax.jit(loss)):
        with pytest.raises(ValueError, match=message):
            call(params, x, target)


@NO_KERNEL_RUNS
def test_samples_per_thread_follow_the_batch_and_the_group():
    """Narrow networks: one sample a thread until a launch would exceed THREADS_WANTED threads, then
    more, up to MAX_SAMPLES_PER_THREAD, but never more than a thread group needs for its vmapped
    group (per-example gradients of single samples run one sample a thread)."""
    per_thread = nn_backends.samples_per_thread
    wanted = nn_kernels.THREADS_WANTED
    assert per_thread(4096, 4096) == 1
    assert per_thread(32 * wanted, 32 * wanted) == 32
    assert per_thread(1 << 30, 1 << 30) == nn_kernels.MAX_SAMPLES_PER_THREAD
    assert per_thread(1 << 20, 1) == 1
    assert per_thread(1 << 20, 200) == 4  # 200 samples: a thread group of 4 each


@NO_KERNEL_RUNS
def test_tiles_per_thread_group_follow_the_batch_and_the_group():
    """Wide networks: a tile (16 samples of the digits network) per thread group until a launch
    would exceed BLOCKS_WANTED thread groups, then more, but never more than a vmapped group has."""
    arch, tiled, cpu = (
        Architecture((64, 128, 64, 10), "float32"),
        nn_backends.Tiled(),
        nn_backends.Platform("cpu"),
    )
    assert tiled.unfit(arch, cpu) is None and tiled.layout(arch).samples == 16

    def launch(samples, per_group):
        found = tiled.gradient_launch(arch, cpu, "mlp_loss_grad", samples, per_group)
        return found.threads, found.blocks, found.share

    blocks = nn_tiled.BLOCKS_WANTED
    assert launch(4096, 4096) == (nn_tiled.TILE_THREADS, 256, ("tiles_per_block", 1))
    assert launch(16 * blocks * 4, 16 * blocks * 4) == (256, blocks, ("tiles_per_block", 4))
    assert launch(1 << 20, 1)[1:] == (1, ("tiles_per_block", 1))
    assert launch(1 << 20, 40)[1:] == (1, ("tiles_per_block", 3))  # 40 samples: 3 tiles
    assert tiled.forward_threads(arch, cpu, 17) == 2 * nn_tiled.TILE_THREADS


# the default launch, a tile a thread group, on one route: the other tests of the tiled kernels run it
# on every route
@pytest.mark.sweep
@pytest.mark.parametrize(
    ("tile_samples", "blocks_wanted"),
    [pytest.param(16, 1 << 20, marks=pytest.mark.one_device_kind), (16, 1), (5, 3)],
)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_tiles_change_only_the_rounding(monkeypatch, dtype, tile_samples, blocks_wanted):
    """Wide networks sum a thread group's tiles in order: one tile per thread group, all of a
    vmapped group's tiles in one thread group, and tiles of 5 samples over 3 thread groups (padding
    in the last tile of each group of 500) all give the reference's loss and gradients, for
    mlp_loss_and_grad and mlp_apply's backward pass."""
    monkeypatch.setattr(nn_tiled, "MAX_TILE_SAMPLES", tile_samples)
    monkeypatch.setattr(nn_tiled, "BLOCKS_WANTED", blocks_wanted)
    caches = (nn_tiled.tile_layout, nn_kernels.kernel_layout, nn_backends.kernel)
    for cached in caches:  # layouts and kernels made with the defaults; cleared again at the end
        cached.cache_clear()
    try:
        sizes = (5, 20, 6)
        assert nn_backends.Tiled().layout(Architecture(sizes, dtype)).samples == tile_samples
        keys = jax.random.split(jax.random.key(14), 4)
        params = nn.mlp_init(keys[0], sizes, dtype)
        x = mlp_inputs(params, keys[1], 1000, dtype).reshape(2, 500, 5)
        target = draw_uniform(keys[2], (2, 500, 6), dtype)
        loss, grads = jax.jit(jax.vmap(nn.mlp_loss_and_grad, in_axes=(None, 0, 0)))(params, x, target)
        apply_grads = jax.jit(jax.vmap(jax.grad(lambda p, x: jnp.sum(nn.mlp_apply(p, x))), (None, 0)))(
            params, x
        )
        for k in range(2):
            loss_ref, grads_ref = jax.value_and_grad(nn.mlp_loss_reference)(
                *cast((params, x[k], target[k]), jnp.float32), storage_dtype=dtype
            )
            assert relative_error(loss[k], loss_ref) < RELATIVE_TOLERANCE[dtype]
            for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)):
                assert relative_error(got[k], want) < RELATIVE_TOLERANCE[dtype]
            inputs = x[k].astype(jnp.float32)
            apply_ref = jax.grad(
                lambda p, inputs=inputs: jnp.sum(nn.mlp_apply_reference(p, inputs, storage_dtype=dtype))
            )(cast(params, jnp.float32))
            for got, want in zip(jax.tree.leaves(apply_grads), jax.tree.leaves(apply_ref)):
                assert relative_error(got[k], want) < RELATIVE_TOLERANCE[dtype]
    finally:
        for cached in caches:
            cached.cache_clear()


@pytest.mark.jax_version
@pytest.mark.one_device_kind  # vmap over the data adds a group axis to the same launches: the narrow
# kernels' per-example gradients run on every route in
# test_gradients_of_the_parameters_alone_compute_no_input_gradient
def test_vmap_gives_per_example_gradients():
    keys = jax.random.split(jax.random.key(4), 2)
    params = nn.mlp_init(keys[0], (3, 7, 5))
    x = draw_uniform(keys[1], (6, 3), "float32")

    def per_example(apply):
        return jax.vmap(jax.grad(lambda p, x: jnp.sum(apply(p, x[None]) ** 2)), in_axes=(None, 0))(params, x)

    got, want = per_example(nn.mlp_apply), per_example(nn.mlp_apply_reference)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape[0] == 6
        assert relative_error(g, w) < RELATIVE_TOLERANCE["float32"]


@pytest.mark.jax_version
@pytest.mark.one_device_kind  # vmap over the parameters loops over launches (_primitives.py's
# _batch_by_loop) of the kernels test_apply_and_its_gradients_match_reference runs on every route
def test_vmap_over_parameters():
    keys = jax.random.split(jax.random.key(5), 3)
    stacked = jax.vmap(lambda k: nn.mlp_init(k, (3, 7, 5)))(jax.random.split(keys[0], 3))
    x = draw_uniform(keys[1], (10, 3), "float32")
    got = jax.vmap(nn.mlp_apply, in_axes=(0, None))(stacked, x)
    want = jax.vmap(nn.mlp_apply_reference, in_axes=(0, None))(stacked, x)
    assert relative_error(got, want) < RELATIVE_TOLERANCE["float32"]


@pytest.mark.jax_version
@pytest.mark.one_device_kind  # JAX's scan and optax around mlp_loss_and_grad, whose narrow kernels run
# on every route in test_samples_per_thread_change_only_the_rounding
def test_training_matches_pure_jax():
    """A short jitted optax run: loss falls by >= 10x and follows the pure-JAX run step by step."""
    keys = jax.random.split(jax.random.key(6), 2)
    params = nn.mlp_init(keys[0], (4, 16, 4))
    optimizer = optax.adam(1e-2)

    def draw_batch(key):
        xy = jax.random.uniform(key, (256, 2), minval=-1.0, maxval=1.0)
        x = jnp.concatenate([xy, xy * xy], axis=-1)
        return x, jnp.stack([xy[:, 0] + xy[:, 1], xy[:, 0] * xy[:, 1], xy[:, 1] ** 2, -xy[:, 0]], -1)

    def train(loss_and_grad):
        step = training_step(loss_and_grad, optimizer, draw_batch)
        state = (params, optimizer.init(params))
        return jax.jit(lambda s: jax.lax.scan(step, s, jax.random.split(keys[1], 300)))(state)[1]

    losses = np.asarray(train(nn.mlp_loss_and_grad))
    reference = np.asarray(train(jax.value_and_grad(nn.mlp_loss_reference)))
    assert losses[-10:].mean() < losses[:10].mean() / 10
    np.testing.assert_allclose(losses, reference, rtol=1e-3)


@pytest.mark.one_device_kind  # the layout and XLA's program (the kernels of 4-16-4 on each route:
# test_apply_and_its_gradients_match_reference, test_training_matches_pure_jax)
def test_ravelled_parameters_are_the_kernels_layout():
    """``ravel_pytree(params)`` is the kernels' parameter layout, so a training state kept as that
    vector (``_training.parameter_state``) packs nothing per step: compiled, a loss and gradient
    over the vector hands it to the kernel as it is and returns the gradient as a slice of the
    kernel's summed row, with no concatenation (BENCHMARKS.md, "Flat parameters"). The numbers are
    the per-array call's, for the fused loss and for a loss around mlp_apply: bit for bit where JAX
    runs on the CPU; on a GPU to float32's 1e-5 relative to the largest gradient, as XLA adds the
    kernel's rows of partial sums in an order that depends on what it fuses the sum with, and with
    atomics, so not the same order twice (4 ulps apart in one run of five on the H100)."""
    keys = jax.random.split(jax.random.key(9), 3)
    params = nn.mlp_init(keys[0], (4, 16, 4))
    x, target = mlp_inputs(params, keys[1], 300, jnp.float32), draw_uniform(keys[2], (300, 4), jnp.float32)
    np.testing.assert_array_equal(nn_backends.packed(flat_layers(params)), ravel_pytree(params)[0])

    def loss_around_apply(params, x, target):
        return jnp.mean(jnp.sum((nn.mlp_apply(params, x) - target) ** 2, axis=-1))

    for loss_and_grad in (nn.mlp_loss_and_grad, jax.value_and_grad(loss_around_apply)):
        vector, flat_loss_and_grad, to_params = parameter_state(params, loss_and_grad, flat=True)
        compiled = jax.jit(flat_loss_and_grad).lower(vector, x, target).compile()
        assert "concatenate" not in compiled.as_text()
        loss, grad = compiled(vector, x, target)
        want_loss, want_grads = jax.jit(loss_and_grad)(params, x, target)
        assert loss == want_loss
        if jax.default_backend() == "cpu":
            np.testing.assert_array_equal(grad, ravel_pytree(want_grads)[0])
        else:
            want = ravel_pytree(want_grads)[0]
            np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(want))))
        assert (
            jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), to_params(vector), params))
            == [True] * 4
        )


@pytest.mark.jax_version
@pytest.mark.one_device_kind  # JAX's scan around mlp_apply, whose kernels run on every route in
# test_apply_and_its_gradients_match_reference
def test_scan_over_apply():
    params = nn.mlp_init(jax.random.key(8), (5, 9, 5))
    x = draw_uniform(jax.random.key(9), (4, 5), "float32")

    def iterate(apply):
        return jax.lax.scan(lambda h, _: (jnp.tanh(apply(params, h)), None), x, None, length=20)[0]

    assert relative_error(jax.jit(lambda: iterate(nn.mlp_apply))(), iterate(nn.mlp_apply_reference)) < 1e-5


@NO_KERNEL_RUNS
def test_init_shapes_and_range():
    params = nn.mlp_init(jax.random.key(0), (3, 7, 5), jnp.float16)
    assert [(p["weight"].shape, p["bias"].shape) for p in params] == [((7, 3), (7,)), ((5, 7), (5,))]
    assert all(p["weight"].dtype == jnp.float16 for p in params)
    assert float(jnp.max(jnp.abs(params[0]["weight"]))) <= 1 / np.sqrt(3)
    assert float(jnp.std(params[0]["weight"])) > 0.1


@NO_KERNEL_RUNS
def test_errors_are_specific():
    params = nn.mlp_init(jax.random.key(0), (3, 7, 5))
    with pytest.raises(ValueError, match=r"mlp_apply: x must have shape \(\.\.\., 3\); got \(4, 4\)"):
        nn.mlp_apply(params, jnp.ones((4, 4)))
    with pytest.raises(TypeError, match="x has dtype float16 but the parameters are float32"):
        nn.mlp_apply(params, jnp.ones((4, 3), jnp.float16))
    with pytest.raises(ValueError, match="layer 1 takes 7 inputs but layer 0 gives 6"):
        nn.mlp_apply(
            [params[0] | {"weight": jnp.ones((6, 3)), "bias": jnp.ones(6)}, params[1]], jnp.ones((2, 3))
        )
    with pytest.raises(ValueError, match=r"target must have shape \(4, 5\)"):
        nn.mlp_loss_and_grad(params, jnp.ones((4, 3)), jnp.ones((4, 4)))
    with pytest.raises(TypeError, match="dtype must be float32 or float16"):
        nn.mlp_init(jax.random.key(0), (3, 4), jnp.int32)


@NO_KERNEL_RUNS
@pytest.mark.parametrize("sizes", [(4, 0, 3), (64, 64, 0), (0, 5)], ids=lambda s: "-".join(map(str, s)))
def test_layers_of_no_width_are_refused(sizes):
    """mlp_init refuses a width below 1; parameters built by hand with one ran the per-sample
    kernels (Slang's "loop runs zero times" warnings) or failed Slang's compile of the wide
    kernels ("divide by zero"). Every function refuses them, naming the layer."""
    keys = jax.random.split(jax.random.key(15), len(sizes) - 1)
    params = [
        {"weight": draw_uniform(key, (out, n_in), "float32"), "bias": jnp.zeros((out,))}
        for key, n_in, out in zip(keys, sizes[:-1], sizes[1:])
    ]
    layer = next(k for k, (n_in, out) in enumerate(zip(sizes[:-1], sizes[1:])) if not (n_in and out))
    x, target = jnp.ones((8, sizes[0])), jnp.ones((8, sizes[-1]))
    message = rf"layer {layer} has weight shape \({sizes[layer + 1]}, {sizes[layer]}\).*at least 1 wide"
    for call in (
        lambda: nn.mlp_apply(params, x),
        lambda: nn.mlp_loss_and_grad(params, x, target),
        lambda: nn.describe(params, x),
    ):
        with pytest.raises(ValueError, match=message):
            call()


@NO_KERNEL_RUNS
@pytest.mark.parametrize("transform", [pytest.param("grad", marks=pytest.mark.jax_version), "jvp", "hessian"])
def test_differentiating_loss_and_grad_points_to_mlp_apply(transform):
    params = nn.mlp_init(jax.random.key(0), (3, 4, 2))
    x, target = jnp.ones((5, 3)), jnp.zeros((5, 2))

    def loss(x):
        return nn.mlp_loss_and_grad(params, x, target)[0]

    differentiate = {
        "grad": lambda: jax.grad(loss)(x),
        "jvp": lambda: jax.jvp(loss, (x,), (x,)),
        "hessian": lambda: jax.hessian(loss)(x),
    }[transform]
    with pytest.raises(TypeError, match=r"mlp_loss_and_grad already returns .* slax\.nn\.mlp_apply"):
        differentiate()


@NO_KERNEL_RUNS
def test_reference_multiplies_at_the_requested_precision():
    """The twin is the reference: full float32 by default (not TF32, JAX's default on tensor-core
    GPUs); ``precision=None`` gives JAX's default, for benchmarks of plain JAX."""
    params = nn.mlp_init(jax.random.key(0), (4, 16, 4))
    x = jnp.ones((8, 4))

    def precisions(**kwargs):
        jaxpr = jax.make_jaxpr(functools.partial(nn.mlp_apply_reference, **kwargs))(params, x)
        return {str(e.params["precision"]) for e in jaxpr.eqns if e.primitive.name == "dot_general"}

    assert precisions() == {"(Precision.HIGHEST, Precision.HIGHEST)"}
    with jax.default_matmul_precision(None):  # JAX's own default, not the suite's (conftest.py)
        assert precisions(precision=None) == {"None"}


@pytest.mark.one_device_kind
@pytest.mark.slow  # --quick runs one route; the full run runs each, and compares them here
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_cpu_device_gives_the_vulkan_routes_results(dtype):
    """Both CPU routes in one process, on the same inputs: apply, its VJP and the fused loss and
    gradient on SlangPy's CPU device (whose gradient sums run a thread group's samples on one
    thread) agree with Vulkan's (sums through group-shared memory) within the dtype's tolerance."""
    for kind in ("vulkan", "cpu"):
        try:
            with slax.config.override(device_kind=kind):
                slax.launch_route("cpu")
        except slax.DeviceUnavailableError as error:
            pytest.skip(f"needs both CPU routes; {kind}: {error}")
    keys = jax.random.split(jax.random.key(11), 4)
    params = nn.mlp_init(keys[0], (64, 128, 64, 10), dtype)
    x, target = mlp_inputs(params, keys[1], 1000, dtype), draw_uniform(keys[2], (1000, 10), dtype)
    dy = draw_uniform(keys[3], (1000, 10), dtype)

    def run():
        y, pullback = jax.vjp(nn.mlp_apply, params, x)
        return y, pullback(dy), jax.jit(nn.mlp_loss_and_grad)(params, x, target)

    results = {}
    for kind in ("vulkan", "cpu"):
        with slax.config.override(device_kind=kind):
            results[kind] = run()
    for got, want in zip(jax.tree.leaves(results["cpu"]), jax.tree.leaves(results["vulkan"])):
        assert relative_error(got, want) < RELATIVE_TOLERANCE[dtype]


@NO_KERNEL_RUNS
@pytest.mark.jax_version
def test_lists_are_refused_as_jax_numpy_refuses_them():
    """A list for x (or target) is refused naming the function and argument, as jax.numpy's
    functions refuse lists, rather than failing on a missing attribute."""
    params = nn.mlp_init(jax.random.key(0), (2, 8, 2))
    x = [[0.5, -0.25]]
    with pytest.raises(
        TypeError, match=r"slax\.nn\.mlp_apply: x must be a jax\.Array .*got a list.*jnp\.asarray\(x\)"
    ):
        nn.mlp_apply(params, x)
    with pytest.raises(TypeError, match=r"mlp_loss_and_grad: target must be a jax\.Array .*got a list"):
        nn.mlp_loss_and_grad(params, jnp.asarray(x), [[1.0, 0.0]])
