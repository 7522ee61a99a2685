"""Train state, optimizer and the GRPO train step on a tiny random Qwen3."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.train.sharded_step_check import make_batch, tiny_model
from wmrl_jax.models import qwen3, sharding
from wmrl_jax.train import state as state_lib
from wmrl_jax.train import step as step_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


def opt_config(**overrides):
    c = state_lib.default_optimizer_config()
    c.lr, c.warmup_steps, c.total_steps, c.clip_norm = 1e-2, 0, 100, None
    c.update(overrides)
    return c


def step_config(**overrides):
    c = step_lib.default_step_config()
    loss = overrides.pop("loss", {})
    c.update(overrides)
    c.loss.update(loss)
    return c


def build(model, mesh, config, opt=None, *, extra=None):
    optimizer = state_lib.make_optimizer(opt or opt_config())
    step = step_lib.make_train_step(model.graphdef, optimizer, config, mesh)
    params = jax.tree_util.tree_map(jnp.copy, model.params)
    state = state_lib.init_train_state(params, optimizer, kl_coef=config.loss.kl_coef, extra=extra)
    return step, step.shard_state(state)


def log_softmax64(logits):
    x = np.asarray(logits, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_schedule_by_hand():
    c = opt_config(lr=1.0, warmup_steps=2, total_steps=4, end_lr_ratio=0.1)
    cosine = [float(state_lib.make_schedule(c)(i)) for i in range(6)]
    np.testing.assert_allclose(cosine, [0.5, 1.0, 1.0, 0.55, 0.1, 0.1], rtol=1e-6)
    c.decay = "linear"
    linear = [float(state_lib.make_schedule(c)(i)) for i in range(5)]
    np.testing.assert_allclose(linear, [0.5, 1.0, 1.0, 0.55, 0.1], rtol=1e-6)


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


def test_epoch_one_is_on_policy(model, mesh):
    config = step_config(num_epochs=2)
    step, state = build(model, mesh, config)
    batch = make_batch(4, 16, seed=2)
    logp, _ = jax.jit(step_lib.sequence_logprobs, static_argnums=0)(
        model.graphdef, state.params, batch["tokens"], batch["attention_mask"]
    )
    batch["old_logprobs"] = np.asarray(logp) * batch["loss_mask"]
    state, metrics = step(state, batch, jax.random.key(0))
    # The same params give the same log-probs, up to the rounding of another compiled
    # program (a few float32 ulps): the ratio is 1 within 2e-6 and nothing is clipped.
    for k in ("ratio_mean", "ratio_min", "ratio_max"):
        assert abs(float(metrics[k]) - 1.0) < 2e-6, (k, float(metrics[k]))
    assert float(metrics["clip_frac"]) == 0.0
    assert float(metrics["epoch2/ratio_max"]) > 1.001 and float(metrics["epoch2/ratio_min"]) < 0.999
    assert all(np.shape(v) == () for v in metrics.values()) and int(state.step) == 1
    assert float(metrics["lr"]) == pytest.approx(1e-2)


def test_no_reference_without_kl(model, mesh, monkeypatch):
    calls = []
    real_apply = qwen3.apply

    def counting(*args, **kwargs):
        calls.append(1)
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(qwen3, "apply", counting)
    batch = make_batch(4, 16, seed=3)
    traced = {}
    for kl in (0.0, 0.1):
        calls.clear()
        step, state = build(model, mesh, step_config(loss=dict(kl_coef=kl)))
        assert (state.ref_params is None) == (kl == 0.0)
        step.lower(state, batch, jax.random.key(0))  # traces; no compile needed
        traced[kl] = len(calls)
    assert traced == {0.0: 1, 0.1: 2}  # the policy forward, plus one reference forward


def test_extra_passes_through_and_second_call_does_not_retrace(model, mesh):
    extra = {"ledger": jnp.array([1.0, 2.0]), "rng": jax.random.key_data(jax.random.key(3))}
    step, state = build(model, mesh, step_config(), extra=extra)
    batch = make_batch(4, 16, seed=4)
    for i in range(3):
        state, metrics = step(state, batch, jax.random.fold_in(jax.random.key(0), i))
    assert step.trace_count == 1 and int(state.step) == 3
    np.testing.assert_array_equal(np.asarray(state.extra["ledger"]), [1.0, 2.0])
    assert set(metrics) >= {"loss", "pg_loss", "kl", "clip_frac", "entropy", "grad_norm", "lr"}
    assert float(metrics["grad_norm"]) > 0.0


def test_bad_batches(model, mesh):
    step, state = build(model, mesh, step_config(num_microbatches=2))
    batch = make_batch(4, 16)
    with pytest.raises(ValueError, match="missing"):
        step(state, {k: v for k, v in batch.items() if k != "advantages"}, jax.random.key(0))
    with pytest.raises(ValueError, match=r"loss_mask must have shape \(4, 16\)"):
        step(state, {**batch, "loss_mask": batch["loss_mask"][:, :8]}, jax.random.key(0))
    with pytest.raises(ValueError, match=r"advantages must have shape \(4,\)"):
        step(state, {**batch, "advantages": batch["advantages"][:2]}, jax.random.key(0))
    with pytest.raises(ValueError, match=r"tokens must have shape \[B, T\]"):
        step(state, {**batch, "tokens": batch["tokens"][0]}, jax.random.key(0))
    with pytest.raises(ValueError, match="not divisible"):
        step(state, {k: v[:3] for k, v in batch.items()}, jax.random.key(0))
    with pytest.raises(ValueError, match="T >= 2"):
        step(state, {k: v[:, :1] if v.ndim == 2 else v for k, v in batch.items()}, None)


def test_divisibility_counts_batch_shards():
    with pytest.raises(ValueError, match="2 x 4"):
        step_lib.check_batch(make_batch(4, 16), num_microbatches=2, batch_shards=4)
    step_lib.check_batch(make_batch(8, 16), num_microbatches=2, batch_shards=4)


def test_mesh_from_config():
    cfg = {"data": 1, "fsdp": -1, "tensor": 1}
    mesh = state_lib.make_mesh_from_config(cfg)
    assert dict(mesh.shape) == {"data": 1, "fsdp": jax.device_count(), "tensor": 1}
    with pytest.raises(ValueError, match="one may be -1"):
        state_lib.make_mesh_from_config({"data": -1, "fsdp": -1, "tensor": 1})
    with pytest.raises(ValueError, match="needs"):
        state_lib.make_mesh_from_config({"data": 1, "fsdp": 1, "tensor": jax.device_count() + 1})


def test_kl_without_reference_raises(model, mesh):
    step, state = build(model, mesh, step_config(loss=dict(kl_coef=0.1)))
    with pytest.raises(ValueError, match="no ref_params"):
        step(state.replace(ref_params=None), make_batch(4, 16), jax.random.key(0))


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(num_microbatches=0), "num_microbatches"),
        (dict(num_epochs=0), "num_epochs"),
        (dict(compute_dtype="int8"), "compute_dtype"),
        (dict(loss=dict(aggregation="sum")), "aggregation"),
        (dict(loss=dict(kl_estimator="k4")), "kl_estimator"),
        (dict(loss=dict(clip_low=1.0)), "clip_low"),
        (dict(loss=dict(kl_coef=-1.0)), "kl_coef"),
        (dict(loss=dict(aggregation="seq_sum_norm", norm_constant=0.0)), "norm_constant"),
    ],
)
def test_bad_step_configs(model, mesh, overrides, match):
    with pytest.raises(ValueError, match=match):
        step_lib.make_train_step(model.graphdef, None, step_config(**overrides), mesh)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(lr=0.0), "lr"),
        (dict(warmup_steps=200), "warmup_steps"),
        (dict(end_lr_ratio=2.0), "end_lr_ratio"),
        (dict(decay="step"), "decay"),
        (dict(b2=1.0), "b1, b2"),
        (dict(clip_norm=-1.0), "clip_norm"),
    ],
)
def test_bad_optimizer_configs(overrides, match):
    with pytest.raises(ValueError, match=match):
        state_lib.make_optimizer(opt_config(**overrides))
    with pytest.raises(ValueError, match="kl_coef"):
        state_lib.init_train_state({"w": jnp.ones(2)}, state_lib.make_optimizer(opt_config()),
                                   kl_coef=-0.1)  # fmt: skip


def test_sharded_step_matches_single_device():
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.train.sharded_step_check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "SHARDED STEP OK" in proc.stdout


def test_benchmark_tiny_preset(tmp_path):
    from benchmarks import train_step as bench

    out = tmp_path / "bench.json"
    payload = bench.main(["--preset", "tiny", "--repeats", "2", "--json", str(out)])
    assert payload["tokens_per_s"] > 0 and payload["step_s"] > 0
    assert payload["traces"] == 1 and out.exists()


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
