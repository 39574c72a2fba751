"""Data parallelism for slax losses: a batch split over JAX devices with ``jax.shard_map``.

Under plain ``jax.jit`` over a batch-sharded array each slax call partitions itself
(``slax/_sharding.py``); :func:`data_parallel` is the explicit form for the common case, a function
returning a batch's loss and its gradient, on a mesh of its own over the first ``devices`` devices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from slax._sharding import mean_over_devices

LossAndGrad = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]
"""``(params, x, y) -> (loss, grads)``: a batch's mean loss and its gradient, shaped like params."""


def data_parallel(loss_and_grad: LossAndGrad, devices: int | None, axis_name: str = "data") -> LossAndGrad:
    """``loss_and_grad`` with the batch split over the first ``devices`` JAX devices.

    Each device runs ``loss_and_grad`` (and so its slax kernels) on its shard of ``x`` and ``y``
    inside ``jax.shard_map``; losses and gradients are averaged over the devices with
    ``lax.pmean``, so for equal shards the result is the single-device one. It works alike for
    gradients from ``jax.grad`` (of slax or of plain JAX) and from a fused kernel such as
    :func:`slax.nn.mlp_loss_and_grad`: each device's gradient is its own shard's, before the mean.

    Args:
      loss_and_grad: ``(params, x, y) -> (loss, grads)`` of a batch: ``x`` and ``y`` with the batch
        as their leading axis, ``params`` a pytree replicated on every device.
      devices: how many devices to split over (the batch must divide evenly); 1 runs it inside a
        one-device mesh; ``None`` returns ``loss_and_grad`` itself.
      axis_name: the mesh axis the batch is split along.

    Returns:
      A function of the same signature, to call under ``jax.jit`` on the whole batch.

    Raises:
      ValueError: ``devices`` is not between 1 and ``len(jax.devices())``.

    Example:
      >>> step = jax.jit(slax.data_parallel(slax.nn.mlp_loss_and_grad, jax.device_count()))
      >>> loss, grads = step(params, x, target)
    """
    if devices is None:
        return loss_and_grad
    present = len(jax.devices())
    if not 1 <= devices <= present:
        raise ValueError(
            f"slax.data_parallel: devices must be 1 to {present}, the JAX devices there are "
            f"({jax.devices()[0].platform}); got {devices}. Pass None for no mesh."
        )
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), (axis_name,))
    spec = jax.sharding.PartitionSpec

    def local(params, x, y):
        # Each device differentiates its own shard's loss: params cast to varying outside the
        # gradient, so that jax.grad inside gives the local gradient (not already summed over the
        # mesh, as for replicated params), the same as a fused slax kernel's; pmean averages both.
        params = jax.lax.pcast(params, axis_name, to="varying")
        loss, grads = loss_and_grad(params, x, y)
        loss, grads = mean_over_devices([loss, grads], axis_name)
        return loss, grads

    return jax.shard_map(
        local, mesh=mesh, in_specs=(spec(), spec(axis_name), spec(axis_name)), out_specs=(spec(), spec())
    )


__all__ = ["LossAndGrad", "data_parallel"]
