"""Held-out evaluation: when it runs, what is submitted and how it is scored."""

import concurrent.futures
import logging
import math
import types

import ml_collections
import pytest

from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.train.evaluation import EvalSchedule, ExecutionFailure, InfraWatch, evaluate
from wmrl_jax.train.ledger import Ledger


class _Source:
    def __init__(self):
        self.submitted = []

    def submit(self, task, program, *, replicate=0):
        self.submitted.append((task.id, program))
        future = concurrent.futures.Future()
        future.set_result(Outcome("ok", 1.0, 0.8, 0.9, 2.0))
        return future


class _Agent:
    def greedy_programs(self, params, tasks):
        return ["", "print(1)"]


def test_a_sample_without_a_program_is_invalid_and_not_submitted():
    source = _Source()
    tasks = [types.SimpleNamespace(id="a"), types.SimpleNamespace(id="b")]
    result = evaluate(_Agent(), None, tasks, source)
    assert source.submitted == [("b", "print(1)")]
    assert result["eval/heldout_percentile"] == pytest.approx(0.4)
    assert result["eval/valid_fraction"] == 0.5 and result["eval/exec_seconds"] == 2.0
    assert result["eval/percentile/a"] == 0.0 and result["eval/percentile/b"] == 0.8


def test_schedule_by_steps_and_on_the_compute_grid():
    config = ml_collections.ConfigDict(
        dict(eval_every=3, budget=dict(compute_seconds=0.0, eval_points=4))
    )
    by_steps = EvalSchedule(config)
    assert [s for s in range(1, 10) if by_steps.due(s, Ledger(), [])] == [3, 6, 9]
    assert not by_steps.spent(Ledger(gen_seconds=1e9))  # No budget: never spent.
    config.budget.compute_seconds = 100.0  # Grid points at 25, 50, 75 and 100 seconds.
    by_compute = EvalSchedule(config)
    history = [{"gen_seconds": 20.0, "exec_seconds": 4.0}]  # 24 s at the last evaluation
    assert not by_compute.due(3, Ledger(gen_seconds=20.0, exec_seconds=4.9), history)
    assert by_compute.due(4, Ledger(gen_seconds=20.0, exec_seconds=5.0), history)
    assert by_compute.due(5, Ledger(wm_seconds=30.0, tool_seconds=21.0), history)
    assert not by_compute.spent(Ledger(exec_seconds=99.0))
    assert by_compute.spent(Ledger(exec_seconds=60.0, tool_seconds=40.0))


class _Flaky:
    """Task "a": one infrastructure error, then ok; task "b": always an infrastructure error."""

    def __init__(self):
        self.calls = {"a": 0, "b": 0}

    def submit(self, task, program, *, replicate=0):
        self.calls[task.id] += 1
        future = concurrent.futures.Future()
        down = task.id == "b" or self.calls["a"] == 1
        future.set_result(infra() if down else Outcome("ok", 0.6, 0.6, 0.5, 1.0))
        return future


def infra():
    return Outcome("infra_error", math.nan, math.nan, math.nan, 0.0, "engine gone")


class _Greedy:
    def greedy_programs(self, params, tasks):
        return ["print(1)"] * len(tasks)


def test_infra_errors_are_retried_then_masked_not_zero(caplog):
    source = _Flaky()
    tasks = [types.SimpleNamespace(id="a"), types.SimpleNamespace(id="b")]
    with caplog.at_level(logging.WARNING):
        result = evaluate(_Greedy(), None, tasks, source, retries=2)
    assert source.calls == {"a": 2, "b": 3}  # a: retried once; b: first try + 2 retries
    # b is masked: the mean is a's alone (0.6), not (0.6 + 0) / 2.
    assert result["eval/heldout_percentile"] == pytest.approx(0.6)
    assert result["eval/percentile/a"] == pytest.approx(0.6)
    assert math.isnan(result["eval/percentile/b"])
    assert result["eval/infra_errors"] == 1 and result["eval/executions"] == 2
    assert result["eval/valid_fraction"] == 1.0
    assert "engine gone" in caplog.text


def test_an_evaluation_without_a_usable_execution_has_no_percentile():
    source = _Flaky()
    tasks = [types.SimpleNamespace(id="b")]
    result = evaluate(_Greedy(), None, tasks, source, retries=0)
    assert math.isnan(result["eval/heldout_percentile"])
    assert math.isnan(result["eval/valid_fraction"]) and result["eval/infra_errors"] == 1


def test_infra_watch_stops_after_consecutive_failed_steps():
    watch = InfraWatch(3)
    watch.observe(attempts=4, failed=4, where="step 1")
    watch.observe(attempts=0, failed=0, where="step 2")  # nothing executed: no evidence
    watch.observe(attempts=4, failed=3, where="step 3")  # one usable: the count restarts
    watch.observe(attempts=4, failed=4, where="step 4")
    watch.observe(attempts=2, failed=2, where="step 5")
    with pytest.raises(ExecutionFailure, match=r"last 3 steps or evaluations, up to step 6.*"
                       r"\(the last: poll timeout too large\)"):  # fmt: skip
        watch.observe(attempts=1, failed=1, where="step 6", message="poll timeout\ntoo large")
    never = InfraWatch(0)
    for _ in range(10):
        never.observe(attempts=1, failed=1, where="step")
