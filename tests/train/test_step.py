"""Train state, optimizer and the GRPO train step on a tiny random Qwen3 (the loss it
minimises: test_loss.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.multidevice import assert_ran, run_on_host_devices
from tests.train.sharded_step_check import make_batch
from tests.train.tiny_step import build, opt_config, step_config
from wmrl_jax.models import qwen3
from wmrl_jax.train import loss as loss_lib
from wmrl_jax.train import state as state_lib
from wmrl_jax.train import step as step_lib


def test_schedule_by_hand():
    c = opt_config(lr=1.0, warmup_steps=2, total_steps=4, end_lr_ratio=0.1)
    cosine = [float(state_lib.make_schedule(c)(i)) for i in range(6)]
    np.testing.assert_allclose(cosine, [0.5, 1.0, 1.0, 0.55, 0.1, 0.1], rtol=1e-6)
    c.decay = "linear"
    linear = [float(state_lib.make_schedule(c)(i)) for i in range(5)]
    np.testing.assert_allclose(linear, [0.5, 1.0, 1.0, 0.55, 0.1], rtol=1e-6)


def test_epoch_one_is_on_policy(model, mesh):
    config = step_config(num_epochs=2)
    step, state = build(model, mesh, config)
    batch = make_batch(4, 16, seed=2)
    logp, _ = jax.jit(loss_lib.sequence_logprobs, static_argnums=0)(
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
    proc = run_on_host_devices("tests.train.sharded_step_check", timeout=600)
    assert_ran(proc, "SHARDED STEP OK")


def test_benchmark_tiny_preset(tmp_path):
    from benchmarks import train_step as bench

    out = tmp_path / "bench.json"
    payload = bench.main(["--preset", "tiny", "--repeats", "2", "--json", str(out)])
    assert payload["tokens_per_s"] > 0 and payload["step_s"] > 0
    assert payload["traces"] == 1 and out.exists()
