"""Tests for the built-in offline suite's task data: determinism, splits, boundaries."""

import csv
import filecmp
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.envs.conftest import read_csv_rows, relative_files
from wmrl_jax.envs import grading, suite
from wmrl_jax.envs import task as task_lib

SMALL = ["iris", "linear_cls_easy", "sine_smooth"]


DATA_FILES = (
    "public/train.csv",
    "public/test.csv",
    "public/sample_submission.csv",
    "private/answers.csv",
    "manifest.json",
    "description.md",
    "data_report.md",
)


@pytest.fixture(scope="module")
def built(builtin_suite):
    return builtin_suite


_read, _files = read_csv_rows, relative_files


def test_suite_has_disjoint_splits():
    specs = suite.suite_specs()
    assert len(specs) >= 16 and len({s.id for s in specs}) == len(specs)
    families = {}
    for spec in specs:
        families.setdefault(spec.family, set()).add(spec.split)
    assert all(len(splits) == 1 for splits in families.values()), families
    by_split = {sp: {f for f, s in families.items() if sp in s} for sp in task_lib.SPLITS}
    assert all(by_split.values())
    assert {"wine", "diabetes"} <= by_split["held-out"]  # Whole bundled datasets held out.


def test_every_task_loads_with_its_split(built):
    for spec in suite.suite_specs():
        task = task_lib.load_task(os.path.join(built, spec.id))
        assert (task.id, task.split, task.metric.name) == (spec.id, spec.split, spec.metric)
        assert task.data_report is not None


def test_data_files_are_byte_identical_and_idempotent(built, tmp_path):
    for spec in suite.select_specs(SMALL):
        suite.write_task(spec, str(tmp_path), seed=0)
        root, _ = suite.write_task(spec, str(tmp_path), seed=0)  # Rewriting in place: a no-op.
        for rel in DATA_FILES:
            assert filecmp.cmp(os.path.join(built, spec.id, rel), os.path.join(root, rel), False)


def test_different_seed_changes_data(built, tmp_path):
    for spec in suite.select_specs(SMALL):
        root, _ = suite.write_task(spec, str(tmp_path), seed=1)
        for rel in ("public/train.csv", "private/answers.csv"):
            assert not filecmp.cmp(
                os.path.join(built, spec.id, rel), os.path.join(root, rel), False
            )


def test_refuses_to_overwrite_foreign_directory(tmp_path):
    foreign = tmp_path / "iris"
    foreign.mkdir()
    (foreign / "manifest.json").write_text(json.dumps({"source": "mine"}))
    with pytest.raises(FileExistsError):
        suite.write_task(suite.spec_by_id("iris"), str(tmp_path), seed=0)
    (foreign / "manifest.json").write_text("{not json")
    with pytest.raises(FileExistsError):
        suite.write_task(suite.spec_by_id("iris"), str(tmp_path), seed=0)
    with pytest.raises(ValueError, match="unknown suite task"):
        suite.select_specs(["iris", "nope"])
    with pytest.raises(ValueError, match="unknown suite task"):
        suite.spec_by_id("nope")


def test_split_matches_written_files(built):
    spec = suite.spec_by_id("iris")
    data = suite.split_task(spec, seed=0)
    train = _read(os.path.join(built, "iris", "public", "train.csv"))
    answers = _read(os.path.join(built, "iris", "private", "answers.csv"))
    assert len(train) == len(data.y_train) == 105 and len(answers) == len(data.y_test) == 45
    assert [int(r["target"]) for r in answers] == data.y_test.tolist()
    assert float(train[0]["f0"]) == data.x_train[0, 0]


def test_public_never_contains_answers(built):
    for spec in suite.suite_specs():
        task = task_lib.load_task(os.path.join(built, spec.id))
        assert sorted(os.listdir(task.public_dir)) == [
            "sample_submission.csv",
            "test.csv",
            "train.csv",
        ]
        test_rows = _read(os.path.join(task.public_dir, "test.csv"))
        assert "target" not in test_rows[0]
        answers = _read(os.path.join(built, spec.id, "private", "answers.csv"))
        train_ids = {r["id"] for r in _read(os.path.join(task.public_dir, "train.csv"))}
        assert {r["id"] for r in test_rows} == {r["id"] for r in answers}
        assert not train_ids & {r["id"] for r in answers}


def _perfect_submission(task, built, path):
    answers = _read(os.path.join(built, task.id, "private", "answers.csv"))
    cols = task.submission.target_columns
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", *cols])
        for row in answers:
            if cols[0].startswith("p_"):
                onehot = np.eye(len(cols))[int(row["target"])]
                writer.writerow([row["id"], *onehot])
            else:
                writer.writerow([row["id"], row["target"]])


def test_perfect_near_top_and_constant_near_bottom(built, tmp_path):
    for spec in suite.suite_specs():
        task = task_lib.load_task(os.path.join(built, spec.id))
        path = tmp_path / f"{spec.id}.csv"
        _perfect_submission(task, built, path)
        perfect = grading.grade(task, str(path))
        constant = grading.grade(task, os.path.join(task.public_dir, "sample_submission.csv"))
        assert perfect.valid and perfect.percentile >= 0.95, (spec.id, perfect)
        assert perfect.rank == 1
        assert constant.valid and constant.percentile <= 0.10, (spec.id, constant)
        assert perfect.board_size >= 200


def test_data_report_is_computed_from_the_data(built):
    root = os.path.join(built, "iris")
    train = _read(os.path.join(root, "public", "train.csv"))
    report = open(os.path.join(root, "data_report.md")).read()
    assert f"train.csv: {len(train)} rows, 4 features" in report
    counts = np.bincount([int(r["target"]) for r in train])
    for k, n in enumerate(counts):
        assert f"| {k} | {n} | {n / len(train):.4f} |" in report
    f0 = np.array([float(r["f0"]) for r in train])
    assert f"| f0 | {np.mean(f0):.6g} | {np.std(f0):.6g} |" in report


def test_envs_never_import_jax():
    code = (
        "import sys; import wmrl_jax.envs.builtin, wmrl_jax.envs.grading; "
        "assert not any(m == 'jax' or m.startswith('jax.') for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
