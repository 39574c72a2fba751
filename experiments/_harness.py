"""What the experiment scripts share: flags, run directories, the devices a run uses, metrics and
exit statuses. The scripts in experiments/ stay thin on top of this, of _training.py (training in
jitted chunks), _plots.py and _checkpoints.py, and of slax's public API.

Uses the ``experiments`` extra (tqdm, matplotlib, scikit-learn) where it is installed. Without it (a
machine with only JAX, such as the GPU machine) training still runs and writes metrics: progress
comes as one line per chunk, and plots are skipped with a note saying what to install.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
from typing import Any

import jax
from _checkpoints import check_resume

import slax


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


def add_common_arguments(parser: argparse.ArgumentParser, *, steps: int, batch: int, chunk: int) -> None:
    """Flags every experiment takes, with defaults that finish in minutes on the CPU path."""
    parser.add_argument("--steps", type=int, default=steps, help="training steps (default %(default)s)")
    parser.add_argument("--batch", type=int, default=batch, help="samples per step (default %(default)s)")
    parser.add_argument(
        "--chunk", type=int, default=chunk, help="steps per jitted lax.scan chunk (default %(default)s)"
    )
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="kernel precision")
    parser.add_argument("--seed", type=int, default=0, help="PRNG seed (default %(default)s)")
    parser.add_argument(
        "--device",
        choices=("auto", "vulkan", "cpu", "cuda"),
        default="auto",
        help="SlangPy device for CPU-placed JAX (auto: SLAX_DEVICE, else Vulkan where a driver exists, "
        "else SlangPy's CPU device; JAX on CUDA always uses cuda)",
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help="output dir (default runs/<name>/<time>)"
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="save params, optimiser state, step and key every N steps",
    )
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoints in --out")
    add_launch_argument(parser)
    parser.add_argument(
        "--devices",
        type=int,
        default=None,
        help="split each batch over a mesh of this many JAX devices (data parallel, under plain jax.jit; "
        "1 is a one-device mesh); default: no mesh",
    )


def add_launch_argument(parser: argparse.ArgumentParser) -> None:
    """``--launch``: the CUDA launch route (``slax.config.cuda_launch``) a script runs with."""
    parser.add_argument(
        "--launch",
        choices=slax.config.CUDA_LAUNCHES,
        default=slax.config.cuda_launch,
        help="how kernels launch when JAX runs on CUDA (slax.config.cuda_launch); ignored on CPU",
    )


def on_cuda() -> bool:
    """Whether JAX runs on a CUDA GPU here (where ``--launch`` chooses the route)."""
    return jax.default_backend() == "gpu"


def provenance() -> dict[str, Any]:
    """What a benchmark's JSON records beside its rows, so that a table can be traced to the run that
    made it: the command line, JAX's devices, the device and route that ran the Slang kernels, the
    versions, the commit (``SLAX_COMMIT`` where set: a copy of a working tree may carry another
    commit's history; else ``git rev-parse HEAD``) and the time (UTC)."""
    import importlib.metadata
    import os
    import platform
    import subprocess
    import sys

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
        "slang_device": f"{slax.describe_device()}, {slax.launch_route()} route",
        "versions": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jaxlib": importlib.metadata.version("jaxlib"),
            "slangpy": importlib.metadata.version("slangpy"),
        },
        "commit": commit,
        "time_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def describe_platform() -> str:
    """One line naming JAX's device and the device that runs slax kernels."""
    device = jax.devices()[0].device_kind
    slang = f"{slax.describe_device()} ({slax.launch_route()} route)"
    return f"JAX {jax.__version__} on {device}; Slang kernels on {slang}"


EXTRAS_HINT = "pip install 'slang-jax[experiments]' for tqdm, matplotlib and scikit-learn"


def run_directory(name: str, out: pathlib.Path | None) -> pathlib.Path:
    """``out``, or ``runs/<name>/<time>`` when it is None; created."""
    out = out or pathlib.Path("runs") / name / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    return out


def prepare_run(name: str, args: argparse.Namespace) -> tuple[pathlib.Path, dict[str, Any]]:
    """Checks the flags (:func:`validate_arguments`), applies --device and --launch, makes the output
    dir; returns it and a description of the run's devices."""
    validate_arguments(name, args)
    slax.config.cuda_launch = args.launch
    if args.device != "auto":
        slax.set_device_kind(args.device)
    if args.devices and args.batch % args.devices:
        raise SystemExit(f"{name}: --batch {args.batch} must divide evenly over --devices {args.devices}.")
    if args.resume and args.out is None:
        raise SystemExit(f"{name}: --resume needs --out, the directory of the run to continue.")
    out = run_directory(name, args.out)
    device = {"jax": str(jax.devices()[0]), "slang": f"{slax.describe_device()}, {slax.launch_route()} route"}
    if on_cuda():
        device["cuda_launch"] = args.launch
    print(f"{name}: JAX on {device['jax']}, Slang kernels on {device['slang']}; writing to {out}")
    return out, device


# --- flags --------------------------------------------------------------------------------------


def validate_arguments(name: str, args: argparse.Namespace) -> None:
    """Refuses flags that cannot make a run, in one line naming the flag, before anything is created;
    says how --checkpoint-every is rounded to whole chunks; with --resume, checks the checkpoints
    (:func:`check_resume`)."""
    for flag in ("steps", "batch", "chunk"):
        value = getattr(args, flag)
        if value < 1:
            raise SystemExit(f"{name}: --{flag} must be a positive integer; got {value}.")
    if args.checkpoint_every < 0:
        raise SystemExit(
            f"{name}: --checkpoint-every must be 0 (no checkpoints) or positive; got {args.checkpoint_every}."
        )
    problem = device_count_problem(args.devices)
    if problem:
        raise SystemExit(f"{name}: {problem}")
    _check_checkpoint_interval(name, args)
    if args.resume and args.out is not None:
        check_resume(name, args)


def device_count_problem(devices: int | None) -> str | None:
    """Why ``--devices`` cannot make a mesh here, or None (``None``: no mesh). The scripts take the
    first N devices (``_training.batch_sharding``), so a count above those present would silently
    use fewer."""
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
        raise SystemExit(
            f"{name}: --checkpoint-every {every} with --chunk {chunk}: checkpoints are written after "
            f"whole chunks, so the first would come only at the end of the {steps} steps; pass a "
            f"--chunk of at most {every} (a divisor of {every} keeps the interval exact)."
        )
    if rounded != every:
        print(
            f"{name}: --checkpoint-every {every} is rounded up to {rounded}: checkpoints are written "
            f"after whole chunks of --chunk {chunk}."
        )


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as JSON values: paths as strings, absent values as null."""
    return {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()}


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
