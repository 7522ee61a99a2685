"""The sampler on Qwen3.5: hybrid caches in the while loop, log-probs vs teacher forcing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.conftest import load, reference
from wmrl_jax import models
from wmrl_jax.models import qwen3_5

FIXTURE = "qwen3_5_text_untied"


def _prompts():
    ids = reference(FIXTURE)["input_ids"]
    # One prompt longer than a chunk (64), so the prefill crosses a chunk boundary.
    rows = [ids[0, :70].tolist(), ids[1, :3].tolist(), ids[0, 20:31].tolist()]
    return models.left_pad(rows, 0)


def test_cache_holds_each_layer_kind():
    model = load(FIXTURE)
    cache = model.module.init_cache(3, 20, jnp.float32)
    c = model.config
    for kind, layer in zip(c.layer_types, cache.layers, strict=True):
        if kind == "full_attention":
            assert isinstance(layer, qwen3_5.AttentionCache)
            assert layer.k.shape == (3, c.num_key_value_heads, 20, c.head_dim)
        else:
            assert isinstance(layer, qwen3_5.DeltaCache)
            assert layer.conv.shape == (3, c.conv_dim, c.linear_conv_kernel_dim - 1)
            assert layer.state.dtype == jnp.float32
            assert layer.state.shape == (
                3,
                c.linear_num_value_heads,
                c.linear_key_head_dim,
                c.linear_value_head_dim,
            )


@pytest.mark.parametrize("filters", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)])
def test_logprobs_match_teacher_forced_forward(filters):
    model = load(FIXTURE)
    ids, mask = _prompts()
    out = models.sample(
        model, ids, mask, jax.random.key(3), max_new_tokens=12, eos_ids=(), **filters
    )
    full = np.concatenate([ids, np.asarray(out.tokens)], axis=1)
    full_mask = np.concatenate([mask, np.asarray(out.mask)], axis=1)
    logits = model.logits(full, full_mask)
    p = ids.shape[1]
    teacher = models.token_logprobs(logits[:, p - 1 : -1], jnp.asarray(full[:, p:]))
    assert np.asarray(out.mask).all()
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(teacher), rtol=0, atol=1e-4)


def test_padded_batch_matches_rows_alone():
    model = load(FIXTURE)
    ids, mask = _prompts()
    kw = dict(max_new_tokens=10, greedy=True, eos_ids=())
    batch = models.sample(model, ids, mask, jax.random.key(0), **kw)
    for row in range(ids.shape[0]):
        alone = ids[row][mask[row] == 1][None]
        out = models.sample(model, alone, np.ones_like(alone), jax.random.key(0), **kw)
        np.testing.assert_array_equal(np.asarray(out.tokens[0]), np.asarray(batch.tokens[row]))
