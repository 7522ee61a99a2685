"""A train step on a tiny random Qwen3, shared by test_step.py and test_loss.py."""

import jax
import jax.numpy as jnp
import numpy as np

from wmrl_jax.train import state as state_lib
from wmrl_jax.train import step as step_lib


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
