"""The replay-oracle step hook: fed rewards against the truth, and the out-of-sample WM."""

import dataclasses

import numpy as np

from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.studies.compute import step_series
from wmrl_jax.studies.oracle import replay_oracle, stream_errors
from wmrl_jax.train.records import Anchors, Execution, Fed, Sampled, StepRecord


class Task:
    def __init__(self, id):
        self.id = id


class Truth:
    """The true reward of program p is float(p)."""

    def lookup(self, task, program):
        return Outcome("ok", float(program), 0.5, 0.5, 1.0)


def _record(programs, wm, executed_rows):
    n = len(programs)
    results = {i: Truth().lookup(None, programs[i]) for i in executed_rows}
    return StepRecord(
        Sampled(1, (Task("a"),), n, Rollout(programs, {}, 0)),
        WMOutput(np.asarray(wm, np.float32), np.ones(n, np.float32), 0, 0),
        Anchors(np.ones(1, bool), np.ones(1, np.float32)),
        Execution.of(results, {}, {}, num_rows=n),
        Fed(np.asarray(wm, np.float32), np.ones(n, bool)),
    )


def test_oracle_metrics_and_the_out_of_sample_rank_correlation():
    hook = replay_oracle(Truth())
    programs = ["0.1", "0.2", "0.3", "0.4", "0.5"]
    # The WM ranks the first three right and the last two backwards.
    wm = [0.1, 0.2, 0.3, 0.9, 0.0]
    m = hook(_record(programs, wm, executed_rows=[]))
    assert m["oracle/true_reward"] == np.float64(0.3)
    assert np.isclose(m["oracle/fed_bias"], np.mean(np.subtract(wm, [0.1, 0.2, 0.3, 0.4, 0.5])))
    assert np.isclose(m["oracle/wm_group_rank_corr"], m["oracle/wm_oos_group_rank_corr"])
    # Once the two misranked programs have been executed, what is left is ranked right.
    m = hook(_record(programs, wm, executed_rows=[3, 4]))
    assert m["oracle/wm_oos_group_rank_corr"] == 1.0
    assert m["oracle/wm_group_rank_corr"] < 1.0


def test_step_series_pads_runs_of_different_length():
    runs = [{"steps": [{"x": 1.0}, {"x": 2.0}]}, {"steps": [{"x": 3.0}]}]
    np.testing.assert_array_equal(step_series(runs, "x"), [[1.0, 2.0], [3.0, np.nan]])


def test_stream_errors_compare_the_streams_on_the_same_executed_rows():
    truth = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    rec = _record(["0.1", "0.2", "0.3", "0.4", "0.5"], truth, executed_rows=[])
    executed = np.array([True, True, True, True, False])
    real = np.where(executed, truth + [0.2, -0.2, 0.2, -0.2, 0.0], np.nan)
    partner = np.array([truth[0] - 0.2, np.nan, np.nan, np.nan, np.nan])  # row 0: a pair
    rec = dataclasses.replace(
        rec,
        execution=Execution({}, {}, real, executed, partner),
        fed=Fed(
            (truth + [0.0, 0.05, -0.05, 0.0, 9.0]).astype(np.float32),
            np.ones(5, bool),
            debiased=(truth + [0.1, 0.1, -0.1, np.nan, 0.0]).astype(np.float32),  # row 3 unusable
        ),
    )
    m = stream_errors(rec, truth)
    # Rows 0-2 only (executed, with a debiased prediction); row 0's real is the pair mean.
    np.testing.assert_allclose(m["oracle/anchor_real_error_var"], np.var([0.0, -0.2, 0.2]), 1e-6)
    np.testing.assert_allclose(m["oracle/anchor_wm_error_var"], np.var([0.1, 0.1, -0.1]), 1e-6)
    np.testing.assert_allclose(m["oracle/anchor_fed_error_var"], np.var([0.0, 0.05, -0.05]), 1e-6)
    # Errors (0, -0.2, 0.2) and (0.1, 0.1, -0.1): Pearson correlation -sqrt(3)/2.
    np.testing.assert_allclose(m["oracle/anchor_error_corr"], -np.sqrt(3) / 2, 1e-5)
    # An arm without a world model has no streams to compare.
    rec = dataclasses.replace(rec, fed=dataclasses.replace(rec.fed, debiased=None))
    assert stream_errors(rec, truth) == {}
