"""Run-time switches of slax (``slax.config``), and the launch routes a computation is traced with."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
from typing import ClassVar

import jax

CUDA_LAUNCHES = ("slangpy", "ptx")
DEVICE_ENV_VAR = "SLAX_DEVICE"
REFLECTION_ENV_VAR = "SLAX_REFLECTION_DEVICE"


class DeviceKind(enum.Enum):
    """The SlangPy device types slax runs kernels on."""

    VULKAN = "vulkan"
    CPU = "cpu"
    CUDA = "cuda"


def parse_device_kind(value: str | DeviceKind | None, *, source: str) -> DeviceKind | None:
    """Turns a user-given name into a :class:`DeviceKind` (``None`` and ``""``: automatic), or says
    which names are valid."""
    if value is None or isinstance(value, DeviceKind):
        return value
    if not isinstance(value, str):
        valid = ", ".join(repr(k.value) for k in DeviceKind)
        raise TypeError(
            f"slax: the device kind from {source} must be one of {valid} or None; got "
            f"{type(value).__name__} {value!r}."
        )
    if not value.strip():
        return None
    try:
        return DeviceKind(value.strip().lower())
    except ValueError:
        valid = ", ".join(repr(k.value) for k in DeviceKind)
        raise ValueError(
            f"slax: unknown device kind {value!r} from {source}; expected one of {valid}, or None "
            "to let slax choose."
        ) from None


@dataclasses.dataclass(frozen=True)
class LaunchRoutes:
    """How slax kernels launch, per platform, as a computation was traced with them.

    Every slax primitive carries it as its ``routes`` parameter, so its lowering takes the route
    it was traced with and never reads a setting; and JAX's caches are keyed by it (a JAX user
    context, :func:`current_routes`), so changing ``slax.config.cuda_launch`` or the device kind
    retraces a jitted function instead of reusing a lowering made for the other route.

    Attributes:
      cuda: the launch route on CUDA GPUs, one of ``CUDA_LAUNCHES`` (``slax.config.cuda_launch``).
      cpu: the SlangPy device kind that runs kernels of CPU-placed JAX (``slax.config.device_kind``);
        ``None``: Vulkan where a driver exists, else SlangPy's CPU device.
      tensor_cores: on CUDA GPUs, whether MLP kernels may run on tensor cores: wide networks', and
        narrow float16 networks' fused loss and gradient (``slax.config.tensor_cores``).
    """

    cuda: str = "slangpy"
    cpu: DeviceKind | None = None
    tensor_cores: bool = True


_traced_routes = jax.make_user_context(LaunchRoutes())


def current_routes() -> LaunchRoutes:
    """The routes a slax primitive bound now is traced with: those of ``slax.config``."""
    return _traced_routes.value


def _parse_switch(value: str | None, source: str, default: bool) -> bool:
    """An on/off environment variable: 1/0, true/false, on/off, yes/no; unset or empty, ``default``
    (as an empty SLAX_CUDA_LAUNCH or SLAX_DEVICE leaves theirs)."""
    normal = (value or "").strip().lower()
    if not normal:
        return default
    if normal in ("1", "true", "on", "yes"):
        return True
    if normal in ("0", "false", "off", "no"):
        return False
    raise ValueError(
        f"slax: {source}={value!r} is not a switch; expected 1 or 0 (true/false, on/off, yes/no), or unset."
    )


@dataclasses.dataclass
class Config:
    """Switches of slax.

    ``cuda_launch``, ``device_kind`` and ``tensor_cores`` are part of what JAX traces (a jitted
    function retraces when one changes);
    ``debug_nans`` is read when a call is traced (a jitted function already compiled keeps the
    setting it was compiled with).

    Attributes:
      debug_nans: check every Slang kernel's floating results and raise ``FloatingPointError``
        naming the first kernel (and Slang function) that produced a NaN or Inf. Off by default: it
        copies results to the host. Also on when ``SLAX_DEBUG_NANS=1`` or when JAX's own
        ``jax_debug_nans`` is set.
      cuda_launch: how kernels run when JAX runs on a CUDA GPU. ``"ptx"`` (the default, the faster
        route as measured on an H100; BENCHMARKS.md): Slang compiles the kernel to PTX and XLA
        launches it through jaxlib's Triton kernel launcher, with no Python per call (see
        ``slax/_ptx_launch.py``); kernels it cannot launch take the SlangPy route, with a warning.
        ``"slangpy"``: SlangPy dispatches each kernel from a ``buffer_callback`` on XLA's buffers
        and stream. Also set by ``SLAX_CUDA_LAUNCH``.
      device_kind: the SlangPy device that runs kernels of CPU-placed JAX: ``"vulkan"`` (a GPU
        driver, or Mesa's lavapipe on the CPU; host copies), ``"cpu"`` (SlangPy's CPU device, on
        XLA's host buffers in place) or ``"cuda"`` (host copies). ``None``, the default: Vulkan
        where a driver exists, else the CPU device, saying so once. Also set by ``SLAX_DEVICE`` and
        :func:`set_device_kind`; JAX placed on a CUDA GPU always uses that GPU's CUDA device.
      tensor_cores: on CUDA GPUs (sm_80 and newer), run wide MLPs (``slax.nn``) on tensor cores,
        each product split into TF32 pieces so that float32 networks keep float32's accuracy
        (``shaders/nn/tensor_cores.slang``); True by default. False runs them on the tiled kernels
        every device runs, whose rounding is the CPU routes' (the per-sample layer's). Also runs
        the fused loss and gradient of narrow float16 networks (layers at most 16 wide) on tensor
        cores, a warp per tile of 16 samples (``shaders/nn/warp_mma.slang``); False runs it a
        sample per thread. Also set by ``SLAX_TENSOR_CORES=0``.
      reflection_device: the SlangPy device whose Slang reflection describes modules (their types,
        functions and entry points' parameters) for slax: ``None``, the default, the device of JAX's
        default platform; ``"cpu"``, ``"vulkan"`` or ``"cuda"`` another. On a CUDA GPU with the PTX route,
        reflection is all slax asks of SlangPy, so ``"cpu"`` keeps SlangPy's CUDA device out of
        the process: profilers that crash in that device's creation (Nsight Compute, ``ncu``) can
        then run it. The kernels must compile for that device's target (the CPU target has no
        group barriers outside a ``__target_switch``). Also set by ``SLAX_REFLECTION_DEVICE``, read
        when slax is imported (as the other variables); the setting is read when a module or kernel
        is first loaded.
    """

    CUDA_LAUNCHES: ClassVar[tuple[str, ...]] = CUDA_LAUNCHES
    """The values ``cuda_launch`` takes."""

    debug_nans: bool = dataclasses.field(
        default_factory=lambda: os.environ.get("SLAX_DEBUG_NANS", "") not in ("", "0")
    )
    cuda_launch: str = dataclasses.field(default_factory=lambda: os.environ.get("SLAX_CUDA_LAUNCH") or "ptx")
    device_kind: DeviceKind | None = dataclasses.field(
        default_factory=lambda: parse_device_kind(
            os.environ.get(DEVICE_ENV_VAR), source=f"the {DEVICE_ENV_VAR} variable"
        )
    )
    tensor_cores: bool = dataclasses.field(
        default_factory=lambda: _parse_switch(os.environ.get("SLAX_TENSOR_CORES"), "SLAX_TENSOR_CORES", True)
    )
    reflection_device: DeviceKind | None = dataclasses.field(
        default_factory=lambda: parse_device_kind(
            os.environ.get(REFLECTION_ENV_VAR), source=f"the {REFLECTION_ENV_VAR} variable"
        )
    )

    def __setattr__(self, name: str, value) -> None:
        if name == "cuda_launch" and value not in CUDA_LAUNCHES:
            raise ValueError(
                f"slax: cuda_launch must be one of {CUDA_LAUNCHES} (slax.config.cuda_launch or "
                f"SLAX_CUDA_LAUNCH); got {value!r}."
            )
        if name in ("device_kind", "reflection_device"):
            value = parse_device_kind(value, source=f"slax.config.{name}")
        if name == "tensor_cores" and not isinstance(value, bool):
            raise TypeError(
                f"slax: tensor_cores must be True or False (slax.config.tensor_cores or SLAX_TENSOR_CORES); "
                f"got {value!r}."
            )
        super().__setattr__(name, value)
        if name in ("cuda_launch", "device_kind", "tensor_cores"):
            routes = LaunchRoutes(
                cuda=getattr(self, "cuda_launch", "slangpy"),
                cpu=getattr(self, "device_kind", None),
                tensor_cores=getattr(self, "tensor_cores", True),
            )
            _traced_routes.set_global(routes)

    @contextlib.contextmanager
    def override(self, **changes):
        """Sets ``changes`` (validated as above) for the ``with`` block, then restores the previous
        values, also on error: ``with slax.config.override(cuda_launch="ptx"): ...``."""
        previous = {name: getattr(self, name) for name in changes}
        try:
            for name, value in changes.items():
                setattr(self, name, value)
            yield self
        finally:
            for name, value in previous.items():
                setattr(self, name, value)


config = Config()


def set_device_kind(kind: str | DeviceKind | None) -> None:
    """Chooses the SlangPy device for CPU-placed JAX computations (``slax.config.device_kind``):
    ``"vulkan"``, ``"cpu"`` or ``"cuda"``; ``None`` lets slax choose. Takes precedence over
    ``SLAX_DEVICE``. JAX computations placed on a CUDA GPU always use the CUDA device of that GPU,
    since their buffers live there."""
    config.device_kind = parse_device_kind(kind, source="slax.set_device_kind")
