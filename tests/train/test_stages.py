"""The step's stages: which rows count, what is fed, the advantages and the loss mask."""

import numpy as np
import pytest

from wmrl_jax.agents.base import Rollout
from wmrl_jax.envs.outcomes import Outcome
from wmrl_jax.train import stages


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
    real, executed = stages.real_rewards({1: _outcome(0.5), 2: _outcome(-0.5)}, 4)
    np.testing.assert_array_equal(executed, [False, True, True, False])
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
