"""The synthetic world model over the committed recipe table: truths, blind spots, recall."""

from __future__ import annotations

import dataclasses

import jax
import ml_collections
import numpy as np
import pytest

from experiments.configs import tiny_cpu
from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.envs import recipes, simulated, tabular
from wmrl_jax.train import builder
from wmrl_jax.train.config import override
from wmrl_jax.worldmodel import synthetic

G = 8


class _Agent:
    """Stands for the learned world model: its pass is what the ledger charges."""

    def __init__(self):
        self.calls = 0

    def predict(self, params, tasks, rollout, *, key):
        self.calls += 1
        n = len(rollout.programs)
        return WMOutput(np.zeros(n, np.float32), np.ones(n, np.float32), 11 * n, 3)


@pytest.fixture(scope="module")
def setting():
    config = override(tiny_cpu.get_config("runlocal"), **{"executor.kind": "replay"})
    tasks = builder.load_tasks(config).train
    return config, tasks, builder.load_table(config), builder.reward_floors(config)


def _config(**fields):
    c = synthetic.default_config()
    c.update(fields)
    return c


def _rollout(tasks, rng, g=G):
    index = rng.integers(0, recipes.NUM_RECIPES, size=(len(tasks), g))
    programs = [
        recipes.compile_program(recipes.recipe_from_index(int(r)), tasks[i // g])
        for i, r in enumerate(index.reshape(-1))
    ]
    return Rollout(programs, {}, 0), index


def test_truth_is_the_table_replicate_mean_and_cost_is_the_agents(setting):
    config, tasks, table, floors = setting
    agent = _Agent()
    wm = synthetic.SyntheticWorldModel(agent, table, floors, _config(q=1.0))
    rollout, index = _rollout(tasks, np.random.default_rng(0))
    truth, failed, blind, _ = wm.rows(tasks, rollout.programs, G)
    expected = np.concatenate([table.reward(t.id, floors)[index[i]] for i, t in enumerate(tasks)])
    np.testing.assert_array_equal(truth, expected)
    # Failed: most of the recipe's replicates did not run ok in the committed table.
    ok = np.concatenate([table.status[table.row(t.id)][index[i]] == 0 for i, t in
                         enumerate(tasks)])  # fmt: skip
    np.testing.assert_array_equal(failed, ok.mean(axis=1) < 0.5)
    assert failed.any() and (~failed).any() and not blind.any()
    out = wm.predict(None, tasks, rollout, key=jax.random.key(0))
    assert agent.calls == 1 and out.wm_tokens == 11 * len(rollout.programs)
    assert out.parse_failures == 0
    # q = 1: the monotone distortion of the truth, exactly (simulated.distort on [0, 1]);
    # a truth below 0 (a floor among the replicates) is ranked below every one in [0, 1];
    # failures the world model does not foresee are `test_failure_recall`'s.
    spec = simulated.WorldModelSpec()
    distorted = spec.offset + spec.scale * np.clip(truth, 0, 1) ** spec.gamma
    foreseen = ~(failed & ~wm.rows(tasks, rollout.programs, G)[3])
    valid, floored = foreseen & (truth >= 0), foreseen & (truth < 0)
    assert valid.any() and floored.any()
    np.testing.assert_allclose(out.mean[valid], distorted[valid], atol=1e-6)
    assert (out.mean[floored] < spec.offset).all()
    assert out.diagnostics["q_groups"] > 0 and out.diagnostics["q_realised"] == pytest.approx(1.0)


def test_blind_spots_overrate_exactly_the_stated_fraction(setting):
    _, tasks, table, floors = setting
    wm = synthetic.SyntheticWorldModel(
        _Agent(), table, floors, _config(q=1.0, blind_spot_fraction=0.1, blind_spot_size=0.3)
    )
    for task in tasks:
        truth, _, blind, _ = wm.task_view(task.id)
        assert blind.sum() == round(0.1 * recipes.NUM_RECIPES)  # 29 of 288
        assert (truth[blind] < np.median(truth)).all()
    rollout, _ = _rollout(tasks, np.random.default_rng(1), g=64)
    truth, _, blind, _ = wm.rows(tasks, rollout.programs, 64)
    out = wm.predict(None, tasks, rollout, key=jax.random.key(1))
    excess = out.mean - wm.distort(truth)
    np.testing.assert_allclose(excess[blind], 0.3, atol=1e-6)
    np.testing.assert_allclose(excess[~blind], 0.0, atol=1e-6)
    # Fixed: another instance with the same seed picks the same recipes; another seed not.
    again = synthetic.SyntheticWorldModel(
        _Agent(), table, floors, _config(blind_spot_fraction=0.1, q=0.2)
    )
    other = synthetic.SyntheticWorldModel(
        _Agent(), table, floors, _config(blind_spot_fraction=0.1, seed=7)
    )
    task_id = tasks[0].id
    np.testing.assert_array_equal(again.task_view(task_id)[2], wm.task_view(task_id)[2])
    assert not np.array_equal(other.task_view(task_id)[2], wm.task_view(task_id)[2])


def test_failure_recall(setting):
    _, tasks, table, floors = setting
    # Make a third of one task's recipes fail in every replicate ("error").
    status = table.status.copy()
    t = table.row(tasks[0].id)
    failing = np.arange(0, recipes.NUM_RECIPES, 3)
    status[t, failing, :] = tabular.STATUS_NAMES.index("error")
    broken = dataclasses.replace(table, status=status)
    rollout, index = _rollout(tasks[:1], np.random.default_rng(2), g=32)
    forced = np.isin(index.reshape(-1), failing)
    # The forced failures and those the committed table already holds for the task.
    fails = (status[t][index.reshape(-1)] == 0).mean(axis=1) < 0.5
    assert (fails >= forced).all() and forced.any() and (~fails).any()
    for recall in (1.0, 0.0):
        wm = synthetic.SyntheticWorldModel(_Agent(), broken, floors, _config(q=1.0,
                                           failure_recall=recall))  # fmt: skip
        truth, failed, _, recalled = wm.rows(tasks[:1], rollout.programs, 32)
        np.testing.assert_array_equal(failed, fails)
        np.testing.assert_allclose(truth[forced], floors.error)
        out = wm.predict(None, tasks[:1], rollout, key=jax.random.key(2))
        np.testing.assert_allclose(out.mean[~fails], wm.distort(truth[~fails]), atol=1e-6)
        if recall == 1.0:  # foreseen: ranked with their floor, below every valid program
            np.testing.assert_allclose(out.mean[fails], wm.distort(truth[fails]), atol=1e-6)
        else:  # missed: predicted inside the range of the group's valid programs
            assert out.mean[fails].min() > wm.distort(truth[fails]).max()
            assert (out.mean[fails] >= wm.distort(truth[~fails]).min() - 1e-6).all()
    wm = synthetic.SyntheticWorldModel(_Agent(), broken, floors, _config(failure_recall=0.5))
    recalled = wm.task_view(tasks[0].id)[3]
    assert 0.3 < recalled.mean() < 0.7  # a fixed share, drawn once per (task, recipe)


def test_realised_q_pools_steps_by_groups():
    steps = [{"wm/q_realised": 0.5, "wm/q_groups": 2.0}, {"wm/q_realised": 0.2, "wm/q_groups": 6.0},
             {"wm/q_realised": float("nan"), "wm/q_groups": 0.0}, {"other": 1.0}]  # fmt: skip
    assert synthetic.realised_q(steps) == pytest.approx((0.5 * 2 + 0.2 * 6) / 8)
    assert np.isnan(synthetic.realised_q([{"other": 1.0}]))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("q", 1.5, "q must be in"), ("gamma", 0.0, "gamma must be"),
     ("blind_spot_fraction", 0.6, "blind_spot_fraction"), ("failure_recall", -0.1, "recall")],
)  # fmt: skip
def test_bad_settings_are_named(field, value, match):
    c = synthetic.default_config()
    c[field] = value
    with pytest.raises(ValueError, match=match):
        synthetic.validate_config(c)


def test_config_is_copied_not_shared(setting):
    _, _, table, floors = setting
    c = ml_collections.ConfigDict(synthetic.default_config().to_dict())
    wm = synthetic.SyntheticWorldModel(_Agent(), table, floors, c)
    c.q = -1.0
    assert wm.config.q == synthetic.default_config().q
