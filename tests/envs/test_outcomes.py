"""Program -> Outcome: sandbox statuses to rewards, and replays from the recipe table."""

from __future__ import annotations

import concurrent.futures
import math
import os
import shutil

import numpy as np
import pytest

from tests.envs.test_recipes import local_executor, shared_suite
from wmrl_jax.envs import grading, recipes, tabular
from wmrl_jax.envs.outcomes import (
    PROGRAM_FILE,
    Outcome,
    ReplayExecutor,
    SandboxOutcomes,
    failed_outcome,
    with_replicate,
)
from wmrl_jax.envs.task import load_task
from wmrl_jax.sandbox import ExecutionResult

TABLE = os.path.join(os.path.dirname(tabular.__file__), "data", "recipe_table.npz")
FLOORS = grading.DEFAULT_FLOORS

COPY_SAMPLE = """
import os, shutil
shutil.copy(os.path.join(os.environ["WMRL_INPUT_DIR"], "sample_submission.csv"),
            os.path.join(os.environ["WMRL_OUTPUT_DIR"], "submission.csv"))
"""
GARBAGE = """
import os
with open(os.path.join(os.environ["WMRL_OUTPUT_DIR"], "submission.csv"), "w") as f:
    f.write("id,p_0\\nnot,a number\\n")
"""


@pytest.fixture(scope="session")
def suite_dir(tmp_path_factory) -> str:
    return shared_suite(tmp_path_factory)


@pytest.fixture(scope="module")
def iris(suite_dir):
    return load_task(os.path.join(suite_dir, "iris"))


@pytest.fixture(scope="module")
def sandbox():
    executor = local_executor(timeout_s=60, max_workers=2)
    outcomes = SandboxOutcomes(executor)
    yield outcomes
    outcomes.close()


def test_sandbox_statuses_and_floor_rewards(sandbox, iris):
    cases = {
        "ok": COPY_SAMPLE,
        "error": "raise RuntimeError('boom')",
        "invalid": GARBAGE,
        "missing": "print('no file written')",
    }
    futures = {k: sandbox.submit(iris, src) for k, src in cases.items()}
    slow = SandboxOutcomes(sandbox.executor, timeout_s=1.0, close_executor=False)
    futures["timeout"] = slow.submit(iris, "import time\ntime.sleep(30)")
    got = {k: f.result(timeout=120) for k, f in futures.items()}

    ok = got["ok"]
    assert ok.status == "ok" and ok.reward == ok.percentile and ok.seconds > 0
    # The sample submission is the ladder's constant prior: the same score as on the board.
    expected = grading.grade(iris, os.path.join(iris.public_dir, "sample_submission.csv"))
    assert ok.score == expected.score and ok.percentile == expected.percentile
    assert (got["error"].status, got["error"].reward) == ("error", FLOORS.error)
    assert "boom" in got["error"].message
    assert (got["invalid"].status, got["invalid"].reward) == ("invalid", FLOORS.invalid)
    assert (got["missing"].status, got["missing"].reward) == ("invalid", FLOORS.invalid)
    assert "missing" in got["missing"].message
    assert (got["timeout"].status, got["timeout"].reward) == ("timeout", FLOORS.timeout)
    for k in ("error", "invalid", "missing", "timeout"):
        assert math.isnan(got[k].score) and math.isnan(got[k].percentile)


class _FakeExecutor:
    """Returns a fixed result, raises in submit, or fails its future."""

    def __init__(self, mode):
        self.mode = mode
        self.closed = False
        self.calls = []

    def submit(self, source, *, input_dir=None, timeout_s=None, files=None):
        self.calls.append((source, files))
        if self.mode == "raise":
            raise RuntimeError("engine unreachable")
        future = concurrent.futures.Future()
        if self.mode == "fail":
            future.set_exception(OSError("lost the container"))
        else:
            future.set_result(
                ExecutionResult(status=self.mode, wall_seconds=2.5, message="daemon died")
            )
        return future

    def close(self):
        self.closed = True


@pytest.mark.parametrize("mode", ["infra_error", "raise", "fail"])
def test_infra_errors_get_nan_rewards(iris, mode):
    executor = _FakeExecutor(mode)
    outcomes = SandboxOutcomes(executor)
    outcome = outcomes.submit(iris, "print(1)").result(timeout=5)
    assert outcome.status == "infra_error" and math.isnan(outcome.reward)
    assert outcome.message
    outcomes.close()
    assert executor.closed


def test_sandbox_runs_the_program_with_its_replicate(sandbox, iris):
    program = 'import os\nraise RuntimeError("replicate=" + os.environ["WMRL_REPLICATE"])\n'
    got = [sandbox.submit(iris, program, **kw).result(timeout=120) for kw in ({}, {"replicate": 3})]
    assert [o.status for o in got] == ["error", "error"]
    assert "replicate=0" in got[0].message and "replicate=3" in got[1].message


def test_with_replicate_hands_the_executor_a_launcher_and_the_program(iris):
    executor = _FakeExecutor("oom")
    SandboxOutcomes(executor).submit(iris, "print(1)", replicate=2).result()
    ((launcher, files),) = executor.calls
    assert (launcher, files) == with_replicate("print(1)", 2)
    assert files == {PROGRAM_FILE: "print(1)"} and '"WMRL_REPLICATE"] = "2"' in launcher
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="non-negative integer"):
            SandboxOutcomes(executor).submit(iris, "print(1)", replicate=bad)
    assert len(executor.calls) == 1  # Refused before anything ran.


def test_custom_floors_and_oom(iris):
    floors = grading.RewardFloors(oom=-3.0, infra_error=-9.0)
    outcome = SandboxOutcomes(_FakeExecutor("oom"), floors=floors).submit(iris, "x").result()
    assert (outcome.status, outcome.reward, outcome.seconds) == ("oom", -3.0, 2.5)
    assert failed_outcome("infra_error", floors=floors).reward == -9.0
    with pytest.raises(ValueError, match="failure"):
        failed_outcome("ok")


@pytest.fixture(scope="module")
def replay():
    return ReplayExecutor(tabular.RecipeTable.load(TABLE))


@pytest.mark.parametrize("index, k", [(0, 0), (7, 1), (100, 2), (287, 0)])
def test_replay_returns_the_recorded_outcome(replay, iris, index, k):
    source = recipes.compile_program(recipes.recipe_from_index(index), iris)
    future = replay.submit(iris, source, replicate=k)
    assert future.done()
    outcome = future.result()
    table, t = replay.table, replay.table.row("iris")
    assert isinstance(outcome, Outcome)
    assert outcome.status == table.status_names("iris", k)[index]
    assert outcome.seconds == pytest.approx(
        table.seconds[t, index, k] + table.meta["startup_seconds"], rel=1e-12
    )
    assert outcome.reward == table.replicate_reward("iris")[index, k]
    np.testing.assert_equal(outcome.score, table.score[t, index, k])
    np.testing.assert_equal(outcome.percentile, table.replicate_percentile("iris")[index, k])
    assert replay.recipe_of(iris, source) == index
    assert replay.submit(iris, source).result() == replay.submit(iris, source, replicate=0).result()


def test_replay_lookup_is_the_replicate_mean(replay, iris):
    table, t = replay.table, replay.table.row("iris")
    # The best recipe by mean reward: valid in every replicate, yet noisy.
    index = int(np.argmax(table.reward("iris")))
    source = recipes.compile_program(recipes.recipe_from_index(index), iris)
    draws = [replay.submit(iris, source, replicate=k).result() for k in range(3)]
    truth = replay.lookup(iris, source)
    assert truth.status == "ok" and truth.reward == pytest.approx(
        np.mean([d.reward for d in draws]), rel=1e-12
    )
    assert truth.percentile == pytest.approx(np.mean([d.percentile for d in draws]), rel=1e-12)
    assert truth.score == pytest.approx(np.mean(table.score[t, index]), rel=1e-12)
    assert replay.reward_mean(iris, source) == truth.reward == table.reward("iris")[index]
    var = np.var([d.reward for d in draws], ddof=1)
    assert replay.reward_var(iris, source) == pytest.approx(var, rel=1e-9, abs=1e-15)
    assert replay.num_replicates == table.num_replicates == 3
    for bad in (3, -1):
        with pytest.raises(ValueError, match="replicate"):
            replay.submit(iris, source, replicate=bad)


def test_replay_lookup_of_mixed_statuses(iris):
    table = tabular.RecipeTable.load(TABLE)
    t = table.row("iris")
    table.status[t, 5] = [0, 2, 2]  # one valid run, two crashes: mostly "error"
    table.score[t, 5, 1:] = np.nan
    replay = ReplayExecutor(table)
    source = recipes.compile_program(recipes.recipe_from_index(5), iris)
    truth = replay.lookup(iris, source)
    pct = table.replicate_percentile("iris")[5, 0]
    assert truth.status == "error" and truth.percentile == pct
    assert truth.reward == pytest.approx((pct + 2 * FLOORS.error) / 3, rel=1e-12)
    assert truth.score == table.score[t, 5, 0]


def test_replay_rejects_unknown_programs_and_other_data(replay, iris, tmp_path):
    with pytest.raises(ValueError, match="'iris'.*not one of the 288 compiled recipes"):
        replay.submit(iris, COPY_SAMPLE)
    copy = tmp_path / "iris"
    shutil.copytree(os.path.dirname(iris.public_dir), copy)
    test_csv = copy / "public" / "test.csv"
    test_csv.chmod(0o644)
    test_csv.write_text(test_csv.read_text() + "")  # same bytes: still accepted
    fresh = ReplayExecutor(replay.table)
    task = load_task(copy)
    assert fresh.submit(task, recipes.compile_program(recipes.Recipe(0, 0, 0, 0), task)).done()
    test_csv.write_text(test_csv.read_text().replace("\n1,", "\n1,9", 1))
    other = ReplayExecutor(replay.table)
    with pytest.raises(tabular.TableError, match="'iris': data digest"):
        other.submit(task, recipes.compile_program(recipes.Recipe(0, 0, 0, 0), task))


def test_replay_rejects_a_task_outside_the_table(replay, make_task):
    task = load_task(make_task())
    with pytest.raises(tabular.TableError, match="'toy' is not in the recipe table"):
        replay.submit(task, "print(1)")


def test_fingerprint_covers_the_grader_side(make_task):
    # Before: an executing source's fingerprint was None whatever the tasks held, so a
    # run resumed after its answers were edited, on outcomes graded before the edit.
    from wmrl_jax.train import resume
    from wmrl_jax.train.config import base_config

    root = make_task()
    fingerprint = lambda: SandboxOutcomes(None, tasks=[load_task(root)]).fingerprint
    before = fingerprint()
    assert before is not None and before == fingerprint()
    assert SandboxOutcomes(None).fingerprint is None  # no tasks: nothing to compare
    private = os.path.join(root, "private")
    edits = {
        "answers": (os.path.join(private, "answers.csv"), "id,target\n0,1\n1,2\n2,100\n"),
        "board": (os.path.join(private, "leaderboards", "private.csv"), "entry,score\ne0,9\n"),
    }
    for name, (path, text) in edits.items():
        with open(path, "rb") as f:
            original = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        assert fingerprint() != before, name
        with open(path, "wb") as f:
            f.write(original)
        assert fingerprint() == before, name
    manifest = os.path.join(root, "manifest.json")
    with open(manifest, encoding="utf-8") as f:
        original = f.read()
    with open(manifest, "w", encoding="utf-8") as f:  # the grading config: another rule
        f.write(original.replace('"mid_rank"', '"beat_ratio"'))
    assert fingerprint() != before
    with open(manifest, "w", encoding="utf-8") as f:
        f.write(original)
    with open(os.path.join(root, "description.md"), "w", encoding="utf-8") as f:
        f.write("# another description\n")  # not grader side
    assert fingerprint() == before
    # The trainer's resume guard refuses a run whose answers changed since its checkpoints.
    with open(edits["answers"][0], "w", encoding="utf-8") as f:
        f.write(edits["answers"][1])
    config = base_config()
    meta = {"config": config.to_json_best_effort(), "outcomes_fingerprint": before}
    with pytest.raises(ValueError, match="another run .*outcome source .*task answers, boards"):
        resume.check_resumable(meta, config, fingerprint=fingerprint(), directory="ckpt")
