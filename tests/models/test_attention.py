"""Blocked attention, the blocked LM head and per-layer remat: same values, less memory.

Values against the dense paths (and the PyTorch reference logits of every committed
checkpoint); memory against XLA's own buffer assignment of the compiled program.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.conftest import ALL_NAMES, QWEN3_5_NAMES, load, reference
from wmrl_jax import models
from wmrl_jax.models import attention, lm_head, qwen3

# float32: the blocked path does the dense path's arithmetic row by row, so only
# the matmuls' blocking may move a result by an ulp or so.
ATOL = 1e-6


def _qkv(b, t, s, h, kv, d, seed=0, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (b, t, h, d), dtype)
    k = jax.random.normal(keys[1], (b, t, kv, d), dtype)
    v = jax.random.normal(keys[2], (b, t, kv, d), dtype)
    return q, k, v


def _left_padded_causal(b, t, s, start=0, pad=(0, 5, 11)):
    """[B, T, S] mask: causal from slot `start`, row i left padded by pad[i]."""
    slot, query = jnp.arange(s), jnp.arange(t) + start
    causal = slot[None, :] <= query[:, None]
    real = slot[None, :] >= jnp.asarray(pad[:b])[:, None]
    return causal[None] & real[:, None, :]


@pytest.mark.parametrize("heads,kv,t,block", [(4, 4, 37, 8), (4, 2, 64, 16), (8, 2, 16, 16)])
def test_blocked_attention_is_the_dense_one(heads, kv, t, block):
    q, k, v = _qkv(3, t, t, heads, kv, 8, seed=t + heads)
    mask = _left_padded_causal(3, t, t)
    dense = attention.attend(q, k, v, mask, query_block=t)
    blocked = attention.attend(q, k, v, mask, query_block=block)
    jitted = jax.jit(functools.partial(attention.attend, query_block=block))(q, k, v, mask)
    for out in (blocked, jitted):
        np.testing.assert_allclose(np.asarray(out[0]), np.asarray(dense[0]), atol=ATOL, rtol=0)
        np.testing.assert_array_equal(np.asarray(out[1][0]), np.asarray(dense[1][0]))


@pytest.mark.parametrize("start", [0, 6])
def test_blocked_attention_through_a_cache(start):
    """A prefill of T tokens into a cache of S > T slots written from `start`."""
    b, t, s, kv, d = 3, 21, 40, 2, 8
    q, k, v = _qkv(b, t, s, 4, kv, d, seed=start)
    cache = tuple(jax.random.normal(jax.random.key(9 + i), (b, kv, s, d)) for i in range(2))
    mask = _left_padded_causal(b, t, s, start)
    dense = attention.attend(q, k, v, mask, cache, start, query_block=t)
    blocked = attention.attend(q, k, v, mask, cache, start, query_block=4)
    np.testing.assert_allclose(np.asarray(blocked[0]), np.asarray(dense[0]), atol=ATOL, rtol=0)
    for ours, theirs in zip(blocked[1], dense[1], strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_blocked_attention_gradients_are_the_dense_ones():
    q, k, v = _qkv(2, 45, 45, 4, 2, 8, seed=3)
    mask = _left_padded_causal(2, 45, 45)
    weights = jax.random.normal(jax.random.key(4), (2, 45, 32))

    def loss(q, k, v, block):
        return jnp.sum(attention.attend(q, k, v, mask, query_block=block)[0] * weights)

    dense = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, 45)
    blocked = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)(q, k, v, 8)
    for ours, theirs in zip(blocked, dense, strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5, rtol=1e-5)


def test_bad_query_block():
    q, k, v = _qkv(1, 4, 4, 2, 2, 8)
    with pytest.raises(ValueError, match="query_block"):
        attention.attend(q, k, v, _left_padded_causal(1, 4, 4), query_block=0)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_blocked_attention_logits_match_reference(name):
    """Every committed checkpoint (dense, GQA 1/2/4, YaRN, Qwen3.5) in 16-query blocks."""
    ref, model = reference(name), load(name)
    ids = jnp.asarray(ref["input_ids"])
    logits = jax.jit(functools.partial(qwen3.apply, query_block=16), static_argnums=0)(
        model.graphdef, model.params, ids
    )
    # As the dense parity tests: 1e-5 for Qwen3, the delta rule's 1e-4 for Qwen3.5.
    atol = 1e-4 if name in QWEN3_5_NAMES else 1e-5
    np.testing.assert_allclose(np.asarray(logits), ref["logits_fp32"], rtol=0, atol=atol)


@pytest.mark.parametrize("t,block", [(33, 8), (16, 16), (5, 64)])
def test_blocked_lm_head_is_the_dense_one(t, block):
    features = jax.random.normal(jax.random.key(0), (2, t, 16))
    head = jax.random.normal(jax.random.key(1), (16, 50))
    targets = jax.random.randint(jax.random.key(2), (2, t), 0, 50)
    logits = jnp.dot(features, head)
    want = qwen3.token_logprobs(logits, targets)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    want_entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)

    def loss(features, head, fn):
        logp, entropy = fn(features, head)
        return jnp.sum(logp * jnp.arange(t)) + jnp.sum(entropy)  # entropy: no gradient

    blocked = functools.partial(lm_head.blocked_token_logprobs, targets=targets, block=block)
    logp, entropy = jax.jit(blocked)(features, head)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(want), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(entropy), np.asarray(want_entropy), atol=1e-5, rtol=0)

    def dense(features, head):
        return qwen3.token_logprobs(jnp.dot(features, head), targets), jnp.zeros_like(want)

    grads = jax.grad(loss, argnums=(0, 1))(features, head, blocked)
    want_grads = jax.grad(loss, argnums=(0, 1))(features, head, dense)
    for ours, theirs in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError, match="targets"):
        lm_head.blocked_token_logprobs(features, head, targets[:, :-1])


@pytest.mark.parametrize("name", ["qwen3_gqa2_untied", "qwen3_5_vl_tied"])
def test_remat_gradients_are_the_plain_ones(name):
    """Per-layer remat, blocked attention and the blocked head change memory, not gradients."""
    model = load(name)
    ids = jnp.asarray(reference(name)["input_ids"][:, :70])
    mask = jnp.ones_like(ids).at[1, :6].set(0)

    def plain(params):
        logits = models.apply(model.graphdef, params, ids[:, :-1], mask[:, :-1])
        return jnp.sum(models.token_logprobs(logits, ids[:, 1:]) * mask[:, 1:])

    def lean(params):
        features, head = qwen3.apply_features(
            model.graphdef, params, ids[:, :-1], mask[:, :-1], remat=True, query_block=16
        )
        logp, _ = lm_head.blocked_token_logprobs(features, head, ids[:, 1:], block=16)
        return jnp.sum(logp * mask[:, 1:])

    value, grads = jax.jit(jax.value_and_grad(plain))(model.params)
    lean_value, lean_grads = jax.jit(jax.value_and_grad(lean))(model.params)
    np.testing.assert_allclose(float(lean_value), float(value), rtol=1e-6)
    flat, lean_flat = jax.tree.leaves(grads), jax.tree.leaves(lean_grads)
    assert len(flat) == len(lean_flat) > 0
    # Relative to each gradient's largest entry: 1e-5 for Qwen3; the chunked delta
    # rule's float32 rounding moves with XLA's fusion choices by up to ~1e-4.
    rtol = 1e-4 if name in QWEN3_5_NAMES else 1e-5
    for ours, theirs in zip(lean_flat, flat, strict=True):
        scale = float(jnp.abs(theirs).max()) + 1e-12
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=rtol * scale)


def _temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_blocked_attention_memory_grows_linearly_in_xla():
    """XLA's buffer assignment of attention's forward + backward: the blocked path's
    temporaries grow ~linearly in T (one block's [H, block, T] scores), the dense
    path's quadratically (every layer's [H, T, T] scores are backward residuals)."""
    heads, kv, d, block = 8, 2, 16, 64

    def grad_fn(block):
        def loss(q, k, v):
            mask = jnp.tril(jnp.ones((q.shape[1],) * 2, bool))[None]
            return jnp.sum(attention.attend(q, k, v, mask, query_block=block)[0] ** 2)

        return jax.grad(loss, argnums=(0, 1, 2))

    measured = {}
    for t in (256, 512, 1024):
        args = [jax.ShapeDtypeStruct((1, t, n, d), jnp.float32) for n in (heads, kv, kv)]
        measured[t] = (_temp_bytes(grad_fn(t), *args), _temp_bytes(grad_fn(block), *args))
    dense, blocked = zip(*measured.values(), strict=True)
    assert dense[2] / dense[1] > 3.5 and dense[1] / dense[0] > 3.5  # quadratic
    assert blocked[2] / blocked[1] < 2.5 and blocked[1] / blocked[0] < 2.5  # linear
    assert blocked[2] * 6 < dense[2], measured
