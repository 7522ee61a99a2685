"""Isotonic fit+predict against scikit-learn, scipy's bare PAV kernel and jaxopt.

    python -m benchmarks.isotonic [--quick] [--json PATH] [--dtype both|float32|float64]

What is timed (median milliseconds per call, CPU):

* Single problems of n points: x ~ U(0, 1), y = x + 0.25 N(0, 1), unit
  weights. Every "fit+predict" fits and then predicts at the same x.
  - ours: `jax.jit` of `isotonic_fit` + `isotonic_predict`, backend "native"
    (the CPU default of backend="auto") and backend "xla";
  - scikit-learn: `IsotonicRegression(out_of_bounds="clip").fit(x, y).predict(x)`,
    the same function ours computes;
  - scipy: `scipy.optimize.isotonic_regression` on y already sorted by x, exact
    ties in x pooled beforehand (weights = tie counts): the bare O(n) PAV loop,
    no sort and no interpolation, the practical floor for one problem. Only
    the call is timed; it computes in float64 whatever the input dtype;
  - ours on that same sorted input, fit+predict and fit alone, to compare with
    the floor like for like (ours still sorts and pools ties itself);
  - jaxopt: jitted `isotonic_l2_pav` on the sorted y (bare problem, unit
    weights, tied x not pooled). Its kernel runs on the host through a
    callback: compiled by numba when numba is installed, plain Python if not.
* Batches (B, n): ours as `jax.jit(jax.vmap(fit+predict))` against a Python
  loop of scikit-learn over rows, a Python loop of scipy's bare kernel over
  pre-sorted, tie-pooled rows, and jaxopt vmapped (its callback goes row by row).
* Agreement: max |ours - sklearn| per case, and that over max |sklearn|.

Timing: inputs are made once from a fixed seed and put on the device. The
first call (compilation, for jitted functions) is excluded; a second call sets
how many back-to-back calls make one sample (>= 20 ms); the median over samples
is reported, with fewer samples for slow cases. Every call is waited on with
`block_until_ready`. Compile time = first call - median. A method is skipped
at a size where extrapolating its last time predicts more than a few seconds
per call; the table says so. float32 and float64 run one after the other in
separate subprocesses (float64 needs `jax_enable_x64` before any array exists)
and are printed side by side. The machine may be shared: medians resist
outliers, and the load average around each run is printed.
"""

import argparse
import functools
import importlib.metadata
import importlib.util
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence

import jax
import numpy as np
from scipy.optimize import isotonic_regression
from sklearn.isotonic import IsotonicRegression

from wmrl_jax.core.isotonic import isotonic_fit, isotonic_predict

SIZES = (10**2, 10**3, 10**4, 10**5, 10**6)
QUICK_SIZES = (10**2, 10**3, 10**4)
BATCHES = ((64, 16), (1024, 16), (1024, 256), (4096, 64), (256, 4096))
QUICK_BATCHES = ((64, 16), (1024, 16))
DTYPES = ("float32", "float64")
NOISE = 0.25
MIN_SAMPLE_S = 0.02
SLOW_CALL_S = 3.0  # skip a case extrapolated to take longer than this per call
TOLERANCE = {"float32": 1e-4, "float64": 1e-6}  # on max|ours - sklearn| / max|sklearn|
ROOT = pathlib.Path(__file__).resolve().parent.parent
# Column keys: ours default (native, or xla where native is unavailable).
OURS = "ours"
METHODS = ("ours_native", "ours_xla", "sklearn", "scipy", "sorted", "sorted_fit", "jaxopt")


def fit_predict(x, y, *, backend):
    return isotonic_predict(isotonic_fit(x, y, backend=backend), x, backend=backend)


def fit_only(x, y, *, backend):
    return isotonic_fit(x, y, backend=backend)


def blocking(fn: Callable, *args) -> Callable[[], object]:
    return lambda: jax.block_until_ready(fn(*args))


def measure(fn: Callable[[], object], *, repeats: int, budget_s: float) -> dict:
    """Median seconds per call of `fn`, plus the first call (with compilation)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    start = time.perf_counter()
    fn()
    probe = time.perf_counter() - start
    calls = max(1, math.ceil(MIN_SAMPLE_S / max(probe, 1e-9)))
    samples = [probe] if calls == 1 else []  # a slow probe is already a clean sample
    more = min(repeats - len(samples), int(budget_s / (probe * calls)))
    for _ in range(max(3 - len(samples), more)):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    median = statistics.median(samples)
    return dict(
        ms=median * 1e3,
        min_ms=min(samples) * 1e3,
        max_ms=max(samples) * 1e3,
        first_ms=first * 1e3,
        compile_ms=(first - median) * 1e3,
        samples=len(samples),
        calls_per_sample=calls,
    )


class Case:
    """Times the methods of one case; skips those extrapolated to be too slow."""

    def __init__(self, row: dict, size: int, history: dict, *, repeats: int, budget_s: float):
        self.row, self.size, self.history = row, size, history
        self.repeats, self.budget_s = repeats, budget_s
        row.setdefault("times", {})
        row.setdefault("skipped", {})

    def time(self, name: str, fn: Callable[[], object], *, tolerate_errors: bool = False) -> bool:
        if name in self.history:
            size, ms = self.history[name]
            predicted_s = ms * 1e-3 * self.size / size
            if predicted_s > SLOW_CALL_S:
                self.row["skipped"][name] = f"~{predicted_s:.0f} s/call extrapolated, skipped"
                return False
        try:
            result = measure(fn, repeats=self.repeats, budget_s=self.budget_s)
        except Exception as error:
            if not tolerate_errors:
                raise
            self.row["skipped"][name] = f"failed: {type(error).__name__}: {error}"[:300]
            print(f"  {name} failed, continuing: {self.row['skipped'][name]}", file=sys.stderr)
            return False
        self.row["times"][name] = result
        self.history[name] = (self.size, result["ms"])
        return True


def pool_sorted(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """y pooled over exact ties of sorted x, and tie counts as weights (None: no ties)."""
    _, first, counts = np.unique(xs, return_index=True, return_counts=True)
    if counts.size == xs.size:
        return ys, None
    return np.add.reduceat(ys.astype(np.float64), first) / counts, counts.astype(np.float64)


def agreement(ours: np.ndarray, reference: np.ndarray) -> dict:
    diff = float(np.max(np.abs(ours.astype(np.float64) - reference)))
    return dict(max_abs=diff, max_rel=diff / max(float(np.max(np.abs(reference))), 1e-30))


def sklearn_fit_predict(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return IsotonicRegression(out_of_bounds="clip").fit(x, y).predict(x)


def single(n: int, dtype: str, env: dict, history: dict, *, seed: int, **timing) -> dict:
    rng = np.random.default_rng([seed, n])
    x = rng.uniform(0.0, 1.0, n)
    y = (x + NOISE * rng.standard_normal(n)).astype(dtype)
    x = x.astype(dtype)
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    pooled, weights = pool_sorted(xs, ys)
    xd, yd, xsd, ysd = (jax.device_put(a) for a in (x, y, xs, ys))
    row = dict(n=n, dtype=dtype, ties=int(n - np.unique(x).size), agreement={})
    case = Case(row, n, history, **timing)

    reference = sklearn_fit_predict(x, y)
    case.time("sklearn", lambda: sklearn_fit_predict(x, y))
    case.time("scipy", lambda: isotonic_regression(pooled, weights=weights))
    for backend in env["backends"]:
        fn = jax.jit(functools.partial(fit_predict, backend=backend))
        if case.time(f"ours_{backend}", blocking(fn, xd, yd)):
            row["agreement"][f"ours_{backend}"] = agreement(np.asarray(fn(xd, yd)), reference)
        if backend == env["default"]:
            case.time("sorted", blocking(fn, xsd, ysd))
            row["agreement"]["sorted"] = agreement(np.asarray(fn(xsd, ysd)), reference[order])
            fit = jax.jit(functools.partial(fit_only, backend=backend))
            case.time("sorted_fit", blocking(fit, xsd, ysd))
    if env["jaxopt"] is not None:
        case.time("jaxopt", blocking(jax.jit(env["jaxopt"]), ysd), tolerate_errors=True)
    return row


def batch(shape: tuple[int, int], dtype: str, env: dict, history: dict, *, seed: int, **timing):
    rows, n = shape
    rng = np.random.default_rng([seed, rows, n])
    x = rng.uniform(0.0, 1.0, shape)
    y = (x + NOISE * rng.standard_normal(shape)).astype(dtype)
    x = x.astype(dtype)
    order = np.argsort(x, axis=1, kind="stable")
    xs, ys = np.take_along_axis(x, order, 1), np.take_along_axis(y, order, 1)
    pooled = [pool_sorted(a, b) for a, b in zip(xs, ys, strict=True)]
    xd, yd, ysd = (jax.device_put(a) for a in (x, y, ys))
    row = dict(B=rows, n=n, dtype=dtype, agreement={})
    case = Case(row, rows * n, history, **timing)

    reference = np.stack([sklearn_fit_predict(a, b) for a, b in zip(x, y, strict=True)])
    case.time("sklearn", lambda: [sklearn_fit_predict(a, b) for a, b in zip(x, y, strict=True)])
    case.time("scipy", lambda: [isotonic_regression(p, weights=w) for p, w in pooled])
    for backend in env["backends"]:
        fn = jax.jit(jax.vmap(functools.partial(fit_predict, backend=backend)))
        if case.time(f"ours_{backend}", blocking(fn, xd, yd)):
            row["agreement"][f"ours_{backend}"] = agreement(np.asarray(fn(xd, yd)), reference)
    if env["jaxopt"] is not None:
        fn = jax.jit(jax.vmap(env["jaxopt"]))
        case.time("jaxopt", blocking(fn, ysd), tolerate_errors=True)
    return row


def environment() -> dict:
    """Loads the native kernels and jaxopt outside any timing; says what is available."""
    env = dict(backends=["native", "xla"], notes=[])
    tiny = jax.numpy.zeros(2)
    start = time.perf_counter()
    try:
        jax.block_until_ready(isotonic_fit(tiny, tiny, backend="native"))
    except RuntimeError as error:
        env["backends"] = ["xla"]
        env["notes"].append(f"native backend unavailable: {error}")
    env["native_load_ms"] = (time.perf_counter() - start) * 1e3
    # Process-wide first-jit costs stay out of the first measured compile time.
    jax.block_until_ready(jax.jit(functools.partial(fit_predict, backend="xla"))(tiny, tiny))
    env["default"] = env["backends"][0]
    env["numba"] = importlib.util.find_spec("numba") is not None
    try:
        from jaxopt.isotonic import isotonic_l2_pav
    except Exception as error:  # any import failure is reported, the rest still runs
        env["jaxopt"] = None
        env["notes"].append(f"jaxopt unavailable: {type(error).__name__}: {error}")
    else:
        env["jaxopt"] = isotonic_l2_pav
        if not env["numba"]:
            env["notes"].append("numba not installed: jaxopt's PAV runs as a plain Python loop")
    warnings.filterwarnings("ignore", message="Numba could not be imported")
    return env


def run_dtype(dtype: str, *, quick: bool, repeats: int, seed: int) -> dict:
    """All measurements for one dtype, in this process."""
    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    load_before = os.getloadavg()
    started = time.perf_counter()
    env = environment()
    timing = dict(repeats=repeats, budget_s=0.25 if quick else 1.0, seed=seed)
    singles, batches, history = [], [], {}
    for n in QUICK_SIZES if quick else SIZES:
        print(f"[{dtype}] single n={n:.0e}", file=sys.stderr, flush=True)
        singles.append(single(n, dtype, env, history, **timing))
    history = {}
    for shape in QUICK_BATCHES if quick else BATCHES:
        print(f"[{dtype}] batch B,n={shape}", file=sys.stderr, flush=True)
        batches.append(batch(shape, dtype, env, history, **timing))
    meta = dict(
        jax_device=str(jax.devices()[0]),
        x64=bool(jax.config.jax_enable_x64),
        backends=env["backends"],
        default_backend=env["default"],
        native_load_ms=env["native_load_ms"],
        numba=env["numba"],
        notes=env["notes"],
        loadavg_before=load_before,
        loadavg_after=os.getloadavg(),
        wall_s=time.perf_counter() - started,
    )
    return dict(meta=meta, singles=singles, batches=batches)


def spawn_dtype(dtype: str, *, quick: bool, repeats: int, seed: int) -> dict:
    """Runs one dtype in a fresh interpreter, so float64 mode cannot leak into float32."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        command = [sys.executable, "-m", "benchmarks.isotonic", "--dtype", dtype, "--json", path]
        command += ["--no-table", "--repeats", str(repeats), "--seed", str(seed)]
        command += ["--quick"] if quick else []
        proc = subprocess.run(command, cwd=ROOT, check=False)
        if proc.returncode != 0:
            return dict(error=f"subprocess for {dtype} exited with status {proc.returncode}")
        with open(path, encoding="utf-8") as f:
            return json.load(f)["runs"][dtype]


def versions() -> dict:
    out = dict(python=platform.python_version(), platform=platform.platform())
    out["cpu_count"] = os.cpu_count()
    for package in ("jax", "jaxlib", "numpy", "scipy", "scikit-learn", "jaxopt", "numba"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = None
    return out


# ----------------------------------------------------------------------------
# Report.


def ms(row: dict, name: str) -> float | None:
    return row["times"][name]["ms"] if name in row["times"] else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def cell(value, width: int, spec: str = ".4g") -> str:
    if value is None:
        return f"{'-':>{width}}"
    if isinstance(value, str):
        return f"{value:>{width}}"
    return f"{value:>{width}{spec}}"


def verdict(ok: bool | None) -> str | None:
    return None if ok is None else ("PASS" if ok else "FAIL")


def with_ours(row: dict, default: str) -> dict:
    times = dict(row["times"])
    if f"ours_{default}" in times:
        times[OURS] = times[f"ours_{default}"]
    return {**row, "times": times}


def c(row: dict, name: str) -> float | None:
    return row["times"][name]["compile_ms"] if name in row["times"] else None


def table(title: str, columns: Sequence[tuple[str, int]], lines: list[list]) -> list[str]:
    header = " ".join(f"{name:>{width}}" for name, width in columns)
    out = ["", title, header, "-" * len(header)]
    for values in lines:
        out.append(" ".join(cell(v, w) for v, (_, w) in zip(values, columns, strict=True)))
    return out


def compile_ok(row: dict, backends: Sequence[str]) -> bool | None:
    times = [
        row["times"][f"ours_{b}"]["compile_ms"] for b in backends if f"ours_{b}" in row["times"]
    ]
    return None if not times else max(times) < 1000.0


def evaluate(runs: dict) -> tuple[list[dict], list[dict], list[str]]:
    """Rows of the single and batch tables with ratios and per-row target verdicts."""
    singles, batches = [], []
    for run in runs.values():
        backends, default = run["meta"]["backends"], run["meta"]["default_backend"]
        for raw in run["singles"]:
            row, n = with_ours(raw, default), raw["n"]
            sk = ratio(ms(row, "sklearn"), ms(row, OURS))
            vs_scipy = ratio(ms(row, OURS), ms(row, "scipy"))
            fit_vs_scipy = ratio(ms(row, "sorted_fit"), ms(row, "scipy"))
            row["ratios"] = dict(
                sklearn_over_ours=sk,
                ours_over_scipy=vs_scipy,
                sorted_over_scipy=ratio(ms(row, "sorted"), ms(row, "scipy")),
                sorted_fit_over_scipy=fit_vs_scipy,
            )
            row["targets"] = dict(
                sklearn_5x=verdict(None if sk is None else sk >= 5),
                under_10ms_at_1e5=verdict(ms(row, OURS) < 10.0) if n == 10**5 else None,
                scipy_2x_at_1e6=verdict(vs_scipy <= 2) if n == 10**6 and vs_scipy else None,
                scipy_2x_at_1e6_sorted_fit=(
                    verdict(fit_vs_scipy <= 2) if n == 10**6 and fit_vs_scipy else None
                ),
                compile_1s=verdict(compile_ok(row, backends)),
            )
            singles.append(row)
        for raw in run["batches"]:
            row = with_ours(raw, default)
            sk = ratio(ms(row, "sklearn"), ms(row, OURS))
            sp = ratio(ms(row, "scipy"), ms(row, OURS))
            small = raw["n"] <= 256
            row["ratios"] = dict(sklearn_over_ours=sk, scipy_over_ours=sp)
            row["targets"] = dict(
                sklearn_10x=verdict(sk >= 10) if small and sk else None,
                scipy_1x=verdict(sp >= 1) if small and sp else None,
                compile_1s=verdict(compile_ok(row, backends)),
            )
            batches.append(row)
    singles.sort(key=lambda r: (r["n"], r["dtype"]))
    batches.sort(key=lambda r: (r["n"] * r["B"], r["n"], r["dtype"]))

    def overall(rows: list[dict], key: str) -> str:
        parts = []
        for dtype in runs:
            marks = [r["targets"][key] for r in rows if r["dtype"] == dtype and r["targets"][key]]
            parts.append(
                f"{dtype} " + (("FAIL" if "FAIL" in marks else "PASS") if marks else "n/a")
            )
        return ", ".join(parts)

    summary = [
        f">=5x faster than sklearn at every n:            {overall(singles, 'sklearn_5x')}",
        f"within 2x of scipy bare at n=1e6 (fit+predict,  unsorted): "
        f"{overall(singles, 'scipy_2x_at_1e6')}",
        f"  like for like (fit alone, sorted input):      "
        f"{overall(singles, 'scipy_2x_at_1e6_sorted_fit')}",
        f"n=1e5 under 10 ms:                              {overall(singles, 'under_10ms_at_1e5')}",
        f">=10x faster than sklearn loop (batch n<=256):  {overall(batches, 'sklearn_10x')}",
        f"not slower than scipy loop (batch n<=256):      {overall(batches, 'scipy_1x')}",
        f"compile < 1 s per shape (native and xla):       "
        f"{overall(singles + batches, 'compile_1s')}",
    ]
    return singles, batches, summary


def format_report(result: dict) -> str:
    runs = {d: r for d, r in result["runs"].items() if "error" not in r}
    out = [f"{d}: {r['error']}" for d, r in result["runs"].items() if "error" in r]
    singles, batches, summary = (result["evaluated"][k] for k in ("singles", "batches", "summary"))
    out += table(
        "Single problem, fit+predict at the training x: median ms per call "
        "(scipy and jaxopt: bare PAV on sorted y; sorted: ours on that sorted input)",
        [("n", 8), ("dtype", 7), ("ties", 6), ("native", 9), ("xla", 9), ("sklearn", 9)]
        + [("scipy", 9), ("sorted", 9), ("sortedfit", 9), ("jaxopt", 9)],
        [[float(r["n"]), r["dtype"], r["ties"], *(ms(r, m) for m in METHODS)] for r in singles],
    )
    out += table(
        'Single problem: ratios (ours = backend "native", the CPU default), compile ms, targets',
        [("n", 8), ("dtype", 7), ("sk/ours", 8), ("ours/sp", 8), ("srt/sp", 7), ("fit/sp", 7)]
        + [("cmp nat", 8), ("cmp xla", 8), (">=5x sk", 7), ("1e5<10ms", 8), ("<=2x sp", 7)]
        + [("fit<=2x", 7), ("cmp<1s", 6)],
        [
            [float(r["n"]), r["dtype"], *r["ratios"].values()]
            + [c(r, "ours_native"), c(r, "ours_xla"), *r["targets"].values()]
            for r in singles
        ],
    )
    out += table(
        "Batches, vmapped fit+predict: median ms per call (loops are Python loops over rows)",
        [("B", 6), ("n", 6), ("dtype", 7), ("native", 9), ("xla", 9), ("sk loop", 9)]
        + [("sp loop", 9), ("jaxopt", 9), ("sk/ours", 8), ("sp/ours", 8), ("cmp nat", 8)]
        + [("cmp xla", 8), (">=10x sk", 8), (">=1x sp", 7), ("cmp<1s", 6)],
        [
            [r["B"], r["n"], r["dtype"], *(ms(r, m) for m in ("ours_native", "ours_xla"))]
            + [ms(r, m) for m in ("sklearn", "scipy", "jaxopt")]
            + [*r["ratios"].values(), c(r, "ours_native"), c(r, "ours_xla")]
            + list(r["targets"].values())
            for r in batches
        ],
    )
    agree = []
    for r in singles + batches:
        a = r["agreement"]
        values = [
            a.get(k, {}).get(m) for k in ("ours_native", "ours_xla") for m in ("max_abs", "max_rel")
        ]
        rels = [v for v in values[1::2] if v is not None]
        ok = verdict(max(rels) <= TOLERANCE[r["dtype"]]) if rels else None
        label = f"{r['n']:.0e}" if "B" not in r else f"{r['B']}x{r['n']}"
        agree.append([label, r["dtype"], *values, TOLERANCE[r["dtype"]], ok])
    out += table(
        "Agreement with scikit-learn (rel = max|ours - sklearn| / max|sklearn|)",
        [("case", 9), ("dtype", 7), ("nat abs", 9), ("nat rel", 9), ("xla abs", 9)]
        + [("xla rel", 9), ("rel tol", 8), ("verdict", 7)],
        agree,
    )
    out += ["", 'Targets (ours = backend "native", the CPU default):', *("  " + s for s in summary)]
    out.append("")
    skipped = sorted(
        {
            f"{m} at {r.get('B', '')}{'x' if 'B' in r else 'n='}{r['n']}: {why}"
            for r in singles + batches
            for m, why in r["skipped"].items()
        }
    )
    out += [f"skipped: {s}" for s in skipped]
    meta = result["meta"]
    out.append(
        f"jax {meta['jax']}, jaxlib {meta['jaxlib']}, numpy {meta['numpy']}, "
        f"scipy {meta['scipy']}, scikit-learn {meta['scikit-learn']}, "
        f"jaxopt {meta['jaxopt']}, numba {meta['numba']}; "
        f"{meta['platform']}, {meta['cpu_count']} CPUs"
    )
    for dtype, run in runs.items():
        m = run["meta"]
        notes = "; ".join(m["notes"]) or "-"
        out.append(
            f"{dtype}: {m['jax_device']}, native kernel load {m['native_load_ms']:.0f} ms, "
            f"wall {m['wall_s']:.0f} s, load average {m['loadavg_before'][0]:.2f} -> "
            f"{m['loadavg_after'][0]:.2f}; {notes}"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("both", *DTYPES), default="both")
    parser.add_argument("--quick", action="store_true", help="n up to 1e4, two batch shapes")
    parser.add_argument("--repeats", type=int, default=7, help="most samples per measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write every number to this JSON file")
    parser.add_argument("--no-table", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    options = dict(quick=args.quick, repeats=args.repeats, seed=args.seed)
    if args.dtype == "both":
        runs = {dtype: spawn_dtype(dtype, **options) for dtype in DTYPES}
    else:
        runs = {args.dtype: run_dtype(args.dtype, **options)}
    result = dict(meta=dict(versions(), **options), runs=runs)
    ok_runs = {dtype: run for dtype, run in runs.items() if "error" not in run}
    result["evaluated"] = dict(
        zip(("singles", "batches", "summary"), evaluate(ok_runs), strict=True)
    )
    if not args.no_table:
        print(format_report(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
