"""What every slax experiment script shares: flags, jitted training chunks with a progress bar,
run directories, metrics and loss plots. The scripts in experiments/ stay thin on top of this.

Uses the ``experiments`` extra (tqdm, matplotlib) where it is installed. Without it (a machine with
only JAX, such as the GPU machine) training still runs and writes metrics: progress comes as one
line per chunk, and plots are skipped with a note saying what to install.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import pathlib
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from slax._checkpoint import CheckpointError as CheckpointError
from slax._checkpoint import check_resume, load_checkpoint, save_checkpoint
from slax._checkpoint import checkpoint_path as checkpoint_path
from slax._checkpoint import checkpoint_step as checkpoint_step
from slax._checkpoint import previous_checkpoint as previous_checkpoint
from slax._config import CUDA_LAUNCHES, config
from slax._device import default_platform, describe_device, set_device_kind


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
        choices=("auto", "vulkan", "cuda"),
        default="auto",
        help="SlangPy device for CPU-placed JAX (auto: follow JAX; JAX on CUDA always uses cuda)",
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
        help="split each batch over a mesh of this many JAX devices with shard_map (data parallel; "
        "1 is a one-device mesh); default: no mesh",
    )


def add_launch_argument(parser: argparse.ArgumentParser) -> None:
    """``--launch``: the CUDA launch route (``slax.config.cuda_launch``) a script runs with."""
    parser.add_argument(
        "--launch",
        choices=CUDA_LAUNCHES,
        default=config.cuda_launch,
        help="how kernels launch when JAX runs on CUDA (slax.config.cuda_launch); ignored on CPU",
    )


def data_parallel(loss_and_grad: Callable, devices: int | None) -> Callable:
    """``(params, x, y) -> (loss, grads)`` with the batch split over ``devices`` JAX devices.

    Each device runs the kernels on its shard inside ``jax.shard_map``; losses and gradients are
    averaged with ``lax.pmean``, so for equal shards the result is the single-device one.
    ``devices=None`` returns ``loss_and_grad`` itself; 1 runs it inside a one-device mesh.
    """
    if devices is None:
        return loss_and_grad
    if not 1 <= devices <= len(jax.devices()):
        raise SystemExit(
            f"--devices {devices}: expected 1 to {len(jax.devices())}, the JAX devices there are."
        )
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("data",))
    spec = jax.sharding.PartitionSpec

    def local(params, x, y):
        # Each device differentiates its own shard's loss: params cast to varying outside the
        # gradient, so that jax.grad inside gives the local gradient (not already summed over the
        # mesh, as for replicated params), the same as a fused slax kernel's; pmean averages both.
        params = jax.lax.pcast(params, "data", to="varying")
        loss, grads = loss_and_grad(params, x, y)
        return jax.lax.pmean(loss, "data"), jax.lax.pmean(grads, "data")

    return jax.shard_map(
        local, mesh=mesh, in_specs=(spec(), spec("data"), spec("data")), out_specs=(spec(), spec())
    )


def describe_platform() -> str:
    """One line naming JAX's device and the device that runs slax kernels."""
    platform = default_platform()
    device = jax.devices()[0].device_kind
    return f"JAX {jax.__version__} on {device}; Slang kernels on {describe_device(platform)}"


EXTRAS_HINT = "pip install 'slang-jax[experiments]' for tqdm, matplotlib and scikit-learn"


def can_plot() -> bool:
    """Whether matplotlib is installed to draw the plots; if not, says so (the run goes on)."""
    if importlib.util.find_spec("matplotlib") is None:
        print(f"matplotlib is not installed: no plots ({EXTRAS_HINT})")
        return False
    return True


class _ChunkLines:
    """Progress as one printed line per chunk, where tqdm is not installed (tqdm's interface)."""

    def __init__(self, total: int, initial: int, desc: str, unit: str):
        self.total, self.n, self.desc, self.unit = total, initial, desc, unit

    def __enter__(self) -> _ChunkLines:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def update(self, n: int) -> None:
        self.n += n

    def set_postfix(self, postfix: dict[str, str]) -> None:
        fields = ", ".join(f"{k} {v}" for k, v in postfix.items())
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}s, {fields}", flush=True)


def run_directory(name: str, out: pathlib.Path | None) -> pathlib.Path:
    """``out``, or ``runs/<name>/<time>`` when it is None; created."""
    out = out or pathlib.Path("runs") / name / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    return out


def prepare_run(name: str, args: argparse.Namespace) -> tuple[pathlib.Path, dict[str, Any]]:
    """Checks the flags (:func:`validate_arguments`), applies --device and --launch, makes the output
    dir; returns it and a description of the run's devices."""
    validate_arguments(name, args)
    config.cuda_launch = args.launch
    if args.device != "auto":
        set_device_kind(args.device)
    if args.devices and args.batch % args.devices:
        raise SystemExit(f"{name}: --batch {args.batch} must divide evenly over --devices {args.devices}.")
    if args.resume and args.out is None:
        raise SystemExit(f"{name}: --resume needs --out, the directory of the run to continue.")
    out = run_directory(name, args.out)
    platform = default_platform()
    device = {"jax": str(jax.devices()[0]), "slang": describe_device(platform)}
    if platform == "cuda":
        device["cuda_launch"] = args.launch
        device["slang"] += f", {args.launch} launch route"
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
    present = len(jax.devices())
    if args.devices is not None and not 1 <= args.devices <= present:
        raise SystemExit(
            f"{name}: --devices {args.devices}: JAX has {present} device(s) here "
            f"({jax.devices()[0].platform}); pass 1 to {present}, or leave it out for no mesh."
        )
    _check_checkpoint_interval(name, args)
    if args.resume and args.out is not None:
        check_resume(name, args)


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


@dataclasses.dataclass
class TrainingRun:
    """What :func:`train_in_chunks` returns.

    Attributes:
      state: the final training state.
      losses: the loss of every step (resumed runs included).
      seconds: wall time of the steps this process ran (compilation and evaluation excluded).
      steps_timed: how many steps that was (fewer than all after ``--resume``).
      evaluations: ``(step, evaluate(state))`` after each chunk this process ran.
      compile_seconds: wall time of compiling the training chunks, before the timed steps.
    """

    state: Any
    losses: np.ndarray
    seconds: float
    steps_timed: int
    evaluations: list[tuple[int, float]]
    compile_seconds: float = 0.0

    def speed(self, batch: int) -> dict[str, float | None]:
        """Compile time, training time and throughput for metrics.json (null when no step ran in
        this process)."""
        rate = self.steps_timed / self.seconds if self.seconds else None
        return {
            "compile_time_s": self.compile_seconds,
            "train_time_s": self.seconds,
            "timed_steps": self.steps_timed,
            "steps_per_s": rate,
            "samples_per_s": rate * batch if rate else None,
        }


def compile_chunks(run_chunk: Any, state: Any, keys: jax.Array, start: int, chunk: int) -> float:
    """Compiles ``run_chunk`` for every chunk length a run from step ``start`` uses, before any step is
    timed; returns the seconds it took. A ``--chunk`` that does not divide ``--steps`` leaves a
    shorter last chunk, a second program: compiled here, it costs compile time, not steps/s."""
    lengths = {len(keys[first : first + chunk]) for first in range(start, len(keys), chunk)}
    began = time.perf_counter()
    for length in sorted(lengths):
        run_chunk.lower(state, keys[:length]).compile()
    return time.perf_counter() - began


def train_in_chunks(
    step: Callable[[Any, jax.Array], tuple[Any, jax.Array]],
    state: Any,
    key: jax.Array,
    steps: int,
    chunk: int,
    description: str,
    evaluate: Callable[[Any], float] | None = None,
    checkpoint: pathlib.Path | None = None,
    checkpoint_every: int = 0,
) -> TrainingRun:
    """Runs ``steps`` of ``step(state, key) -> (state, loss)`` in jitted ``lax.scan`` chunks.

    A progress bar advances once per chunk with the latest loss (and ``evaluate(state)``, if
    given, e.g. a test accuracy). With ``checkpoint``, the state is saved there every
    ``checkpoint_every`` steps (rounded up to whole chunks) and at the end, and an existing
    checkpoint is resumed from: step ``s`` always uses the same key, so a resumed run ends bit-identical
    to an uninterrupted one.

    ``evaluate`` sees, and the result holds, the state on JAX's first device: after data-parallel
    steps it is replicated over a mesh, and a slax kernel called on it under plain ``jax.jit``
    would be refused (XLA would partition it automatically).
    """
    try:
        from tqdm.auto import tqdm
    except ImportError:
        tqdm = _ChunkLines

    keys = jax.random.split(key, steps)

    def training_chunk(state, keys):
        return jax.lax.scan(step, state, keys)

    run_chunk = jax.jit(training_chunk)
    start = 0
    losses: list[np.ndarray] = []
    evaluations: list[tuple[int, float]] = []
    if checkpoint is not None and checkpoint.exists():
        state, start, previous = load_checkpoint(checkpoint, state, key)
        losses.append(previous)
        print(f"{description}: resuming from step {start} ({checkpoint})")
    compile_seconds = compile_chunks(run_chunk, state, keys, start, chunk)
    print(f"{description}: compiled the training chunks in {compile_seconds:.1f} s")
    seconds = 0.0
    last_saved = start
    with tqdm(total=steps, initial=start, desc=description, unit="step") as bar:
        for first in range(start, steps, chunk):
            chunk_keys = keys[first : first + chunk]
            began = time.perf_counter()
            state, chunk_losses = run_chunk(state, chunk_keys)
            chunk_losses = np.asarray(chunk_losses)
            seconds += time.perf_counter() - began
            losses.append(chunk_losses)
            postfix = {"loss": f"{chunk_losses[-1]:.3e}"}
            if evaluate is not None:
                evaluations.append((first + len(chunk_losses), float(evaluate(_on_first_device(state)))))
                postfix["eval"] = f"{evaluations[-1][1]:.4f}"
            bar.update(len(chunk_losses))
            bar.set_postfix(postfix)
            done = first + len(chunk_losses)
            if checkpoint is not None and (
                done == steps or (checkpoint_every and done - last_saved >= checkpoint_every)
            ):
                save_checkpoint(checkpoint, state, done, key, np.concatenate(losses))
                last_saved = done
    return TrainingRun(
        _on_first_device(state), np.concatenate(losses), seconds, steps - start, evaluations, compile_seconds
    )


def _on_first_device(tree: Any) -> Any:
    return jax.device_put(tree, jax.devices()[0])


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as JSON values: paths as strings, absent values as null."""
    return {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()}


def write_metrics(out: pathlib.Path, metrics: dict[str, Any]) -> pathlib.Path:
    path = out / "metrics.json"
    path.write_text(json.dumps(metrics, indent=2, default=float) + "\n")
    return path


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


MODEL_STYLES = {
    "slax": {"color": "tab:blue", "linestyle": "-", "linewidth": 2.2},
    "jax": {"color": "tab:orange", "linestyle": (0, (4, 3)), "linewidth": 1.4},
}
"""How each model is drawn in every plot: slax thick and solid, plain JAX thin and dashed over it, so
both stay visible where the curves coincide."""


def plot_title(task: str, args: argparse.Namespace, device: dict[str, str]) -> str:
    """``"polynomial: float32, 3000 steps, batch 1024; Slang kernels on vulkan (...)"``."""
    return f"{task}: {args.dtype}, {args.steps} steps, batch {args.batch}; Slang kernels on {device['slang']}"


def plot_loss_curves(
    out: pathlib.Path, curves: dict[str, np.ndarray], ylabel: str, title: str
) -> pathlib.Path:
    """Training loss per step of each model (keys of :data:`MODEL_STYLES`), log scale, smoothed over
    1% of the run; below it, how far slax's curve is from plain JAX's, relative to JAX's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, gap) = plt.subplots(
        2, 1, figsize=(8, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.2]}
    )
    smoothed = {}
    for label, losses in curves.items():
        window = max(1, len(losses) // 100)
        smoothed[label] = np.convolve(losses, np.ones(window) / window, mode="valid")
        steps = np.arange(len(smoothed[label])) + window - 1
        ax.plot(steps, smoothed[label], label=label, **MODEL_STYLES[label])
    ax.set_yscale("log")
    ax.set_ylabel(f"{ylabel}, smoothed")
    ax.grid(alpha=0.3)
    ax.legend()
    if {"slax", "jax"} <= smoothed.keys():
        difference = np.abs(smoothed["slax"] - smoothed["jax"]) / np.abs(smoothed["jax"])
        gap.plot(steps, np.maximum(difference, 1e-12), color="black", linewidth=1)
        gap.set_yscale("log")
    gap.set_ylabel("|slax - jax| / jax")
    gap.set_title("relative gap of the smoothed losses (1e-12 where identical)", fontsize=8)
    gap.set_xlabel("step")
    gap.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = out / "loss.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
