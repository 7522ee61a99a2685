"""The remat forward's layer scan: its period, and values and gradients of the plain loop."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wmrl_jax.models import api, layer_scan, lm_head, qwen3

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _qwen3_5(layer_types):
    """A random float32 Qwen3.5 from a committed fixture's config, with these layer types."""
    with open(os.path.join(FIXTURES, "qwen3_5_text_untied", "config.json")) as f:
        raw = json.load(f)
    raw["layer_types"], raw["num_hidden_layers"] = list(layer_types), len(layer_types)
    return api.random_model(raw, jax.random.key(0))


def _qwen3(layers):
    raw = api.qwen3_config_dict(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    return api.random_model(raw, jax.random.key(1))


LIN, FULL = "linear_attention", "full_attention"


@pytest.mark.parametrize(
    "model,period",
    [
        (lambda: _qwen3(3), 1),
        (lambda: _qwen3_5([LIN, LIN, LIN, FULL] * 2), 4),
        (lambda: _qwen3_5([FULL, LIN] * 3), 2),
        (lambda: _qwen3_5([FULL, LIN, LIN, FULL, LIN]), 5),  # no shorter period: one group
    ],
)
def test_period_is_the_layer_pattern(model, period):
    assert layer_scan.period(model().module.layers) == period


# Relative to each gradient's largest entry: 1e-5 for Qwen3; the chunked delta rule's
# float32 rounding moves with XLA's fusion choices (measured: 1.9e-4 on one 4-entry
# per-head parameter of the Qwen3.5 model).
@pytest.mark.parametrize(
    "model,rtol",
    [(lambda: _qwen3(3), 1e-5), (lambda: _qwen3_5([LIN, LIN, LIN, FULL] * 2), 5e-4)],
    ids=["qwen3", "qwen3.5"],
)
def test_scanned_layers_give_the_loop_values_and_gradients(model, rtol):
    """The remat forward (layers scanned in groups) against the plain Python loop."""
    model = model()
    ids = jax.random.randint(jax.random.key(2), (2, 40), 0, model.config.vocab_size)
    mask = jnp.ones_like(ids).at[1, :5].set(0)

    def plain(params):
        logits = qwen3.apply(model.graphdef, params, ids[:, :-1], mask[:, :-1])
        return jnp.sum(qwen3.token_logprobs(logits, ids[:, 1:]) * mask[:, 1:])

    def scanned(params):
        features, head = qwen3.apply_features(
            model.graphdef, params, ids[:, :-1], mask[:, :-1], remat=True
        )
        logp, _ = lm_head.blocked_token_logprobs(features, head, ids[:, 1:], block=16)
        return jnp.sum(logp * mask[:, 1:])

    value, grads = jax.jit(jax.value_and_grad(plain))(model.params)
    ours, our_grads = jax.jit(jax.value_and_grad(scanned))(model.params)
    np.testing.assert_allclose(float(ours), float(value), rtol=1e-6)
    flat, our_flat = jax.tree.leaves(grads), jax.tree.leaves(our_grads)
    assert len(flat) == len(our_flat) > 0
    for a, b in zip(our_flat, flat, strict=True):
        scale = float(jnp.abs(b).max()) + 1e-12
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=rtol * scale)
