"""Structural checks of a built-in board: what makes `builtin build` exit 1.

`board_checks` places three reference submissions on a board and states the
result as shares; on test sets of 45-180 rows those checks measure which rows
the split drew, so they are diagnostics. A board is broken, whatever the rows,
when (`structural_problems`):

* its task does not load (`task.load_task`: among others, grader-side files
  reachable from `public/`), or a public file is a copy of the private answers,
  or `public/test.csv` carries the answer column;
* its leaderboard cannot be read, or holds a score that is not finite;
* it lacks the sample submission (`public/sample_submission.csv` missing, not
  gradable, or its score not on the board), the default baseline
  (`ensembles.BASELINE_ENTRY`) or any tuned ensemble;
* it holds fewer entries than the ladder promises (`promised_entries`);
* its order disagrees with the metric's direction: the best tuned ensemble
  does not beat the sample submission (the constant prior).

Example:
    >>> structural_problems(f"{root}/iris")                   # doctest: +SKIP
    []
"""

from __future__ import annotations

import csv
import hashlib
import os

import numpy as np

from wmrl_jax.envs import ensembles, grading, ladder, metrics, suite
from wmrl_jax.envs import task as task_lib

SAMPLE_FILE = "sample_submission.csv"


def promised_entries(*, classification: bool) -> int:
    """Entries a built-in board holds: the ladder's single models (`ladder.population`),
    the default baseline and `ensembles.NUM_ENSEMBLES` tuned ensembles."""
    singles = ladder.population(seed=0, classification=classification, n_train=100)
    return len(singles) + 1 + ensembles.NUM_ENSEMBLES


def _sha256(path: str) -> bytes:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


def _leaks(task: task_lib.Task, root: str) -> list[str]:
    """Copies of the private answers in `public/`, and an answer column in its test.csv."""
    out = []
    answers = _sha256(os.path.join(root, "private", "answers.csv"))
    for dirpath, _, names in os.walk(task.public_dir):
        for name in names:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and _sha256(path) == answers:
                out.append(f"public file {os.path.relpath(path, root)} is a copy of the answers")
    test = os.path.join(task.public_dir, "test.csv")
    if os.path.isfile(test):
        with open(test, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
        if task.submission.answer_column in header:
            column = task.submission.answer_column
            out.append(f"public/test.csv carries the answer column {column!r}")
    return out


def _read_board(path: str) -> tuple[list[str], np.ndarray]:
    """(entry names, scores of shape [N]); a score that is not a number is NaN."""
    names, scores = [], []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            names.append(row.get("entry") or "")
            try:
                scores.append(float(row.get("score") or "nan"))
            except ValueError:
                scores.append(float("nan"))
    return names, np.asarray(scores, dtype=np.float64)


def structural_problems(task_dir: str) -> list[str]:
    """One line per structural failure of the built-in board at `task_dir`; [] when sound.

    See the module docstring for the checks. Never raises for a broken board.
    """
    try:
        task = task_lib.load_task(task_dir)
    except task_lib.ManifestError as e:
        return [f"task does not load: {e}"]
    problems = _leaks(task, task_dir)
    board_path = os.path.join(task_dir, "private", "leaderboards", f"{task.leaderboards[0]}.csv")
    try:
        names, board = _read_board(board_path)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        return [*problems, f"cannot read the board {board_path}: {e}"]
    bad = [n for n, s in zip(names, board, strict=True) if not np.isfinite(s)]
    if bad:
        problems.append(f"non-finite score for {len(bad)} entries, e.g. {bad[:3]}")
    try:
        classification = suite.spec_by_id(task.id).classification
    except ValueError:
        return [*problems, f"{task.id!r} is not a built-in suite task"]
    promised = promised_entries(classification=classification)
    if len(board) < promised:
        problems.append(f"the board holds {len(board)} entries, the ladder promises {promised}")
    if ensembles.BASELINE_ENTRY not in names:
        problems.append(f"the board lacks the default baseline {ensembles.BASELINE_ENTRY!r}")
    ens = [s for n, s in zip(names, board, strict=True) if n.startswith(ensembles.ENSEMBLE_PREFIX)]
    if not ens:
        problems.append(f"the board lacks tuned ensembles ({ensembles.ENSEMBLE_PREFIX}*)")
    sample_path = os.path.join(task.public_dir, SAMPLE_FILE)
    if not os.path.isfile(sample_path):
        return [*problems, f"the board lacks the sample submission: no public/{SAMPLE_FILE}"]
    try:
        sample = grading.grade(task, sample_path)
    except grading.TaskError as e:
        return [*problems, f"cannot grade: {e}"]
    if not sample.valid:
        return [*problems, f"the sample submission does not grade: {sample.message}"]
    if not np.any(np.isclose(board, sample.score, rtol=1e-9, atol=0.0)):
        problems.append(f"the board lacks the sample submission (score {sample.score!r})")
    finite = [s for s in ens if np.isfinite(s)]
    if finite:
        sign = 1.0 if task.metric.direction == metrics.HIGHER else -1.0
        best = max(sign * s for s in finite)
        if not best > sign * sample.score:
            problems.append(
                f"the board's order disagrees with {task.metric.direction}-is-better: its best "
                f"ensemble ({sign * best!r}) does not beat the sample submission "
                f"({sample.score!r})"
            )
    return problems
