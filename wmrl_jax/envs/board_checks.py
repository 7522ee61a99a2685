"""The built-in boards' checks, stated as shares.

A board is useful when three reference submissions land where a real
competition puts them: the sample submission (the constant prior) at or below
`SAMPLE_MAX`, the default baseline within `BASELINE_WINDOW`, the best tuned
ensemble at or above `ENSEMBLE_MIN`. On test sets of 45-180 rows a check is
decided by which rows the split drew, so the checks are diagnostics, not a
gate: `check_board` places the three on the written board, `passing_share`
counts the boards passing all three, and `check_noise` gives each board's
bootstrap share, the share of resamples of its test rows in which all three
checks hold. What fails a build is structural (`board_structure`). Nothing
here tunes a competitor; the checks only read the boards.

Example:
    >>> checks = [check_board(f"{root}/{t}") for t in ids]   # doctest: +SKIP
    >>> passing_share(checks)                                # doctest: +SKIP
    0.91
"""

from __future__ import annotations

import csv
import functools
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from wmrl_jax.envs import boards, grading, metrics, suite
from wmrl_jax.envs import task as task_lib
from wmrl_jax.envs.ensembles import BASELINE_ENTRY, ENSEMBLE_PREFIX

SAMPLE_MAX = 0.10
BASELINE_WINDOW = (0.5, 0.75)
ENSEMBLE_MIN = 0.95


class BoardCheck(NamedTuple):
    """Where three reference submissions land on one task's board.

    Attributes:
        task_id: the task; board_size: entries on its board.
        sample: percentile of `public/sample_submission.csv` (the constant prior).
        baseline: percentile of `BASELINE_ENTRY` (`default_blend`).
        ensemble: percentile of the best tuned ensemble (`ensemble_*` entries);
            ensemble_entry names it.
        sample_ok: sample <= `SAMPLE_MAX`; baseline_ok: baseline within
            `BASELINE_WINDOW`; ensemble_ok: ensemble >= `ENSEMBLE_MIN`.
    """

    task_id: str
    board_size: int
    sample: float
    baseline: float
    ensemble: float
    ensemble_entry: str
    sample_ok: bool
    baseline_ok: bool
    ensemble_ok: bool

    @property
    def passed(self) -> bool:
        return self.sample_ok and self.baseline_ok and self.ensemble_ok

    def line(self) -> str:
        flag = "ok  " if self.passed else "miss"
        return (
            f"{flag} {self.task_id:22s} n={self.board_size} sample={self.sample:.3f} "
            f"baseline={self.baseline:.3f} ensemble={self.ensemble:.3f} ({self.ensemble_entry})"
        )


def checks_hold(sample, baseline, ensemble) -> tuple:
    """Whether each check holds, for percentiles given as floats or arrays of one shape."""
    return (
        np.asarray(sample) <= SAMPLE_MAX,
        np.logical_and(
            np.asarray(baseline) >= BASELINE_WINDOW[0], np.asarray(baseline) <= BASELINE_WINDOW[1]
        ),
        np.asarray(ensemble) >= ENSEMBLE_MIN,
    )


def passing_share(checks: Sequence[BoardCheck]) -> float:
    """The share of `checks` whose board passes all three checks; ValueError when empty."""
    if not checks:
        raise ValueError("passing_share needs at least one board check")
    return sum(c.passed for c in checks) / len(checks)


def check_board(task_dir: str) -> BoardCheck:
    """Percentiles of the sample submission, the default baseline and the best ensemble.

    Percentiles use the task's own rule and first board. Raises ValueError when
    the board lacks the baseline or any ensemble entry.
    """
    task = task_lib.load_task(task_dir)
    path = os.path.join(task_dir, "private", "leaderboards", f"{task.leaderboards[0]}.csv")
    with open(path, newline="", encoding="utf-8") as f:
        rows = [(r["entry"], float(r["score"])) for r in csv.DictReader(f)]
    names = [n for n, _ in rows]
    if BASELINE_ENTRY not in names or not any(n.startswith(ENSEMBLE_PREFIX) for n in names):
        raise ValueError(f"{path} lacks {BASELINE_ENTRY!r} or {ENSEMBLE_PREFIX}* entries")
    board = np.array([s for _, s in rows])
    kw = {"direction": task.metric.direction, "rule": task.percentile_rule}
    b, e, best = _positions(names, board, **kw)
    sample = grading.grade(task, os.path.join(task.public_dir, "sample_submission.csv"))
    if not sample.valid:
        raise ValueError(f"{task_dir}: sample submission does not grade: {sample.message}")
    s = sample.percentile
    return BoardCheck(task.id, len(board), s, b, e, best, *map(bool, checks_hold(s, b, e)))


def _positions(names, board: np.ndarray, *, direction: str, rule: str) -> tuple[float, float, str]:
    """Percentiles of `BASELINE_ENTRY` and of the best `ensemble_*` entry on `board`, and
    the best entry's name (ties go to the greater name)."""
    sign = 1.0 if direction == metrics.HIGHER else -1.0
    best = max(
        (sign * s, n) for n, s in zip(names, board, strict=True) if n.startswith(ENSEMBLE_PREFIX)
    )[1]
    pct = lambda n: grading.percentile(
        board[list(names).index(n)], board, direction=direction, rule=rule
    )
    return pct(BASELINE_ENTRY), pct(best), best


class NoiseCheck(NamedTuple):
    """A board's checks on its real test rows and over bootstrap resamples of them.

    Attributes:
        task_id: the task; n_test: its test rows; resamples: bootstrap draws kept.
        sample, baseline, ensemble: percentiles on the real test rows (as `check_board`).
        passed: whether all three checks hold on the real rows.
        baseline_band, ensemble_band: 5th and 95th percentiles over the draws.
        p_sample, p_baseline, p_ensemble: the share of draws where each check holds.
        p_all: the board's bootstrap share, the share of draws where all three hold.
    """

    task_id: str
    n_test: int
    resamples: int
    sample: float
    baseline: float
    ensemble: float
    passed: bool
    baseline_band: tuple[float, float]
    ensemble_band: tuple[float, float]
    p_sample: float
    p_baseline: float
    p_ensemble: float
    p_all: float

    def line(self) -> str:
        b, e = self.baseline_band, self.ensemble_band
        flag = "ok  " if self.passed else "miss"
        return (
            f"{flag} {self.task_id:22s} test rows={self.n_test:4d} "
            f"sample={self.sample:.3f} P(ok)={self.p_sample:.2f}  "
            f"baseline={self.baseline:.3f} [{b[0]:.2f}, {b[1]:.2f}] P(ok)={self.p_baseline:.2f}  "
            f"ensemble={self.ensemble:.3f} [{e[0]:.2f}, {e[1]:.2f}] P(ok)={self.p_ensemble:.2f}  "
            f"P(all)={self.p_all:.2f}"
        )


def resampled_positions(
    names: Sequence[str],
    preds: Sequence[np.ndarray],
    y_test: np.ndarray,
    *,
    sample: str,
    score: Callable[[np.ndarray, np.ndarray], float],
    direction: str,
    rule: str,
    resamples: int,
    seed: int = 0,
) -> np.ndarray:
    """Sample, baseline and best-ensemble percentiles on bootstrap resamples of the test rows.

    Each draw rescores every entry on the same resampled rows, so the board
    moves with them; the best `ensemble_*` entry is picked again per draw, as
    `check_board` picks it on the real rows. Draws where the metric is
    undefined (`score` raises ValueError or gives NaN, as AUC on one class)
    are skipped.

    Args:
        names: entry names, including `sample`, `BASELINE_ENTRY` and `ensemble_*` entries.
        preds: their test predictions, each of shape [M] or [M, C].
        y_test: test targets of shape [M].
        sample: the entry that is the sample submission (the constant prior).
        score: (y, pred) -> the task metric.
        direction, rule: the task's metric direction and percentile rule.
        resamples: bootstrap draws; seed: seeds them.

    Returns:
        Percentiles of shape [draws kept, 3]: sample, baseline, best ensemble.
    """
    rng = np.random.default_rng([seed, 13])
    at = list(names).index(sample)
    out = []
    for _ in range(resamples):
        rows = rng.integers(0, len(y_test), len(y_test))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # AUC on one class warns, then is NaN.
            try:
                board = np.array([score(y_test[rows], p[rows]) for p in preds])
            except ValueError:
                continue
        if not np.all(np.isfinite(board)):
            continue
        s = grading.percentile(board[at], board, direction=direction, rule=rule)
        out.append((s, *_positions(names, board, direction=direction, rule=rule)[:2]))
    return np.asarray(out, dtype=np.float64).reshape(-1, 3)


def check_noise(
    only: Sequence[str] | None = None,
    *,
    seed: int = 0,
    workers: int = 2,
    resamples: int = 200,
    suite_name: str = "core",
) -> list[NoiseCheck]:
    """Fits the boards of suite `seed` in memory (no files) and bootstraps their test rows.

    A check that holds on the real rows but in few draws, or fails on them but
    holds in many, is decided by which rows the test split drew rather than by
    the board's population. Entry 0 of every board is the constant prior that
    `suite.write_task` writes as the sample submission.

    Args:
        only: task ids (default: the whole suite).
        seed: the suite seed.
        workers: worker processes fitting the competitors.
        resamples: bootstrap draws per board.
        suite_name: one of `suite.SUITES`.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    specs = suite.select_specs(only, name=suite_name)
    fitted = boards.fit_boards(specs, seed=seed, workers=workers)
    band = lambda x: (float(np.percentile(x, 5)), float(np.percentile(x, 95)))
    out = []
    for spec in specs:
        _, data, entries, _ = boards.task_board(spec.id, seed)
        named = boards.named_predictions(spec.id, seed, fitted[spec.id])
        names, preds = [n for n, _ in named], [p for _, p in named]
        kw = {"direction": metrics.METRICS[spec.metric].direction, "rule": "mid_rank"}
        score = functools.partial(suite.score_predictions, spec)
        board = np.array([score(data.y_test, p) for p in preds])
        b0, e0, _ = _positions(names, board, **kw)
        s0 = grading.percentile(board[0], board, **kw)
        pos = resampled_positions(
            names, preds, data.y_test, sample=entries[0].name, score=score,
            resamples=resamples, seed=seed, **kw,
        )  # fmt: skip
        holds = checks_hold(pos[:, 0], pos[:, 1], pos[:, 2])
        shares = [float(h.mean()) for h in (*holds, holds[0] & holds[1] & holds[2])]
        out.append(
            NoiseCheck(
                spec.id, len(data.y_test), len(pos), s0, b0, e0,
                all(map(bool, checks_hold(s0, b0, e0))), band(pos[:, 1]), band(pos[:, 2]),
                *shares,
            )
        )  # fmt: skip
    return out


def shares_markdown(per_seed: Mapping[int, Sequence[NoiseCheck]], *, command: str) -> str:
    """The board-check section of docs/tasks.md: per seed, then per board across seeds.

    Args:
        per_seed: suite seed -> `check_noise` results of that seed's boards.
        command: the command line that generated it (printed under the tables).
    """
    seeds = sorted(per_seed)
    lines = [
        "| suite seed | boards passing all three checks | share | mean bootstrap share "
        "| boards missing a check |",
        "|---:|---:|---:|---:|---|",
    ]
    for seed in seeds:
        checks = per_seed[seed]
        passed = sum(c.passed for c in checks)
        share = passed / len(checks)
        missing = ", ".join(c.task_id for c in checks if not c.passed) or "none"
        lines.append(
            f"| {seed} | {passed} / {len(checks)} | {share:.2f} | "
            f"{np.mean([c.p_all for c in checks]):.2f} | {missing} |"
        )
    ids = [c.task_id for c in per_seed[seeds[0]]]
    by_id = {seed: {c.task_id: c for c in per_seed[seed]} for seed in seeds}
    lines += [
        "",
        "| board | split | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---|---|" + "---:|" * len(seeds),
    ]
    for task_id in ids:
        cells = []
        for seed in seeds:
            c = by_id[seed].get(task_id)
            cells.append("" if c is None else f"{c.p_all:.2f}" + ("" if c.passed else " ✗"))
        split = suite.spec_by_id(task_id).split
        lines.append(f"| {task_id} | {split} | " + " | ".join(cells) + " |")
    resamples = max(c.resamples for checks in per_seed.values() for c in checks)
    lines += [
        "",
        "The checks are diagnostics: `build --seed N` prints them and exits 1 only on a "
        "structural failure. Per board: its bootstrap "
        f"share, the share of {resamples} resamples of its test rows in which all three checks "
        "hold; ✗ marks a board that misses a check on its real rows. Generated by "
        f"`{command}`.",
    ]
    return "\n".join(lines)
