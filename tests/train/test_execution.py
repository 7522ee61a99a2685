"""The runner: the execution cache, retries, dropped rows and rejected rewards."""

import concurrent.futures
import math

from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.train.execution import Runner, cache_key


class Task:
    def __init__(self, id):
        self.id = id


class Source:
    """Answers program `p` with reward len(p); `fail` lists programs that hit infra errors."""

    fingerprint = None

    def __init__(self, fail=()):
        self.calls, self.fail = [], set(fail)

    def submit(self, task, program):
        self.calls.append((task.id, program))
        if program in self.fail:
            out = Outcome("infra_error", math.nan, math.nan, math.nan, 0.0, "engine down")
        else:
            out = Outcome("ok", float(len(program)), 0.5, 1.0, 2.0)
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
