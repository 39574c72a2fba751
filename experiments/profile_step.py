"""Where a training step's time goes on a CUDA GPU: each kernel's share, from JAX's profiler.

For each configuration (network, dtype, batch, model: slax on a launch route, or plain JAX), times
benchmark.py's training step (a jitted lax.scan of --steps steps; median of --repeats calls), then
traces one more call with ``jax.profiler`` (CUPTI sees every kernel on the GPU: XLA's, the PTX
route's and SlangPy's alike) and prints each kernel's launches and microseconds per step, and their
sum against the wall time per step: the difference is time the GPU waits between kernels (launch
latency, the loop's host round trips, Python callbacks).

    python experiments/profile_step.py --batch 4096 1048576 --launch ptx --json runs/profile.json

(Nsight Compute, which would add hardware counters, crashed the JAX process on the H100 image.)
"""

from __future__ import annotations

import argparse
import collections
import glob
import sys
import tempfile

import _harness as harness
import jax
from benchmark import NETWORKS, steps_per_second, training_run
from jax.profiler import ProfileData

import slax


def kernel_times(config: dict) -> tuple[dict[str, list[float]], float]:
    """(kernel name -> [launches per step, GPU microseconds per step], GPU busy span per step in
    microseconds: first kernel start to last kernel end) over one traced call of ``config``."""
    run, state = training_run(config["network"], config["model"], config["dtype"], config["batch"])
    keys = jax.random.split(jax.random.key(1), config["steps"])
    jax.block_until_ready(run(state, keys))
    with tempfile.TemporaryDirectory() as scratch:
        jax.profiler.start_trace(scratch)
        jax.block_until_ready(run(state, keys))
        jax.profiler.stop_trace()
        (trace,) = glob.glob(f"{scratch}/**/*.xplane.pb", recursive=True)
        data = ProfileData.from_file(trace)
    steps = config["steps"]
    times: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    starts, ends = [], []
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue
            for event in line.events:
                entry = times[event.name]
                entry[0] += 1 / steps
                entry[1] += event.duration_ns / 1e3 / steps
                starts.append(event.start_ns)
                ends.append(event.end_ns)
    if not times:
        lines = [f"{plane.name}: {[line.name for line in plane.lines]}" for plane in data.planes]
        raise SystemExit("profile_step: the trace holds no GPU kernels; its planes:\n" + "\n".join(lines))
    return dict(times), (max(ends) - min(starts)) / 1e3 / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=harness.HelpFormatter, epilog=harness.exit_status_help(None)
    )
    parser.add_argument(
        "--network", nargs="+", choices=tuple(NETWORKS), default=["polynomial"], help="networks"
    )
    parser.add_argument("--batch", nargs="+", type=int, default=[4096, 1048576], help="batch sizes")
    parser.add_argument(
        "--dtype", nargs="+", choices=("float32", "float16"), default=["float32"], help="dtypes"
    )
    parser.add_argument(
        "--model", nargs="+", choices=("slax", "jax"), default=["slax", "jax"], help="slax or plain JAX"
    )
    parser.add_argument(
        "--launch", nargs="+", choices=slax.config.CUDA_LAUNCHES, default=["ptx"], help="routes for slax"
    )
    parser.add_argument("--steps", type=int, default=20, help="steps per scan (per profiled call)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls for the wall time (median)")
    parser.add_argument("--json", default=None, help="also write the tables here (default: not written)")
    args = parser.parse_args(argv)
    if not harness.on_cuda():
        raise SystemExit("profile_step: needs JAX on a CUDA GPU")
    print(harness.describe_platform())
    results = []
    for network in args.network:
        for dtype in args.dtype:
            for batch in args.batch:
                for model in args.model:
                    for launch in args.launch if model == "slax" else [None]:
                        config = dict(network=network, dtype=dtype, batch=batch, model=model, launch=launch)
                        config["steps"] = args.steps
                        with slax.config.override(cuda_launch=launch or slax.config.cuda_launch):
                            rate = steps_per_second(network, model, dtype, batch, args.steps, args.repeats)
                            kernels, span = kernel_times(config)
                        gpu_us = sum(us for _, us in kernels.values())
                        name = f"slax/{launch}" if launch else model
                        print(
                            f"\n{network} {dtype} batch {batch} {name}: {1e6 / rate:.1f} us/step wall, "
                            f"{span:.1f} from first kernel start to last end, {gpu_us:.1f} in kernels"
                        )
                        print(f"  {'launches':>8} {'us/step':>9}  kernel")
                        for kernel, (launches, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
                            print(f"  {launches:>8.2f} {us:>9.2f}  {kernel[:100]}")
                        results.append(
                            {
                                **config,
                                "wall_us": 1e6 / rate,
                                "span_us": span,
                                "kernel_us": gpu_us,
                                "kernels": kernels,
                            }
                        )
    if args.json:
        harness.write_json(args.json, {"platform": harness.describe_platform(), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
