"""`TrainStep.compile_ahead`: the update compiled in the background, reused by the next call."""

import concurrent.futures

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.train.sharded_step_check import make_batch
from wmrl_jax.models import sharding
from wmrl_jax.train import state as state_lib
from wmrl_jax.train import step as step_lib


def build(model, kl_coef=0.1):
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    opt = state_lib.default_optimizer_config()
    opt.lr = 1e-2
    optimizer = state_lib.make_optimizer(opt)
    config = step_lib.default_step_config()
    config.loss.kl_coef = kl_coef
    step = step_lib.make_train_step(model.graphdef, optimizer, config, mesh)
    params = jax.tree_util.tree_map(jnp.copy, model.params)
    return step, step.shard_state(state_lib.init_train_state(params, optimizer, kl_coef=kl_coef))


def test_the_next_call_reuses_the_compile_and_gives_the_same_update(model):
    batch = make_batch(4, 16, seed=5)
    shapes = {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype) for k, v in batch.items()}
    ahead, state = build(model)
    future = ahead.compile_ahead(state, shapes)
    assert isinstance(future, concurrent.futures.Future)
    key = jax.random.key(1)
    state, metrics = ahead(state, batch, key)
    assert future.done() and ahead.trace_count == 1  # compiled once, in the background
    state, _ = ahead(state, batch, key)
    assert ahead.trace_count == 1

    plain, plain_state = build(model)
    plain_state, plain_metrics = plain(plain_state, batch, key)
    plain_state, _ = plain(plain_state, batch, key)
    for got, want in zip(
        jax.tree.leaves(state.params), jax.tree.leaves(plain_state.params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
    assert float(metrics["loss"]) == pytest.approx(float(plain_metrics["loss"]), rel=1e-6)


def test_bad_shapes_are_refused_at_once(model):
    step, state = build(model)
    batch = make_batch(4, 16)
    with pytest.raises(ValueError, match="missing"):
        step.compile_ahead(state, {k: v for k, v in batch.items() if k != "advantages"})
    with pytest.raises(ValueError, match=r"advantages must have shape \(4,\)"):
        step.compile_ahead(state, {**batch, "advantages": batch["advantages"][:2]})
    step.compile_ahead(state, batch)  # a valid one still works after the refusals
    step.lower(state, batch, jax.random.key(0))  # waits for it; no second trace
    assert step.trace_count == 1
