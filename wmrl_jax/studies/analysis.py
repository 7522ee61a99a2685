"""The studies' one analysis: reaching a target, paired differences, and the command shape.

Every study (compute, controlled, embodied) asks the same three things, and
they are answered here once:

* **Reaching a target** (`reach`): the first x (compute, executions,
  simulator steps) at which the linearly interpolated curve y(x) reaches the
  target. A curve that never reaches it gives `inf` ("never"), reported as
  such and never read as a number. Points after a run's end (NaN) are not
  part of its curve.
* **Paired differences** (`paired`): seeds are paired by design (same warm
  start, same keys), so two arms are compared by the per-seed difference:
  its mean, a Student-t interval at `level` (90% by default) and the number
  of pairs. `equivalence` turns that interval into a verdict against a
  declared margin: "equivalent" when the 90% interval lies inside
  (−margin, +margin), the two one-sided tests (TOST) at 5% each.
* **The command shape** (`Command`, `command_main`): a study is a `run`
  (config, workdir, readme, docs[, extend]) and a `render` (workdir, readme,
  docs) from its `results.json`; the entry points in `experiments/` are flags
  and a call.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
from scipy import stats


def reach(x, y, target: float) -> float:
    """The first x at which the piecewise-linear curve y(x) reaches `target`.

    Between consecutive points (x₀, y₀) below and (x₁, y₁) at or above the
    target, the crossing is x₀ + (target − y₀)/(y₁ − y₀)·(x₁ − x₀). A curve
    that starts at or above the target reaches it at x[0].

    Args:
      x: non-decreasing points, of shape [P] (compute, executions, steps).
      y: the curve at them, of shape [P]; NaN where the run has no value (after
        its end): such points are left out.
      target: the level to reach.

    Returns:
      The interpolated x; `inf` when the curve never reaches the target (or
      has no finite point).

    Example:
      >>> reach([0.0, 10.0, 20.0], [0.0, 0.2, 0.6], 0.4)
      15.0
      >>> reach([0.0, 10.0, 20.0], [0.0, 0.6, 0.2], 0.4)  # First crossing counts.
      6.666666666666667
      >>> reach([0.0, 10.0], [0.0, 0.2], 0.4)
      inf
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be [P], got {x.shape} and {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    hit = np.flatnonzero(y >= target)
    if not hit.size:
        return math.inf
    j = int(hit[0])
    if j == 0:
        return float(x[0])
    frac = (target - y[j - 1]) / (y[j] - y[j - 1])
    return float(x[j - 1] + frac * (x[j] - x[j - 1]))


def finite(x: float) -> float | None:
    """`x` as a float, or None where it is not finite (a target never reached: "never")."""
    return float(x) if np.isfinite(x) else None


def reach_rows(x, y, targets) -> np.ndarray:
    """`reach` per row (seed): rows of x and y [S, P] against `targets` [S] (or one scalar)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    targets = np.broadcast_to(np.asarray(targets, np.float64), (x.shape[0],))
    return np.array([reach(xi, yi, t) for xi, yi, t in zip(x, y, targets, strict=True)])


@dataclasses.dataclass(frozen=True)
class Paired:
    """A paired difference a − b over seeds.

    Attributes:
      diffs: the per-seed differences (pairs where both are finite), of shape [n].
      n: pairs.
      mean: mean difference.
      se: its standard error (sd / √n, sd with ddof=1); NaN for n < 2.
      lo, hi: the Student-t interval at `level` (t with n − 1 degrees of
        freedom); NaN for n < 2.
      level: the interval's coverage, e.g. 0.9.
    """

    diffs: tuple[float, ...]
    n: int
    mean: float
    se: float
    lo: float
    hi: float
    level: float

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["diffs"] = list(self.diffs)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in d.items()}  # fmt: skip


def paired(a, b, *, level: float = 0.9) -> Paired:
    """The per-seed difference a − b, its mean and a Student-t interval at `level`.

    Seeds are paired by position; a pair where either value is NaN (a run
    without the value) is left out, so `n` says how many pairs the interval
    rests on.

    Example:
      >>> p = paired([0.5, 0.6, 0.7], [0.4, 0.4, 0.6])
      >>> round(p.mean, 4), p.n
      (0.1333, 3)
    """
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired: a and b must be [seeds] of one shape, got {a.shape}, {b.shape}")
    if not 0 < level < 1:
        raise ValueError(f"paired: level must be in (0, 1), got {level}")
    d = (a - b)[np.isfinite(a) & np.isfinite(b)]
    n = int(d.size)
    mean = float(d.mean()) if n else math.nan
    if n < 2:
        return Paired(tuple(d.tolist()), n, mean, math.nan, math.nan, math.nan, level)
    se = float(d.std(ddof=1) / math.sqrt(n))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * se
    return Paired(tuple(d.tolist()), n, mean, se, mean - half, mean + half, level)


def equivalence(p: Paired, margin: float) -> str:
    """A verdict on a paired difference against a declared equivalence margin.

    "equivalent": the interval lies inside (−margin, +margin) (with a 90%
    interval, the two one-sided tests at 5% each); else "above" / "below": the
    interval excludes 0 on that side; else "inconclusive" (neither: more seeds
    would be needed to say). "no pairs" with fewer than two pairs.
    """
    if margin <= 0:
        raise ValueError(f"equivalence margin must be > 0, got {margin}")
    if p.n < 2:
        return "no pairs"
    if -margin < p.lo and p.hi < margin:
        return "equivalent"
    if p.lo > 0:
        return "above"
    if p.hi < 0:
        return "below"
    return "inconclusive"


@dataclasses.dataclass(frozen=True)
class Command:
    """A study command: `run` it (writes `results.json`, renders) or `render` its outputs.

    Attributes:
      config: the default config file.
      workdir: the default output directory.
      section: the docs page's marker (its `--readme`/`--docs` section).
      run: `(config, workdir, readme, docs, **extra) -> analysis`.
      render: `(workdir, readme, docs) -> anything` from `workdir/results.json`.
      extend: the command takes `--extend` (run only the runs results.json lacks).
    """

    config: str
    workdir: str
    section: str
    run: Callable
    render: Callable
    extend: bool = False


def command_main(command: Command) -> Callable[[list[str]], None]:
    """Defines the study's flags (--config, --workdir, --readme, --docs, --render_only and,
    where the command has it, --extend) and returns its absl `main`."""
    from absl import app, flags
    from ml_collections import config_flags

    cfg = config_flags.DEFINE_config_file(
        "config", command.config, "Study config.", lock_config=True
    )
    workdir = flags.DEFINE_string("workdir", command.workdir, "Where outputs go.")
    readme = flags.DEFINE_string(
        "readme", None, f"README to update between the {command.section}-headline markers."
    )
    docs = flags.DEFINE_string(
        "docs", None, f"Page to update between the {command.section} markers (default: "
        "the study's page in docs/ beside --readme).",
    )  # fmt: skip
    render_only = flags.DEFINE_bool(
        "render_only", False, "Only re-render from --workdir/results.json (no runs)."
    )
    extend = None
    if command.extend:
        extend = flags.DEFINE_bool(
            "extend", False, "Run only the runs --workdir/results.json lacks (same config "
            "but the run lists).",
        )  # fmt: skip

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
        if render_only.value:
            command.render(workdir.value, readme.value, docs.value)
            return
        extra = {"extend": extend.value} if extend is not None else {}
        command.run(cfg.value, workdir.value, readme.value, docs.value, **extra)

    return main
