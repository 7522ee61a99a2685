"""Tests for grading: metrics, error kinds, percentile rules on hand-made boards, rewards."""

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as sk_metrics

from tests.envs.conftest import base_manifest, write_csv
from wmrl_jax.envs import grading, metrics
from wmrl_jax.envs import task as task_lib


@pytest.fixture(autouse=True)
def _allow_this_module_as_grader(monkeypatch):
    monkeypatch.setenv(task_lib.GRADER_MODULES_ENV, "tests.envs.test_grading")


def grader_that_fails(y_true, y_pred):
    raise RuntimeError("boom")


def grader_sum(y_true, y_pred):
    return float(np.sum(y_pred))


# ---- metrics against scikit-learn ------------------------------------------------------


def test_metrics_match_sklearn():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, size=50).astype(np.float64)
    p = rng.dirichlet(np.ones(3), size=50)
    np.testing.assert_allclose(metrics.log_loss(y, p), sk_metrics.log_loss(y, p), rtol=1e-12)
    labels = np.argmax(p, axis=1).astype(np.float64)[:, None]
    assert metrics.accuracy(y, labels) == sk_metrics.accuracy_score(y, labels[:, 0])
    np.testing.assert_allclose(
        metrics.auc(y, p), sk_metrics.roc_auc_score(y, p, multi_class="ovr"), rtol=1e-12
    )
    yb = (y > 0).astype(np.float64)
    np.testing.assert_allclose(metrics.auc(yb, p[:, :1]), sk_metrics.roc_auc_score(yb, p[:, 0]))
    t, q = rng.normal(size=40), rng.normal(size=(40, 1))
    np.testing.assert_allclose(metrics.rmse(t, q), math.sqrt(sk_metrics.mean_squared_error(t, q)))
    np.testing.assert_allclose(metrics.mae(t, q), sk_metrics.mean_absolute_error(t, q))
    np.testing.assert_allclose(metrics.r2(t, q), sk_metrics.r2_score(t, q[:, 0]), rtol=1e-12)


def test_log_loss_clips_confident_mistakes():
    y = np.array([0.0, 1.0])
    p = np.array([[0.0, 1.0], [0.0, 1.0]])  # First row: probability 0 on the truth.
    expected = (-math.log(1e-15) + 0.0) / 2  # The clipped row, then renormalised.
    np.testing.assert_allclose(metrics.log_loss(y, p), expected, rtol=1e-6)


# ---- percentile rules on hand-made boards ------------------------------------------------


# Higher is better: board [0.9, 0.8, 0.8, 0.7, 0.5], score 0.8 -> 2 strictly worse,
# 2 ties, N = 5: mid-rank (2 + 1) / 5, MLE-Dojo (2 + 2) / 5, beat-ratio 2 / 5.
# Lower is better: board [0.1, 0.2, 0.2, 0.3], score 0.2 -> 1 worse, 2 ties, N = 4.
@pytest.mark.parametrize(
    "board, score, direction, rule, expected",
    [
        ([0.9, 0.8, 0.8, 0.7, 0.5], 0.8, "higher", "mid_rank", 0.6),
        ([0.9, 0.8, 0.8, 0.7, 0.5], 0.8, "higher", "mle_dojo", 0.8),
        ([0.9, 0.8, 0.8, 0.7, 0.5], 0.8, "higher", "beat_ratio", 0.4),
        ([0.1, 0.2, 0.2, 0.3], 0.2, "lower", "mid_rank", 0.5),
        ([0.1, 0.2, 0.2, 0.3], 0.2, "lower", "mle_dojo", 0.75),
        ([0.1, 0.2, 0.2, 0.3], 0.2, "lower", "beat_ratio", 0.25),
        ([0.1, 0.2, 0.3], 0.0, "lower", "mid_rank", 1.0),
        ([0.1, 0.2, 0.3], 0.0, "higher", "mle_dojo", 0.0),
        ([0.5], 0.5, "higher", "mid_rank", 0.5),
    ],
)
def test_percentile_rules(board, score, direction, rule, expected):
    got = grading.percentile(score, board, direction=direction, rule=rule)
    assert got == pytest.approx(expected, abs=1e-12)


def test_rank_and_bad_inputs():
    assert grading.rank(0.8, [0.9, 0.8, 0.8, 0.7], direction="higher") == 2
    assert grading.rank(0.15, [0.1, 0.2, 0.3], direction="lower") == 2
    with pytest.raises(ValueError, match="unknown percentile rule"):
        grading.percentile(1.0, [1.0], direction="higher", rule="median")
    with pytest.raises(ValueError, match="non-empty"):
        grading.percentile(1.0, [], direction="higher", rule="mid_rank")
    with pytest.raises(ValueError, match="direction"):
        grading.percentile(1.0, [1.0], direction="up", rule="mid_rank")


# ---- grade() ---------------------------------------------------------------------------


def _submit(tmp_path, header, rows, name="submission.csv"):
    path = tmp_path / name
    write_csv(path, header, rows)
    return str(path)


def test_grade_valid_rmse(make_task, tmp_path):
    # Answers 1, 2, 3; predictions 1, 2, 5 -> rmse = sqrt(4 / 3) ~ 1.1547.
    # Board (lower is better) [0.5, 1.0, 2.0]: 1 worse -> mid-rank 1/3, rank 3.
    task = task_lib.load_task(make_task())
    path = _submit(tmp_path, ["id", "target"], [(2, 5.0), (0, 1.0), (1, 2.0)])
    result = grading.grade(task, path)
    assert result.valid and result.error_kind is None
    assert result.score == pytest.approx(math.sqrt(4 / 3))
    assert result.percentile == pytest.approx(1 / 3)
    assert (result.rank, result.board_size) == (3, 3)


def test_grade_mle_dojo_averages_two_boards(make_task, tmp_path):
    # Score 2 (higher is better). Public [1, 2, 3, 4]: 1 worse + 1 tie -> 2/4.
    # Private [2, 2, 5]: 0 worse + 2 ties -> 2/3. Mean (1/2 + 2/3) / 2 = 7/12.
    manifest = base_manifest(
        metric={"grader": "tests.envs.test_grading:grader_sum", "direction": "higher"},
        percentile_rule="mle_dojo",
        leaderboards=["public", "private"],
    )
    root = make_task(manifest=manifest, boards={"public": [1, 2, 3, 4], "private": [2, 2, 5]})
    task = task_lib.load_task(root)
    path = _submit(tmp_path, ["id", "target"], [(0, 0.5), (1, 0.5), (2, 1.0)])
    result = grading.grade(task, path)
    assert result.valid and result.score == 2.0
    assert result.percentile == pytest.approx(7 / 12)
    assert (result.rank, result.board_size) == (3, 4)


def test_grade_error_kinds(make_task, tmp_path):
    task = task_lib.load_task(make_task())
    good_rows = [(0, 1.0), (1, 2.0), (2, 3.0)]
    cases = {
        "missing": [None, str(tmp_path / "nope.csv")],
        "unparseable": [],
        "invalid_format": [
            _submit(tmp_path, ["id", "prediction"], good_rows, "a.csv"),
            _submit(tmp_path, ["id", "target"], good_rows[:2], "b.csv"),
            _submit(tmp_path, ["id", "target"], [*good_rows[:2], (1, 2.0)], "c.csv"),
            _submit(tmp_path, ["id", "target"], [*good_rows[:2], (7, 2.0)], "d.csv"),
            _submit(tmp_path, ["id", "target"], [*good_rows[:2], (2, "abc")], "e.csv"),
            _submit(tmp_path, ["id", "target"], [*good_rows[:2], (2, "nan")], "f.csv"),
        ],
    }
    for name, content in [("g.csv", b""), ("h.csv", b"\xff\xfe\x00bin"), ("i.csv", b"id\n1,2\n")]:
        (tmp_path / name).write_bytes(content)
        cases["unparseable"].append(str(tmp_path / name))
    for kind, paths in cases.items():
        for path in paths:
            result = grading.grade(task, path)
            assert not result.valid and result.error_kind == kind, (path, result)
            assert result.score is None and result.percentile is None and result.message


def test_grade_metric_error(make_task, tmp_path):
    manifest = base_manifest(
        metric={"grader": "tests.envs.test_grading:grader_that_fails", "direction": "lower"}
    )
    task = task_lib.load_task(make_task(manifest=manifest))
    result = grading.grade(task, _submit(tmp_path, ["id", "target"], [(0, 1), (1, 1), (2, 1)]))
    assert result.error_kind == "metric_error" and "boom" in result.message


# ---- rewards -----------------------------------------------------------------------------


def test_reward_floors_and_ordering():
    valid = grading.GradeResult(valid=True, score=1.0, percentile=0.0, rank=3, board_size=3)
    invalid = grading.GradeResult(valid=False, error_kind="invalid_format")
    assert grading.reward(valid) == 0.0
    r_invalid = grading.reward(invalid)
    r_error = grading.reward(None, status="error")
    r_killed = grading.reward(None, status="killed")
    r_timeout = grading.reward(None, status="timeout")
    r_oom = grading.reward(None, status="oom")
    assert 0.0 > r_invalid > r_error == r_killed > r_timeout == r_oom
    assert grading.reward(None, status="infra_error") is None
    # Sandbox status wins over a stale grade.
    assert grading.reward(valid, status="timeout") == r_timeout
    custom = grading.RewardFloors(invalid=-1.0)._replace(timeout=-2.0)
    assert grading.reward(invalid, floors=custom) == -1.0
    assert grading.reward(None, status="timeout", floors=custom) == -2.0
    with pytest.raises(ValueError, match="unknown sandbox status"):
        grading.reward(valid, status="segfault")


def test_grade_tolerates_byte_order_mark(make_task, tmp_path):
    task = task_lib.load_task(make_task())
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbfid,target\n0,1\n1,2\n2,3\n")
    result = grading.grade(task, str(path))
    assert result.valid and result.score == 0.0


@settings(max_examples=50, deadline=None)
@given(
    board=st.lists(st.integers(0, 5).map(float), min_size=1, max_size=20),
    score=st.integers(0, 5).map(float),
    direction=st.sampled_from(["higher", "lower"]),
)
def test_rules_are_ordered_and_mid_rank_is_their_mean(board, score, direction):
    # Small integer scores force many ties.
    beat = grading.percentile(score, board, direction=direction, rule="beat_ratio")
    mid = grading.percentile(score, board, direction=direction, rule="mid_rank")
    dojo = grading.percentile(score, board, direction=direction, rule="mle_dojo")
    assert 0.0 <= beat <= mid <= dojo <= 1.0
    assert mid == pytest.approx((beat + dojo) / 2, abs=1e-12)
    better = grading.rank(score, board, direction=direction) - 1
    assert dojo == pytest.approx(1.0 - better / len(board), abs=1e-12)


def test_grade_rejects_oversized_file_unread(make_task, tmp_path):
    task = task_lib.load_task(make_task())
    path = _submit(tmp_path, ["id", "target"], [(0, 1.0), (1, 2.0), (2, 3.0)])
    result = grading.grade(task, path, max_bytes=8)
    assert result.error_kind == "invalid_format" and "over 8" in result.message
    assert grading.grade(task, path).valid


# ---- bounded memory and a broken task side ---------------------------------------------


def _peak_bytes(fn):
    import tracemalloc

    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _rows_file(path, n_bytes, first_id=0):
    """About `n_bytes` of well-formed rows `id,0.5` (ids from `first_id`)."""
    with open(path, "w") as f:
        f.write("id,target\n")
        i, written = first_id, 0
        while written < n_bytes:
            line = f"{i},0.5\n"
            f.write(line)
            written += len(line)
            i += 1
    return str(path)


def test_oversized_submission_is_rejected_unread(make_task, tmp_path):
    """The cap comes from the task: 3 answers allow about 1 MiB, not 16 MiB."""
    task = task_lib.load_task(make_task())
    path = _rows_file(tmp_path / "big.csv", 16 << 20)
    result, peak = _peak_bytes(lambda: grading.grade(task, path))
    assert result.error_kind == "invalid_format" and "over" in result.message
    assert peak < 1 << 20, peak
    sparse = tmp_path / "sparse.csv"
    with open(sparse, "wb") as f:
        f.truncate(200 << 20)
    assert grading.grade(task, str(sparse)).error_kind == "invalid_format"


def test_submission_under_the_cap_is_parsed_in_bounded_memory(make_task, tmp_path):
    """A task allowing 64 MiB: 16 MiB of rows stop at the first row past the 3 test ids."""
    manifest = base_manifest(limits={"wall_seconds": 60, "submission_mb": 64})
    task = task_lib.load_task(make_task(manifest=manifest))
    path = _rows_file(tmp_path / "big.csv", 16 << 20)
    result, peak = _peak_bytes(lambda: grading.grade(task, path))
    assert result.error_kind == "invalid_format" and "more than 3 rows" in result.message
    assert peak < 1 << 20, peak


def test_derived_cap_admits_a_large_valid_submission(make_task, tmp_path):
    n = 20_000
    rng = np.random.default_rng(0)
    truth = rng.normal(size=n)
    task = task_lib.load_task(make_task(answers=list(enumerate(truth))))
    pred = truth + rng.normal(scale=0.1, size=n)
    rows = [(i, repr(float(p))) for i, p in enumerate(pred)]
    path = _submit(tmp_path, ["id", "target"], rows[::-1])
    result = grading.grade(task, path)
    assert result.valid, result
    np.testing.assert_allclose(result.score, np.sqrt(np.mean((pred - truth) ** 2)), rtol=1e-12)


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("no-answers", "answers.csv"),
        ("answers-without-column", "lack the id"),
        ("non-numeric-answer", "non-numeric answer"),
        ("empty-board", "no finite scores"),
        ("board-without-score", "no 'score' column"),
        ("board-with-text", "not a number"),
        ("no-board", "private.csv"),
    ],
)
def test_broken_task_side_is_one_clear_error(make_task, tmp_path, breakage, message):
    root = make_task()
    private = os.path.join(root, "private")
    board = os.path.join(private, "leaderboards", "private.csv")
    answers = os.path.join(private, "answers.csv")
    if breakage == "no-answers":
        os.remove(answers)
    elif breakage == "answers-without-column":
        write_csv(answers, ["id", "y"], [(0, 1.0)])
    elif breakage == "non-numeric-answer":
        write_csv(answers, ["id", "target"], [(0, "cat")])
    elif breakage == "empty-board":
        write_csv(board, ["entry", "score"], [])
    elif breakage == "board-without-score":
        write_csv(board, ["entry", "points"], [("a", 1.0)])
    elif breakage == "board-with-text":
        write_csv(board, ["entry", "score"], [("a", "high")])
    elif breakage == "no-board":
        os.remove(board)
    task = task_lib.load_task(root)
    good = _submit(tmp_path, ["id", "target"], [(0, 1.0), (1, 2.0), (2, 3.0)])
    with pytest.raises(grading.TaskError, match=message):
        grading.check_task(task)
    with pytest.raises(grading.TaskError, match=message) as info:
        grading.grade(task, good)
    assert "\n" not in str(info.value)


def _classification_task(make_task, metric, columns, y):
    direction = metrics.METRICS[metric].direction
    manifest = base_manifest(metric={"name": metric, "direction": direction})
    manifest["submission"]["target_columns"] = columns
    return task_lib.load_task(make_task(manifest=manifest, answers=list(enumerate(y))))


@pytest.mark.parametrize(
    "metric, columns, y, message",
    [
        ("accuracy", ["target"], [0, 1, "nan", 1], "'target' holds nan for id '2'"),
        ("rmse", ["target"], [1.5, "inf", 2.0], "holds inf for id '1'"),
        ("r2", ["target"], ["-inf", 1.0], "holds -inf for id '0'"),
        ("auc", ["target"], [1, 1, 1, 1], "auc needs both classes .* 1 distinct"),
        ("auc", ["p_0", "p_1"], [0, 0, 0], r"auc needs every class .* \[1\] never occur"),
        ("auc", ["p_0", "p_1", "p_2"], [0, 2, 0, 2], r"\[1\] never occur"),
        ("auc", ["p_0", "p_1"], [0, 1, 2], r"class indices 0..1"),
        ("log_loss", ["p_0", "p_1", "p_2"], [0, 1, 3], r"class indices 0..2 .* \[0.0, 1.0, 3.0\]"),
        ("log_loss", ["p_0", "p_1"], [0, 0.5, 1], "class indices 0..1"),
        ("log_loss", ["p_0", "p_1"], [-1, 0, 1], "class indices 0..1"),
    ],
)
def test_check_task_refuses_answers_the_metric_cannot_score(
    make_task, tmp_path, metric, columns, y, message
):
    task = _classification_task(make_task, metric, columns, y)
    with pytest.raises(grading.TaskError, match=message) as info:
        grading.check_task(task)
    assert "answers.csv" in str(info.value) and "\n" not in str(info.value)
    # Grading refuses the task too: the program is not blamed (no "invalid" result).
    rows = [(i, *([0.5] * len(columns))) for i in range(len(y))]
    with pytest.raises(grading.TaskError, match=message):
        grading.grade(task, _submit(tmp_path, ["id", *columns], rows))


def test_a_nan_answer_made_a_perfect_submission_score_below_one(make_task, tmp_path):
    # The cause of the 0.909: an accuracy task whose answers hold one NaN among 11.
    # NaN equals nothing, so a submission right on every other row scored 10/11,
    # and copying the answers (NaN included) was blamed as an invalid submission.
    y = [k % 2 for k in range(11)]
    task = _classification_task(make_task, "accuracy", ["target"], [*y[:10], "nan"])
    with pytest.raises(grading.TaskError, match="holds nan for id '10'"):
        grading.check_task(task)
    # With the row's true label restored, the same submission scores 1.
    write_csv(os.path.join(task._root, "private", "answers.csv"), ["id", "target"], enumerate(y))
    grading.check_task(task)
    result = grading.grade(task, _submit(tmp_path, ["id", "target"], list(enumerate(y))))
    assert result.valid and result.score == 1.0


def test_answers_every_metric_can_score_pass(make_task):
    task = _classification_task(make_task, "auc", ["p_0", "p_1", "p_2"], [0, 1, 2, 1])
    grading.check_task(task)
