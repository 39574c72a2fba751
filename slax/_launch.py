"""Launchers: one interface, one implementation per launch route, chosen in one place.

A launcher lowers one slax kernel launch (``slang_kernel_p``, ``slax/_kernel_primitive.py``) into
the XLA computation being built. The routes:

- ``"host-copy"`` (:class:`slax._bridge.HostCopyLauncher`): JAX on the CPU, kernels on a Vulkan
  (or CUDA) device. A ``buffer_callback`` copies XLA's host buffers through device buffers and
  dispatches with SlangPy.
- ``"host-pointer"`` (:class:`slax._bridge.HostPointerLauncher`): JAX on the CPU, kernels on
  SlangPy's CPU device. A ``buffer_callback`` dispatches with SlangPy on XLA's host buffers'
  addresses, zero-copy.
- ``"ptx"`` (:class:`slax._ptx_launch.PtxLauncher`, the default): JAX on CUDA. An FFI custom call
  that XLA launches itself (jaxlib's Triton kernel launcher), with no Python per call.
- ``"slangpy"`` (:class:`slax._bridge.ZeroCopyLauncher`): JAX on CUDA. A ``buffer_callback``
  dispatches with SlangPy on XLA's device buffers and stream, zero-copy; also where the PTX route
  cannot launch a kernel.

:func:`launcher_for` is where the route is chosen: from the platform the computation is lowered
for and the :class:`~slax._config.LaunchRoutes` it was traced with (a parameter of the launch).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from slax._bridge import HostCopyLauncher, HostPointerLauncher, ZeroCopyLauncher
from slax._compile import Aliases, KernelSpec, Scalars
from slax._config import LaunchRoutes, current_routes
from slax._device import DeviceKind, default_platform, device_kind_for_platform
from slax._ptx_launch import PtxLauncher


class Launcher(Protocol):
    """Lowers slax kernel launches on one route."""

    name: str
    """The route: ``"host-copy"``, ``"host-pointer"``, ``"slangpy"`` or ``"ptx"``."""

    def lower(
        self,
        ctx: Any,
        operands: Sequence[Any],
        *,
        spec: KernelSpec,
        scalars: Scalars,
        count: int,
        aliases: Aliases,
    ) -> Sequence[Any]:
        """The MLIR values of the launch's results (``ctx.avals_out``, in order) for one launch of
        ``spec`` with ``count > 0`` threads on ``operands`` (MLIR values), passing ``scalars`` by
        name. ``aliases`` pairs (operand, result): that result is the operand's buffer, updated in
        place through the operand's pointer (it gets no pointer of its own)."""
        ...


_launchers: dict[tuple[str, DeviceKind], Launcher] = {}
_lock = threading.Lock()


def _new_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at fork()


os.register_at_fork(after_in_child=_new_lock_in_child)


def launcher_for(platform: str, routes: LaunchRoutes) -> Launcher:
    """The launcher of kernels in a computation lowered for ``platform`` (``"cpu"`` or ``"cuda"``)
    and traced with ``routes``; one per route and device kind, made on first use."""
    kind = device_kind_for_platform(platform, routes)
    if platform == "cuda":
        route = routes.cuda
    else:
        route = "host-pointer" if kind is DeviceKind.CPU else "host-copy"
    with _lock:
        launcher = _launchers.get((route, kind))
        if launcher is None:
            launcher = _launchers[(route, kind)] = _new_launcher(route, kind)
        return launcher


def _new_launcher(route: str, kind: DeviceKind) -> Launcher:
    if route == "ptx":
        return PtxLauncher(fallback=ZeroCopyLauncher(kind))
    if route == "slangpy":
        return ZeroCopyLauncher(kind)
    if route == "host-pointer":
        return HostPointerLauncher(kind)
    return HostCopyLauncher(kind)


def launch_route(platform: str | None = None) -> str:
    """The route slax kernels take in computations traced now and lowered for ``platform``
    (``"cpu"`` or ``"cuda"``; default: JAX's default platform): on the CPU ``"host-copy"`` (a Vulkan
    or CUDA device, copies through device buffers) or ``"host-pointer"`` (SlangPy's CPU device,
    zero-copy), as ``slax.config.device_kind`` chooses; on CUDA ``"slangpy"`` or ``"ptx"``
    (zero-copy, as ``slax.config.cuda_launch`` chooses). For logs and checks:
    ``slax.launch_route()``.

    Args:
      platform: ``"cpu"`` or ``"cuda"``; ``None``, JAX's default platform.

    Returns:
      ``"host-copy"``, ``"host-pointer"``, ``"slangpy"`` or ``"ptx"``.

    Raises:
      ValueError: an unsupported platform, or a CPU device kind chosen for CUDA-placed JAX.
    """
    return launcher_for(platform or default_platform(), current_routes()).name
