"""Fit a texture to a photograph through a differentiable bilinear sampler written in Slang.

The texture, (size, size, 4) float32 RGBA texels starting from uniform noise, is the only parameter.
Each step draws --batch points uv uniformly in [0, 1]^2, samples the photograph there (the target)
and the texture (the prediction) with bilinear interpolation, and takes one optax Adam step on their
squared error; the whole loop runs in jitted lax.scan chunks. slax's sampler is sample_bilinear in
shaders/texture.slang, which reads the texture as SlangPy's IDiffTensor<float4, 2>: its backward
pass adds each sample's gradient into the texture's gradient buffer with atomic adds (on a CUDA GPU
from sm_90, one vector reduction a texel). Beside it the same model in plain JAX
(bilinear_reference: a gather, whose gradient XLA computes as a scatter-add) trains from the same
texture on the same points. Each model samples its targets with its own sampler.

The photograph is Grace Hopper's portrait from matplotlib's sample data (600x512), its central
512x512 crop, averaged over blocks down to --size, opaque (alpha 1). Texels are RGBA, as a GPU
texture's are: a texel is then one 16-byte element, which the GPU loads and adds into at once
(plain JAX trains no slower on RGBA than on RGB texels: BENCHMARKS.md, "The texture fit").

    python experiments/texture.py --steps 500 --batch 65536

Writes metrics.json (per model the texture's MSE against the photograph's colours and its PSNR),
loss.png and texture.png (the photograph, both fits and slax's error, in RGB) to --out. With
--target-psnr, exits 1 if slax's texture ends below it (the sampler can represent the photograph
exactly: the default run ends near 88 dB in plain JAX, float32's rounding; short runs stay lower).

Run time of the defaults: about 2 minutes on a 2-core CPU (SlangPy's CPU device, kernels compiled
afresh). On a GPU the steps take well under a second (an H100's rows in BENCHMARKS.md); loading JAX
and slax and compiling take the rest.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import _harness as harness

PHOTOGRAPH_SIZE = 512
"""The side of the photograph's central square crop; --size must divide it."""


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=harness.HelpFormatter,
        epilog=harness.exit_status_help("slax's texture ends below --target-psnr"),
    )
    harness.add_common_arguments(parser, steps=500, batch=65536, chunk=100)
    parser.add_argument(
        "--size",
        type=harness.positive_int,
        default=PHOTOGRAPH_SIZE,
        help="texture side, a divisor of 512 (default %(default)s)",
    )
    parser.add_argument(
        "--lr", type=harness.positive_float, default=0.1, help="Adam learning rate, cosine-decayed"
    )
    parser.add_argument(
        "--target-psnr",
        type=harness.finite_float,
        default=None,
        help="exit 1 if slax's texture ends below this PSNR in dB (default: not checked)",
    )
    args = parser.parse_args(argv)
    if args.dtype != "float32":
        parser.error(
            "--dtype float16: the sampler reads a float texture (IDiffTensor<float4, 2>); use float32."
        )
    if PHOTOGRAPH_SIZE % args.size:
        parser.error(f"--size must divide {PHOTOGRAPH_SIZE} (the photograph's crop); got {args.size}.")
    return args


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "texture")

# After the flags: JAX and slax take seconds to import.
import _plots as plots
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _training import fit, result_line

import slax

Sampler = Callable[[jax.Array, jax.Array], jax.Array]
"""``(texture (H, W, C), uv (N, 2)) -> (N, C)``: bilinear samples at ``uv`` in [0, 1]^2."""


def bilinear_reference(texture: jax.Array, uv: jax.Array) -> jax.Array:
    """Plain JAX's twin of shaders/texture.slang's ``sample_bilinear``: ``texture`` (H, W, C) at
    ``uv`` (N, 2) in [0, 1]^2 (u along the width, v along the height), interpolated between the four
    nearest texel centres, texel (y, x) sitting at uv ((x + 0.5) / W, (y + 0.5) / H), the edge texels
    extended beyond the outermost centres. Returns (N, C). Reads the texels with a gather, so that
    its gradient with respect to the texture is XLA's scatter-add."""
    height, width = texture.shape[:2]
    size = jnp.array([width, height], jnp.int32)
    position = uv * size.astype(uv.dtype) - 0.5
    corner = jnp.floor(position)
    weight = position - corner
    low = jnp.clip(corner.astype(jnp.int32), 0, size - 1)
    high = jnp.clip(corner.astype(jnp.int32) + 1, 0, size - 1)

    def lerp(a, b, t):
        return a + (b - a) * t[:, None]

    top = lerp(texture[low[:, 1], low[:, 0]], texture[low[:, 1], high[:, 0]], weight[:, 0])
    bottom = lerp(texture[high[:, 1], low[:, 0]], texture[high[:, 1], high[:, 0]], weight[:, 0])
    return lerp(top, bottom, weight[:, 1])


def sampler(model: str) -> Sampler:
    """The bilinear sampler of ``model``: ``"slax"``, the Slang function through slax, or ``"jax"``,
    :func:`bilinear_reference`."""
    if model == "slax":
        return slax.load_module("texture").sample_bilinear
    return bilinear_reference


def loss_and_grad(sample: Sampler):
    """``(texture, uv, target) -> (mean squared error, its gradient with respect to texture)``."""

    def loss(texture, uv, target):
        return jnp.mean((sample(texture, uv) - target) ** 2)

    return jax.value_and_grad(loss)


def batch_drawer(sample: Sampler, photograph: jax.Array, batch: int):
    """``key -> (uv, target)``: ``batch`` points uniform in [0, 1]^2 and the photograph sampled there."""

    def draw(key):
        uv = jax.random.uniform(key, (batch, 2))
        return uv, sample(photograph, uv)

    return draw


def load_photograph(size: int) -> np.ndarray:
    """The photograph as (size, size, 3) float32 RGB in [0, 1]: the central square of matplotlib's
    ``grace_hopper.jpg``, averaged over blocks of (512 / size)^2 pixels."""
    try:
        from matplotlib import cbook, image
    except ImportError as error:
        raise SystemExit(
            f"texture: the photograph comes with matplotlib, which is not installed ({harness.EXTRAS_HINT})."
        ) from error
    with cbook.get_sample_data("grace_hopper.jpg") as file:
        pixels = np.asarray(image.imread(file, format="jpeg"), np.float32) / 255.0
    top = (pixels.shape[0] - PHOTOGRAPH_SIZE) // 2
    square = pixels[top : top + PHOTOGRAPH_SIZE, :PHOTOGRAPH_SIZE, :3]
    block = PHOTOGRAPH_SIZE // size
    return square.reshape(size, block, size, block, 3).mean(axis=(1, 3))


def opaque(colours: np.ndarray) -> np.ndarray:
    """``colours`` (H, W, 3) as RGBA texels (H, W, 4), alpha 1."""
    return np.concatenate([colours, np.ones_like(colours[..., :1])], axis=-1)


def psnr(mse: float) -> float:
    """Peak signal-to-noise ratio in dB of an MSE between images in [0, 1]."""
    return float(10 * np.log10(1.0 / mse))


def grad_disagreement(texture, photograph, key, batch) -> dict[str, float]:
    """How far slax's gradient with respect to the initial texture is from plain JAX's, on one
    batch: the largest absolute difference, and that relative to JAX's largest gradient entry."""
    uv, target = batch_drawer(bilinear_reference, photograph, batch)(key)
    _, g_slax = loss_and_grad(sampler("slax"))(texture, uv, target)
    _, g_jax = loss_and_grad(bilinear_reference)(texture, uv, target)
    worst = float(jnp.max(jnp.abs(g_slax - g_jax)))
    return {
        "max_abs_difference": worst,
        "max_difference_relative_to_largest": worst / float(jnp.max(jnp.abs(g_jax))),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    out, device = harness.prepare_run("texture", args)
    print(
        "texture: comparing the step-0 gradients of slax and plain JAX (slax compiles its kernels on a "
        "first run) ...",
        flush=True,
    )

    photograph = jnp.asarray(opaque(load_photograph(args.size)))
    init_key, data_key, grad_key = jax.random.split(jax.random.key(args.seed), 3)
    texture = jax.random.uniform(init_key, photograph.shape)
    optimizer = optax.adam(optax.cosine_decay_schedule(args.lr, args.steps, alpha=0.01))
    disagreement = grad_disagreement(texture, photograph, grad_key, args.batch)
    print(
        f"step-0 gradient disagreement slax vs jax: max abs {disagreement['max_abs_difference']:.3g}, "
        f"relative {disagreement['max_difference_relative_to_largest']:.3g}"
    )

    def colour_mse(texture) -> float:
        return float(jnp.mean((texture[..., :3] - photograph[..., :3]) ** 2))

    def texture_psnr(texture) -> float:
        return psnr(colour_mse(texture))

    results, curves, fitted = {}, {}, {}
    for name in ("slax", "jax"):
        sample = sampler(name)
        draw_batch = batch_drawer(sample, photograph, args.batch)
        # The texture is one array: nothing to flatten.
        run, final = fit(
            name,
            texture,
            loss_and_grad(sample),
            optimizer,
            draw_batch,
            data_key,
            args,
            out,
            flat=False,
            evaluate=texture_psnr,
        )
        fitted[name], curves[name] = np.asarray(final)[..., :3], run.losses
        mse = colour_mse(final)
        results[name] = run.results(args.batch, {"texture_mse": mse, "texture_psnr_db": psnr(mse)})
        print(result_line(name, f"texture PSNR {psnr(mse):.2f} dB (MSE {mse:.3e})", results[name], 1))

    metrics = {
        "config": harness.run_config(args),
        "device": device,
        "step0_gradient_slax_vs_jax": disagreement,
        "slax_texture_vs_jax_texture_max_abs": float(np.max(np.abs(fitted["slax"] - fitted["jax"]))),
        **results,
    }
    harness.write_metrics(out, metrics)
    plots.plot_training(
        "texture",
        out,
        args,
        device,
        curves,
        "training loss (squared error)",
        {
            "texture.png": lambda title: plots.plot_image_fits(
                out / "texture.png", np.asarray(photograph)[..., :3], fitted, "texture", title
            )
        },
    )
    harness.report_outputs(out)
    met = harness.met_target(
        "slax texture PSNR (dB)", results["slax"]["texture_psnr_db"], args.target_psnr, at_least=True
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
