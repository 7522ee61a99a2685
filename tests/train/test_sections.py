"""Typed config sections: each view names every field of its section, read at the boundary."""

import dataclasses

import pytest

from experiments.configs import qwen3_4b_mledojo, study_compute, tiny_cpu
from wmrl_jax.train.config import base_config, override
from wmrl_jax.train.sections import (
    AgentSection,
    AnchorsSection,
    CorrectionSection,
    ExecutorSection,
)

CONFIGS = {
    "recipe": lambda: base_config("recipe"),
    "text": lambda: base_config("text"),
    "tiny_cpu": lambda: tiny_cpu.get_config("runlocal"),
    "study_compute": lambda: study_compute.get_config("wm"),
    "qwen3_4b_mledojo": qwen3_4b_mledojo.get_config,
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_training_config_reads_into_its_sections(name):
    config = CONFIGS[name]()
    anchors = AnchorsSection.of(config)
    assert (anchors.fraction, anchors.policy) == (config.anchor_fraction, config.anchor_policy)
    assert anchors.adaptive.rho_max == config.anchors.adaptive.rho_max
    assert anchors.reliability.decay == config.anchors.reliability.decay
    correction = CorrectionSection.of(config)
    assert correction.kwargs() == config.correction.to_dict()
    executor = ExecutorSection.of(config)
    assert dataclasses.asdict(executor) == config.executor.to_dict()
    agent = AgentSection.of(config)
    assert agent.settings is config.agent[config.agent.kind]


def test_the_sections_are_frozen_and_follow_overrides():
    config = override(tiny_cpu.get_config("runlocal"), anchor_fraction=0.5,
                      **{"executor.kind": "replay", "correction.wm_var": "per_sample"})  # fmt: skip
    assert AnchorsSection.of(config).fraction == 0.5
    assert ExecutorSection.of(config).kind == "replay"
    assert CorrectionSection.of(config).wm_var == "per_sample"
    with pytest.raises(dataclasses.FrozenInstanceError):
        ExecutorSection.of(config).kind = "docker"


def test_a_field_the_view_does_not_name_fails_with_its_name():
    config = base_config()
    with config.unlocked():
        config.executor.new_knob = 1
        del config.correction["decay"]
    with pytest.raises(ValueError, match=r"config.executor .*unknown \['new_knob'\]"):
        ExecutorSection.of(config)
    with pytest.raises(ValueError, match=r"config.correction .*missing \['decay'\]"):
        CorrectionSection.of(config)
