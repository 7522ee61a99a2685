"""The tabular benchmark: the committed table, real re-execution, build and board refresh."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from tests.envs.test_recipes import local_executor, shared_suite
from wmrl_jax.envs import grading, recipes, suite, tabular
from wmrl_jax.envs.outcomes import SandboxOutcomes
from wmrl_jax.envs.recipes import Recipe
from wmrl_jax.envs.task import load_task

TABLE = os.path.join(os.path.dirname(tabular.__file__), "data", "recipe_table.npz")


@pytest.fixture(scope="session")
def suite_dir(tmp_path_factory) -> str:
    return shared_suite(tmp_path_factory)


@pytest.fixture(scope="module")
def table() -> tabular.RecipeTable:
    return tabular.RecipeTable.load(TABLE)


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
        # Real execution is noisy: most recipes score differently across replicates.
        var = table.reward_var(task_id)
        assert np.all(var >= 0) and np.mean(var > 0) > 0.5, task_id
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
    try:
        for j, ((task_id, r), future) in enumerate(zip(runs, futures, strict=True)):
            outcome = future.result()
            assert outcome.status == "ok", (task_id, recipes.describe(r), outcome.message)
            assert 0.0 <= outcome.percentile <= 1.0 and outcome.reward == outcome.percentile
            k = j % table.num_replicates
            recorded = table.score[table.row(task_id), recipes.recipe_index(r), k]
            # Same program, same data, one thread: equal up to float formatting.
            np.testing.assert_allclose(outcome.score, recorded, rtol=1e-9, err_msg=task_id)
    finally:
        outcomes.close()


def test_run_in_process_matches_the_table(table, suite_dir):
    task = load_task(os.path.join(suite_dir, "iris"))
    for index, k in ((0, 0), (100, 1), (250, 2)):
        source = recipes.compile_program(recipes.recipe_from_index(index), task)
        status, score, cpu, wall, message = tabular.run_in_process(task, source, replicate=k)
        assert (status, message) == ("ok", "")
        assert cpu >= 0 and wall > 0
        np.testing.assert_allclose(score, table.score[table.row("iris"), index, k], rtol=1e-9)


def test_run_in_process_reports_failures(suite_dir):
    task = load_task(os.path.join(suite_dir, "iris"))
    assert tabular.run_in_process(task, "raise RuntimeError('boom')")[0] == "error"
    assert "boom" in tabular.run_in_process(task, "raise RuntimeError('boom')")[4]
    garbage = (
        "import os\n"
        "open(os.path.join(os.environ['WMRL_OUTPUT_DIR'], 'submission.csv'), 'w').write('x\\n1\\n')"
    )
    status, score, *_, message = tabular.run_in_process(task, garbage)
    assert status == "invalid" and np.isnan(score) and "invalid_format" in message


def test_build_save_load_and_refresh_boards(tmp_path, suite_dir):
    mini = tmp_path / "suite"
    shutil.copytree(os.path.join(suite_dir, "iris"), mini / "iris")
    built = tabular.build(os.fspath(mini), workers=1, indices=[0, 250], replicates=2, log=None)
    path = os.fspath(tmp_path / "t.npz")
    built.save(path)
    table = tabular.RecipeTable.load(path, suite=os.fspath(mini))
    assert table.task_ids == ("iris",) and table.num_replicates == 2
    assert table.status.shape == (1, recipes.NUM_RECIPES, 2)
    digest = table.digest()
    assert tabular.RecipeTable.load(path).digest() == digest  # Stable across loads.
    assert table.status_names("iris", 1)[0] == "ok" and table.status_names("iris")[1] == "error"
    assert table.meta["tasks"]["iris"]["messages"]["1/1"] == "not executed"
    # Replicates differ: another validation split, another fit (a 1e-9 change would do).
    assert table.score[0, 250, 0] != table.score[0, 250, 1]
    score = table.score[0, 250, 0]
    # A board holding exactly this score and one better: mid-rank percentile 0.5 / 2.
    score, better = float(score), float(score) - 1.0  # log_loss: lower is better
    board = mini / "iris" / "private" / "leaderboards" / "private.csv"
    board.write_text(f"entry,score\na,{score!r}\nb,{better!r}\n")
    tabular.main(["refresh-boards", "--suite", os.fspath(mini), "--table", path])
    refreshed = tabular.RecipeTable.load(path)
    assert refreshed.replicate_percentile("iris")[250, 0] == pytest.approx(0.25)
    assert refreshed.digest() != digest  # The boards moved.
    assert refreshed.reward("iris")[1] == grading.DEFAULT_FLOORS.error
    assert refreshed.reward_var("iris")[1] == 0.0
    np.testing.assert_array_equal(refreshed.score, table.score)
    assert "iris" in tabular.summary(refreshed)
    with pytest.raises(ValueError, match=r"replicate must be in \[0, 2\)"):
        refreshed.status_names("iris", 2)


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


def test_update_re_executes_only_stale_tasks(tmp_path, suite_dir):
    mini = tmp_path / "suite"
    for task_id in ("iris", "moons_high_noise"):
        shutil.copytree(os.path.join(suite_dir, task_id), mini / task_id)
    base = tabular.build(os.fspath(mini), workers=1, indices=[0, 100], log=None)
    assert tabular.stale_tasks(base, os.fspath(mini)) == []
    # New training data for one task: only that task is stale.
    train = mini / "moons_high_noise" / "public" / "train.csv"
    train.chmod(0o644)
    lines = train.read_text().splitlines(keepends=True)
    train.write_text("".join(lines[:-1]))
    assert tabular.stale_tasks(base, os.fspath(mini)) == ["moons_high_noise"]
    update = tabular.build(
        os.fspath(mini), workers=1, only=["moons_high_noise"], indices=[0], log=None
    )
    merged = tabular.merge(base, update)
    assert merged.task_ids == base.task_ids
    np.testing.assert_array_equal(merged.score[0], base.score[0])  # iris untouched
    np.testing.assert_array_equal(merged.score[1], update.score[0])
    assert tabular.stale_tasks(merged, os.fspath(mini)) == []
    single = tabular.build(
        os.fspath(mini), workers=1, only=["iris"], indices=[0], replicates=1, log=None
    )
    with pytest.raises(tabular.TableError, match="1 replicates into one of 3"):
        tabular.merge(base, single)
