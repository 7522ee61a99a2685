"""Grading outside the sandbox: submission -> score -> leaderboard percentile -> reward.

Only this module reads a task's `private/` directory. A submission's failures
are results, never exceptions: `grade` returns an invalid `GradeResult` with
an error kind. A broken task side (no answers file, an empty board, a board
without a `score` column, an answer that is NaN or infinite, answers a named
metric cannot score, such as one class for `auc`) is not the program's fault:
it raises `TaskError` with one line naming the file (`check_task` finds it
before any grading).

Memory: a submission larger than its cap is rejected unread, and one under it
is parsed row by row into an array of shape [N, K] (N test ids, K target
columns), stopping at the first row past N; the grader's memory is then
O(N * K) whatever the file holds. The cap is the task's `limits.submission_mb`
when given, else derived from the answers (`submission_cap`).

Percentile rules (scores first oriented so that higher is better; N = board size):

* ``mid_rank`` (default): (#strictly worse + 0.5 * #ties) / N.
* ``mle_dojo``: (#strictly worse + #ties) / N, i.e. ties count as beaten.
* ``beat_ratio``: #strictly worse / N.

Each rule is averaged over the task's boards (MLE-Dojo averages its public and
private boards); `rank` and `board_size` refer to the first board.

Example:
    >>> percentile(0.5, [0.1, 0.5, 0.9], direction="higher", rule="mid_rank")
    0.5
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import importlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from wmrl_jax.envs import metrics
from wmrl_jax.envs.task import Task, check_grader

ERROR_KINDS = ("missing", "unparseable", "invalid_format", "metric_error")
MiB = 1 << 20


class TaskError(ValueError):
    """A task's grader side (answers, leaderboards) is missing or malformed; names the file."""


@dataclasses.dataclass(frozen=True)
class GradeResult:
    """The outcome of grading one submission.

    Attributes:
        valid: whether the submission was scored.
        error_kind: None when valid, else one of `ERROR_KINDS`.
        message: a short human-readable reason when invalid.
        score: the raw metric value (None when invalid).
        percentile: leaderboard percentile in [0, 1] (None when invalid).
        rank: 1 + number of entries strictly better on the first board.
        board_size: number of entries on the first board.
    """

    valid: bool
    error_kind: str | None = None
    message: str = ""
    score: float | None = None
    percentile: float | None = None
    rank: int | None = None
    board_size: int | None = None


def _oriented(score: float, board: np.ndarray, direction: str) -> tuple[float, np.ndarray]:
    if direction == metrics.LOWER:
        return -score, -board
    if direction == metrics.HIGHER:
        return score, board
    raise ValueError(f"direction must be one of {metrics.DIRECTIONS}, got {direction!r}")


def percentile(score: float, board: Sequence[float], *, direction: str, rule: str) -> float:
    """The percentile of `score` on one leaderboard `board` under `rule`, in [0, 1]."""
    board_arr = np.asarray(board, dtype=np.float64)
    if board_arr.ndim != 1 or board_arr.size == 0:
        raise ValueError(f"board must be a non-empty list of scores, got shape {board_arr.shape}")
    s, b = _oriented(float(score), board_arr, direction)
    worse, ties = float(np.sum(b < s)), float(np.sum(b == s))
    weight = {"mid_rank": 0.5, "mle_dojo": 1.0, "beat_ratio": 0.0}.get(rule)
    if weight is None:
        raise ValueError(f"unknown percentile rule {rule!r}")
    return min(1.0, max(0.0, (worse + weight * ties) / board_arr.size))


def rank(score: float, board: Sequence[float], *, direction: str) -> int:
    """1 + the number of board entries strictly better than `score`."""
    s, b = _oriented(float(score), np.asarray(board, dtype=np.float64), direction)
    return 1 + int(np.sum(b > s))


def read_leaderboard(path: str) -> np.ndarray:
    """The `score` column of a leaderboard CSV, of shape [N], N >= 1, all finite.

    Raises:
        TaskError: the file is missing, has no `score` column, no rows, or a
            score that is not a finite number.
    """
    name = os.path.basename(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            if "score" not in (reader.fieldnames or ()):
                raise TaskError(f"leaderboard {path!r} has no 'score' column")
            scores = np.asarray([float(row["score"]) for row in reader], dtype=np.float64)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise TaskError(f"cannot read leaderboard {path!r}: {e}") from e
    except (TypeError, ValueError) as e:  # a short row (None) or a non-number
        if isinstance(e, TaskError):
            raise
        raise TaskError(f"leaderboard {name} has a score that is not a number: {e}") from e
    if scores.size == 0 or not np.all(np.isfinite(scores)):
        raise TaskError(
            f"leaderboard {path!r} has no finite scores (it needs one or more, all finite)"
        )
    return scores


def _private_dir(task: Task) -> str:
    # Grader side only; deliberately not a property of Task.
    return os.path.join(task._root, "private")


def load_leaderboards(task: Task) -> dict[str, np.ndarray]:
    """Grader side: the task's boards, name -> scores of shape [N].

    Raises:
        TaskError: a board is missing or malformed (see `read_leaderboard`).
    """
    root = os.path.join(_private_dir(task), "leaderboards")
    return {name: read_leaderboard(os.path.join(root, f"{name}.csv")) for name in task.leaderboards}


class _Answers(NamedTuple):
    index: dict[str, int]  # test id -> row of `truth`
    truth: np.ndarray  # [N]
    file_bytes: int


def _load_answers(task: Task) -> _Answers:
    """The test ids and the truth of shape [N], read row by row.

    Raises:
        TaskError: no answers file, a missing column, a duplicate id or a
            non-numeric answer.
    """
    spec = task.submission
    path = os.path.join(_private_dir(task), "answers.csv")
    index: dict[str, int] = {}
    truth: list[float] = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            if spec.id_column not in header or spec.answer_column not in header:
                raise TaskError(
                    f"answers {path!r} lack the id {spec.id_column!r} or answer "
                    f"{spec.answer_column!r} column (header {header})"
                )
            i_id, i_y = header.index(spec.id_column), header.index(spec.answer_column)
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header) or row[i_id] in index:
                    raise TaskError(f"answers {path!r}: bad or duplicate row {row[:3]}")
                index[row[i_id]] = len(truth)
                truth.append(float(row[i_y]))
        size = os.path.getsize(path)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise TaskError(f"cannot read answers {path!r}: {e}") from e
    except ValueError as e:
        if isinstance(e, TaskError):
            raise
        raise TaskError(f"answers {path!r} hold a non-numeric answer: {e}") from e
    if not truth:
        raise TaskError(f"answers {path!r} have no rows")
    y = np.asarray(truth, dtype=np.float64)
    if not np.all(np.isfinite(y)):
        bad = next(i for i, v in index.items() if not math.isfinite(y[v]))
        raise TaskError(
            f"answers {path!r}: column {spec.answer_column!r} holds {y[index[bad]]} for id "
            f"{bad!r}; every answer must be a finite number"
        )
    _check_truth(task, y, path)
    return _Answers(index, y, size)


def _check_truth(task: Task, y: np.ndarray, path: str) -> None:
    """Raises `TaskError` when the named metric cannot score answers `y` of shape [N]
    (every submission would then be blamed, or scored against nothing)."""
    name, k = task.metric.name, len(task.submission.target_columns)
    labels = np.unique(y)
    if name == "auc" and k == 1:  # one score column: any two label values
        if labels.size != 2:
            raise TaskError(
                f"answers {path!r}: auc needs both classes among the answers, found "
                f"{labels.size} distinct value(s)"
            )
    elif name in ("log_loss", "auc"):  # one probability column per class
        if np.any(labels != np.round(labels)) or labels[0] < 0 or labels[-1] >= k:
            raise TaskError(
                f"answers {path!r}: {name} needs class indices 0..{k - 1} (one per target "
                f"column), found {labels[:5].tolist()}"
            )
        missing = sorted(set(range(k)) - set(labels.astype(int).tolist()))
        if name == "auc" and missing:
            raise TaskError(
                f"answers {path!r}: auc needs every class among the answers; class(es) "
                f"{missing} never occur"
            )


def check_task(task: Task) -> None:
    """Reads the task's answers and boards once; raises `TaskError` naming what is broken:
    a missing or malformed file, an answer that is not a finite number, answers the
    named metric cannot score (`auc` on one class, `log_loss` labels outside the
    target columns)."""
    _load_answers(task)
    load_leaderboards(task)


def grader_digest(task: Task) -> str:
    """sha256 over everything grading reads besides the submission: the answers file,
    every board file and the manifest's grading fields (metric, submission spec,
    percentile rule, board names). Any edit of them changes it.

    Raises:
        TaskError: a file cannot be read.
    """
    h = hashlib.sha256()
    config = {
        "metric": dataclasses.asdict(task.metric),
        "submission": dataclasses.asdict(task.submission),
        "percentile_rule": task.percentile_rule,
        "leaderboards": list(task.leaderboards),
    }
    h.update(json.dumps(config, sort_keys=True).encode() + b"\0")
    rels = ["answers.csv", *(os.path.join("leaderboards", f"{b}.csv") for b in task.leaderboards)]
    for rel in rels:
        path = os.path.join(_private_dir(task), rel)
        try:
            with open(path, "rb") as f:
                content = hashlib.sha256(f.read()).digest()
        except OSError as e:
            raise TaskError(f"cannot read {path!r}: {e}") from e
        h.update(rel.encode() + b"\0" + content)
    return h.hexdigest()


def submission_cap(task: Task, answers_rows: int, answers_bytes: int) -> int:
    """Largest submission read: `limits.submission_mb` MiB, else 1 MiB + 2 x the answers
    file + 32 bytes per row and target column (a float printed in full is <= 24)."""
    if "submission_mb" in task.limits:
        return int(task.limits["submission_mb"] * MiB)
    width = len(task.submission.target_columns) + 1
    return MiB + 2 * answers_bytes + 32 * width * answers_rows


def _metric_fn(task: Task):
    if task.metric.name is not None:
        return metrics.METRICS[task.metric.name].fn
    module, _, name = check_grader(task.metric.grader).partition(":")
    return getattr(importlib.import_module(module), name)


def _invalid(kind: str, message: str) -> GradeResult:
    return GradeResult(valid=False, error_kind=kind, message=message)


def _read_submission(path: str, task: Task, answers: _Answers) -> np.ndarray | GradeResult:
    """Predictions of shape [N, K] in the answers' row order, or the invalid result."""
    spec = task.submission
    n = answers.truth.shape[0]
    # utf-8-sig: tolerate the byte-order mark some spreadsheet tools write.
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return _invalid("unparseable", "cannot read submission as CSV: empty file")
        missing_cols = [c for c in (spec.id_column, *spec.target_columns) if c not in header]
        s_id = None if missing_cols else header.index(spec.id_column)
        cols = [] if missing_cols else [header.index(c) for c in spec.target_columns]
        y_pred = np.full((n, len(spec.target_columns)), np.nan, dtype=np.float64)
        seen = np.zeros(n, dtype=bool)
        rows = known = 0
        bad_number = None
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                return _invalid(
                    "unparseable",
                    "cannot read submission as CSV: rows do not all have as many fields as the"
                    " header",
                )
            if missing_cols:
                continue  # only the structure is checked on: it decides the error kind
            rows += 1
            if rows > n:
                return _invalid(
                    "invalid_format",
                    f"submission ids must match the {n} test ids exactly once (more than {n} rows)",
                )
            i = answers.index.get(row[s_id])
            if i is None or seen[i]:
                continue
            seen[i] = True
            known += 1
            try:
                y_pred[i] = [float(row[c]) for c in cols]
            except ValueError as e:
                bad_number = bad_number or str(e)
    if missing_cols:
        return _invalid("invalid_format", f"submission lacks columns {missing_cols}")
    if rows != n or known != n:
        return _invalid(
            "invalid_format",
            f"submission ids must match the {n} test ids exactly once "
            f"(got {rows} rows, {known} known ids)",
        )
    if bad_number is not None:
        return _invalid("invalid_format", f"non-numeric prediction: {bad_number}")
    if not np.all(np.isfinite(y_pred)):
        return _invalid("invalid_format", "predictions contain NaN or infinity")
    return y_pred


def grade(
    task: Task,
    submission_path: str | os.PathLike[str] | None,
    *,
    max_bytes: int | None = None,
) -> GradeResult:
    """Grades the submission file at `submission_path` against the task's answers.

    Args:
        task: the task, from `load_task`.
        submission_path: the submission CSV (None or absent -> error kind "missing").
        max_bytes: larger files are rejected unread ("invalid_format"); default
            (and upper bound) `submission_cap`, so that a runaway program cannot
            exhaust the grader's memory.

    Returns:
        A `GradeResult`; never raises for a bad submission.

    Raises:
        TaskError: the task's answers or boards are missing or malformed.
    """
    spec = task.submission
    answers = _load_answers(task)
    boards = load_leaderboards(task)
    if submission_path is None or not os.path.isfile(submission_path):
        return _invalid("missing", f"no submission file {spec.file!r}")
    cap = submission_cap(task, answers.truth.shape[0], answers.file_bytes)
    cap = cap if max_bytes is None else min(cap, max_bytes)
    size = os.path.getsize(submission_path)
    if size > cap:
        return _invalid("invalid_format", f"submission is {size} bytes, over {cap}")
    try:
        y_pred = _read_submission(os.fspath(submission_path), task, answers)
    except (UnicodeDecodeError, csv.Error) as e:
        return _invalid("unparseable", f"cannot read submission as CSV: {e}")
    if isinstance(y_pred, GradeResult):
        return y_pred
    try:
        score = float(_metric_fn(task)(answers.truth, y_pred))
    except Exception as e:  # Any metric failure is a result, not a crash.
        return _invalid("metric_error", f"{type(e).__name__}: {e}")
    if not math.isfinite(score):
        return _invalid("metric_error", f"metric returned {score}")
    direction, rule = task.metric.direction, task.percentile_rule
    pcts = [percentile(score, b, direction=direction, rule=rule) for b in boards.values()]
    pct = float(np.mean(pcts))
    first = boards[task.leaderboards[0]]
    return GradeResult(
        valid=True,
        score=score,
        percentile=pct,
        rank=rank(score, first, direction=direction),
        board_size=int(first.size),
    )


class RewardFloors(NamedTuple):
    """Rewards for outcomes without a valid score.

    Default ordering: any valid submission (percentile in [0, 1]) > invalid
    submission (the program ran, the file is wrong) > error / killed >
    timeout / oom. `infra_error` is the sandbox's fault, not the program's:
    its floor is None, meaning "no reward; re-run or mask this sample".
    """

    invalid: float = -0.25
    error: float = -0.5
    killed: float = -0.5
    timeout: float = -0.75
    oom: float = -0.75
    infra_error: float | None = None


DEFAULT_FLOORS = RewardFloors()
STATUSES = ("ok", "error", "timeout", "oom", "killed", "infra_error")


def reward(
    grade_result: GradeResult | None,
    *,
    status: str = "ok",
    floors: RewardFloors | Mapping[str, float | None] = DEFAULT_FLOORS,
) -> float | None:
    """The training reward: the percentile if valid, else the floor for the outcome.

    Args:
        grade_result: the grading outcome (may be None when `status` is not "ok").
        status: the sandbox status, one of `STATUSES`.
        floors: floors per outcome (`RewardFloors` or a mapping with its fields).

    Returns:
        A float, or None for `infra_error` under the default floors.
    """
    if status not in STATUSES:
        raise ValueError(f"unknown sandbox status {status!r}; expected one of {STATUSES}")
    table = floors._asdict() if isinstance(floors, RewardFloors) else dict(floors)
    if status != "ok":
        return table[status]
    if grade_result is None or not grade_result.valid:
        return table["invalid"]
    return grade_result.percentile
