"""Checkpoints of experiment runs: written so that a crash never loses all progress, read so that
a damaged file or a changed flag is refused, naming it and what to do.

A run in ``--out`` keeps, per model, ``checkpoint-<model>.npz`` (the latest) and
``checkpoint-<model>.previous.npz`` (the one before), and ``checkpoint-flags.json``, the flags that
define the run, which ``--resume`` compares with its own.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import zipfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _harness import refuse_flags

_PREVIOUS_SUFFIX = ".previous.npz"


class CheckpointError(ValueError):
    """A checkpoint file that cannot be resumed from (and what to do)."""


def previous_checkpoint(path: pathlib.Path) -> pathlib.Path:
    """Where :func:`save_checkpoint` keeps the checkpoint before ``path``'s latest."""
    return path.with_name(path.name.removesuffix(".npz") + _PREVIOUS_SUFFIX)


def checkpoint_path(out: pathlib.Path, args: argparse.Namespace, model: str) -> pathlib.Path | None:
    """Where ``model``'s checkpoint lives, if this run checkpoints or resumes (a fresh run into a
    directory holding checkpoints was refused with its flags: :func:`check_fresh`). A fresh run
    records its flags there, for --resume to compare, and so does a --resume that finds none
    recorded (into an empty --out, as a launcher of preemptible jobs passes it every time): the run
    it starts is defined by its flags as a fresh run's are."""
    if not (args.checkpoint_every or args.resume):
        return None
    path = out / f"checkpoint-{model}.npz"
    if not args.resume or not _flags_path(out).exists():
        _write_run_flags(out, args)
    return path


def save_checkpoint(path: pathlib.Path, state: Any, step: int, key: jax.Array, losses: np.ndarray) -> None:
    """Writes state, step, RNG key and losses so far, keeping the checkpoint it replaces as
    :func:`previous_checkpoint`: written to a temporary file, flushed to disk, then renamed over
    ``path``, so that at every instant ``path`` is a whole checkpoint, and a crash during the write,
    or damage to the new file after it, leaves an intact one to resume from."""
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(state)]
    arrays = {f"leaf_{i}": leaf for i, leaf in enumerate(leaves)}
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as f:
        np.savez(f, step=np.asarray(step), key=np.asarray(jax.random.key_data(key)), losses=losses, **arrays)  # type: ignore[arg-type]
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        _keep_as_previous(path)
    os.replace(temporary, path)
    _fsync_directory(path.parent)


def _keep_as_previous(path: pathlib.Path) -> None:
    """Makes ``path``'s checkpoint the previous one, atomically, leaving ``path`` in place."""
    previous = previous_checkpoint(path)
    staged = previous.with_name(previous.name + ".tmp")
    staged.unlink(missing_ok=True)
    try:
        os.link(path, staged)
    except OSError:  # a file system without hard links
        shutil.copy2(path, staged)
    os.replace(staged, previous)


def _fsync_directory(directory: pathlib.Path) -> None:
    """Flushes renames in ``directory`` to disk (where the OS lets a directory be opened)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _read_checkpoint(path: pathlib.Path) -> dict[str, np.ndarray]:
    """Every array of the checkpoint at ``path`` (read whole, so a damaged file fails here), or
    :class:`CheckpointError` naming it, saying why, and what to do."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: np.array(data[name]) for name in data.files}
        missing = {"step", "key", "losses"} - set(arrays)
        if missing:
            raise ValueError(f"it has no {', '.join(sorted(missing))}")
        return arrays
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as error:
        reason = str(error) or type(error).__name__
        raise CheckpointError(f"checkpoint {path} cannot be read ({reason}). {_what_to_do(path)}") from None


def _what_to_do(path: pathlib.Path) -> str:
    previous = previous_checkpoint(path)
    try:
        step = checkpoint_step(previous) if previous.exists() else None
    except CheckpointError:
        step = None
    if step is None:
        return (
            f"No intact previous checkpoint ({previous}) is there: start the run afresh in another "
            "--out (or delete the damaged file to start this one over)."
        )
    aside = f"move the damaged file aside (mv {path} {path}.damaged), then " if path.exists() else ""
    return (
        f"The previous checkpoint {previous} (step {step}) is intact: {aside}copy it in its place "
        f"(cp {previous} {path}) and pass --resume again to continue from step {step}."
    )


def checkpoint_step(path: pathlib.Path) -> int:
    """The step the checkpoint at ``path`` was written after; CheckpointError if it cannot be read."""
    return int(_read_checkpoint(path)["step"])


def load_checkpoint(path: pathlib.Path, template: Any, key: jax.Array) -> tuple[Any, int, np.ndarray]:
    """Reads a :func:`save_checkpoint` file into the structure of ``template``.

    Raises:
      CheckpointError: the file is damaged (truncated, empty, not a checkpoint) or holds another
        model's state; the message names it and what to do.
      ValueError: it was written by a run with another seed.
    """
    data = _read_checkpoint(path)
    if not np.array_equal(data["key"], np.asarray(jax.random.key_data(key))):
        raise ValueError(f"slax: checkpoint {path} was written by a run with another seed.")
    leaves, treedef = jax.tree.flatten(template)
    stored = sorted((name for name in data if name.startswith("leaf_")), key=lambda n: int(n[5:]))
    shapes = [data[name].shape for name in stored]
    if shapes != [np.shape(leaf) for leaf in leaves]:
        raise CheckpointError(
            f"checkpoint {path} holds another model's state (arrays of shapes {shapes}, this run's "
            f"are {[np.shape(leaf) for leaf in leaves]}): resume with the run's flags, or use another --out "
            f"(checkpoints slax wrote before it kept its parameters as one vector do not resume)."
        )
    loaded = [jnp.asarray(data[f"leaf_{i}"], dtype=leaf.dtype) for i, leaf in enumerate(leaves)]
    return jax.tree.unflatten(treedef, loaded), int(data["step"]), np.array(data["losses"])


_FLAGS_THAT_KEEP_THE_RUN = ("out", "resume", "checkpoint_every", "chunk", "device", "launch", "steps")
"""Flags a resumed run may change: where it writes, how often it checkpoints, how steps are grouped
into jitted chunks, which device runs them. Every other flag, except ``--target-*`` pass marks,
defines the run; --steps may change but not drop below a checkpoint's step."""


def run_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that define a run's numbers (see ``_FLAGS_THAT_KEEP_THE_RUN``), as JSON values."""
    return {
        key: str(value) if isinstance(value, pathlib.Path) else value
        for key, value in sorted(vars(args).items())
        if key not in _FLAGS_THAT_KEEP_THE_RUN and not key.startswith("target_")
    }


def _flags_path(out: pathlib.Path) -> pathlib.Path:
    return out / "checkpoint-flags.json"


def check_fresh(name: str, args: argparse.Namespace) -> None:
    """Refuses a fresh run that checkpoints into an ``--out`` holding checkpoints, as bad flags
    (exit status 2), before anything is compiled: it would overwrite another run's progress, which
    ``--resume`` continues."""
    existing = sorted(args.out.glob("checkpoint-*.npz")) if args.checkpoint_every else []
    if existing:
        refuse_flags(name, f"{existing[0]} exists: pass --resume to continue that run, or another --out.")


def check_resume(name: str, args: argparse.Namespace) -> None:
    """Refuses ``--resume`` where it would not continue the run in ``--out``: flags that change the
    run (naming each difference) or --steps below a checkpoint's step, as bad flags (exit status
    2), or a checkpoint that cannot be read or is missing (naming the file, and the intact previous
    one to resume from)."""
    out = args.out
    recorded = _read_run_flags(_flags_path(out)) if _flags_path(out).exists() else None
    if recorded is not None:
        before = {key: value for key, value in recorded.items() if key != "steps"}
        now = run_flags(args)
        differences = [
            f"--{key.replace('_', '-')} {before.get(key)} (the run's) vs {now.get(key)} (now)"
            for key in sorted(set(before) | set(now))
            if before.get(key) != now.get(key)
        ]
        if differences:
            refuse_flags(
                name,
                f"--resume would change the run in {out}: {'; '.join(differences)}. Resume with the "
                "run's flags, or start a new run in another --out.",
            )
        if args.steps != recorded.get("steps", args.steps):
            print(f"{name}: note: --steps {args.steps} differs from the run's {recorded['steps']}.")
    for previous in sorted(out.glob("checkpoint-*" + _PREVIOUS_SUFFIX)):
        latest = previous.with_name(previous.name.removesuffix(_PREVIOUS_SUFFIX) + ".npz")
        if not latest.exists():
            raise SystemExit(f"{name}: checkpoint {latest} is missing. {_what_to_do(latest)}")
    for path in sorted(out.glob("checkpoint-*.npz")):
        if path.name.endswith(_PREVIOUS_SUFFIX):
            continue
        try:
            step = checkpoint_step(path)
        except CheckpointError as error:
            raise SystemExit(f"{name}: {error}") from None
        if args.steps < step:
            refuse_flags(
                name,
                f"--steps {args.steps} is below step {step}, where {path} stopped; resume with "
                f"--steps {step} or more.",
            )


def _read_run_flags(path: pathlib.Path) -> dict[str, Any]:
    try:
        flags = json.loads(path.read_text())
        if not isinstance(flags, dict):
            raise ValueError("not a JSON object")
        return flags
    except (OSError, ValueError) as error:
        raise SystemExit(
            f"{path} cannot be read ({error}); it records the flags of the run in {path.parent}. "
            "Restore it, or delete it to resume without checking the flags."
        ) from None


def _write_run_flags(out: pathlib.Path, args: argparse.Namespace) -> None:
    """Records the run's flags beside its checkpoints, for --resume to compare (atomically)."""
    flags = run_flags(args) | {"steps": args.steps}
    temporary = _flags_path(out).with_name(_flags_path(out).name + ".tmp")
    temporary.write_text(json.dumps(flags, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, _flags_path(out))
