"""One arm, one behaviour: the trainer's reward stage and the controlled study feed the
same rewards, with the same validity mask, on the same inputs, for every arm; the arms
that form their own advantages (`wmrl_ppi`, `wmrl_weighted`) form the same ones."""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import controlled as controlled_config
from experiments.configs import tiny_cpu
from wmrl_jax.agents.base import Rollout, WMOutput
from wmrl_jax.core import grpo, ppi
from wmrl_jax.studies import controlled
from wmrl_jax.train import arms
from wmrl_jax.train.config import override
from wmrl_jax.train.records import Anchors, Execution, Sampled
from wmrl_jax.train.rewards import Rewarder

B, G, K, STEPS, TASKS = 6, 4, 3, 4, 8


def _inputs(step: int):
    """One step of a small simulated batch: candidates recur, so memory and local offsets act."""
    rng = np.random.default_rng(step)
    tasks = np.sort(rng.choice(TASKS, B, replace=False)).astype(np.int32)
    actions = rng.integers(0, K, (B, G)).astype(np.int32)
    quality = (tasks[:, None] * 0.1 + actions * 0.1).astype(np.float32)
    real = (quality + 0.05 * rng.normal(size=(B, G))).astype(np.float32)
    pred = (0.3 + 0.5 * quality**2 + 0.05 * rng.normal(size=(B, G))).astype(np.float32)
    groups = np.zeros(B, bool)
    groups[rng.choice(B, 2 + step % 2, replace=False)] = True
    weights = np.where(groups, rng.uniform(0.5, 2.0, B), 0.0).astype(np.float32)
    return tasks, actions, real, pred, groups, weights


def _study_config():
    config = controlled_config.get_config("runlocal")
    with config.unlocked():
        config.correction.min_anchors = 4  # the map acts within the replay's few steps
        config.anchors.reliability.warmup_rows = 8.0  # so does λ (wmrl_ppi, wmrl_weighted)
    return config


def _trainer_fed(arm, config, steps):
    """The trainer's `Rewarder.correct` over `steps`, with the study's correction settings."""
    c = config.correction
    correction = arms.make_correction(
        arm, capacity=c.capacity, decay=c.decay, real_var_prior=c.real_var_prior,
        min_anchors=c.min_anchors, local_features=1, local_prior_count=c.local_prior_count,
    )  # fmt: skip
    memory = {}

    def remembered(tasks, programs, g):
        del g
        keys = [(t.id, p) for t, p in zip(np.repeat(tasks, G), programs, strict=True)]
        total = np.array([memory.get(k, (0.0, 0.0))[0] for k in keys], np.float32)
        count = np.array([memory.get(k, (0.0, 0.0))[1] for k in keys], np.float32)
        return np.where(count > 0, total / np.maximum(count, 1), np.nan), count

    train_config = override(
        tiny_cpu.get_config("runlocal"), arm=arm.name, tasks_per_step=B,
        **{"anchors.reliability.warmup_rows": config.anchors.reliability.warmup_rows},
    )  # fmt: skip
    rewarder = Rewarder.from_config(train_config, arm, correction, remembered=remembered)
    extra, out = rewarder.init(), []
    for step, (tasks, actions, real, pred, groups, weights) in enumerate(steps):
        task_objs = [types.SimpleNamespace(id=int(t)) for t in tasks]
        programs = [str(a) for a in actions.reshape(-1)]
        rollout = Rollout(programs, {}, 0, (), features=actions.reshape(-1, 1))
        sampled = Sampled(step + 1, tuple(task_objs), G, rollout)
        executed = np.repeat(groups, G)
        real_rows = np.where(executed, real.reshape(-1), np.nan).astype(np.float32)
        execution = Execution({}, {}, real_rows, executed, np.full(B * G, np.nan, np.float32))
        wm = None
        if arm.world_model:
            wm = WMOutput(pred.reshape(-1), np.ones(B * G, np.float32), 0, 0)
        fed, extra = rewarder.correct(sampled, wm, Anchors(groups, weights), execution, extra)
        out.append((fed.rewards, fed.valid, fed.advantages))
        for i in np.flatnonzero(executed):
            total, count = memory.get((task_objs[i // G].id, programs[i]), (0.0, 0.0))
            memory[(task_objs[i // G].id, programs[i])] = (total + real_rows[i], count + 1)
    return out


def _study_fed(arm, config, steps):
    """The controlled study's reward formation over `steps`."""
    c = config.correction
    correction = arms.make_correction(
        arm, capacity=c.capacity, decay=c.decay, real_var_prior=c.real_var_prior,
        min_anchors=c.min_anchors, local_features=1, local_prior_count=c.local_prior_count,
    )  # fmt: skip
    state, reliability = correction.init(), ppi.init()
    mem_sum = mem_count = jnp.zeros((TASKS, K))
    r = config.anchors.reliability
    estimate = functools.partial(
        ppi.advantages, arm.estimator, mode=config.advantage, decay=r.decay,
        warmup_rows=r.warmup_rows,
    )  # fmt: skip
    adv_fn = functools.partial(grpo.group_advantages, mode=config.advantage)
    advantages = jax.jit(functools.partial(controlled._advantages, arm, estimate, adv_fn))
    out = []
    # Jitted, as the study runs it (eager and jitted float32 may differ in the last bit).
    fed_rewards = jax.jit(functools.partial(controlled._fed_rewards, arm, correction))
    for tasks, actions, real, pred, groups, weights in steps:
        carry = types.SimpleNamespace(mem_sum=mem_sum, mem_count=mem_count)
        anchor = jnp.broadcast_to(jnp.asarray(groups)[:, None], (B, G))
        rows = controlled._row_extras(arm, carry, tasks, actions, jnp.asarray(weights), G)
        before = correction.debias(state, jnp.asarray(pred))  # the map before the anchors
        fed, valid, _, state = fed_rewards(
            state, jnp.asarray(pred), jnp.asarray(real), anchor, rows
        )
        adv, _, reliability, _ = advantages(
            reliability, fed, valid, jnp.asarray(real), before, anchor, jnp.asarray(weights)
        )
        out.append((np.asarray(fed).reshape(-1), np.asarray(valid).reshape(-1), adv.reshape(-1)))
        at = (tasks[:, None], actions)
        mem_sum = mem_sum.at[at].add(jnp.where(anchor, real, 0.0))
        mem_count = mem_count.at[at].add(anchor.astype(jnp.float32))
    return out


@pytest.mark.parametrize("name", list(arms.ARMS))
def test_trainer_and_controlled_study_feed_the_same_rewards(name):
    arm = arms.get(name)
    if arm.executes == "all":
        steps = [
            (*s[:4], np.ones(B, bool), np.ones(B, np.float32)) for s in map(_inputs, range(STEPS))
        ]
    else:
        steps = [_inputs(s) for s in range(STEPS)]
    config = _study_config()
    trainer, study = _trainer_fed(arm, config, steps), _study_fed(arm, config, steps)
    for step, (mine, theirs) in enumerate(zip(trainer, study, strict=True)):
        (fed_t, valid_t, adv_t), (fed_s, valid_s, adv_s) = mine, theirs
        np.testing.assert_array_equal(valid_t, valid_s, err_msg=f"{name} step {step}: masks")
        # Rows outside the mask carry no reward: their values are the arm's business.
        np.testing.assert_array_equal(
            np.where(valid_t, fed_t, 0), np.where(valid_s, fed_s, 0), err_msg=f"{name} step {step}"
        )
        if arm.estimator != "grpo":
            np.testing.assert_allclose(
                adv_t, np.asarray(adv_s), rtol=1e-6, atol=1e-6, err_msg=f"{name} step {step}"
            )
    if arm.estimator != "grpo":  # λ > 0 by the last step: the WM groups carry advantages.
        off_anchor = ~np.repeat(steps[-1][4], G)
        assert np.abs(trainer[-1][2][off_anchor]).max() > 1e-3
