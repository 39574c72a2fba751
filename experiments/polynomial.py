"""Fit the Slang autodiff tutorial's polynomial targets with a 4 -> 16 -> 4 MLP in Slang kernels.

Inputs (x, y) uniform in [-1, 1] are encoded as (x, y, x^2, y^2); the targets are
f1 = (x+y)/(1+y^2), f2 = 2x+y, f3 = 0.5x^2+1.2y, f4 = x+0.5y^2. Each step samples a fresh batch and
takes one optax Adam step; the whole loop runs in jitted lax.scan chunks. The same network in plain
JAX trains side by side from the same initialisation and batches.

    python experiments/polynomial.py --steps 3000 --dtype float32

Writes metrics.json, loss.png and surfaces.png to --out. With --target-mse, exits 1 if slax's held-out
MSE ends above it (the default run reaches ~1.3e-4; short runs stay higher).

Run time of the defaults: about 25 s on a 2-core CPU (SlangPy's CPU device, kernels compiled
afresh). On a GPU the steps take well under a second (an H100's rows in BENCHMARKS.md); loading JAX
and slax and compiling take the rest.
"""

from __future__ import annotations

import argparse
import sys

import _harness as harness


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=harness.HelpFormatter,
        epilog=harness.exit_status_help("slax's held-out MSE ends above --target-mse"),
    )
    harness.add_common_arguments(parser, steps=3000, batch=1024, chunk=250)
    parser.add_argument(
        "--lr", type=harness.positive_float, default=1e-2, help="Adam learning rate, cosine-decayed"
    )
    parser.add_argument(
        "--target-mse",
        type=harness.finite_float,
        default=None,
        help="exit 1 if slax's held-out MSE ends above this (default: not checked)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "polynomial")

# After the flags: JAX and slax take seconds to import.
import _plots as plots
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _training import cast, fit, result_line

from slax import nn

SIZES = (4, 16, 4)
TARGET_NAMES = (
    r"$f_1(x, y) = (x+y)\,/\,(1+y^2)$",
    r"$f_2(x, y) = 2x+y$",
    r"$f_3(x, y) = 0.5x^2+1.2y$",
    r"$f_4(x, y) = x+0.5y^2$",
)
"""The four targets, as the surfaces plot titles its columns (matplotlib's mathtext)."""


def encode(xy: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(x, y) -> network input (x, y, x^2, y^2) and the four targets."""
    x, y = xy[..., 0], xy[..., 1]
    inputs = jnp.stack([x, y, x * x, y * y], axis=-1)
    targets = jnp.stack([(x + y) / (1 + y * y), 2 * x + y, 0.5 * x * x + 1.2 * y, x + 0.5 * y * y], axis=-1)
    return inputs, targets


def sample(key: jax.Array, batch: int) -> tuple[jax.Array, jax.Array]:
    return encode(jax.random.uniform(key, (batch, 2), minval=-1.0, maxval=1.0))


def loss_and_grad_fns(dtype: str):
    """Both models' (params, x, target) -> (loss, float32 grads), params kept in float32.

    In float16 the kernels (and the JAX twin) run on a half copy of the float32 master parameters.
    """
    kernel_dtype = jnp.dtype(dtype)

    def slax_fn(params, x, t):
        return nn.mlp_loss_and_grad(*cast((params, x, t), kernel_dtype))

    def jax_loss(params, x, t):
        return nn.mlp_loss_reference(*cast((params, x, t), kernel_dtype))

    return {"slax": slax_fn, "jax": jax.value_and_grad(jax_loss)}


def test_mse(predict, params, dtype, key, size=8192) -> float:
    """The mean squared error of ``predict`` on ``size`` fresh samples, in one jitted program."""

    def mse(params, key):
        x, t = sample(key, size)
        y = predict(*cast((params, x), dtype)).astype(jnp.float32)
        return jnp.mean((y - t) ** 2)

    return float(jax.jit(mse)(params, key))


def grad_disagreement(fns, params, key, batch) -> dict[str, float]:
    """How far slax's gradient at the initial parameters is from plain JAX's: the largest absolute
    difference, and that relative to JAX's largest gradient entry."""
    x, t = sample(key, batch)
    _, g_slax = jax.jit(fns["slax"])(params, x, t)
    _, g_jax = jax.jit(fns["jax"])(params, x, t)
    diffs = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)), g_slax, g_jax))
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(g_jax))
    worst = max(float(d) for d in diffs)
    return {"max_abs_difference": worst, "max_difference_relative_to_largest": worst / scale}


def plot_surfaces(out, params_by_model, dtype, title) -> None:
    """Each target over the input square (columns) and, in rows: the target, slax's and plain JAX's
    predictions on the target's colour scale, and slax's absolute error on a scale of its own. Each
    column is titled with its target's formula, each row named at its left; axes tick at -1, 0, 1
    and colour bars carry at most five ticks, so every label stays legible."""
    from matplotlib import ticker

    grid = jnp.linspace(-1.0, 1.0, 96)
    xy = jnp.stack(jnp.meshgrid(grid, grid, indexing="xy"), axis=-1)
    inputs, targets = encode(xy)
    rows = {"target": targets}
    for name, params in params_by_model.items():
        predict = nn.mlp_apply if name == "slax" else nn.mlp_apply_reference
        label = "slax prediction" if name == "slax" else "plain JAX prediction"
        rows[label] = predict(*cast((params, inputs), dtype)).astype(jnp.float32)
    rows["slax error |slax - target|"] = jnp.abs(rows["slax prediction"] - targets)
    fig, axes = plots.pyplot().subplots(len(rows), 4, figsize=(14, 2.9 * len(rows) + 0.8), squeeze=False)
    for c, target_name in enumerate(TARGET_NAMES):
        low, high = float(targets[..., c].min()), float(targets[..., c].max())
        axes[0, c].set_title(target_name, fontsize=11, pad=8)
        for r, (label, values) in enumerate(rows.items()):
            is_error = label.startswith("slax error")
            ax = axes[r, c]
            image = ax.imshow(
                np.asarray(values[..., c]),
                extent=(-1, 1, -1, 1),
                origin="lower",
                vmin=0 if is_error else low,
                vmax=None if is_error else high,
                cmap="magma" if is_error else "viridis",
            )
            ax.set_xticks([-1, 0, 1])
            ax.set_yticks([-1, 0, 1])
            ax.tick_params(labelsize=8)
            ax.set_xlabel("x", fontsize=9, labelpad=0)
            ax.set_ylabel(f"{label}\n\ny" if c == 0 else "y", fontsize=9, labelpad=2)
            bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.03)
            bar.locator = ticker.MaxNLocator(5)
            bar.formatter = ticker.ScalarFormatter(useMathText=True)
            bar.formatter.set_powerlimits((-2, 3))  # small errors: "x10^-3" above the bar
            bar.update_ticks()
            bar.ax.tick_params(labelsize=8)
            bar.ax.yaxis.get_offset_text().set_fontsize(8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    plots.save(fig, out / "surfaces.png", dpi=100)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    out, device = harness.prepare_run("polynomial", args)

    print(
        "polynomial: comparing the step-0 gradients of slax and plain JAX (slax compiles its "
        "kernels on a first run) ...",
        flush=True,
    )
    init_key, data_key, test_key, grad_key = jax.random.split(jax.random.key(args.seed), 4)
    params = nn.mlp_init(init_key, SIZES, jnp.float32)
    optimizer = optax.adam(optax.cosine_decay_schedule(args.lr, args.steps, alpha=0.01))
    fns = loss_and_grad_fns(args.dtype)
    disagreement = grad_disagreement(fns, params, grad_key, args.batch)
    print(
        f"step-0 gradient disagreement slax vs jax: max abs {disagreement['max_abs_difference']:.3g}, "
        f"relative {disagreement['max_difference_relative_to_largest']:.3g}"
    )

    results, curves, trained = {}, {}, {}
    for name, fn in fns.items():
        run, final = fit(
            name, params, fn, optimizer, lambda key: sample(key, args.batch), data_key, args, out
        )
        predict = nn.mlp_apply if name == "slax" else nn.mlp_apply_reference
        mse = test_mse(predict, final, jnp.dtype(args.dtype), test_key)
        trained[name], curves[name] = final, run.losses
        results[name] = run.results(args.batch, {"test_mse": mse})
        print(result_line(name, f"held-out MSE {mse:.3e}", results[name]))

    metrics = {
        "config": harness.run_config(args),
        "device": device,
        "step0_gradient_slax_vs_jax": disagreement,
        **results,
    }
    harness.write_metrics(out, metrics)
    plots.plot_training(
        "polynomial",
        out,
        args,
        device,
        curves,
        "training loss (squared error)",
        {"surfaces.png": lambda title: plot_surfaces(out, trained, jnp.dtype(args.dtype), title)},
    )
    harness.report_outputs(out)
    met = harness.met_target("slax held-out MSE", results["slax"]["test_mse"], args.target_mse)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
