"""What the experiment scripts share: flags, run directories, the devices a run uses, metrics and
exit statuses. The scripts in experiments/ stay thin on top of this, of _training.py (training in
jitted chunks), _plots.py and _checkpoints.py, and of slax's public API.

Importing this module imports neither JAX nor slax (each takes seconds): a script parses its flags
first (:func:`parse_first`), so that ``--help`` and bad flags answer at once, and the functions here
that need JAX or slax import them when called.

Uses the ``experiments`` extra (tqdm, matplotlib, scikit-learn) where it is installed. Without it (a
machine with only JAX, such as the GPU machine) training still runs and writes metrics: progress
comes as one line per chunk, and plots are skipped with a note saying what to install.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import logging
import math
import pathlib
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

NETWORKS = {"polynomial": (4, 16, 4), "digits": (64, 128, 64, 10), "sdf": (3, 64, 64, 64, 1)}
"""The experiments' networks by name, as layer widths: polynomial.py's, digits.py's and sdf.py's,
which benchmark.py, profile_step.py and soak.py time."""
WIDE = "wide"
"""benchmark.py's and profile_step.py's family of wide networks, tiny-cuda-nn's FullyFusedMLP class
(widths 16-128, 2-8 hidden layers, inputs 16-64, outputs 1-16): ``--network wide`` stands for one
architecture per ``--width`` and ``--hidden-layers`` (:func:`workloads`), each named as
:func:`wide_name` names it."""
NGP_TASKS = {"ngp_image": (2, 3), "ngp_sdf": (3, 1)}
"""instant-NGP's hash-encoded training steps, ngp_image.py's and ngp_sdf.py's, as (the points'
dimensions, the model's outputs): in benchmark.py and profile_step.py ``--network ngp_image`` stands
for the encoding of ``--levels`` and ``--log2-table-size`` (:func:`workloads`), named as
:func:`ngp_name` names it, its resolutions 16 to :data:`NGP_FINEST_RESOLUTION`."""
NGP_FINEST_RESOLUTION = 2048
"""The finest level's cells a side in the timed hash-encoded steps: the issue's (ngp_image.py's
--size, ngp_sdf.py's --finest-resolution)."""
WORKLOADS = (*NETWORKS, WIDE, "texture", *NGP_TASKS)
"""What benchmark.py and profile_step.py time: the networks, the wide family, texture.py's
texture fit and the hash-encoded steps."""

CUDA_LAUNCHES = ("slangpy", "ptx")
"""``slax.config.CUDA_LAUNCHES``, for flags parsed before slax is imported (tests pin the two equal)."""
MLP_BACKENDS = ("auto", "thread_sums", "tiled", "tensor_cores", "warp_rows", "xla")
"""``slax._config.MLP_BACKENDS``, for the same reason (tests pin the two equal)."""


def parse_first(parse: Callable[[], Any], name: str) -> None:
    """For a script run as a program, before it imports JAX and slax: parses its flags with
    ``parse()`` (``--help`` and bad flags answer here, and exit), says what it is loading, and has
    slax's log say what it compiles (:func:`show_slax_progress`): a user never waits in silence."""
    parse()
    print(f"{name}: loading JAX and slax ...", flush=True)
    show_slax_progress()


def show_slax_progress() -> None:
    """Prints slax's log at INFO (which Slang module or kernel it is compiling: seconds each on a
    first run) on stdout, in order with the script's own lines."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger = logging.getLogger("slax")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` with the script's docstring as written and each flag's default after its help
    (unless the help already says it: a default of None means something each flag explains)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS) or not action.option_strings:
            return text
        if isinstance(action.default, bool):  # a switch
            return text + (" (default on)" if action.default else " (default off)")
        if isinstance(action.default, list):  # nargs="+": shown as it is typed
            return text + f" (default {' '.join(map(str, action.default))})".replace("%", "%%")
        return text + " (default %(default)s)"


def exit_status_help(failure: str | None) -> str:
    """The epilog of a script's ``--help``: what its exit status means."""
    lines = ["exit status:", "  0  the run finished" + (" and passed" if failure else "")]
    if failure:
        lines.append(f"  1  {failure}")
    lines.append("  2  bad flags (argparse's usage message says which)")
    return "\n".join(lines)


def _flag_type(convert: Callable[[str], Any], accepts: Callable[[Any], bool], expected: str):
    """An argparse ``type=`` that refuses what a flag cannot take when the flags are parsed:
    argparse then says ``argument --lr: must be a finite number above 0; got 'nan'`` and exits 2."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {expected}; got {text!r}") from None
        if not accepts(value):
            raise argparse.ArgumentTypeError(f"must be {expected}; got {text!r}")
        return value

    return parse


positive_int = _flag_type(int, lambda value: value >= 1, "a positive integer")
"""Counts: steps, samples, chunks, repeats, widths, devices."""
non_negative_int = _flag_type(int, lambda value: value >= 0, "0 or a positive integer")
seed = _flag_type(int, lambda value: 0 <= value < 2**32, "an integer from 0 to 2**32 - 1")
"""PRNG seeds, as ``jax.random.key`` and NumPy's generators take them."""
positive_float = _flag_type(
    float, lambda value: math.isfinite(value) and value > 0, "a finite number above 0"
)
"""Learning rates and peaks: NaN would train (or divide) on NaN for the whole run."""
non_negative_float = _flag_type(
    float, lambda value: math.isfinite(value) and value >= 0, "a finite number, 0 or above"
)
finite_float = _flag_type(float, math.isfinite, "a finite number")
"""Targets a run is checked against: a NaN target is missed whatever the run does."""
log2_table_size = _flag_type(int, lambda value: 1 <= value <= 24, "an integer from 1 to 24")
"""A hash encoding's log2 entries per level, up to the paper's largest table (2^24)."""


@dataclasses.dataclass(frozen=True)
class DeviceDefault:
    """A flag's default that depends on where JAX runs: ``cpu`` on the CPU, ``gpu`` on a CUDA GPU,
    so that a run of the defaults ends in minutes on a laptop and runs the full-size task on a GPU.

    argparse keeps it as the flag's value until :func:`prepare_run` knows the device (finding out
    imports JAX, which ``--help`` must not wait for) and puts the chosen value in its place
    (:func:`resolve_device_defaults`); a flag given on the command line is a plain value and stays.
    ``--help`` shows both: ``(default 300 on a CPU, 2000 on a GPU)``."""

    cpu: Any
    gpu: Any

    def __str__(self) -> str:
        return f"{self.cpu} on a CPU, {self.gpu} on a GPU"


def resolve_device_defaults(args: argparse.Namespace, *, on_gpu: bool | None = None) -> None:
    """Replaces each :class:`DeviceDefault` among ``args`` by its value for the device: its ``gpu``
    one where ``on_gpu`` (by default: where JAX runs on CUDA, :func:`on_cuda`), else its ``cpu``
    one."""
    defaults = {key: value for key, value in vars(args).items() if isinstance(value, DeviceDefault)}
    if not defaults:
        return
    if on_gpu is None:
        on_gpu = on_cuda()
    for key, default in defaults.items():
        setattr(args, key, default.gpu if on_gpu else default.cpu)


def add_common_arguments(
    parser: argparse.ArgumentParser,
    *,
    steps: int | DeviceDefault,
    batch: int | DeviceDefault,
    chunk: int | DeviceDefault,
) -> None:
    """Flags every experiment takes; each script's docstring says how long its defaults take (on a
    CPU and on a GPU, where a :class:`DeviceDefault` sets them apart)."""
    parser.add_argument(
        "--steps", type=positive_int, default=steps, help="training steps (default %(default)s)"
    )
    parser.add_argument(
        "--batch", type=positive_int, default=batch, help="samples per step (default %(default)s)"
    )
    parser.add_argument(
        "--chunk",
        type=positive_int,
        default=chunk,
        help="steps per jitted lax.scan chunk (default %(default)s)",
    )
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="kernel precision")
    parser.add_argument("--seed", type=seed, default=0, help="PRNG seed (default %(default)s)")
    parser.add_argument(
        "--device",
        choices=("auto", "vulkan", "cpu", "cuda"),
        default="auto",
        help="SlangPy device for CPU-placed JAX (auto: SLAX_DEVICE, else a GPU's Vulkan driver where "
        "one is here, else SlangPy's CPU device, the faster CPU route; JAX on CUDA always uses cuda)",
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help="output dir (default runs/<name>/<time>)"
    )
    parser.add_argument(
        "--checkpoint-every",
        type=non_negative_int,
        default=0,
        help="save params, optimiser state, step and key every N steps",
    )
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoints in --out")
    add_launch_argument(parser)
    parser.add_argument(
        "--devices",
        type=positive_int,
        default=None,
        help="split each batch over a mesh of this many JAX devices (data parallel, under plain jax.jit; "
        "1 is a one-device mesh); default: no mesh",
    )


def add_wide_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that choose the architectures ``--network wide`` stands for (:func:`workloads`)."""
    parser.add_argument(
        "--width",
        nargs="+",
        type=positive_int,
        default=[64],
        help="--network wide: hidden-layer widths to time",
    )
    parser.add_argument(
        "--hidden-layers",
        nargs="+",
        type=positive_int,
        default=[2],
        help="--network wide: hidden-layer counts to time, each with every --width",
    )
    parser.add_argument("--wide-input", type=positive_int, default=32, help="--network wide: input width")
    parser.add_argument("--wide-output", type=positive_int, default=16, help="--network wide: output width")


def add_hash_encoding_arguments(
    parser: argparse.ArgumentParser, *, default_levels: int, default_log2_table_size: int, default_lr: float
) -> None:
    """The flags of the hash-encoded models (ngp_image.py, ngp_sdf.py; ``_ngp.py``): the encoding's
    levels and table size, and Adam's learning rate. The finest resolution is each script's own (an
    image's pixels, a field's detail)."""
    parser.add_argument(
        "--levels", type=positive_int, default=default_levels, help="the encoding's levels (L)"
    )
    parser.add_argument(
        "--log2-table-size",
        type=log2_table_size,
        default=default_log2_table_size,
        help="log2 of the entries per level (T; the paper's 19 at full size)",
    )
    parser.add_argument(
        "--lr", type=positive_float, default=default_lr, help="Adam learning rate, cosine-decayed"
    )


def add_ngp_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that size the encoding ``--network ngp_image`` and ``ngp_sdf`` stand for
    (:func:`workloads`); their defaults are the issue's full size."""
    parser.add_argument(
        "--levels", type=positive_int, default=16, help="--network ngp_image, ngp_sdf: the encoding's levels"
    )
    parser.add_argument(
        "--log2-table-size",
        type=log2_table_size,
        default=19,
        help="--network ngp_image, ngp_sdf: log2 of the entries per level",
    )


def ngp_name(task: str, levels: int, log2_table_size: int) -> str:
    """A hash-encoded step's workload name, ``"ngp_sdf-16x2^19"``: ngp_sdf.py's step with 16 levels
    of 2^19 entries."""
    return f"{task}-{levels}x2^{log2_table_size}"


def ngp_architecture(workload: str) -> dict[str, Any] | None:
    """``{"task", "levels", "log2_table_size"}`` of an :func:`ngp_name`; None for any other
    workload."""
    match = re.fullmatch(rf"({'|'.join(NGP_TASKS)})-(\d+)x2\^(\d+)", workload)
    if match is None:
        return None
    return {"task": match[1], "levels": int(match[2]), "log2_table_size": int(match[3])}


def wide_name(inputs: int, width: int, hidden_layers: int, outputs: int) -> str:
    """A wide architecture's workload name, ``"wide-32-64x4-16"``: 32 inputs, four hidden layers of
    64, 16 outputs (tiny-cuda-nn's ``n_neurons`` and ``n_hidden_layers``)."""
    return f"{WIDE}-{inputs}-{width}x{hidden_layers}-{outputs}"


def wide_architecture(workload: str) -> dict[str, int] | None:
    """``{"inputs", "width", "hidden_layers", "outputs"}`` of a :func:`wide_name`; None for any other
    workload."""
    match = re.fullmatch(rf"{WIDE}-(\d+)-(\d+)x(\d+)-(\d+)", workload)
    if match is None:
        return None
    return dict(zip(("inputs", "width", "hidden_layers", "outputs"), map(int, match.groups())))


def network_sizes(workload: str) -> tuple[int, ...] | None:
    """A workload's layer widths, input first (:data:`NETWORKS`, a :func:`wide_name`'s, or the MLP
    of an :func:`ngp_name`'s model, after its encoding); None for the texture fit, which has no
    network."""
    if workload in NETWORKS:
        return NETWORKS[workload]
    ngp = ngp_architecture(workload)
    if ngp is not None:
        import _ngp  # imports JAX: asked only after a script's flags are parsed

        dimensions, outputs = NGP_TASKS[ngp["task"]]
        levels, log2_table_size = ngp["levels"], ngp["log2_table_size"]
        config = _ngp.encoding_config(levels, log2_table_size, dimensions, NGP_FINEST_RESOLUTION)
        return _ngp.mlp_sizes(config, outputs)
    wide = wide_architecture(workload)
    if wide is None:
        return None
    return (wide["inputs"], *[wide["width"]] * wide["hidden_layers"], wide["outputs"])


def workloads(args: argparse.Namespace) -> list[str]:
    """``--network`` as the workloads to time: each name as given, ``wide`` as one
    :func:`wide_name` per ``--width`` and ``--hidden-layers`` (widths outer), ``ngp_image`` and
    ``ngp_sdf`` as the :func:`ngp_name` of ``--levels`` and ``--log2-table-size``."""
    named = []
    for network in args.network:
        if network in NGP_TASKS:
            named.append(ngp_name(network, args.levels, args.log2_table_size))
            continue
        if network != WIDE:
            named.append(network)
            continue
        for width, hidden_layers in itertools.product(args.width, args.hidden_layers):
            named.append(wide_name(args.wide_input, width, hidden_layers, args.wide_output))
    return named


def add_launch_argument(parser: argparse.ArgumentParser) -> None:
    """``--launch``: the CUDA launch route (``slax.config.cuda_launch``) a script runs with."""
    parser.add_argument(
        "--launch",
        choices=CUDA_LAUNCHES,
        default=None,
        help="how kernels launch when JAX runs on CUDA (default: slax.config.cuda_launch, which "
        "SLAX_CUDA_LAUNCH sets, else ptx); ignored on CPU, where it is recorded as null",
    )


def apply_launch(args: argparse.Namespace) -> None:
    """Sets ``slax.config.cuda_launch`` from ``--launch`` on CUDA, and records the route taken in
    ``args.launch``; elsewhere no CUDA launch route applies: ``args.launch`` becomes None, so that
    no output names one (a ``--launch`` given says it is ignored)."""
    import slax

    if on_cuda():
        if args.launch is not None:
            slax.config.cuda_launch = args.launch
        args.launch = slax.config.cuda_launch
    elif args.launch is not None:
        print(f"--launch {args.launch} is ignored: JAX runs on the CPU here, where no CUDA route applies.")
        args.launch = None


def on_cuda() -> bool:
    """Whether JAX runs on a CUDA GPU here (where ``--launch`` chooses the route)."""
    import jax

    return jax.default_backend() == "gpu"


CPU_ROUTE_NOTE = (
    "Slang kernels run on a CPU route here, which is for development and correctness, not speed "
    "(its kernels are GPU code run on CPU threads; XLA's are the CPU's own); GPU figures are in "
    "BENCHMARKS.md."
)
"""What a run on a CPU route says once, so that its steps/s against plain JAX's are read rightly."""


def provenance(device_kinds: list[str | None] | None = None) -> dict[str, Any]:
    """What a benchmark's JSON records beside its rows, so that a table can be traced to the run that
    made it: the command line, JAX's devices, the devices and routes that ran the Slang kernels
    (:func:`slang_devices` of ``device_kinds``), the versions, the commit (``SLAX_COMMIT`` where
    set: a copy of a working tree may carry another commit's history; else ``git rev-parse HEAD``)
    and the time (UTC)."""
    import importlib.metadata
    import os
    import platform
    import subprocess

    import jax

    commit = os.environ.get("SLAX_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
                cwd=pathlib.Path(__file__).parent,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = None
    devices = jax.devices()
    return {
        "command": " ".join(["python", *sys.argv]),
        "jax_devices": f"{len(devices)} x {devices[0].device_kind}",
        "slang_device": slang_devices(device_kinds),
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jaxlib": importlib.metadata.version("jaxlib"),
            "slangpy": importlib.metadata.version("slangpy"),
        },
        "commit": commit,
        "time_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def slang_devices(device_kinds: list[str | None] | None = None) -> str:
    """The SlangPy device and launch route that run slax's kernels where JAX runs, as
    ``"cpu (CPU), host-pointer route"``: for ``slax.config.device_kind``, or on the CPU for each of
    ``device_kinds`` (a None among them: the automatic choice), joined by "; "."""
    import slax

    descriptions = []
    for kind in device_kinds or [slax.config.device_kind]:
        with slax.config.override(device_kind=kind):
            descriptions.append(f"{slax.describe_device()}, {slax.launch_route()} route")
    return "; ".join(descriptions)


def describe_platform(device_kinds: list[str | None] | None = None) -> str:
    """One line naming JAX's device and the devices and routes that run slax kernels
    (:func:`slang_devices`)."""
    import jax

    device = jax.devices()[0].device_kind
    return f"JAX {jax.__version__} on {device}; Slang kernels on {slang_devices(device_kinds)}"


EXTRAS_HINT = "pip install 'slang-jax[experiments]' for tqdm, matplotlib and scikit-learn"


def run_devices() -> dict[str, str]:
    """The devices a run's kernels ran on, as its JSON records them (``device``): JAX's device, the
    SlangPy device with the launch route, and the route alone (``host-pointer`` or ``host-copy``
    on the CPU, ``ptx`` or ``slangpy`` on CUDA)."""
    import jax

    import slax

    return {"jax": str(jax.devices()[0]), "slang": slang_devices(), "route": slax.launch_route()}


def run_directory(name: str, out: pathlib.Path | None) -> pathlib.Path:
    """``out``, or ``runs/<name>/<time>`` when it is None; created."""
    out = out or pathlib.Path("runs") / name / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    return out


def prepare_run(name: str, args: argparse.Namespace) -> tuple[pathlib.Path, dict[str, Any]]:
    """Chooses the defaults for the device (:func:`resolve_device_defaults`), checks the flags
    (:func:`validate_arguments`), applies --device and --launch, makes the output dir; returns it
    and the run's devices as metrics.json records them: JAX's device, the SlangPy device and the
    launch route that ran slax's kernels. Says them in one line, and on a CPU route what CPU routes
    are for (:data:`CPU_ROUTE_NOTE`)."""

    import slax

    resolve_device_defaults(args)
    validate_arguments(name, args)
    apply_launch(args)
    if args.device != "auto":
        slax.set_device_kind(args.device)
    out = run_directory(name, args.out)
    device = run_devices()
    print(f"{name}: JAX on {device['jax']}, Slang kernels on {device['slang']}; writing to {out}")
    if not on_cuda():
        print(f"{name}: {CPU_ROUTE_NOTE}")
    return out, device


# --- flags --------------------------------------------------------------------------------------


def validate_arguments(name: str, args: argparse.Namespace) -> None:
    """Refuses flags that together cannot make a run (each flag's own values are its type's to
    refuse, when the flags are parsed), in one line naming the flags, with exit status 2 as
    argparse's refusals, before anything is created; says how --checkpoint-every is rounded to
    whole chunks; checks the checkpoints in --out: with --resume, that they continue the run
    (:func:`check_resume`), else that there are none to overwrite (:func:`check_fresh`)."""
    problem = device_count_problem(args.devices)
    if problem:
        refuse_flags(name, problem)
    if args.devices and args.batch % args.devices:
        refuse_flags(name, f"--batch {args.batch} must divide evenly over --devices {args.devices}.")
    if args.resume and args.out is None:
        refuse_flags(name, "--resume needs --out, the directory of the run to continue.")
    _check_checkpoint_interval(name, args)
    if args.out is not None:
        from _checkpoints import check_fresh, check_resume

        (check_resume if args.resume else check_fresh)(name, args)


def refuse_flags(name: str, problem: str) -> NoReturn:
    """Ends a run over flags found bad only together or once JAX is imported (a --devices count
    above the devices present) as argparse ends one over bad flags: the problem on stderr, exit
    status 2."""
    print(f"{name}: error: {problem}", file=sys.stderr)
    raise SystemExit(2)


def device_count_problem(devices: int | None) -> str | None:
    """Why ``--devices`` cannot make a mesh here, or None (``None``: no mesh). The scripts take the
    first N devices (``_training.batch_sharding``), so a count above those present would silently
    use fewer."""
    import jax

    present = len(jax.devices())
    if devices is None or 1 <= devices <= present:
        return None
    return (
        f"--devices {devices}: JAX has {present} device(s) here ({jax.devices()[0].platform}); pass 1 "
        f"to {present}, or leave it out for no mesh."
    )


def _check_checkpoint_interval(name: str, args: argparse.Namespace) -> None:
    """Checkpoints are written after whole chunks: an interval that is no multiple of --chunk is
    rounded up, with a note; one that chunking would postpone to the end of the run is refused."""
    every, chunk, steps = args.checkpoint_every, args.chunk, args.steps
    if not every:
        return
    rounded = -(-every // chunk) * chunk
    if every < steps <= rounded:
        refuse_flags(
            name,
            f"--checkpoint-every {every} with --chunk {chunk}: checkpoints are written after whole "
            f"chunks, so the first would come only at the end of the {steps} steps; pass a --chunk of "
            f"at most {every} (a divisor of {every} keeps the interval exact).",
        )
    if rounded != every:
        print(
            f"{name}: --checkpoint-every {every} is rounded up to {rounded}: checkpoints are written "
            f"after whole chunks of --chunk {chunk}."
        )


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as JSON values: paths as strings, absent values as null."""
    return {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()}


def mean_call_seconds(function: Callable[..., Any], *args: Any, repeats: int, warm_calls: int = 1) -> float:
    """Mean seconds of ``repeats`` calls of ``jax.jit(function)`` on ``args``, after ``warm_calls``
    untimed calls (the first compiles), the last call's result waited for once at the end: the
    calls queue behind each other as a training loop's do."""
    import time

    import jax

    function = jax.jit(function)
    for _ in range(warm_calls):
        jax.block_until_ready(function(*args))
    began = time.perf_counter()
    for _ in range(repeats):
        out = function(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - began) / repeats


def write_json(path: pathlib.Path | str, data: Any) -> pathlib.Path:
    """Writes ``data`` to ``path`` as indented JSON (NumPy numbers as floats)."""
    path = pathlib.Path(path)
    path.write_text(json.dumps(data, indent=2, default=float) + "\n")
    return path


def write_metrics(out: pathlib.Path, metrics: dict[str, Any]) -> pathlib.Path:
    return write_json(out / "metrics.json", metrics)


def met_target(what: str, value: float, target: float | None, *, at_least: bool = False) -> bool:
    """Whether ``value`` meets ``target`` (at most it, or at least it with ``at_least``); a target of
    None is not checked. Prints the verdict of a checked one."""
    if target is None:
        return True
    ok = value >= target if at_least else value <= target
    bound = "at least" if at_least else "at most"
    print(f"{'met' if ok else 'MISSED'}: {what} {value:.4g}, target {bound} {target:.4g}")
    return ok


def report_outputs(out: pathlib.Path) -> None:
    """Ends a run by saying where its outputs went."""
    files = sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.endswith(".tmp"))
    print(f"outputs in {out}: {', '.join(files)}")
