"""Tests for the task contract: manifests, errors naming fields, the public boundary."""

import dataclasses
import json
import os

import pytest

from tests.envs.conftest import base_manifest
from wmrl_jax.envs import task as task_lib


def test_load_task_reads_manifest(make_task):
    task = task_lib.load_task(make_task())
    assert task.id == "toy" and task.split == "train"
    assert task.metric == task_lib.MetricSpec(name="rmse", grader=None, direction="lower")
    assert task.submission.target_columns == ("target",)
    assert task.public_dir.endswith(os.path.join("task", "public"))
    assert task.description == "# toy\n"
    assert task.data_report is None


def test_task_exposes_no_private_path(make_task):
    root = make_task()
    task = task_lib.load_task(root)
    private = os.path.join(os.path.abspath(root), "private")
    public_values = [getattr(task, f.name) for f in dataclasses.fields(task) if f.repr]
    public_values += [task.public_dir, task.description]
    assert not any(private in str(v) for v in public_values)
    assert os.path.abspath(root) not in repr(task)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"split": "test"}, "split"),
        ({"metric": {"name": "f1", "direction": "higher"}}, "metric.name"),
        ({"metric": {"name": "rmse", "direction": "up"}}, "metric.direction"),
        ({"metric": {"name": "rmse", "direction": "higher"}}, "metric.direction"),
        ({"metric": {"name": "rmse"}}, "metric.direction"),
        ({"metric": {"direction": "lower"}}, "metric"),
        ({"metric": {"grader": "no_colon", "direction": "lower"}}, "metric.grader"),
        ({"percentile_rule": "median"}, "percentile_rule"),
        ({"limits": {"wall_seconds": -1}}, "limits.wall_seconds"),
        ({"leaderboards": []}, "leaderboards"),
        ({"format_version": 2}, "format_version"),
        ({"id": 3}, "id"),
    ],
)
def test_malformed_manifest_names_the_field(make_task, overrides, field):
    root = make_task(manifest=base_manifest(**overrides))
    with pytest.raises(task_lib.ManifestError, match=f"'{field}'"):
        task_lib.load_task(root)


@pytest.mark.parametrize(
    "key", ["id", "source", "split", "metric", "submission", "limits", "leaderboards"]
)
def test_missing_field_is_named(make_task, key):
    manifest = base_manifest()
    del manifest[key]
    with pytest.raises(task_lib.ManifestError, match=f"'{key}' is missing"):
        task_lib.load_task(make_task(manifest=manifest))


@pytest.mark.parametrize("key", ["file", "id_column", "target_columns", "answer_column"])
def test_missing_submission_field_is_named(make_task, key):
    manifest = base_manifest()
    del manifest["submission"][key]
    with pytest.raises(task_lib.ManifestError, match=f"'submission.{key}' is missing"):
        task_lib.load_task(make_task(manifest=manifest))


def test_submission_file_must_stay_inside_output(make_task):
    manifest = base_manifest()
    manifest["submission"]["file"] = "../answers.csv"
    with pytest.raises(task_lib.ManifestError, match="'submission.file'"):
        task_lib.load_task(make_task(manifest=manifest))


def test_grader_entry_point_is_accepted(make_task):
    manifest = base_manifest(metric={"grader": "pkg.mod:score", "direction": "higher"})
    task = task_lib.load_task(make_task(manifest=manifest))
    assert task.metric.grader == "pkg.mod:score" and task.metric.name is None


def test_missing_or_broken_files(tmp_path, make_task):
    with pytest.raises(task_lib.ManifestError, match="no manifest.json"):
        task_lib.load_task(tmp_path)
    root = make_task()
    with open(os.path.join(root, "manifest.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(task_lib.ManifestError, match="not valid JSON"):
        task_lib.load_task(root)
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(base_manifest(), f)
    os.remove(os.path.join(root, "description.md"))
    with pytest.raises(task_lib.ManifestError, match="description.md"):
        task_lib.load_task(root)
