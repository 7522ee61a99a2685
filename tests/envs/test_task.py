"""Tests for the task contract: manifests, errors naming fields, the public boundary."""

import dataclasses
import json
import math
import os

import pytest

from tests.envs.conftest import base_manifest, write_csv
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


@pytest.mark.parametrize(
    "file", ["", ".", "/tmp/submission.csv", "../submission.csv", "out/", "a//b.csv",
             "./submission.csv", "out/../submission.csv", "sub\\mission.csv"],
)  # fmt: skip
def test_unusable_submission_file_is_refused(make_task, file):
    manifest = base_manifest()
    manifest["submission"]["file"] = file
    with pytest.raises(task_lib.ManifestError, match="'submission.file' is .*relative to"):
        task_lib.load_task(make_task(manifest=manifest))


def test_submission_file_may_be_nested(make_task):
    manifest = base_manifest()
    manifest["submission"]["file"] = "out/submission.csv"
    assert task_lib.load_task(make_task(manifest=manifest)).submission.file == "out/submission.csv"


def test_grader_entry_point_is_accepted_from_an_allowed_module(make_task, monkeypatch):
    manifest = base_manifest(metric={"grader": "pkg.mod:score", "direction": "higher"})
    monkeypatch.setenv(task_lib.GRADER_MODULES_ENV, "other, pkg")
    root = make_task(manifest=manifest)
    task = task_lib.load_task(root)
    assert task.metric.grader == "pkg.mod:score" and task.metric.name is None
    manifest = base_manifest(metric={"grader": "wmrl_jax.envs.metrics:mae", "direction": "lower"})
    assert task_lib.parse_manifest(manifest, root).metric.grader.endswith(":mae")


@pytest.mark.parametrize(
    "grader, match",
    [
        ("os:system", "not an allowed grader module"),
        ("subprocess:run", "not an allowed grader module"),
        ("pkgx.mod:score", "not an allowed grader module"),  # a prefix is not the package
        ("pkg.mod:_private", "not 'module:function'"),
        ("pkg.mod:a:b", "not 'module:function'"),
        ("pkg/mod:score", "not 'module:function'"),
        (":score", "not 'module:function'"),
        (7, "not 'module:function'"),
    ],
)
def test_grader_outside_the_allowlist_is_refused(make_task, monkeypatch, grader, match):
    monkeypatch.setenv(task_lib.GRADER_MODULES_ENV, "pkg")
    manifest = base_manifest(metric={"grader": grader, "direction": "higher"})
    with pytest.raises(task_lib.ManifestError, match=f"'metric.grader' is .*{match}"):
        task_lib.load_task(make_task(manifest=manifest))


def _task_dir(root, task_id, y):
    """A task directory at `root` with id `task_id` and answers `y` (ids 0..)."""
    (root / "public").mkdir(parents=True)
    (root / "private" / "leaderboards").mkdir(parents=True)
    split = "held-out" if "held" in task_id else "train"
    (root / "manifest.json").write_text(json.dumps(base_manifest(id=task_id, split=split)))
    (root / "description.md").write_text(f"# {task_id}\n")
    write_csv(root / "private" / "answers.csv", ["id", "target"], list(enumerate(y)))
    write_csv(root / "private" / "leaderboards" / "private.csv", ["score"], [[1.0], [2.0]])
    return root


def test_duplicate_task_ids_are_refused(tmp_path):
    a = _task_dir(tmp_path / "a", "toy", [1.0, 2.0])
    b = _task_dir(tmp_path / "b", "toy", [100.0, 200.0])
    c = _task_dir(tmp_path / "c", "other", [1.0])
    with pytest.raises(task_lib.ManifestError) as e:
        task_lib.load_tasks([a, c, b])
    message = str(e.value)
    assert "duplicate task id 'toy'" in message and "\n" not in message
    assert str(a) in message and str(b) in message
    assert [t.id for t in task_lib.load_tasks([a, c])] == ["toy", "other"]


def test_trainer_task_set_refuses_duplicate_ids(tmp_path):
    # Before: both loaded, and the execution cache (keyed on the id) answered one
    # task with the other's outcomes.
    from wmrl_jax.train import builder
    from wmrl_jax.train.config import base_config, override

    root = tmp_path / "tasks"
    _task_dir(root / "first", "toy", [1.0, 2.0])
    _task_dir(root / "second", "toy", [100.0, 200.0])
    _task_dir(root / "third", "toy_held", [1.0])
    config = override(base_config(), **{"tasks.source": "dir", "tasks.path": str(root)})
    with pytest.raises(task_lib.ManifestError, match="duplicate task id 'toy'.*first.*second"):
        builder.load_tasks(config)


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


# ---- the public/private boundary on disk -------------------------------------------------


def _link_answers(root, name="answers.csv"):
    os.symlink(os.path.join("..", "private", "answers.csv"), os.path.join(root, "public", name))


@pytest.mark.parametrize(
    "attack",
    [
        "link-to-answers",
        "absolute-link-to-answers",
        "link-to-private-dir",
        "link-outside-the-task",
        "public-is-private",
        "public-is-a-link-into-private",
        "hard-link-of-answers",
        "description-is-the-answers",
        "fifo",
    ],
)
def test_public_side_cannot_reach_the_private_side(make_task, attack):
    root = make_task()
    public, private = os.path.join(root, "public"), os.path.join(root, "private")
    answers = os.path.join(private, "answers.csv")
    if attack == "link-to-answers":
        _link_answers(root)
    elif attack == "absolute-link-to-answers":
        os.symlink(answers, os.path.join(public, "a.csv"))
    elif attack == "link-to-private-dir":
        os.symlink(private, os.path.join(public, "p"))
    elif attack == "link-outside-the-task":
        os.symlink("/etc/hostname", os.path.join(public, "host"))
    elif attack == "public-is-private":
        os.rmdir(public)
        os.symlink("private", public)
    elif attack == "public-is-a-link-into-private":
        os.mkdir(os.path.join(private, "inner"))
        os.rmdir(public)
        os.symlink(os.path.join("private", "inner"), public)
    elif attack == "hard-link-of-answers":
        os.link(answers, os.path.join(public, "train.csv"))
    elif attack == "description-is-the-answers":
        os.remove(os.path.join(root, "description.md"))
        os.symlink(answers, os.path.join(root, "description.md"))
    elif attack == "fifo":
        os.mkfifo(os.path.join(public, "pipe"))
    with pytest.raises(task_lib.ManifestError, match="'toy'"):
        task_lib.load_task(root)


def test_public_may_be_a_link_and_hold_links_inside_it(make_task, tmp_path):
    root = make_task()
    upstream = tmp_path / "upstream_public"
    upstream.mkdir()
    (upstream / "train.csv").write_text("x\n1\n")
    (upstream / "alias.csv").symlink_to("train.csv")
    os.rmdir(os.path.join(root, "public"))
    os.symlink(upstream, os.path.join(root, "public"))
    task = task_lib.load_task(root)
    assert os.path.realpath(task.public_dir) == str(upstream)


def test_a_link_added_after_loading_reaches_no_program(make_task):
    """The executor refuses it too: an infra error (NaN reward, masked), never reward 1."""
    import warnings

    from wmrl_jax.envs.outcomes import SandboxOutcomes
    from wmrl_jax.sandbox import LocalExecutor, WeakIsolationWarning

    root = make_task()
    task = task_lib.load_task(root)
    _link_answers(root, "leak.csv")
    copy_answers = "import shutil\nshutil.copy('input/leak.csv', 'output/submission.csv')\n"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WeakIsolationWarning)
        executor = LocalExecutor(timeout_s=30)
    outcomes = SandboxOutcomes(executor)
    try:
        outcome = outcomes.submit(task, copy_answers).result()
    finally:
        outcomes.close()
    assert outcome.status == "infra_error" and math.isnan(outcome.reward), outcome
    assert "leak.csv" in outcome.message


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), -float("inf"), -1, 0, 10**400, "60", True, None],
    ids=["nan", "inf", "-inf", "negative", "zero", "10**400", "string", "bool", "null"],
)
def test_non_finite_or_impossible_limits_are_refused(make_task, value):
    root = make_task(manifest=base_manifest(limits={"wall_seconds": value, "memory_mb": 512}))
    with pytest.raises(task_lib.ManifestError, match="'limits.wall_seconds'"):
        task_lib.load_task(root)


@pytest.mark.parametrize("name", [["rmse"], {"a": 1}, 3])
def test_metric_name_of_the_wrong_type_is_named(make_task, name):
    root = make_task(manifest=base_manifest(metric={"name": name, "direction": "lower"}))
    with pytest.raises(task_lib.ManifestError, match="'metric.name'"):
        task_lib.load_task(root)


def test_deeply_nested_manifest_is_a_manifest_error(make_task):
    root = make_task()
    with open(os.path.join(root, "manifest.json"), "w") as f:
        f.write('{"id": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(task_lib.ManifestError, match="nested too deeply"):
        task_lib.load_task(root)
    with open(os.path.join(root, "manifest.json"), "w") as f:
        f.write('{"format_version": ' + "9" * 5000 + "}")
    with pytest.raises(task_lib.ManifestError, match="not valid JSON"):
        task_lib.load_task(root)
