"""Compare every Slang function and network shipped in shaders/ with jax.grad of its JAX twin.

For the example functions (shaders/examples.slang, twins in slax/examples.py) and the tutorial
polynomial: values, reverse mode, forward mode and second order (Hessian-vector products, forward
over reverse and reverse over reverse; not for accumulate, whose inout parameter Slang cannot
differentiate twice); for the functions with tensor parameters (shaders/tensor_examples.slang):
values and reverse mode (forward mode through SlangPy's tensors is refused). For the MLP
(shaders/nn/mlp.slang): values, reverse mode, forward mode and second order of mlp_apply in its
parameters and inputs together (the Hessian-vector products an eikonal loss's gradient takes), and
the fused mlp_loss_and_grad, on samples away from LeakyReLU's kink (slax.testing.away_from_kinks).
float32 and float16. Prints one table and writes it to the run
directory (--out, default runs/gradcheck/<time>) as gradcheck.txt and gradcheck.json; exits 1 if
any check fails. --only checks some of the functions and networks (each compiles its own kernels:
seconds apiece on a CPU), on the inputs the whole run draws for them.

    python experiments/gradcheck.py [--dtype float32 float16] [--only wave mlp-4-16-4] [--seed 0] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import pathlib
import sys

import _harness as harness

FUNCTIONS = (
    "wave",
    "twist",
    "energy",
    "matvec",
    "softplus",
    "power_of",
    "to_polar",
    "accumulate",
    "polynomial",
    "bilinear",
)
"""The functions checked, in order: shaders/examples.slang's (``slax.examples.EXAMPLES``), the
tutorial's polynomial and shaders/tensor_examples.slang's (``slax.examples.TENSOR_EXAMPLES``),
named here for --only, which is parsed before slax is imported (a test pins them to slax's)."""
MLP_SIZES = ((4, 16, 4), (64, 128, 64, 10))
NETWORKS = tuple("mlp-" + "-".join(map(str, sizes)) for sizes in MLP_SIZES)
"""The MLPs checked, as --only names them (their rows' label is ``mlp 4-16-4``)."""


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=harness.HelpFormatter,
        epilog=harness.exit_status_help("any check fails"),
    )
    parser.add_argument(
        "--dtype",
        nargs="+",
        choices=("float32", "float16"),
        default=["float32", "float16"],
        help="precisions to check",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=(*FUNCTIONS, *NETWORKS),
        default=None,
        metavar="NAME",
        help="check only these functions and networks, of %(choices)s (default: every one)",
    )
    parser.add_argument("--seed", type=harness.seed, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--out", type=pathlib.Path, default=None, help="output dir (default runs/gradcheck/<time>)"
    )
    harness.add_launch_argument(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "gradcheck")

# After the flags: JAX and slax take seconds to import.
import jax
import jax.numpy as jnp
import numpy as np
from _training import cast

import slax
from slax import examples, nn
from slax.testing import RELATIVE_TOLERANCE, away_from_kinks, check_grads, compare


def polynomial_twin(a, b, c, x):
    """shaders/poly.slang's polynomial in plain JAX."""
    return a * x * x + b * x + c


def function_rows(dtype: str, rng: np.random.Generator, only: set[str]):
    """The rows of each function in ``only``. Every function's inputs are drawn, checked or not, so
    that a function checks the same inputs in a run of some as in a run of all."""
    load = functools.cache(slax.load_module)  # a module compiles once, and only if checked
    for example in examples.EXAMPLES:
        args = example.draw(rng, jnp.dtype(dtype))
        if example.name in only:
            function = getattr(load(examples.MODULE), example.name)
            order = 2 if example.second_order else 1
            yield example.name, check_grads(function, example.twin, *args, order=order).rows
    if dtype == "float32":  # polynomial is declared for float only
        args = tuple(jnp.asarray(rng.normal(size=s), jnp.float32) for s in [(), (), (), (3, 4)])
        if "polynomial" in only:
            yield "polynomial", check_grads(load("poly").polynomial, polynomial_twin, *args, order=2).rows
        for example in examples.TENSOR_EXAMPLES:  # float only; first order (tensors' limit)
            args = example.draw(rng, jnp.float32)
            if example.name in only:
                function = getattr(load(examples.TENSOR_MODULE), example.name)
                yield example.name, check_grads(function, example.twin, *args).rows


def network_rows(dtype: str, seed: int, only: set[str]):
    for sizes, name in zip(MLP_SIZES, NETWORKS):
        if name not in only:
            continue
        keys = jax.random.split(jax.random.key(seed), 3)
        params = nn.mlp_init(keys[0], sizes, dtype)
        x = jax.random.uniform(keys[1], (512, sizes[0]), minval=-1, maxval=1).astype(dtype)
        x = away_from_kinks(params, x)
        target = jax.random.uniform(keys[2], (x.shape[0], sizes[-1]), minval=-1, maxval=1).astype(dtype)
        label = "mlp " + "-".join(map(str, sizes))
        # The twin runs in float32 but stores activations as the kernels do, so LeakyReLU kinks agree.
        reference = functools.partial(nn.mlp_apply_reference, storage_dtype=dtype)
        yield label, check_grads(nn.mlp_apply, reference, params, x, order=2).rows
        loss, grads = nn.mlp_loss_and_grad(params, x, target)
        upcast = cast((params, x, target), jnp.float32)
        loss_ref, grads_ref = jax.value_and_grad(nn.mlp_loss_reference)(*upcast, storage_dtype=dtype)
        tolerance = RELATIVE_TOLERANCE[dtype]
        rows = [compare("loss", "value", loss, loss_ref, tolerance)]
        for k, (got, want) in enumerate(zip(grads, grads_ref)):
            for name in ("weight", "bias"):
                rows.append(compare("loss grad", f"layer {k} {name}", got[name], want[name], tolerance))
        yield label + " fused", rows


COLUMNS = (
    ("function", 24),
    ("dtype", 8),
    ("check", 10),
    ("argument", 18),
    ("max abs err", 11),
    ("max rel err", 11),
    ("tolerance", 9),
    ("pass", 4),
)
"""The table's columns and widths: rows are printed as their checks finish, before the widest is
known (a longer cell widens its row, not the column)."""


def table_line(cells) -> str:
    return "  ".join(str(cell).ljust(width) for cell, (_, width) in zip(cells, COLUMNS)).rstrip()


def row_line(function: str, dtype: str, row) -> str:
    return table_line(
        (
            function,
            dtype,
            row.check,
            row.argument,
            f"{row.max_abs_error:.2e}",
            f"{row.max_rel_error:.2e}",
            f"{row.tolerance:.1e}",
            "yes" if row.passed else "NO",
        )
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    harness.apply_launch(args)
    out = harness.run_directory("gradcheck", args.out)
    device = harness.run_devices()
    print(f"gradcheck: JAX on {device['jax']}, Slang kernels on {device['slang']}; writing to {out}")
    print("gradcheck: each line comes as its check finishes (slax compiles kernels on a first run)")
    text = [table_line(name for name, _ in COLUMNS), table_line("-" * width for _, width in COLUMNS)]
    print("\n".join(text), flush=True)
    table = []
    only = set(args.only or (*FUNCTIONS, *NETWORKS))
    for dtype in args.dtype:
        rng = np.random.default_rng(args.seed)
        checks = itertools.chain(function_rows(dtype, rng, only), network_rows(dtype, args.seed, only))
        for function, rows in checks:
            for row in rows:
                table.append((function, dtype, row))
                text.append(row_line(function, dtype, row))
                print(text[-1], flush=True)
    failed = sum(not r.passed for _, _, r in table)
    text.append(f"\n{len(table) - failed} passed, {failed} failed")
    print(text[-1])
    (out / "gradcheck.txt").write_text("\n".join(text) + "\n")
    rows = [{"function": f, "dtype": d, **dataclasses.asdict(r), "passed": r.passed} for f, d, r in table]
    summary = {
        "config": harness.run_config(args),
        "device": device,
        "passed": len(table) - failed,
        "failed": failed,
    }
    harness.write_json(out / "gradcheck.json", {**summary, "rows": rows})
    harness.report_outputs(out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
