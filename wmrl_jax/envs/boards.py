"""Fitting the built-in suite's boards: every competitor of every task, in worker processes.

Each task's board (`ladder.population`) holds single models fitted in chunks
across worker processes and scored on the private answers, then the default
baseline and the tuned ensembles (`ensembles`) built from the candidates'
out-of-fold predictions on the training rows. `fit_boards` returns the
predictions in memory (the board checks bootstrap them); `write_board` writes a
task's leaderboard and its fit-and-predict seconds.

Example:
    >>> specs = suite.select_specs(["iris"])                  # doctest: +SKIP
    >>> results, ens = fit_boards(specs, seed=0, workers=2)["iris"]  # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures
import csv
import functools
import multiprocessing
import os
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import tqdm

from wmrl_jax.envs import ensembles, ladder, suite

SECONDS_FILE = "fit_predict_seconds.csv"
_CHUNK = 8


class TaskBoard(NamedTuple):
    """One task before fitting: its spec, split data, competitors and CV folds."""

    spec: suite.TaskSpec
    data: suite.TaskData
    entries: list[ladder.Entry]
    folds: list[np.ndarray]


def _init_worker() -> None:
    from threadpoolctl import threadpool_limits

    # One core per worker; also keeps results independent of the thread count.
    threadpool_limits(1)


@functools.lru_cache(maxsize=4)
def task_board(task_id: str, seed: int) -> TaskBoard:
    """The task's spec, data, competitors and folds for suite `seed` (cached per process)."""
    spec = suite.spec_by_id(task_id)
    data = suite.split_task(spec, seed=seed)
    entries = ladder.population(
        seed=data.task_seed, classification=spec.classification, n_train=len(data.y_train)
    )
    cv = ladder.folds(data.y_train, classification=spec.classification, seed=data.task_seed)
    return TaskBoard(spec, data, entries, cv)


def _fit_chunk(task_id: str, seed: int, indices: Sequence[int]) -> list[tuple]:
    """Worker: fits entries `indices`; (index, test pred, oof pred, fit s, cv s) each."""
    _, data, entries, cv = task_board(task_id, seed)
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
    spec, data, entries, _ = task_board(task_id, seed)
    results = sorted(results, key=lambda r: r[0])  # Chunks arrive in completion order.
    candidates = [
        ensembles.Candidate(
            entries[i].name, entries[i].family, oof, pred, fit_s, cv_s, entries[i].hedge
        )
        for i, pred, oof, fit_s, cv_s in results
        if oof is not None
    ]
    members = [c for c in candidates if c.family == "default"]
    pred, _ = ensembles.default_blend(members, data.y_train, metric=spec.metric)
    blend = (ensembles.BASELINE_ENTRY, pred, sum(c.fit_s + c.cv_s for c in members))
    tuned = ensembles.tuned_ensembles(
        candidates, data.y_train, metric=spec.metric, seed=data.task_seed
    )
    return [blend, *tuned]


def fit_boards(
    specs: Sequence[suite.TaskSpec], *, seed: int, workers: int
) -> dict[str, tuple[list, list]]:
    """Fits every board of `specs` in worker processes; task id -> (results, ensembles).

    results: (index, test pred, oof pred, fit s, cv s) per entry, in entry order;
    ensembles: (name, test pred, seconds) per blend or ensemble entry.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    pending, results, ens = {}, {s.id: [] for s in specs}, {}
    ctx = multiprocessing.get_context("spawn")  # No fork: callers may hold threads (JAX).
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_init_worker
    ) as pool:
        # Largest tasks first so the last chunks are small.
        for spec in sorted(specs, key=lambda s: -task_board(s.id, seed).data.x_train.size):
            n = len(task_board(spec.id, seed).entries)
            for lo in range(0, n, _CHUNK):
                fut = pool.submit(_fit_chunk, spec.id, seed, range(lo, min(n, lo + _CHUNK)))
                pending[fut] = spec.id
            results[spec.id] = [None] * ((n + _CHUNK - 1) // _CHUNK)
        chunks = {s.id: 0 for s in specs}
        # A bar on a terminal (hidden in logs): fitted chunks, then one ensemble job per task.
        bar = tqdm.tqdm(
            total=len(pending) + len(specs), desc="fitting boards", unit="job", disable=None
        )
        while pending:
            done, _ = concurrent.futures.wait(
                pending, return_when=concurrent.futures.FIRST_COMPLETED
            )
            bar.update(len(done))
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
        bar.close()
    return {s.id: (sorted(results[s.id], key=lambda r: r[0]), ens[s.id]) for s in specs}


def named_predictions(task_id: str, seed: int, fitted: tuple[list, list]) -> list[tuple]:
    """(entry name, test predictions) of every board entry, in board order."""
    entries = task_board(task_id, seed).entries
    results, ens = fitted
    return [(entries[i].name, pred) for i, pred, *_ in results] + [(n, p) for n, p, _ in ens]


def write_board(root: str, task_id: str, seed: int, fitted: tuple[list, list]) -> None:
    """Writes the task's leaderboard and `private/SECONDS_FILE` from `fit_boards` output."""
    spec, data, entries, _ = task_board(task_id, seed)
    results, ens = fitted
    rows, seconds = [], []
    for i, pred, _, fit_s, _ in results:
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
