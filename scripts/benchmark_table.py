"""Prints the Markdown table BENCHMARKS.md shows for a JSON file of benchmarks/ (written by
``experiments/benchmark.py --json`` or ``experiments/bridge_check.py --json``), so that each table
there is the file's rows and nothing else. The wide family's rows (``--network wide``) come as a
table per width and dtype, in samples/s.

    python scripts/benchmark_table.py benchmarks/polynomial-h200.json
    python scripts/benchmark_table.py benchmarks/wide-float16-2.json benchmarks/wide-float16-8.json
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


def _median_steps(rows: list[dict], key) -> dict[tuple, dict[str, float]]:
    """``key(row)`` -> model -> the median of that model's step times (us) over the rounds."""
    step_us: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        step_us.setdefault(key(r), {}).setdefault(r["model"], []).append(r["step_us"])
    return {k: {m: statistics.median(t) for m, t in models.items()} for k, models in step_us.items()}


def _plain_jax(median: dict[str, float]) -> float:
    """Plain JAX's step (us): the faster of its per-layer and flat-parameter forms, as the ratios."""
    return min(median[m] for m in ("jax", "jax/flat") if m in median)


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
    medians = _median_steps(rows, lambda r: (r["network"], r["dtype"], r["batch"], r["devices"] or 1))
    for network, dtype, batch, devices in keys:
        median = medians[network, dtype, batch, devices]
        jax_us = _plain_jax(median)
        cells = [network, dtype, f"2^{batch.bit_length() - 1}", str(devices), f"{jax_us:.1f}"]
        for model in slax_models:
            cells.append(f"{median[model]:.1f} ({jax_us / median[model]:.2f}x)" if model in median else "-")
        if harness:
            cells.append(f"{median['harness']:.1f}" if "harness" in median else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _millions_per_second(batch: int, step_us: float) -> str:
    """Samples a step over microseconds a step: millions of samples a second."""
    return f"{batch / step_us:.3g}" if step_us else "-"


def wide_tables(data: dict) -> list[str]:
    """The wide family's rows as a table per (width, dtype), float16 first: one line per
    (architecture, batch, devices), millions of samples/s of plain JAX (the faster of jax and
    jax/flat), of plain JAX in full float32 and of each slax model with its ratio to plain JAX;
    of a run with ``--rounds``, each model's median over the rounds."""
    rows = [r for r in data["rows"] if "width" in r]
    slax_models = sorted({r["model"] for r in rows if r["model"].startswith("slax")})
    head = ["architecture", "batch", "devices", "plain JAX M samples/s", "jax-f32 M samples/s"]
    head += [f"{m} M samples/s (x JAX)" for m in slax_models]
    medians = _median_steps(
        rows,
        lambda r: (
            r["width"],
            r["dtype"],
            r["hidden_layers"],
            tuple(r["sizes"]),
            r["batch"],
            r["devices"] or 1,
        ),
    )
    lines: list[str] = []
    for width, dtype in sorted({k[:2] for k in medians}, key=lambda k: (k[0], k[1] != "float16")):
        lines += [f"**Width {width}, {dtype}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for key in sorted(k for k in medians if k[:2] == (width, dtype)):
            *_, sizes, batch, devices = key
            median = medians[key]
            jax_us = _plain_jax(median)
            cells = ["-".join(map(str, sizes)), f"2^{batch.bit_length() - 1}", str(devices)]
            cells.append(_millions_per_second(batch, jax_us))
            cells.append(_millions_per_second(batch, median["jax-f32"]) if "jax-f32" in median else "-")
            for model in slax_models:
                rate = _millions_per_second(batch, median.get(model, 0.0))
                cells.append(f"{rate} ({jax_us / median[model]:.2f}x)" if model in median else "-")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines[:-1]


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


def main(paths: list[str]) -> None:
    """The tables of the rows of every file of ``paths`` together (the wide family's grid may be
    timed in several runs), then where each file came from."""
    files = {path: json.loads(open(path).read()) for path in paths}
    data = {"rows": [row for each in files.values() for row in each["rows"]]}
    if any("parity" in each for each in files.values()):
        tables = [dispatch_table({**data, "parity": [p for each in files.values() for p in each["parity"]]})]
    else:
        named = {"rows": [r for r in data["rows"] if "width" not in r]}
        tables = [training_table(named)] if named["rows"] else []
        tables += [wide_tables(data)] if len(named["rows"]) < len(data["rows"]) else []
    lines = [line for table in tables for line in [*table, ""]]
    sources = [f"From `{path}`: {_provenance(each)}." for path, each in files.items()]
    print("\n".join([*lines, *sources]))


if __name__ == "__main__":
    main(sys.argv[1:])
