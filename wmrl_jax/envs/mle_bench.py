"""MLE-bench prepared competitions mapped onto the task contract, with Kaggle medals.

Upstream layout: a competition's *spec* directory (in the MLE-bench source tree)
and its prepared data under a data root::

    <spec>/config.yaml        # id, name, awards_medals, dataset.{answers, sample_submission},
                              #   grader.{name, grade_fn: "module:function"}
    <spec>/description.md     # shown to the agent
    <spec>/grade.py           # grade(submission_df, answers_df) -> float
    <spec>/leaderboard.csv    # the Kaggle board, best first, with a `score` column
    <data>/<id>/prepared/public/...      # incl. the sample submission
    <data>/<id>/prepared/private/...     # incl. the answers (`dataset.answers`, relative to <data>)

`make_task` writes a linked view in the contract's layout (see `mle_dojo`;
no data is copied) with the direction stored explicitly in the manifest:
lower-is-better is *inferred* as MLE-bench does (the board's first score is
below its last), then recorded, so a later board edit cannot flip it silently.

`grade` scores a submission as MLE-bench does: with the upstream `grade_fn`
when its package is importable (else the contract's metric through
`grading.grade`), the score rounded to 5 decimals, then the leaderboard
percentile (the task's rule) and the Kaggle medal.

Kaggle medal thresholds (Kaggle's progression system page, "Competition
medals"; the same table MLE-bench applies), N = number of teams on the board:

    N          gold                 silver      bronze
    1-99       top 10%              top 20%     top 40%
    100-249    top 10               top 20%     top 40%
    250-999    top 10 + 0.2% of N   top 50      top 100
    1000+      top 10 + 0.2% of N   top 5%      top 10%

("top 10 + 0.2%": one extra gold place per 500 teams.) A position "top p%"
is floor(p * N), at least 1; the threshold is the board's score at that
position (best first), and a score at least as good as it earns the medal.
Only the best medal counts; `above_median` is strictly better than the median.

Example:
    >>> comp = load_competition("mlebench/competitions/x", "data")    # doctest: +SKIP
    >>> task = make_task(comp, "views/x", split="held-out")            # doctest: +SKIP
    >>> outcome = grade(comp, task, "submission.csv")                  # doctest: +SKIP
    >>> outcome.medal, outcome.result.percentile                       # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import yaml

from wmrl_jax.envs import grading, metrics
from wmrl_jax.envs import task as task_lib
from wmrl_jax.envs.mle_dojo import (
    CompetitionError,
    PrivateMountError,
    check_mount,
    check_numeric_column,
    csv_header,
    sandbox_mounts,
    write_view,
)

__all__ = ["CompetitionError", "PrivateMountError", "check_mount", "sandbox_mounts"]

SCORE_DECIMALS = 5
DEFAULT_LIMITS = {"wall_seconds": 3600, "memory_mb": 32768, "cpus": 4}
MEDALS = ("gold", "silver", "bronze")


# ---- config.yaml ---------------------------------------------------------------------


def parse_config(text: str) -> dict[str, Any]:
    """Parses config.yaml with PyYAML's `safe_load`; CompetitionError unless it is a mapping."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise CompetitionError(f"config.yaml is not valid YAML: {e}") from e
    if not isinstance(loaded, dict):
        raise CompetitionError("config.yaml is not a mapping")
    return loaded


# ---- competitions ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Competition:
    """One prepared MLE-bench competition, as found on disk (nothing copied).

    Attributes:
        id: the competition id (`config.yaml` `id`).
        config: the parsed `config.yaml`.
        description_path, leaderboard_path: in the spec directory.
        public_dir, private_dir: `<data>/<id>/prepared/{public,private}`.
        answers_path, sample_submission_path: from `config.yaml` `dataset`.
        grade_fn: the upstream grader entry point "module:function".
        board: leaderboard scores in file order (best first), of shape [N].
        lower_is_better: inferred from `board` (first score below the last).
    """

    id: str
    config: Mapping[str, Any]
    description_path: str
    leaderboard_path: str
    public_dir: str
    private_dir: str
    answers_path: str
    sample_submission_path: str
    grade_fn: str
    board: np.ndarray = dataclasses.field(repr=False, compare=False)
    lower_is_better: bool


def is_lower_better(board: Sequence[float]) -> bool:
    """MLE-bench's inference: lower is better iff the first (top) score < the last."""
    board = np.asarray(board, dtype=np.float64)
    if board.ndim != 1 or board.size == 0:
        raise ValueError(f"board must be a non-empty list of scores, got shape {board.shape}")
    return bool(board[0] < board[-1])


def _require(mapping: Any, dotted: str) -> Any:
    value: Any = mapping
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or value.get(part) in (None, ""):
            raise CompetitionError(f"config.yaml field {dotted!r} is missing")
        value = value[part]
    return value


def load_competition(
    spec_dir: str | os.PathLike[str], data_dir: str | os.PathLike[str]
) -> Competition:
    """Finds and checks one competition: its spec directory and its prepared data.

    Args:
        spec_dir: the directory holding config.yaml, description.md, grade.py, leaderboard.csv.
        data_dir: the data root that `config.yaml` `dataset` paths are relative to.

    Raises:
        CompetitionError: a file or config field is missing, the board has no
            `score` column or is empty; the message names what is wrong.
    """
    spec, data = os.path.abspath(os.fspath(spec_dir)), os.path.abspath(os.fspath(data_dir))
    files = {n: os.path.join(spec, n) for n in ("config.yaml", "description.md", "grade.py")}
    files["leaderboard.csv"] = os.path.join(spec, "leaderboard.csv")
    for name, path in files.items():
        if not os.path.isfile(path):
            raise CompetitionError(f"competition spec {spec!r} has no {name}")
    with open(files["config.yaml"], encoding="utf-8") as f:
        config = parse_config(f.read())
    comp_id = str(_require(config, "id"))
    grade_fn = str(_require(config, "grader.grade_fn"))
    if grade_fn.count(":") != 1:
        raise CompetitionError("config.yaml field 'grader.grade_fn' must be 'module:function'")
    prepared = os.path.join(data, comp_id, "prepared")
    public, private = os.path.join(prepared, "public"), os.path.join(prepared, "private")
    for d in (public, private):
        if not os.path.isdir(d):
            raise CompetitionError(f"competition {comp_id!r} has no {os.path.relpath(d, data)}/")
    answers = os.path.join(data, str(_require(config, "dataset.answers")))
    sample = os.path.join(data, str(_require(config, "dataset.sample_submission")))
    for field, path, inside in (
        ("answers", answers, private),
        ("sample_submission", sample, public),
    ):
        if not os.path.isfile(path):
            raise CompetitionError(f"competition {comp_id!r}: dataset.{field} {path!r} is missing")
        if not os.path.realpath(path).startswith(os.path.realpath(inside) + os.sep):
            raise CompetitionError(
                f"competition {comp_id!r}: dataset.{field} is not under {inside!r}"
            )
    if "score" not in csv_header(files["leaderboard.csv"]):
        raise CompetitionError(f"competition {comp_id!r}: leaderboard.csv has no 'score' column")
    try:
        board = grading.read_leaderboard(files["leaderboard.csv"])
    except ValueError as e:
        raise CompetitionError(f"competition {comp_id!r}: leaderboard.csv: {e}") from e
    if board.size == 0 or not np.all(np.isfinite(board)):
        raise CompetitionError(f"competition {comp_id!r}: leaderboard.csv has no finite scores")
    return Competition(
        id=comp_id,
        config=config,
        description_path=files["description.md"],
        leaderboard_path=files["leaderboard.csv"],
        public_dir=public,
        private_dir=private,
        answers_path=answers,
        sample_submission_path=sample,
        grade_fn=grade_fn,
        board=board,
        lower_is_better=is_lower_better(board),
    )


# ---- medals ------------------------------------------------------------------------------


class MedalThresholds(NamedTuple):
    """Scores to match or beat for each medal (see the module docstring), and the median."""

    gold: float
    silver: float
    bronze: float
    median: float


def medal_positions(n_teams: int) -> tuple[int, int, int]:
    """(gold, silver, bronze) last medal positions, 1-based, for a board of `n_teams`."""
    if n_teams < 1:
        raise ValueError(f"a board needs at least one team, got {n_teams}")

    def top(fraction: float) -> int:
        return max(1, math.floor(n_teams * fraction))

    if n_teams < 100:
        return top(0.1), top(0.2), top(0.4)
    if n_teams < 250:
        return 10, top(0.2), top(0.4)
    extra_gold = 10 + math.floor(n_teams * 0.002)
    if n_teams < 1000:
        return extra_gold, 50, 100
    return extra_gold, top(0.05), top(0.1)


def medal_thresholds(board: Sequence[float], *, lower_is_better: bool) -> MedalThresholds:
    """Kaggle's medal thresholds on `board` (scores of shape [N], any order)."""
    scores = np.sort(np.asarray(board, dtype=np.float64))
    if scores.ndim != 1 or scores.size == 0:
        raise ValueError(f"board must be a non-empty list of scores, got shape {scores.shape}")
    best_first = scores if lower_is_better else scores[::-1]
    gold, silver, bronze = (float(best_first[p - 1]) for p in medal_positions(scores.size))
    return MedalThresholds(gold, silver, bronze, float(np.median(scores)))


def medal(score: float, thresholds: MedalThresholds, *, lower_is_better: bool) -> str | None:
    """The best medal `score` earns ("gold" / "silver" / "bronze"), or None."""
    for name, threshold in zip(MEDALS, thresholds[:3], strict=True):
        if (score <= threshold) if lower_is_better else (score >= threshold):
            return name
    return None


# ---- tasks and grading ----------------------------------------------------------------


def make_task(
    competition: Competition,
    out_dir: str | os.PathLike[str],
    *,
    split: str | Mapping[str, str],
    metric: Mapping[str, str] | None = None,
    answer_column: str | None = None,
    percentile_rule: str = "mid_rank",
    limits: Mapping[str, float] | None = None,
) -> task_lib.Task:
    """Maps `competition` onto the task contract as a linked view at `out_dir`.

    Args:
        competition: from `load_competition`.
        out_dir: where the view (manifest + links) is written.
        split: "train" / "held-out", or a mapping competition id -> split.
        metric: {"name": ..., "direction": ...} or {"grader": ..., "direction": ...};
            default: `config.yaml` `grader.name` when it names a contract metric,
            with the inferred direction.
        answer_column: the truth column (default: the sample submission's single
            non-id column); the submission columns are the sample submission's.
        percentile_rule: one of `task.PERCENTILE_RULES`.
        limits: sandbox limits (default `DEFAULT_LIMITS`).

    Raises:
        CompetitionError: no usable metric, a metric whose direction contradicts
            the board, an ambiguous / missing / non-numeric answer column.
    """
    if isinstance(split, Mapping):
        if competition.id not in split:
            raise CompetitionError(f"competition {competition.id!r} is in neither split")
        split = split[competition.id]
    direction = metrics.LOWER if competition.lower_is_better else metrics.HIGHER
    if metric is None:
        name = competition.config.get("grader", {}).get("name")
        if name not in metrics.METRICS:
            raise CompetitionError(
                f"competition {competition.id!r}: grader {name!r} is not a contract metric; "
                "pass metric={'name': ..., 'direction': ...}"
            )
        metric = {"name": name, "direction": direction}
    if metric.get("direction") != direction:
        raise CompetitionError(
            f"competition {competition.id!r}: metric direction {metric.get('direction')!r} "
            f"contradicts the leaderboard, which is {direction}-is-better"
        )
    id_column, *targets = csv_header(competition.sample_submission_path)
    answers_header = csv_header(competition.answers_path)
    if answer_column is None:
        if len(targets) != 1:
            raise CompetitionError(
                f"competition {competition.id!r} submits columns {targets}; pass answer_column"
            )
        answer_column = targets[0]
    if answer_column not in answers_header or id_column not in answers_header:
        raise CompetitionError(
            f"answers {answers_header} lack the id {id_column!r} or answer {answer_column!r} column"
        )
    check_numeric_column(competition.answers_path, answer_column)
    manifest = {
        "format_version": task_lib.FORMAT_VERSION,
        "id": competition.id,
        "source": "mle-bench",
        "split": split,
        "metric": dict(metric),
        "submission": {
            "file": "submission.csv",
            "id_column": id_column,
            "target_columns": targets,
            "answer_column": answer_column,
        },
        "limits": dict(limits or DEFAULT_LIMITS),
        "percentile_rule": percentile_rule,
        "leaderboards": ["private"],
    }
    return write_view(
        out_dir,
        manifest=manifest,
        public_dir=competition.public_dir,
        description=competition.description_path,
        answers=competition.answers_path,
        boards={"private": competition.leaderboard_path},
    )


def upstream_grader(
    competition: Competition, *, read_frame: Callable[[str], Any] | None = None
) -> Callable[[str], float] | None:
    """`score(submission_path)` with the upstream `grade_fn`, or None when not installed.

    Args:
        competition: the competition.
        read_frame: reads a CSV into what `grade_fn` expects (default `pandas.read_csv`).
    """
    module, _, name = competition.grade_fn.partition(":")
    try:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return None
        fn = getattr(importlib.import_module(module), name)
        if read_frame is None:
            import pandas

            read_frame = pandas.read_csv
    except ImportError:
        return None
    return lambda path: float(fn(read_frame(path), read_frame(competition.answers_path)))


class BenchGrade(NamedTuple):
    """A graded MLE-bench submission.

    Attributes:
        result: the contract's `GradeResult` (score rounded to 5 decimals).
        medal: "gold" / "silver" / "bronze" or None (None when invalid).
        above_median: strictly better than the board's median.
        thresholds: the board's medal thresholds.
        upstream: whether a scorer other than the contract's metric (by default
            the upstream `grade_fn`) produced the score.
    """

    result: grading.GradeResult
    medal: str | None
    above_median: bool
    thresholds: MedalThresholds
    upstream: bool


def grade(
    competition: Competition,
    task: task_lib.Task,
    submission_path: str | os.PathLike[str] | None,
    *,
    scorer: Callable[[str], float] | None = None,
) -> BenchGrade:
    """Grades a submission as MLE-bench does; never raises for a bad submission.

    Args:
        competition: from `load_competition`.
        task: its view, from `make_task`.
        submission_path: the submission CSV.
        scorer: `score(path)`; default `upstream_grader(competition)`, and the
            contract's metric via `grading.grade` when that is None.
    """
    lower = task.metric.direction == metrics.LOWER
    thresholds = medal_thresholds(competition.board, lower_is_better=lower)
    scorer = upstream_grader(competition) if scorer is None else scorer
    if scorer is None:
        result = grading.grade(task, submission_path)
    elif submission_path is None or not os.path.isfile(submission_path):
        result = grading.GradeResult(
            False, "missing", f"no submission file {task.submission.file!r}"
        )
    else:
        try:
            score = float(scorer(os.fspath(submission_path)))
        except Exception as e:  # Upstream graders signal invalid submissions by raising.
            result = grading.GradeResult(False, "invalid_format", f"{type(e).__name__}: {e}")
        else:
            result = (
                grading.GradeResult(valid=True, score=score)
                if math.isfinite(score)
                else grading.GradeResult(False, "metric_error", f"grader returned {score}")
            )
    if not result.valid:
        return BenchGrade(result, None, False, thresholds, scorer is not None)
    score = round(result.score, SCORE_DECIMALS)
    direction, rule = task.metric.direction, task.percentile_rule
    boards = grading.load_leaderboards(task)
    pct = [grading.percentile(score, b, direction=direction, rule=rule) for b in boards.values()]
    first = boards[task.leaderboards[0]]
    result = grading.GradeResult(
        valid=True,
        score=score,
        percentile=float(np.mean(pct)),
        rank=grading.rank(score, first, direction=direction),
        board_size=int(first.size),
    )
    above = score < thresholds.median if lower else score > thresholds.median
    return BenchGrade(
        result,
        medal(score, thresholds, lower_is_better=lower),
        bool(above),
        thresholds,
        scorer is not None,
    )
