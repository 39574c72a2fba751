"""Fit sdf.py's torus signed distance field with instant-NGP's multiresolution hash encoding and a
32-64-64-1 ReLU MLP, under the eikonal loss: its gradient runs through the MLP and the encoding.

The model maps a point p in [-1, 1]^3 to a distance: ``slax.nn.hash_encode`` of (p + 1) / 2 (the
encoding's [0, 1]^3; --levels levels of 2 features, 2^--log2-table-size entries a level,
resolutions from 16 to --finest-resolution cells a side), then ``slax.nn.mlp_apply`` (two hidden
ReLU layers of 64, one affine output). Each step samples fresh points uniform in the cube (sdf.py's
``sample``) and takes one optax Adam step, on the tables and the MLP together, on sdf.py's loss

    mean((f(p) - sdf(p))^2) + 0.1 * mean((|grad_p f(p)| - 1)^2),

whose parameter gradient differentiates the model's gradient in p: second derivatives of the MLP
and of the encoding, in the tables and the points. slax's model takes the field and that gradient
from ``slax.nn.hash_field_with_gradient``: the encoding's Jacobian in p times the MLP's input
gradient, so that the gradient in the tables is one scatter. The loop runs in jitted lax.scan chunks. Beside
it the same model in plain JAX (``slax.nn.hash_encode_reference``, ``mlp_apply_reference``, the
gradient in p by ``jax.vjp``) trains from the same initialisation on the same points.

--dtype float16 runs both MLPs in half precision with the tables float32, as ngp_image.py does
(experiments/_ngp.py says why); the losses are float32's. The defaults (4 levels from 16 to 32
cells a side in 2^16 entries each: every level dense) suit the CPU routes. Small tables that hash
the coarse levels stall this loss (held-out error near 2e-2 however long it trains, against 2e-4
dense): colliding vertices make the gradient in p noisy, and the eikonal term then outweighs the
distance error. The issue's size on a GPU (16 levels, 16 to 2048 cells a side, 2^19 entries each):

    python experiments/ngp_sdf.py --levels 16 --batch 262144 --log2-table-size 19 \\
        --finest-resolution 2048 --dtype float16

Writes metrics.json (per model the held-out squared distance error, its mean near the surface and
the eikonal residual; the step-0 gradient disagreement of slax and plain JAX; the encoding and each
part's dtype), loss.png and slice.png (both fields and the true one on the plane y = 0) to --out.
With --target-mse, exits 1 if slax's held-out squared distance error ends above it.

Run time of the defaults: about 1.5 minutes on a 2-core CPU (SlangPy's CPU device, kernels compiled
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
        epilog=harness.exit_status_help("slax's held-out squared distance error ends above --target-mse"),
    )
    harness.add_common_arguments(parser, steps=300, batch=1024, chunk=100)
    harness.add_hash_encoding_arguments(parser, default_levels=4, default_log2_table_size=16, default_lr=1e-2)
    parser.add_argument(
        "--finest-resolution",
        type=harness.positive_int,
        default=32,
        help="the finest level's cells a side, at least 16 (the paper's 2048 at full size)",
    )
    parser.add_argument(
        "--target-mse",
        type=harness.finite_float,
        default=None,
        help="exit 1 if slax's held-out squared distance error ends above this (default: not checked)",
    )
    args = parser.parse_args(argv)
    if args.finest_resolution < 16:
        parser.error(
            f"--finest-resolution must be at least 16 (the coarsest level's); got {args.finest_resolution}."
        )
    return args


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "ngp_sdf")

# After the flags: JAX and slax take seconds to import.
import _ngp as ngp
import _plots as plots
import jax
import jax.numpy as jnp
import sdf
from _training import fit, gradient_disagreement, result_line

from slax import nn


def field(name: str, config: nn.HashEncodingConfig, dtype) -> sdf.Field:
    """The hash-encoded model of ``name`` (:func:`_ngp.model`) as sdf.py's field over [-1, 1]^3."""
    predict = ngp.model(name, config, dtype)
    return lambda params, points: predict(params, (points + 1.0) / 2.0)


def field_with_gradient(name: str, config: nn.HashEncodingConfig, dtype) -> sdf.FieldWithGradient:
    """:func:`field` and its gradient in the points, which the eikonal loss holds. Plain JAX's is
    ``jax.vjp`` of the field (``sdf.with_gradient``). slax's is ``nn.hash_field_with_gradient``:
    the encoding and its Jacobian in the point read together, the gradient the Jacobian times the
    MLP's input gradient, and the loss's gradient in the tables one scatter (times 1/2: the
    encoding's [0, 1]^3 is half as wide as the cube)."""
    if name != "slax":
        return sdf.with_gradient(field(name, config, dtype))
    network = ngp.network(name, dtype)

    def both(params, points):
        x = (points + 1.0) / 2.0
        values, gradient = nn.hash_field_with_gradient(
            network, params["mlp"], params["tables"], x, config, dtype
        )
        return values, 0.5 * gradient

    return both


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    out, device = harness.prepare_run("ngp_sdf", args)
    print(
        "ngp_sdf: comparing the step-0 gradients of slax and plain JAX (slax compiles its kernels "
        "on a first run) ...",
        flush=True,
    )
    config = ngp.encoding_config(args.levels, args.log2_table_size, 3, args.finest_resolution)
    init_key, data_key, test_key, grad_key = jax.random.split(jax.random.key(args.seed), 4)
    params = ngp.init_params(init_key, config, outputs=1)
    optimizer = ngp.optimizer(args.lr, args.steps)
    fields = {name: field(name, config, jnp.dtype(args.dtype)) for name in ("slax", "jax")}
    fns = {
        name: jax.value_and_grad(sdf.sdf_loss(field_with_gradient(name, config, jnp.dtype(args.dtype))))
        for name in fields
    }
    disagreement = gradient_disagreement(fns, params, sdf.sample(grad_key, min(args.batch, 4096)))
    print(
        f"step-0 gradient disagreement slax vs jax: max abs {disagreement['max_abs_difference']:.3g}, "
        f"relative {disagreement['max_difference_relative_to_largest']:.3g}"
    )
    untrained = sdf.evaluate(fields["jax"], params, test_key)["test_mse"]

    results, curves, trained = {}, {}, {}
    for name, fn in fns.items():
        run, final = fit(
            name,
            params,
            fn,
            optimizer,
            lambda key: sdf.sample(key, args.batch),
            data_key,
            args,
            out,
            flat=ngp.kept_flat(name),
        )
        trained[name], curves[name] = (fields[name], final), run.losses
        results[name] = run.results(args.batch, sdf.evaluate(fields[name], final, test_key))
        quality = (
            f"held-out squared distance error {results[name]['test_mse']:.3e} (untrained "
            f"{untrained:.3e}), eikonal residual {results[name]['eikonal_residual']:.3f}"
        )
        print(result_line(name, quality, results[name]))

    metrics = {
        "config": harness.run_config(args),
        "device": device,
        "encoding": ngp.encoding_metrics(config, args.dtype),
        "sizes": ngp.mlp_sizes(config, 1),
        "eikonal_weight": sdf.EIKONAL_WEIGHT,
        "step0_gradient_slax_vs_jax": disagreement,
        "untrained_test_mse": untrained,
        **results,
    }
    harness.write_metrics(out, metrics)
    plots.plot_training(
        "ngp_sdf",
        out,
        args,
        device,
        curves,
        "training loss (distance + 0.1 eikonal)",
        {"slice.png": lambda title: sdf.plot_slice(out, trained, title)},
    )
    harness.report_outputs(out)
    error = results["slax"]["test_mse"]
    met = harness.met_target("slax held-out squared distance error", error, args.target_mse)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
