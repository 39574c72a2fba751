"""Fit the signed distance field of a torus with a 3 -> 64 -> 64 -> 64 -> 1 MLP in Slang kernels,
under an eikonal loss: a gradient of a loss that holds the network's own input gradient.

The torus lies around the y axis (major radius 0.5, minor radius 0.2) in the cube [-1, 1]^3. Each
step samples fresh points, uniform in the cube, and takes one optax Adam step on

    mean((f(p) - sdf(p))^2) + 0.1 * mean((|grad_p f(p)| - 1)^2),

whose parameter gradient differentiates ``jax.grad`` of ``slax.nn.mlp_apply`` (second derivatives
of the network); the whole loop runs in jitted lax.scan chunks. The same network in plain JAX
(``slax.nn.mlp_apply_reference``) trains side by side from the same initialisation and points.

    python experiments/sdf.py --steps 2000 --batch 4096

Writes metrics.json, loss.png and slice.png (both fields and the true one on the plane y = 0) to
--out. With --target-mse, exits 1 if slax's held-out squared distance error ends above it.

The defaults depend on where JAX runs (``--help`` gives both): on a CPU 1500 steps of 512 points,
enough for the torus's hole to open in the slice, on a GPU 2000 steps of 4096 points. Run time of
the defaults: about 2.5 minutes on a 2-core CPU (SlangPy's CPU device, kernels compiled afresh;
timed while other work shared the machine), 80 s of it slax's steps (19 a second there). On a
GPU the steps take under two seconds (an H100's rows in BENCHMARKS.md); loading JAX and slax and
compiling take the rest.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import _harness as harness


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=harness.HelpFormatter,
        epilog=harness.exit_status_help("slax's held-out squared distance error ends above --target-mse"),
    )
    harness.add_common_arguments(
        parser,
        steps=harness.DeviceDefault(cpu=1500, gpu=2000),
        batch=harness.DeviceDefault(cpu=512, gpu=4096),
        chunk=250,
    )
    parser.add_argument(
        "--lr", type=harness.positive_float, default=3e-3, help="Adam learning rate, cosine-decayed"
    )
    parser.add_argument(
        "--target-mse",
        type=harness.finite_float,
        default=None,
        help="exit 1 if slax's held-out squared distance error ends above this (default: not checked)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "sdf")

# After the flags: JAX and slax take seconds to import.
import _plots as plots
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _training import cast, fit, gradient_disagreement, result_line

from slax import nn

SIZES = (3, 64, 64, 64, 1)
MAJOR_RADIUS, MINOR_RADIUS = 0.5, 0.2
EIKONAL_WEIGHT = 0.1


def torus_distance(points: jax.Array) -> jax.Array:
    """The signed distance from ``points (..., 3)`` to the torus: negative inside."""
    ring = jnp.hypot(points[..., 0], points[..., 2]) - MAJOR_RADIUS
    return jnp.hypot(ring, points[..., 1]) - MINOR_RADIUS


def sample(key: jax.Array, batch: int) -> tuple[jax.Array, jax.Array]:
    """``batch`` points uniform in [-1, 1]^3 and their signed distances ``(batch, 1)``."""
    points = jax.random.uniform(key, (batch, 3), minval=-1.0, maxval=1.0)
    return points, torus_distance(points)[:, None]


Field = Callable[[Any, jax.Array], jax.Array]
"""A learnt field: ``(params, points (..., 3) float32) -> float32 distances (..., 1)``."""


def network(name: str, dtype: Any) -> Field:
    """The 3-64-64-64-1 MLP as a :data:`Field`, slax's (``"slax"``) or plain JAX's (``"jax"``), run
    in ``dtype`` on float32 master parameters."""
    apply = nn.mlp_apply if name == "slax" else nn.mlp_apply_reference

    def field(params, points):
        return apply(*cast((params, points), dtype)).astype(jnp.float32)

    return field


FieldWithGradient = Callable[[Any, jax.Array], tuple[jax.Array, jax.Array]]
"""A field and its gradient in the points: ``(params, points (..., 3)) -> (distances (..., 1),
gradients (..., 3))``, both float32."""


def with_gradient(field: Field) -> FieldWithGradient:
    """``field`` and its gradient in the points, by ``jax.vjp``."""

    def both(params, points):
        values, pullback = jax.vjp(lambda points: field(params, points), points)
        (gradient,) = pullback(jnp.ones_like(values))  # each point's own: the samples are independent
        return values, gradient

    return both


def sdf_loss(field: FieldWithGradient):
    """``(params, points, distances) -> loss``: the squared distance error of ``field`` plus
    EIKONAL_WEIGHT times the eikonal residual, ``(|grad_p field(params, p)| - 1)^2``."""

    def loss(params, points, distances):
        values, gradient = field(params, points)
        norm = jnp.linalg.norm(gradient, axis=-1)
        fit = jnp.mean((values - distances) ** 2)
        return fit + EIKONAL_WEIGHT * jnp.mean((norm - 1.0) ** 2)

    return loss


def evaluate(field: Field, params, key, size=16384) -> dict[str, float]:
    """Held-out squared distance error, its mean within 0.1 of the surface, and the mean eikonal
    residual ``| |grad f| - 1 |``."""
    points, distances = sample(key, size)
    values = field(params, points)
    gradient = jax.grad(lambda p: jnp.sum(field(params, p)))(points)
    squared = (values - distances) ** 2
    near = jnp.abs(distances) < 0.1
    return {
        "test_mse": float(jnp.mean(squared)),
        "test_mse_near_surface": float(jnp.sum(jnp.where(near, squared, 0.0)) / jnp.maximum(near.sum(), 1)),
        "eikonal_residual": float(jnp.mean(jnp.abs(jnp.linalg.norm(gradient, axis=-1) - 1))),
    }


def plot_slice(out, trained: dict[str, tuple[Field, Any]], title) -> None:
    """The plane y = 0: the true signed distance and each model's (``trained``: its field and
    parameters by name), on one colour scale, with their zero level (the surface) drawn on each,
    and slax's absolute error."""
    grid = jnp.linspace(-1.0, 1.0, 128)
    x, z = jnp.meshgrid(grid, grid, indexing="xy")
    points = jnp.stack([x, jnp.zeros_like(x), z], axis=-1)
    fields = {"true distance": torus_distance(points)}
    for name, (field, params) in trained.items():
        fields[f"{name} network"] = field(params, points)[..., 0]
    fields["|slax - true|"] = jnp.abs(fields["slax network"] - fields["true distance"])
    low, high = float(fields["true distance"].min()), float(fields["true distance"].max())
    plt = plots.pyplot()
    from matplotlib.colors import TwoSlopeNorm  # with the experiments extra, as plots.pyplot

    centred = TwoSlopeNorm(vcenter=0.0, vmin=low, vmax=high)  # the surface white
    fig, axes = plt.subplots(1, len(fields), figsize=(4.2 * len(fields), 4.2), squeeze=False)
    for ax, (label, values) in zip(axes[0], fields.items()):
        is_error = label.startswith("|")
        image = ax.imshow(
            np.asarray(values),
            extent=(-1, 1, -1, 1),
            origin="lower",
            norm=None if is_error else centred,
            vmin=0 if is_error else None,
            cmap="magma" if is_error else "RdBu",
        )
        if not is_error:
            ax.contour(np.asarray(x), np.asarray(z), np.asarray(values), levels=[0.0], colors="black")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("x", fontsize=8)
        ax.set_ylabel("z", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    plots.save(fig, out / "slice.png", dpi=100)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    out, device = harness.prepare_run("sdf", args)

    print(
        "sdf: comparing the step-0 gradients of slax and plain JAX (slax compiles its kernels on a "
        "first run) ...",
        flush=True,
    )

    init_key, data_key, test_key, grad_key = jax.random.split(jax.random.key(args.seed), 4)
    params = nn.mlp_init(init_key, SIZES, jnp.float32)
    optimizer = optax.adam(optax.cosine_decay_schedule(args.lr, args.steps, alpha=0.01))
    fields = {name: network(name, jnp.dtype(args.dtype)) for name in ("slax", "jax")}
    fns = {name: jax.value_and_grad(sdf_loss(with_gradient(field))) for name, field in fields.items()}
    disagreement = gradient_disagreement(fns, params, sample(grad_key, min(args.batch, 4096)))
    print(
        f"step-0 gradient disagreement slax vs jax: max abs {disagreement['max_abs_difference']:.3g}, "
        f"relative {disagreement['max_difference_relative_to_largest']:.3g}"
    )

    results, curves, trained = {}, {}, {}
    for name, fn in fns.items():
        run, final = fit(
            name, params, fn, optimizer, lambda key: sample(key, args.batch), data_key, args, out
        )
        trained[name], curves[name] = (fields[name], final), run.losses
        results[name] = run.results(args.batch, evaluate(fields[name], final, test_key))
        quality = (
            f"held-out squared distance error {results[name]['test_mse']:.3e}, eikonal residual "
            f"{results[name]['eikonal_residual']:.3f}"
        )
        print(result_line(name, quality, results[name]))

    metrics = {
        "config": harness.run_config(args),
        "device": device,
        "sizes": SIZES,
        "eikonal_weight": EIKONAL_WEIGHT,
        "step0_gradient_slax_vs_jax": disagreement,
        **results,
    }
    harness.write_metrics(out, metrics)
    plots.plot_training(
        "sdf",
        out,
        args,
        device,
        curves,
        "training loss (distance + 0.1 eikonal)",
        {"slice.png": lambda title: plot_slice(out, trained, title)},
    )
    harness.report_outputs(out)
    error = results["slax"]["test_mse"]
    met = harness.met_target("slax held-out squared distance error", error, args.target_mse)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
