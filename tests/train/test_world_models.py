"""World-model kinds in the trainer (the synthetic quality knob), and the execution-cost
axis: a fixed cost per execution and the re-pricing of a recorded run."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from experiments.configs import tiny_cpu
from wmrl_jax.train import loop, world_models
from wmrl_jax.train.config import ConfigError, base_config, override, validate_config
from wmrl_jax.train.cost import CostModel, TokenLengths, from_config, reprice
from wmrl_jax.train.ledger import Ledger
from wmrl_jax.worldmodel import synthetic

COST = {"cost_model.params": 1e9, "cost_model.accelerator": "A100"}


def _config(**overrides):
    base = {"executor.kind": "replay", "num_steps": 3, "eval_every": 3, "checkpoint.every": 10,
            "checkpoint.export_hf": False, **COST}  # fmt: skip
    return override(tiny_cpu.get_config("runlocal"), **{**base, **overrides})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same wmrl run with the learned world model, the synthetic one at q = 1, and the
    synthetic one with each execution charged 30 s."""
    out = {}
    for name, fields in {
        "agent": {},
        "synthetic": {"world_model.kind": "synthetic", "world_model.synthetic.q": 1.0},
        "fixed30": {"world_model.kind": "synthetic", "world_model.synthetic.q": 1.0,
                    "cost_model.execution_seconds": 30.0},
    }.items():  # fmt: skip
        out[name] = loop.train_and_evaluate(_config(**fields), str(tmp_path_factory.mktemp(name)))
    return out


def test_synthetic_world_model_runs_end_to_end_and_logs_its_quality(runs):
    steps = runs["synthetic"]["steps"]
    assert all("wm/q_groups" in s for s in steps)
    counted = [s for s in steps if s["wm/q_groups"] > 0]
    assert counted, "no group was scored"
    for s in counted:  # q = 1 and no blind spots: every group ranks exactly as the truth
        assert s["wm/q_realised"] == pytest.approx(1.0)
    assert synthetic.realised_q(steps) == pytest.approx(1.0)
    assert all("wm/q_realised" not in s for s in runs["agent"]["steps"])


def test_synthetic_world_model_is_charged_as_the_learned_one(runs):
    agent, synth = runs["agent"]["ledger"], runs["synthetic"]["ledger"]
    # The policy is the same until the first update uses other rewards: step 1's rows.
    assert synth["wm_rows"] > 0
    n1 = runs["synthetic"]["steps"][0]
    a1 = runs["agent"]["steps"][0]
    assert n1["ledger/wm_tokens"] == a1["ledger/wm_tokens"] > 0
    assert n1["ledger/wm_rows"] == a1["ledger/wm_rows"]
    assert synth["wm_tokens"] / synth["wm_rows"] == agent["wm_tokens"] / agent["wm_rows"]


def test_a_fixed_execution_cost_leaves_the_trajectory_and_reprices_it(runs):
    synth, fixed = runs["synthetic"]["steps"], runs["fixed30"]["steps"]
    counts = ("ledger/executions", "ledger/samples", "ledger/wm_rows", "ledger/train_rows",
              "train/loss", "reward/fed_mean")  # fmt: skip
    for a, b in zip(synth, fixed, strict=True):
        assert {k: a.get(k) for k in counts} == {k: b.get(k) for k in counts}
    model = from_config(_config())
    recorded = reprice(synth, model, prefix="ledger/")
    np.testing.assert_allclose(recorded, [s["ledger/modelled_compute_seconds"] for s in synth])
    # Re-priced at 30 s per execution: what the run charged at 30 s, token seconds the same.
    at30 = reprice(synth, model, execution_seconds=30.0, prefix="ledger/")
    np.testing.assert_allclose(at30, [s["ledger/modelled_compute_seconds"] for s in fixed])
    tokens = [model.token_seconds(Ledger.from_dict({f: s[f"ledger/{f}"] for f in Ledger._fields}))
              for s in synth]  # fmt: skip
    executions = np.array([s["ledger/executions"] for s in synth])
    np.testing.assert_allclose(at30, np.array(tokens) + 30.0 * executions)
    # The evaluation history carries the same cumulative ledgers, unprefixed.
    hist = runs["synthetic"]["history"]
    np.testing.assert_allclose(
        reprice(hist, model, execution_seconds=300.0),
        [model.token_seconds(Ledger.from_dict({f: h[f] for f in Ledger._fields}))
         + 300.0 * h["executions"] for h in hist],
    )  # fmt: skip


def test_reprice_by_hand():
    model = CostModel(params=1e9, peak_flops=1e12, mfu=0.5,
                      lengths=TokenLengths(sample=3000, wm_row=4000, train_row=3000))  # fmt: skip
    steps = [
        {"ledger/samples": 10, "ledger/wm_rows": 5, "ledger/train_rows": 2,
         "ledger/executions": 4, "ledger/exec_seconds": 6.0},
        {"ledger/samples": 20, "ledger/wm_rows": 10, "ledger/train_rows": 4,
         "ledger/executions": 8, "ledger/exec_seconds": 12.0, "ledger/tool_seconds": 1.0},
    ]  # fmt: skip
    # Tokens: (2e9 (10·3000 + 5·4000) + 6e9 · 2·3000) / 5e11 = 272 s; doubled at step 2.
    np.testing.assert_allclose(reprice(steps, model, prefix="ledger/"), [278.0, 557.0])
    np.testing.assert_allclose(
        reprice(steps, model, execution_seconds=30.0, prefix="ledger/"),
        [272.0 + 4 * 30.0, 544.0 + 8 * 30.0 + 1.0],
    )
    np.testing.assert_allclose(
        reprice(steps, model, execution_seconds=1800.0, prefix="ledger/"),
        [272.0 + 7200.0, 544.0 + 14400.0 + 1.0],
    )
    assert model.execution_seconds is None  # the caller's model is left as it was
    assert reprice([], model).shape == (0,)
    with pytest.raises(ValueError, match="execution_seconds"):
        reprice(steps, model, execution_seconds=-1.0)
    # Charging the cached repeats too: 3 and 9 of them, at 30 s each.
    steps[0]["ledger/cached"], steps[1]["ledger/cached"] = 3, 9
    again = dataclasses.replace(model, execution_seconds=30.0, charge_repeats=True)
    np.testing.assert_allclose(
        reprice(steps, again, execution_seconds=30.0, prefix="ledger/"),
        [272.0 + 7 * 30.0, 544.0 + 17 * 30.0 + 1.0],
    )
    with pytest.raises(ValueError, match="charge_repeats needs a fixed execution_seconds"):
        reprice(steps, again, prefix="ledger/")


def test_fixed_execution_cost_from_config_and_its_errors():
    on = override(base_config(), **COST, **{"cost_model.execution_seconds": 300.0})
    model = from_config(on)
    assert model.execution_seconds == 300.0
    ledger = Ledger(executions=3, exec_seconds=4.5)
    assert model.seconds(ledger) == pytest.approx(900.0)
    assert from_config(override(on, **{"cost_model.execution_seconds": 0.0})).seconds(
        ledger
    ) == pytest.approx(4.5)  # 0: the recorded seconds
    with pytest.raises(ConfigError, match="execution_seconds"):
        validate_config(override(on, **{"cost_model.execution_seconds": -30.0}))


@pytest.mark.parametrize(
    ("fields", "match"),
    [({"world_model.kind": "oracle"}, "world_model.kind must be one of"),
     ({"world_model.kind": "synthetic", "world_model.synthetic.q": 2.0}, "synthetic.q"),
     ({"world_model.kind": "synthetic", "world_model.synthetic.blind_spot_fraction": 0.9},
      "blind_spot_fraction")],
)  # fmt: skip
def test_bad_world_model_settings_fail_before_any_work(fields, match):
    with pytest.raises(ConfigError, match=match):
        validate_config(override(base_config(), **fields))


def test_synthetic_needs_recipe_programs():
    config = override(base_config(), **{"world_model.kind": "synthetic"})
    with pytest.raises(ValueError, match="not recipes"):
        world_models.validate(config, replayable=False)
    world_models.validate(config, replayable=True)
    assert math.isclose(config.world_model.synthetic.q, synthetic.default_config().q)
