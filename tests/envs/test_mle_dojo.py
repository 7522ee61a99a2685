"""Tests for the MLE-Dojo loader on competitions built in the upstream layout."""

import importlib.util
import json
import os
import sys
import types

import pytest

from tests.envs.conftest import write_csv
from wmrl_jax.envs import grading, mle_dojo
from wmrl_jax.envs import task as task_lib

AUC = {"name": "auc", "direction": "higher"}
ANSWERS = [(1, 0), (2, 1), (3, 1), (4, 0)]


def make_competition(
    root, name="toy-comp", *, header=("Id", "Probability"), rows=ANSWERS, boards=None
):
    """`<root>/<name>/data/{public,private}` exactly as MLE-Dojo's preparation writes it."""
    boards = (
        {"public": [0.9, 0.75, 0.75, 0.5], "private": [0.8, 0.7, 0.6]} if boards is None else boards
    )
    data = root / name / "data"
    (data / "public").mkdir(parents=True)
    (data / "private").mkdir(parents=True)
    (data / "public" / "description.txt").write_text(f"# {name}\n")
    write_csv(data / "public" / "train.csv", ["Id", "x", "Probability"], [(9, 0.5, 1)])
    write_csv(data / "public" / "test.csv", ["Id", "x"], [(r[0], 0.1) for r in rows])
    write_csv(data / "public" / "sample_submission.csv", list(header), [(r[0], 0) for r in rows])
    write_csv(data / "private" / "test_answer.csv", list(header), rows)
    for board, scores in boards.items():
        write_csv(
            data / "private" / f"{board}_leaderboard.csv",
            ["rank", "score"],
            [(i + 1, s) for i, s in enumerate(scores)],
        )
    return root / name


def submit(tmp_path, rows, header=("Id", "Probability")):
    path = tmp_path / "submission.csv"
    write_csv(path, list(header), rows)
    return str(path)


def test_load_and_map_onto_contract(tmp_path):
    comp = mle_dojo.load_competition(make_competition(tmp_path))
    assert comp.name == "toy-comp" and comp.columns == ("Id", "Probability")
    assert sorted(comp.boards) == ["private", "public"]
    task = mle_dojo.make_task(comp, tmp_path / "view", split="train", metric=AUC)
    assert (task.id, task.source, task.split) == ("toy-comp", "mle-dojo", "train")
    assert task.percentile_rule == "mle_dojo" and task.leaderboards == ("private", "public")
    assert task.submission.id_column == "Id" and task.submission.target_columns == ("Probability",)
    assert task.description == "# toy-comp\n"
    # Re-loading the written view through the contract gives the same task.
    assert task_lib.load_task(tmp_path / "view") == task


def test_view_links_instead_of_copying(tmp_path):
    comp = mle_dojo.load_competition(make_competition(tmp_path))
    task = mle_dojo.make_task(comp, tmp_path / "view", split="train", metric=AUC)
    view = tmp_path / "view"
    assert os.path.islink(view / "public") and os.path.samefile(task.public_dir, comp.public_dir)
    assert os.path.islink(view / "private" / "answers.csv")
    assert os.path.samefile(view / "private" / "answers.csv", comp.answers_path)
    for board, path in comp.boards.items():
        assert os.path.samefile(view / "private" / "leaderboards" / f"{board}.csv", path)
    # Writing the view again (e.g. a second run) replaces the links in place.
    assert mle_dojo.make_task(comp, view, split="train", metric=AUC) == task


def test_grade_end_to_end_with_mle_dojo_rule(tmp_path):
    # Truth 0, 1, 1, 0; predictions 0.1, 0.8, 0.4, 0.6 -> of the 4 (positive, negative)
    # pairs, 3 are ordered correctly: AUC = 0.75.
    # Public board [0.9, 0.75, 0.75, 0.5]: 1 worse + 2 ties -> 3/4 (upstream: position 2,
    # (4 - 2 + 1) / 4). Private [0.8, 0.7, 0.6]: 2 worse -> 2/3 (position 2, (3 - 2 + 1) / 3).
    # Mean (3/4 + 2/3) / 2 = 17/24; rank and size refer to the private board.
    comp = mle_dojo.load_competition(make_competition(tmp_path))
    task = mle_dojo.make_task(comp, tmp_path / "view", split="train", metric=AUC)
    path = submit(tmp_path, [(4, 0.6), (1, 0.1), (2, 0.8), (3, 0.4)])
    result = grading.grade(task, path)
    assert result.valid and result.score == pytest.approx(0.75)
    assert result.percentile == pytest.approx(17 / 24)
    assert (result.rank, result.board_size) == (2, 3)
    bad = grading.grade(task, submit(tmp_path, [(1, 0.1)]))
    assert not bad.valid and bad.error_kind == "invalid_format"


def test_single_board_lower_is_better(tmp_path):
    # Only a private board [1, 2, 2, 3]; answers 1, 2, predictions 1, 4 -> rmse
    # sqrt(4 / 2) = sqrt(2) ~ 1.414: 2, 2 and 3 are worse, 1 is better -> 3/4, rank 2.
    root = make_competition(
        tmp_path, header=("id", "y"), rows=[(0, 1.0), (1, 2.0)], boards={"private": [1, 2, 2, 3]}
    )
    comp = mle_dojo.load_competition(root)
    task = mle_dojo.make_task(
        comp, tmp_path / "view", split="held-out", metric={"name": "rmse", "direction": "lower"}
    )
    assert task.leaderboards == ("private",)
    result = grading.grade(task, submit(tmp_path, [(0, 1.0), (1, 4.0)], header=("id", "y")))
    assert result.score == pytest.approx(2**0.5)
    assert result.percentile == pytest.approx(3 / 4)
    assert (result.rank, result.board_size) == (2, 4)


def test_split_forms(tmp_path):
    upstream = {"Training": ["a", "b"], "Evaluation": {"MLE-Lite": ["c"], "Tabular": ["d"]}}
    path = tmp_path / "competition.json"
    path.write_text(json.dumps(upstream))
    expected = {"a": "train", "b": "train", "c": "held-out", "d": "held-out"}
    assert mle_dojo.load_split(path) == expected
    assert mle_dojo.load_split({"train": ["a", "b"], "held-out": ["c", "d"]}) == expected
    assert mle_dojo.load_split(path, expected_sizes=(2, 2)) == expected
    with pytest.raises(mle_dojo.CompetitionError, match="expected 151 / 51"):
        mle_dojo.load_split(path, expected_sizes=(mle_dojo.TRAIN_SIZE, mle_dojo.HELD_OUT_SIZE))
    with pytest.raises(mle_dojo.CompetitionError, match="both splits: \\['a'\\]"):
        mle_dojo.load_split({"train": ["a"], "held-out": ["a"]})
    with pytest.raises(mle_dojo.CompetitionError, match="needs keys"):
        mle_dojo.load_split({"Train": []})
    comp = mle_dojo.load_competition(make_competition(tmp_path))
    split = mle_dojo.load_split({"train": ["x"], "held-out": ["toy-comp"]})
    task = mle_dojo.make_task(comp, tmp_path / "view", split=split, metric=AUC)
    assert task.split == "held-out"
    with pytest.raises(mle_dojo.CompetitionError, match="neither split"):
        mle_dojo.make_task(comp, tmp_path / "v2", split={"x": "train"}, metric=AUC)


def test_private_dirs_are_never_mountable(tmp_path):
    comp = mle_dojo.load_competition(make_competition(tmp_path))
    task = mle_dojo.make_task(comp, tmp_path / "view", split="train", metric=AUC)
    assert mle_dojo.sandbox_mounts(task) == [os.path.realpath(comp.public_dir)]
    refused = [
        comp.private_dir,  # upstream private/
        comp.answers_path,
        comp.data_dir,  # contains private/
        tmp_path,  # contains everything
        tmp_path / "view",
        tmp_path / "view" / "private",
        tmp_path / "view" / "private" / "leaderboards",
    ]
    for path in refused:
        with pytest.raises(mle_dojo.PrivateMountError, match="refusing to mount"):
            mle_dojo.check_mount(task, path)
    # A link planted in public/ that leads into private/ is refused too.
    os.symlink(comp.answers_path, os.path.join(comp.public_dir, "leak.csv"))
    with pytest.raises(mle_dojo.PrivateMountError, match="toy-comp/data/private"):
        mle_dojo.sandbox_mounts(task)


def test_view_refuses_public_inside_private(tmp_path):
    comp = mle_dojo.load_competition(make_competition(tmp_path))
    task = mle_dojo.make_task(comp, tmp_path / "ok", split="train", metric=AUC)
    manifest = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    assert task.id == manifest["id"]
    with pytest.raises(mle_dojo.PrivateMountError, match="overlaps"):
        mle_dojo.write_view(
            tmp_path / "view",
            manifest=manifest,
            public_dir=comp.private_dir,
            description=comp.answers_path,
            answers=comp.answers_path,
            boards=comp.boards,
        )
    assert not os.path.exists(tmp_path / "view")


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda d: os.rename(d / "public", d / "pub"), "no data/public/"),
        (lambda d: os.remove(d / "private" / "test_answer.csv"), "no data/private/test_answer.csv"),
        (lambda d: os.remove(d / "public" / "description.txt"), "description.txt"),
        (
            lambda d: [os.remove(p) for p in (d / "private").glob("*_leaderboard.csv")],
            "no leaderboard",
        ),
        (
            lambda d: write_csv(
                d / "private" / "public_leaderboard.csv", ["rank", "Score"], [(1, 2)]
            ),
            "public leaderboard has no 'score' column",
        ),
        (
            lambda d: write_csv(d / "private" / "test_answer.csv", ["Id"], [(1,)]),
            "needs an id and a target",
        ),
        (lambda d: (d / "private" / "test_answer.csv").write_text(""), "is empty"),
    ],
)
def test_malformed_competition_dirs(tmp_path, breakage, message):
    root = make_competition(tmp_path)
    breakage(root / "data")
    with pytest.raises(mle_dojo.CompetitionError, match=message):
        mle_dojo.load_competition(root)


def test_metric_and_answer_errors(tmp_path):
    comp = mle_dojo.load_competition(make_competition(tmp_path))
    with pytest.raises(task_lib.ManifestError, match="'metric.direction'"):
        mle_dojo.make_task(comp, tmp_path / "v1", split="train", metric={"name": "auc"})
    with pytest.raises(task_lib.ManifestError, match="'metric.direction'"):
        mle_dojo.make_task(
            comp, tmp_path / "v1", split="train", metric={"name": "auc", "direction": "lower"}
        )
    multi = mle_dojo.load_competition(
        make_competition(tmp_path, "multi", header=("id", "a", "b"), rows=[(0, 1, 2)])
    )
    with pytest.raises(mle_dojo.CompetitionError, match="pass answer_column"):
        mle_dojo.make_task(multi, tmp_path / "v2", split="train", metric=AUC)
    task = mle_dojo.make_task(multi, tmp_path / "v2", split="train", metric=AUC, answer_column="b")
    assert task.submission.answer_column == "b"
    labels = mle_dojo.load_competition(
        make_competition(tmp_path, "labels", header=("id", "label"), rows=[(0, "cat")])
    )
    with pytest.raises(mle_dojo.CompetitionError, match="not numeric"):
        mle_dojo.make_task(labels, tmp_path / "v3", split="train", metric=AUC)


@pytest.mark.skipif(importlib.util.find_spec("mledojo") is not None, reason="mledojo installed")
def test_upstream_metric_needs_the_package():
    with pytest.raises(mle_dojo.CompetitionError, match="explicit metric mapping"):
        mle_dojo.upstream_metric_class("toy-comp")


def test_direction_checked_against_upstream_metric_class(tmp_path, monkeypatch):
    # A stand-in for an installed mledojo whose metric class is lower-is-better.
    class LowerMetrics:
        def __init__(self, higher_is_better=False):
            self.higher_is_better = higher_is_better

    package = types.ModuleType("mledojo")
    registry = types.ModuleType("mledojo.competitions")
    registry.get_metric = lambda name: LowerMetrics
    package.competitions = registry
    monkeypatch.setitem(sys.modules, "mledojo", package)
    monkeypatch.setitem(sys.modules, "mledojo.competitions", registry)
    assert mle_dojo.upstream_direction("toy-comp") == "lower"
    comp = mle_dojo.load_competition(make_competition(tmp_path))
    with pytest.raises(mle_dojo.CompetitionError, match="contradicts MLE-Dojo's metric class"):
        mle_dojo.make_task(comp, tmp_path / "view", split="train", metric=AUC)
    assert not os.path.exists(tmp_path / "view")
    rmse = {"name": "rmse", "direction": "lower"}
    assert (
        mle_dojo.make_task(comp, tmp_path / "view", split="train", metric=rmse).metric.name
        == "rmse"
    )
