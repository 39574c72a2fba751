"""One device fixture for the whole suite: each test whose result depends on the route its kernels
take runs on every device kind this machine has (``SLAX_TEST_DEVICES`` picks some); a test (or a
parameter) marked ``one_device_kind`` runs once, and a test marked ``sweep`` runs every case on the
first kind and a sample of them on the others.

``--quick`` runs on one device kind what the full run runs on each further kind, and no test marked
``slow``: of a sweep, its sample; of a test some of whose parameters are marked ``one_device_kind``,
the others (its representative few); and of a test marked ``quick_sample`` (a sweep the full run
runs whole on every kind), its sample too; each kernel family and entry point keeps a test. From a
cold cache it takes about 9 minutes on 2 cores, about 5 run again (the full run: about 25 minutes).

The markers decide what CI's legs run (``.ci/run``): the first runs everything (the README's test
command); the other JAX releases run the tests marked ``jax_version``, those that exercise how slax
plugs into JAX (its rules, lowerings, sharding, and the API in ``slax/_jax_api.py``): one
representative of each mechanism, so a test parametrized over kernels (examples, sizes, dtypes)
marks one parameter (``pytest.param(..., marks=pytest.mark.jax_version)``), not all of them."""

from __future__ import annotations

import collections
import ctypes
import functools
import importlib.metadata
import json
import os
import pathlib
import signal
import sys

import jax
import pytest
from _helpers import run_python

import slax
from slax._device import cache_dir, cpp_compiler, get_device

PRECISION_ENV_VAR = "JAX_DEFAULT_MATMUL_PRECISION"
# The suite holds float32 results to float32's accuracy (1e-5 relative): JAX's products at HIGHEST,
# and so slax's, which follow JAX's rule (slax/nn/_precision.py), in this process and in the Python
# processes its tests start. JAX's default (one TF32 pass on GPUs with tensor cores) is tested where
# a test asks for it by name (tests/test_precision.py, tests/test_tensor_cores.py,
# tests/test_ptx_launch.py). It changes nothing on the CPU routes, whose products are float32's.
os.environ.setdefault(PRECISION_ENV_VAR, "highest")
jax.config.update("jax_default_matmul_precision", os.environ[PRECISION_ENV_VAR])


def pytest_report_header(config) -> str:
    """The versions under test, for CI logs that run the suite on more than one JAX."""
    import jaxlib
    import slangpy

    return (
        f"slax under JAX {jax.__version__} (jaxlib {jaxlib.__version__}), SlangPy {slangpy.__version__}; "
        f"device kinds under test: {', '.join(_device_kinds())}"
    )


DEVICES_ENV_VAR = "SLAX_TEST_DEVICES"
"""Restricts the device kinds the suite runs on (comma-separated, e.g. ``cpu``); default: all."""

_quick = False
"""``--quick``: the first device kind only, no test marked ``slow``, and of the tests the full run
runs in part on further kinds, that part (:func:`pytest_collection_modifyitems`)."""


def pytest_addoption(parser):
    parser.addoption(
        "--quick",
        action="store_true",
        help="a run of about 9 minutes on 2 cores: on the first device kind only, the tests not "
        "marked slow, and of sweeps a sample taking every value once",
    )


def pytest_configure(config):
    global _quick
    _quick = config.getoption("--quick")
    if _quick:
        chosen = config.option.markexpr
        config.option.markexpr = f"({chosen}) and not slow" if chosen else "not slow"
    _compile_cpu_programs_quickly()
    _compile_plain_jax_quickly()


PLAIN_JAX_COMPILES = {
    "jax_disable_most_optimizations": True,
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": 0,
}
"""How the suite's processes compile on a machine without a GPU, where XLA's compiles of plain JAX
(each test's twins, data and initial parameters, and in each Python process a test starts, those
of every step and ``mlp_init`` again) took as long as Slang's: 154 s of a 308 s run of
test_nn_kernels and test_backends on the CPU device, in 686 compiles.
XLA's CPU back end runs without LLVM's optimisations (``jax_disable_most_optimizations``: about a
fifth less CPU time over a test file here; the same IEEE arithmetic, more slowly on the suite's
small arrays), and every program is kept in JAX's persistent compilation cache, which the other
processes of the run (pytest-xdist's workers, the processes tests start) read instead of compiling
it again. JAX keeps no program holding slax's kernels there (their launches are host callbacks,
which it never writes), so only plain JAX's programs are shared. GPU sessions compile as users do."""


XLA_CPU_FLAGS = "--xla_cpu_use_fusion_emitters=false"
"""XLA flags for the suite's processes, through ``XLA_FLAGS`` (a flag named there already is left
as it is): XLA's CPU back end emits fusions with its LLVM IR emitters instead of its MLIR ones,
which compile a small program in about 40% less time, and most of the suite's compiles are such
programs (JAX's eager operations, mostly on the twins' side). The arithmetic is IEEE either way;
a sum's order or a contraction into an FMA may differ, within the suite's tolerances. The flag
concerns XLA's CPU back end alone, and only jaxlib 0.10 (the suite's first CI leg) gets it:
jaxlib 0.12's XLA no longer knows it and, named in ``XLA_FLAGS``, stops the process as its back
ends start. Set before JAX starts its back ends (which read ``XLA_FLAGS`` once), and for the
processes tests start."""
XLA_CPU_FLAGS_JAXLIB = (0, 10)
"""The jaxlib release (major, minor) whose XLA the suite measured :data:`XLA_CPU_FLAGS` on."""


def _compile_cpu_programs_quickly() -> None:
    """Adds :data:`XLA_CPU_FLAGS` to ``XLA_FLAGS`` under the jaxlib release that has them
    (:data:`XLA_CPU_FLAGS_JAXLIB`), each flag not named there already."""
    release = tuple(int(part) for part in importlib.metadata.version("jaxlib").split(".")[:2])
    if release != XLA_CPU_FLAGS_JAXLIB:
        return
    given = os.environ.get("XLA_FLAGS", "")
    for flag in XLA_CPU_FLAGS.split():
        if flag.split("=")[0] not in given:
            given = f"{given} {flag}".strip()
    os.environ["XLA_FLAGS"] = given


def _jax_on_gpu() -> bool:
    """Whether JAX runs on a GPU here: the suite then tests CUDA alone, compiling as users do."""
    return any(device.platform == "gpu" for device in jax.devices())


def _compile_plain_jax_quickly() -> None:
    """Applies :data:`PLAIN_JAX_COMPILES` and the cache's directory (``jax-tests`` in slax's cache
    directory) to this process, and through the environment to the processes it starts; a setting
    already in the environment is left as it is."""
    if _jax_on_gpu():
        return
    settings = {**PLAIN_JAX_COMPILES, "jax_compilation_cache_dir": str(cache_dir() / "jax-tests")}
    for name, value in settings.items():
        variable = name.upper()
        if variable not in os.environ:
            os.environ[variable] = str(int(value) if isinstance(value, bool) else value)
            jax.config.update(name, value)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """A pytest-xdist worker whose tests have all run and reported ignores SIGINT from here on.
    execnet sends one to a worker still ending 5 s after the controller asked it to exit
    (``_terminate_execution`` in execnet/gateway_base.py), and a worker's end (pytest's last
    ``gc.collect`` over the heap its tests left) can take longer on a busy 2-core machine. The
    ``KeyboardInterrupt`` then landed wherever the worker was, often in JAX's gc callback, and
    ended a green run with a ``PytestUnraisableExceptionWarning``. The controller ends a worker
    still running 10 s after it asked."""
    if hasattr(session.config, "workerinput"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@functools.cache
def _device_kinds() -> list[str]:
    """The device kinds under test: CUDA on a GPU machine; elsewhere both CPU routes, SlangPy's CPU
    device where a C++ compiler exists and Vulkan (lavapipe) where a Vulkan device can be created,
    the CPU device first (it runs the suite faster: tests marked ``one_device_kind`` take it);
    ``SLAX_TEST_DEVICES`` picks some of them (CI's other JAX releases run one); ``--quick`` the
    first."""
    if _jax_on_gpu():
        return ["cuda"]
    kinds = []
    if cpp_compiler():
        kinds.append("cpu")
    try:
        get_device(slax.DeviceKind.VULKAN)
        kinds.append("vulkan")
    except slax.DeviceUnavailableError:
        pass
    chosen = os.environ.get(DEVICES_ENV_VAR)
    if chosen:
        wanted = [kind.strip() for kind in chosen.split(",") if kind.strip()]
        missing = [kind for kind in wanted if kind not in kinds]
        if missing:
            raise pytest.UsageError(
                f"{DEVICES_ENV_VAR}={chosen!r} asks for {missing}, which this machine lacks; it has {kinds}."
            )
        kinds = wanted
    if not kinds:
        raise pytest.UsageError("no device runs slax kernels here: no Vulkan driver and no C++ compiler.")
    return kinds[:1] if _quick else kinds


def pytest_generate_tests(metafunc):
    """Every test runs on each device kind under test (:func:`device_kind`), but tests marked
    ``one_device_kind`` run once (:func:`_one_kind`): those whose result does not depend on the
    route (layouts, lowering for CUDA, the experiments' flags and files, JAX's API) and those that
    choose their devices themselves, in the processes they start."""
    if "device_kind" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("one_device_kind")
        kinds = [_one_kind(marker)] if marker else _device_kinds()
        metafunc.parametrize("device_kind", kinds, indirect=True)


def _one_kind(marker) -> str:
    """The kind a test or parameter marked ``one_device_kind`` runs on: the kind the marker names
    (``pytest.mark.one_device_kind("vulkan")``, for kernels that kind compiles fastest) where it is
    under test, else the first."""
    kinds = _device_kinds()
    return marker.args[0] if marker.args and marker.args[0] in kinds else kinds[0]


def pytest_collection_modifyitems(config, items):
    """A parameter marked ``one_device_kind`` (``pytest.param(..., marks=...)``) runs on one kind, as
    a marked test does (:func:`pytest_generate_tests`): a test whose parameters differ by route only
    in the kernels they compile runs all of them on one kind and a representative few on every
    kind. A test marked ``sweep`` takes those few itself (:func:`_route_sample`), from its cases
    that run on the kind (a sweep may put some of its parameters on one kind). ``--quick`` runs
    those few alone (:func:`_one_kind_cases`), and the sample of a test marked ``sweep`` or
    ``quick_sample`` (:func:`_sampled`)."""
    kept, dropped = [], []
    on_route = [item for item in items if not _off_route(item)]
    left_to_the_full_run = _one_kind_cases(on_route) if _quick else set()
    on_route = [item for item in on_route if item not in left_to_the_full_run]
    sampled = [item for item in on_route if _sampled(item)]
    samples = _route_sample(sampled)
    for item in items:
        kind = getattr(item, "callspec", None) and item.callspec.params.get("device_kind")
        unsampled = item not in samples and (
            (item.get_closest_marker("sweep") and kind != _device_kinds()[0]) or (_quick and _sampled(item))
        )
        (dropped if _off_route(item) or unsampled or item in left_to_the_full_run else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    _longest_files_first(items)


SLOW_WEIGHT = 10
"""What a test marked ``slow`` counts for in :func:`_longest_files_first`, where another counts 1."""

QUICK_SECONDS = pathlib.Path(__file__).with_name("quick_seconds.json")
"""Each test file's seconds under ``scripts/test.sh --quick`` from a cold cache on a 2-core machine
(its tests' setup, call and teardown, as ``--durations=0`` lists them, summed), which orders
``--quick``'s files (:func:`_longest_files_first`). Counts of tests misorder them: 12 tests of
test_nn_activations.py take 56 s, 48 of test_bridge.py 4 s; by counts the former came among the
last files given out, where a long file can leave one worker running alone.
A stale entry costs only balance; measure again when a file's time changes by much."""

SECONDS_PER_UNLISTED_TEST = 1.5
"""A test's expected seconds under ``--quick`` in a file :data:`QUICK_SECONDS` does not list: the
suite's mean."""


def _longest_files_first(items) -> None:
    """Orders the files, each keeping its tests in order, by their expected time, longest first:
    under ``--quick`` the seconds :data:`QUICK_SECONDS` gives; in the full run a file's count of
    tests, a test marked ``slow`` counting :data:`SLOW_WEIGHT`. scripts/test.sh gives each
    pytest-xdist worker whole files (``--dist loadfile``) in this order: a file's tests share the
    kernels they compile, which a worker then compiles once (the CPU device keeps no compiled
    kernel on disk for another process to read), and the longest files start first, so the last
    to end is a short one and both workers end together."""
    weight: collections.Counter = collections.Counter()
    for item in items:
        weight[item.path] += SLOW_WEIGHT if item.get_closest_marker("slow") else 1
    if _quick:
        seconds = json.loads(QUICK_SECONDS.read_text())
        for path, count in weight.items():
            weight[path] = seconds.get(path.name, count * SECONDS_PER_UNLISTED_TEST)
    items.sort(key=lambda item: -weight[item.path])


def _sampled(item) -> bool:
    """Whether ``--quick`` runs only a sample of ``item``'s test (:func:`_route_sample`): tests marked
    ``sweep``, and those marked ``quick_sample`` (sweeps that the full run runs whole on every
    kind)."""
    return bool(item.get_closest_marker("sweep") or item.get_closest_marker("quick_sample"))


def _one_kind_cases(items) -> set:
    """The cases ``--quick`` leaves to the full run: of a test some of whose parameters are marked
    ``one_device_kind`` (``pytest.param(..., marks=...)``) and others not, those marked. The full
    run runs them on one kind and the others, the test's representative few, on every kind;
    ``--quick`` runs on its one kind what the full run runs on each further kind."""
    by_test: dict = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        on_one_kind = any(mark.name == "one_device_kind" for mark in callspec.marks)
        by_test.setdefault((item.path, item.originalname), ([], []))[on_one_kind].append(item)
    return {item for every, one in by_test.values() if every for item in one}


def _off_route(item) -> bool:
    """Whether ``item`` is a case of a test or parameter marked ``one_device_kind`` on another kind."""
    marker = item.get_closest_marker("one_device_kind")
    kind = getattr(item, "callspec", None) and item.callspec.params.get("device_kind")
    return bool(marker and kind and kind != _one_kind(marker))


def _route_sample(items) -> set:
    """Of the cases of tests marked ``sweep`` (sizes, batches, dtypes, activations of the same
    kernels), those that run on every device kind; the others run on the first kind alone. The
    sample takes every value of every parameter at least once: the diagonal of the parameters'
    product (its i-th case takes each parameter's i-th value, modulo its count), then, where a test's
    cases are not the whole product, the first case bringing each value the diagonal missed. The
    cases differ by route only in the kernels each route compiles from the same Slang, and the
    sample compiles each value's on every route."""
    by_test: dict = {}
    for item in items:
        kind = item.callspec.params.get("device_kind")
        params = {name: repr(value) for name, value in item.callspec.params.items() if name != "device_kind"}
        by_test.setdefault((item.function, kind), []).append((item, params))
    sampled = set()
    for cases in by_test.values():
        values: dict[str, list[str]] = {}
        for _, params in cases:
            for name, value in params.items():
                if value not in values.setdefault(name, []):
                    values[name].append(value)
        count = max((len(options) for options in values.values()), default=1)
        diagonal = [
            {name: options[i % len(options)] for name, options in values.items()} for i in range(count)
        ]
        covered: set = set()
        for item, params in cases:
            if params in diagonal:
                sampled.add(item)
                covered.update(params.items())
        for item, params in cases:
            if not set(params.items()) <= covered:
                sampled.add(item)
                covered.update(params.items())
    return sampled


@pytest.fixture(autouse=True)
def device_kind(request, monkeypatch):
    """The SlangPy device kind under test, for this process (``slax.config.device_kind``) and the
    processes tests start (``SLAX_DEVICE``): on CPU machines each test runs on Vulkan (lavapipe) and
    on SlangPy's CPU device; with a GPU on CUDA, which JAX's placement chooses."""
    if request.param == "cuda":
        yield request.param
        return
    monkeypatch.setenv("SLAX_DEVICE", request.param)
    with slax.config.override(device_kind=request.param):
        yield request.param


@functools.cache
def _cpu_path_missing() -> str | None:
    """Why CPU-placed JAX cannot run Slang kernels here, or None if it can. Only asked on machines
    with a GPU (elsewhere the whole suite runs on the CPU path): they may have neither a Vulkan
    driver nor a C++ compiler, so a fresh process asks slax to choose the device CPU-placed JAX
    would use, and creates it."""
    if "cuda" not in _device_kinds():
        return None
    probe = "import slax._device as d; d.get_device(d.device_kind_for_platform('cpu'))"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = run_python("-c", probe, env=env, timeout=300)
    if result.returncode == 0:
        return None
    return "no device for it on this machine: " + (result.stderr.strip().splitlines() or ["?"])[-1][:300]


@functools.cache
def _vulkan_missing() -> str | None:
    """Why no SlangPy Vulkan device can be created here (None if one can)."""
    if "vulkan" in _device_kinds():
        return None
    try:
        get_device(slax.DeviceKind.VULKAN)
    except slax.DeviceUnavailableError as error:
        return str(error).splitlines()[0][:300]
    return None


@pytest.fixture
def vulkan_driver():
    """For tests that need a Vulkan device whichever kinds are under test: skips, saying why, where
    none can be created (a GPU machine without NVIDIA's Vulkan driver, a CPU machine without
    lavapipe)."""
    missing = _vulkan_missing()
    if missing:
        pytest.skip(f"needs a Vulkan device; {missing}")


@pytest.fixture
def cpu_path():
    """For tests of CPU-placed JAX (host devices, cross-lowering) in a subprocess: skips, saying
    why, on a GPU machine with neither a Vulkan driver nor a C++ compiler for SlangPy's CPU device."""
    missing = _cpu_path_missing()
    if missing:
        pytest.skip(f"tests slax with JAX on the CPU; {missing}")


@pytest.fixture
def fused_kernels(monkeypatch):
    """For a test about the MLP's Slang kernels: ``"auto"`` takes them wherever they fit, passing
    over none of them where XLA's products were measured faster (the second column of the rule's
    table, ``_backends.AUTO``)."""
    from slax.nn import _backends

    monkeypatch.setattr(_backends, "AUTO", tuple((name, ()) for name, _ in _backends.AUTO))


@pytest.fixture
def lowered(monkeypatch, fused_kernels):
    """The MLP kernels lowered while the test runs: (architecture, entry point, tensor cores), the
    warp tiles' kernels (float16, or float32 at one TF32 pass) as (architecture, entry point, "warp
    tiles"). How their float32 products run is tests/test_ptx_launch.py's to check."""
    from slax.nn import _backends

    kernels = []
    make, make_wide = _backends.kernel, _backends.wide_warp_kernel

    def recorded(arch, entry, tensor_cores, *products):
        kernels.append((arch, entry, tensor_cores))
        return make(arch, entry, tensor_cores, *products)

    def recorded_wide(arch, entry):
        kernels.append((arch, entry, "warp tiles"))
        return make_wide(arch, entry)

    monkeypatch.setattr(_backends, "kernel", recorded)
    monkeypatch.setattr(_backends, "wide_warp_kernel", recorded_wide)
    return kernels


@pytest.fixture
def rng():
    """A fixed-seed NumPy generator, fresh per test."""
    import numpy as np

    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _quick_frees_each_tests_programs():
    """Under ``--quick``, after each test: JAX's caches of traced and compiled functions
    (``jax.clear_caches``). XLA's compiled programs are most of what a test leaves behind (tens of
    MB for a test of the MLP; their host callbacks hold slax's kernels): test_nn.py's quick tests
    grew a process from 1.0 to 2.6 GB keeping them, to 1.3 GB dropping them, in the same time. A
    file's tests still share its Slang kernels (:func:`_quick_frees_each_files_kernels`), which
    take longest to build; JAX's persistent cache gives back plain JAX's programs."""
    yield
    if _quick:
        jax.clear_caches()


@pytest.fixture(scope="module", autouse=True)
def _quick_frees_each_files_kernels():
    """Under ``--quick``, after each test file: slax's compiled kernels and Slang sessions are
    dropped, so that a pytest-xdist worker holds one file's kernels at a time, not those of every
    file it ran (a later file compiles those it shares again), and the heap they and the file's
    programs freed goes back to the system (glibc's ``malloc_trim``; glibc keeps it otherwise).
    With :func:`_quick_frees_each_tests_programs`, each of the two workers of
    ``scripts/test.sh --quick`` stays under 2 GB. The full run keeps everything (its slow tests
    were not measured with it)."""
    yield
    if not _quick:
        return
    import gc

    from slax import _compile

    jax.clear_caches()
    with _compile._lock:
        _compile._kernels.clear()
        _compile._sessions.clear()
    gc.collect()
    if sys.platform == "linux":
        ctypes.CDLL(None).malloc_trim(0)
