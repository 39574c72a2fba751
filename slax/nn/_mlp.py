"""The Slang MLP for JAX: initialisation, apply (differentiable to any order through the rules of
its primitives), the fused loss-and-gradient, and the same network in plain JAX
(slax/nn/_reference.py).

Parameters are :class:`MLPParams` (slax/nn/_params.py): a list of ``{"weight": (out, in), "bias":
(out,)}`` dicts, one per layer, and the activations of the hidden layers and of the output layer
(slax/nn/_activations.py; a plain list of layers means LeakyReLU with slope 0.01, then an affine
output layer). The primitives (slax/nn/_primitives.py) run each call on one of the backends
(slax/nn/_backends.py: Slang kernels from ``shaders/nn/``, or XLA's own products), which
:func:`describe` names.

Half precision: parameters and activations are stored as float16, but every dot product is summed in
float32 inside the kernels, gradients flow backwards between layers in float32 and parameter
gradients are accumulated in float32, so there is no loss scaling to tune: gradients do not
underflow in half. :func:`mlp_loss_and_grad` returns those
float32 gradients unrounded; for stable half training keep float32 master parameters for the
optimiser and cast them to float16 for the kernels (see experiments/polynomial.py).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from slax._config import current_routes
from slax._primitive import check_finite, vary_alike
from slax._sharding import across_devices, mean_over_devices
from slax.nn._activations import HIDDEN_DEFAULT, OUTPUT_DEFAULT, check_activation
from slax.nn._architecture import Architecture
from slax.nn._backends import OPERATIONS, SECOND_ORDER_CALL, BackendRequest, choose
from slax.nn._kernels import layer_pairs
from slax.nn._params import MLPParams, flat_layers, split_params
from slax.nn._primitives import PLATFORMS, mlp_forward_p, mlp_loss_grad_p
from slax.nn._reference import require_samples

PrecisionLike = str | jax.lax.Precision | jax.lax.DotAlgorithmPreset | tuple | None
"""A ``precision=`` argument, as ``jnp.matmul`` takes it (slax/nn/_precision.py)."""
Params = MLPParams | list[dict[str, jax.Array]]
"""An MLP's parameters: :class:`MLPParams` (layers and activations), or a plain list of one
``{"weight": (out, in), "bias": (out,)}`` dict per layer, input first, all of one dtype (float32 or
float16), with the default activations (LeakyReLU, then an affine output layer)."""
SUPPORTED_DTYPES = ("float32", "float16")


# --- public API ----------------------------------------------------------------------------------


def mlp_init(
    key: jax.Array,
    sizes: tuple[int, ...],
    dtype: Any = jnp.float32,
    *,
    activation: str = HIDDEN_DEFAULT,
    output_activation: str = OUTPUT_DEFAULT,
) -> MLPParams:
    """Initial parameters: weights and biases uniform in ±1/sqrt(fan_in), as torch.nn.Linear, for
    every activation (a sine network may want SIREN's initialisation instead: replace the weights).

    Args:
      key: a JAX PRNG key.
      sizes: layer widths from input to output, e.g. ``(4, 16, 4)``.
      dtype: ``jnp.float32`` or ``jnp.float16``.
      activation: the hidden layers' activation: ``"leaky_relu"`` (slope 0.01), ``"relu"``,
        ``"none"``, ``"sigmoid"``, ``"tanh"`` or ``"sine"`` (``sin z``).
      output_activation: the output layer's, one of the same (``"none"``: affine).

    Returns:
      The parameters (:class:`MLPParams`): one ``{"weight": (out, in), "bias": (out,)}`` per
      layer, and the activations, which :func:`mlp_apply` and the other functions use.

    Raises:
      ValueError: fewer than two widths, a width below 1, or an unknown activation.
      TypeError: a dtype other than float32 or float16.
    """
    if len(sizes) < 2 or any(int(s) < 1 for s in sizes):
        raise ValueError(f"slax.nn.mlp_init: sizes must be >= 2 positive widths, got {sizes}.")
    _check_dtype("mlp_init", "dtype", jnp.dtype(dtype))
    check_activation("mlp_init", "activation", activation)
    check_activation("mlp_init", "output_activation", output_activation)
    params = []
    for k, (n_in, n_out) in zip(jax.random.split(key, len(sizes) - 1), layer_pairs(sizes)):
        bound = 1.0 / math.sqrt(n_in)
        wkey, bkey = jax.random.split(k)
        params.append(
            {
                "weight": jax.random.uniform(wkey, (n_out, n_in), jnp.float32, -bound, bound).astype(dtype),
                "bias": jax.random.uniform(bkey, (n_out,), jnp.float32, -bound, bound).astype(dtype),
            }
        )
    return MLPParams(params, activation, output_activation)


def mlp_apply(params: Params, x: jax.Array, *, precision: PrecisionLike = None) -> jax.Array:
    """The network on a batch, in Slang kernels: ``x (..., in) -> (..., out)``.

    Differentiable in both modes and to any order, for params and x (``jax.grad``, ``jax.jvp``,
    ``jax.linearize``, ``jax.hessian``, and ``jax.grad`` of a loss that holds ``jax.grad`` of the
    network with respect to x, as an eikonal loss does): first derivatives run the layers' Slang
    backward kernel, higher ones add the network's plain-JAX twin's, or, for the parameters' part
    along a direction in x of an eikonal loss's gradient, the backend's Hessian kernel where it has
    one (slax/nn/_primitives.py).
    Composes with jit, vmap, lax.scan and shard_map (gradients of replicated params are summed over
    the mesh, as JAX does).

    Args:
      params: the network's parameters, from :func:`mlp_init` (:data:`Params`).
      x: inputs ``(..., in)``, of the parameters' dtype.
      precision: a float32 network's matrix products, as ``jnp.matmul``'s ``precision``: None
        (JAX's default matmul precision, ``jax.default_matmul_precision``), a ``lax.Precision``,
        one of the strings JAX accepts for it, or a TF32 or float32 ``lax.DotAlgorithmPreset``.
        On GPUs with tensor cores ``DEFAULT`` and ``HIGH`` run one TF32 pass, as XLA does, and
        ``HIGHEST`` keeps float32's accuracy (3xTF32); elsewhere every float32 product is
        float32's. Derivatives take the same.

    Returns:
      The outputs ``(..., out)``, of the parameters' dtype.

    Raises:
      TypeError: parameters not laid out as :data:`Params`, mixed dtypes, or ``x`` not an array
        or of another dtype.
      ValueError: layer shapes that do not chain or are 0 wide, ``x`` not ending in the input
        width, a backend forced by ``slax.config.mlp_backend`` that cannot run the network, a batch
        beyond the kernels' 32-bit indices, or a precision the kernels do not run (bfloat16
        algorithms).
    """
    activations = _architecture("mlp_apply", params, x).activations  # validates first
    layers, _ = split_params(params)
    leaves = [*flat_layers(layers), x]
    request = BackendRequest.current("mlp_apply", precision)

    def call(axes, *leaves):
        del axes  # per sample: nothing sums over the batch (jax.grad sums params' gradients)
        *flat, x = vary_alike(list(leaves))
        arch = _architecture("mlp_apply", _unflat(flat), x, activations)
        _refuse_unfit(arch, x, request)
        outputs = mlp_forward_p.bind(
            x, *flat, arch=arch, keep_hidden=False, request=request, routes=current_routes()
        )
        check_finite("slax.nn.mlp_apply's forward kernel", [x, *flat], outputs)
        return outputs

    has_batch = x.ndim > 1
    return across_devices(call, leaves, [False] * (len(leaves) - 1) + [has_batch], [has_batch])[0]


def mlp_loss_and_grad(
    params: Params, x: jax.Array, target: jax.Array, *, precision: PrecisionLike = None
) -> tuple[jax.Array, Params]:
    """The tutorial's training loss and its parameter gradients in one Slang dispatch.

    Loss: the batch mean of each sample's squared L2 error ``|mlp(x) - target|^2``.

    Args:
      params: the network's parameters, from :func:`mlp_init` (:data:`Params`).
      x: inputs ``(batch, in)``, of the parameters' dtype.
      target: ``(batch, out)``, of ``x``'s dtype.
      precision: a float32 network's matrix products, as :func:`mlp_apply`'s.

    Returns:
      ``(loss, grads)``: a float32 scalar and float32 gradients shaped like ``params`` (of its
      type: :class:`MLPParams` with its activations, or a list of layers).

    Raises:
      TypeError: as :func:`mlp_apply`, or ``target`` not an array.
      ValueError: as :func:`mlp_apply`, ``target`` not of shape ``(batch, out)`` and ``x``'s
        dtype, or ``x`` holding no samples (a batch of 0: their mean has no value, as
        :func:`mlp_loss_reference` says too).
    """
    arch, request, routes, flat = _squared_error_call("mlp_loss_and_grad", params, x, target, precision)
    leaves = [x, target, *flat]
    loss, *grads = _squared_error_launch("mlp_loss_and_grad", arch, request, routes, False, leaves)
    return loss, _shaped_like(params, grads)


def mlp_squared_error(
    params: Params, x: jax.Array, target: jax.Array, *, precision: PrecisionLike = None
) -> jax.Array:
    """The batch mean of each sample's squared L2 error ``|mlp(x) - target|^2``, a loss whose
    gradient runs in one Slang dispatch.

    :func:`mlp_loss_and_grad`'s loss, for a network whose input other JAX code computes (an
    encoding): under ``jax.grad``, ``jax.value_and_grad`` or ``jax.vjp``, the forward pass, the
    loss and its gradients in the parameters and in ``x`` come from one launch where the backend
    has a kernel for them (the warp tiles), else from the backend's forward and backward kernels,
    and the gradient in ``x`` flows on into what computed it. ``jnp.mean(jnp.sum((mlp_apply(params,
    x) - target) ** 2, -1))`` is the same loss, whose gradient runs the forward kernel, XLA's loss
    and the backward kernel. In float16 the residual enters the backward pass unscaled (on the
    warp tiles in float; elsewhere rounded to half), and the mean's factor multiplies the sums in
    float (``mlp_apply``'s gradient takes the loss's cotangent in half, where a mean over many
    samples' is near or below half's normal range). Under ``jax.grad`` in the parameters alone
    the launch writes no dx.

    Reverse mode, once: ``jax.jvp`` and second derivatives are refused; write the loss with
    :func:`mlp_apply` for those. Composes with jit, vmap (each vmapped group its own mean),
    lax.scan and sharded batches (the mean over the whole batch).

    Args:
      params: the network's parameters, from :func:`mlp_init` (:data:`Params`).
      x: inputs ``(batch, in)``, of the parameters' dtype.
      target: ``(batch, out)``, of ``x``'s dtype.
      precision: a float32 network's matrix products, as :func:`mlp_apply`'s.

    Returns:
      The loss, a float32 scalar; its gradients have the parameters', ``x``'s and ``target``'s
      dtypes.

    Raises:
      TypeError: as :func:`mlp_loss_and_grad`; forward-mode or second derivatives.
      ValueError: as :func:`mlp_loss_and_grad`.
    """
    arch, request, routes, flat = _squared_error_call("mlp_squared_error", params, x, target, precision)

    def loss_of(flat, x, target):
        y = mlp_apply(_shaped_like(params, flat), x, precision=precision)
        return jnp.mean(jnp.sum((y.astype(jnp.float32) - target.astype(jnp.float32)) ** 2, -1))

    def forward(flat, x, target):
        """The fused launch, computing dx only where x is differentiated, and keeping what the
        target's gradient takes only where the target is."""
        input_gradient = bool(x.perturbed)
        values = [p.value for p in flat]
        leaves = [x.value, target.value, *values]
        function = "mlp_squared_error"
        loss, *results = _squared_error_launch(function, arch, request, routes, input_gradient, leaves)
        dx, grads = (results[0], results[1:]) if input_gradient else (None, results)
        for_target = (values, x.value, target.value) if target.perturbed else None
        return loss, (dx, grads, values, for_target)

    def backward(saved, cotangent):
        dx, grads, values, for_target = saved
        dflat = [(cotangent * g).astype(p.dtype) for g, p in zip(grads, values)]
        if dx is not None:  # a cotangent other than 1 (a loss scaled after) rounds dx a second time
            dx = (cotangent * dx.astype(jnp.float32)).astype(dx.dtype)
        dtarget = None
        if for_target is not None:  # the network's output again, through mlp_apply's kernels
            dtarget = jax.vjp(loss_of, *for_target)[1](cotangent)[2]
        return dflat, dx, dtarget

    loss = jax.custom_vjp(loss_of)
    loss.defvjp(forward, backward, symbolic_zeros=True)
    return loss(flat, x, target)


def describe(
    params: Params, x: Any, platform: str | None = None, *, precision: PrecisionLike = None
) -> dict[str, str]:
    """Which backend runs each of the MLP's operations on ``x``, and why.

    The backends: ``thread_sums`` (narrow networks' Slang kernels, a sample per thread),
    ``tiled`` (wide networks' Slang kernels on any device), ``tensor_cores`` (wide networks' Slang
    kernels on NVIDIA tensor cores, sm_80 and newer) and ``xla`` (XLA's own matrix products, the
    plain-JAX twin). ``slax.config.mlp_backend`` forces one; by default (``"auto"``) slax takes the
    fused kernels where they fit, except where they are known to lose to XLA. The answer is the
    one a call traced now (with ``slax.config`` as it is) takes.

    Args:
      params: the network's parameters (:data:`Params`).
      x: an input batch ``(..., in)``, or its shape (a tuple of ints).
      platform: ``"cpu"`` or ``"cuda"``, where the call runs; default: JAX's default platform.
      precision: the calls' ``precision`` (:func:`mlp_apply`'s): how float32 products run.

    Returns:
      For each call, ``"mlp_apply"``, ``"jax.grad of mlp_apply"``, ``"mlp_loss_and_grad"`` and
      ``"second derivatives of mlp_apply"`` (``jax.hessian``, or ``jax.grad`` of a loss holding
      ``jax.grad`` of the network: their launches), a line ``"backend: network on platform, how;
      why"``, e.g. ``"tensor_cores: 64-128-64-10 float16 on CUDA sm_90, tiles of 16 samples per
      thread group as mma.sync; the fused kernels that fit"``.

    Raises:
      TypeError, ValueError: parameters or ``x`` as :func:`mlp_apply` refuses them, a platform
        other than ``"cpu"`` or ``"cuda"``, or a forced backend that cannot run the network.
    """
    if isinstance(x, tuple) and all(isinstance(n, int) for n in x):
        dtype = params[0]["weight"].dtype if params and isinstance(params[0], dict) else jnp.float32
        x = np.broadcast_to(np.zeros((), dtype), x)  # no memory: a view of one element
    arch = _architecture("describe", params, x)
    platform = _default_platform() if platform is None else platform
    if platform not in PLATFORMS:
        raise ValueError(f"slax.nn.describe: platform must be one of {PLATFORMS}; got {platform!r}.")
    samples, request = math.prod(x.shape[:-1]), BackendRequest.current("describe", precision)
    choice = choose(arch, platform, samples, request)
    answer = {call: choice.describe(arch, operation) for operation, call in OPERATIONS.items()}
    return answer | {SECOND_ORDER_CALL: choice.describe(arch, "second_order")}


def _squared_error_call(function: str, params: Params, x, target, precision: PrecisionLike):
    """``(arch, request, routes, flat)`` for a squared-error call of ``function`` (its network,
    the backend request its precision makes, the launch routes, the layers' flat arrays), its
    arguments checked in the order :func:`mlp_loss_and_grad` documents."""
    arch = _architecture(function, params, x)
    _check_target(function, arch, x, target)
    request = BackendRequest.current(function, precision)
    _refuse_unfit(arch, x, request)
    layers, _ = split_params(params)
    return arch, request, current_routes(), flat_layers(layers)


def _squared_error_launch(
    function: str, arch: Architecture, request: BackendRequest, routes, input_gradient: bool, leaves
) -> list[jax.Array]:
    """``[loss, [dx,] *grads]`` of the squared error on ``leaves`` (``x, target, *flat``): the
    fused kernel's over each device's samples, then the loss and gradients the means over the
    devices (equal shards, so the mean of means is the batch's mean), and dx each device's share
    of the whole batch's mean (left split, as x is)."""

    def call(axes, x, target, *flat):
        x, target, *flat = vary_alike([x, target, *flat])
        # dx is each device's share of the batch's mean: its kernel takes the whole batch's
        # 1 / samples (one rounding of dx, no pass of its own), and the means over the devices
        # are then the devices' sums
        devices = jax.lax.psum(1, axes) if axes and input_gradient else 1
        loss, *results = mlp_loss_grad_p.bind(
            x,
            target,
            *flat,
            arch=arch,
            group_ndim=0,
            loss_scale=1.0 / (math.prod(x.shape[:-1]) * devices),
            input_gradient=input_gradient,
            request=request,
            routes=routes,
        )
        check_finite(f"slax.nn.{function}'s kernel", [x, target, *flat], [loss, *results])
        dx, grads = results[: int(input_gradient)], results[int(input_gradient) :]
        # In the kernel's order (gradients, then the loss) the flat vector mean_over_devices
        # all-reduces is the sum of the kernel's partial rows as it is: no kernel repacking it
        # each step (BENCHMARKS.md, "Two GPUs after the rewrite").
        *grads, loss = [v * devices for v in mean_over_devices([*grads, loss], axes)]
        return loss, *dx, *grads

    has_batch = leaves[0].ndim > 1
    batched = [has_batch, has_batch] + [False] * (len(leaves) - 2)
    out_batched = [False] + [has_batch] * int(input_gradient) + [False] * (len(leaves) - 2)
    return across_devices(call, leaves, batched, out_batched)


# --- checks and flattening -------------------------------------------------------------------------


def _check_target(function: str, arch: Architecture, x, target) -> None:
    """Refuses a batch of no samples and a target that is not an array of ``(batch, out)`` in
    ``x``'s dtype."""
    require_samples(function, x)
    _require_array(function, "target", target)
    if target.shape != x.shape[:-1] + (arch.sizes[-1],) or target.dtype != x.dtype:
        raise ValueError(
            f"slax.nn.{function}: target must have shape {x.shape[:-1] + (arch.sizes[-1],)} and "
            f"dtype {x.dtype} to match x; got {target.shape} {target.dtype}."
        )


def _check_dtype(function: str, name: str, dtype) -> None:
    if str(dtype) not in SUPPORTED_DTYPES:
        raise TypeError(f"slax.nn.{function}: {name} must be float32 or float16, got {dtype}.")


def _default_platform() -> str:
    """JAX's default platform by the name lowering rules get (``"cuda"`` for NVIDIA GPUs)."""
    platform = jax.default_backend()
    return "cuda" if platform == "gpu" else platform


def _refuse_unfit(arch: Architecture, x, request: BackendRequest) -> None:
    """Refuses, when the call is traced, a backend forced that cannot run ``arch`` on JAX's default
    platform: the rule that lowering applies again on the platform the call runs on."""
    if request.backend != "auto" and _default_platform() in PLATFORMS:
        choose(arch, _default_platform(), math.prod(x.shape[:-1]), request)


def _require_array(function: str, name: str, value: Any) -> None:
    """Refuses what is not an array, as jax.numpy's functions do (``jnp.sum([1.0])`` raises a
    TypeError): a list of numbers would have to be converted on every call, and a list of arrays
    might be a batch or a pytree; the caller says which with ``jnp.asarray``."""
    if not isinstance(value, (jax.Array, np.ndarray)):
        raise TypeError(
            f"slax.nn.{function}: {name} must be a jax.Array or numpy.ndarray; got a "
            f"{type(value).__name__}. Convert it with jnp.asarray({name.split()[-1]})."
        )


def _architecture(
    function: str, params: Params, x: jax.Array, activations: tuple[str, ...] | None = None
) -> Architecture:
    """The network's :class:`Architecture`, after checking ``params`` and ``x``: the activations
    :class:`MLPParams` holds, else ``activations``, else the defaults."""
    if isinstance(params, MLPParams):
        params, activations = split_params(params)
    if not isinstance(params, (list, tuple)) or not params:
        raise TypeError(
            f"slax.nn.{function}: params must be slax.nn.MLPParams or a non-empty list of layers, "
            f"from mlp_init; got {type(params).__name__}."
        )
    sizes: list[int] = []
    dtype = None
    for k, layer in enumerate(params):
        if not isinstance(layer, dict) or set(layer) != {"weight", "bias"}:
            raise TypeError(f"slax.nn.{function}: layer {k} must be a dict with keys 'weight' and 'bias'.")
        weight, bias = layer["weight"], layer["bias"]
        _require_array(function, f"layer {k} weight", weight)
        _require_array(function, f"layer {k} bias", bias)
        if weight.ndim != 2 or bias.shape != (weight.shape[0],):
            raise ValueError(
                f"slax.nn.{function}: layer {k} needs weight (out, in) and bias (out,); got "
                f"{weight.shape} and {bias.shape}."
            )
        if 0 in weight.shape:
            raise ValueError(
                f"slax.nn.{function}: layer {k} has weight shape {weight.shape}: every layer must be "
                "at least 1 wide, in and out (as mlp_init's sizes); drop the layer instead."
            )
        if sizes and weight.shape[1] != sizes[-1]:
            raise ValueError(
                f"slax.nn.{function}: layer {k} takes {weight.shape[1]} inputs but layer {k - 1} "
                f"gives {sizes[-1]}."
            )
        if not sizes:
            sizes.append(weight.shape[1])
        sizes.append(weight.shape[0])
        for name, array in (("weight", weight), ("bias", bias)):
            _check_dtype(function, f"layer {k} {name}", array.dtype)
            if dtype is not None and array.dtype != dtype:
                raise TypeError(
                    f"slax.nn.{function}: all parameters need one dtype; layer {k} {name} is "
                    f"{array.dtype}, earlier ones {dtype}."
                )
            dtype = array.dtype
    _require_array(function, "x", x)
    if x.ndim < 1 or x.shape[-1] != sizes[0]:
        raise ValueError(f"slax.nn.{function}: x must have shape (..., {sizes[0]}); got {x.shape}.")
    if x.dtype != dtype:
        raise TypeError(
            f"slax.nn.{function}: x has dtype {x.dtype} but the parameters are {dtype}; cast x "
            f"with x.astype(jnp.{dtype})."
        )
    return Architecture(tuple(sizes), str(dtype), activations or ())


def _shaped_like(params: Params, flat) -> Params:
    """``flat`` (each layer's arrays in :func:`flat_layers`' order) as ``params`` is laid out: an
    :class:`MLPParams` with its activations, or a list of layers."""
    return params.with_layers(_unflat(flat)) if isinstance(params, MLPParams) else _unflat(flat)


def _unflat(flat) -> list[dict[str, jax.Array]]:
    return [{"weight": w, "bias": b} for b, w in zip(flat[0::2], flat[1::2])]
