"""Training for the experiments: one optimiser step, and many of them in jitted ``lax.scan`` chunks
under a progress bar, with checkpoints.

Uses tqdm where it is installed (the ``experiments`` extra); without it, progress comes as one
printed line per chunk.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from _checkpoints import checkpoint_path, load_checkpoint, save_checkpoint
from jax.flatten_util import ravel_pytree
from jax.sharding import AxisType, NamedSharding, PartitionSpec

Batch = tuple[jax.Array, jax.Array]
LossAndGrad = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]
Step = Callable[[Any, jax.Array], tuple[Any, jax.Array]]


def cast(tree: Any, dtype: Any) -> Any:
    """Every array of ``tree`` as ``dtype``: in float16 runs, the kernels' half copy of the float32
    parameters the optimiser keeps."""
    return jax.tree.map(lambda a: a.astype(dtype), tree)


def batch_sharding(devices: int | None) -> NamedSharding | None:
    """Where ``--devices N`` puts each batch: split along its first axis over a mesh of the first
    ``N`` devices (``None``: no mesh). The step stays a plain ``jax.jit``: slax's calls partition
    themselves by the batch's sharding, and XLA partitions the plain-JAX model. The mesh's axis is
    automatic, so plain JAX code (the twins' gradients contract over the batch) needs no
    explicit-sharding annotations."""
    if devices is None:
        return None
    mesh = jax.make_mesh((devices,), ("data",), devices=jax.devices()[:devices], axis_types=(AxisType.Auto,))
    return NamedSharding(mesh, PartitionSpec("data"))


def on_every_device(tree: Any, sharding: NamedSharding | None) -> Any:
    """``tree`` replicated over ``sharding``'s mesh (unchanged without one): where a training loop
    keeps its state and step keys from call to call. Left on one device, every call of a step
    jitted over the mesh would first copy them to the others: 0.7-0.9 ms a call on two H200s
    (BENCHMARKS.md, "Two GPUs after the rewrite")."""
    if sharding is None:
        return tree
    return jax.device_put(tree, NamedSharding(sharding.mesh, PartitionSpec()))


def keeps_parameters_flat(model: str) -> bool:
    """Whether the experiments train ``model`` (``"slax"`` or a plain-JAX model) with its
    parameters kept as one vector (:func:`parameter_state`): slax's, which its kernels read as
    they are; plain JAX keeps its per-layer arrays, with which XLA's step is faster at large
    batches (BENCHMARKS.md, "Flat parameters")."""
    return model == "slax"


PARTS = "parts"
""":func:`parameter_state`'s ``flat`` for a dict of a model's parts (the hash-encoded models'
``{"tables", "mlp"}``): one vector a part."""


def parameter_state(
    params: Any, loss_and_grad: LossAndGrad, flat: bool | str
) -> tuple[Any, LossAndGrad, Callable[[Any], Any]]:
    """How a training loop keeps ``params``: ``(stored, loss_and_grad over stored, to_params)``.

    With ``flat``, the stored parameters are one vector, ``jax.flatten_util.ravel_pytree(params)``,
    and the loss's gradient comes back as one too; with :data:`PARTS`, ``params`` is a dict of a
    model's parts and each part is one vector, so that a part its kernels read whole (an encoding's
    tables) is never concatenated with another. Else they are ``params`` as they are. For slax's
    MLP the vector is the kernels' own parameter layout (slax/nn/_kernels.py): with float32 kernels
    a step packs nothing for them (in float16 they read a float32 copy of the half parameters, one
    small fusion), the gradient is one slice of the kernel's summed row, and Adam updates all
    parameters together instead of array by array (BENCHMARKS.md, "Flat parameters")."""
    if not flat:
        return params, loss_and_grad, lambda stored: stored
    ravel = _raveled_parts if flat == PARTS else ravel_pytree
    stored, unravel = ravel(params)

    def flat_loss_and_grad(stored, *batch):
        loss, grads = loss_and_grad(unravel(stored), *batch)
        return loss, ravel(grads)[0]

    return stored, flat_loss_and_grad, unravel


def _raveled_parts(params: dict) -> tuple[dict, Callable[[dict], dict]]:
    """``ravel_pytree`` of each part of ``params``: (stored, unravel)."""
    parts = {name: ravel_pytree(part) for name, part in params.items()}
    return (
        {name: vector for name, (vector, _) in parts.items()},
        lambda stored: {name: unravel(stored[name]) for name, (_, unravel) in parts.items()},
    )


def training_step(
    loss_and_grad: LossAndGrad,
    optimizer: optax.GradientTransformation,
    draw_batch: Callable[[jax.Array], Batch],
    sharding: NamedSharding | None = None,
) -> Step:
    """``step(state, key) -> (state, loss)`` for ``lax.scan``: draws a batch ``(x, y)`` with
    ``draw_batch(key)`` (placed with ``sharding``, if given: see :func:`batch_sharding`), computes
    ``loss_and_grad(params, x, y)`` and applies one ``optimizer`` update to
    ``state = (params, optimizer state)``."""

    def step(state, key):
        params, opt_state = state
        batch = draw_batch(key)
        if sharding is not None:
            batch = jax.lax.with_sharding_constraint(batch, sharding)
        loss, grads = loss_and_grad(params, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    return step


def gradient_disagreement(
    loss_and_grads: dict[str, LossAndGrad], params: Any, batch: Batch
) -> dict[str, float]:
    """How far slax's loss gradient is from plain JAX's at ``params`` on one ``batch``: the largest
    absolute difference over every parameter, and that relative to plain JAX's largest entry.
    ``loss_and_grads`` holds both models' ``(params, *batch) -> (loss, grads)`` by name, ``"slax"``
    and ``"jax"``; each is jitted here."""
    _, g_slax = jax.jit(loss_and_grads["slax"])(params, *batch)
    _, g_jax = jax.jit(loss_and_grads["jax"])(params, *batch)
    pairs = zip(jax.tree.leaves(g_slax), jax.tree.leaves(g_jax))
    worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in pairs)
    scale = max(float(np.max(np.abs(np.asarray(g)))) for g in jax.tree.leaves(g_jax))
    return {"max_abs_difference": worst, "max_difference_relative_to_largest": worst / scale}


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

    def results(self, batch: int, quality: dict[str, Any]) -> dict[str, Any]:
        """One model's entry in metrics.json: its own ``quality`` measures, then the mean loss of
        the last 50 steps and :meth:`speed`."""
        return {
            **quality,
            "train_loss_mean_last_50_steps": float(self.losses[-50:].mean()),
            **self.speed(batch),
        }


def result_line(name: str, quality: str, results: dict[str, Any], decimals: int = 0) -> str:
    """The line an experiment prints for model ``name`` after training: ``quality`` (its own
    measures, as text), then the steps per second (with ``decimals``, 0 where fewer than one's
    noise) and the compile time from ``results`` (:meth:`TrainingRun.results`)."""
    return (
        f"{name}: {quality}, {results['steps_per_s'] or 0:.{decimals}f} steps/s "
        f"(compiling took {results['compile_time_s']:.1f} s more)"
    )


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
    step: Step,
    state: Any,
    key: jax.Array,
    steps: int,
    chunk: int,
    description: str,
    evaluate: Callable[[Any], float] | None = None,
    checkpoint: pathlib.Path | None = None,
    checkpoint_every: int = 0,
    sharding: NamedSharding | None = None,
) -> TrainingRun:
    """Runs ``steps`` of ``step(state, key) -> (state, loss)`` in jitted ``lax.scan`` chunks.

    Says when it compiles the chunks (seconds, and slax's kernels on a first run), then a progress
    bar advances once per chunk with the latest loss (and ``evaluate(state)``, if given, e.g. a
    test accuracy). With ``checkpoint``, the state is saved there every
    ``checkpoint_every`` steps (rounded up to whole chunks) and at the end, and an existing
    checkpoint is resumed from: step ``s`` always uses the same key, so a resumed run ends bit-identical
    to an uninterrupted one (on a GPU, where XLA's reductions are made deterministic with
    ``XLA_FLAGS=--xla_gpu_deterministic_ops=true``). With ``sharding`` (the step's batch sharding),
    the state and the keys are placed on every device of its mesh once, not copied there per chunk.

    """
    try:
        from tqdm.auto import tqdm
    except ImportError:
        tqdm = _ChunkLines

    keys = on_every_device(jax.random.split(key, steps), sharding)

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
    state = on_every_device(state, sharding)
    print(f"{description}: compiling the training chunks ...", flush=True)
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
                evaluations.append((first + len(chunk_losses), float(evaluate(state))))
                postfix["eval"] = f"{evaluations[-1][1]:.4f}"
            bar.update(len(chunk_losses))
            bar.set_postfix(postfix)
            done = first + len(chunk_losses)
            if checkpoint is not None and (
                done == steps or (checkpoint_every and done - last_saved >= checkpoint_every)
            ):
                save_checkpoint(checkpoint, state, done, key, np.concatenate(losses))
                last_saved = done
    return TrainingRun(state, np.concatenate(losses), seconds, steps - start, evaluations, compile_seconds)


def fit(
    name: str,
    params: Any,
    loss_and_grad: LossAndGrad,
    optimizer: optax.GradientTransformation,
    draw_batch: Callable[[jax.Array], Batch],
    key: jax.Array,
    args: argparse.Namespace,
    out: pathlib.Path,
    *,
    flat: bool | str | None = None,
    evaluate: Callable[[Any], float] | None = None,
) -> tuple[TrainingRun, Any]:
    """Trains model ``name`` from ``params`` as every training experiment does; returns the run and
    its final parameters, in ``params``' own form.

    The parameters are kept as :func:`parameter_state` keeps them (``flat``: by default as
    :func:`keeps_parameters_flat` says for ``name``), each step is one :func:`training_step` of
    ``optimizer`` on ``loss_and_grad`` over a batch ``draw_batch`` draws, with the step keys split
    from ``key``, and :func:`train_in_chunks` runs them with the script's common flags
    (``args.steps``, ``--chunk``, ``--devices``, and the checkpoint flags, saved under ``out`` as
    :func:`_checkpoints.checkpoint_path` names them). ``evaluate``, if given, is called with the
    parameters (in ``params``' form) after every chunk, for the progress bar and
    ``TrainingRun.evaluations``."""
    flat = keeps_parameters_flat(name) if flat is None else flat
    stored, loss_and_grad, to_params = parameter_state(params, loss_and_grad, flat)
    sharding = batch_sharding(args.devices)
    run = train_in_chunks(
        training_step(loss_and_grad, optimizer, draw_batch, sharding),
        (stored, optimizer.init(stored)),
        key,
        args.steps,
        args.chunk,
        name,
        evaluate=None if evaluate is None else lambda state: evaluate(to_params(state[0])),
        checkpoint=checkpoint_path(out, args, name),
        checkpoint_every=args.checkpoint_every,
        sharding=sharding,
    )
    return run, to_params(run.state[0])
