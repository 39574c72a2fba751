"""Which SlangPy device runs slax kernels, and creating it once per process.

JAX decides where arrays live; slax follows it. A JAX computation lowered for the CPU runs its Slang
kernels on a Vulkan device (a real GPU driver where there is one, Mesa's lavapipe CPU driver
otherwise) with host copies; one lowered for CUDA runs them on a SlangPy CUDA device that shares
JAX's CUDA context, zero-copy. ``SLAX_DEVICE=cuda|vulkan`` or :func:`set_device_kind` override the
choice for CPU-placed computations.
"""

from __future__ import annotations

import contextlib
import enum
import os
import pathlib
import tempfile
import threading
from collections.abc import Iterator

import jax
import slangpy as spy

from slax._errors import DeviceUnavailableError


def _find_shader_dir() -> pathlib.Path:
    """slax's own Slang sources: ``slax/shaders`` in an installed wheel (pyproject.toml maps the
    repository's top-level ``shaders/`` there), ``shaders/`` beside the package in a source checkout
    (an editable install or ``PYTHONPATH``)."""
    package = pathlib.Path(__file__).resolve().parent
    candidates = (package / "shaders", package.parent / "shaders")
    for candidate in candidates:
        if (candidate / "slax" / "kernel.slang").is_file():
            return candidate
    raise FileNotFoundError(
        f"slax: its Slang sources (slax/kernel.slang) are in neither of {[str(c) for c in candidates]}; "
        "the installation is incomplete: reinstall slang-jax."
    )


SHADER_DIR = _find_shader_dir()
"""Slang sources shipped with slax; always on the include path."""


SLANGPY_INCLUDE_PATHS = (
    pathlib.Path(spy.__file__).parent / "slang",
    pathlib.Path(spy.__file__).parent / "shaders",
)
"""What SlangPy's sessions add to the include path (``add_default_include_paths``;
``slangpy.SHADER_PATH`` is the first), where ``slangpy.slang`` lives."""


def include_paths() -> list[str]:
    """The directories Slang searches for ``import``, on every device and every compile route (and
    when slax lists a module's imports for its content key): slax's own sources, then SlangPy's, so
    that modules written as SlangPy's documentation writes them (``import slangpy;``) load
    unchanged."""
    return [str(SHADER_DIR), *(str(path) for path in SLANGPY_INCLUDE_PATHS)]


ENV_VAR = "SLAX_DEVICE"


class DeviceKind(enum.Enum):
    """The SlangPy device types slax runs kernels on."""

    VULKAN = "vulkan"
    CUDA = "cuda"


_lock = threading.Lock()
_devices: dict[tuple[DeviceKind, int], spy.Device] = {}
_override: DeviceKind | None = None


def parse_device_kind(value: str, *, source: str) -> DeviceKind:
    """Turns a user-given name into a :class:`DeviceKind`, or says which names are valid."""
    try:
        return DeviceKind(value.strip().lower())
    except ValueError:
        valid = ", ".join(repr(k.value) for k in DeviceKind)
        raise ValueError(
            f"slax: unknown device kind {value!r} from {source}; expected one of {valid}."
        ) from None


def set_device_kind(kind: str | DeviceKind | None) -> None:
    """Chooses the device for CPU-placed JAX computations; ``None`` restores the default.

    Takes precedence over ``SLAX_DEVICE``. JAX computations placed on a CUDA GPU always use
    the CUDA device of that GPU, since their buffers live there.
    """
    global _override
    if kind is None or isinstance(kind, DeviceKind):
        _override = kind
    else:
        _override = parse_device_kind(kind, source="slax.set_device_kind")


def device_kind_for_platform(platform: str) -> DeviceKind:
    """The device kind that runs kernels of a JAX computation lowered for ``platform``.

    Args:
      platform: JAX's lowering platform, ``"cpu"`` or ``"cuda"``.
    """
    requested = _override
    if requested is None and os.environ.get(ENV_VAR):
        requested = parse_device_kind(os.environ[ENV_VAR], source=f"the {ENV_VAR} variable")
    if platform == "cuda":
        if requested is DeviceKind.VULKAN:
            raise ValueError(
                "slax: JAX placed this computation on a CUDA GPU, whose buffers only a SlangPy "
                "CUDA device can read without copies; unset SLAX_DEVICE=vulkan or run JAX on the "
                "CPU (JAX_PLATFORMS=cpu)."
            )
        return DeviceKind.CUDA
    if platform == "cpu":
        return requested or DeviceKind.VULKAN
    raise ValueError(f"slax: JAX platform {platform!r} is not supported; use cpu or cuda.")


def cache_dir() -> pathlib.Path:
    """Where compiled Slang modules and shaders persist across processes."""
    root = os.environ.get("SLAX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "slax"
    )
    return pathlib.Path(root)


def writable_cache_dir(*parts: str) -> pathlib.Path:
    """``cache_dir() / parts``, created and checked writable; else an OSError naming it and
    ``SLAX_CACHE_DIR`` (rather than a failure further on that blames something else)."""
    directory = cache_dir().joinpath(*parts)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise OSError(
            error.errno,
            f"slax: cannot write to its cache directory {directory} ({error.strerror or error}); "
            "set SLAX_CACHE_DIR to a writable directory: slax keeps compiled Slang modules and "
            "the sources of load_module_from_source there",
        ) from error
    return directory


def get_device(kind: DeviceKind, ordinal: int = 0) -> spy.Device:
    """The process-wide SlangPy device of ``kind`` (for CUDA, of GPU ``ordinal``)."""
    key = (kind, ordinal)
    with _lock:
        device = _devices.get(key)
        if device is None:
            device = _create_device(kind, ordinal)
            _devices[key] = device
        return device


def _create_device(kind: DeviceKind, ordinal: int) -> spy.Device:
    options = spy.SlangCompilerOptions({"include_paths": include_paths()})
    cache = writable_cache_dir(kind.value)
    adapter_luid = None
    if kind is DeviceKind.CUDA:
        adapters = spy.Device.enumerate_adapters(spy.DeviceType.cuda)
        if ordinal >= len(adapters):
            raise DeviceUnavailableError(
                f"slax: JAX uses CUDA GPU {ordinal} but SlangPy sees {len(adapters)} CUDA "
                "adapter(s); check CUDA_VISIBLE_DEVICES is the same for both."
            )
        # GPU 0 uses SlangPy's default adapter, as verified to share JAX's CUDA context.
        adapter_luid = adapters[ordinal].luid if ordinal else None
    try:
        with _quiet_slangpy():
            return spy.Device(
                type=spy.DeviceType.cuda if kind is DeviceKind.CUDA else spy.DeviceType.vulkan,
                compiler_options=options,
                module_cache_path=str(cache / "modules"),
                shader_cache_path=str(cache / "shaders"),
                adapter_luid=adapter_luid,
                enable_hot_reload=False,
                label=f"slax-{kind.value}-{ordinal}",
            )
    except Exception as error:
        raise DeviceUnavailableError(_missing_device_advice(kind, error)) from error


@contextlib.contextmanager
def _quiet_slangpy() -> Iterator[None]:
    """SlangPy's log at errors only: creating a CUDA device logs a warning to stdout ("No supported
    shader model found, pretending to support sm_6_0") that is about SlangPy's own shader models,
    not slax's kernels, and would land in every user program's output. Failures still raise."""
    logger = spy.Logger.get()
    level = logger.level
    logger.level = spy.LogLevel.error
    try:
        yield
    finally:
        logger.level = level


def _missing_device_advice(kind: DeviceKind, error: Exception) -> str:
    if kind is DeviceKind.CUDA:
        return (
            f"slax: could not create a SlangPy CUDA device ({error}). It needs an NVIDIA GPU and "
            "driver; without one, run JAX on the CPU and let slax use Vulkan (unset SLAX_DEVICE)."
        )
    return (
        f"slax: could not create a SlangPy Vulkan device ({error}). Without a GPU driver, "
        "install Mesa 25's CPU driver lavapipe: on Debian 12, add bookworm-backports to apt "
        "and run `apt-get install -t bookworm-backports mesa-vulkan-drivers libvulkan1` "
        "(Mesa 22 from plain bookworm lacks VK_KHR_shader_non_semantic_info and fails)."
    )


def default_platform() -> str:
    """JAX's default lowering platform in slax's terms: ``"cpu"`` or ``"cuda"``."""
    return "cuda" if jax.default_backend() == "gpu" else jax.default_backend()


def reflection_device() -> spy.Device:
    """The device whose Slang reflection describes modules (types, signatures, entry points):
    the device of JAX's default platform, which every process using slax has."""
    return get_device(device_kind_for_platform(default_platform()))


def describe_device(platform: str | None = None) -> str:
    """Which SlangPy device runs slax kernels in computations lowered for ``platform`` (``"cpu"`` or
    ``"cuda"``; default: JAX's default platform), for logs: ``"vulkan (llvmpipe ...)"``, naming the
    device kind and its adapter. ``slax.describe_device()``."""
    kind = device_kind_for_platform(platform or default_platform())
    return f"{kind.value} ({get_device(kind).info.adapter_name})"
