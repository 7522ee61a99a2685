"""Held-out evaluation: what is submitted and how it is scored."""

import concurrent.futures
import types

import pytest

from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.train.evaluation import evaluate


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
