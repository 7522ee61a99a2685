"""Generation 2's foreseeable failures: executed like any other outcome, and only then."""

from __future__ import annotations

import json
import os

import pytest

from wmrl_jax.envs import families, recipes, suite, table_build
from wmrl_jax.envs.recipes import Recipe
from wmrl_jax.envs.task import load_task

NB = recipes.MODELS.index("naive_bayes")
NONE, STANDARD = recipes.PREPROCESS.index("none"), recipes.PREPROCESS.index("standard")


def _task(root, task_id, generation, monkeypatch):
    monkeypatch.setattr(families, "GENERATION", generation)
    path, _ = suite.write_task(suite.spec_by_id(task_id), str(root), seed=0)
    board = os.path.join(path, "private", "leaderboards", "private.csv")
    with open(board, "w", encoding="utf-8") as f:
        f.write("entry,score\na,0.0\nb,0.5\nc,1.0\nd,2.0\n")
    return load_task(path)


def _run(task, recipe):
    return table_build.run_in_process(task, recipes.compile_program(recipe, task))


@pytest.mark.parametrize("generation", [1, 2])
def test_naive_bayes_failures(tmp_path, monkeypatch, generation):
    iris = _task(tmp_path / "c", "iris", generation, monkeypatch)  # non-negative features
    sine = _task(tmp_path / "r", "sine_smooth", generation, monkeypatch)
    raw, scaled, gaussian = Recipe(NONE, NB, 0, 2), Recipe(STANDARD, NB, 0, 2), Recipe(1, NB, 2, 2)
    got = {name: _run(task, r) for name, task, r in (
        ("raw", iris, raw), ("scaled", iris, scaled), ("gaussian", iris, gaussian),
        ("regression", sine, raw),
    )}  # fmt: skip
    assert got["raw"][0] == got["gaussian"][0] == "ok"
    if generation == 1:
        assert got["scaled"][0] == got["regression"][0] == "ok"
        return
    # A count model on standardised (negative) features; a classifier on a real target.
    assert got["scaled"][0] == "error" and "Negative values" in got["scaled"][4]
    assert got["regression"][0] == "error" and "Unknown label type" in got["regression"][4]
    assert "multinomial" in recipes.describe(raw)


def test_cpu_budget_times_out_and_charges_the_budget(tmp_path, monkeypatch):
    task = _task(tmp_path, "iris", 2, monkeypatch)
    with open(os.path.join(task.public_dir, "..", "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["limits"]["cpu_seconds"] == suite.CPU_BUDGET
    manifest["limits"]["cpu_seconds"] = 1e-6
    with open(os.path.join(task.public_dir, "..", "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    task = load_task(os.path.dirname(task.public_dir))
    status, score, cpu, wall, message = _run(task, Recipe(1, recipes.MODELS.index("linear"), 1, 2))
    assert status == "timeout" and cpu == 1e-6 and wall > cpu and "CPU s" in message
    monkeypatch.setattr(families, "GENERATION", 1)
    path, _ = suite.write_task(suite.spec_by_id("iris"), str(tmp_path / "g1"), seed=0)
    assert "cpu_seconds" not in load_task(path).limits
