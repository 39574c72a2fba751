"""Where a training step's time goes on a CUDA GPU: each kernel's share, from JAX's profiler.

For each configuration (network, dtype, batch, model: slax on a launch route, or plain JAX), times
benchmark.py's training step (a jitted lax.scan of --steps steps; median of --repeats calls), then
traces one more call with ``jax.profiler`` (CUPTI sees every kernel on the GPU: XLA's, the PTX
route's and SlangPy's alike) and prints each kernel's launches and microseconds per step, and their
sum against the wall time per step: the difference is time the GPU waits between kernels (launch
latency, the loop's host round trips, Python callbacks).

    python experiments/profile_step.py --batch 4096 1048576 --launch ptx --json runs/profile.json
    python experiments/profile_step.py --network wide --width 64 --hidden-layers 4 --dtype float16 \
        --batch 262144 --json runs/profile-wide.json

``--network ngp_image ngp_sdf`` profiles instant-NGP's hash-encoded steps as benchmark.py times
them (ngp_image.py's and ngp_sdf.py's model, loss and Adam; by default the issue's 16 levels of
2^19 entries, resolutions 16 to 2048):

    python experiments/profile_step.py --network ngp_image ngp_sdf --batch 262144 --dtype float16 \
        --launch ptx --json runs/profile-ngp.json

Each table lists the kernels by their time, longest first, with each one's share of the step's
kernel time and the running total of those shares: the few kernels that make most of the step.

With ``--devices N`` the batch is split over N GPUs: each kernel is listed per GPU, with the streams
each GPU's kernels ran on (each GPU running its own shard, on its own stream).

For hardware counters, run Nsight Compute on the script with ``SLAX_REFLECTION_DEVICE=cpu``
(docs/debugging.md: ncu crashes in SlangPy's CUDA device; benchmarks/encoding-ncu-h200.json was
taken that way).
"""

from __future__ import annotations

import argparse
import collections
import glob
import sys
import tempfile

import _harness as harness


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=harness.HelpFormatter, epilog=harness.exit_status_help(None)
    )
    parser.add_argument(
        "--network",
        nargs="+",
        choices=harness.WORKLOADS,
        default=["polynomial"],
        help="networks (wide: the architectures --width and --hidden-layers name, as in benchmark.py; "
        "texture: the texture fit; ngp_image, ngp_sdf: the hash-encoded steps of --levels and "
        "--log2-table-size)",
    )
    harness.add_wide_arguments(parser)
    harness.add_ngp_workload_arguments(parser)
    parser.add_argument(
        "--batch", nargs="+", type=harness.positive_int, default=[4096, 1048576], help="batch sizes"
    )
    parser.add_argument(
        "--dtype", nargs="+", choices=("float32", "float16"), default=["float32"], help="dtypes"
    )
    parser.add_argument(
        "--model", nargs="+", choices=("slax", "jax"), default=["slax", "jax"], help="slax or plain JAX"
    )
    parser.add_argument(
        "--launch", nargs="+", choices=harness.CUDA_LAUNCHES, default=["ptx"], help="routes for slax"
    )
    parser.add_argument(
        "--devices",
        type=harness.positive_int,
        default=None,
        help="split each batch over a mesh of this many GPUs (benchmark.py --devices); the tables "
        "then name each kernel's GPU, and list the streams each GPU's kernels ran on (default: no mesh)",
    )
    parser.add_argument(
        "--steps", type=harness.positive_int, default=20, help="steps per scan (per profiled call)"
    )
    parser.add_argument(
        "--repeats", type=harness.positive_int, default=5, help="timed calls for the wall time (median)"
    )
    parser.add_argument("--json", default=None, help="also write the tables here (default: not written)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    harness.parse_first(parse_arguments, "profile_step")

# After the flags: JAX and slax take seconds to import.
import jax
from benchmark import step_keys, steps_per_second, training_run
from jax.profiler import ProfileData

import slax


def kernel_times(
    config: dict,
) -> tuple[dict[str, list[float]], float, dict[str, list[str]], dict[str, float]]:
    """(kernel name -> [launches per step, GPU microseconds per step], GPU busy span per step in
    microseconds: first kernel start to last kernel end, GPU -> the streams its kernels ran on,
    kernel name -> microseconds per step its GPU sat idle before it started) over one traced call of
    ``config``. Over several GPUs, each kernel name starts with its GPU's."""
    run, state = training_run(
        config["network"], config["model"], config["dtype"], config["batch"], config["devices"]
    )
    keys = step_keys(config["steps"], config["devices"])
    jax.block_until_ready(run(state, keys))
    with tempfile.TemporaryDirectory() as scratch:
        jax.profiler.start_trace(scratch)
        jax.block_until_ready(run(state, keys))
        jax.profiler.stop_trace()
        (trace,) = glob.glob(f"{scratch}/**/*.xplane.pb", recursive=True)
        data = ProfileData.from_file(trace)
    steps = config["steps"]
    times: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    streams: dict[str, list[str]] = collections.defaultdict(list)
    starts, ends = [], []
    idle: dict[str, float] = collections.defaultdict(float)
    gpu_planes = [plane for plane in data.planes if plane.name.startswith("/device:GPU")]
    for plane in gpu_planes:
        gpu = plane.name.removeprefix("/device:").split(" ")[0]

        def label(kernel: str, gpu: str = gpu) -> str:
            return f"{gpu} {kernel}" if (config["devices"] or 1) > 1 else kernel

        busy_until = None
        events = sorted(
            (event.start_ns, event.end_ns, event.name)
            for line in plane.lines
            if line.name.startswith("Stream")
            for event in line.events
        )
        for start, end, name in events:  # idle: no kernel on any of this GPU's streams
            if busy_until is not None and start > busy_until:
                idle[label(name)] += (start - busy_until) / 1e3 / steps
            busy_until = end if busy_until is None else max(busy_until, end)
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue
            for event in line.events:
                entry = times[label(event.name)]
                entry[0] += 1 / steps
                entry[1] += event.duration_ns / 1e3 / steps
                starts.append(event.start_ns)
                ends.append(event.end_ns)
                if line.name not in streams[gpu]:
                    streams[gpu].append(line.name)
    if not times:
        lines = [f"{plane.name}: {[line.name for line in plane.lines]}" for plane in data.planes]
        raise SystemExit("profile_step: the trace holds no GPU kernels; its planes:\n" + "\n".join(lines))
    return dict(times), (max(ends) - min(starts)) / 1e3 / steps, dict(streams), dict(idle)


def kernel_table(kernels: dict[str, list[float]]) -> list[str]:
    """The table of :func:`kernel_times`'s kernels (name -> [launches, microseconds] per step),
    longest first, each with its share of the step's kernel time and the running total of the
    shares (``cumul.``): the rows above 90% are the few kernels that make the step. Names as the
    profiler gives them (slax's ``slax_primal_level_corners_3d``, XLA's ``loop_fusion_12``)."""
    total = sum(us for _, us in kernels.values()) or 1.0
    lines = [f"  {'launches':>8} {'us/step':>9} {'share':>6} {'cumul.':>6}  kernel"]
    running = 0.0
    for kernel, (launches, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
        running += us
        share = f"{us / total:>6.1%} {running / total:>6.1%}"
        lines.append(f"  {launches:>8.2f} {us:>9.2f} {share}  {kernel[:100]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    problem = harness.device_count_problem(args.devices)
    if problem:
        harness.refuse_flags("profile_step", problem)
    if not harness.on_cuda():
        raise SystemExit("profile_step: needs JAX on a CUDA GPU")
    print(harness.describe_platform())
    results = []
    for network in harness.workloads(args):
        for dtype in args.dtype:
            for batch in args.batch:
                for model in args.model:
                    for launch in args.launch if model == "slax" else [None]:
                        config = dict(network=network, dtype=dtype, batch=batch, model=model, launch=launch)
                        config.update(
                            steps=args.steps, devices=args.devices, sizes=harness.network_sizes(network)
                        )
                        with slax.config.override(cuda_launch=launch or slax.config.cuda_launch):
                            rate = steps_per_second(
                                network, model, dtype, batch, args.steps, args.repeats, args.devices
                            )
                            kernels, span, streams, idle = kernel_times(config)
                        gpu_us = sum(us for _, us in kernels.values())
                        name = f"slax/{launch}" if launch else model
                        print(
                            f"\n{network} {dtype} batch {batch} {name}: {1e6 / rate:.1f} us/step wall, "
                            f"{span:.1f} from first kernel start to last end, {gpu_us:.1f} in kernels"
                        )
                        for gpu, names in streams.items():
                            print(f"  {gpu}: kernels on {', '.join(names)}")
                        print("\n".join(kernel_table(kernels)))
                        print(
                            f"  GPU idle before a kernel, us/step ({sum(idle.values()):.1f} in all; largest):"
                        )
                        for kernel, us in sorted(idle.items(), key=lambda kv: -kv[1])[:12]:
                            print(f"  {us:>18.2f}  {kernel[:100]}")
                        results.append(
                            {
                                **config,
                                "wall_us": 1e6 / rate,
                                "span_us": span,
                                "kernel_us": gpu_us,
                                "kernels": kernels,
                                "streams": streams,
                                "idle_before_us": idle,
                            }
                        )
    if args.json:
        harness.write_json(
            args.json, {**harness.provenance(), "platform": harness.describe_platform(), "results": results}
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
