"""A narrow float16 network's fused loss and gradient on tensor cores, a warp per tile of 16 samples
(shaders/nn/warp_mma.slang): which networks and launches take it, and on a CUDA GPU, where it runs,
its results against the float32 reference and the per-sample kernel (mlp.slang), which runs with
tensor cores switched off. Its PTX: tests/test_ptx_launch.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import draw_uniform, mlp_inputs, relative_error
from _training import cast

import slax
from slax import nn
from slax._compile import kernel_parameters
from slax._device import get_device
from slax.nn import _backends as nn_backends
from slax.nn import _kernels as nn_kernels
from slax.nn import _warp_mma_kernels as nn_warp_mma
from slax.nn._architecture import Architecture
from slax.nn._kernels import kernel_layout, warp_mma_fits

ON_TENSOR_CORES = nn_backends.Platform("cuda", tensor_cores=True, capability=90)

NARROW = [(4, 16, 4), (3, 7, 5), (9, 12, 3), (16, 3, 16), (2, 8, 8, 1), (5, 9, 6, 2)]
"""Narrow networks whose layers fit the kernel (at most 16 wide): the polynomial network, layers
of 8 or fewer (mma.sync's k = 8 blocks), inputs and outputs wider than 8 (k = 16; two blocks of
outputs and of targets), weight gradients summed either way round (In x Out or Out x In, whichever
has fewer blocks), and three layers; widths off multiples of 8 (zero columns in the fragments)."""
TOLERANCE = 1e-2
"""Normwise relative error of the loss and gradients against the float32 reference (activations
rounded to half) and against the per-sample kernel: slax.testing's float16 tolerance. Both kernels
round activations to half, but their float sums run in different orders, so an activation can
round the other way (2^-11); and this kernel rounds each sample's gradient at a layer's output to
half where it multiplies (2^-11 of each product, more where it falls below half's smallest normal,
6e-5: the near-fit case below)."""


def _ids(sizes):
    return "-".join(map(str, sizes))


@pytest.mark.parametrize(
    ("sizes", "dtype", "fits"),
    [
        ((4, 16, 4), "float16", True),
        ((5, 9, 6, 2), "float16", True),
        ((16, 16, 16, 16), "float16", False),  # wide (816 parameters): the wide networks' kernels
        ((4, 16, 4), "float32", False),  # float32 stays on CUDA cores, exact to jax.grad
        ((4, 17, 4), "float16", False),  # a layer wider than 16
        ((1, 50, 1), "float16", False),  # narrow (101 parameters), but 50 wide
    ],
)
def test_which_networks_the_kernel_runs(sizes, dtype, fits):
    assert warp_mma_fits(sizes, dtype) == fits
    assert kernel_layout(sizes, tensor_cores=True, dtype=dtype).warp_mma == fits
    assert not kernel_layout(sizes, tensor_cores=False, dtype=dtype).warp_mma  # not without tensor cores
    arch, thread_sums = Architecture(sizes, dtype), nn_backends.ThreadSums()
    if thread_sums.unfit(arch, ON_TENSOR_CORES) is None:  # a specialisation of thread_sums, on tensor cores
        assert thread_sums.on_tensor_cores(arch, ON_TENSOR_CORES) == fits
        assert not thread_sums.on_tensor_cores(arch, nn_backends.Platform("cuda", False, 90))


def test_only_the_fused_loss_and_gradient_launches_more_threads():
    """The kernel's warps hold 64 registers a thread, so its launch keeps WARP_MMA_THREADS_WANTED
    threads (fewer samples each); the network's other gradient kernels run a sample per thread as
    before, and every launch's thread groups cover whole vmapped groups."""
    arch, thread_sums = Architecture((4, 16, 4), "float16"), nn_backends.ThreadSums()

    def launch(entry, samples, per_group):
        return thread_sums.gradient_launch(arch, ON_TENSOR_CORES, entry, samples, per_group)

    samples = 1 << 20
    fused = launch("mlp_loss_grad", samples, samples)
    assert fused.share == ("samples_per_thread", samples // nn_warp_mma.WARP_MMA_THREADS_WANTED)
    assert fused.blocks * nn_backends.GROUP_SIZE * fused.share[1] == samples
    per_sample = launch("mlp_backward_params", samples, samples).share[1]
    assert per_sample == samples // nn_kernels.THREADS_WANTED
    # vmapped groups of 200: one thread group each, 4 samples a thread, whatever the launch wants
    grouped = launch("mlp_loss_grad", samples, 200)
    assert (grouped.blocks, grouped.share) == (1, ("samples_per_thread", 4))


def test_every_device_kind_reflects_the_kernel(device_kind):
    """On the PTX route slax reads a kernel's parameters from SlangPy's reflection of it, on the
    device ``slax.config.reflection_device`` names: SlangPy's CPU device where no Vulkan driver is
    (tests/scripts/ptx_lowering.py on such a machine) or where ``SLAX_REFLECTION_DEVICE=cpu`` keeps
    SlangPy's CUDA device out of a profiled process. The C++ target has no wave operations and no
    group barriers, so the kernel must compile there too, if only to be reflected."""
    spec = nn_backends.kernel(Architecture((4, 16, 4), "float16"), "mlp_loss_grad", tensor_cores=True)
    assert "typealias WarpNetwork" in (spec.source or "")  # the warp tiles' kernel, not the per-sample one
    parameters = kernel_parameters(get_device(slax.DeviceKind(device_kind)), spec)
    assert [name for name, _ in parameters.pointers] == ["x", "target", "params", "partials"]
    assert [name for name, _ in parameters.scalars] == [
        "count",
        "samples_per_group",
        "blocks_per_group",
        "samples_per_thread",
        "loss_scale",
    ]


def _runs(params, x, target):
    """mlp_loss_and_grad over each group of x's leading axis (vmapped): each group's loss and
    gradients, with tensor cores on (twice) and off, each traced afresh (the switch is read when
    mlp_loss_and_grad is traced)."""
    runs = {}
    for name, tensor_cores in (("on", True), ("again", True), ("off", False)):
        with slax.config.override(tensor_cores=tensor_cores):
            function = jax.jit(jax.vmap(lambda *args: nn.mlp_loss_and_grad(*args), in_axes=(None, 0, 0)))
            leaves = jax.tree.leaves(function(params, x, target))
        runs[name] = [[leaf[k] for leaf in leaves] for k in range(x.shape[0])]
    return runs


def _targets(params, x, key, near_fit):
    """Targets for x: uniform in [-1, 1), errors of about 1; or the network's own outputs plus
    noise of 1e-3 (``near_fit``, as late in training), where each sample's gradients at the hidden
    layers' negative side (slope 0.01) fall below half's smallest normal, 6e-5."""
    if not near_fit:
        return draw_uniform(key, x.shape[:-1] + (params[-1]["bias"].shape[0],), "float16")
    outputs = nn.mlp_apply_reference(*cast((params, x), jnp.float32), storage_dtype="float16")
    return (outputs + 1e-3 * jax.random.normal(key, outputs.shape)).astype(jnp.float16)


@pytest.mark.parametrize("near_fit", [False, True], ids=["uniform", "near_fit"])
@pytest.mark.parametrize("threads_wanted", [1 << 16, 64])
@pytest.mark.parametrize("sizes", NARROW, ids=_ids)
def test_tensor_cores_match_the_reference_and_the_per_sample_kernel(
    sizes, threads_wanted, near_fit, device_kind, lowered, monkeypatch
):
    """On a CUDA GPU, the loss and gradients of two vmapped groups of 1000 samples, of one of 333
    and of one of 5 (tiles of 16 padded past a group's end; a sample a thread, or with few threads
    wanted 16, a warp then running 32 tiles of which the last part-filled) agree with the float32
    reference and with the per-sample kernel within TOLERANCE, and are the same bits on a second
    run. Near a fit only against the per-sample kernel: there each gradient sums errors of 1e-3
    that a half ulp of an output (5e-4) moves, so any two orders of the forward sums disagree. The
    reference, which sums in XLA's order, differed from both kernels by up to 0.68 (normwise, 16-3-16
    at 2^16 samples) where the two kernels agreed within 6.3e-3 (BENCHMARKS.md)."""
    if device_kind != "cuda":
        pytest.skip("JAX on a CUDA GPU runs the tensor-core kernel; elsewhere the per-sample kernel runs")
    assert kernel_layout(sizes, tensor_cores=True, dtype="float16").warp_mma
    monkeypatch.setattr(nn_warp_mma, "WARP_MMA_THREADS_WANTED", threads_wanted)
    keys = jax.random.split(jax.random.key(sum(sizes)), 3)
    params = nn.mlp_init(keys[0], sizes, "float16")
    for groups, batch in ((2, 1000), (1, 333), (1, 5)):
        x = mlp_inputs(params, keys[1], groups * batch, "float16").reshape(groups, batch, sizes[0])
        target = _targets(params, x, keys[2], near_fit)
        runs = _runs(params, x, target)
        for k in range(groups):
            want = jax.tree.leaves(
                jax.value_and_grad(nn.mlp_loss_reference)(
                    *cast((params, x[k], target[k]), jnp.float32), storage_dtype="float16"
                )
            )
            for on, again, off, reference in zip(
                runs["on"][k], runs["again"][k], runs["off"][k], want, strict=True
            ):
                assert np.array_equal(on, again), "the sums are not deterministic"
                assert near_fit or relative_error(on, reference) < TOLERANCE
                assert relative_error(on, off) < TOLERANCE
    assert {key[1:] for key in lowered} == {("mlp_loss_grad", True), ("mlp_loss_grad", False)}
