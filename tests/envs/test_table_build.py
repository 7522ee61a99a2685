"""Building the recipe table: in-process execution, build, save / load, board refresh
and updates of stale tasks."""

from __future__ import annotations

import functools
import io
import os
import shutil

import numpy as np
import pytest

from wmrl_jax.envs import grading, recipes, table_build, tabular
from wmrl_jax.envs.task import load_task


def test_run_in_process_matches_the_table(table, suite_dir):
    task = load_task(os.path.join(suite_dir, "iris"))
    for index, k in ((0, 0), (100, 1), (250, 2)):
        source = recipes.compile_program(recipes.recipe_from_index(index), task)
        status, score, cpu, wall, message = table_build.run_in_process(task, source, replicate=k)
        assert (status, message) == ("ok", "")
        assert cpu >= 0 and wall > 0
        np.testing.assert_allclose(score, table.score[table.row("iris"), index, k], rtol=1e-9)


def test_run_in_process_reports_failures(suite_dir):
    task = load_task(os.path.join(suite_dir, "iris"))
    assert table_build.run_in_process(task, "raise RuntimeError('boom')")[0] == "error"
    assert "boom" in table_build.run_in_process(task, "raise RuntimeError('boom')")[4]
    garbage = (
        "import os\n"
        "open(os.path.join(os.environ['WMRL_OUTPUT_DIR'], 'submission.csv'), 'w').write('x\\n1\\n')"
    )
    status, score, *_, message = table_build.run_in_process(task, garbage)
    assert status == "invalid" and np.isnan(score) and "invalid_format" in message


def test_build_save_load_and_refresh_boards(tmp_path, suite_dir):
    mini = tmp_path / "suite"
    shutil.copytree(os.path.join(suite_dir, "iris"), mini / "iris")
    built = table_build.build(os.fspath(mini), workers=1, indices=[0, 250], replicates=2, log=None)
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
    table_build.main(["refresh-boards", "--suite", os.fspath(mini), "--table", path])
    refreshed = tabular.RecipeTable.load(path)
    assert refreshed.replicate_percentile("iris")[250, 0] == pytest.approx(0.25)
    assert refreshed.digest() != digest  # The boards moved.
    assert refreshed.reward("iris")[1] == grading.DEFAULT_FLOORS.error
    assert refreshed.reward_var("iris")[1] == 0.0
    np.testing.assert_array_equal(refreshed.score, table.score)
    assert "iris" in table_build.summary(refreshed)
    with pytest.raises(ValueError, match=r"replicate must be in \[0, 2\)"):
        refreshed.status_names("iris", 2)


def test_update_re_executes_only_stale_tasks(tmp_path, suite_dir, monkeypatch):
    mini = tmp_path / "suite"
    for task_id in ("iris", "moons_high_noise"):
        shutil.copytree(os.path.join(suite_dir, task_id), mini / task_id)
    base = table_build.build(os.fspath(mini), workers=1, indices=[0, 100], log=None)
    assert table_build.stale_tasks(base, os.fspath(mini)) == []
    # New training data for one task: only that task is stale.
    train = mini / "moons_high_noise" / "public" / "train.csv"
    train.chmod(0o644)
    lines = train.read_text().splitlines(keepends=True)
    train.write_text("".join(lines[:-1]))
    assert table_build.stale_tasks(base, os.fspath(mini)) == ["moons_high_noise"]
    update = table_build.build(
        os.fspath(mini), workers=1, only=["moons_high_noise"], indices=[0], log=None
    )
    merged = table_build.merge(base, update)
    assert merged.task_ids == base.task_ids
    np.testing.assert_array_equal(merged.score[0], base.score[0])  # iris untouched
    np.testing.assert_array_equal(merged.score[1], update.score[0])
    assert table_build.stale_tasks(merged, os.fspath(mini)) == []
    # The command's --update: stale data must not stop the kept tasks' boards being re-read.
    original = table_build.build
    monkeypatch.setattr(table_build, "build", functools.partial(original, indices=[0]))
    updated = table_build.update(base, os.fspath(mini), workers=1, log=io.StringIO())
    assert updated.task_ids == base.task_ids
    np.testing.assert_array_equal(updated.score[0], base.score[0])
    np.testing.assert_array_equal(updated.score[1], update.score[0])
    assert table_build.stale_tasks(updated, os.fspath(mini)) == []
    # Every task stale (a generation switch): all re-executed, nothing checked against old data.
    for path in (mini / "iris" / "public" / "train.csv", train):
        path.chmod(0o644)
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    log = io.StringIO()
    rebuilt = table_build.update(updated, os.fspath(mini), workers=1, log=log)
    assert "re-executing ['iris', 'moons_high_noise']" in log.getvalue()
    assert table_build.stale_tasks(rebuilt, os.fspath(mini)) == []
    single = original(
        os.fspath(mini), workers=1, only=["iris"], indices=[0], replicates=1, log=None
    )
    with pytest.raises(tabular.TableError, match="1 replicates into one of 3"):
        table_build.merge(base, single)
