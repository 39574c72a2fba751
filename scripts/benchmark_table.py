"""Prints the Markdown table BENCHMARKS.md shows for a JSON file of benchmarks/ (written by
``experiments/benchmark.py --json`` or ``experiments/bridge_check.py --json``), so that each table
there is the file's rows and nothing else.

    python scripts/benchmark_table.py benchmarks/polynomial-h200.json
"""

from __future__ import annotations

import json
import statistics
import sys


def _provenance(data: dict) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in data["versions"].items())
    return (
        f"`{data['command']}` on {data['jax_devices']} (Slang kernels: {data['slang_device']}); "
        f"{versions}; commit {data['commit'][:10]}; {data['time_utc']}"
    )


def training_table(data: dict) -> list[str]:
    """One line per (network, dtype, batch, devices): slax's models and plain JAX side by side; of a
    run with ``--rounds``, each model's median over the rounds."""
    rows = data["rows"]
    slax_models = sorted({r["model"] for r in rows if r["model"].startswith("slax")})
    head = ["network", "dtype", "batch", "devices", "plain JAX us/step (best of jax, jax/flat)"]
    head += [f"{m} us/step (x JAX)" for m in slax_models]
    harness = any(r["model"] == "harness" for r in rows)
    head += ["harness us/step"] if harness else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted(
        {(r["network"], r["dtype"], r["batch"], r["devices"] or 1) for r in rows},
        key=lambda k: (k[0], k[1] != "float32", k[3], k[2]),
    )
    for network, dtype, batch, devices in keys:
        step_us: dict[str, list[float]] = {}
        for r in rows:
            if (r["network"], r["dtype"], r["batch"], r["devices"] or 1) == (network, dtype, batch, devices):
                step_us.setdefault(r["model"], []).append(r["step_us"])
        median = {model: statistics.median(times) for model, times in step_us.items()}
        jax_us = min(median[m] for m in ("jax", "jax/flat") if m in median)
        cells = [network, dtype, f"2^{batch.bit_length() - 1}", str(devices), f"{jax_us:.1f}"]
        for model in slax_models:
            cells.append(f"{median[model]:.1f} ({jax_us / median[model]:.2f}x)" if model in median else "-")
        if harness:
            cells.append(f"{median['harness']:.1f}" if "harness" in median else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def dispatch_table(data: dict) -> list[str]:
    """One line per (route, elements): a kernel's cost in a jitted loop against XLA's own op."""
    lines = [
        "| route | elements | slax, fresh result (us) | slax, in place (us) | XLA op (us) | in place / XLA |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['route']} | {r['elements']} | {r['slax_us']:.1f} | {r['slax_in_place_us']:.1f} | "
            f"{r['xla_us']:.1f} | {r['slax_in_place_us'] / r['xla_us']:.2f}x |"
        )
    identical = sum(p["identical"] for p in data.get("parity", []))
    if data.get("parity"):
        lines.append("")
        lines.append(
            f"PTX route against SlangPy route, bitwise: {identical} of {len(data['parity'])} cases identical."
        )
    return lines


def main(path: str) -> None:
    data = json.loads(open(path).read())
    table = dispatch_table(data) if "parity" in data else training_table(data)
    print("\n".join([*table, "", f"From `{path}`: {_provenance(data)}."]))


if __name__ == "__main__":
    main(sys.argv[1])
