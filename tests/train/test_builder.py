"""The trainer's task sources on MLE-Dojo competitions in the upstream layout."""

import json
import os
import shutil

import pytest

from experiments.configs import qwen3_4b_mledojo, tiny_cpu
from tests.envs import test_mle_bench
from tests.envs.test_mle_dojo import make_competition
from wmrl_jax.envs import grading
from wmrl_jax.train import builder
from wmrl_jax.train import config as config_lib
from wmrl_jax.train.config import ConfigError, override

AUC = {"name": "auc", "direction": "higher"}


def _dojo_config(tmp_path, *, split=None, metrics=None):
    prepared = tmp_path / "prepared"
    for name in ("comp-a", "comp-b", "comp-c"):
        make_competition(prepared, name)
    split_file, metrics_file = tmp_path / "competition.json", tmp_path / "metrics.json"
    split = split or {"Training": ["comp-a", "comp-b"], "Evaluation": {"Tabular": ["comp-c"]}}
    split_file.write_text(json.dumps(split))
    metrics_file.write_text(json.dumps(metrics or {n: AUC for n in ("comp-a", "comp-b", "comp-c")}))
    return override(
        qwen3_4b_mledojo.get_config("runlocal"),
        **{
            "tasks.source": "mle_dojo",
            "tasks.path": str(prepared),
            "tasks.views": str(tmp_path / "views"),
            "tasks.split_file": str(split_file),
            "tasks.metrics_file": str(metrics_file),
        },
    )


def test_mle_dojo_source_gives_split_task_views(tmp_path):
    sets = builder.load_tasks(_dojo_config(tmp_path))
    assert [t.id for t in sets.train] == ["comp-a", "comp-b"]
    assert [t.id for t in sets.heldout] == ["comp-c"] and sets.pretrain == []
    task = sets.heldout[0]
    assert task.source == "mle-dojo" and task.percentile_rule == "mle_dojo"
    # The view links the public data; answers stay on the grader's side.
    assert os.path.realpath(task.public_dir).startswith(str(tmp_path / "prepared"))
    assert not os.path.exists(os.path.join(task.public_dir, "test_answer.csv"))
    submission = tmp_path / "submission.csv"
    submission.write_text("Id,Probability\n1,0.1\n2,0.9\n3,0.8\n4,0.2\n")
    result = grading.grade(task, str(submission))
    assert result.valid and result.score == pytest.approx(1.0), result


@pytest.mark.parametrize(
    "field, match",
    [
        ("tasks.split_file", "config.tasks.split_file is required"),
        ("tasks.metrics_file", "config.tasks.metrics_file is required"),
    ],
)
def test_mle_dojo_source_needs_its_files(tmp_path, field, match):
    config = override(_dojo_config(tmp_path), **{field: ""})
    with pytest.raises(ConfigError, match=match):
        builder.load_tasks(config)


def test_mle_dojo_metric_is_never_guessed(tmp_path):
    config = _dojo_config(tmp_path, metrics={"comp-a": AUC, "comp-c": AUC})
    with pytest.raises(ConfigError, match="no metric for competition 'comp-b'"):
        builder.load_tasks(config)


def test_mle_dojo_source_needs_held_out_tasks(tmp_path):
    config = _dojo_config(tmp_path, split={"train": ["comp-a", "comp-b", "comp-c"], "held-out": []})
    with pytest.raises(ConfigError, match="no held-out tasks"):
        builder.load_tasks(config)


def test_workdir_must_be_a_writable_directory(tmp_path):
    builder.check_workdir(str(tmp_path / "new" / "dir"))  # created
    afile = tmp_path / "afile"
    afile.write_text("x")
    for bad in (afile, afile / "below"):
        with pytest.raises(ConfigError, match="is not a writable directory"):
            builder.check_workdir(str(bad))


def test_a_task_that_cannot_be_graded_fails_at_start(tmp_path, monkeypatch):
    config = _dojo_config(tmp_path)
    builder.load_tasks(config)  # every task's grader side reads

    def broken(task):
        if task.id == "comp-c":
            raise grading.TaskError("answers.csv is missing")

    monkeypatch.setattr(grading, "check_task", broken)
    with pytest.raises(ConfigError, match="task 'comp-c' cannot be graded: answers.csv"):
        builder.load_tasks(config)


def test_an_executing_source_fingerprints_the_tasks_grader_side(tmp_path):
    config = override(_dojo_config(tmp_path), **{"executor.kind": "local"})
    tasks = [*builder.load_tasks(config).train, *builder.load_tasks(config).heldout]

    def fingerprint():
        outcomes, _ = builder.make_outcomes(config, tasks=tasks)
        outcomes.close()
        return outcomes.fingerprint

    before = fingerprint()
    assert before is not None and before == fingerprint()
    answers = os.path.join(grading._private_dir(tasks[-1]), "answers.csv")
    with open(answers, "a", encoding="utf-8") as f:
        f.write("5,1\n")  # An answer edited between runs: the resume guard must see it.
    assert fingerprint() != before


def _bench_config(tmp_path, **overrides):
    """Two MLE-bench competitions in the upstream layout, one per split."""
    competitions, data = tmp_path / "mlebench" / "competitions", tmp_path / "data"
    for name in ("bench-a", "bench-b"):
        spec, prepared = test_mle_bench.make_competition(tmp_path / f"src-{name}")
        shutil.copytree(spec, competitions / name)
        text = (competitions / name / "config.yaml").read_text()
        (competitions / name / "config.yaml").write_text(text.replace("toy-bench", name))
        shutil.copytree(prepared / "toy-bench", data / name)
    split_file = tmp_path / "split.json"
    split_file.write_text(json.dumps({"train": ["bench-a"], "held-out": ["bench-b"]}))
    fields = {
        "tasks.source": "mle_bench",
        "tasks.path": str(competitions),
        "tasks.data_root": str(data),
        "tasks.views": str(tmp_path / "views"),
        "tasks.split_file": str(split_file),
    }
    return override(qwen3_4b_mledojo.get_config("runlocal"), **{**fields, **overrides})


def test_every_task_source_has_a_loader():
    assert set(builder.TASK_LOADERS) == set(config_lib.TASK_SOURCES)


def test_every_executor_kind_has_a_builder():
    # "replay" answers from the recipe table; every other kind builds a sandbox executor.
    assert set(builder.EXECUTORS) | {"replay"} == set(config_lib.EXECUTORS)


def test_an_executor_that_cannot_run_is_a_config_error(monkeypatch):
    from wmrl_jax import sandbox

    def engine_down(c):
        raise sandbox.InfraError("the Docker engine is not reachable")

    monkeypatch.setitem(builder.EXECUTORS, "docker", engine_down)
    config = override(tiny_cpu.get_config(), **{"executor.kind": "docker"})
    with pytest.raises(ConfigError, match="executor.kind='docker' but: the Docker engine"):
        builder.make_outcomes(config)


def test_mle_bench_source_gives_split_task_views(tmp_path):
    config = _bench_config(tmp_path)
    config_lib.validate_config(config)
    sets = builder.load_tasks(config)
    assert [t.id for t in sets.train] == ["bench-a"]
    assert [t.id for t in sets.heldout] == ["bench-b"] and sets.pretrain == []
    task = sets.heldout[0]
    assert task.metric.name == "rmse" and task.metric.direction == "lower"  # from the board
    submission = tmp_path / "submission.csv"
    submission.write_text("id,y\n0,1.0\n1,2.0\n2,3.0\n")
    result = grading.grade(task, str(submission))
    assert result.valid and result.score == pytest.approx(0.0), result


@pytest.mark.parametrize(
    "field, match",
    [
        ("tasks.data_root", "config.tasks.data_root is required"),
        ("tasks.split_file", "config.tasks.split_file is required"),
    ],
)
def test_mle_bench_source_needs_its_files(tmp_path, field, match):
    with pytest.raises(ConfigError, match=match):
        builder.load_tasks(_bench_config(tmp_path, **{field: ""}))


def test_a_broken_mle_bench_competition_is_named(tmp_path):
    config = _bench_config(tmp_path)
    os.remove(tmp_path / "mlebench" / "competitions" / "bench-b" / "leaderboard.csv")
    with pytest.raises(ConfigError, match="MLE-bench competition 'bench-b'"):
        builder.load_tasks(config)
