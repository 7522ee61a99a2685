"""The whole-batch GRPO loss by micro-batches, against numpy float64, on a tiny random Qwen3."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.train.sharded_step_check import make_batch
from tests.train.tiny_step import build, log_softmax64, step_config
from wmrl_jax.models import qwen3
from wmrl_jax.train import loss as loss_lib


def test_loss_matches_float64_reference(model, mesh):
    """Clipped surrogate + k3 KL, global token mean over 2 micro-batches, vs numpy float64."""
    config = step_config(num_microbatches=2, loss=dict(kl_coef=0.1, clip_high=0.28))
    step, state = build(model, mesh, config)
    # A reference that differs from the policy, so the KL term is not zero.
    ref = jax.tree_util.tree_map(lambda p: p * 0.7, state.ref_params)
    state = state.replace(ref_params=ref)
    batch = make_batch(4, 16)
    loss, _, metrics = step.loss_and_grads(state, batch)

    tokens = batch["tokens"]
    targets = tokens[:, 1:, None]
    logits = qwen3.apply(model.graphdef, model.params, tokens, batch["attention_mask"])
    ref_logits = qwen3.apply(model.graphdef, ref, tokens, batch["attention_mask"])
    logp = np.take_along_axis(log_softmax64(logits[:, :-1]), targets, -1)[..., 0]
    ref_logp = np.take_along_axis(log_softmax64(ref_logits[:, :-1]), targets, -1)[..., 0]
    mask = batch["loss_mask"][:, 1:] > 0
    old = batch["old_logprobs"][:, 1:].astype(np.float64)
    adv = batch["advantages"][:, None].astype(np.float64)
    ratio = np.exp(logp - old)
    pg = -np.minimum(ratio * adv, np.clip(ratio, 0.8, 1.28) * adv)
    kl = np.exp(ref_logp - logp) - (ref_logp - logp) - 1.0
    want = ((pg + 0.1 * kl) * mask).sum() / mask.sum()
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    # Micro-batches are rows 0::2 and 1::2; the mean of their token means is not the loss.
    parts = [((pg + 0.1 * kl) * mask)[i::2].sum() / mask[i::2].sum() for i in range(2)]
    assert abs(np.mean(parts) - want) > 1e-3 * abs(want)
    # k3 = exp(x) - x - 1 cancels in float32: ~1 ulp of 1.0 (1.2e-7) absolute per token.
    want_kl = (kl * mask).sum() / mask.sum()
    np.testing.assert_allclose(float(metrics["kl"]), want_kl, rtol=1e-5, atol=2e-7)
    assert float(metrics["tokens"]) == mask.sum()
    probs = np.exp(log_softmax64(logits[:, :-1]))
    entropy = -(probs * np.log(probs)).sum(-1)
    np.testing.assert_allclose(float(metrics["entropy"]), entropy[mask].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["ratio_max"]), ratio[mask].max(), rtol=1e-5)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_microbatches_give_the_global_mean(model, mesh, aggregation):
    """4 micro-batches of unequal lengths == 1 micro-batch: loss, grads (and the update)."""
    batch = make_batch(8, 16, seed=1)
    batch["loss_mask"][0] = 0.0  # an empty sequence too
    lengths = batch["loss_mask"].sum(1)
    assert len(set(lengths.tolist())) > 3, lengths
    out = {}
    for m in (1, 4):
        config = step_config(num_microbatches=m, loss=dict(aggregation=aggregation))
        step, state = build(model, mesh, config)
        out[m] = step.loss_and_grads(state, batch)
        if aggregation == "token_mean":
            out[m] += step(state, batch, jax.random.key(0))
    # float32 sums in another order: a few ulps of the summed terms.
    np.testing.assert_allclose(float(out[4][0]), float(out[1][0]), rtol=1e-6, atol=1e-7)
    leaves = [jax.tree_util.tree_leaves(out[m][1:3]) for m in (4, 1)]
    for a, b in zip(*leaves, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    if aggregation != "token_mean":
        return
    # Adam's update is ~lr * sign(g): an element with g ~ 0 turns reduction noise
    # into up to lr (1e-2); 1e-4 is 1% of one update.
    leaves = [jax.tree_util.tree_leaves(out[m][3].params) for m in (4, 1)]
    for a, b in zip(*leaves, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-4)


def test_divisibility_counts_batch_shards():
    with pytest.raises(ValueError, match="2 x 4"):
        loss_lib.check_batch(make_batch(4, 16), num_microbatches=2, batch_shards=4)
    loss_lib.check_batch(make_batch(8, 16), num_microbatches=2, batch_shards=4)


def test_auxiliary_loss_is_the_global_token_mean_nll(model, mesh):
    """aux_coef * mean NLL of the masked aux targets, exact across micro-batches."""
    batch = make_batch(4, 16, seed=2)
    rng = np.random.default_rng(3)
    batch["aux_tokens"] = rng.integers(0, 64, size=(4, 7)).astype(np.int32)
    mask = np.zeros((4, 7), np.float32)
    mask[[0, 0, 2, 3], [6, 3, 6, 1]] = 1.0  # Unequal counts per row; row 1 has none.
    batch["aux_mask"] = mask
    base = step_config(num_microbatches=1)
    step0, state0 = build(model, mesh, base)
    loss0, _, _ = step0.loss_and_grads(state0, batch)
    logits = qwen3.apply(model.graphdef, model.params, jnp.asarray(batch["aux_tokens"]))
    logp = log_softmax64(logits)[:, :-1]
    nll = -np.take_along_axis(logp, batch["aux_tokens"][:, 1:, None], -1)[..., 0]
    expected = (nll * mask[:, 1:]).sum() / mask.sum()
    out = {}
    for m in (1, 2):
        config = step_config(num_microbatches=m, loss=dict(aux_coef=0.5))
        step, state = build(model, mesh, config)
        out[m] = step.loss_and_grads(state, batch)
        np.testing.assert_allclose(float(out[m][2]["aux_nll"]), expected, rtol=1e-5)
        np.testing.assert_allclose(float(out[m][0]), float(loss0) + 0.5 * expected, rtol=1e-5)
    for a, b in zip(*(jax.tree_util.tree_leaves(out[m][1]) for m in (1, 2)), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="aux_tokens"):
        step.loss_and_grads(state, {k: v for k, v in batch.items() if k != "aux_tokens"})


def test_remat_gives_the_same_loss_gradients_and_metrics(model, mesh):
    """Per-layer remat with the blocked LM head, over 600 tokens: the attention runs in
    two query blocks and the head in two token blocks, and nothing changes but memory."""
    batch = make_batch(4, 600, seed=6)
    rng = np.random.default_rng(7)
    batch["aux_tokens"] = rng.integers(0, 64, size=(4, 9)).astype(np.int32)
    batch["aux_mask"] = (rng.uniform(size=(4, 9)) < 0.5).astype(np.float32)
    out = {}
    for remat in (False, True):
        config = step_config(num_microbatches=2, remat=remat, loss=dict(aux_coef=0.5))
        step, state = build(model, mesh, config)
        out[remat] = step.loss_and_grads(state, batch)
    (loss, grads, metrics), (loss_r, grads_r, metrics_r) = out[False], out[True]
    np.testing.assert_allclose(float(loss_r), float(loss), rtol=1e-6)
    for key in metrics:
        np.testing.assert_allclose(float(metrics_r[key]), float(metrics[key]), rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(grads_r), jax.tree_util.tree_leaves(grads),
                    strict=True):  # fmt: skip
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
