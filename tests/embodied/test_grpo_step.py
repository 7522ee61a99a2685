"""The embodied GRPO update: advantages per group, the clipped loss over simulated steps."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from wmrl_jax.embodied import grpo_step, policy


def test_episode_advantages_per_group():
    rewards = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0])
    adv = np.asarray(grpo_step.episode_advantages(rewards, 4))
    first = (rewards[:4] - rewards[:4].mean()) / (rewards[:4].std() + 1e-6)
    np.testing.assert_allclose(adv[:4], first, rtol=1e-5)
    np.testing.assert_array_equal(adv[4:], 0.0)  # Equal rewards: exactly no signal.
    with pytest.raises(ValueError, match="multiple of 3"):
        grpo_step.episode_advantages(rewards, 3)


def _batch(key, n=6, h=5, d=3, a=2):
    k1, k2, k3 = jax.random.split(key, 3)
    obs = jax.random.normal(k1, (n, h, d))
    actions = jax.random.normal(k2, (n, h, a))
    mask = jnp.arange(h)[None, :] < jnp.array([5, 5, 2, 2, 2, 2])[:, None]
    advantages = jax.random.normal(k3, (n,))
    return obs, actions, mask, advantages


def test_first_epoch_loss_is_reinforce_over_simulated_steps():
    params = policy.init_policy(jax.random.key(0), obs_dim=3, act_dim=2, hidden=(4,))
    obs, actions, mask, adv = _batch(jax.random.key(1))
    old = policy.log_prob(params, obs, actions)
    update = grpo_step.make_grpo_update(optax.sgd(0.0), horizon=5, epochs=1)
    batch = grpo_step.GrpoBatch(obs, actions, old, mask, adv)
    _, _, metrics = update(params, optax.sgd(0.0).init(params), batch)
    # At ratio 1 the clipped surrogate is -A per step; summed over simulated
    # steps and divided by N * H.
    expected = -np.sum(np.asarray(adv)[:, None] * np.asarray(mask)) / (6 * 5)
    np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-5)
    assert float(metrics["clip_fraction"]) == 0.0


def test_masked_steps_do_not_move_the_policy():
    params = policy.init_policy(jax.random.key(0), obs_dim=3, act_dim=2, hidden=(4,))
    obs, actions, mask, adv = _batch(jax.random.key(1))
    update = grpo_step.make_grpo_update(optax.adam(1e-2), horizon=5, epochs=3)
    outs = []
    for fill in (0.0, 100.0):
        o = jnp.where(mask[..., None], obs, fill)
        a = jnp.where(mask[..., None], actions, fill)
        batch = grpo_step.GrpoBatch(o, a, policy.log_prob(params, o, a), mask, adv)
        new, _, _ = update(params, optax.adam(1e-2).init(params), batch)
        outs.append(new)
    for x, y in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1]), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_update_raises_positive_advantage_actions():
    params = policy.init_policy(jax.random.key(0), obs_dim=3, act_dim=2, hidden=(8,))
    obs, actions, mask, _ = _batch(jax.random.key(2))
    adv = jnp.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    old = policy.log_prob(params, obs, actions)
    update = grpo_step.make_grpo_update(optax.adam(3e-3), horizon=5, epochs=4)
    batch = grpo_step.GrpoBatch(obs, actions, old, mask, adv)
    new, _, metrics = update(params, optax.adam(3e-3).init(params), batch)
    delta = np.asarray(((policy.log_prob(new, obs, actions) - old) * mask).sum(axis=1))
    # The surrogate objective rises: mass moves towards positive-advantage episodes.
    assert float(np.dot(np.asarray(adv), delta)) > 0.1
    assert delta[::2].sum() > 0 > delta[1::2].sum()
    assert 0.0 < float(metrics["approx_kl"]) < 0.1
    with pytest.raises(ValueError, match="epochs"):
        grpo_step.make_grpo_update(optax.adam(1e-3), horizon=5, epochs=0)
