"""The controlled study's world model of chosen quality (`world_model.kind="copula"`)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from experiments.configs import controlled as controlled_config
from wmrl_jax.studies import controlled
from wmrl_jax.train.config import override


def _config(**fields):
    base = {"num_steps": 30, "world_model.blind_spot_fraction": 0.0}
    return override(controlled_config.get_config("runlocal"), **{**base, **fields})


@pytest.mark.parametrize("q", [0.0, 0.8])
def test_copula_world_model_realises_its_target(q):
    config = _config(**{"world_model.kind": "copula", "world_model.q": q})
    out = controlled.run_arm(config, "wmrl", jax.random.key(0))
    realised = np.asarray(out["wm_q_realised"])
    # 30 steps x 10 groups of 8 (draws from 16 candidates): the mean is within 0.05.
    assert np.nanmean(realised) == pytest.approx(q, abs=0.05)
    assert np.isfinite(np.asarray(out["true_reward"])).all()


def test_additive_world_model_is_unchanged_and_reports_its_quality():
    config = _config()
    out = controlled.run_arm(config, "wmrl", jax.random.key(1))
    assert -1.0 <= float(np.nanmean(np.asarray(out["wm_q_realised"]))) <= 1.0
    summary = controlled.summarize({"wmrl": {k: np.asarray(v)[None] for k, v in out.items()}},
                                   config)  # fmt: skip
    assert "wm_q_realised" in summary["wmrl"]


@pytest.mark.parametrize(("fields", "match"), [({"world_model.kind": "oracle"}, "kind"),
                                               ({"world_model.kind": "copula",
                                                 "world_model.q": 1.5}, "q in")])  # fmt: skip
def test_bad_world_model_settings_are_named(fields, match):
    with pytest.raises(ValueError, match=match):
        controlled.run_arm(_config(**fields), "wmrl", jax.random.key(0))
