"""The table of arms: what each arm executes and feeds, and the anchor choice."""

import dataclasses

import jax
import numpy as np
import pytest

from wmrl_jax.train import arms


def test_table_rows():
    t = arms.ARMS
    assert set(t) == {
        "real", "anchors_only", "wm_naive", "wm_debias", "wmrl", "wmrl_memory",
        "wmrl_local", "wmrl_active", "wmrl_plus", "wmrl_adaptive", "wmrl_ppi", "wmrl_weighted",
    }  # fmt: skip
    assert (t["real"].executes, t["real"].world_model) == ("all", False)
    assert (t["anchors_only"].executes, t["anchors_only"].world_model) == ("anchors", False)
    assert (t["wm_naive"].executes, t["wm_naive"].use_real, t["wm_naive"].debias) == (
        "none", False, False,
    )  # fmt: skip
    assert (t["wm_debias"].debias, t["wm_debias"].ivd) == (True, False)
    assert (t["wmrl"].debias, t["wmrl"].ivd, t["wmrl"].use_real) == (True, True, True)
    assert t["wmrl_memory"] == dataclasses.replace(t["wmrl"], name="wmrl_memory", memory=True)
    assert not any(a.memory for name, a in t.items() if name not in ("wmrl_memory", "wmrl_plus"))
    assert t["wmrl_local"] == dataclasses.replace(t["wmrl"], name="wmrl_local", local=True)
    assert t["wmrl_active"] == dataclasses.replace(
        t["wmrl"], name="wmrl_active", anchor_policy="active"
    )
    assert t["wmrl_plus"] == dataclasses.replace(
        t["wmrl"], name="wmrl_plus", memory=True, local=True, anchor_policy="active"
    )
    assert t["wmrl_adaptive"] == dataclasses.replace(
        t["wmrl"], name="wmrl_adaptive", adaptive_rho=True
    )
    assert [n for n, a in t.items() if a.adaptive_rho] == ["wmrl_adaptive"]
    assert t["wmrl_ppi"] == dataclasses.replace(t["wm_debias"], name="wmrl_ppi", estimator="ppi")
    assert t["wmrl_weighted"] == dataclasses.replace(
        t["wmrl"], name="wmrl_weighted", estimator="weighted"
    )
    assert {n for n, a in t.items() if a.estimator != "grpo"} == {"wmrl_ppi", "wmrl_weighted"}
    with pytest.raises(ValueError, match="estimator must be one of"):
        arms.Arm("x", executes="anchors", world_model=True, debias=True, estimator="nope")
    with pytest.raises(ValueError, match="debiased WM"):
        arms.Arm("x", executes="anchors", world_model=True, estimator="ppi")
    assert arms.anchor_policy(t["wmrl"], "uncertain") == "uncertain"
    assert arms.anchor_policy(t["wmrl_active"], "uncertain") == "active"
    with pytest.raises(ValueError, match="memory"):
        arms.Arm("x", executes="anchors", world_model=False, memory=True)


@pytest.mark.parametrize(
    "name, groups, fraction, expected",
    [("real", 6, 0.1, 6), ("wm_naive", 6, 0.5, 0), ("wmrl", 6, 0.1, 1), ("wmrl", 20, 0.1, 2),
     ("anchors_only", 20, 0.25, 5), ("wm_debias", 3, 1.0, 3)],
)  # fmt: skip
def test_num_anchor_groups(name, groups, fraction, expected):
    assert arms.get(name).num_anchor_groups(groups, fraction) == expected


def test_anchors_only_executes_exactly_the_groups_wmrl_anchors():
    key = jax.random.key(7)
    a = arms.choose_anchor_groups(arms.get("wmrl"), key, num_groups=20, fraction=0.2)
    b = arms.choose_anchor_groups(arms.get("anchors_only"), key, num_groups=20, fraction=0.2)
    np.testing.assert_array_equal(a.groups, b.groups)
    assert a.groups.sum() == 4
    np.testing.assert_array_equal(a.weights, a.groups.astype(np.float32))


def test_uncertain_policy_takes_the_largest_variances_nan_first():
    var = np.array([0.1, np.nan, 0.5, 0.2])
    choice = arms.choose_anchor_groups(
        arms.get("wmrl"), None, num_groups=4, fraction=0.5, policy="uncertain", group_score=var
    )
    np.testing.assert_array_equal(choice.groups, [False, True, True, False])


def test_active_policy_draws_by_score_rank_and_weights_by_inverse_probability():
    score = np.array([0.3, -np.inf, 0.9, 0.1, 0.5])  # ranks 3, 1, 5, 2, 4
    groups, weights = [], []
    for key in jax.random.split(jax.random.key(0), 3000):
        c = arms.choose_anchor_groups(
            arms.get("wmrl"), key, num_groups=5, fraction=0.4, policy="active",
            group_score=score, uniform_share=0.5,
        )  # fmt: skip
        groups.append(c.groups)
        weights.append(c.weights)
    groups, weights = np.array(groups), np.array(weights)
    assert (groups.sum(1) == 2).all()  # exactly k = round(0.4 * 5) groups every draw
    # π = k (0.5 rank/Σrank + 0.5/B), rank/Σrank = rank/15.
    rank = np.array([3, 1, 5, 2, 4])
    pi = 2 * (0.5 * rank / 15 + 0.5 / 5)
    np.testing.assert_allclose(groups.mean(0), pi, atol=0.03)  # 3000 draws: s.e. <= 0.01
    # Horvitz-Thompson: E[weight] = (k/B) on every group, whatever its π.
    np.testing.assert_allclose(weights.mean(0), 2 / 5, atol=0.04)
    drawn = weights[groups]
    np.testing.assert_allclose(np.sort(np.unique(drawn.round(5))), np.sort((0.4 / pi).round(5)))


def test_correction_switches_come_from_the_arm():
    naive = arms.make_correction(arms.get("wm_naive"), capacity=8, min_anchors=1)
    pred = np.array([0.2, 0.8], np.float32)
    real = np.array([0.9, np.nan], np.float32)
    fed, _, _ = naive.update(
        naive.init(), pred, np.ones(2, np.float32), real, np.array([1, 0], bool)
    )
    np.testing.assert_allclose(np.asarray(fed), pred)  # wm_naive ignores real scores


def test_bad_arms_are_refused():
    with pytest.raises(ValueError, match="unknown arm"):
        arms.get("wm_magic")
    with pytest.raises(ValueError, match="world model"):
        arms.Arm("x", executes="none", world_model=False)
    with pytest.raises(ValueError, match="needs use_real"):
        arms.Arm("x", executes="anchors", world_model=True, ivd=True, use_real=False)
    with pytest.raises(ValueError, match="adaptive"):
        arms.Arm("x", executes="all", world_model=True, debias=True, adaptive_rho=True)


def test_an_explicit_count_overrides_the_arms_fraction():
    key = jax.random.key(3)
    wmrl = arms.get("wmrl")
    for count in (0, 3):
        choice = arms.choose_anchor_groups(wmrl, key, num_groups=10, fraction=0.1, count=count)
        assert choice.groups.sum() == count
        np.testing.assert_array_equal(choice.weights, choice.groups.astype(np.float32))
    with pytest.raises(ValueError, match="count must be in"):
        arms.choose_anchor_groups(wmrl, key, num_groups=10, fraction=0.1, count=11)
