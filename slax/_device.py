"""Which SlangPy device runs slax kernels, and creating it once per process.

JAX decides where arrays live; slax follows it. A JAX computation lowered for CUDA runs its Slang
kernels on a SlangPy CUDA device that shares JAX's CUDA context, zero-copy. One lowered for the CPU
runs them on a GPU's Vulkan device, with host copies, where a GPU's Vulkan driver exists; else on
SlangPy's CPU device, on XLA's host buffers in place (faster than Mesa's lavapipe, a Vulkan driver
on the CPU: :func:`automatic_cpu_device_kind`).
``slax.config.device_kind`` (``SLAX_DEVICE``, :func:`slax.set_device_kind`) chooses for
CPU-placed computations; it is part of what JAX traces (:class:`slax._config.LaunchRoutes`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import pathlib
import platform
import re
import shutil
import struct
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator

import jax

from slax._config import DEVICE_ENV_VAR, REFLECTION_ENV_VAR, DeviceKind, LaunchRoutes, config, current_routes
from slax._errors import DeviceUnavailableError


@contextlib.contextmanager
def _exit_handlers_registered() -> Iterator[list[Callable[..., object]]]:
    """The functions this thread registers with :mod:`atexit` while inside."""
    registered: list[Callable[..., object]] = []
    register = atexit.register
    thread = threading.get_ident()

    def recording(function: Callable[..., object], /, *args: object, **kwargs: object) -> object:
        if threading.get_ident() == thread:
            registered.append(function)
        return register(function, *args, **kwargs)

    atexit.register = recording  # type: ignore[assignment]
    try:
        yield registered
    finally:
        atexit.register = register  # type: ignore[assignment]


with _exit_handlers_registered() as _SLANGPY_EXIT_HANDLERS:
    import slangpy as spy
"""SlangPy's extension registers an exit handler that closes every SlangPy device, its parent's
included in a forked child, where closing a Vulkan device waits forever for driver threads fork()
did not copy: a child forked after slax ran kernels on lavapipe hung at exit. A forked child drops
these handlers (:func:`_forget_devices_in_child`). slax imports :mod:`slax._device` before any
other module that imports SlangPy, so it sees them registered unless the program imported SlangPy
before slax."""


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
    unchanged, then the sources of ``slax.load_module_from_source`` by name (read from
    ``SLAX_CACHE_DIR`` as it is now)."""
    return [str(SHADER_DIR), *(str(path) for path in SLANGPY_INCLUDE_PATHS), str(cache_dir() / "sources")]


_lock = threading.Lock()
_devices: dict[tuple[DeviceKind, int], spy.Device] = {}
_generation = 0
_inherited: list[object] = []
"""What a process forked after using slax inherited from its parent: devices (and their buffers)
whose driver threads fork() did not copy (lavapipe's, a GPU driver's). The child never uses,
closes or frees them: each of those waits for the missing threads forever."""


def process_generation() -> int:
    """How many fork()s separate this process from the one that imported slax: a device, kernel
    or buffer made under another generation belongs to an ancestor and must not be used."""
    return _generation


def keep_inherited(*objects: object) -> None:
    """Keeps ``objects`` of an ancestor's devices alive, unused, for the life of this process."""
    _inherited.extend(objects)


def _forget_devices_in_child() -> None:
    """After fork(), in the child: the parent's devices stay behind (:data:`_inherited`); the next
    :func:`get_device` creates the child's own, and launchers rebuild their kernels on it
    (:func:`process_generation`). SlangPy's exit handlers, which would close the parent's devices
    too and wait for their driver's threads forever, are dropped: the child's own devices close
    as the process ends. The lock is new: another thread may have held it at fork()."""
    global _lock, _generation
    if _devices or _inherited:
        for handler in _SLANGPY_EXIT_HANDLERS:
            atexit.unregister(handler)
    keep_inherited(*_devices.values())
    _devices.clear()
    _lock = threading.Lock()
    _generation += 1


os.register_at_fork(after_in_child=_forget_devices_in_child)


def device_kind_for_platform(platform: str, routes: LaunchRoutes | None = None) -> DeviceKind:
    """The device kind that runs kernels of a JAX computation lowered for ``platform`` and traced
    with ``routes`` (default: the routes of ``slax.config`` now).

    Args:
      platform: JAX's lowering platform, ``"cpu"`` or ``"cuda"``.
      routes: the routes the computation was traced with; their ``cpu`` device kind, or the
        automatic choice (:func:`automatic_cpu_device_kind`) where it is None.
    """
    requested = (routes or current_routes()).cpu
    if platform == "cuda":
        if requested in (DeviceKind.VULKAN, DeviceKind.CPU):
            raise ValueError(
                "slax: JAX placed this computation on a CUDA GPU, whose buffers only a SlangPy "
                f"CUDA device can read without copies; unset {DEVICE_ENV_VAR}={requested.value} "
                "(slax.config.device_kind) or run JAX on the CPU (JAX_PLATFORMS=cpu)."
            )
        return DeviceKind.CUDA
    if platform == "cpu":
        return requested or automatic_cpu_device_kind()
    raise ValueError(f"slax: JAX platform {platform!r} is not supported; use cpu or cuda.")


@functools.cache
def automatic_cpu_device_kind() -> DeviceKind:
    """The device that runs kernels of CPU-placed JAX where none is chosen: Vulkan where a GPU's
    Vulkan driver is here; else SlangPy's CPU device, the faster of the two CPU routes (it runs
    kernels in place on XLA's buffers, where a Vulkan driver on the CPU, Mesa's lavapipe, copies
    through Vulkan buffers: every training step measured there took 1.1-7x as long; BENCHMARKS.md,
    "The CPU routes"); lavapipe only where no C++ compiler is here to build the CPU device's kernels.

    A choice that falls back from the faster one (a GPU's Vulkan driver that fails; lavapipe for
    want of a compiler) says so once on stderr, with what to do: a silent one would hide a broken
    driver or a missing compiler behind slower steps."""
    adapters = _vulkan_adapters()
    gpus = [adapter.name for adapter in adapters if not _vulkan_runs_on_the_cpu(adapter)]
    if gpus:
        try:
            get_device(DeviceKind.VULKAN)
            return DeviceKind.VULKAN
        except DeviceUnavailableError as error:
            cause = str(error.__cause__ or error).strip().splitlines()[0]
            _note(
                f"the Vulkan driver of {', '.join(gpus)} failed ({cause}); Slang kernels of CPU-placed "
                f"JAX run on SlangPy's CPU device instead. {DEVICE_ENV_VAR}=cpu chooses it without this note."
            )
            return DeviceKind.CPU
    if adapters and not cpp_compiler():
        _note(
            f"no C++ compiler ({' or '.join(CPP_COMPILERS)}) here to build kernels for SlangPy's CPU "
            f"device, the faster CPU route; Slang kernels of CPU-placed JAX run on Vulkan over "
            f"{adapters[0].name} instead. Install g++ (Debian: `apt-get install g++`) to use the CPU "
            f"device, or set {DEVICE_ENV_VAR}=vulkan to choose Vulkan without this note."
        )
        return DeviceKind.VULKAN
    return DeviceKind.CPU


_MESA_VENDOR_ID = 0x10005
"""VK_VENDOR_ID_MESA: Mesa's lavapipe, a Vulkan driver on the CPU, reports it (Mesa's GPU drivers
report their GPU's PCI vendor)."""

_SWIFTSHADER = (0x1AE0, 0xC0DE)
"""(vendor ID, device ID) of Google's SwiftShader, another Vulkan driver on the CPU."""


def _vulkan_runs_on_the_cpu(adapter: spy.AdapterInfo) -> bool:
    """Whether a Vulkan adapter is a driver on the CPU: SlangPy reports no Vulkan device type, so
    known software drivers are told by their IDs."""
    return adapter.vendor_id == _MESA_VENDOR_ID or (adapter.vendor_id, adapter.device_id) == _SWIFTSHADER


def _vulkan_adapters() -> list[spy.AdapterInfo]:
    """The Vulkan adapters the Vulkan loader lists (none where it or a driver is missing), without
    creating a device."""
    try:
        with _quiet_slangpy(spy.LogLevel.fatal):  # "Failed to create Vulkan instance": none is here
            return list(spy.Device.enumerate_adapters(spy.DeviceType.vulkan))
    except Exception:  # SlangPy raises its own RuntimeError where no Vulkan loader is installed
        return []


def _note(text: str) -> None:
    print(f"slax: {text}", file=sys.stderr)


def cache_dir() -> pathlib.Path:
    """Where compiled Slang modules and shaders persist across processes: ``SLAX_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/slax``, else ``~/.cache/slax``, as the variables are now. A relative directory
    is resolved against the working directory where slax first reads it, once per value: after an
    ``os.chdir`` the modules of ``load_module_from_source`` stay where they were written (and where
    the include path, :func:`include_paths`, finds them)."""
    root = os.environ.get("SLAX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "slax"
    )
    resolved = _resolved_cache_dirs.get(root)
    if resolved is None:
        resolved = _resolved_cache_dirs.setdefault(root, pathlib.Path(root).absolute())
    return resolved


_resolved_cache_dirs: dict[str, pathlib.Path] = {}
"""Each cache directory's value as read, resolved when first read (:func:`cache_dir`)."""


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
    """The process-wide SlangPy device of ``kind`` (for CUDA, of GPU ``ordinal``), created on first
    use (seconds: slax's log says so at INFO)."""
    key = (kind, ordinal)
    with _lock:
        device = _devices.get(key)
        if device is None:
            logging.getLogger("slax").info("creating SlangPy's %s device ...", kind.value)
            device = _create_device(kind, ordinal)
            _devices[key] = device
        return device


_SPY_DEVICE_TYPES = {
    DeviceKind.VULKAN: spy.DeviceType.vulkan,
    DeviceKind.CPU: spy.DeviceType.cpu,
    DeviceKind.CUDA: spy.DeviceType.cuda,
}


def cuda_defines(capability: int | None) -> dict[str, str]:
    """The preprocessor macros slax's Slang is compiled with for a CUDA GPU of compute capability
    ``capability`` (90 for sm_90; None where unknown): ``SLAX_CUDA_ARCH``, from which
    shaders/slax/tensor.slang uses that architecture's instructions (vector reductions from 90).
    Both CUDA routes compile with it (the PTX route in slax/_ptx_launch.py, the SlangPy route's
    device here); without it, kernels use no instruction newer than their own code asks for."""
    return {} if capability is None else {"SLAX_CUDA_ARCH": str(capability)}


def _jax_compute_capability(ordinal: int) -> int | None:
    """JAX's GPU ``ordinal``'s compute capability (90 for "9.0"), or None where JAX has no such
    GPU or does not say."""
    try:
        major, minor = str(jax.devices("gpu")[ordinal].compute_capability).split(".")
        return int(major) * 10 + int(minor)
    except (RuntimeError, IndexError, AttributeError, ValueError):
        return None


def _create_device(kind: DeviceKind, ordinal: int) -> spy.Device:
    if kind is DeviceKind.CPU and not cpp_compiler():
        raise DeviceUnavailableError(_missing_device_advice(kind, RuntimeError("no C++ compiler found")))
    options: dict[str, object] = {"include_paths": include_paths()}
    if kind is DeviceKind.CPU:
        # Slang builds CPU kernels with the C++ compiler at -Os by default; "maximal" gives -O3,
        # which vectorises the loop over a group's threads: 2^20 elements of a*x+b take ~2 ms
        # instead of ~50 ms (BENCHMARKS.md). Floating point stays IEEE: no fast-math, no
        # contraction in ISO C++ mode.
        options["optimization"] = spy.SlangOptimizationLevel.maximal
        if host_cpu_converts_half():
            options["defines"] = {"SLAX_HOST_F16C": "1"}  # shaders/slax/cpu.slang
    cache = writable_cache_dir(kind.value)
    adapter_luid = None
    if kind is DeviceKind.CUDA:
        adapters = spy.Device.enumerate_adapters(spy.DeviceType.cuda)
        if ordinal >= len(adapters):
            seen = f"{len(adapters)} CUDA adapter(s)" if adapters else "no CUDA adapter on this machine"
            raise DeviceUnavailableError(
                f"slax: a SlangPy CUDA device for GPU {ordinal} was asked for (JAX placed on that GPU, "
                f"or {DEVICE_ENV_VAR} or {REFLECTION_ENV_VAR} set to cuda) but SlangPy sees {seen}; "
                "with a GPU, check that CUDA_VISIBLE_DEVICES is the same for JAX and SlangPy."
            )
        # GPU 0 uses SlangPy's default adapter, as verified to share JAX's CUDA context.
        adapter_luid = adapters[ordinal].luid if ordinal else None
        options["defines"] = cuda_defines(_jax_compute_capability(ordinal))
    _set_aside_damaged_shader_cache(cache / "shaders")
    try:
        with _quiet_slangpy(spy.LogLevel.error):
            return spy.Device(
                type=_SPY_DEVICE_TYPES[kind],
                compiler_options=spy.SlangCompilerOptions(options),
                module_cache_path=str(cache / "modules"),
                shader_cache_path=str(cache / "shaders"),
                adapter_luid=adapter_luid,
                enable_hot_reload=False,
                label=f"slax-{kind.value}-{ordinal}",
            )
    except Exception as error:
        raise DeviceUnavailableError(_missing_device_advice(kind, error)) from error


def _lmdb_damage(data: pathlib.Path) -> str | None:
    """What is wrong with the LMDB file ``data`` (SlangPy's shader cache, ``data.mdb``), or None.

    LMDB maps the file and reads pages up to the last one its newer meta page (of pages 0 and 1)
    records; a file cut short below that page (a full disk, a copy interrupted) kills every process
    that opens it with SIGBUS, before LMDB or SlangPy can say anything. So the size is checked
    against the meta pages here, before SlangPy opens it. Layout (64-bit LMDB): a page header of 16
    bytes, then the magic (uint32 0xBEEFC0DE) at 16, the page size (the free-page DB's ``md_pad``)
    at 40, ``mm_last_pg`` at 136 and ``mm_txnid`` at 144.
    """
    try:
        size = data.stat().st_size
        with data.open("rb") as file:
            head = file.read(8192)
    except FileNotFoundError:
        return None
    if size == 0:
        return None  # created, never written: LMDB initialises it
    if len(head) < 152 or struct.unpack_from("<I", head, 16)[0] != _LMDB_MAGIC:
        return f"it holds {size} bytes and no LMDB meta page"
    page = struct.unpack_from("<I", head, 40)[0]
    if page not in (4096, 8192, 16384, 32768, 65536) or size < 2 * page:
        return f"it holds {size} bytes, less than its two meta pages"
    with data.open("rb") as file:
        file.seek(page)
        second = file.read(152)
    metas = [
        struct.unpack_from("<QQ", meta, 136)
        for meta in (head, second)
        if struct.unpack_from("<I", meta, 16)[0] == _LMDB_MAGIC
    ]
    last_page, _ = max(metas, key=lambda meta: meta[1])  # the newer transaction's meta
    needed = (last_page + 1) * page
    return f"it holds {size} bytes, its header records {needed}" if size < needed else None


_LMDB_MAGIC = 0xBEEFC0DE


def _set_aside_damaged_shader_cache(directory: pathlib.Path) -> None:
    """Moves a damaged LMDB shader cache under ``directory`` aside (``<name>.damaged-<pid>``),
    saying so on stderr, so that SlangPy makes a new one instead of dying with SIGBUS on it."""
    for data in sorted(directory.glob("*/data.mdb")):
        damage = _lmdb_damage(data)
        if damage is None:
            continue
        aside = data.parent.with_name(f"{data.parent.name}.damaged-{os.getpid()}")
        try:
            data.parent.rename(aside)
        except OSError as error:
            raise DeviceUnavailableError(
                f"slax: SlangPy's shader cache {data} is damaged ({damage}) and could not be moved "
                f"aside ({error}); delete the directory {data.parent} and run again."
            ) from error
        print(
            f"slax: SlangPy's shader cache {data} was damaged ({damage}); moved it to {aside} "
            "(delete it when you like): kernels compile afresh into a new cache.",
            file=sys.stderr,
        )


def host_cpu_converts_half() -> bool:
    """Whether this machine is an x86-64 whose CPU converts between half and float in hardware
    (F16C: every x86-64 CPU since 2012 has it). Then SlangPy's CPU device builds kernels that use
    it where g++ builds them (shaders/slax/cpu.slang): g++ otherwise converts each ``_Float16``
    with a library call (x86-64 without -mf16c, a flag SlangPy gives no way to pass), which made
    half kernels 3-20x slower than float ones there. Where Slang builds with clang++ (its first
    choice where installed) the conversions stay library calls. Read from /proc/cpuinfo (Linux);
    elsewhere False."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return re.search(r"^flags\s*:.*\bf16c\b", cpuinfo, re.MULTILINE) is not None


CPP_COMPILERS = ("clang++", "g++")
"""The compilers Slang's CPU target builds kernels with (its "pass-through" compilers), in the
order it looks for them on ``PATH``."""


def cpp_compiler() -> str | None:
    """The C++ compiler SlangPy's CPU device will build kernels with, or None: Slang's CPU target
    writes C++ and compiles it with the system's clang++ or g++ (the SlangPy wheel ships no LLVM)."""
    return next((path for path in map(shutil.which, CPP_COMPILERS) if path), None)


@contextlib.contextmanager
def _quiet_slangpy(level: spy.LogLevel) -> Iterator[None]:
    """SlangPy's log at ``level`` and above only: creating a CUDA or CPU device logs a warning to
    stdout ("No supported shader model found, pretending to support sm_6_0") that is about SlangPy's
    own shader models, not slax's kernels, and would land in every user program's output. Failures
    still raise."""
    logger = spy.Logger.get()
    previous = logger.level
    logger.level = max(previous, level)  # never louder: calls nest (the Vulkan probe creates a device)
    try:
        yield
    finally:
        logger.level = previous


def _missing_device_advice(kind: DeviceKind, error: Exception) -> str:
    if kind is DeviceKind.CUDA:
        return (
            f"slax: could not create a SlangPy CUDA device ({error}). It needs an NVIDIA GPU and "
            f"driver; without one, run JAX on the CPU and let slax choose (unset {DEVICE_ENV_VAR})."
        )
    if kind is DeviceKind.CPU:
        return (
            f"slax: cannot run Slang kernels on SlangPy's CPU device ({error}): Slang compiles them "
            f"as C++ with the system's {' or '.join(CPP_COMPILERS)}, and neither is on PATH. Install "
            "one (Debian: `apt-get install g++`; conda: `conda install gxx`), or a Vulkan driver."
        )
    return (
        f"slax: could not create a SlangPy Vulkan device ({error}). Without a GPU driver, either "
        f"use SlangPy's CPU device ({DEVICE_ENV_VAR}=cpu or slax.set_device_kind('cpu'), or leave "
        "the device kind unset to let slax choose), or install Mesa 25's CPU driver lavapipe: on "
        "Debian 12, add bookworm-backports to apt and run `apt-get install -t bookworm-backports "
        "mesa-vulkan-drivers libvulkan1` (Mesa 22 from plain bookworm lacks "
        "VK_KHR_shader_non_semantic_info and fails)."
    )


def default_platform() -> str:
    """JAX's default lowering platform in slax's terms: ``"cpu"`` or ``"cuda"``."""
    return "cuda" if jax.default_backend() == "gpu" else jax.default_backend()


def reflection_device() -> spy.Device:
    """The device whose Slang reflection describes modules (types, signatures, entry points):
    the device of JAX's default platform, which every process using slax has, unless
    ``slax.config.reflection_device`` names another (``SLAX_REFLECTION_DEVICE=cpu`` keeps SlangPy's
    CUDA device out of a process on the PTX route, for profilers that crash in its creation)."""
    return get_device(reflection_override() or device_kind_for_platform(default_platform()))


def reflection_override() -> DeviceKind | None:
    """``slax.config.reflection_device`` where it names a device other than the one of JAX's
    default platform (which runs the kernels), else None: then a module reflected there must
    compile for another target than its kernels' (``slax.load_module`` says so on a compile
    error)."""
    chosen = config.reflection_device
    return None if chosen is device_kind_for_platform(default_platform()) else chosen


def describe_device(platform: str | None = None) -> str:
    """Which device runs slax kernels in computations lowered for ``platform`` (``"cpu"`` or
    ``"cuda"``; default: JAX's default platform) traced now, for logs: ``"vulkan (llvmpipe ...)"``,
    ``"cpu (CPU)"``, naming the device kind and its adapter. ``slax.describe_device()``. On the PTX
    route XLA launches the kernels on JAX's GPU, which names it: no SlangPy CUDA device is created
    to describe it (none may be wanted: ``slax.config.reflection_device``).

    Args:
      platform: ``"cpu"`` or ``"cuda"``; ``None``, JAX's default platform.

    Returns:
      The device kind and its adapter's name.

    Raises:
      ValueError: an unsupported platform, or a CPU device kind chosen for CUDA-placed JAX.
      slax.DeviceUnavailableError: the device cannot be created here.
    """
    platform = platform or default_platform()
    kind = device_kind_for_platform(platform)
    if platform == "cuda" and current_routes().cuda == "ptx":
        return f"{kind.value} ({jax.devices('gpu')[0].device_kind})"
    return f"{kind.value} ({get_device(kind).info.adapter_name})"
