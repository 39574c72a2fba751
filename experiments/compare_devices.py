"""Data-parallel runs against one device: the same result.

Reads the metrics.json of experiment runs (``polynomial.py`` or ``digits.py``) that differ only in
``--devices``, groups them by everything else (batch, dtype, launch route, ...) and prints, per
group and model, each device count's result (held-out MSE or test accuracy) and its relative
difference from the one-device run. Exits 1 if one of slax's multi-device results differs by more
than --tolerance (plain JAX's are shown beside them).

Speed is not compared here: a short run's samples/s include each program's first execution (on
several GPUs, setting up NCCL), so ``benchmark.py --devices 1 2`` times the steps instead.

    python experiments/compare_devices.py runs/polynomial-*gpu-* --tolerance 1e-4
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import _harness as harness

RESULTS = ("test_mse", "test_accuracy")
"""The result each experiment writes per model (the first one a run has is compared)."""
IGNORED = {"devices", "out", "resume", "checkpoint_every", "target_mse", "target_accuracy"}
"""Flags that do not change what a run computes."""


def load(run: pathlib.Path) -> dict:
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["run"] = str(run)
    return metrics


def group_key(metrics: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in metrics["config"].items() if k not in IGNORED))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=harness.HelpFormatter,
        epilog=harness.exit_status_help(
            "a multi-device result differs from one device's by more than --tolerance"
        ),
    )
    parser.add_argument("runs", nargs="+", type=pathlib.Path, help="run directories holding metrics.json")
    parser.add_argument(
        "--tolerance",
        type=harness.non_negative_float,
        default=1e-4,
        help="relative result difference allowed (default %(default)s)",
    )
    parser.add_argument("--json", default=None, help="also write the rows here (default: not written)")
    args = parser.parse_args(argv)
    groups: dict[tuple, list[dict]] = {}
    for run in args.runs:
        metrics = load(run)
        groups.setdefault(group_key(metrics), []).append(metrics)
    rows, failures = [], []
    header = f"{'run':<44} {'model':<5} {'devices':>7} {'result':>12} {'rel diff':>9}"
    print(header)
    print("-" * len(header))
    for group in groups.values():
        group.sort(key=lambda m: m["config"]["devices"] or 1)
        one = group[0]
        if (one["config"]["devices"] or 1) != 1:
            failures.append(f"{one['run']}: no one-device run to compare with")
            continue
        for metrics in group:
            for model in ("slax", "jax"):
                name = next(r for r in RESULTS if r in metrics[model])
                result, reference = metrics[model][name], one[model][name]
                difference = abs(result - reference) / abs(reference)
                devices = metrics["config"]["devices"] or 1
                row = {
                    "run": metrics["run"],
                    "model": model,
                    "devices": devices,
                    name: result,
                    "relative_difference": difference,
                }
                rows.append(row)
                print(
                    f"{pathlib.Path(metrics['run']).name:<44} {model:<5} {devices:>7} {result:>12.6g} "
                    f"{difference:>9.2g}"
                )
                if model == "slax" and devices > 1 and difference > args.tolerance:
                    failures.append(f"{metrics['run']}: {name} differs by {difference:.3g} (relative)")
    if args.json:
        harness.write_json(args.json, {"rows": rows, "failures": failures})
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
