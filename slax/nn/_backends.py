"""The MLP's backends: each family of kernels that runs the MLP's operations, behind one interface,
in one registry, and the one rule that picks a backend for a call.

The operations are what the MLP's primitives lower to (slax/nn/_primitives.py):

- ``forward``: ``x, params -> y`` or, keeping the hidden activations a wide network's backward
  pass reads (slax/nn/_kernels.py, ``hidden_width``), ``-> y, hidden``;
- ``backward``: ``x, [hidden,] dy, params -> [dx,] gradients``, the gradients summed per group of
  the leading ``group_ndim`` axes (vmapped calls), ``dx`` only where something reads it;
- ``loss_grad``: ``x, target, params -> loss, gradients`` per group, the fused loss and gradient;
- ``hessian_sums`` (optional, :meth:`Backend.hessian_sums`): ``x, direction, dy, params ->``
  the parameters' part of each sample's Hessian of ``dy . network(x)`` along a direction in x,
  summed per group: what the gradient of an eikonal loss takes of the second derivative.

Each :class:`Backend` says whether it runs an :class:`Architecture` on a :class:`Platform` (and
why not), and runs the operations. The three Slang kernel families are :class:`KernelBackend`\\ s,
which run every operation the same way (:meth:`KernelBackend.gradient`) from what each family
defines: the parameter operands its kernels read, the launch of each entry point (threads, thread
groups, the scalar that says how much each runs) and its Slang specialisation (source):

- ``thread_sums``: narrow networks (their gradient sums fit a thread's registers), a sample per
  thread (``shaders/nn/thread_sums.slang``). On tensor cores (:attr:`Platform.tensor_cores`), a float16
  network with layers at most 16 wide runs its fused loss and gradient a warp per tile of 16
  samples (``shaders/nn/warp_mma.slang``): a specialisation of this backend, not a backend of its
  own, since its other operations are the per-sample kernels and its launches theirs.
- ``tiled``: wide networks, a tile of samples per thread group on SIMT cores
  (``shaders/nn/tiled.slang``), on every platform; for networks of LeakyReLU, ReLU and linear
  layers, its ``hessian_sums`` (``mlp_hessian_sums``, a source of its own whose tiles hold each
  layer's input tangent), as the ``tensor_cores`` tiles have.
- ``tensor_cores``: wide networks on CUDA GPUs of compute capability 8.0 and newer, the tiles'
  products as ``mma.sync`` (``shaders/nn/tensor_cores.slang``). A float16 network at most 64 wide
  runs every operation in warp tiles of halves instead, each warp's 16 samples in registers
  through every layer (``shaders/nn/wide_warp.slang``), and so does a float32 network at one TF32
  pass whose tiles and sums fit a thread's registers (``_wide_warp_kernels.TF32_REGISTERS``): the
  backend's kernels for it, with their
  own operands and launches (:meth:`KernelBackend.entry_operands`), a backward pass that
  recomputes the forward pass's activations rather than reading them, an input gradient without
  the parameters' sums, and, for networks of LeakyReLU, ReLU and linear layers, its
  ``hessian_sums`` (``mlp_hessian_sums``); the tiles have their own for the other networks of such
  layers (in float32, the forward pass and its tangent in one row product of twice the rows).
- ``warp_rows``: wide float16 networks whose weight-gradient sums pass a warp's registers, on CUDA
  GPUs of compute capability 8.0 and newer: the fused loss and gradient in warp tiles that write
  each layer's rows, whose weight gradients XLA's products sum (slax/nn/_warp_rows_kernels.py);
  its other operations are ``xla``'s.
- ``xla``: any network, on every platform: the operations as the plain-JAX twins
  (slax/nn/_reference.py), XLA's own matrix products.

:func:`choose` is the rule, one table (:data:`AUTO`): ``slax.config.mlp_backend`` forces a backend
(refusing one that does not fit, saying why); ``"auto"`` takes the first fused backend of the
table that runs the network and that no measured case of its row passes over (:class:`XlaWins`,
:class:`XlaWinsOnTensorCoreGpus`: where XLA's products beat its kernels), else ``xla``. The
primitives carry the user's :class:`BackendRequest` as a static parameter and apply the rule when
they lower, where the platform is known; :func:`slax.nn.describe` applies it for the user.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from slax._compile import GROUP_SIZE, KernelSpec
from slax._config import MLP_BACKENDS, LaunchRoutes, config
from slax._kernel_primitive import UINT_MAX, run_kernel
from slax._ptx_launch import compute_capability
from slax.nn import _kernels, _warp_mma_kernels, _warp_rows_kernels, _wide_warp_kernels
from slax.nn._activations import ACTIVATIONS
from slax.nn._architecture import Architecture
from slax.nn._kernels import THREAD_SUMS_LIMIT, mlp_source, parameter_offsets, warp_mma_fits
from slax.nn._precision import Float32Products, float32_products, twin_precision
from slax.nn._reference import apply_twin, backward_twin, forward_twin, loss_grad_twin
from slax.nn._tensor_core_kernels import tensor_core_layout, weight_fragments
from slax.nn._tiled_kernels import TILE_THREADS, TileLayout, tile_error, tile_layout, tiles_per_block

# --- what a call asks for, and where it runs -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BackendRequest:
    """The user's settings for the MLP's backend, as a call was traced with them: a static
    parameter of every MLP primitive (not a launch route: switching it retraces no other function).

    Attributes:
      backend: ``"auto"`` or a backend's name (``slax.config.mlp_backend``).
      tensor_cores: whether kernels may run on tensor cores (``slax.config.tensor_cores``).
      products: how a float32 network's products run on tensor cores: the call's ``precision``,
        else JAX's default matmul precision as the call was traced (slax/nn/_precision.py).
    """

    backend: str = "auto"
    tensor_cores: bool = True
    products: Float32Products = Float32Products.TF32

    @classmethod
    def current(cls, function: str = "mlp_apply", precision=None) -> BackendRequest:
        """The request of ``slax.config`` now, for a call of ``slax.nn.<function>`` with
        ``precision`` (None: JAX's default matmul precision now)."""
        return cls(config.mlp_backend, config.tensor_cores, float32_products(function, precision))


@dataclasses.dataclass(frozen=True)
class Platform:
    """Where a call lowers, as the backends need it.

    Attributes:
      name: JAX's platform, ``"cpu"`` or ``"cuda"``.
      tensor_cores: kernels may run on tensor cores here: a CUDA GPU of compute capability 8.0 or
        newer (TF32 and float16 ``mma.sync``; the kernels' PTX is for sm_80, which older GPUs
        refuse to load), and ``slax.config.tensor_cores`` on.
      capability: the CUDA GPU's compute capability (90 for sm_90); 0 elsewhere.
      products: how a float32 network's products run: as the request asks on tensor cores, else
        float32's (SIMT cores and CPUs have no TF32).
    """

    name: str
    tensor_cores: bool = False
    capability: int = 0
    products: Float32Products = Float32Products.FLOAT32

    @classmethod
    def of(cls, name: str, request: BackendRequest) -> Platform:
        if name != "cuda":
            return cls(name)
        capability = compute_capability()
        tensor_cores = request.tensor_cores and capability >= 80
        products = request.products if tensor_cores else Float32Products.FLOAT32
        return cls(name, tensor_cores, capability, products)

    def __str__(self) -> str:
        return f"CUDA sm_{self.capability}" if self.name == "cuda" else self.name.upper()


# --- the interface --------------------------------------------------------------------------------


class Backend(abc.ABC):
    """A way to run the MLP's operations (see the module's docstring). Results are as the
    primitives' abstract evaluation gives them: outputs of the network's dtype, gradients and
    losses float32."""

    name: ClassVar[str]

    @abc.abstractmethod
    def unfit(self, arch: Architecture, platform: Platform) -> str | None:
        """Why this backend cannot run ``arch`` on ``platform``, or None where it can."""

    @abc.abstractmethod
    def summary(self, arch: Architecture, platform: Platform, operation: str) -> str:
        """How it runs ``operation`` (one of :data:`OPERATIONS`) of ``arch`` on ``platform``, for
        :func:`slax.nn.describe`."""

    @abc.abstractmethod
    def forward(self, arch, platform, x, params, keep_hidden: bool, routes: LaunchRoutes) -> list:
        """``[y]``, or with ``keep_hidden`` ``[y, hidden]``: ``hidden`` what this backend's backward
        reads of them (a backend whose backward recomputes them may return zeros, which nothing reads
        and XLA drops; the primitives run both on one backend, :func:`choose`'s for the same call)."""

    @abc.abstractmethod
    def backward(
        self, arch, platform, data, params, group_ndim, input_gradient, param_output, routes
    ) -> list:
        """``data``: ``[x, *hidden, dy]``; ``[dx,] [*gradients]`` (``dx`` with ``input_gradient``, the
        gradients with ``param_output``: the input gradient inside an eikonal loss reads none)."""

    @abc.abstractmethod
    def loss_grad(self, arch, platform, x, target, params, group_ndim, loss_scale, routes) -> list:
        """``[loss, *gradients]``, per group."""

    def loss_input_grad(self, arch, platform, x, target, params, group_ndim, loss_scale, routes) -> list:
        """``[loss, dx, *gradients]``: :meth:`loss_grad`'s, and ``dx``, the loss's gradient at each
        sample's input (``x``'s shape and dtype). Here the backend's forward and backward passes,
        as ``jax.grad`` of the loss written with ``slax.nn.mlp_apply`` runs them: the residual
        ``y - target`` enters the backward pass as dy (in the network's dtype: a mean loss's
        factor ``2 loss_scale`` would push half's dy below its normal range), and the factor
        multiplies its results in float32. A backend with a kernel for all of it overrides this."""
        keep_hidden = _kernels.hidden_width(arch.sizes) > 0
        y, *hidden = self.forward(arch, platform, x, params, keep_hidden, routes)
        residual = y.astype(jnp.float32) - target.astype(jnp.float32)
        loss = loss_scale * jnp.sum(residual**2, axis=tuple(range(group_ndim, x.ndim)))
        dy = residual.astype(arch.dtype)
        dx, *grads = self.backward(arch, platform, [x, *hidden, dy], params, group_ndim, True, True, routes)
        factor = 2.0 * loss_scale
        dx = (dx.astype(jnp.float32) * factor).astype(arch.dtype)
        return [loss, dx, *(g * factor for g in grads)]

    def second_order_summary(self, arch: Architecture, platform: Platform) -> str:
        """How second derivatives of ``arch`` run on ``platform``, for :func:`slax.nn.describe`."""
        return (
            "first-order launches as jax.grad's, and what a second derivative adds in the plain-JAX "
            "twin's products"
        )

    def hessian_sums(self, arch, platform, x, direction, dy, params, group_ndim, routes) -> list | None:
        """The parameters' part of each sample's Hessian of ``dy . network(x)`` times ``direction``
        (a direction in x alone, like ``x``), summed per group (float32, each layer's bias then
        weight): what the gradient of an eikonal loss takes of the second derivative. A kernel's, or
        None where the backend has none for ``arch`` on ``platform`` (the primitive then runs the
        plain-JAX twin, slax/nn/_primitives.py)."""
        return None


@dataclasses.dataclass(frozen=True)
class Launch:
    """A gradient kernel's launch over each vmapped group.

    Attributes:
      threads: threads per thread group.
      blocks: thread groups per vmapped group, each writing one row of partial sums.
      share: the kernel's scalar saying how much each runs: ``("samples_per_thread", n)`` or
        ``("tiles_per_block", n)``.
      reach: the sample positions a vmapped group's thread groups step through, the padding of the
        last included: the kernels number them with 32-bit uints.
    """

    threads: int
    blocks: int
    share: tuple[str, int]
    reach: int


class KernelBackend(Backend):
    """A family of Slang kernels, whose entry points (slax/nn/_kernels.py) run the operations:
    ``mlp_forward`` / ``mlp_forward_hidden``, ``mlp_backward`` / ``mlp_backward_params`` and
    ``mlp_loss_grad`` (and, in the wide networks' families, ``mlp_hessian_sums``). Each thread group of a
    gradient kernel writes one row of partial sums (the parameters' gradients, then the loss) in a
    fixed order, and XLA adds a group's rows: results are bit-identical from run to run."""

    @abc.abstractmethod
    def operands(self, arch: Architecture, platform: Platform, params) -> list[jax.Array]:
        """The parameter operands its kernels take after the data on ``platform``, from each
        layer's bias then weight (one small XLA fusion each, shared by a step's launches)."""

    @abc.abstractmethod
    def forward_threads(self, arch: Architecture, platform: Platform, samples: int) -> int:
        """Threads a forward launch over ``samples`` runs."""

    @abc.abstractmethod
    def gradient_launch(
        self, arch: Architecture, platform: Platform, entry: str, samples: int, per_group: int
    ) -> Launch:
        """The launch of gradient kernel ``entry`` over ``samples`` in vmapped groups of ``per_group``."""

    @abc.abstractmethod
    def on_tensor_cores(self, arch: Architecture, platform: Platform) -> bool:
        """Its Slang specialisation for ``arch`` on ``platform``: the source on tensor cores, or
        the one every device runs (slax/nn/_kernels.py, ``mlp_source``)."""

    def kernel(self, arch: Architecture, platform: Platform, entry: str) -> KernelSpec:
        """Kernel ``entry`` of its specialisation for ``arch`` on ``platform``."""
        return kernel(arch, entry, self.on_tensor_cores(arch, platform), platform.products)

    def entry_operands(self, arch: Architecture, platform: Platform, entry: str, params) -> list[jax.Array]:
        """The parameter operands kernel ``entry`` takes: :meth:`operands`, unless a family's
        kernel for that entry reads its own."""
        return self.operands(arch, platform, params)

    def forward(self, arch, platform, x, params, keep_hidden, routes):
        samples = math.prod(x.shape[:-1])
        count = self.forward_threads(arch, platform, samples)
        shapes = [x.shape[:-1] + (arch.sizes[-1],)]
        if keep_hidden:
            shapes.append(x.shape[:-1] + (_kernels.hidden_width(arch.sizes),))
        return run_kernel(
            self.kernel(arch, platform, "mlp_forward_hidden" if keep_hidden else "mlp_forward"),
            [x, *self.operands(arch, platform, params)],
            tuple((shape, arch.dtype) for shape in shapes),
            count,
            (("count", count), ("samples", samples)),
            routes=routes,
        )

    input_gradient_kernel: ClassVar[bool] = False
    """Whether the family has ``mlp_input_gradient``: ``mlp_backward``'s operands and results, dx
    alone computed (where nothing reads the parameters' gradients, ``param_output`` off)."""

    def backward(self, arch, platform, data, params, group_ndim, input_gradient, param_output, routes):
        x = data[0]
        entry = "mlp_backward" if input_gradient else "mlp_backward_params"
        if input_gradient and not param_output and self.input_gradient_kernel:
            entry = "mlp_input_gradient"
        extra = [(x.shape, arch.dtype)] if input_gradient else []
        _, *results = self.gradient(arch, platform, entry, data, params, group_ndim, extra, (), routes)
        return results if param_output else results[: int(input_gradient)]

    def loss_grad(self, arch, platform, x, target, params, group_ndim, loss_scale, routes):
        scalars = (("loss_scale", float(loss_scale)),)
        return self.gradient(
            arch, platform, "mlp_loss_grad", [x, target], params, group_ndim, [], scalars, routes
        )

    def gradient(self, arch, platform, entry, data, params, group_ndim, extra_results, scalars, routes):
        """Launches gradient kernel ``entry`` on ``data`` (per-sample arrays, ``x`` first) and the
        parameter operands, and adds up each group's rows of partial sums: ``[loss per group,
        *extra results, *parameter gradients]``."""
        x = data[0]
        groups = math.prod(x.shape[:group_ndim])
        per_group = math.prod(x.shape[:-1]) // max(groups, 1)
        launch = self.gradient_launch(arch, platform, entry, groups * per_group, per_group)
        if launch.reach > UINT_MAX:
            raise ValueError(
                f"slax: kernel {entry!r}: its thread groups step through {launch.reach:,} sample "
                f"positions for {per_group:,} samples (the last group padded), past the 32-bit uint "
                f"indices it uses: at most {UINT_MAX:,}. Split the batch over several calls, e.g. "
                "jax.lax.map over chunks of it."
            )
        count = groups * launch.blocks * launch.threads  # 0 for an empty batch: no launch
        sums = parameter_offsets(arch.sizes)[1] + 1
        partial, *extra = run_kernel(
            self.kernel(arch, platform, entry),
            [*data, *self.entry_operands(arch, platform, entry, params)],
            (((groups * launch.blocks, sums), "float32"), *extra_results),
            count,
            (
                ("count", count),
                ("samples_per_group", per_group),
                ("blocks_per_group", launch.blocks),
                launch.share,
                *scalars,
            ),
            routes=routes,
        )
        summed = partial.reshape(x.shape[:group_ndim] + (launch.blocks, sums)).sum(axis=group_ndim)
        return [summed[..., -1], *extra, *unpacked(summed, arch.sizes, x.shape[:group_ndim])]


HESSIAN_ENTRY = "mlp_hessian_sums"
"""The entry point of :meth:`Backend.hessian_sums`' kernels; a tile family's has a source and
layout of its own (slax/nn/_kernels.py, ``tangents``)."""


@functools.cache
def kernel(
    arch: Architecture, entry: str, tensor_cores: bool, products: Float32Products = Float32Products.FLOAT32
) -> KernelSpec:
    """Kernel ``entry`` of ``arch``'s Slang source, specialised for tensor cores (their float32
    products as ``products``) or not: one source per specialisation, whichever family asks (each
    family's entry points are the source's), and the Hessian kernel's own for :data:`HESSIAN_ENTRY`."""
    source = mlp_source(
        arch.sizes, arch.dtype, tensor_cores, arch.activations, entry == HESSIAN_ENTRY, products
    )
    return KernelSpec(entry, source=source)


def power_of_two_normalised(values: jax.Array, group_ndim: int) -> tuple[jax.Array, jax.Array]:
    """``values`` (groups, then samples and columns) times a power of two per group of the
    ``group_ndim`` leading axes, raising a group whose largest magnitude is below 0.5 into [0.5, 1)
    (a group already at or past 0.5, all zero or holding a value not finite stays as it is; one of
    float32 values all below 2^-126 rises by 2^126), in their own dtype; and the exponents ``e``
    (int32, per group, from -126 to 0) with ``values == ldexp(scaled, e)``. Exact: scaling up by a
    power of two keeps every significand, where scaling down would push a group's smallest values
    into half's subnormals. The power is a float32 factor per group, one product a value: the same
    values as ``jnp.ldexp``'s, which takes about 20 integer operations a value."""
    wide = values.astype(jnp.float32)
    peak = jnp.max(jnp.abs(wide), axis=tuple(range(group_ndim, values.ndim)), initial=0.0)
    _, exponent = jnp.frexp(jnp.where(jnp.isfinite(peak), peak, 0.0))
    exponent = jnp.clip(exponent, -126, 0).astype(jnp.int32)
    return (wide * _grouped(powers_of_two(-exponent, flat=False), values.ndim)).astype(values.dtype), exponent


def powers_of_two(exponent: jax.Array, flat: bool = True) -> jax.Array:
    """``2 ** exponent`` (from -126 to 126: normal float32 numbers, each exact) as float32,
    flattened unless ``flat`` is off: the scales a kernel multiplies a result by in float32 before
    rounding it to half, as :func:`scaled_back` would after it (the same values: both products are
    exact wherever the result is a normal float32), without a pass of XLA's over the result."""
    scales = jnp.ldexp(jnp.ones(exponent.shape, jnp.float32), exponent)
    return scales.reshape(-1) if flat else scales


def scaled_back(value: jax.Array, exponent: jax.Array) -> jax.Array:
    """``value`` (the groups' axes first, as ``exponent``'s) times 2 ** ``exponent`` per group, in
    its own dtype: :func:`power_of_two_normalised`'s inverse, exact wherever the result is normal."""
    scales = _grouped(powers_of_two(exponent, flat=False), value.ndim)
    return (value.astype(jnp.float32) * scales).astype(value.dtype)


def _unread_scales() -> jax.Array:
    """The ``dx_scales`` operand of a float32 network's warp tiles, which read none
    (``ScaledGradients`` of ``shaders/nn/wide_warp_tf32.slang``)."""
    return jnp.ones((1,), jnp.float32)


def _grouped(per_group: jax.Array, ndim: int) -> jax.Array:
    """A per-group array with axes of 1 appended up to ``ndim``, to broadcast over each group."""
    return per_group.reshape(per_group.shape + (1,) * (ndim - per_group.ndim))


WARP_TILE_ENTRIES = (
    "mlp_forward",
    "mlp_backward",
    "mlp_backward_params",
    "mlp_input_gradient",
    "mlp_loss_grad",
    "mlp_loss_grad_input",
    "mlp_hessian_sums",
)
"""The entry points of the warp tiles (``shaders/nn/wide_warp.slang``)."""


@functools.cache
def wide_warp_kernel(arch: Architecture, entry: str) -> KernelSpec:
    """Kernel ``entry`` (one of :data:`WARP_TILE_ENTRIES`) of ``arch`` on the warp tiles
    (slax/nn/_wide_warp_kernels.py): a float32 network's at one TF32 pass."""
    activations = tuple(ACTIVATIONS[name].slang for name in arch.activations)
    source = _wide_warp_kernels.wide_warp_source(arch.sizes, activations, arch.dtype)
    return KernelSpec(entry, source=source)


def packed(params) -> jax.Array:
    """The parameters as the kernels read them: one flat float32 array (slax/nn/_kernels.py). Half
    parameters convert exactly, in the same XLA fusion as the concatenation. Where ``params`` are
    slices of one float32 vector in this layout (``ravel_pytree``'s), XLA folds the concatenation
    of those slices back into that vector: nothing runs."""
    return jnp.concatenate([p.reshape(-1).astype(jnp.float32) for p in params])


def unpacked(flat: jax.Array, sizes, leading: tuple[int, ...]) -> list[jax.Array]:
    """Each layer's bias and weight arrays from the last axis of the flat layout."""
    offsets, _ = parameter_offsets(sizes)
    arrays = []
    for start, (n_in, n_out) in zip(offsets, zip(sizes[:-1], sizes[1:])):
        arrays.append(flat[..., start : start + n_out].reshape(leading + (n_out,)))
        arrays.append(
            flat[..., start + n_out : start + n_out + n_in * n_out].reshape(leading + (n_out, n_in))
        )
    return arrays


def _parameter_count(arch: Architecture) -> int:
    return parameter_offsets(arch.sizes)[1]


def _narrow(arch: Architecture) -> bool:
    """Whether a thread's registers hold the network's gradient sums and loss: the kernels' own
    rule (slax/nn/_kernels.py, ``KernelLayout.thread_sums``)."""
    return _kernels.kernel_layout(arch.sizes).thread_sums


def _unfit_wide(arch: Architecture) -> str | None:
    """Why a wide networks' family does not run ``arch``: it is narrow."""
    if _narrow(arch):
        return (
            f"its {_parameter_count(arch)} parameters' gradient sums fit a thread's registers: "
            "thread_sums runs narrow networks"
        )
    return None


def _no_tensor_cores(platform: Platform) -> str | None:
    """Why kernels on tensor cores do not run on ``platform``, or None where they do."""
    if platform.name != "cuda":
        return f"it runs on CUDA GPUs, and this call runs on {platform}"
    if not platform.tensor_cores:
        if platform.capability < 80:
            return f"it needs a GPU of compute capability 8.0 or newer, and this is sm_{platform.capability}"
        return "slax.config.tensor_cores is off"
    return None


def _kept_input(arch: Architecture, reason: str) -> str | None:
    """The refusal of a family whose kernels take a hidden layer's kept values for its output
    (``reason``: why they do), where a hidden activation keeps its input z instead."""
    kept_inputs = [name for name in arch.activations[:-1] if ACTIVATIONS[name].keeps_input]
    if kept_inputs:
        return (
            f"a hidden {kept_inputs[0]} layer keeps its input z, and {reason} (shaders/nn/activations.slang)"
        )
    return None


def linear_pieces(arch: Architecture) -> bool:
    """Whether every activation of ``arch`` is linear pieces (its second derivative zero): the
    Hessian kernels' networks."""
    return all(ACTIVATIONS[name].linear_pieces for name in arch.activations)


# --- the kernel families ----------------------------------------------------------------------------


class ThreadSums(KernelBackend):
    name = "thread_sums"

    def unfit(self, arch, platform):
        if _narrow(arch):
            return None
        return (
            f"its {_parameter_count(arch)} parameters' gradient sums exceed a thread's registers "
            f"(at most {THREAD_SUMS_LIMIT - 1} parameters)"
        )

    def summary(self, arch, platform, operation):
        if operation == "loss_grad" and self.on_tensor_cores(arch, platform):
            return "on tensor cores, a warp per tile of 16 samples, gradient sums in registers"
        return "a sample per thread, gradient sums in registers"

    def on_tensor_cores(self, arch, platform):
        return platform.tensor_cores and warp_mma_fits(arch.sizes, arch.dtype)

    def operands(self, arch, platform, params):
        return [packed(params)]

    def forward_threads(self, arch, platform, samples):
        return -(-samples // GROUP_SIZE) * GROUP_SIZE  # whole thread groups: they stage the parameters

    def gradient_launch(self, arch, platform, entry, samples, per_group):
        warp_tiles = entry == "mlp_loss_grad" and self.on_tensor_cores(arch, platform)
        each = samples_per_thread(samples, per_group, warp_tiles)
        blocks = -(-per_group // (GROUP_SIZE * each))
        return Launch(GROUP_SIZE, blocks, ("samples_per_thread", each), blocks * each * GROUP_SIZE)


def samples_per_thread(samples: int, per_group: int, warp_tiles: bool = False) -> int:
    """Samples each thread of a ``thread_sums`` gradient launch over ``samples`` in all, in vmapped
    groups of ``per_group``, runs: enough to keep near THREADS_WANTED threads (or
    WARP_MMA_THREADS_WANTED for the warp tiles' kernel, ``warp_tiles``), but no more than a thread
    group needs to cover its group (a thread group serves one group: per-example gradients of
    single samples run one each)."""
    threads = _warp_mma_kernels.WARP_MMA_THREADS_WANTED if warp_tiles else _kernels.THREADS_WANTED
    wanted = min(_kernels.MAX_SAMPLES_PER_THREAD, math.ceil(samples / threads))
    return max(1, min(wanted, math.ceil(per_group / GROUP_SIZE)))


class _Tiles(KernelBackend):
    """Wide networks' kernels, a tile of samples per thread group of TILE_THREADS
    (slax/nn/_tiled_kernels.py); each family lays its tiles out its own way (:meth:`layout`).
    Both families have a Hessian kernel (``mlp_hessian_sums``, :meth:`hessian_sums`) for networks
    of activations whose second derivatives are zero."""

    input_gradient_kernel = True

    @abc.abstractmethod
    def layout(self, arch: Architecture, tangents: bool = False):
        """Its tiles' layout for ``arch`` (with ``tangents``, its Hessian kernel's), or None where
        one does not fit."""

    def forward_threads(self, arch, platform, samples):
        return -(-samples // self.layout(arch).samples) * TILE_THREADS

    def gradient_launch(self, arch, platform, entry, samples, per_group):
        tile = self.layout(arch, entry == HESSIAN_ENTRY)
        return tile_launch(tile.samples, tile.tiles_per_block(samples, per_group), per_group)

    def hessian_kernel(self, arch: Architecture, platform: Platform) -> str | None:
        """How its Hessian kernel runs ``arch`` on ``platform`` (for :func:`slax.nn.describe`), or
        None where it has none: networks it runs whose activations are linear pieces (their second
        derivatives zero: the bias parts are then zero, and the weights' are each layer's output
        gradient times its input's tangent), and which its family's Hessian tiles fit
        (:meth:`hessian_tiles`)."""
        if self.unfit(arch, platform) or not linear_pieces(arch):
            return None
        return self.hessian_tiles(arch, platform)

    def hessian_tiles(self, arch: Architecture, platform: Platform) -> str | None:
        """Which of the family's Hessian kernels runs ``arch``, a network it runs whose activations
        are linear pieces, or None where its tiles do not fit with their tangents."""
        tile = self.layout(arch, True)
        if tile is None:
            return None
        return f"the {self.name} kernels' Hessian kernel, tiles of {tile.samples} samples"

    def second_order_summary(self, arch, platform):
        kernel = self.hessian_kernel(arch, platform)
        if kernel is None:
            return super().second_order_summary(arch, platform)
        return (
            "first-order launches as jax.grad's; of what a second derivative adds, the parameters' "
            f"part along a direction in x (an eikonal loss's gradient) in {kernel}, its part in x "
            "zero (linear pieces), the rest in the plain-JAX twin's products"
        )

    def hessian_sums(self, arch, platform, x, direction, dy, params, group_ndim, routes):
        """``mlp_hessian_sums``, where :meth:`hessian_kernel` says it runs. The bias parts are zero
        (the kernel's bias columns hold dz's sums, which its backward pass shares with the
        first-order kernels). A float16 network's direction and ``dy`` enter scaled by powers of two,
        each group's largest to [0.5, 1), and its sums leave unscaled (both exact): its tiles hold
        both as halves, and round each layer's tangent and output gradient to half (the warp tiles),
        where a mean loss's cotangents over many samples (an eikonal term's direction, about 1e-6 at
        2^18 samples) would fall below half's normal range. A float32 network's tiles hold floats,
        whose range those cotangents are far inside: they enter as they are."""
        if self.hessian_kernel(arch, platform) is None:
            return None
        halves = arch.dtype == "float16"
        if halves:
            direction, direction_exponent = power_of_two_normalised(direction, group_ndim)
            dy, dy_exponent = power_of_two_normalised(dy, group_ndim)
        _, *sums = self.gradient(
            arch, platform, HESSIAN_ENTRY, [x, direction, dy], params, group_ndim, [], (), routes
        )
        if halves:
            exponent = direction_exponent + dy_exponent  # per group
            sums = [scaled_back(s, exponent) for s in sums]
        return [jnp.zeros_like(s) if k % 2 == 0 else s for k, s in enumerate(sums)]


def tile_launch(tile_samples: int, each: int, per_group: int, threads: int = TILE_THREADS) -> Launch:
    """The launch of thread groups of ``threads`` over vmapped groups of ``per_group`` samples,
    each running ``each`` tiles of ``tile_samples``."""
    blocks = -(-per_group // (tile_samples * each))
    return Launch(threads, blocks, ("tiles_per_block", each), blocks * each * tile_samples)


class Tiled(_Tiles):
    name = "tiled"

    def layout(self, arch, tangents=False) -> TileLayout | None:
        return tile_layout(arch.sizes, tangents)

    def unfit(self, arch, platform):
        return _unfit_wide(arch) or tile_error(arch.sizes)

    def summary(self, arch, platform, operation):
        return f"tiles of {self.layout(arch).samples} samples per thread group on SIMT cores"

    def on_tensor_cores(self, arch, platform):
        return False

    def operands(self, arch, platform, params):
        """The packed parameters, and the same with every weight transposed, which the forward
        pass reads along its rows."""
        return [packed(params), packed([p.T if p.ndim == 2 else p for p in params])]


class TensorCores(_Tiles):
    name = "tensor_cores"

    def layout(self, arch, tangents=False):
        return tensor_core_layout(arch.sizes, arch.dtype, tangents)

    def unfit(self, arch, platform):
        if _no_tensor_cores(platform) or _unfit_wide(arch):
            return _no_tensor_cores(platform) or _unfit_wide(arch)
        if self.layout(arch) is None:
            return (
                "its tile does not fit 48 KiB of group-shared memory, or its weight gradients 96 "
                "registers a thread (slax/nn/_tensor_core_kernels.py)"
            )
        return _kept_input(arch, "the tensor-core products read a hidden layer's kept tile as their input")

    def summary(self, arch, platform, operation):
        if self._on_warp_tiles(arch, platform, "mlp_" + operation):
            group = _wide_warp_kernels.group_samples(arch.sizes, arch.dtype)
            products = "TF32" if arch.dtype == "float32" else "float16"
            return (
                f"a warp per tile of 16 samples in registers through every layer as {products} mma.sync, "
                f"{group} samples per thread group sharing the weight gradient"
            )
        products = f" ({platform.products.value})" if arch.dtype == "float32" else ""
        return f"tiles of {self.layout(arch).samples} samples per thread group as mma.sync{products}"

    def on_tensor_cores(self, arch, platform):
        return True

    @staticmethod
    def wide_warp(arch: Architecture, platform: Platform) -> bool:
        """Whether its kernels for ``arch`` on ``platform`` are the warp tiles'
        (``shaders/nn/wide_warp.slang``): float16 networks at most 64 wide, and float32 ones whose
        products are one TF32 pass where their tiles fit a thread's registers."""
        return _wide_warp_kernels.wide_warp_fits(arch.sizes, arch.dtype, platform.products)

    def _on_warp_tiles(self, arch: Architecture, platform: Platform, entry: str) -> bool:
        """Whether kernel ``entry`` of ``arch`` is the warp tiles': its own source, operands and launch."""
        return entry in WARP_TILE_ENTRIES and self.wide_warp(arch, platform)

    def kernel(self, arch, platform, entry):
        if self._on_warp_tiles(arch, platform, entry):
            return wide_warp_kernel(arch, entry)
        return super().kernel(arch, platform, entry)

    def hessian_tiles(self, arch, platform):
        """The warp tiles' Hessian kernel for the networks they run, else the tensor-core tiles'."""
        if self.wide_warp(arch, platform):
            return "the warp tiles' Hessian kernel"
        return super().hessian_tiles(arch, platform)

    def forward(self, arch, platform, x, params, keep_hidden, routes):
        """On the warp tiles, ``mlp_forward``; the hidden activations' place holds zeros, since the
        warp tiles' backward recomputes them in registers."""
        if not self.wide_warp(arch, platform):
            return super().forward(arch, platform, x, params, keep_hidden, routes)
        y = self._warp_tiles(arch, platform, "mlp_forward", [x], params, arch.sizes[-1], routes)
        if not keep_hidden:
            return [y]
        return [y, jnp.zeros(x.shape[:-1] + (_kernels.hidden_width(arch.sizes),), arch.dtype)]

    def backward(self, arch, platform, data, params, group_ndim, input_gradient, param_output, routes):
        """On the warp tiles, from ``x`` (the forward pass again, in registers) and ``dy``. A float16
        network's dy enters scaled up by a power of two per group (:func:`power_of_two_normalised`;
        the results leave unscaled): the tiles round each layer's output gradient to half, where a
        mean loss's cotangents over many samples (2 / N of a residual: 8e-6 at 2^18) lie near or
        below half's normal range (6e-5). The kernels scale dx back themselves
        (:func:`powers_of_two`), the parameters' sums are scaled back here. A float32 network's
        tiles hold floats, whose range those cotangents are far inside: dy enters as it is (the
        kernels read no scales). The input gradient alone (``param_output`` off) runs
        ``mlp_input_gradient``, a warp per tile with no sums, its dy scaled per sample (no sum mixes
        samples there)."""
        if not self.wide_warp(arch, platform):
            return super().backward(
                arch, platform, data, params, group_ndim, input_gradient, param_output, routes
            )
        x, dy = data[0], data[-1]
        halves = arch.dtype == "float16"
        if not param_output:
            if not input_gradient:
                return []
            scales = _unread_scales()
            if halves:
                dy, exponent = power_of_two_normalised(dy, dy.ndim - 1)
                scales = powers_of_two(exponent)
            entry = "mlp_input_gradient"
            return [self._warp_tiles(arch, platform, entry, [x, dy, scales], params, arch.sizes[0], routes)]
        if not halves:
            data = [x, dy, _unread_scales()] if input_gradient else [x, dy]
            return super().backward(arch, platform, data, params, group_ndim, input_gradient, True, routes)
        dy, exponent = power_of_two_normalised(dy, group_ndim)
        data = [x, dy, powers_of_two(exponent)] if input_gradient else [x, dy]
        results = super().backward(arch, platform, data, params, group_ndim, input_gradient, True, routes)
        dx = results[: int(input_gradient)]
        return dx + [scaled_back(r, exponent) for r in results[len(dx) :]]

    def loss_input_grad(self, arch, platform, x, target, params, group_ndim, loss_scale, routes):
        """On the warp tiles, one launch (``mlp_loss_grad_input``): the loss, its gradients and dx
        from each tile's forward pass in registers."""
        if not self._on_warp_tiles(arch, platform, "mlp_loss_grad_input"):
            return super().loss_input_grad(arch, platform, x, target, params, group_ndim, loss_scale, routes)
        scalars = (("loss_scale", float(loss_scale)),)
        entry, dx = "mlp_loss_grad_input", [(x.shape, arch.dtype)]
        return self.gradient(arch, platform, entry, [x, target], params, group_ndim, dx, scalars, routes)

    def _warp_tiles(self, arch, platform, entry, data, params, width, routes) -> jax.Array:
        """Kernel ``entry`` of the warp tiles with no sums (a warp per tile of 16 samples, or
        ``FORWARD_TILES`` of them for ``mlp_forward``) on ``data`` (per-sample arrays, ``x``
        first): its per-sample result, ``width`` values a sample."""
        samples = math.prod(data[0].shape[:-1])
        tiles = _wide_warp_kernels.FORWARD_TILES[arch.dtype] if entry == "mlp_forward" else 1
        count = _wide_warp_kernels.warp_tile_threads(arch.sizes, samples, arch.dtype, tiles)
        (result,) = run_kernel(
            wide_warp_kernel(arch, entry),
            [*data, *self.entry_operands(arch, platform, entry, params)],
            ((data[0].shape[:-1] + (width,), arch.dtype),),
            count,
            (("count", count), ("samples", samples)),
            routes=routes,
        )
        return result

    def operands(self, arch, platform, params):
        """The packed parameters, and the weights as mma.sync B fragments (in pieces for
        ``platform.products``)."""
        return [packed(params), weight_fragments(params[1::2], arch.dtype, platform.products)]

    def entry_operands(self, arch, platform, entry, params):
        """The warp tiles' kernels read the weights as their format's B fragments."""
        if self._on_warp_tiles(arch, platform, entry):
            flat = packed(params)
            return [flat, _wide_warp_kernels.warp_fragments(flat, arch.sizes, arch.dtype)]
        return self.operands(arch, platform, params)

    def gradient_launch(self, arch, platform, entry, samples, per_group):
        if not self._on_warp_tiles(arch, platform, entry):
            return super().gradient_launch(arch, platform, entry, samples, per_group)
        tile = _wide_warp_kernels.group_samples(arch.sizes, arch.dtype)
        threads = 32 * _wide_warp_kernels.group_warps(arch.sizes, arch.dtype)
        return tile_launch(tile, tiles_per_block(tile, samples, per_group), per_group, threads)


# --- XLA ----------------------------------------------------------------------------------------------


FLOAT32_ON_TENSOR_CORES = jax.lax.DotAlgorithmPreset.TF32_TF32_F32_X3
"""The ``xla`` backend's float32 products at float32's accuracy where tensor cores may run
(:attr:`Platform.tensor_cores`, ``HIGHEST``): three TF32 products a product (each operand split
into two TF32 parts; the parts' product of the two small ones dropped), about 2^-21 relative, as
the tensor-core tiles' own (3xTF32). Full float32 products run on the SIMT cores: the 128-wide
layers' products are bound by their arithmetic there. Measured on an H100 (BENCHMARKS.md, wide
networks in float32 on XLA): 32-128x4-16 trained in 2979 us a step at 2^18 samples against 3277 us
at full float32, 32-64x8-16 in 2504 against 2745 us."""


def xla_products(arch: Architecture, platform: Platform):
    """The precision of the ``xla`` backend's matrix products for ``arch`` on ``platform``:
    :data:`FLOAT32_ON_TENSOR_CORES` for float32 networks at float32's accuracy on GPUs whose tensor
    cores slax may use, else the twins' (slax/nn/_precision.py, ``twin_precision``: XLA's
    ``DEFAULT``, TF32 on tensor cores, for float32 networks asking for TF32 and for float16 ones)."""
    if arch.dtype == "float32" and platform.tensor_cores and platform.products is Float32Products.FLOAT32:
        return FLOAT32_ON_TENSOR_CORES
    return twin_precision(arch.dtype, platform.products)


class Xla(Backend):
    name = "xla"

    def unfit(self, arch, platform):
        return None

    def summary(self, arch, platform, operation):
        on_tensor_cores = arch.dtype == "float32" and platform.tensor_cores
        products = f" in {platform.products.value}" if on_tensor_cores else ""
        return f"XLA's own matrix products{products} (the plain-JAX twin, slax/nn/_reference.py)"

    def forward(self, arch, platform, x, params, keep_hidden, routes):
        precision = xla_products(arch, platform)
        if keep_hidden:
            return forward_twin(
                x, *params, dtype=arch.dtype, activations=arch.activations, precision=precision
            )
        return [apply_twin(x, params, arch.dtype, arch.activations, precision)]

    def backward(self, arch, platform, data, params, group_ndim, input_gradient, param_output, routes):
        x, dy = data[0], data[-1]  # the hidden activations between them: the twin recomputes them
        precision = xla_products(arch, platform)
        results = backward_twin(
            x, dy, params, arch.dtype, arch.activations, group_ndim, input_gradient, precision
        )
        return results if param_output else results[: int(input_gradient)]  # XLA drops the sums' products

    def loss_grad(self, arch, platform, x, target, params, group_ndim, loss_scale, routes):
        return loss_grad_twin(
            x,
            target,
            params,
            arch.dtype,
            arch.activations,
            group_ndim,
            loss_scale,
            xla_products(arch, platform),
        )


class WarpRows(Xla):
    """Wide float16 networks whose weight-gradient sums pass a warp's registers (128-wide layers,
    eight 64-wide ones), on tensor cores: the fused loss and gradient runs each sample through
    the network in warp tiles and writes each layer's rows, whose weight gradients XLA's matrix
    products sum (slax/nn/_warp_rows_kernels.py); the network's other operations are XLA's, as
    the ``xla`` backend runs them (a forward pass alone gains nothing from keeping a tile in
    registers that XLA's fusions do not)."""

    name = "warp_rows"

    def unfit(self, arch, platform):
        return (
            _no_tensor_cores(platform)
            or _unfit_wide(arch)
            or _warp_rows_kernels.warp_rows_error(arch.sizes, arch.dtype)
            or _kept_input(arch, "the warp tiles derive its activation's derivative from its output")
        )

    def summary(self, arch, platform, operation):
        if operation == "loss_grad":
            return (
                "a warp per tile of 16 samples in registers through every layer as float16 mma.sync, "
                "each layer's input and output gradient written out for XLA's matrix products to sum "
                "into its weight gradient"
            )
        return super().summary(arch, platform, operation)

    def loss_grad(self, arch, platform, x, target, params, group_ndim, loss_scale, routes):
        return _warp_rows_kernels.loss_grad(
            warp_rows_kernel(arch),
            arch.sizes,
            x,
            target,
            params,
            group_ndim,
            loss_scale,
            packed(params),
            routes,
        )


@functools.cache
def warp_rows_kernel(arch: Architecture) -> KernelSpec:
    """``mlp_loss_rows`` of ``arch`` (slax/nn/_warp_rows_kernels.py)."""
    return _warp_rows_kernels.kernel(arch.sizes, tuple(ACTIVATIONS[name].slang for name in arch.activations))


BACKENDS: dict[str, Backend] = {b.name: b for b in (ThreadSums(), Tiled(), TensorCores(), WarpRows(), Xla())}
"""The registry: each backend by name (``slax.config.mlp_backend`` takes these names)."""
assert tuple(BACKENDS) == MLP_BACKENDS[1:], "slax._config.MLP_BACKENDS names the registry's backends"

# --- the rule -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class XlaWins:
    """Where XLA's matrix products, measured, train faster than a backend's fused kernels that run
    the network: on ``platform``, networks in ``dtype`` with two adjacent hidden layers at least
    ``hidden_pair`` wide, below ``below_batch`` samples (every batch where None)."""

    platform: str
    dtype: str
    hidden_pair: int
    below_batch: int | None

    def applies(self, arch: Architecture, platform: Platform, samples: int) -> bool:
        return (
            (platform.name, arch.dtype) == (self.platform, self.dtype)
            and arch.hidden_pair >= self.hidden_pair
            and (self.below_batch is None or samples < self.below_batch)
        )

    def why(self, platform: Platform) -> str:
        """What :func:`slax.nn.describe` says of a backend passed over here."""
        below = f" below {self.below_batch} samples" if self.below_batch else ""
        return (
            f"{self.dtype} networks with two adjacent hidden layers {self.hidden_pair} or wider train "
            f"faster on XLA's products than on its tiles{below} on {platform.name.upper()} (BENCHMARKS.md)"
        )


@dataclasses.dataclass(frozen=True)
class XlaWinsOnTensorCoreGpus:
    """Where XLA's matrix products, measured, train faster than a backend's fused kernels on every
    network they run: a GPU whose tensor cores slax may use."""

    def applies(self, arch: Architecture, platform: Platform, samples: int) -> bool:
        return platform.tensor_cores

    def why(self, platform: Platform) -> str:
        """What :func:`slax.nn.describe` says of a backend passed over here."""
        return "slower than XLA's products on GPUs with tensor cores (BENCHMARKS.md)"


_WIDE_PAIRS_FLOAT32 = XlaWins("cuda", "float32", 128, 1 << 16)
"""BENCHMARKS.md, wide networks: 32-128-128-16 at 0.88x plain JAX at 2^14 samples on an H100 on the
tensor-core tiles, 1.28-1.29x from 2^18."""
_WIDE_PAIRS_FLOAT16 = XlaWins("cuda", "float16", 128, None)
"""BENCHMARKS.md, wide networks: 32-128-128-16 at 0.87x plain JAX at 2^14 on an H100 on the
tensor-core tiles, 0.65x at 2^18 on an H200."""
_TENSOR_CORE_GPUS = XlaWinsOnTensorCoreGpus()
"""BENCHMARKS.md, wide networks: 32-64x8-16 at 0.33-0.66x and 32-128x4-16 at 0.17-0.28x plain JAX on
the tiled kernels on an H100, both dtypes, 2^14 to 2^20 samples."""

AUTO: tuple[tuple[str, tuple[XlaWins | XlaWinsOnTensorCoreGpus, ...]], ...] = (
    ("thread_sums", ()),
    ("tensor_cores", (_WIDE_PAIRS_FLOAT32, _WIDE_PAIRS_FLOAT16)),
    ("warp_rows", ()),
    ("tiled", (_WIDE_PAIRS_FLOAT32, _WIDE_PAIRS_FLOAT16, _TENSOR_CORE_GPUS)),
)
"""The rule's one table: the fused backends ``"auto"`` tries, in order, each with the measured
cases where it passes over the backend although it runs the network (XLA's products beat it);
``xla`` runs what none of them takes. Networks without two adjacent 128-wide hidden layers
(64-128-64-10: 1.11-1.34x at 2^12) keep the kernels; on the CPU routes the Slang kernels stay
the default wherever they fit (they are what CI tests). The tests' ``fused_kernels`` fixture
(tests/conftest.py) empties the second column, so that a test about the kernels gets them."""


OPERATIONS = {"forward": "mlp_apply", "backward": "jax.grad of mlp_apply", "loss_grad": "mlp_loss_and_grad"}
"""The operations, and the calls of slax.nn that run them."""
SECOND_ORDER_CALL = "second derivatives of mlp_apply"
"""The calls whose launches are second derivatives' rules (``jax.hessian``, ``jax.grad`` of a loss
holding ``jax.grad`` of the network), as :func:`slax.nn.describe` names them (operation
``"second_order"``)."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """A backend chosen for a call: where it runs, and why this backend."""

    backend: Backend
    platform: Platform
    why: str

    def describe(self, arch: Architecture, operation: str) -> str:
        """``"backend: how it runs operation of arch, and why"``, as :func:`slax.nn.describe` says it."""
        if operation == "second_order":
            how = self.backend.second_order_summary(arch, self.platform)
        else:
            how = self.backend.summary(arch, self.platform, operation)
        return f"{self.backend.name}: {arch} on {self.platform}, {how}; {self.why}"


def choose(arch: Architecture, platform: str, samples: int, request: BackendRequest) -> Choice:
    """The backend that runs ``arch``'s operations over ``samples`` on JAX platform ``platform``
    (``"cpu"`` or ``"cuda"``) for ``request``; raises ValueError for a forced backend that cannot
    run it."""
    where = Platform.of(platform, request)
    if request.backend != "auto":
        backend = BACKENDS[request.backend]
        refusal = backend.unfit(arch, where)
        if refusal:
            raise ValueError(
                f"slax.nn: the {backend.name!r} backend (slax.config.mlp_backend) cannot run the "
                f"network {arch} on {where}: {refusal}. Set slax.config.mlp_backend = 'auto' to let "
                "slax choose, or 'xla', which runs every network."
            )
        return Choice(backend, where, "forced by slax.config.mlp_backend")
    skipped: list[str] = []
    for name, passed_over in AUTO:
        wins = next((case for case in passed_over if case.applies(arch, where, samples)), None)
        if wins is not None:
            skipped.append(f"{name}: {wins.why(where)}")
            continue
        backend = BACKENDS[name]
        refusal = backend.unfit(arch, where)
        if refusal is None:
            passed = f" ({'; '.join(skipped)})" if skipped else ""
            return Choice(backend, where, f"the first fused backend that runs it{passed}")
        skipped.append(f"{name}: {refusal}")
    return Choice(BACKENDS["xla"], where, f"no fused kernels run it ({'; '.join(skipped)})")
