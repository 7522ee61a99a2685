"""A step's anchors and fed rewards (`Rewarder`) on hand-made stage records of 2 groups of 4."""

import dataclasses

import jax
import numpy as np
import pytest

from experiments.configs import tiny_cpu
from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.train import arms, builder
from wmrl_jax.train.config import override
from wmrl_jax.train.records import Anchors, Execution, Sampled
from wmrl_jax.train.rewards import Rewarder

G = 4


def _rewarder(arm: str, **overrides):
    config = override(tiny_cpu.get_config("runlocal"), arm=arm, **overrides)
    assert (config.tasks_per_step, config.group_size) == (2, G)
    return Rewarder.from_config(config, arms.get(arm), builder.make_correction(config)), config


def _sampled(programs=("p",) * 8, causes=()):
    rollout = Rollout(list(programs), {}, 0, tuple(causes))
    return Sampled(3, ("task a", "task b"), G, rollout)


def _execution(real, partner=None):
    real = np.asarray(real, np.float32)
    partner = np.full(len(real), np.nan, np.float32) if partner is None else partner
    return Execution({}, {}, real, np.isfinite(real), np.asarray(partner, np.float32))


def test_an_arm_without_a_world_model_is_fed_its_real_scores():
    rewarder, config = _rewarder("real")
    extra = rewarder.init()
    assert set(extra) == {"correction"}
    sampled = _sampled(programs=["p"] * 7 + [""], causes=["ok"] * 7 + ["no_code"])
    anchors = rewarder.choose_anchors(sampled, None, extra, jax.random.key(0))
    np.testing.assert_array_equal(anchors.groups, [True, True])  # "real" runs all
    execution = _execution(
        [0.1, 0.2, np.nan, 0.4, 0.5, 0.6, 0.7, np.nan],
        partner=np.array([0.3] + [np.nan] * 7, np.float32),  # a second replicate
    )
    fed, out = rewarder.correct(sampled, None, anchors, execution, extra)
    assert out is extra  # Nothing to update.
    floor = builder.reward_floors(config).invalid
    want = [0.2, 0.2, 0.0, 0.4, 0.5, 0.6, 0.7, floor]  # row 0: the replicates' mean
    np.testing.assert_allclose(fed.rewards, want, rtol=1e-6)
    np.testing.assert_array_equal(fed.valid, [1, 1, 0, 1, 1, 1, 1, 1])
    assert fed.debiased is None and fed.advantages is None and not fed.diagnostics


def test_anchors_only_executes_every_group_it_sampled():
    rewarder, _ = _rewarder("anchors_only")
    anchors = rewarder.choose_anchors(_sampled(), None, rewarder.init(), jax.random.key(0))
    np.testing.assert_array_equal(anchors.groups, [True, True])
    np.testing.assert_array_equal(anchors.weights, [1.0, 1.0])
    assert anchors.fraction is None


def test_adaptive_rho_chooses_and_then_measures_out_of_sample():
    rewarder, config = _rewarder("wmrl_adaptive")
    extra = rewarder.init()
    assert set(extra) == {"correction", "rho"}
    sampled = _sampled()
    anchors = rewarder.choose_anchors(sampled, None, extra, jax.random.key(1))
    # Before any error is measured ρ_t is the arm's own share (one group of two), clipped.
    assert config.anchors.adaptive.rho_max == 0.3
    assert anchors.fraction == pytest.approx(0.3)
    # 0.3 x 2 = 0.6 groups, stochastically rounded.
    assert anchors.groups.sum() in (0, 1) and anchors.weights.shape == (2,)
    mean = np.linspace(0.1, 0.8, 8).astype(np.float32)
    wm = WMOutput(mean, np.full(8, 0.01, np.float32), 0, 0)
    execution = _execution(np.where(np.arange(8) < G, mean + 0.1, np.nan))
    fed, out = rewarder.correct(sampled, wm, anchors, execution, extra)
    assert out is not extra and set(out) == {"correction", "rho"}
    assert int(out["rho"].steps) == 1 and int(extra["rho"].steps) == 0  # Not in place.
    np.testing.assert_allclose(fed.debiased, mean)  # Before the map saw an anchor.
    assert fed.valid.all() and np.isfinite(fed.rewards).all()
    assert fed.diagnostics  # The correction's diagnostics.


def test_stage_records_are_frozen():
    rewarder, _ = _rewarder("real")
    anchors = rewarder.choose_anchors(_sampled(), None, rewarder.init(), jax.random.key(0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        anchors.groups = np.zeros(2, bool)


@pytest.mark.parametrize("arm", ["wm_naive", "wmrl", "wmrl_memory"])
def test_forced_prediction_failures_are_masked_out_of_the_update(arm):
    """The recipe agent's readout for a prediction it could not make: a finite mean and an
    infinite variance. Such rows are masked (not fed 0.0 or the buffer mean)."""
    remembered = lambda tasks, programs, g: (np.full(8, np.nan), np.zeros(8))
    config = override(tiny_cpu.get_config("runlocal"), arm=arm)
    rewarder = Rewarder.from_config(config, arms.get(arm), builder.make_correction(config),
                                    remembered=remembered)  # fmt: skip
    groups = np.array([arms.get(arm).executes != "none", False])
    anchors = Anchors(groups, groups.astype(np.float32))
    var = np.full(8, 0.01, np.float32)
    var[[0, 4, 5, 6, 7]] = np.inf  # forced failures; row 0 in the anchor group
    wm = WMOutput(np.full(8, 0.5, np.float32), var, 0, 5)
    execution = _execution(np.where(np.repeat(groups, G), 0.7, np.nan))
    fed, _ = rewarder.correct(_sampled(), wm, anchors, execution, rewarder.init())
    executed = bool(groups[0])
    want = [executed and arm != "wm_naive", 1, 1, 1, 0, 0, 0, 0]
    np.testing.assert_array_equal(fed.valid, want)


def _ref_adv(x):
    x = np.asarray(x, np.float64)
    return (x - x.mean()) / (x.std() + 1e-6)


def test_ppi_advantages_in_the_reward_stage_by_hand():
    """`wmrl_ppi`'s advantages from the trainer's record: a real anchor group, a WM group with
    an unusable prediction (masked) and a row without a program (the invalid floor, known
    to both streams); λ = 0.5 from the state of earlier steps; 1/π = 2 (one group of two)."""
    rewarder, config = _rewarder("wmrl_ppi")
    extra = rewarder.init()
    assert set(extra) == {"correction", "reliability"}
    extra["reliability"] = extra["reliability"]._replace(
        cross=np.float32(0.5), wm_sq=np.float32(1.0), real_sq=np.float32(1.0),
        rows=np.float32(1000.0),
    )  # fmt: skip
    sampled = _sampled(programs=["p"] * 7 + [""], causes=["ok"] * 7 + ["no_code"])
    anchors = Anchors(np.array([True, False]), np.array([1.0, 0.0]))
    mean = np.array([0.2, 0.6, 0.4, 0.3, 0.5, 0.9, 0.1, 0.5], np.float32)
    var = np.full(8, 0.01, np.float32)
    var[5] = np.inf  # unusable
    wm = WMOutput(mean, var, 0, 1)
    execution = _execution([0.1, 0.4, 0.3, 0.2] + [np.nan] * 4)
    fed, out = rewarder.correct(sampled, wm, anchors, execution, extra)
    floor = builder.reward_floors(config).invalid
    np.testing.assert_array_equal(fed.valid, [1, 1, 1, 1, 1, 0, 1, 1])
    a_real, a_wm0 = _ref_adv(execution.real[:4]), _ref_adv(mean[:4])  # the map is empty: g = id
    a_wm1 = _ref_adv([mean[4], mean[6], floor])
    want = np.concatenate([0.5 * a_wm0 + 2 * (a_real - 0.5 * a_wm0), 0.5 * a_wm1[:1], [0.0],
                           0.5 * a_wm1[1:]])  # fmt: skip
    np.testing.assert_allclose(fed.advantages, want, rtol=1e-5, atol=1e-6)
    assert fed.diagnostics["reliability"] == 0.5
    assert float(out["reliability"].rows) == pytest.approx(0.95 * 1000 + 4)  # decay, 4 anchor rows
    weighted, _ = _rewarder("wmrl")
    assert weighted.init().keys() == {"correction"}  # and no advantages of its own
