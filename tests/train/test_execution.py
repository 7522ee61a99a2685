"""The runner: the execution cache, retries, dropped rows and rejected rewards."""

import concurrent.futures
import math

import numpy as np
import pytest

from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.train.execution import Runner, cache_key, first_replicate


class Task:
    def __init__(self, id):
        self.id = id


class Source:
    """Answers replicate k of program `p` with reward len(p) + k / 10; `fail` lists
    programs that hit infra errors."""

    fingerprint = None

    def __init__(self, fail=(), num_replicates=1):
        self.calls, self.fail, self.num_replicates = [], set(fail), num_replicates

    def submit(self, task, program, *, replicate=0):
        assert 0 <= replicate < self.num_replicates
        self.calls.append((task.id, program) if self.num_replicates == 1 else
                          (task.id, program, replicate))  # fmt: skip
        if program in self.fail:
            out = Outcome("infra_error", math.nan, math.nan, math.nan, 0.0, "engine down")
        else:
            out = Outcome("ok", len(program) + replicate / 10, 0.5, 1.0, 2.0)
        fut = concurrent.futures.Future()
        fut.set_result(out)
        return fut

    def close(self):
        pass


def _run(runner, tasks, programs, rows, g):
    return runner.collect(runner.submit(tasks, programs, rows, g), tasks, programs, g)


def test_repeats_are_answered_from_the_cache_and_not_charged():
    source, tasks = Source(), [Task("a"), Task("b")]
    runner = Runner(source, retries=1, on_infra_error="wm_only")
    programs = ["xx", "xx", "yyy", "xx"]  # rows 0, 1 of task a; rows 2, 3 of task b
    got = _run(runner, tasks, programs, [0, 1, 2, 3], 2)
    assert source.calls == [("a", "xx"), ("b", "yyy"), ("b", "xx")]  # once per (task, program)
    assert got.executions == 3 and got.exec_seconds == 6.0 and got.counts["cached"] == 1
    assert {i: o.reward for i, o in got.outcomes.items()} == {0: 2.0, 1: 2.0, 2: 3.0, 3: 2.0}
    again = _run(runner, tasks, programs, [0, 2], 2)  # A later step: both from the cache.
    assert len(source.calls) == 3 and again.executions == 0 and again.counts["cached"] == 2
    # Checkpointed and restored.
    other = Runner(Source(), retries=1, on_infra_error="wm_only")
    other.restore_cache(runner.cache_state())
    assert other.cache == runner.cache


def test_without_cache_every_row_executes():
    source = Source()
    runner = Runner(source, retries=0, on_infra_error="wm_only", cache=False)
    got = _run(runner, [Task("a")], ["xx", "xx"], [0, 1], 2)
    assert len(source.calls) == 2 and got.executions == 2 and got.counts["cached"] == 0


def test_infra_errors_are_retried_dropped_and_never_cached():
    source = Source(fail={"bad"})
    runner = Runner(source, retries=2, on_infra_error="wm_only")
    got = _run(runner, [Task("a")], ["bad", "bad", "ok"], [0, 1, 2], 3)
    assert got.counts["dropped"] == 2 and got.counts["infra_errors"] == 3
    assert set(got.outcomes) == {2} and got.executions == 4  # 3 attempts + "ok"
    assert list(runner.cache) == [cache_key(Task("a"), "ok")]  # only the real result


def test_replicates_rotate_from_a_seeded_start_then_come_from_the_cache():
    source, task = Source(num_replicates=3), Task("a")
    runner = Runner(source, retries=0, on_infra_error="wm_only", seed=7)
    k0 = first_replicate(cache_key(task, "xx"), 7, 3)
    seen = []
    for _ in range(5):  # five steps, one row each
        got = _run(runner, [task], ["xx"], [0], 1)
        seen.append((got.executions, round(got.outcomes[0].reward - 2, 3), 0 in got.partners))
    order = [(k0 + n) % 3 / 10 for n in range(5)]
    # Three charged executions (one per replicate), then answers from the cache.
    assert seen == [(1, order[0], False), (1, order[1], True), (1, order[2], True),
                    (0, order[3], False), (0, order[4], False)]  # fmt: skip
    assert len(source.calls) == 3


def test_one_step_with_a_repeated_program_executes_two_replicates_as_a_pair():
    source, task = Source(num_replicates=3), Task("a")
    runner = Runner(source, retries=0, on_infra_error="wm_only")
    got = _run(runner, [task], ["xx", "xx"], [0, 1], 2)
    assert got.executions == 2 and got.counts["cached"] == 0
    assert set(got.partners) == {1} and got.partners[1].reward == got.outcomes[0].reward
    assert got.outcomes[0].reward != got.outcomes[1].reward


def test_the_seed_decides_which_replicate_comes_first():
    keys = [cache_key(Task("a"), f"p{i}") for i in range(40)]
    firsts = {seed: [first_replicate(k, seed, 3) for k in keys] for seed in (0, 1)}
    assert firsts[0] != firsts[1] and set(firsts[0]) == {0, 1, 2}
    assert all(first_replicate(k, 5, 1) == 0 for k in keys)


def test_checkpointed_cache_keeps_replicates_and_request_counts():
    runner = Runner(Source(num_replicates=3), retries=0, on_infra_error="wm_only", seed=3)
    for _ in range(2):
        _run(runner, [Task("a")], ["xx", "yyy"], [0, 1], 2)
    other = Runner(Source(num_replicates=3), retries=0, on_infra_error="wm_only", seed=3)
    other.restore_cache(runner.cache_state())
    assert other.cache == runner.cache and other.requests == runner.requests
    # The format before replicates (a list of rows) restores replicate 0.
    old = Runner(Source(), retries=0, on_infra_error="wm_only")
    old.restore_cache([["a", "d1", "ok", 1.0, 0.5, 1.0, 2.0, ""]])
    assert old.cache == {("a", "d1"): {0: Outcome("ok", 1.0, 0.5, 1.0, 2.0, "")}}


def test_a_source_without_replicates_is_refused():
    with pytest.raises(ValueError, match="num_replicates"):
        Runner(Source(num_replicates=0), retries=0, on_infra_error="wm_only")


def test_remembered_means_of_executed_programs():
    runner = Runner(Source(num_replicates=3), retries=0, on_infra_error="wm_only", seed=1)
    tasks = [Task("a"), Task("b")]
    for _ in range(2):  # "xx" on task a twice: two replicates known
        _run(runner, tasks, ["xx", "q", "zzz", "q"], [0], 2)
    mean, count = runner.remembered(tasks, ["xx", "xx", "xx", "zzz"], 2)
    rewards = [o.reward for o in runner.cache[cache_key(tasks[0], "xx")].values()]
    np.testing.assert_allclose(mean[:2], np.mean(rewards), rtol=1e-6)
    np.testing.assert_array_equal(count, [2, 2, 0, 0])  # "xx" was never executed on task b
    assert np.isnan(mean[2:]).all()
