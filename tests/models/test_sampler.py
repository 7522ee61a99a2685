"""The KV-cache sampler: determinism, log-probs vs teacher forcing, stopping, filters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.conftest import load, reference
from wmrl_jax import models
from wmrl_jax.models.sampler import _sample, filter_logits

FIXTURE = "qwen3_gqa4_yarn"


def _prompts():
    ids = reference(FIXTURE)["input_ids"]
    return models.left_pad([ids[0, :10].tolist(), ids[1, :3].tolist(), ids[0, 20:27].tolist()], 0)


def _sample_args(**kwargs):
    ids, mask = _prompts()
    kwargs.setdefault("max_new_tokens", 12)
    return (load(FIXTURE), ids, mask), kwargs


def test_same_key_same_samples_and_no_recompile():
    args, kw = _sample_args(temperature=1.3)
    a = models.sample(*args, jax.random.key(1), **kw)
    before = _sample._cache_size()
    b = models.sample(*args, jax.random.key(1), **kw)
    c = models.sample(*args, jax.random.key(2), **kw)
    assert _sample._cache_size() == before
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))


@pytest.mark.parametrize(
    "filters",
    [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9, top_k=40), dict(greedy=True)],
)
def test_logprobs_match_teacher_forced_forward(filters):
    (model, ids, mask), kw = _sample_args(**filters)
    out = models.sample(model, ids, mask, jax.random.key(3), eos_ids=(), **kw)
    full = np.concatenate([ids, np.asarray(out.tokens)], axis=1)
    full_mask = np.concatenate([mask, np.asarray(out.mask)], axis=1)
    logits = model.logits(full, full_mask)
    p = ids.shape[1]
    teacher = models.token_logprobs(logits[:, p - 1 : -1], jnp.asarray(full[:, p:]))
    live = np.asarray(out.mask).astype(bool)
    assert live.all()  # no stop ids: every row runs the full budget
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(teacher), rtol=0, atol=1e-4)


def test_stop_ids_end_rows_and_set_masks():
    ref = reference(FIXTURE)
    model = load(FIXTURE)
    prompt = ref["greedy_prompt"]
    stop = int(ref["greedy_tokens"][5])
    first = int(np.argmax(ref["greedy_tokens"] == stop))
    out = models.sample(
        model,
        prompt,
        np.ones_like(prompt),
        jax.random.key(0),
        max_new_tokens=16,
        greedy=True,
        eos_ids=(),
        stop_ids=(stop,),
        pad_id=7,
    )
    n = first + 1  # the stop token itself is part of the completion
    assert int(out.lengths[0]) == n
    np.testing.assert_array_equal(np.asarray(out.tokens[0, :n]), ref["greedy_tokens"][:n])
    np.testing.assert_array_equal(np.asarray(out.tokens[0, n:]), 7)
    np.testing.assert_array_equal(np.asarray(out.mask[0]), np.arange(16) < n)
    np.testing.assert_array_equal(np.asarray(out.logprobs[0, n:]), 0.0)


def test_padded_batch_matches_rows_alone():
    (model, ids, mask), kw = _sample_args(greedy=True)
    batch = models.sample(model, ids, mask, jax.random.key(0), eos_ids=(), **kw)
    for row in range(ids.shape[0]):
        alone = ids[row][mask[row] == 1][None]
        out = models.sample(model, alone, np.ones_like(alone), jax.random.key(0), eos_ids=(), **kw)
        np.testing.assert_array_equal(np.asarray(out.tokens[0]), np.asarray(batch.tokens[row]))


def test_filter_logits_by_hand():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda **kw: np.isfinite(np.asarray(filter_logits(logits, **kw)))[0].tolist()
    # top-p keeps a token while the mass before it is < p.
    assert kept(temperature=1.0, top_k=0, top_p=0.7) == [True, True, False, False]
    assert kept(temperature=1.0, top_k=0, top_p=0.8) == [True, True, False, False]
    assert kept(temperature=1.0, top_k=0, top_p=0.81) == [True, True, True, False]
    assert kept(temperature=1.0, top_k=3, top_p=1.0) == [True, True, True, False]
    assert kept(temperature=1.0, top_k=3, top_p=0.5) == [True, False, False, False]
    np.testing.assert_allclose(
        filter_logits(logits, temperature=2.0, top_k=0, top_p=1.0), logits / 2.0, rtol=1e-6
    )


def test_top_k_one_is_greedy():
    args, kw = _sample_args()
    greedy = models.sample(*args, jax.random.key(0), greedy=True, eos_ids=(), **kw)
    top1 = models.sample(*args, jax.random.key(5), top_k=1, eos_ids=(), **kw)
    np.testing.assert_array_equal(np.asarray(greedy.tokens), np.asarray(top1.tokens))


def test_bad_arguments():
    (model, ids, mask), kw = _sample_args()
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="temperature"):
        models.sample(model, ids, mask, key, temperature=0.0, **kw)
    with pytest.raises(ValueError, match="top_p"):
        models.sample(model, ids, mask, key, top_p=0.0, **kw)
    with pytest.raises(ValueError, match=r"\[B, P\]"):
        models.sample(model, ids[0], mask[0], key, **kw)
    with pytest.raises(ValueError, match="max_new_tokens"):
        models.sample(model, ids, mask, key, max_new_tokens=0)


@pytest.mark.parametrize("fixture", [FIXTURE, "qwen3_5_vl_tied"])
def test_one_prefill_per_prompt_gives_the_repeated_prompts_samples(fixture):
    """num_samples=K: the samples of each prompt repeated K times, from one prefill each."""
    ids, mask = _prompts()
    model, k = load(fixture), 3
    kw = dict(max_new_tokens=4, temperature=1.2, eos_ids=())
    shared = models.sample(model, ids, mask, jax.random.key(4), num_samples=k, **kw)
    repeated = models.sample(
        model, np.repeat(ids, k, axis=0), np.repeat(mask, k, axis=0), jax.random.key(4), **kw
    )
    assert shared.tokens.shape == (ids.shape[0] * k, 4)
    np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(repeated.tokens))
    # Batches of other sizes round the float32 delta rule differently (as in test_qwen3_5).
    np.testing.assert_allclose(
        np.asarray(shared.logprobs), np.asarray(repeated.logprobs), atol=1e-4, rtol=0
    )
    assert len({tuple(r) for r in np.asarray(shared.tokens)[:k]}) > 1  # K distinct samples
    with pytest.raises(ValueError, match="num_samples"):
        models.sample(model, ids, mask, jax.random.key(4), num_samples=0, **kw)
