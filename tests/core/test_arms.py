"""The arms' two decisions (`core.arms`): which groups are executed, and what is fed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wmrl_jax.core import arms

WM_ARMS = [name for name, arm in arms.ARMS.items() if arm.world_model]


@pytest.mark.parametrize("jit", [False, True])
def test_random_choice_is_a_permutation_cut_and_count_may_be_traced(jit):
    key = jax.random.key(4)
    choose = lambda k: arms.choose_anchors(key, k, num_groups=10)
    choose = jax.jit(choose) if jit else choose
    perm = np.asarray(jax.random.permutation(key, 10))
    for k in (0, 3, 10):
        groups, weights = choose(k)
        np.testing.assert_array_equal(groups, perm < k)
        np.testing.assert_array_equal(weights, groups.astype(np.float32))


def test_uncertain_choice_takes_the_largest_scores_nan_first_with_a_traced_count():
    score = jnp.array([0.1, jnp.nan, 0.5, 0.2])
    run = jax.jit(lambda k: arms.choose_anchors(None, k, num_groups=4, policy="uncertain",
                                                group_score=score))  # fmt: skip
    np.testing.assert_array_equal(run(2).groups, [False, True, True, False])
    np.testing.assert_array_equal(run(3).groups, [False, True, True, True])


@pytest.mark.parametrize(
    "groups, fraction, expected",
    [(10, 0.25, 2), (10, 0.35, 4), (20, 0.1, 2), (4, 0.1, 1), (6, 0.5, 3), (3, 1.0, 3)],
)
def test_one_rounding_rule_nearest_ties_to_even_at_least_one(groups, fraction, expected):
    assert arms.get("wmrl").num_anchor_groups(groups, fraction) == expected


@pytest.mark.parametrize("name", WM_ARMS)
def test_unusable_predictions_are_masked_in_every_arm(name):
    """A prediction the agent could not make comes back with a finite placeholder mean and
    infinite variance (the recipe agent's readout): it is no reward, whatever the arm."""
    arm = arms.get(name)
    correction = arms.correction_for(arm, capacity=8, min_anchors=1, local_features=0)
    mean = np.full(8, 0.5, np.float32)  # finite everywhere, as the agent returns it
    var = np.full(8, 0.01, np.float32)
    var[[0, 5, 6]] = np.inf  # forced failures: row 0 executed, rows 5 and 6 not
    var[7] = np.nan
    executed = np.zeros(8, bool) if arm.executes == "none" else np.arange(8) < 4
    real = np.where(executed, 0.7, np.nan).astype(np.float32)
    rows = {"task": np.zeros(8, np.int32)} if arm.local else {}
    fed = jax.jit(lambda s: arms.fed_rewards(arm, correction, s, mean, var, real, executed,
                                             **rows))(correction.init())  # fmt: skip
    want = np.ones(8, bool)
    want[[5, 6, 7]] = False
    want[0] = bool(executed[0] and arm.use_real)  # its own real score stands in
    np.testing.assert_array_equal(fed.valid, want)
    assert np.isfinite(np.asarray(fed.rewards)[want]).all()
    # Counted by the correction as rows with neither stream (row 0 has one if executed).
    assert float(fed.diagnostics["n_unusable"]) == 4.0 - executed[0]


def test_wm_free_arms_are_fed_real_scores_of_executed_rows_with_replicates_averaged():
    arm = arms.get("anchors_only")
    correction = arms.correction_for(arm, capacity=4)
    real = np.array([0.2, 0.4, np.nan, np.nan], np.float32)
    fed = arms.fed_rewards(arm, correction, correction.init(), None, None, real,
                           np.array([1, 1, 0, 0], bool),
                           real_replicate=np.array([0.6, np.nan, np.nan, np.nan]))  # fmt: skip
    np.testing.assert_allclose(fed.rewards, [0.4, 0.4, 0.0, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(fed.valid, [1, 1, 0, 0])


def test_bad_policy_is_refused():
    with pytest.raises(ValueError, match="anchor policy must be one of"):
        arms.choose_anchors(jax.random.key(0), 1, num_groups=3, policy="greedy")
