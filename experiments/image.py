"""Learn a photograph with a frequency encoding and a 64-wide MLP in Slang kernels, as tiny-cuda-nn's
``mlp_learning_an_image`` sample does.

The network maps a point uv in [0, 1]^2 to the photograph's colour there. uv is encoded in plain JAX
as NeRF and tiny-cuda-nn's Frequency encoding do: sin and cos of 2^k pi u and 2^k pi v for k below
--frequencies (4 x --frequencies inputs: 40 by default, the finest wave two pixels long at 512
pixels a side), followed by --hidden-layers LeakyReLU layers of 64 and an affine RGB output. Each
step draws --batch points uniformly, samples the photograph there bilinearly (the target) and takes
one optax Adam step on the mean squared error; the whole loop runs in jitted lax.scan chunks. slax
trains through the fused ``slax.nn.mlp_loss_and_grad``; beside it the same network in plain JAX
(``jax.value_and_grad`` of ``slax.nn.mlp_loss_reference``) trains from the same initialisation on
the same points.

The photograph is texture.py's: the central 512x512 crop of Grace Hopper's portrait from
matplotlib's sample data, averaged over blocks down to --size.

--dtype float32 (the default, on every route, so that runs compare across machines, and the
precision in which slax's and plain JAX's fits agree to rounding) or float16 (tiny-cuda-nn's: half
parameters and activations, float32 sums, float32 master parameters for Adam).

    python experiments/image.py --steps 2000 --batch 65536 --dtype float16

Writes metrics.json (per model the reconstruction's MSE against the photograph and its PSNR, over
every pixel centre), loss.png and image.png (the photograph, both fits and slax's error) to --out.
With --target-psnr, exits 1 if slax's reconstruction ends below it.

The defaults depend on where JAX runs (``--help`` gives both): on a CPU 500 steps of 4096 points
on a 256x256 photograph (about 23 dB: the portrait recognisable, blurred), on a GPU 1000 steps of
16384 points on the 512x512 one. Run time of the defaults: about 2 minutes on a 2-core CPU
(SlangPy's CPU device, kernels compiled afresh; timed while other work shared the machine), 70 s of
it slax's steps (7 a second there). On a GPU: not timed at these defaults (an H100 trained 2000
float16 steps of 65536 points in about a second: BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import sys

import _harness as harness

WIDTH = 64
"""The hidden layers' width: tiny-cuda-nn's image sample's."""


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=harness.HelpFormatter,
        epilog=harness.exit_status_help("slax's reconstruction ends below --target-psnr"),
    )
    harness.add_common_arguments(
        parser,
        steps=harness.DeviceDefault(cpu=500, gpu=1000),
        batch=harness.DeviceDefault(cpu=4096, gpu=16384),
        chunk=100,
    )
    parser.add_argument(
        "--size",
        type=harness.positive_int,
        default=harness.DeviceDefault(cpu=256, gpu=512),
        help="image side, a divisor of 512 (default %(default)s)",
    )
    parser.add_argument(
        "--frequencies",
        type=harness.positive_int,
        default=10,
        help="octaves of the encoding: 4 x this many inputs",
    )
    parser.add_argument(
        "--hidden-layers", type=harness.positive_int, default=4, help=f"hidden layers of {WIDTH}"
    )
    parser.add_argument(
        "--lr", type=harness.positive_float, default=1e-2, help="Adam learning rate, cosine-decayed"
    )
    parser.add_argument(
        "--target-psnr",
        type=harness.finite_float,
        default=None,
        help="exit 1 if slax's reconstruction ends below this PSNR in dB (default: not checked)",
    )
    args = parser.parse_args(argv)
    if isinstance(args.size, int) and 512 % args.size:  # given; both defaults divide it
        parser.error(f"--size must divide 512 (the photograph's crop); got {args.size}.")
    return args


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "image")

# After the flags: JAX and slax take seconds to import.
import _plots as plots
import jax
import jax.numpy as jnp
import numpy as np
import optax
import texture
from _training import cast, fit, result_line

from slax import nn


def encode(uv: jax.Array, frequencies: int) -> jax.Array:
    """``uv (..., 2)`` -> ``(..., 4 * frequencies)``: sin(2^k pi uv) then cos(2^k pi uv) for
    k < ``frequencies``, each of u and v (NeRF's positional encoding, without uv itself)."""
    angles = uv[..., None] * (jnp.pi * 2.0 ** jnp.arange(frequencies, dtype=uv.dtype))
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*uv.shape[:-1], -1)


def sizes(args: argparse.Namespace) -> tuple[int, ...]:
    return (4 * args.frequencies, *[WIDTH] * args.hidden_layers, 3)


def loss_and_grad_fns(frequencies: int, dtype: str):
    """Both models' ``(params, uv, target) -> (loss, float32 grads)``, the parameters float32 masters
    cast to ``dtype`` for the network, the encoding computed in float32."""
    kernel_dtype = jnp.dtype(dtype)

    def slax_fn(params, uv, target):
        return nn.mlp_loss_and_grad(*cast((params, encode(uv, frequencies), target), kernel_dtype))

    def jax_loss(params, uv, target):
        return nn.mlp_loss_reference(*cast((params, encode(uv, frequencies), target), kernel_dtype))

    return {"slax": slax_fn, "jax": jax.value_and_grad(jax_loss)}


def model(name: str):
    return nn.mlp_apply if name == "slax" else nn.mlp_apply_reference


def reconstruct(name: str, params, frequencies: int, dtype: str, size: int) -> np.ndarray:
    """The network's image (size, size, 3): its colour at every pixel centre (the points the
    photograph's texels sit at, as texture.py samples them)."""
    centres = (jnp.arange(size, dtype=jnp.float32) + 0.5) / size
    v, u = jnp.meshgrid(centres, centres, indexing="ij")
    features = encode(jnp.stack([u, v], axis=-1).reshape(-1, 2), frequencies)
    colours = model(name)(*cast((params, features), jnp.dtype(dtype)))
    return np.asarray(colours.astype(jnp.float32)).reshape(size, size, 3)


def grad_disagreement(fns, params, draw_batch, key) -> dict[str, float]:
    """How far slax's gradient at the initial parameters is from plain JAX's on one batch: the
    largest absolute difference, and that relative to JAX's largest gradient entry."""
    batch = draw_batch(key)
    _, g_slax = jax.jit(fns["slax"])(params, *batch)
    _, g_jax = jax.jit(fns["jax"])(params, *batch)
    pairs = zip(jax.tree.leaves(g_slax), jax.tree.leaves(g_jax))
    worst = max(float(jnp.max(jnp.abs(a - b))) for a, b in pairs)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(g_jax))
    return {"max_abs_difference": worst, "max_difference_relative_to_largest": worst / scale}


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    out, device = harness.prepare_run("image", args)
    print(
        "image: comparing the step-0 gradients of slax and plain JAX (slax compiles its kernels on a "
        "first run) ...",
        flush=True,
    )

    photograph = jnp.asarray(texture.load_photograph(args.size))
    init_key, data_key, grad_key = jax.random.split(jax.random.key(args.seed), 3)
    params = nn.mlp_init(init_key, sizes(args), jnp.float32)
    optimizer = optax.adam(optax.cosine_decay_schedule(args.lr, args.steps, alpha=0.01))
    draw_batch = texture.batch_drawer(texture.bilinear_reference, photograph, args.batch)
    fns = loss_and_grad_fns(args.frequencies, args.dtype)
    disagreement = grad_disagreement(fns, params, draw_batch, grad_key)
    print(
        f"step-0 gradient disagreement slax vs jax: max abs {disagreement['max_abs_difference']:.3g}, "
        f"relative {disagreement['max_difference_relative_to_largest']:.3g}"
    )

    results, curves, fitted = {}, {}, {}
    for name, fn in fns.items():
        run, final = fit(name, params, fn, optimizer, draw_batch, data_key, args, out)
        curves[name] = run.losses
        fitted[name] = reconstruct(name, final, args.frequencies, args.dtype, args.size)
        mse = float(np.mean((fitted[name] - np.asarray(photograph)) ** 2))
        results[name] = run.results(args.batch, {"image_mse": mse, "image_psnr_db": texture.psnr(mse)})
        print(result_line(name, f"image PSNR {texture.psnr(mse):.2f} dB (MSE {mse:.3e})", results[name], 1))

    metrics = {
        "config": harness.run_config(args),
        "device": device,
        "sizes": sizes(args),
        "step0_gradient_slax_vs_jax": disagreement,
        "slax_image_vs_jax_image_max_abs": float(np.max(np.abs(fitted["slax"] - fitted["jax"]))),
        **results,
    }
    harness.write_metrics(out, metrics)
    plots.plot_training(
        "image",
        out,
        args,
        device,
        curves,
        "training loss (squared error)",
        {
            "image.png": lambda title: plots.plot_image_fits(
                out / "image.png", np.asarray(photograph), fitted, "fit", title
            )
        },
    )
    harness.report_outputs(out)
    met = harness.met_target(
        "slax image PSNR (dB)", results["slax"]["image_psnr_db"], args.target_psnr, at_least=True
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
