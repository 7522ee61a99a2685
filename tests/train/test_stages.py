"""The step's stages: which rows count, what is fed, the advantages and the loss mask."""

import dataclasses

import numpy as np
import pytest

from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.train import arms, stages
from wmrl_jax.train.ledger import LedgerStep
from wmrl_jax.train.records import Anchors, Execution, Fed, Sampled


def _outcome(reward):
    return Outcome("ok", reward, 0.5, 0.5, 1.0, "")


def test_step_tasks_is_a_pure_function_of_seed_and_step():
    tasks = list(range(12))
    a = stages.step_tasks(tasks, seed=0, step=3, count=6)
    assert a == stages.step_tasks(tasks, seed=0, step=3, count=6)
    assert len(set(a)) == 6 and a != stages.step_tasks(tasks, seed=0, step=4, count=6)
    many = stages.step_tasks(tasks[:2], seed=0, step=1, count=5)
    assert sorted(many) == many and {many.count(0), many.count(1)} == {2, 3}


def test_wm_free_arms_feed_real_scores_of_executed_rows_only():
    ex = Execution.of({1: _outcome(0.5), 2: _outcome(-0.5)}, {}, {3: _outcome(0.25)}, num_rows=4)
    real, executed = ex.real, ex.executed
    np.testing.assert_array_equal(executed, [False, True, True, False])
    np.testing.assert_array_equal(ex.partner, np.float32([np.nan, np.nan, np.nan, 0.25]))
    rewards, valid = stages.wm_free_rewards(real, executed)
    np.testing.assert_array_equal(rewards, [0.0, 0.5, -0.5, 0.0])
    np.testing.assert_array_equal(valid, executed)


def test_advantages_and_loss_mask_leave_out_invalid_rows():
    rewards = np.array([1.0, 0.0, np.nan, 7.0, 0.2, 0.4, 0.6, 0.8], np.float32)
    valid = np.array([1, 1, 0, 0, 1, 1, 1, 1], bool)
    adv = stages.advantages(rewards, valid, 4, "std")
    assert adv[2] == 0 and adv[3] == 0 and np.all(np.isfinite(adv))
    np.testing.assert_allclose(adv[:2], [1, -1], atol=1e-5)  # the two valid rows alone
    batch = {"loss_mask": np.ones((8, 3), np.float32), "tokens": np.zeros((8, 3), np.int32)}
    out = stages.policy_batch(Rollout([""] * 8, batch, 0), adv, valid)
    np.testing.assert_array_equal(out["loss_mask"].sum(1), 3 * valid)
    assert out["advantages"] is adv and out["tokens"] is batch["tokens"]


def test_non_finite_fed_rewards_are_masked_and_all_non_finite_fails_loudly():
    rewards = np.array([0.1, np.nan, np.inf, 0.3], np.float32)
    valid = stages.finite_rows(rewards, np.ones(4, bool), step=1)
    np.testing.assert_array_equal(valid, [True, False, False, True])
    with pytest.raises(RuntimeError, match="every fed reward is non-finite"):
        stages.finite_rows(np.full(4, np.nan, np.float32), np.ones(4, bool), step=2)
    # No valid row at all (a WM-free arm whose anchors were all dropped) is not an error.
    assert not stages.finite_rows(np.zeros(4, np.float32), np.zeros(4, bool), step=3).any()


def test_rows_without_a_program_get_the_invalid_floor_in_every_arm():
    ro = Rollout(["x = 1", "", "y = 2", ""], {}, 0, ("ok", "no_code", "ok", "syntax_error"))
    no_program = stages.no_program_rows(ro)
    np.testing.assert_array_equal(no_program, [False, True, False, True])
    assert not stages.no_program_rows(Rollout(["a", "b"], {}, 0)).any()
    rewards, valid = stages.with_no_program_rows(
        np.array([0.3, np.nan, 0.0, 0.2], np.float32),
        np.array([1, 0, 0, 1], bool),
        no_program,
        -1.0,
    )
    assert rewards.dtype == np.float32
    np.testing.assert_array_equal(rewards, np.float32([0.3, -1.0, 0.0, -1.0]))
    np.testing.assert_array_equal(valid, [True, True, False, True])


def test_step_metrics_count_missing_programs_and_wm_parse_causes():
    ro = Rollout(["x = 1", "", "", "print(2)"], {}, 0, ("ok", "no_code", "empty", "ok"))
    nan = np.full(4, np.nan, np.float32)
    causes = {"no_json": 2, "truncated": 1, "missing_keys": 0, "bad_value": 0}
    wm = WMOutput(np.array([0.5, np.nan, np.nan, 0.1], np.float32), np.ones(4, np.float32),
                  10, 0, causes, 3)  # fmt: skip
    record = stages.StepRecord(
        Sampled(1, (None,), 4, ro), wm, Anchors(np.array([False]), np.zeros(1, np.float32)),
        Execution({}, {}, nan, np.zeros(4, bool), nan),
        Fed(np.zeros(4, np.float32), np.ones(4, bool)),
    )  # fmt: skip
    m = stages.step_metrics(record, arms.get("wmrl"))
    assert (m["programs/none/no_code"], m["programs/none/empty"]) == (1.0, 1.0)
    assert m["programs/none/syntax_error"] == 0.0
    assert {k: v for k, v in m.items() if k.startswith("wm/parse_fail/")} == {
        f"wm/parse_fail/{k}": float(v) for k, v in causes.items()
    }
    assert m["wm/clamped"] == 3.0
    recipe = dataclasses.replace(
        record, sampled=Sampled(1, (None,), 4, Rollout(ro.programs, {}, 0)),
        wm=wm._replace(parse_causes={}),
    )  # fmt: skip
    assert not any(k.startswith(("programs/", "wm/parse_fail/", "wm/clamped"))
                   for k in stages.step_metrics(recipe, arms.get("wmrl")))  # fmt: skip


def test_a_rollout_is_charged_its_generation_and_its_tools_apart():
    timing = LedgerStep()
    rollout = Rollout(
        programs=["x"], batch={}, gen_tokens=0, tool_calls=3, tool_seconds=2.5,
        tool_wait_seconds=1.5,
    )  # fmt: skip
    stages.charge_rollout(timing, rollout, 4.0)
    ledger = timing.ledger()
    assert (ledger.gen_seconds, ledger.tool_seconds, ledger.tool_calls) == (2.5, 2.5, 3)
    assert ledger.compute_seconds == pytest.approx(5.0)  # generation + the tools' sandbox
    stages.charge_rollout(timing, rollout._replace(tool_wait_seconds=9.0), 4.0)
    assert timing.ledger().gen_seconds == 2.5  # waiting longer than the rollout took: 0 s
