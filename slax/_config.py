"""Run-time switches of slax (``slax.config``), and the launch routes a computation is traced with."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import os
import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from slax._jax_api import TraceState, trace_state_unset

CUDA_LAUNCHES = ("slangpy", "ptx")
MLP_BACKENDS = ("auto", "thread_sums", "tiled", "tensor_cores", "warp_rows", "xla")
"""The values ``slax.config.mlp_backend`` takes: ``"auto"``, or the name of one of the MLP's backends
(slax/nn/_backends.py, whose registry holds these names)."""
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
        ``None``: Vulkan where a GPU's Vulkan driver exists, else SlangPy's CPU device (the faster
        CPU route), or lavapipe where no C++ compiler exists.

    What kernels an MLP runs is no launch route: the MLP's primitives carry their own request
    (slax/nn/_backends.py, ``BackendRequest``), so switching it leaves every other function's
    trace alone.
    """

    cuda: str = "slangpy"
    cpu: DeviceKind | None = None


_traced_routes = TraceState(
    "slax_launch_routes", LaunchRoutes(), include_in_jit_key=True, include_in_trace_context=True
)
"""What JAX keys its caches by: the routes of ``slax.config``'s global values, and per thread those
of the overrides active in it (JAX's own contexts are per thread)."""


def current_routes() -> LaunchRoutes:
    """The routes a slax primitive bound now is traced with: those of ``slax.config`` in this thread."""
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


def _switch(variable: str, default: bool):
    """An on/off setting: (its value from ``variable``, :func:`_parse_switch`; its check of a value
    assigned, True or False only: a truthy string or number would be taken for what it is not)."""

    def parse(value, name: str):
        if not isinstance(value, bool):
            raise TypeError(
                f"slax: {name} must be True or False (slax.config.{name} or {variable}); got {value!r}."
            )
        return value

    return lambda: _parse_switch(os.environ.get(variable), variable, default), parse


def _one_of(setting: str, choices: tuple[str, ...], variable: str, default: str):
    """The setting ``setting`` that takes one of ``choices``: (its value from ``variable``, in any
    case with spaces around, unset or empty ``default``; its check of a value assigned)."""

    def parse(value, name: str):
        if value not in choices:
            raise ValueError(
                f"slax: {name} must be one of {choices} (slax.config.{name} or {variable}); got {value!r}."
            )
        return value

    def from_environment():
        return parse(os.environ.get(variable, "").strip().lower() or default, setting)

    return from_environment, parse


def _parse_device(value, name: str):
    return parse_device_kind(value, source=f"slax.config.{name}")


def _device_from(variable: str):
    return lambda: parse_device_kind(os.environ.get(variable), source=f"the {variable} variable")


_SETTINGS: dict[str, tuple[Callable[[], Any], Callable[..., Any]]] = {
    "debug_nans": _switch("SLAX_DEBUG_NANS", False),
    "debug_bounds": _switch("SLAX_DEBUG_BOUNDS", False),
    "cuda_launch": _one_of("cuda_launch", CUDA_LAUNCHES, "SLAX_CUDA_LAUNCH", "ptx"),
    "device_kind": (_device_from(DEVICE_ENV_VAR), _parse_device),
    "tensor_cores": _switch("SLAX_TENSOR_CORES", True),
    "mlp_backend": _one_of("mlp_backend", MLP_BACKENDS, "SLAX_MLP_BACKEND", "auto"),
    "reflection_device": (_device_from(REFLECTION_ENV_VAR), _parse_device),
}
"""Each setting of :class:`Config`: (its value from the environment, its check of a value given)."""

_TRACED = ("cuda_launch", "device_kind")
"""The settings :class:`LaunchRoutes` carries into what JAX traces."""

_NO_OVERRIDES: Mapping[str, Any] = types.MappingProxyType({})


class _Setting:
    """A setting of :class:`Config`, as a data descriptor: reading it gives this thread's (or
    task's) override where one is active, else the global value; assigning sets the global value.
    Being a class-level data descriptor, it is what tools that save and restore attributes
    (``monkeypatch.setattr``) read and write back, not an entry in the instance's ``__dict__``."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, config, owner=None):
        if config is None:
            return self
        overrides = config._overrides.get()
        return overrides[self.name] if self.name in overrides else config._globals[self.name]

    def __set__(self, config, value) -> None:
        setattr(config, self.name, value)


class Config:
    """Switches of slax.

    ``cuda_launch`` and ``device_kind`` are part of what JAX traces (a jitted function retraces
    when one changes); ``debug_nans``, ``debug_bounds``, ``tensor_cores`` and ``mlp_backend`` are
    read when a call is traced (a jitted function already compiled keeps the setting it was
    compiled with: set them before jitting, or jit afresh), so switching the MLP's kernels retraces
    no other function.

    An assignment (``slax.config.debug_nans = True``) sets the global value, which every thread
    and asyncio task sees where no override is active. :meth:`override` sets values for a ``with``
    block in the thread or task that enters it only (a ``contextvars`` variable): two threads'
    overlapping blocks each see their own, and each block's exit restores exactly what it changed.
    What JAX traces follows the overrides of the thread that traces (JAX keys its caches per
    thread): a function jitted inside a block of thread A runs A's routes, thread B's B's.

    Attributes:
      debug_nans: check every Slang kernel's floating results and raise ``FloatingPointError``
        naming the first kernel (and Slang function) that produced a NaN or Inf. Off by default: it
        copies results to the host. Also on when ``SLAX_DEBUG_NANS=1`` (or true, on, yes) or when JAX's own
        ``jax_debug_nans`` is set.
      debug_bounds: before each call of a Slang function with tensor parameters, run it once more
        checking every tensor index against the tensor's shape, and raise ``IndexError`` naming the
        function, the parameter, its shape and the index (inside ``jax.jit``, as XLA's runtime
        error). Off by default (an index outside is clamped to the axis's last element); it costs
        a launch and a host copy per call. Also on when ``SLAX_DEBUG_BOUNDS=1`` (or true, on, yes).
      cuda_launch: how kernels run when JAX runs on a CUDA GPU. ``"ptx"`` (the default, the faster
        route as measured on an H100; BENCHMARKS.md): Slang compiles the kernel to PTX and XLA
        launches it through jaxlib's Triton kernel launcher, with no Python per call (see
        ``slax/_ptx_launch.py``); kernels it cannot launch take the SlangPy route, with a warning.
        ``"slangpy"``: SlangPy dispatches each kernel from a ``buffer_callback`` on XLA's buffers
        and stream. Also set by ``SLAX_CUDA_LAUNCH``.
      device_kind: the SlangPy device that runs kernels of CPU-placed JAX: ``"vulkan"`` (a GPU
        driver, or Mesa's lavapipe on the CPU; host copies), ``"cpu"`` (SlangPy's CPU device, on
        XLA's host buffers in place) or ``"cuda"`` (host copies). ``None``, the default: Vulkan
        where a GPU's Vulkan driver exists, else the CPU device, the faster CPU route (Vulkan over
        lavapipe where no C++ compiler exists, saying so once). Also set by ``SLAX_DEVICE`` and
        :func:`set_device_kind`; JAX placed on a CUDA GPU always uses that GPU's CUDA device.
      tensor_cores: on CUDA GPUs (sm_80 and newer), let the MLP (``slax.nn``) run on tensor cores:
        wide networks on the ``tensor_cores`` backend, each product split into TF32 pieces so
        that float32 networks keep float32's accuracy (``shaders/nn/tensor_cores.slang``), and the
        fused loss and gradient of narrow float16 networks (layers at most 16 wide) a warp per
        tile of 16 samples (``shaders/nn/warp_mma.slang``); True by default. False runs them on
        the tiled and per-sample kernels every device runs, whose rounding is the CPU routes'.
        Read when ``mlp_apply`` or ``mlp_loss_and_grad`` is traced. Also set by
        ``SLAX_TENSOR_CORES=0``.
      mlp_backend: which backend runs the MLP's operations (``slax.nn.describe`` says which each
        takes, and why): ``"auto"``, the default, the fused Slang kernels where they fit, except
        where they are known to lose to XLA's own matrix products; or one of ``"thread_sums"``,
        ``"tiled"``, ``"tensor_cores"``, ``"xla"`` to force it (a backend that cannot run the
        network on its platform raises ``ValueError`` saying why). Read when ``mlp_apply`` or
        ``mlp_loss_and_grad`` is traced. Also set by ``SLAX_MLP_BACKEND``.
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

    debug_nans = _Setting()
    debug_bounds = _Setting()
    cuda_launch = _Setting()
    device_kind = _Setting()
    tensor_cores = _Setting()
    mlp_backend = _Setting()
    reflection_device = _Setting()

    def __init__(self, trace_state=None) -> None:
        """The settings' global values come from the environment; ``trace_state`` (``slax.config``'s
        is ``_traced_routes``) is the JAX state that follows their :class:`LaunchRoutes`."""
        globals_ = {name: default() for name, (default, _) in _SETTINGS.items()}
        object.__setattr__(self, "_globals", globals_)
        overrides = contextvars.ContextVar("slax_config_overrides", default=_NO_OVERRIDES)
        object.__setattr__(self, "_overrides", overrides)
        object.__setattr__(self, "_trace_state", trace_state)
        if trace_state is not None:
            trace_state.set_global(self._routes(globals_))

    def __getattr__(self, name: str):
        raise AttributeError(f"slax.config has no setting {name!r}; settings: {', '.join(_SETTINGS)}.")

    def __setattr__(self, name: str, value) -> None:
        self._globals[name] = self._parse(name, value)
        if name in _TRACED and self._trace_state is not None:
            self._trace_state.set_global(self._routes(self._globals))

    def __dir__(self):
        return [*super().__dir__(), *_SETTINGS]

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in _SETTINGS) + ")"

    @staticmethod
    def _parse(name: str, value):
        if name not in _SETTINGS:
            raise AttributeError(f"slax.config has no setting {name!r}; settings: {', '.join(_SETTINGS)}.")
        return _SETTINGS[name][1](value, name)

    @staticmethod
    def _routes(values) -> LaunchRoutes:
        return LaunchRoutes(cuda=values["cuda_launch"], cpu=values["device_kind"])

    def _follow_overrides(self) -> None:
        """Sets this thread's value of the JAX state to the routes of this context's overrides, or
        clears it (the global value applies) where none of them is a traced setting."""
        if self._trace_state is None:
            return
        overrides = self._overrides.get()
        if any(name in overrides for name in _TRACED):
            self._trace_state.set_local(self._routes({**self._globals, **overrides}))
        else:
            self._trace_state.set_local(trace_state_unset)

    @contextlib.contextmanager
    def override(self, **changes):
        """Sets ``changes`` (validated as an assignment is) for the ``with`` block, in this thread or
        asyncio task only, then restores exactly the values before it, also on error:
        ``with slax.config.override(cuda_launch="ptx"): ...``.

        Args:
          **changes: settings and their values for the block.

        Returns:
          A context manager; ``as`` gives ``slax.config`` itself.

        Raises:
          AttributeError: an unknown setting.
          TypeError: a value of the wrong type (``tensor_cores`` takes a bool).
          ValueError: a value the setting does not take.
        """
        parsed = {name: self._parse(name, value) for name, value in changes.items()}
        token = self._overrides.set(types.MappingProxyType({**self._overrides.get(), **parsed}))
        try:
            self._follow_overrides()
            yield self
        finally:
            self._overrides.reset(token)
            self._follow_overrides()


config = Config(_traced_routes)


def set_device_kind(kind: str | DeviceKind | None) -> None:
    """Chooses the SlangPy device for CPU-placed JAX computations (``slax.config.device_kind``):
    ``"vulkan"``, ``"cpu"`` or ``"cuda"``; ``None`` lets slax choose. Takes precedence over
    ``SLAX_DEVICE``. JAX computations placed on a CUDA GPU always use the CUDA device of that GPU,
    since their buffers live there.

    Args:
      kind: ``"vulkan"``, ``"cpu"``, ``"cuda"`` (any case), a :class:`DeviceKind`, or ``None``.

    Raises:
      ValueError: an unknown device kind's name.
      TypeError: neither a name, a :class:`DeviceKind` nor ``None``.
    """
    config.device_kind = parse_device_kind(kind, source="slax.set_device_kind")
