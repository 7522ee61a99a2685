"""The recipe table: the committed table against the seed-0 suite and the sandbox,
and what loading refuses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.envs.test_recipes import local_executor
from wmrl_jax.envs import recipes, suite, tabular
from wmrl_jax.envs.outcomes import SandboxOutcomes
from wmrl_jax.envs.recipes import Recipe
from wmrl_jax.envs.task import load_task

TABLE = tabular.DEFAULT_TABLE


def test_committed_table_covers_the_suite(table):
    # The grown suite's 56 tasks, which include the core suite's 22.
    assert set(table.task_ids) == {s.id for s in suite.suite_specs("grown")}
    k = table.num_replicates
    assert k == tabular.REPLICATES >= 3 and table.meta["replicates"] == k
    assert table.status.shape == (len(table.task_ids), recipes.NUM_RECIPES, k)
    ok = table.status == 0
    assert np.all(np.isfinite(table.score[ok])) and np.all(np.isnan(table.score[~ok]))
    assert np.all(table.seconds >= 0) and table.meta["startup_seconds"] > 0
    for task_id in table.task_ids:
        pct = table.replicate_percentile(task_id)
        assert np.all((pct[ok[table.row(task_id)]] >= 0) & (pct[ok[table.row(task_id)]] <= 1))
        # The space spans bad to good on every task.
        assert np.nanmax(table.percentile(task_id)) - np.nanmin(table.percentile(task_id)) > 0.3
        # Real execution is noisy: most recipes that run in every replicate score
        # differently across them (a foreseeable failure fails the same way each time).
        var = table.reward_var(task_id)
        ran = ok[table.row(task_id)].all(axis=1)
        assert np.all(var >= 0) and np.mean(var[ran] > 0) > 0.5, task_id
        rewards = table.replicate_reward(task_id)
        np.testing.assert_allclose(table.reward(task_id), rewards.mean(axis=1), rtol=1e-12)
        np.testing.assert_allclose(var, rewards.var(axis=1, ddof=1), rtol=1e-12)
    assert os.path.getsize(TABLE) < 8 * 2**20


def test_committed_table_matches_the_seed0_suite(table, suite_dir):
    table.check_suite(suite_dir)


def _family_runs():
    """One recipe per family and task kind, cheap levels for the costly families."""
    runs = []
    for m, family in enumerate(recipes.MODELS):
        a = 0 if family in ("forest", "boosting", "mlp") else m % 3
        r = Recipe(preprocess=m % 4, model=m, a=a, b=(m + 1) % 3)
        runs += [("iris", r), ("sine_smooth", r)]
    return runs + [
        ("moons_high_noise", Recipe(1, 5, 1, 1)),
        ("moons_high_noise", Recipe(2, 3, 1, 1)),
        # Naive Bayes on unscaled, non-negative features: the multinomial model runs.
        ("iris", Recipe(0, recipes.MODELS.index("naive_bayes"), 0, 2)),
    ]


def test_every_family_runs_in_the_sandbox_and_matches_the_table(table, suite_dir):
    executor = local_executor(timeout_s=120, max_workers=2)
    outcomes = SandboxOutcomes(executor)
    runs = _family_runs()
    futures = []
    for j, (task_id, r) in enumerate(runs):
        task = load_task(os.path.join(suite_dir, task_id))
        source = recipes.compile_program(r, task)
        futures.append(outcomes.submit(task, source, replicate=j % table.num_replicates))
    scored = set()
    try:
        for j, ((task_id, r), future) in enumerate(zip(runs, futures, strict=True)):
            outcome = future.result()
            k = j % table.num_replicates
            at = (table.row(task_id), recipes.recipe_index(r), k)
            expected = tabular.STATUS_NAMES[table.status[at]]
            if expected == "timeout":
                # The build's CPU budget; a sandboxed executor does not enforce it.
                continue
            what = (task_id, recipes.describe(r), outcome.message)
            # A foreseeable failure fails here as it did in the build, and only it does.
            assert outcome.status == expected, what
            if expected != "ok":
                continue
            scored.add(recipes.MODELS[r.model])
            assert 0.0 <= outcome.percentile <= 1.0 and outcome.reward == outcome.percentile
            # Same program, same data, one thread: equal up to float formatting.
            np.testing.assert_allclose(outcome.score, table.score[at], rtol=1e-9, err_msg=task_id)
    finally:
        outcomes.close()
    assert scored == set(recipes.MODELS), set(recipes.MODELS) - scored


def test_load_refuses_a_table_without_replicates(tmp_path):
    with np.load(TABLE, allow_pickle=False) as z:
        arrays = {name: z[name] for name in z.files}
    meta = json.loads(str(arrays["meta_json"]))
    meta["format_version"] = 1
    arrays["meta_json"] = np.asarray(json.dumps(meta))
    old = tmp_path / "old.npz"
    np.savez_compressed(old, **arrays)
    with pytest.raises(tabular.TableError, match="format 1, this version reads format 2"):
        tabular.RecipeTable.load(os.fspath(old))


def test_load_refuses_other_data(tmp_path, suite_dir):
    mini = tmp_path / "suite"
    shutil.copytree(os.path.join(suite_dir, "iris"), mini / "iris")
    train = mini / "iris" / "public" / "train.csv"
    train.chmod(0o644)
    train.write_text(train.read_text().replace(",0\n", ",1\n", 1))
    with pytest.raises(tabular.TableError, match="'iris': data digest"):
        tabular.RecipeTable.load(TABLE, suite=os.fspath(mini))
    with pytest.raises(tabular.TableError, match="no task of the recipe table"):
        tabular.RecipeTable.load(TABLE, suite=os.fspath(tmp_path))


def test_old_command_names_the_new_one():
    run = subprocess.run(
        [sys.executable, "-m", "wmrl_jax.envs.tabular", "summary", "--table", TABLE],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    assert "python -m wmrl_jax.envs.table_build build|refresh-boards|summary" in run.stderr
