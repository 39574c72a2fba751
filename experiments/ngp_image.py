"""Learn an image with instant-NGP's multiresolution hash encoding and a 32-64-64-3 ReLU MLP.

The model maps a point uv in [0, 1]^2 to the image's colour there: ``slax.nn.hash_encode`` (16
levels of 2 features, 2^--log2-table-size entries a level, resolutions from 16 to --size cells a
side) followed by ``slax.nn.mlp_apply`` (two hidden ReLU layers of 64, an affine RGB output). Each
step draws --batch points uniformly, samples the image there bilinearly (the target) and takes one
optax Adam step, on the tables and the MLP together, on the mean squared error; the loop runs in
jitted lax.scan chunks. Beside it the same model in plain JAX (``slax.nn.hash_encode_reference``,
gathers and XLA's scatter-add, and ``slax.nn.mlp_apply_reference``) trains from the same
initialisation on the same points.

--dtype float16 runs both MLPs in half precision, as instant-NGP does, with the tables float32: the
encoding's output is float16 for the MLP, which runs on a half copy of float32 parameters
(experiments/_ngp.py says why), and the loss is float32's, against the target rounded to half in
both models. slax's loss is ``slax.nn.mlp_squared_error`` on the encoding's features: its gradient
runs the network's forward pass, the loss and both gradients in one launch on a GPU.

The image is procedural, sharp at every scale: a checkerboard of 16 squares a side, each with a ring
whose radius grows across the image, in three colours (--size pixels a side; 2048 is the issue's
size on a GPU). The default, 128, suits the CPU routes.

    python experiments/ngp_image.py --size 2048 --steps 2000 --batch 262144 --log2-table-size 19 \\
        --dtype float16

Writes metrics.json (per model the reconstruction's MSE and PSNR over every pixel centre, and its
PSNR after every chunk; the encoding and each part's dtype), loss.png, psnr.png (PSNR against
steps) and image.png (the image, both fits and slax's error) to --out. With --target-psnr, exits 1
if slax's reconstruction ends below it.

Run time of the defaults: under 2 minutes on a 2-core CPU (SlangPy's CPU device, kernels compiled
afresh). On a GPU: not timed.
"""

from __future__ import annotations

import argparse
import sys

import _harness as harness


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=harness.HelpFormatter,
        epilog=harness.exit_status_help("slax's reconstruction ends below --target-psnr"),
    )
    harness.add_common_arguments(parser, steps=300, batch=4096, chunk=100)
    parser.add_argument(
        "--size", type=harness.positive_int, default=128, help="image side in pixels, at least 16"
    )
    harness.add_hash_encoding_arguments(
        parser, default_levels=16, default_log2_table_size=14, default_lr=1e-2
    )
    parser.add_argument(
        "--target-psnr",
        type=harness.finite_float,
        default=None,
        help="exit 1 if slax's reconstruction ends below this PSNR in dB (default: not checked)",
    )
    args = parser.parse_args(argv)
    if args.size < 16:
        parser.error(f"--size must be at least 16 (the coarsest level's resolution); got {args.size}.")
    return args


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "ngp_image")

# After the flags: JAX and slax take seconds to import.
import _ngp as ngp
import _plots as plots
import jax
import jax.numpy as jnp
import numpy as np
import texture
from _training import fit, gradient_disagreement, result_line


def procedural_image(size: int) -> np.ndarray:
    """``(size, size, 3)`` float32 in [0, 1]: a 16x16 checkerboard, each square holding a ring
    whose radius grows with the square's column, coloured by its row (sharp edges at every level)."""
    centres = (np.arange(size, dtype=np.float32) + 0.5) / size
    v, u = np.meshgrid(centres, centres, indexing="ij")
    cell_u, cell_v = np.floor(u * 16), np.floor(v * 16)
    checker = (cell_u + cell_v) % 2
    local = np.stack([u * 16 - cell_u - 0.5, v * 16 - cell_v - 0.5], axis=-1)
    radius = 0.1 + 0.3 * cell_u / 15
    ring = np.abs(np.linalg.norm(local, axis=-1) - radius) < 0.06
    hue = cell_v / 15
    colour = np.stack([hue, 1 - hue, 0.5 + 0.5 * checker], axis=-1)
    image = np.where(ring[..., None], colour, checker[..., None] * 0.8 + 0.1)
    return image.astype(np.float32)


def loss_and_grad(name: str, config, dtype):
    """``(params, uv, target) -> (loss, grads)``: the mean squared error of model ``name``'s colours
    (:func:`_ngp.squared_error`, float32)."""
    return jax.value_and_grad(ngp.squared_error(name, config, dtype))


def reconstruct(predict, params, size: int) -> np.ndarray:
    """The model's image (size, size, 3) at every pixel centre, in blocks of rows of about 2^16
    pixels (bounded memory at 2048x2048)."""
    rows_per_block = max(1, min(size, 65536 // size))
    centres = (jnp.arange(size, dtype=jnp.float32) + 0.5) / size

    @jax.jit
    def block(first_row):
        v = (first_row + jnp.arange(rows_per_block, dtype=jnp.float32) + 0.5) / size
        uv = jnp.stack(jnp.broadcast_arrays(centres[None, :], v[:, None]), axis=-1).reshape(-1, 2)
        return predict(params, uv).reshape(rows_per_block, size, 3)

    blocks = [np.asarray(block(float(first))) for first in range(0, size, rows_per_block)]
    return np.concatenate(blocks)[:size]


def plot_psnr(path, evaluations: dict[str, list[tuple[int, float]]], title: str) -> None:
    """PSNR against steps, slax solid and plain JAX dashed."""
    fig, ax = plots.pyplot().subplots(figsize=(6, 4))
    for name, points in evaluations.items():
        steps, values = zip(*points) if points else ((), ())
        ax.plot(steps, values, "-" if name == "slax" else "--", marker="o", label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("PSNR over every pixel (dB)")
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    plots.save(fig, path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    out, device = harness.prepare_run("ngp_image", args)
    print(
        "ngp_image: comparing the step-0 gradients of slax and plain JAX (slax compiles its kernels "
        "on a first run) ...",
        flush=True,
    )
    config = ngp.encoding_config(args.levels, args.log2_table_size, 2, args.size)
    image = jnp.asarray(procedural_image(args.size))
    init_key, data_key, grad_key = jax.random.split(jax.random.key(args.seed), 3)
    params = ngp.init_params(init_key, config, outputs=3)
    optimizer = ngp.optimizer(args.lr, args.steps)
    draw_batch = texture.batch_drawer(texture.bilinear_reference, image, args.batch)
    predictors = {name: ngp.model(name, config, jnp.dtype(args.dtype)) for name in ("slax", "jax")}
    disagreement = gradient_disagreement(
        {name: loss_and_grad(name, config, jnp.dtype(args.dtype)) for name in predictors},
        params,
        draw_batch(grad_key),
    )
    print(
        f"step-0 gradient disagreement slax vs jax: max abs {disagreement['max_abs_difference']:.3g}, "
        f"relative {disagreement['max_difference_relative_to_largest']:.3g}"
    )

    def image_psnr(predict):
        return lambda params: texture.psnr(
            float(np.mean((reconstruct(predict, params, args.size) - np.asarray(image)) ** 2))
        )

    results, curves, fitted, evaluations = {}, {}, {}, {}
    for name, predict in predictors.items():
        run, final = fit(
            name,
            params,
            loss_and_grad(name, config, jnp.dtype(args.dtype)),
            optimizer,
            draw_batch,
            data_key,
            args,
            out,
            flat=ngp.kept_flat(name),
            evaluate=image_psnr(predict),
        )
        curves[name], evaluations[name] = run.losses, run.evaluations
        fitted[name] = reconstruct(predict, final, args.size)
        mse = float(np.mean((fitted[name] - np.asarray(image)) ** 2))
        quality = {"image_mse": mse, "image_psnr_db": texture.psnr(mse), "psnr_db_by_step": run.evaluations}
        results[name] = run.results(args.batch, quality)
        print(result_line(name, f"image PSNR {texture.psnr(mse):.2f} dB (MSE {mse:.3e})", results[name], 1))

    metrics = {
        "config": harness.run_config(args),
        "device": device,
        "encoding": ngp.encoding_metrics(config, args.dtype),
        "sizes": ngp.mlp_sizes(config, 3),
        "step0_gradient_slax_vs_jax": disagreement,
        "slax_image_vs_jax_image_max_abs": float(np.max(np.abs(fitted["slax"] - fitted["jax"]))),
        **results,
    }
    harness.write_metrics(out, metrics)
    plots.plot_training(
        "ngp_image",
        out,
        args,
        device,
        curves,
        "training loss (squared error)",
        {
            "psnr.png": lambda title: plot_psnr(out / "psnr.png", evaluations, title),
            "image.png": lambda title: plots.plot_image_fits(
                out / "image.png", np.asarray(image), fitted, "fit", title
            ),
        },
    )
    harness.report_outputs(out)
    met = harness.met_target(
        "slax image PSNR (dB)", results["slax"]["image_psnr_db"], args.target_psnr, at_least=True
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
