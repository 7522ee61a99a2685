"""Executions per second through RayExecutor and EnginePool, against ExecutorPool.

    python -m benchmarks.scaleout [--widths 1,2,4] [--programs 4] [--rounds 3] [--backend docker]
                                  [--engines URL,URL] [--json PATH]
    python -m benchmarks.scaleout --quick      # widths 1 and 2, one round of 2 programs per slot

All three run the same backend (`--backend`: Docker by default, "local" for
the subprocess one) on this machine, `width` programs at once:

* anchor: `ExecutorPool(executor, width=w)` (cache off), one process;
* `RayExecutor(slots_per_node=w)` on a one-node `LocalRayCluster` (loopback),
  the executor in the node's actor, the driver here;
* `EnginePool` over `--engines` (default: the one engine), w slots spread over them.

Throughput: programs per second for a batch of `--programs` x width copies of
a program that sleeps `--sleep` seconds (sleep, not CPU, so that widths above
the core count still measure scheduling, not the CPU): the median of
`--rounds` rounds that alternate the three (a shared machine's load drifts
alike for all), reported as the ratio to the anchor at the same width.
Overhead: the median latency of one `pass` program through each, minus that
of the backend's own `run`, the two alternated (what the layer adds per
program). Dispatch ceiling: programs per second `FanOut` schedules onto
workers that answer at once (no sandbox): the most one driver can hand out.

Scaling with nodes: a node adds `slots` programs at once, so with programs of
T seconds and n nodes of s slots the throughput is about n*s/(T + overhead)
until it meets the dispatch ceiling; at minutes per program (the real
workload) that is thousands of nodes away.
"""

import argparse
import concurrent.futures
import json
import os
import platform
import statistics
import time
import warnings

from wmrl_jax.sandbox import DockerExecutor, ExecutorPool, LocalExecutor, WeakIsolationWarning
from wmrl_jax.sandbox.fanout import FanOut
from wmrl_jax.sandbox.result import ExecutionResult


def make_backend(name: str, timeout_s: float = 120.0):
    if name == "local":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WeakIsolationWarning)
            return LocalExecutor(timeout_s=timeout_s)
    return DockerExecutor(timeout_s=timeout_s)


def backend_factory(name: str):
    """A picklable factory of the backend (for the Ray node's actor)."""
    import functools

    if name == "local":
        return functools.partial(LocalExecutor, timeout_s=120.0)
    return functools.partial(DockerExecutor, timeout_s=120.0)


def throughput(submit, programs: int, source: str) -> float:
    """Programs per second for `programs` copies of `source` (all submitted at once)."""
    start = time.perf_counter()
    futures = [submit(source + f"\n# {i}") for i in range(programs)]  # distinct: no cache
    results = [f.result() for f in futures]
    elapsed = time.perf_counter() - start
    bad = [r for r in results if r.status != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} programs failed: {bad[0].status} {bad[0].message}")
    return programs / elapsed


def paired_overhead(run_layer, run_backend, repeats: int) -> float:
    """Median latency of a `pass` program through the layer minus through the backend,
    the two alternated (after one warm-up each)."""
    times = {"layer": [], "backend": []}
    for i in range(repeats + 1):
        for key, run in (("layer", run_layer), ("backend", run_backend)):
            start = time.perf_counter()
            result = run(f"pass  # {key} {i}")
            if i:
                times[key].append(time.perf_counter() - start)
            assert result.status == "ok", result
    return statistics.median(times["layer"]) - statistics.median(times["backend"])


class _Instant:
    """A worker that answers at once: what is left is the fan-out's own cost."""

    def __init__(self, name: str, slots: int):
        self.name, self.slots = name, slots

    def start(self, source, *, input_dir, timeout_s, files):
        future = concurrent.futures.Future()
        future.set_result(ExecutionResult(status="ok"))
        return future

    def alive(self):
        return True

    def close(self):
        pass


def dispatch_ceiling(programs: int = 5000) -> float:
    with FanOut([_Instant(f"w{i}", 4) for i in range(4)], environment="bench") as ex:
        start = time.perf_counter()
        futures = [ex.submit("pass") for _ in range(programs)]
        for f in futures:
            f.result()
        return programs / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="1,2,4")
    parser.add_argument("--programs", type=int, default=4, help="per slot, per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", choices=("docker", "local"), default="docker")
    parser.add_argument("--engines", default="", help="engine URLs for EnginePool (docker)")
    parser.add_argument("--skip", default="", help="comma-separated: ray, engines")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.quick:
        args.widths, args.programs, args.repeats, args.rounds = "1,2", 2, 2, 1
    widths = [int(w) for w in args.widths.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    source = f"import time\ntime.sleep({args.sleep})\n"
    backend = make_backend(args.backend)
    out = {
        "machine": platform.platform(),
        "backend": backend.environment,
        "programs": args.programs,
        "sleep_s": args.sleep,
        "rows": [],
        "overhead_s": {},
    }
    out["dispatch_ceiling_per_s"] = dispatch_ceiling()

    layers = {}  # name -> (factory of an executor at width w)
    layers["ExecutorPool"] = lambda w: ExecutorPool(
        backend, width=w, cache=False, close_executor=False
    )
    cluster = None
    if "ray" not in skip:
        from wmrl_jax.sandbox.ray_executor import RayExecutor
        from wmrl_jax.sandbox.ray_local import LocalRayCluster

        cluster = LocalRayCluster(workers=0, num_cpus=max(widths))
        make = backend_factory(args.backend)
        layers["RayExecutor"] = lambda w: RayExecutor(slots_per_node=w, make_executor=make)
    if "engines" not in skip and args.backend == "docker":
        from wmrl_jax.sandbox.remote import EnginePool

        urls = [u for u in args.engines.split(",") if u]
        urls = urls or [os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")]

        def engine_pool(w):
            n = min(w, len(urls))  # w slots spread over the first n engines
            slots = [w // n + (i < w % n) for i in range(n)]
            return EnginePool(urls[:n], slots=slots, timeout_s=120)

        layers["EnginePool"] = engine_pool
    try:
        for w in widths:
            built = {name: make_layer(w) for name, make_layer in layers.items()}
            try:
                if w == 1:  # interleaved with the backend's own runs: the load drifts alike
                    for name, layer in built.items():
                        run = lambda s, layer=layer: layer.submit(s).result()  # noqa: E731
                        out["overhead_s"][name] = paired_overhead(run, backend.run, args.repeats)
                rates = {name: [] for name in built}
                for _ in range(args.rounds):  # rounds interleave the layers, for the same reason
                    for name, layer in built.items():
                        rates[name].append(throughput(layer.submit, args.programs * w, source))
            finally:
                for layer in built.values():
                    layer.close()
            for name, values in rates.items():
                rate = statistics.median(values)
                out["rows"].append({"layer": name, "width": w, "per_s": rate})
                print(f"{name:>12} width {w}: {rate:6.2f} programs/s", flush=True)
    finally:
        if cluster is not None:
            cluster.close()
        backend.close()

    anchor = {r["width"]: r["per_s"] for r in out["rows"] if r["layer"] == "ExecutorPool"}
    for row in out["rows"]:
        row["vs_pool"] = row["per_s"] / anchor[row["width"]]
    print(
        f"\nBackend {out['backend']}; {args.programs} x width programs of sleep({args.sleep}),"
        f" median of {args.rounds} interleaved rounds."
    )
    print("| layer | width | programs/s | vs ExecutorPool |")
    print("|---|---:|---:|---:|")
    for row in out["rows"]:
        print(f"| {row['layer']} | {row['width']} | {row['per_s']:.2f} | {row['vs_pool']:.2f}x |")
    print("\n| per-program overhead over the backend's run (median `pass`) | seconds |")
    print("|---|---:|")
    for name, seconds in out["overhead_s"].items():
        print(f"| {name} | {seconds:+.3f} |")
    print(f"\nFanOut dispatch ceiling: {out['dispatch_ceiling_per_s']:.0f} programs/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
