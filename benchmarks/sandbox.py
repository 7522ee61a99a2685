"""Per-program overhead of the sandbox backends, and pool throughput.

    python -m benchmarks.sandbox [--repeats 10] [--backends local,docker] [--json PATH]
    python -m benchmarks.sandbox --quick     # smoke run: 3 repeats, widths 1 and 2

Overhead: the median wall time of one `Executor.run` of a program minus the
median of a bare `subprocess.run([python, "-c", program])` of the same program
on the host (after one warm-up run each). Two programs: `pass`, and a small
scikit-learn fit. The local backend runs programs under an unprivileged uid
when started as root, and then uses the system python3 when the running
interpreter is out of that uid's reach; its baseline is a bare run of the same
interpreter, and a program it cannot import is reported as not available.

Throughput: programs per second for a batch of a short CPU-bound program
through `ExecutorPool` at widths 1, 2 and 4 (cache off); it should scale with
width up to the number of cores.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

from wmrl_jax.sandbox import (
    DockerExecutor,
    ExecutorPool,
    InfraError,
    LocalExecutor,
    WeakIsolationWarning,
)

PROGRAMS = {
    "pass": "pass",
    "sklearn_fit": (
        "import numpy as np\n"
        "from sklearn.linear_model import LogisticRegression\n"
        "x = np.random.default_rng(0).normal(size=(500, 8))\n"
        "LogisticRegression().fit(x, x[:, 0] > 0)\n"
    ),
}
CPU_PROGRAM = "s = 0\nfor i in range(3_000_000):\n    s += i\n"


def median_seconds(fn, repeats: int) -> tuple[float, float, float]:
    fn()  # warm-up: page cache, image layers, imports
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)


def bare(python: str, source: str) -> None:
    subprocess.run([python, "-c", source], check=True, capture_output=True)


def make_backend(name: str):
    if name == "local":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WeakIsolationWarning)
            return LocalExecutor(timeout_s=120)
    return DockerExecutor(timeout_s=120)


def overhead(executor, repeats: int) -> dict:
    python = executor.python if isinstance(executor, LocalExecutor) else sys.executable
    rows = {}
    for name, source in PROGRAMS.items():
        probe = executor.run(source)
        if probe.status != "ok":
            rows[name] = {"available": False, "why": probe.stderr.strip().splitlines()[-1:]}
            continue
        backend = median_seconds(lambda s=source: executor.run(s), repeats)
        baseline = median_seconds(lambda s=source: bare(python, s), repeats)
        rows[name] = {
            "available": True,
            "backend_median_s": backend[0],
            "backend_min_max_s": backend[1:],
            "bare_median_s": baseline[0],
            "bare_python": python,
            "overhead_s": backend[0] - baseline[0],
        }
    return rows


def throughput(executor, widths, programs: int) -> dict:
    rows = {}
    for width in widths:
        with ExecutorPool(executor, width=width, cache=False, close_executor=False) as pool:
            pool.map([CPU_PROGRAM] * width)  # warm-up
            start = time.perf_counter()
            results = pool.map([CPU_PROGRAM] * programs)
            elapsed = time.perf_counter() - start
        assert all(r.status == "ok" for r in results), [r for r in results if not r.ok][:1]
        rows[str(width)] = {"programs": programs, "seconds": elapsed, "per_s": programs / elapsed}
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--backends", default="local,docker")
    parser.add_argument("--widths", default="1,2,4")
    parser.add_argument("--programs", type=int, default=16, help="batch size for throughput")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    if args.quick:
        args.repeats, widths, args.programs = 3, [1, 2], 4
    report = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
        "backends": {},
    }
    print(f"# sandbox overhead (median of {args.repeats}) and throughput; {os.cpu_count()} cores")
    for name in args.backends.split(","):
        try:
            executor = make_backend(name)
        except InfraError as e:
            report["backends"][name] = {"skipped": str(e)}
            print(f"{name}: skipped ({e})")
            continue
        with executor:
            entry = {"environment": executor.environment}
            entry["overhead"] = overhead(executor, args.repeats)
            entry["throughput"] = throughput(executor, widths, args.programs)
        report["backends"][name] = entry
        for prog, row in entry["overhead"].items():
            if row["available"]:
                print(
                    f"{name:7s} {prog:12s} run {row['backend_median_s'] * 1e3:7.1f} ms"
                    f"  bare {row['bare_median_s'] * 1e3:7.1f} ms"
                    f"  overhead {row['overhead_s'] * 1e3:7.1f} ms"
                )
            else:
                print(f"{name:7s} {prog:12s} not available: {row['why']}")
        scaling = "  ".join(
            f"width {w}: {r['per_s']:.2f}/s" for w, r in entry["throughput"].items()
        )
        print(f"{name:7s} throughput   {scaling}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
