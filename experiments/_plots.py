"""Plots for the experiments: matplotlib set up once, one style per model, loss curves, titles.

matplotlib comes with the ``experiments`` extra; where it is missing, :func:`can_plot` says so and
the run goes on without plots.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
from _harness import EXTRAS_HINT

MODEL_STYLES = {
    "slax": {"color": "tab:blue", "linestyle": "-", "linewidth": 2.2},
    "jax": {"color": "tab:orange", "linestyle": (0, (4, 3)), "linewidth": 1.4},
}
"""How each model is drawn in every plot: slax thick and solid, plain JAX thin and dashed over it, so
both stay visible where the curves coincide."""


def can_plot() -> bool:
    """Whether matplotlib is installed to draw the plots; if not, says so (the run goes on)."""
    if importlib.util.find_spec("matplotlib") is None:
        print(f"matplotlib is not installed: no plots ({EXTRAS_HINT})")
        return False
    return True


def pyplot() -> Any:
    """``matplotlib.pyplot``, drawing to files (the Agg backend), never to a window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def announce(name: str, out: pathlib.Path, files: list[str]) -> None:
    """Says which plots a run draws next, and where: drawing them (and evaluating the models for
    them, which may compile another kernel) takes seconds."""
    print(f"{name}: drawing {', '.join(files)} in {out} ...", flush=True)


def save(fig: Any, path: pathlib.Path, dpi: int) -> pathlib.Path:
    """Writes ``fig`` to ``path`` and closes it, saying so."""
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    print(f"  wrote {path.name}", flush=True)
    return path


def plot_title(task: str, args: argparse.Namespace, device: dict[str, str]) -> str:
    """``"polynomial: float32, 3000 steps, batch 1024; Slang kernels on vulkan (...)"``."""
    return f"{task}: {args.dtype}, {args.steps} steps, batch {args.batch}; Slang kernels on {device['slang']}"


GAP_FLOOR = float(np.finfo(np.float32).eps)
"""Where the gap panel's scale ends: float32's relative rounding (1.2e-7). Two runs of one network
whose smoothed losses are equal to the last bit, or differ by rounding, sit on it, rather than
plunging to an arbitrary tiny value."""


def plot_loss_curves(
    out: pathlib.Path, curves: dict[str, np.ndarray], ylabel: str, title: str
) -> pathlib.Path:
    """Training loss per step of each model (keys of :data:`MODEL_STYLES`), log scale, smoothed over
    1% of the run; below it, how far slax's curve is from plain JAX's, relative to JAX's, on a log
    scale from :data:`GAP_FLOOR` up to at least two decades above it."""
    fig, (ax, gap) = pyplot().subplots(
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
        shown = np.maximum(difference, GAP_FLOOR)
        gap.plot(steps, shown, color="black", linewidth=1)
        gap.set_yscale("log")
        gap.set_ylim(GAP_FLOOR / 2, max(float(shown.max()) * 3, GAP_FLOOR * 100))
        gap.axhline(GAP_FLOOR, color="tab:gray", linestyle=":", linewidth=1)
    gap.set_ylabel("|slax - jax| / jax", fontsize=9)
    gap.set_title(
        "relative gap of the smoothed losses (dotted: float32 rounding, 1.2e-7; equal losses sit on it)",
        fontsize=8,
    )
    gap.set_xlabel("step")
    gap.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save(fig, out / "loss.png", dpi=120)


def plot_image_fits(
    path: pathlib.Path, target: np.ndarray, fits: dict[str, np.ndarray], what: str, title: str
) -> pathlib.Path:
    """The target image (H, W, 3) in [0, 1], each model's fit of it (keys of :data:`MODEL_STYLES`,
    panels titled ``"<model> <what>"``, clipped to [0, 1]) and slax's absolute error, mean over the
    channels, on a colour scale of its own."""
    panels = {"photograph (target)": target}
    panels.update({f"{name} {what}": np.clip(fit, 0, 1) for name, fit in fits.items()})
    fig, axes = pyplot().subplots(1, len(panels) + 1, figsize=(4.2 * (len(panels) + 1), 4.6))
    for ax, (label, values) in zip(axes, panels.items()):
        ax.imshow(values, interpolation="nearest")
        ax.set_title(label, fontsize=10)
        ax.axis("off")
    error = np.abs(fits["slax"] - target).mean(axis=-1)
    shown = axes[-1].imshow(error, cmap="magma", interpolation="nearest")
    axes[-1].set_title("|slax - photograph|, mean over RGB", fontsize=10)
    axes[-1].axis("off")
    fig.colorbar(shown, ax=axes[-1], fraction=0.046)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, path, dpi=100)


def plot_training(
    name: str,
    out: pathlib.Path,
    args: argparse.Namespace,
    device: dict[str, str],
    curves: dict[str, np.ndarray],
    loss_label: str,
    figures: dict[str, Callable[[str], Any]],
) -> None:
    """Every plot of a training experiment ``name``, where matplotlib is installed (:func:`can_plot`):
    says which (:func:`announce`), draws loss.png from ``curves`` (:func:`plot_loss_curves`, with
    ``loss_label`` on its axis), then each of the script's own ``figures``, a file name mapped to
    the function that draws that file given the plots' title (:func:`plot_title`)."""
    if not can_plot():
        return
    announce(name, out, ["loss.png", *figures])
    title = plot_title(name, args, device)
    plot_loss_curves(out, curves, loss_label, title)
    for draw in figures.values():
        draw(title)
