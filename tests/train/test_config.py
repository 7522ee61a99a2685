"""The training config: defaults per agent kind, and every bad field refused by name."""

import math

import pytest

from wmrl_jax import agents
from wmrl_jax.train.config import ConfigError, base_config, override, validate_config


@pytest.mark.parametrize("kind", agents.kinds())
def test_base_config_holds_the_kinds_sub_config(kind):
    config = base_config(kind)
    assert config.agent.kind == kind
    assert config.agent[kind].to_dict() == agents.default_config(kind).to_dict()
    assert (config.train.loss.aux_coef > 0) == agents.capabilities(kind).aux_loss


def test_the_default_recipe_config_is_valid():
    validate_config(base_config("recipe"))


@pytest.mark.parametrize(
    "field, value, match",
    [
        (
            "correction.real_var_prior",
            math.nan,
            "config.correction.real_var_prior must be a finite",
        ),
        ("correction.real_var_prior", 0.0, "config.correction.real_var_prior must be > 0"),
        ("optimizer.lr", math.inf, "config.optimizer.lr must be a finite"),
        ("checkpoint.every", 0, "config.checkpoint.every must be >= 1"),
        ("agent.recipe.warm_start.steps", -3, "config.agent.recipe.warm_start.steps must be >= 0"),
        ("agent.recipe.temperature", 0.0, "config.agent.recipe.temperature must be > 0"),
        ("executor.timeout_s", -1.0, r"config.executor.timeout_s must be in \(0, 604800\]"),
        # "No limit" is no setting: it would overflow the backends' waits.
        ("executor.timeout_s", 1e9, r"config.executor.timeout_s must be in \(0, 604800\]"),
        ("executor.timeout_s", 604800.0, None),
        ("seed", -1, r"config.seed must be in \[0, 4294967295\]"),
        ("group_size", 100_000, "config.group_size must be <= 1024"),
        ("optimizer.lr", 1e30, r"config.optimizer.lr must be in \(0, 1.0\]"),
        ("optimizer.lr", 0.0, r"config.optimizer.lr must be in \(0, 1.0\]"),
        ("rewards.invalid", 1e30, r"config.rewards.invalid must be in \[-1.0, 1.0\]"),
        ("rewards.timeout", -2.0, r"config.rewards.timeout must be in \[-1.0, 1.0\]"),
        ("executor.max_infra_steps", -1, "config.executor.max_infra_steps must be >= 0"),
        ("eval_samples", -1, "config.eval_samples must be >= 0"),
        ("correction.decay", 1.5, r"config.correction.decay must be in \(0, 1\]"),
        ("arm", "wm_magic", "config.arm must be one of"),
        ("agent.kind", "text", r"config.agent.text \(the 'text' agent's sub-config\) is missing"),
        ("agent.kind", "vla", "config.agent.kind must be one of"),
        ("executor.kind", "replay", None),  # valid for the recipe kind
    ],
)
def test_bad_fields_are_named(field, value, match):
    config = override(base_config("recipe"), **{field: value})
    if match is None:
        validate_config(config)
        return
    with pytest.raises(ConfigError, match=match):
        validate_config(config)


def test_agent_capabilities_are_checked_against_the_rest():
    text = override(base_config("text"), **{"agent.text.checkpoint": "some/dir"})
    validate_config(text)
    with pytest.raises(ConfigError, match="aux_coef must be 0 for the 'text' agent"):
        validate_config(override(text, **{"train.loss.aux_coef": 1.0}))
    with pytest.raises(ConfigError, match="replay.*'text' agent"):
        validate_config(override(text, **{"executor.kind": "replay"}))
    with pytest.raises(ConfigError, match="config.agent.text.checkpoint"):
        validate_config(base_config("text"))


def test_cost_model_by_hand():
    from wmrl_jax.train.cost import ACCELERATORS, CostModel, from_config
    from wmrl_jax.train.ledger import Ledger

    model = CostModel(params=1e9, peak_flops=1e12, mfu=0.5)
    ledger = Ledger(gen_tokens=100, wm_tokens=50, train_tokens=10, exec_seconds=3.0)
    # (2e9 * 150 + 6e9 * 10) / 5e11 = 0.72 s of tokens, plus the measured 3 s.
    assert model.token_seconds(ledger) == pytest.approx(0.72)
    assert model.seconds(ledger) == pytest.approx(3.72)
    assert from_config(base_config()) is None  # off by default
    on = override(base_config(), **{"cost_model.params": 4e9, "cost_model.accelerator": "H100"})
    assert from_config(on) == CostModel(4e9, ACCELERATORS["H100"], 0.4)
    with pytest.raises(ConfigError, match="cost_model.accelerator"):
        validate_config(override(on, **{"cost_model.accelerator": "TPU9"}))
    with pytest.raises(ValueError, match="mfu"):
        CostModel(1e9, 1e12, 1.5)


def test_cost_model_charges_rows_at_llm_lengths():
    from wmrl_jax.train.cost import CostModel, TokenLengths, from_config
    from wmrl_jax.train.ledger import Ledger

    lengths = TokenLengths(sample=3000, wm_row=4000, train_row=3000)
    model = CostModel(params=1e9, peak_flops=1e12, mfu=0.5, lengths=lengths)
    # The run's own token counts are ignored; rows are charged at the LLM's lengths:
    # (2e9 * (10 * 3000 + 5 * 4000) + 6e9 * 2 * 3000) / 5e11 = 200 + 72 = 272 s.
    ledger = Ledger(gen_tokens=60, wm_tokens=99, train_tokens=7, samples=10, wm_rows=5,
                    train_rows=2, exec_seconds=3.0)  # fmt: skip
    assert model.seconds(ledger) == pytest.approx(275.0)
    on = override(base_config(), **{"cost_model.params": 1e9, "cost_model.sample_tokens": 3000.0,
                                    "cost_model.wm_tokens": 4000.0,
                                    "cost_model.train_tokens": 3000.0})  # fmt: skip
    assert from_config(on).lengths == lengths
    with pytest.raises(ConfigError, match="token lengths"):
        validate_config(override(on, **{"cost_model.wm_tokens": 0.0}))
    with pytest.raises(ConfigError, match="token lengths"):  # not silently ignored
        validate_config(override(on, **{"cost_model.sample_tokens": 0.0}))


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"executor.gpus": "two"}, "executor.gpus"),
        ({"executor.gpus_per_program": 1}, "needs config.executor.gpus"),
        ({"executor.gpus": "1", "executor.kind": "local"}, "needs a Docker executor"),
        ({"executor.gpus": "1", "executor.kind": "replay"}, "needs a Docker executor"),
        ({"executor.gpus": "0,1,2", "executor.gpus_per_program": 2}, "executor.gpus"),
        ({"executor.gpu_memory_fraction": 1.5}, "gpu_memory_fraction"),
    ],
)
def test_gpu_settings_are_checked(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate_config(override(base_config(), **overrides))
    validate_config(override(base_config(), **{"executor.gpus": "all", "executor.kind": "docker"}))
