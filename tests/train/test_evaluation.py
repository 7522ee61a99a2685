"""Held-out evaluation: when it runs, what is submitted and how it is scored."""

import concurrent.futures
import types

import ml_collections
import pytest

from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.train.evaluation import EvalSchedule, evaluate
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
