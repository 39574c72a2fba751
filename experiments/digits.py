"""Classify scikit-learn's handwritten digits (8x8, 1797 images) with a Slang MLP.

64 -> 128 -> 64 -> 10 (LeakyReLU hidden layers in Slang kernels via slax.nn.mlp_apply), softmax
cross-entropy and optax AdamW in JAX, minibatches sampled inside jitted lax.scan chunks; the same
network in plain JAX trains side by side from the same initialisation. Stratified 80/20 split.

    python experiments/digits.py --steps 2000 --batch 128

Writes metrics.json, loss.png, accuracy.png and confusion.png to --out. With --target-accuracy,
exits 1 if slax's test accuracy ends below it (the default run reaches ~0.97).

Run time of the defaults: about 40 s on a 2-core CPU (SlangPy's CPU device, kernels compiled
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
        epilog=harness.exit_status_help("slax's test accuracy ends below --target-accuracy"),
    )
    harness.add_common_arguments(parser, steps=2000, batch=128, chunk=100)
    parser.add_argument(
        "--lr", type=harness.positive_float, default=3e-3, help="AdamW learning rate, cosine-decayed"
    )
    parser.add_argument(
        "--weight-decay", type=harness.non_negative_float, default=5e-2, help="AdamW weight decay"
    )
    parser.add_argument(
        "--target-accuracy",
        type=harness.finite_float,
        default=None,
        help="exit 1 if slax's test accuracy ends below this (default: not checked)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "digits")

# After the flags: JAX and slax take seconds to import.
import _plots as plots
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _training import cast, fit, result_line

from slax import nn

SIZES = (64, 128, 64, 10)


def load_split(seed: int):
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as error:
        raise SystemExit(
            f"digits: the data set comes with scikit-learn, which is not installed ({harness.EXTRAS_HINT})."
        ) from error

    digits = load_digits()
    images = (digits.data / 16.0).astype(np.float32)
    return train_test_split(
        images, digits.target.astype(np.int32), test_size=0.2, stratify=digits.target, random_state=seed
    )


def make_model(name: str, dtype):
    apply = nn.mlp_apply if name == "slax" else nn.mlp_apply_reference

    def logits(params, x):
        return apply(*cast((params, x), dtype)).astype(jnp.float32)

    def loss(params, x, labels):
        return optax.softmax_cross_entropy_with_integer_labels(logits(params, x), labels).mean()

    return logits, jax.value_and_grad(loss)


def plot_accuracy(out, curves, title):
    fig, ax = plots.pyplot().subplots(figsize=(8, 4.2))
    markers = {"slax": {"marker": "o", "markersize": 6}, "jax": {"marker": "x", "markersize": 5}}
    for name, points in curves.items():
        steps, values = zip(*points)
        ax.plot(steps, values, label=name, **plots.MODEL_STYLES[name], **markers[name])
    ax.set_xlabel("step")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.8, 1.0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    plots.save(fig, out / "accuracy.png", dpi=120)


def plot_confusion(out, matrices, title):
    """Each model's confusion matrix on the test set, titled with its accuracy."""
    fig, axes = plots.pyplot().subplots(1, len(matrices), figsize=(5.5 * len(matrices), 5))
    for ax, (name, matrix) in zip(np.atleast_1d(axes), matrices.items()):
        ax.imshow(matrix, cmap="Blues")
        for (i, j), count in np.ndenumerate(matrix):
            if count:
                ax.text(
                    j,
                    i,
                    str(count),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if count > matrix.max() / 2 else "black",
                )
        ax.set_xticks(range(10))
        ax.set_yticks(range(10))
        ax.set_xlabel("predicted digit")
        ax.set_ylabel("true digit")
        correct, total = int(np.trace(matrix)), int(matrix.sum())
        ax.set_title(f"{name}: test accuracy {correct / total:.1%} ({correct} of {total})", fontsize=11)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    plots.save(fig, out / "confusion.png", dpi=110)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    out, device = harness.prepare_run("digits", args)
    dtype = jnp.dtype(args.dtype)

    print("digits: loading scikit-learn's digits data set ...", flush=True)
    x_train, x_test, y_train, y_test = (jnp.asarray(a) for a in load_split(args.seed))
    init_key, data_key = jax.random.split(jax.random.key(args.seed))
    params = nn.mlp_init(init_key, SIZES, jnp.float32)
    schedule = optax.cosine_decay_schedule(args.lr, args.steps, alpha=0.05)
    optimizer = optax.adamw(schedule, weight_decay=args.weight_decay)

    def draw_batch(key):
        index = jax.random.randint(key, (args.batch,), 0, x_train.shape[0])
        return x_train[index], y_train[index]

    results, losses, accuracy_curves, confusion = {}, {}, {}, {}
    for name in ("slax", "jax"):
        logits, loss_and_grad = make_model(name, dtype)
        predict = jax.jit(lambda params, logits=logits: jnp.argmax(logits(params, x_test), axis=-1))

        def accuracy(params, predict=predict):
            return float(jnp.mean(predict(params) == y_test))

        run, final = fit(
            name, params, loss_and_grad, optimizer, draw_batch, data_key, args, out, evaluate=accuracy
        )
        losses[name], accuracy_curves[name] = run.losses, run.evaluations
        predicted = np.asarray(predict(final))
        confusion[name] = np.zeros((10, 10), int)
        np.add.at(confusion[name], (np.asarray(y_test), predicted), 1)
        results[name] = run.results(
            args.batch, {"test_accuracy": float(np.mean(predicted == np.asarray(y_test)))}
        )
        print(result_line(name, f"test accuracy {results[name]['test_accuracy']:.4f}", results[name]))

    harness.write_metrics(
        out,
        {
            "config": harness.run_config(args),
            "device": device,
            "train_size": int(x_train.shape[0]),
            "test_size": int(x_test.shape[0]),
            **results,
        },
    )
    plots.plot_training(
        "digits",
        out,
        args,
        device,
        losses,
        "training loss (cross-entropy)",
        {
            "accuracy.png": lambda title: plot_accuracy(out, accuracy_curves, title),
            "confusion.png": lambda title: plot_confusion(out, confusion, title),
        },
    )
    harness.report_outputs(out)
    accuracy = results["slax"]["test_accuracy"]
    met = harness.met_target("slax test accuracy", accuracy, args.target_accuracy, at_least=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
