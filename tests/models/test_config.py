"""config.json parsing: both RoPE forms, YaRN frequencies, errors."""

import math

import numpy as np
import pytest

from wmrl_jax.models.config import config_from_dict
from wmrl_jax.models.rope import RopeConfig, rope_frequencies

BASE = dict(
    model_type="qwen3",
    vocab_size=16,
    hidden_size=8,
    intermediate_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    max_position_embeddings=64,
)
YARN = {"factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8, "beta_slow": 1}


def test_new_and_legacy_rope_forms_agree():
    new = config_from_dict(
        {**BASE, "rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, **YARN}}
    )
    legacy = config_from_dict(
        {**BASE, "rope_theta": 500.0, "rope_scaling": {"type": "yarn", **YARN}}
    )
    assert new.rope == legacy.rope
    assert new.rope.rope_type == "yarn" and new.rope.theta == 500.0
    plain = config_from_dict({**BASE, "rope_theta": 123.0, "rope_scaling": None})
    assert plain.rope == RopeConfig(theta=123.0)
    assert config_from_dict(BASE).rope == RopeConfig(theta=10000.0)


def test_default_frequencies_by_hand():
    inv_freq, scale = rope_frequencies(RopeConfig(theta=100.0), 4)
    np.testing.assert_allclose(inv_freq, [1.0, 0.1], rtol=1e-7)
    assert scale == 1.0


def test_yarn_frequencies_by_hand():
    rope = RopeConfig(
        theta=10000.0,
        rope_type="yarn",
        factor=4.0,
        original_max_position_embeddings=16,
        beta_fast=8.0,
        beta_slow=1.0,
    )
    inv_freq, scale = rope_frequencies(rope, 8)
    base = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    # Correction dims: 8 ln(16 / (2 pi r)) / (2 ln 1e4) for r = 8 and 1 -> floor 0, ceil 1.
    # Ramp over dims (i - 0) / (1 - 0) clipped: [0, 1, 1, 1]; extrapolate where ramp is 0.
    expected = np.array([base[0], base[1] / 4, base[2] / 4, base[3] / 4])
    np.testing.assert_allclose(inv_freq, expected, rtol=1e-6)
    assert scale == pytest.approx(0.1 * math.log(4.0) + 1.0)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "llama"}, "unknown model_type 'llama'"),
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"rope_scaling": {"type": "longrope", "factor": 2.0}}, "unsupported rope_type"),
        ({"vocab_size": None}, "vocab_size"),
        ({"use_sliding_window": True}, "use_sliding_window"),
    ],
)
def test_bad_configs(change, message):
    raw = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        config_from_dict(raw)
