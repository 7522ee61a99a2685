"""Grading outside the sandbox: submission -> score -> leaderboard percentile -> reward.

Only this module reads a task's `private/` directory. Failures are results,
never exceptions: `grade` returns an invalid `GradeResult` with an error kind.

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
import importlib
import math
import os
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from wmrl_jax.envs import metrics
from wmrl_jax.envs.task import Task

ERROR_KINDS = ("missing", "unparseable", "invalid_format", "metric_error")


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
    """The `score` column of a leaderboard CSV, of shape [N]."""
    with open(path, newline="", encoding="utf-8") as f:
        return np.asarray([float(row["score"]) for row in csv.DictReader(f)], dtype=np.float64)


def _private_dir(task: Task) -> str:
    # Grader side only; deliberately not a property of Task.
    return os.path.join(task._root, "private")


def load_leaderboards(task: Task) -> dict[str, np.ndarray]:
    """Grader side: the task's boards, name -> scores of shape [N]."""
    root = os.path.join(_private_dir(task), "leaderboards")
    return {name: read_leaderboard(os.path.join(root, f"{name}.csv")) for name in task.leaderboards}


def _read_csv(path: str) -> tuple[list[str], list[list[str]]]:
    # utf-8-sig: tolerate the byte-order mark some spreadsheet tools write.
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError("empty file")
    header, body = rows[0], [r for r in rows[1:] if r]
    if any(len(r) != len(header) for r in body):
        raise ValueError("rows do not all have as many fields as the header")
    return header, body


def _metric_fn(task: Task):
    if task.metric.name is not None:
        return metrics.METRICS[task.metric.name].fn
    module, _, name = task.metric.grader.partition(":")
    return getattr(importlib.import_module(module), name)


def _invalid(kind: str, message: str) -> GradeResult:
    return GradeResult(valid=False, error_kind=kind, message=message)


def grade(
    task: Task,
    submission_path: str | os.PathLike[str] | None,
    *,
    max_bytes: int = 256 * 2**20,
) -> GradeResult:
    """Grades the submission file at `submission_path` against the task's answers.

    Args:
        task: the task, from `load_task`.
        submission_path: the submission CSV (None or absent -> error kind "missing").
        max_bytes: larger files are rejected unread ("invalid_format"), so a
            runaway program cannot exhaust the grader's memory.

    Returns:
        A `GradeResult`; never raises for a bad submission.
    """
    spec = task.submission
    if submission_path is None or not os.path.isfile(submission_path):
        return _invalid("missing", f"no submission file {spec.file!r}")
    size = os.path.getsize(submission_path)
    if size > max_bytes:
        return _invalid("invalid_format", f"submission is {size} bytes, over {max_bytes}")
    try:
        header, body = _read_csv(os.fspath(submission_path))
    except (ValueError, UnicodeDecodeError, csv.Error) as e:
        return _invalid("unparseable", f"cannot read submission as CSV: {e}")
    needed = (spec.id_column, *spec.target_columns)
    missing_cols = [c for c in needed if c not in header]
    if missing_cols:
        return _invalid("invalid_format", f"submission lacks columns {missing_cols}")
    a_header, a_body = _read_csv(os.path.join(_private_dir(task), "answers.csv"))
    a_id, a_col = a_header.index(spec.id_column), a_header.index(spec.answer_column)
    truth = {row[a_id]: float(row[a_col]) for row in a_body}
    s_id = header.index(spec.id_column)
    ids = [row[s_id] for row in body]
    if len(ids) != len(set(ids)) or set(ids) != set(truth):
        return _invalid(
            "invalid_format",
            f"submission ids must match the {len(truth)} test ids exactly once "
            f"(got {len(ids)} rows, {len(set(ids) & set(truth))} known ids)",
        )
    cols = [header.index(c) for c in spec.target_columns]
    try:
        y_pred = np.asarray([[float(row[c]) for c in cols] for row in body], dtype=np.float64)
    except ValueError as e:
        return _invalid("invalid_format", f"non-numeric prediction: {e}")
    if not np.all(np.isfinite(y_pred)):
        return _invalid("invalid_format", "predictions contain NaN or infinity")
    y_true = np.asarray([truth[i] for i in ids], dtype=np.float64)
    try:
        score = float(_metric_fn(task)(y_true, y_pred))
    except Exception as e:  # Any metric failure is a result, not a crash.
        return _invalid("metric_error", f"{type(e).__name__}: {e}")
    if not math.isfinite(score):
        return _invalid("metric_error", f"metric returned {score}")
    boards = load_leaderboards(task)
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
