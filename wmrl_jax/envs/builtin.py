"""The built-in offline suite with its synthetic leaderboards: the one command.

    python -m wmrl_jax.envs.builtin build --out DIR [--seed 0] [--workers 2] [--only ID,ID]
    python -m wmrl_jax.envs.builtin noise [--seed 0] [--workers 2] [--only ID,ID] [--resamples 200]

Each task (`suite`) gets a board of a few hundred competitors (`ladder`):
single models really fitted in parallel worker processes and scored on the
private answers, then tuned ensembles built from the candidates' out-of-fold
predictions on the training data only. Every file is byte-identical across
builds of one seed except `private/fit_predict_seconds.csv` (wall-clock
fit-and-predict seconds per entry). The command prints `check_board` for every
task and exits non-zero if a board fails that is not in `KNOWN_FAILING_BOARDS`.
`noise` refits the boards in memory and reports how often the baseline and
ensemble checks hold over bootstrap draws of each task's test rows
(`check_noise`): on test sets of 45-180 rows a check can be decided by which
rows the split drew.

Example:
    >>> root = cached_suite(seed=0)              # doctest: +SKIP
    >>> check_board(f"{root}/iris").passed       # doctest: +SKIP
    True
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import fcntl
import functools
import hashlib
import multiprocessing
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import sklearn
from scipy import stats
from sklearn import linear_model, preprocessing

from wmrl_jax.envs import grading, ladder, metrics, report, suite
from wmrl_jax.envs import task as task_lib

# The default baseline (`default_blend`): the average of the BLEND_TOP untuned off-the-shelf
# models (`default_*` entries: scikit-learn defaults, scaled inputs) with the best 3-fold CV
# score on the training data, what a competitor submits first after trying the usual models.
BASELINE_ENTRY = "default_blend"
BLEND_TOP = 5
ENSEMBLE_PREFIX = "ensemble_"
NUM_ENSEMBLES = 60
# Hedges a tuned classifier ensemble chooses from by out-of-fold score (`_tuned_hedge`).
HEDGE_GRID = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
SECONDS_FILE = "fit_predict_seconds.csv"
# The board checks: the sample submission at or below SAMPLE_MAX, the baseline
# within BASELINE_WINDOW, the best tuned ensemble at or above ENSEMBLE_MIN.
SAMPLE_MAX = 0.10
BASELINE_WINDOW = (0.5, 0.75)
ENSEMBLE_MIN = 0.95
# Boards of the seed-0 suite that miss a check, and why; `build` reports them
# but fails only on others. `noise` gives the share of bootstrap draws of the
# test rows where both checks hold: iris 0.15, wine 0.16.
# iris (45 test rows): tuned ensembles follow one 3-fold split's ranking, led by
# boosting (log-loss 0.06 out of fold, 0.18 over repeated splits, 0.35 on test);
# the best lands at 0.870, below lucky simple models, and the blend at 0.767.
# wine (53 test rows): the blend of five diverse defaults (0.088) is beaten by
# 3 of 173 single entries and 9 of 60 ensembles, so it lands at 0.947.
KNOWN_FAILING_BOARDS = ("iris", "wine")
_CHUNK = 8


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
        flag = "ok  " if self.passed else "FAIL"
        return (
            f"{flag} {self.task_id:22s} n={self.board_size} sample={self.sample:.3f} "
            f"baseline={self.baseline:.3f} ensemble={self.ensemble:.3f} ({self.ensemble_entry})"
        )


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
    ok = (s <= SAMPLE_MAX, bool(_baseline_ok(b)), e >= ENSEMBLE_MIN)
    return BoardCheck(task.id, len(board), s, b, e, best, *ok)


def _baseline_ok(percentile):
    """Whether the baseline's percentile (a float or an array) lies in `BASELINE_WINDOW`."""
    return np.logical_and(percentile >= BASELINE_WINDOW[0], percentile <= BASELINE_WINDOW[1])


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


class _Candidate(NamedTuple):
    name: str
    family: str
    oof: np.ndarray  # [N] or [N, C]
    pred: np.ndarray  # [M] or [M, C]
    fit_s: float
    cv_s: float
    hedge: float = ladder._HEDGE  # Uniform-mixture weight in a classifier's oof and pred.


def _unhedged(c: _Candidate) -> _Candidate:
    """`c` with its raw probabilities: the inverse of the entry's uniform-mixture hedge.

    A competitor ensembling their own models averages what the models predict and
    clips once, for the ensemble. Regressors are returned as they are.
    """
    if c.oof.ndim == 1:
        return c
    raw = lambda p: ladder.unhedged(p, c.hedge)
    return c._replace(oof=raw(c.oof), pred=raw(c.pred), hedge=0.0)


def _tuned_hedge(oof: np.ndarray, y: np.ndarray, metric: str) -> float:
    """The `HEDGE_GRID` value with the best out-of-fold score for raw probabilities `oof`.

    Ties go to the smaller hedge. Clipping is the one knob log-loss rewards on a
    task a model nearly solves: too little and one confident mistake dominates,
    too much and every confident right answer pays for it.
    """
    scores = [_oof_score(metric, y, ladder.hedged(oof, h)) for h in HEDGE_GRID]
    return HEDGE_GRID[int(np.argmax(scores))]


def _oof_score(metric: str, y: np.ndarray, pred: np.ndarray) -> float:
    """The metric on training rows, oriented so that higher is better."""
    if metric == "auc" and pred.ndim == 2 and pred.shape[1] == 2:
        # Rank form of binary ROC AUC (ties averaged), as roc_auc_score, without its overhead.
        ranks, pos = stats.rankdata(pred[:, 1]), y == 1
        n1 = int(pos.sum())
        return (ranks[pos].sum() - n1 * (n1 + 1) / 2) / max(1, n1 * (len(y) - n1))
    if pred.ndim == 2 and metric == "accuracy":
        pred = np.argmax(pred, axis=1).astype(np.float64)
    value = metrics.METRICS[metric].fn(
        y.astype(np.float64), pred if pred.ndim == 2 else pred[:, None]
    )
    return value if metrics.METRICS[metric].direction == metrics.HIGHER else -value


def _greedy(pool, y, score: Callable[[np.ndarray], float], rounds: int) -> list[int]:
    """Caruana et al. (2004) ensemble selection with replacement on out-of-fold predictions.

    `score` maps an out-of-fold average to a higher-is-better value.
    """
    chosen, total = [], 0.0
    for r in range(rounds):
        trial = [score((total + c.oof) / (r + 1)) for c in pool]
        chosen.append(int(np.argmax(trial)))
        total = total + pool[chosen[-1]].oof
    return chosen


def default_blend(
    members: Sequence[_Candidate], y_train: np.ndarray, *, metric: str
) -> tuple[np.ndarray, list[str]]:
    """The default baseline: the average of the `BLEND_TOP` members with the best CV score.

    A competitor's first submission after trying the usual untuned models: score
    each by 3-fold cross-validation on the training data, keep the best
    `BLEND_TOP` (ties keep the given order) and average their test predictions.

    Args:
        members: candidates with out-of-fold predictions of shape [N] or [N, C].
        y_train: training targets of shape [N].
        metric: the task metric.

    Returns:
        (test predictions of shape [M] or [M, C], the chosen names in CV order).
    """
    if not members:
        raise ValueError("default_blend needs at least one member")
    scores = [_oof_score(metric, y_train, c.oof) for c in members]
    top = sorted(range(len(members)), key=lambda j: -scores[j])[:BLEND_TOP]
    return np.mean([members[j].pred for j in top], axis=0), [members[j].name for j in top]


def _stack(pool, y, *, num_classes: int | None, strength: float) -> np.ndarray:
    """Stacking (Wolpert, 1992): a regularised linear model on the pool's out-of-fold predictions.

    Classifiers stack log-probabilities with a multinomial logistic regression
    (inverse strength C = 1 / `strength`), hedged like the entries; regressors
    stack predictions with ridge (alpha = `strength`). Returns test predictions.
    """
    if num_classes is None:
        feats = lambda c: c[:, None]
        model = linear_model.Ridge(alpha=strength)
    else:
        feats = lambda c: np.log(np.clip(c, 1e-6, 1.0))
        model = linear_model.LogisticRegression(C=1.0 / strength, max_iter=500)
    x_oof = np.concatenate([feats(c.oof) for c in pool], axis=1)
    x_test = np.concatenate([feats(c.pred) for c in pool], axis=1)
    scaler = preprocessing.StandardScaler().fit(x_oof)
    model.fit(scaler.transform(x_oof), y)
    if num_classes is None:
        return model.predict(scaler.transform(x_test))
    proba = np.zeros((len(x_test), num_classes))
    proba[:, model.classes_] = model.predict_proba(scaler.transform(x_test))
    return ladder.hedged(proba, ladder._HEDGE)


def tuned_ensembles(
    candidates: Sequence[_Candidate], y_train: np.ndarray, *, metric: str, seed: int
) -> list[tuple[str, np.ndarray, float]]:
    """`NUM_ENSEMBLES` ensembles tuned on out-of-fold predictions only; (name, pred, seconds).

    Three kinds, each over a seeded random pool of the candidates: greedy
    ensemble selection with replacement, the average of the top k by
    cross-validated score, and stacking of the top k (`_stack`) with a drawn
    regularisation strength. Classifier averages combine the members' raw
    probabilities (`_unhedged`), are selected with the entries' 1% hedge, and
    are then hedged once by the `_tuned_hedge` of their out-of-fold average;
    an average of members' hedges would carry a clipping nobody tuned.
    Seconds: the pool's cross-validation, the chosen members' full fits, and
    the selection.
    """
    rng = np.random.default_rng([seed, 11])
    classifier = candidates[0].oof.ndim == 2
    selection_hedge = (lambda p: ladder.hedged(p, ladder._HEDGE)) if classifier else (lambda p: p)
    score = lambda p: _oof_score(metric, y_train, selection_hedge(p))
    raw = [_unhedged(c) for c in candidates]
    out = []
    for k in range(NUM_ENSEMBLES):
        start = time.perf_counter()
        size = max(2, int(round(rng.uniform(0.6, 1.0) * len(candidates))))
        idx = np.sort(rng.choice(len(candidates), size, replace=False))
        pool = [raw[i] for i in idx]
        scores = np.array([score(c.oof) for c in pool])
        kind = ("greedy", "top", "stack")[k % 3]
        if kind == "stack":
            chosen = list(np.argsort(-scores, kind="stable")[: int(rng.integers(3, 11))])
            num_classes = pool[0].oof.shape[1] if classifier else None
            strength = float(np.exp(rng.uniform(np.log(0.3), np.log(30.0))))
            members = [candidates[idx[i]] for i in chosen]  # As the entries predict.
            pred = _stack(members, y_train, num_classes=num_classes, strength=strength)
        else:
            if kind == "greedy":
                chosen = _greedy(pool, y_train, score, int(rng.integers(15, 40)))
            else:
                chosen = list(np.argsort(-scores, kind="stable")[: int(rng.integers(2, 13))])
            pred = np.mean([pool[i].pred for i in chosen], axis=0)
            if classifier:
                oof = np.mean([pool[i].oof for i in chosen], axis=0)
                pred = ladder.hedged(pred, _tuned_hedge(oof, y_train, metric))
        sec = sum(c.cv_s for c in pool) + sum(pool[i].fit_s for i in set(chosen))
        out.append((f"{ENSEMBLE_PREFIX}{kind}{k}", pred, sec + time.perf_counter() - start))
    return out


def _init_worker() -> None:
    from threadpoolctl import threadpool_limits

    # One core per worker; also keeps results independent of the thread count.
    threadpool_limits(1)


@functools.lru_cache(maxsize=4)
def _task(task_id: str, seed: int):
    spec = suite.spec_by_id(task_id)
    data = suite.split_task(spec, seed=seed)
    entries = ladder.population(
        seed=data.task_seed, classification=spec.classification, n_train=len(data.y_train)
    )
    cv = ladder.folds(data.y_train, classification=spec.classification, seed=data.task_seed)
    return spec, data, entries, cv


def _fit_chunk(task_id: str, seed: int, indices: Sequence[int]) -> list[tuple]:
    """Worker: fits entries `indices`; (index, test pred, oof pred, fit s, cv s) each."""
    _, data, entries, cv = _task(task_id, seed)
    out = []
    for i in indices:
        entry, kw = entries[i], {"num_classes": data.num_classes, "seed": data.task_seed + i}
        start = time.perf_counter()
        pred = ladder.fit_predict(entry, data.x_train, data.y_train, data.x_test, **kw)
        fit_s = time.perf_counter() - start
        oof, cv_s = None, 0.0
        if entry.cv:
            start = time.perf_counter()
            oof = ladder.oof_predict(entry, data.x_train, data.y_train, cv_folds=cv, **kw)
            cv_s = time.perf_counter() - start
        out.append((i, pred, oof, fit_s, cv_s))
    return out


def _ensemble_task(task_id: str, seed: int, results: list[tuple]) -> list[tuple]:
    """Worker: the default blend, then the tuned ensembles; (name, pred, seconds) each."""
    spec, data, entries, _ = _task(task_id, seed)
    results = sorted(results, key=lambda r: r[0])  # Chunks arrive in completion order.
    candidates = [
        _Candidate(entries[i].name, entries[i].family, oof, pred, fit_s, cv_s, entries[i].hedge)
        for i, pred, oof, fit_s, cv_s in results
        if oof is not None
    ]
    members = [c for c in candidates if c.family == "default"]
    pred, _ = default_blend(members, data.y_train, metric=spec.metric)
    blend = (BASELINE_ENTRY, pred, sum(c.fit_s + c.cv_s for c in members))
    return [
        blend,
        *tuned_ensembles(candidates, data.y_train, metric=spec.metric, seed=data.task_seed),
    ]


def _write_board(spec, root, data, entries, results, ens) -> None:
    rows, seconds = [], []
    for i, pred, _, fit_s, _ in sorted(results, key=lambda r: r[0]):
        rows.append((entries[i].name, suite.score_predictions(spec, data.y_test, pred)))
        seconds.append((entries[i].name, fit_s))
    for name, pred, sec in ens:
        rows.append((name, suite.score_predictions(spec, data.y_test, pred)))
        seconds.append((name, sec))
    suite.write_leaderboard(root, rows)
    with open(os.path.join(root, "private", SECONDS_FILE), "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["entry", "seconds"])
        # Floor at 1 microsecond: a recorded cost is always positive.
        writer.writerows((n, f"{max(s, 1e-6):.6f}") for n, s in seconds)


def build(
    out_dir: str,
    *,
    seed: int = 0,
    workers: int = 2,
    only: Sequence[str] | None = None,
) -> list[str]:
    """Writes the suite (or the tasks in `only`) with leaderboards; returns task dirs.

    Args:
        out_dir: created if absent; existing built-in task dirs are replaced.
        seed: suite seed; the same seed gives byte-identical files except the
            seconds file.
        workers: worker processes fitting the competitors.
        only: task ids to build (suite order kept); unknown ids raise ValueError.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    specs = suite.select_specs(only)
    os.makedirs(out_dir, exist_ok=True)
    written = {s.id: suite.write_task(s, out_dir, seed=seed) for s in specs}
    fitted = _fit_boards(specs, seed=seed, workers=workers)
    for spec in specs:
        root, data = written[spec.id]
        _write_board(spec, root, data, _task(spec.id, seed)[2], *fitted[spec.id])
    return [written[s.id][0] for s in specs]


def _fit_boards(specs, *, seed: int, workers: int) -> dict[str, tuple[list, list]]:
    """Fits every board of `specs` in worker processes; task id -> (results, ensembles).

    results: (index, test pred, oof pred, fit s, cv s) per entry (`_fit_chunk`);
    ensembles: (name, test pred, seconds) per entry (`_ensemble_task`).
    """
    pending, results, ens = {}, {s.id: [] for s in specs}, {}
    ctx = multiprocessing.get_context("spawn")  # No fork: callers may hold threads (JAX).
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_init_worker
    ) as pool:
        # Largest tasks first so the last chunks are small.
        for spec in sorted(specs, key=lambda s: -_task(s.id, seed)[1].x_train.size):
            n = len(_task(spec.id, seed)[2])
            for lo in range(0, n, _CHUNK):
                fut = pool.submit(_fit_chunk, spec.id, seed, range(lo, min(n, lo + _CHUNK)))
                pending[fut] = spec.id
            results[spec.id] = [None] * ((n + _CHUNK - 1) // _CHUNK)
        chunks = {s.id: 0 for s in specs}
        while pending:
            done, _ = concurrent.futures.wait(
                pending, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for fut in done:
                task_id = pending.pop(fut)
                if task_id in ens and fut is ens[task_id]:
                    ens[task_id] = fut.result()
                    continue
                chunk = fut.result()
                results[task_id][chunks[task_id]] = chunk
                chunks[task_id] += 1
                if chunks[task_id] == len(results[task_id]):
                    results[task_id] = [r for c in results[task_id] for r in c]
                    ens[task_id] = pool.submit(_ensemble_task, task_id, seed, results[task_id])
                    pending[ens[task_id]] = task_id
    return {s.id: (results[s.id], ens[s.id]) for s in specs}


class NoiseCheck(NamedTuple):
    """How often a board's baseline and ensemble checks hold when its test rows are resampled.

    Attributes:
        task_id: the task; n_test: its test rows; resamples: bootstrap draws.
        baseline, ensemble: percentiles on the real test rows (as `check_board`).
        baseline_band, ensemble_band: their 5th and 95th percentiles over the draws.
        p_baseline, p_ensemble, p_both: the share of draws where the baseline
            check, the ensemble check, or both hold.
    """

    task_id: str
    n_test: int
    resamples: int
    baseline: float
    baseline_band: tuple[float, float]
    p_baseline: float
    ensemble: float
    ensemble_band: tuple[float, float]
    p_ensemble: float
    p_both: float

    def line(self) -> str:
        b, e = self.baseline_band, self.ensemble_band
        return (
            f"{self.task_id:22s} test rows={self.n_test:4d} "
            f"baseline={self.baseline:.3f} [{b[0]:.2f}, {b[1]:.2f}] P(ok)={self.p_baseline:.2f}  "
            f"ensemble={self.ensemble:.3f} [{e[0]:.2f}, {e[1]:.2f}] P(ok)={self.p_ensemble:.2f}  "
            f"P(both)={self.p_both:.2f}"
        )


def resampled_checks(
    names: Sequence[str],
    preds: Sequence[np.ndarray],
    y_test: np.ndarray,
    *,
    score: Callable[[np.ndarray, np.ndarray], float],
    direction: str,
    rule: str,
    resamples: int,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Baseline and best-ensemble percentiles on bootstrap resamples of the test rows.

    Each draw rescores every entry on the same resampled rows, so the board
    moves with them; the best `ensemble_*` entry is picked again per draw, as
    `check_board` picks it on the real rows. Draws where the metric is
    undefined (`score` raises ValueError or gives NaN, as AUC on one class)
    are skipped.

    Args:
        names: entry names, including `BASELINE_ENTRY` and `ensemble_*` entries.
        preds: their test predictions, each of shape [M] or [M, C].
        y_test: test targets of shape [M].
        score: (y, pred) -> the task metric.
        direction, rule: the task's metric direction and percentile rule.
        resamples: bootstrap draws; seed: seeds them.

    Returns:
        (baseline, ensemble) percentiles, each of shape [draws kept].
    """
    rng = np.random.default_rng([seed, 13])
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
        out.append(_positions(names, board, direction=direction, rule=rule)[:2])
    pct = np.asarray(out, dtype=np.float64).reshape(-1, 2)
    return pct[:, 0], pct[:, 1]


def check_noise(
    only: Sequence[str] | None = None,
    *,
    seed: int = 0,
    workers: int = 2,
    resamples: int = 200,
) -> list[NoiseCheck]:
    """Refits the boards in memory (no files) and bootstraps their test rows.

    A check that holds on the real rows but in few draws, or fails on them but
    holds in many, is decided by which rows the test split drew rather than by
    the board's population. Same arguments as `build`; `resamples` draws each.
    """
    specs = suite.select_specs(only)
    fitted = _fit_boards(specs, seed=seed, workers=workers)
    band = lambda x: (float(np.percentile(x, 5)), float(np.percentile(x, 95)))
    out = []
    for spec in specs:
        _, data, entries, _ = _task(spec.id, seed)
        results, ens = fitted[spec.id]
        named = [(entries[i].name, pred) for i, pred, *_ in sorted(results, key=lambda r: r[0])]
        named += [(name, pred) for name, pred, _ in ens]
        names, preds = [n for n, _ in named], [p for _, p in named]
        kw = {"direction": metrics.METRICS[spec.metric].direction, "rule": "mid_rank"}
        score = functools.partial(suite.score_predictions, spec)
        board = np.array([score(data.y_test, p) for p in preds])
        b0, e0, _ = _positions(names, board, **kw)
        b, e = resampled_checks(
            names, preds, data.y_test, score=score, resamples=resamples, seed=seed, **kw
        )
        b_ok, e_ok = _baseline_ok(b), e >= ENSEMBLE_MIN
        p_ok = [float(x.mean()) for x in (b_ok, e_ok, b_ok & e_ok)]
        out.append(
            NoiseCheck(
                spec.id, len(data.y_test), len(b), b0, band(b), p_ok[0], e0, band(e), *p_ok[1:]
            )
        )
    return out


def _source_key(seed: int) -> str:
    h = hashlib.sha256(f"seed={seed};sklearn={sklearn.__version__};np={np.__version__}".encode())
    for module in (sys.modules[__name__], suite, ladder, metrics, report, task_lib):
        with open(module.__file__, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def cache_root() -> str:
    """`$XDG_CACHE_HOME/wmrl_jax` (default `~/.cache/wmrl_jax`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "wmrl_jax")


def cached_suite(seed: int = 0, *, workers: int = 2) -> str:
    """The full suite for `seed`, built once per generator source and seed; returns its dir.

    The cache key hashes the generator's source files, the seed and the
    scikit-learn / numpy versions. A file lock makes concurrent callers (test
    workers) build once; the build goes to a temporary dir renamed into place.
    """
    root = os.path.join(cache_root(), "builtin")
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"{_source_key(seed)}-seed{seed}")
    with open(final + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(final):
            tmp = f"{final}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp, seed=seed, workers=workers)
            os.rename(tmp, final)
    return final


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("build", help="write the suite with its leaderboards and check them")
    cmd.add_argument("--out", required=True, help="output directory")
    noise = sub.add_parser(
        "noise", help="refit the boards in memory and bootstrap their test rows (no files)"
    )
    noise.add_argument("--resamples", type=int, default=200, help="bootstrap draws per board")
    for p in (cmd, noise):
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--workers", type=int, default=2, help="worker processes")
        p.add_argument("--only", default=None, help="comma-separated task ids")
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    try:
        suite.select_specs(only)
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
    except ValueError as e:
        parser.error(str(e))
    start = time.perf_counter()
    if args.command == "noise":
        if args.resamples < 1:
            parser.error(f"--resamples must be >= 1, got {args.resamples}")
        for check in check_noise(only, seed=args.seed, workers=args.workers,
                                 resamples=args.resamples):  # fmt: skip
            print(check.line())
        print(f"P(ok): share of {args.resamples} bootstrap draws of the test rows where the check"
              f" holds; [5th, 95th] percentiles; {time.perf_counter() - start:.1f} s")  # fmt: skip
        return 0
    checks = [
        check_board(path)
        for path in build(args.out, seed=args.seed, workers=args.workers, only=only)
    ]
    known = KNOWN_FAILING_BOARDS if args.seed == 0 else ()
    for check in checks:
        note = not check.passed and check.task_id in known
        print(check.line() + ("  (known: KNOWN_FAILING_BOARDS)" if note else ""))
    failed = [c.task_id for c in checks if not c.passed]
    unexpected = [t for t in failed if t not in known]
    print(
        f"{len(checks)} tasks in {time.perf_counter() - start:.1f} s; {len(failed)} boards fail"
        f" ({len(failed) - len(unexpected)} known, {len(unexpected)} unexpected)"
    )
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
