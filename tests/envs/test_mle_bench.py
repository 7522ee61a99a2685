"""Tests for the MLE-bench loader on competitions built in the upstream layout."""

import csv
import os

import pytest

from tests.envs.conftest import write_csv
from wmrl_jax.envs import grading, mle_bench
from wmrl_jax.envs import task as task_lib

CONFIG = """\
id: toy-bench
name: Toy Bench
competition_type: simple
awards_medals: true
prizes: null
description: mlebench/competitions/toy-bench/description.md

dataset:
  answers: toy-bench/prepared/private/test.csv
  sample_submission: toy-bench/prepared/public/sample_submission.csv

grader:
  name: {metric}
  grade_fn: {grade_fn}

preparer: mlebench.competitions.toy-bench.prepare:prepare
"""
LOWER_BOARD = [0.1, 0.2, 0.3, 0.4, 0.5]  # Best first: lower is better.


def fake_grade(submission, answers):
    """Stands in for an upstream grade(submission_df, answers_df); rows here are dicts."""
    if len(submission) != len(answers):
        raise ValueError("row count mismatch")
    return 0.2000004


def make_competition(
    root,
    *,
    board=LOWER_BOARD,
    metric="rmse",
    grade_fn="mlebench.competitions.toy-bench.grade:grade",
    answers=((0, 1.0), (1, 2.0), (2, 3.0)),
):
    """(spec dir, data root) exactly as MLE-bench lays them out."""
    spec = root / "mlebench" / "competitions" / "toy-bench"
    spec.mkdir(parents=True)
    (spec / "config.yaml").write_text(CONFIG.format(metric=metric, grade_fn=grade_fn))
    (spec / "description.md").write_text("# Toy Bench\n")
    (spec / "grade.py").write_text("def grade(submission, answers):\n    return 0.0\n")
    write_csv(
        spec / "leaderboard.csv",
        ["teamName", "score", "submissionDate"],
        [(f"team{i}", s, "2020-01-01") for i, s in enumerate(board)],
    )
    data = root / "data"
    prepared = data / "toy-bench" / "prepared"
    (prepared / "public").mkdir(parents=True)
    (prepared / "private").mkdir(parents=True)
    write_csv(prepared / "public" / "train.csv", ["id", "x", "y"], [(9, 0.5, 1.0)])
    write_csv(prepared / "public" / "test.csv", ["id", "x"], [(i, 0.0) for i, _ in answers])
    write_csv(
        prepared / "public" / "sample_submission.csv", ["id", "y"], [(i, 0) for i, _ in answers]
    )
    write_csv(prepared / "private" / "test.csv", ["id", "y"], answers)
    return spec, data


def submit(tmp_path, rows):
    path = tmp_path / "submission.csv"
    write_csv(path, ["id", "y"], rows)
    return str(path)


@pytest.fixture
def bench(tmp_path):
    comp = mle_bench.load_competition(*make_competition(tmp_path))
    return comp, mle_bench.make_task(comp, tmp_path / "view", split="held-out")


def test_load_and_map_onto_contract(tmp_path, bench):
    comp, task = bench
    assert comp.id == "toy-bench" and comp.lower_is_better
    assert comp.grade_fn == "mlebench.competitions.toy-bench.grade:grade"
    assert (task.id, task.source, task.split) == ("toy-bench", "mle-bench", "held-out")
    # The inferred direction is stored explicitly in the manifest.
    assert task.metric == task_lib.MetricSpec(name="rmse", grader=None, direction="lower")
    assert task.submission.target_columns == ("y",) and task.leaderboards == ("private",)
    assert task.description == "# Toy Bench\n"
    assert task_lib.load_task(tmp_path / "view") == task
    assert os.path.samefile(tmp_path / "view" / "private" / "answers.csv", comp.answers_path)
    assert os.path.islink(tmp_path / "view" / "public")


def test_grade_end_to_end_with_contract_metric(tmp_path, bench):
    # Truth 1, 2, 3; predictions 1, 2, 3.5 -> rmse sqrt(0.25 / 3) = 0.2886751... -> 0.28868.
    # Board (lower is better) [0.1 .. 0.5]: 0.3, 0.4, 0.5 worse -> mid-rank 3/5, rank 3.
    # Medals (N = 5): gold / silver at position 1 (0.1), bronze at position 2 (0.2): none.
    # Median 0.3 -> above the median.
    comp, task = bench
    outcome = mle_bench.grade(comp, task, submit(tmp_path, [(0, 1), (1, 2), (2, 3.5)]))
    assert not outcome.upstream  # mlebench is not installed here.
    assert outcome.result.valid and outcome.result.score == 0.28868
    assert outcome.result.percentile == pytest.approx(3 / 5)
    assert (outcome.result.rank, outcome.result.board_size) == (3, 5)
    assert outcome.medal is None and outcome.above_median
    assert outcome.thresholds == mle_bench.MedalThresholds(0.1, 0.1, 0.2, 0.3)
    # The contract's own grade() agrees on everything but the rounding.
    plain = grading.grade(task, submit(tmp_path, [(0, 1), (1, 2), (2, 3.5)]))
    assert plain.score == pytest.approx((0.25 / 3) ** 0.5) and plain.percentile == 0.6
    missing = mle_bench.grade(comp, task, str(tmp_path / "nope.csv"))
    assert missing.result.error_kind == "missing" and missing.medal is None


def test_rounding_changes_ties_and_medals(tmp_path, bench):
    # 0.2000004 rounds to 0.2: a tie with the bronze threshold (bronze, since ties earn
    # the medal) and on the board 3 worse + 1 tie -> mid-rank 3.5 / 5.
    comp, task = bench
    outcome = mle_bench.grade(comp, task, submit(tmp_path, []), scorer=lambda path: 0.2000004)
    assert outcome.upstream and outcome.result.score == 0.2
    assert outcome.result.percentile == pytest.approx(0.7) and outcome.result.rank == 2
    assert outcome.medal == "bronze"
    unrounded = grading.percentile(0.2000004, LOWER_BOARD, direction="lower", rule="mid_rank")
    assert unrounded == pytest.approx(0.6)


def test_upstream_grader_only_when_importable(tmp_path):
    spec, data = make_competition(tmp_path, grade_fn="tests.envs.test_mle_bench:fake_grade")
    comp = mle_bench.load_competition(spec, data)
    task = mle_bench.make_task(comp, tmp_path / "view", split="train")

    def read_rows(path):
        with open(path, newline="") as f:
            return list(csv.DictReader(f))

    scorer = mle_bench.upstream_grader(comp, read_frame=read_rows)
    outcome = mle_bench.grade(comp, task, submit(tmp_path, [(0, 1), (1, 2), (2, 3)]), scorer=scorer)
    assert outcome.upstream and outcome.result.score == 0.2 and outcome.medal == "bronze"
    # The upstream grader raising means an invalid submission, not a crash.
    bad = mle_bench.grade(comp, task, submit(tmp_path, [(0, 1)]), scorer=scorer)
    assert bad.result.error_kind == "invalid_format" and "row count" in bad.result.message
    # The real entry point's package is absent: no upstream grader.
    absent = mle_bench.load_competition(*make_competition(tmp_path / "other"))
    assert mle_bench.upstream_grader(absent) is None


def test_direction_inference(tmp_path):
    assert mle_bench.is_lower_better([0.1, 0.2, 0.3])
    assert not mle_bench.is_lower_better([0.9, 0.5, 0.1])
    assert not mle_bench.is_lower_better([0.5, 0.5])  # A flat board reads as higher-is-better.
    with pytest.raises(ValueError, match="non-empty"):
        mle_bench.is_lower_better([])
    spec, data = make_competition(tmp_path, board=[0.9, 0.8, 0.5], metric="auc")
    comp = mle_bench.load_competition(spec, data)
    assert not comp.lower_is_better
    task = mle_bench.make_task(comp, tmp_path / "view", split="train")
    assert task.metric.direction == "higher"
    # A metric whose direction contradicts the board is refused.
    with pytest.raises(mle_bench.CompetitionError, match="contradicts the leaderboard"):
        mle_bench.make_task(
            comp, tmp_path / "v2", split="train", metric={"name": "rmse", "direction": "lower"}
        )


def test_metric_must_be_known(tmp_path):
    comp = mle_bench.load_competition(*make_competition(tmp_path, metric="quadratic-kappa"))
    with pytest.raises(mle_bench.CompetitionError, match="not a contract metric"):
        mle_bench.make_task(comp, tmp_path / "view", split="train")
    task = mle_bench.make_task(
        comp, tmp_path / "view", split="train", metric={"name": "mae", "direction": "lower"}
    )
    assert task.metric.name == "mae"


@pytest.mark.parametrize(
    "n, positions",
    [
        (1, (1, 1, 1)),
        (5, (1, 1, 2)),
        (99, (9, 19, 39)),  # floor(9.9), floor(19.8), floor(39.6)
        (100, (10, 20, 40)),
        (249, (10, 49, 99)),
        (250, (10, 50, 100)),  # 10 + floor(0.5)
        (999, (11, 50, 100)),  # 10 + floor(1.998)
        (1000, (12, 50, 100)),
        (2500, (15, 125, 250)),
    ],
)
def test_medal_positions(n, positions):
    assert mle_bench.medal_positions(n) == positions


def test_medal_thresholds_on_hand_made_boards():
    # Higher is better, 100 teams scoring 100, 99, ..., 1: positions 10 / 20 / 40.
    board = [100 - i for i in range(100)]
    thresholds = mle_bench.medal_thresholds(board, lower_is_better=False)
    assert thresholds == mle_bench.MedalThresholds(91.0, 81.0, 61.0, 50.5)
    assert mle_bench.medal(91, thresholds, lower_is_better=False) == "gold"
    assert mle_bench.medal(90.5, thresholds, lower_is_better=False) == "silver"
    assert mle_bench.medal(61, thresholds, lower_is_better=False) == "bronze"
    assert mle_bench.medal(60.9, thresholds, lower_is_better=False) is None
    # Lower is better, 250 teams scoring 1 .. 250 (given unsorted): positions 10 / 50 / 100.
    board = list(range(250, 0, -1))
    thresholds = mle_bench.medal_thresholds(board, lower_is_better=True)
    assert thresholds[:3] == (10.0, 50.0, 100.0) and thresholds.median == 125.5
    assert mle_bench.medal(10, thresholds, lower_is_better=True) == "gold"
    assert mle_bench.medal(100.5, thresholds, lower_is_better=True) is None
    with pytest.raises(ValueError, match="at least one team"):
        mle_bench.medal_positions(0)


def test_private_dirs_are_never_mountable(tmp_path, bench):
    comp, task = bench
    assert mle_bench.sandbox_mounts(task) == [os.path.realpath(comp.public_dir)]
    for path in (comp.private_dir, comp.answers_path, os.path.dirname(comp.private_dir)):
        with pytest.raises(mle_bench.PrivateMountError, match="refusing to mount"):
            mle_bench.check_mount(task, path)


def test_config_is_parsed_by_pyyaml_and_must_be_a_mapping():
    text = CONFIG.format(metric="rmse", grade_fn="m.n:f")
    config = mle_bench.parse_config(text)
    assert config["grader"]["grade_fn"] == "m.n:f"
    assert config["dataset"]["answers"].endswith("prepared/private/test.csv")
    for bad, message in [
        ("a: [1, 2\n", "not valid YAML"),
        ("- a\n- b\n", "not a mapping"),
        ("", "not a mapping"),
    ]:
        with pytest.raises(mle_bench.CompetitionError, match=message):
            mle_bench.parse_config(bad)


def _drop(path):
    os.remove(path)


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda s, d: _drop(s / "config.yaml"), "no config.yaml"),
        (lambda s, d: _drop(s / "leaderboard.csv"), "no leaderboard.csv"),
        (lambda s, d: _drop(s / "grade.py"), "no grade.py"),
        (lambda s, d: _drop(s / "description.md"), "no description.md"),
        (
            lambda s, d: write_csv(s / "leaderboard.csv", ["teamName", "Score"], [("t", 1)]),
            "no 'score' column",
        ),
        (lambda s, d: write_csv(s / "leaderboard.csv", ["score"], []), "no finite scores"),
        (
            lambda s, d: (s / "config.yaml").write_text("id: toy-bench\ngrader:\n  name: rmse\n"),
            "'grader.grade_fn' is missing",
        ),
        (
            lambda s, d: _drop(d / "toy-bench" / "prepared" / "private" / "test.csv"),
            "dataset.answers",
        ),
        (
            lambda s, d: os.rename(d / "toy-bench" / "prepared" / "public", d / "pub"),
            "no toy-bench/prepared/public/",
        ),
        (
            lambda s, d: (s / "config.yaml").write_text(
                CONFIG.format(metric="rmse", grade_fn="m:f").replace(
                    "prepared/private/test.csv", "prepared/public/test.csv"
                )
            ),
            "dataset.answers is not under",
        ),
    ],
)
def test_malformed_competition_dirs(tmp_path, breakage, message):
    spec, data = make_competition(tmp_path)
    breakage(spec, data)
    with pytest.raises(mle_bench.CompetitionError, match=message):
        mle_bench.load_competition(spec, data)


def test_answer_column_errors(tmp_path):
    spec, data = make_competition(tmp_path, answers=((0, "yes"), (1, "no")))
    comp = mle_bench.load_competition(spec, data)
    with pytest.raises(mle_bench.CompetitionError, match="not numeric"):
        mle_bench.make_task(comp, tmp_path / "view", split="train")
    with pytest.raises(mle_bench.CompetitionError, match="lack the id"):
        mle_bench.make_task(comp, tmp_path / "view", split="train", answer_column="z")
    with pytest.raises(mle_bench.CompetitionError, match="neither split"):
        mle_bench.make_task(comp, tmp_path / "view", split={"other": "train"})
