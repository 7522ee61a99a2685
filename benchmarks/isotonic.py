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
`block_until_ready`. Compile time = first call - median. Our xla backend and
jaxopt are skipped at a size where extrapolating their last time predicts more
than a few seconds per call; the report says so. float32 and float64 run one
after the other in separate subprocesses (float64 needs `jax_enable_x64` before
any array exists) and are printed side by side; --quick (n <= 1e4, two batch
shapes, a smoke test) runs the two concurrently. The machine may be shared:
medians resist outliers, and the load average around each run is printed.

Targets are judged for the default backend ("native" on CPU) and printed as
PASS/FAIL columns and a summary; compile time is judged for both backends.
"""

import argparse
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
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
# An optional method is skipped where its last time, scaled linearly with the
# number of points, predicts more than this per call; the anchors always run.
SKIPPABLE = ("ours_xla", "jaxopt")
SLOW_CALL_S = 3.0
QUICK_SLOW_CALL_S = 0.1
SLOW_SAMPLE_S = 0.5  # calls slower than this get fewer than 3 samples
TOLERANCE = {"float32": 1e-4, "float64": 1e-6}  # on max|ours - sklearn| / max|sklearn|
ROOT = pathlib.Path(__file__).resolve().parent.parent
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
    # At least 3 samples, except for calls so slow that 1 or 2 must do.
    for _ in range(max(3 - len(samples) if probe < SLOW_SAMPLE_S else 0, more)):
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

    def __init__(self, row: dict, size: int, history: dict, *, repeats, budget_s, slow_s):
        self.row, self.size, self.history = row, size, history
        self.repeats, self.budget_s, self.slow_s = repeats, budget_s, slow_s
        row.setdefault("times", {})
        row.setdefault("skipped", {})

    def time(self, name: str, fn: Callable[[], object], *, tolerate_errors: bool = False) -> bool:
        if name in SKIPPABLE and name in self.history:
            size, ms = self.history[name]
            predicted_s = ms * 1e-3 * self.size / size
            if predicted_s > self.slow_s:
                self.row["skipped"][name] = f"extrapolated to ~{predicted_s:.1f} s per call"
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


def sklearn_fit_predict(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return IsotonicRegression(out_of_bounds="clip").fit(x, y).predict(x)


def sklearn_references(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn fit+predict per row of [n] or [B, n], in the input dtype and in float64.

    In float32, scikit-learn also pools x values closer than 1e-6 (the dtype's
    resolution) and accumulates in float32. On float64 copies of the same
    values only exactly equal x pool, as in ours, so the second reference
    separates that documented difference from numerical error.
    """

    def rows(a, b):
        pairs = zip(np.atleast_2d(a), np.atleast_2d(b), strict=True)
        return np.stack([sklearn_fit_predict(u, v) for u, v in pairs]).reshape(a.shape)

    same = rows(x, y)
    wide = same if x.dtype == np.float64 else rows(x.astype(np.float64), y.astype(np.float64))
    return same, wide


def agreement(ours: np.ndarray, references: tuple[np.ndarray, np.ndarray]) -> dict:
    """Max |ours - reference|, and that over max |reference|, for both references."""
    out = {}
    for suffix, reference in zip(("", "_f64"), references, strict=True):
        diff = float(np.max(np.abs(ours.astype(np.float64) - reference)))
        out[f"max_abs{suffix}"] = diff
        out[f"max_rel{suffix}"] = diff / max(float(np.max(np.abs(reference))), 1e-30)
    return out


def near_ties(xs: np.ndarray) -> int:
    """Neighbours in sorted x that differ by less than the dtype's resolution."""
    gaps = np.diff(xs, axis=-1)
    return int(np.sum((gaps > 0) & (gaps < np.finfo(xs.dtype).resolution)))


def single(n: int, dtype: str, env: dict, history: dict, *, seed: int, **timing) -> dict:
    rng = np.random.default_rng([seed, n])
    x = rng.uniform(0.0, 1.0, n)
    y = (x + NOISE * rng.standard_normal(n)).astype(dtype)
    x = x.astype(dtype)
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    pooled, weights = pool_sorted(xs, ys)
    xd, yd, xsd, ysd = (jax.device_put(a) for a in (x, y, xs, ys))
    row = dict(n=n, dtype=dtype, ties=int(n - np.unique(x).size), near_ties=near_ties(xs))
    row["agreement"] = {}
    case = Case(row, n, history, **timing)

    references = sklearn_references(x, y)
    case.time("sklearn", lambda: sklearn_fit_predict(x, y))
    case.time("scipy", lambda: isotonic_regression(pooled, weights=weights))
    for backend in env["backends"]:
        fn = jax.jit(functools.partial(fit_predict, backend=backend))
        if case.time(f"ours_{backend}", blocking(fn, xd, yd)):
            row["agreement"][f"ours_{backend}"] = agreement(np.asarray(fn(xd, yd)), references)
        if backend == env["default"]:
            case.time("sorted", blocking(fn, xsd, ysd))
            in_order = tuple(r[order] for r in references)
            row["agreement"]["sorted"] = agreement(np.asarray(fn(xsd, ysd)), in_order)
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
    row = dict(B=rows, n=n, dtype=dtype, near_ties=near_ties(xs), agreement={})
    case = Case(row, rows * n, history, **timing)

    references = sklearn_references(x, y)
    case.time("sklearn", lambda: [sklearn_fit_predict(a, b) for a, b in zip(x, y, strict=True)])
    case.time("scipy", lambda: [isotonic_regression(p, weights=w) for p, w in pooled])
    for backend in env["backends"]:
        fn = jax.jit(jax.vmap(functools.partial(fit_predict, backend=backend)))
        if case.time(f"ours_{backend}", blocking(fn, xd, yd)):
            row["agreement"][f"ours_{backend}"] = agreement(np.asarray(fn(xd, yd)), references)
    if env["jaxopt"] is not None:
        fn = jax.jit(jax.vmap(env["jaxopt"]))
        case.time("jaxopt", blocking(fn, ysd), tolerate_errors=True)
    return row


def callback_gets_numpy() -> bool:
    """Whether `jax.pure_callback` hands numpy arrays (not jax.Array) to the host function."""
    seen = []

    def host(v):
        seen.append(isinstance(v, np.ndarray))
        return np.asarray(v)

    out = jax.ShapeDtypeStruct((1,), np.float32)
    jax.block_until_ready(jax.pure_callback(host, out, np.zeros(1, np.float32)))
    return seen[0]


def environment() -> dict:
    """Loads the native kernels and jaxopt outside any timing; says what is available."""
    env = dict(backends=["native", "xla"], notes=[])
    tiny = np.zeros(2, np.float32)
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
            if not callback_gets_numpy():
                env["notes"].append(
                    "host callbacks receive jax.Array here, so that loop's every element "
                    "access is a JAX operation"
                )
    warnings.filterwarnings("ignore", message="Numba could not be imported")
    return env


def library_digest() -> str:
    """Digest of the benchmarked sources, to flag a library edited between or during runs."""
    module = pathlib.Path(inspect.getfile(isotonic_fit))
    files = [module, *sorted((module.parent / "_native").glob("*.cc"))]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]


def progress(label: str, started: float) -> None:
    print(f"{label} done at {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


def run_dtype(dtype: str, *, quick: bool, repeats: int, seed: int) -> dict:
    """All measurements for one dtype, in this process."""
    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    load_before, digest_before = os.getloadavg(), library_digest()
    started = time.perf_counter()
    env = environment()
    timing = dict(repeats=repeats, seed=seed, budget_s=0.1 if quick else 1.0)
    timing["slow_s"] = QUICK_SLOW_CALL_S if quick else SLOW_CALL_S
    singles, batches, history = [], [], {}
    for n in QUICK_SIZES if quick else SIZES:
        singles.append(single(n, dtype, env, history, **timing))
        progress(f"[{dtype}] single n={n:.0e}", started)
    for shape in QUICK_BATCHES if quick else BATCHES:
        batches.append(batch(shape, dtype, env, history, **timing))
        progress(f"[{dtype}] batch B,n={shape}", started)
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
        source_digest=[digest_before, library_digest()],
        wall_s=time.perf_counter() - started,
    )
    return dict(meta=meta, singles=singles, batches=batches)


def spawn_dtypes(*, quick: bool, repeats: int, seed: int) -> dict:
    """Runs each dtype in a fresh interpreter, so float64 mode cannot leak into float32.

    The full run goes one dtype after the other; --quick (a smoke test) runs
    them concurrently to stay short, at the cost of noisier numbers.
    """
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        procs = {}
        for dtype in DTYPES:
            path = os.path.join(tmp, f"{dtype}.json")
            command = [sys.executable, "-m", "benchmarks.isotonic", "--dtype", dtype]
            command += ["--json", path, "--no-table", "--repeats", str(repeats)]
            command += ["--seed", str(seed)] + (["--quick"] if quick else [])
            procs[dtype] = (path, subprocess.Popen(command, cwd=ROOT))
            if not quick:
                procs[dtype][1].wait()
        for dtype, (path, proc) in procs.items():
            if proc.wait() != 0:
                runs[dtype] = dict(error=f"subprocess exited with status {proc.returncode}")
                continue
            with open(path, encoding="utf-8") as f:
                runs[dtype] = json.load(f)["runs"][dtype]
    return runs


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

# key: (label, bound, whether the value must be at least (True) or below (False) the bound)
TARGETS = {
    "sklearn_5x": (">=5x faster than sklearn at every n (sk/ours)", 5.0, True),
    "scipy_2x_1e6": (
        "within 2x of scipy bare at n=1e6, fit+predict unsorted (ours/sp)",
        2.0,
        False,
    ),
    "scipy_2x_1e6_fit": (
        "  like for like: fit alone on the same sorted input (fit/sp)",
        2.0,
        False,
    ),
    "under_10ms_1e5": ("n=1e5 under 10 ms (ms)", 10.0, False),
    "sklearn_loop_10x": (">=10x faster than sklearn loop, batches n<=256 (sk/ours)", 10.0, True),
    "scipy_loop_1x": ("not slower than scipy loop, batches n<=256 (sp/ours)", 1.0, True),
    "compile_native": ("compile < 1 s per shape, backend native (ms)", 1e3, False),
    "compile_xla": ("compile < 1 s per shape, backend xla (ms)", 1e3, False),
    # Bound None: the dtype's tolerance.
    "agree_sklearn": ("agreement with sklearn, same dtype (max rel)", None, False),
}


def ms(row: dict, name: str) -> float | None:
    return row["times"][name]["ms"] if name in row["times"] else None


def compile_ms(row: dict, name: str) -> float | None:
    return row["times"][name]["compile_ms"] if name in row["times"] else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def case_label(row: dict) -> str:
    return f"{row['B']}x{row['n']}" if "B" in row else f"n={row['n']:.0e}"


def judge(row: dict, values: dict) -> None:
    """Stores `{target: (value, passed)}` for the targets whose value was measured."""
    row["targets"] = {}
    for key, value in values.items():
        if value is not None:
            _, bound, at_least = TARGETS[key]
            bound = TOLERANCE[row["dtype"]] if bound is None else bound
            row["targets"][key] = (value, value >= bound if at_least else value <= bound)


def worst_rel(row: dict, suffix: str) -> float | None:
    rels = [a[f"max_rel{suffix}"] for a in row["agreement"].values()]
    return max(rels) if rels else None


def evaluate(runs: dict) -> dict:
    """Ratios and per-case target verdicts for every run, plus a summary per target."""
    singles, batches = [], []
    for run in runs.values():
        default = run["meta"]["default_backend"]
        for raw in run["singles"]:
            row = dict(raw, ours=ms(raw, f"ours_{default}"))
            row["ratios"] = dict(
                sklearn_over_ours=ratio(ms(row, "sklearn"), row["ours"]),
                ours_over_scipy=ratio(row["ours"], ms(row, "scipy")),
                sorted_over_scipy=ratio(ms(row, "sorted"), ms(row, "scipy")),
                sorted_fit_over_scipy=ratio(ms(row, "sorted_fit"), ms(row, "scipy")),
            )
            big = row["n"] == 10**6
            judge(
                row,
                dict(
                    sklearn_5x=row["ratios"]["sklearn_over_ours"],
                    scipy_2x_1e6=row["ratios"]["ours_over_scipy"] if big else None,
                    scipy_2x_1e6_fit=row["ratios"]["sorted_fit_over_scipy"] if big else None,
                    under_10ms_1e5=row["ours"] if row["n"] == 10**5 else None,
                    compile_native=compile_ms(row, "ours_native"),
                    compile_xla=compile_ms(row, "ours_xla"),
                    agree_sklearn=worst_rel(row, ""),
                ),
            )
            singles.append(row)
        for raw in run["batches"]:
            row = dict(raw, ours=ms(raw, f"ours_{default}"))
            row["ratios"] = dict(
                sklearn_over_ours=ratio(ms(row, "sklearn"), row["ours"]),
                scipy_over_ours=ratio(ms(row, "scipy"), row["ours"]),
            )
            small = row["n"] <= 256
            judge(
                row,
                dict(
                    sklearn_loop_10x=row["ratios"]["sklearn_over_ours"] if small else None,
                    scipy_loop_1x=row["ratios"]["scipy_over_ours"] if small else None,
                    compile_native=compile_ms(row, "ours_native"),
                    compile_xla=compile_ms(row, "ours_xla"),
                    agree_sklearn=worst_rel(row, ""),
                ),
            )
            batches.append(row)
    singles.sort(key=lambda r: (r["n"], r["dtype"]))
    batches.sort(key=lambda r: (r["B"] * r["n"], r["n"], r["dtype"]))

    summary = {key: {} for key in TARGETS}
    for key, (_, _, at_least) in TARGETS.items():
        for dtype in runs:
            judged = [r for r in singles + batches if r["dtype"] == dtype and key in r["targets"]]
            if not judged:
                summary[key][dtype] = "n/a"
                continue
            pick = min if at_least else max
            worst = pick(judged, key=lambda r, k=key: r["targets"][k][0])
            passed = all(r["targets"][key][1] for r in judged)
            summary[key][dtype] = (
                f"{'PASS' if passed else 'FAIL'} (worst {worst['targets'][key][0]:.3g} "
                f"at {case_label(worst)})"
            )
    return dict(singles=singles, batches=batches, summary=summary)


def cell(value, width: int) -> str:
    if value is None:
        text = "-"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, bool):
        text = "PASS" if value else "FAIL"
    else:
        text = f"{value:.4g}"
    return f"{text:>{width}}"


def table(title: str, columns: Sequence[tuple[str, int]], lines: list[list]) -> list[str]:
    header = " ".join(f"{name:>{width}}" for name, width in columns)
    out = ["", title, header, "-" * len(header)]
    for values in lines:
        out.append(" ".join(cell(v, w) for v, (_, w) in zip(values, columns, strict=True)))
    return out


def verdicts(row: dict, keys: Sequence[str]) -> list:
    return [row["targets"][k][1] if k in row["targets"] else None for k in keys]


def format_report(result: dict) -> str:
    evaluated = result["evaluated"]
    singles, batches = evaluated["singles"], evaluated["batches"]
    out = [f"{d}: {r['error']}" for d, r in result["runs"].items() if "error" in r]
    if result["meta"]["quick"]:
        out.append("quick smoke run: reduced set, few samples; timings indicative only")
    out += table(
        "Single problem, fit+predict at the training x: median ms per call "
        "(scipy, jaxopt: bare PAV on sorted y; sorted: ours on that sorted input)",
        [("n", 7), ("dtype", 7), ("ties", 5), ("native", 9), ("xla", 9), ("sklearn", 9)]
        + [("scipy", 9), ("sorted", 9), ("sortedfit", 9), ("jaxopt", 9)],
        [[f"{r['n']:.0e}", r["dtype"], r["ties"], *(ms(r, m) for m in METHODS)] for r in singles],
    )
    keys = ("sklearn_5x", "under_10ms_1e5", "scipy_2x_1e6", "scipy_2x_1e6_fit")
    keys += ("compile_native", "compile_xla")
    out += table(
        'Single problem: ratios (ours = backend "native", the CPU default), compile ms, targets',
        [("n", 7), ("dtype", 7), ("sk/ours", 8), ("ours/sp", 8), ("srt/sp", 7), ("fit/sp", 7)]
        + [("cmp nat", 8), ("cmp xla", 8), (">=5x sk", 7), ("1e5<10ms", 8), ("<=2x sp", 7)]
        + [("fit<=2x", 7), ("nat<1s", 6), ("xla<1s", 6)],
        [
            [f"{r['n']:.0e}", r["dtype"], *r["ratios"].values()]
            + [compile_ms(r, "ours_native"), compile_ms(r, "ours_xla"), *verdicts(r, keys)]
            for r in singles
        ],
    )
    keys = ("sklearn_loop_10x", "scipy_loop_1x", "compile_native", "compile_xla")
    out += table(
        "Batches, jit(vmap(fit+predict)) vs Python loops over rows: median ms per call",
        [("B", 5), ("n", 5), ("dtype", 7), ("native", 8), ("xla", 8), ("sk loop", 8)]
        + [("sp loop", 8), ("jaxopt", 8), ("sk/ours", 8), ("sp/ours", 7), ("cmp nat", 7)]
        + [("cmp xla", 7), (">=10x sk", 8), (">=1x sp", 7), ("nat<1s", 6), ("xla<1s", 6)],
        [
            [r["B"], r["n"], r["dtype"], ms(r, "ours_native"), ms(r, "ours_xla")]
            + [ms(r, "sklearn"), ms(r, "scipy"), ms(r, "jaxopt"), *r["ratios"].values()]
            + [compile_ms(r, "ours_native"), compile_ms(r, "ours_xla"), *verdicts(r, keys)]
            for r in batches
        ],
    )
    lines = []
    columns = [("ours_native", "max_abs"), ("ours_native", "max_rel"), ("ours_xla", "max_rel")]
    columns += [("sorted", "max_rel"), ("ours_native", "max_rel_f64"), ("ours_xla", "max_rel_f64")]
    for r in singles + batches:
        values = [r["agreement"].get(k, {}).get(m) for k, m in columns]
        lines.append([case_label(r), r["dtype"], r["near_ties"], *values, TOLERANCE[r["dtype"]]])
        lines[-1] += verdicts(r, ("agree_sklearn",))
    out += table(
        "Agreement with scikit-learn: rel = max|ours - sklearn| / max|sklearn|; sorted = native "
        "on the pre-sorted input;\n*64 = against sklearn on float64 copies of the same values "
        "(information only: in float64 fewer near ties are pooled);\nnear ties = sorted "
        "neighbours closer than the dtype's resolution (both sklearn and ours pool them)",
        [("case", 9), ("dtype", 7), ("near ties", 9), ("nat abs", 9), ("nat rel", 9)]
        + [("xla rel", 9), ("srt rel", 9), ("nat rel64", 9), ("xla rel64", 9), ("rel tol", 7)]
        + [("vs sk", 5)],
        lines,
    )
    out += ["", 'Targets (ours = backend "native", the CPU default):']
    for key, (label, _, _) in TARGETS.items():
        parts = "; ".join(f"{d} {v}" for d, v in evaluated["summary"][key].items())
        out.append(f"  {label:<66} {parts}")
    out.append("")
    for r in singles + batches:
        out += [
            f"skipped {m} at {case_label(r)} {r['dtype']}: {why}" for m, why in r["skipped"].items()
        ]
    meta = result["meta"]
    out.append(
        f"jax {meta['jax']}, jaxlib {meta['jaxlib']}, numpy {meta['numpy']}, "
        f"scipy {meta['scipy']}, scikit-learn {meta['scikit-learn']}, "
        f"jaxopt {meta['jaxopt']}, numba {meta['numba']}; "
        f"{meta['platform']}, {meta['cpu_count']} CPUs"
    )
    for dtype, run in result["runs"].items():
        if "error" in run:
            continue
        m = run["meta"]
        out.append(
            f"{dtype}: {m['jax_device']}, native kernel build/load {m['native_load_ms']:.0f} ms, "
            f"wall {m['wall_s']:.0f} s, 1-min load average {m['loadavg_before'][0]:.2f} -> "
            f"{m['loadavg_after'][0]:.2f}"
        )
    metas = [run["meta"] for run in result["runs"].values() if "meta" in run]
    digests = sorted({d for m in metas for d in m["source_digest"]})
    if len(digests) > 1:
        out.append(
            "WARNING: the isotonic sources changed between or during the runs "
            f"(digests {', '.join(digests)}); numbers may mix library versions"
        )
    notes = {
        note for run in result["runs"].values() for note in run.get("meta", {}).get("notes", [])
    }
    out += [f"note: {note}" for note in sorted(notes)]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dtype",
        choices=("both", *DTYPES),
        default="both",
        help="both (default) runs each dtype in its own subprocess and prints them together",
    )
    parser.add_argument("--quick", action="store_true", help="n up to 1e4, two batch shapes")
    parser.add_argument("--repeats", type=int, default=7, help="most samples per measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write every number to this JSON file")
    parser.add_argument("--no-table", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    options = dict(quick=args.quick, repeats=args.repeats, seed=args.seed)
    if args.dtype == "both":
        runs = spawn_dtypes(**options)
    else:
        runs = {args.dtype: run_dtype(args.dtype, **options)}
    result = dict(meta=dict(versions(), **options), runs=runs)
    result["evaluated"] = evaluate({d: run for d, run in runs.items() if "error" not in run})
    if not args.no_table:
        print(format_report(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    failed = [d for d, run in runs.items() if "error" in run]
    if failed:
        sys.exit(f"benchmark runs failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
