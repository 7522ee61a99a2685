"""The GRPO update of the control policy, on groups of episodes.

Each episode's advantage is its reward relative to its group
(`wmrl_jax.core.grpo.group_advantages`, one initial-state seed per group) and
is shared by all its simulated steps; the loss is the clipped surrogate
(`wmrl_jax.core.grpo.clipped_surrogate`) summed over simulated steps and
normalised by ``N * H`` (`aggregate` mode ``"seq_sum_norm"``): a truncated
episode of k steps contributes its k steps, with the same per-step weight as a
full episode, i.e. the REINFORCE gradient of what was actually simulated.

Example:
  >>> import optax
  >>> from wmrl_jax.embodied import policy
  >>> params = policy.init_policy(jax.random.key(0), obs_dim=3, act_dim=1, hidden=(4,))
  >>> update = make_grpo_update(optax.adam(1e-3), horizon=5, epochs=2)
  >>> batch = GrpoBatch(jnp.zeros((4, 5, 3)), jnp.zeros((4, 5, 1)), jnp.zeros((4, 5)),
  ...                   jnp.ones((4, 5), bool), jnp.array([1.0, -1.0, 0.5, -0.5]))
  >>> params, opt_state, metrics = update(params, optax.adam(1e-3).init(params), batch)
  >>> sorted(metrics)
  ['approx_kl', 'clip_fraction', 'loss', 'std']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from wmrl_jax.core import grpo
from wmrl_jax.embodied import policy as policy_lib


class GrpoBatch(NamedTuple):
    """One update's episodes.

    Attributes:
      obs: scaled observations, of shape [N, H, D].
      actions: sampled actions, of shape [N, H, A].
      old_logp: log-probabilities under the sampling policy, of shape [N, H].
      mask: bool, of shape [N, H]: simulated steps.
      advantages: per-episode advantages, of shape [N].
    """

    obs: jax.Array
    actions: jax.Array
    old_logp: jax.Array
    mask: jax.Array
    advantages: jax.Array


def episode_advantages(rewards: jax.Array, group_size: int, *, mask=None) -> jax.Array:
    """GRPO advantages of rewards of shape [N] laid out as consecutive groups of G.

    Args:
      rewards: float [N].
      group_size: G.
      mask: optional bool [N], the episodes with a usable reward (the others get 0
        and do not enter their group's statistics); all when None.

    Returns:
      Float32 advantages of shape [N].
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards must be [N] with N a multiple of {group_size}, got {rewards.shape}"
        )
    groups = rewards.reshape(-1, group_size)
    if mask is None:
        return jax.vmap(grpo.group_advantages)(groups).reshape(-1)
    valid = jnp.asarray(mask, bool).reshape(-1, group_size)
    return jax.vmap(lambda r, m: grpo.group_advantages(r, mask=m))(groups, valid).reshape(-1)


def make_grpo_update(
    optimizer: optax.GradientTransformation,
    *,
    horizon: int,
    epochs: int = 4,
    clip: float = 0.2,
) -> Callable:
    """Builds a jitted ``(params, opt_state, batch) -> (params, opt_state, metrics)``.

    ``epochs`` full-batch gradient steps on the same episodes; the clipped
    ratio keeps the later ones near the sampling policy.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")

    def loss_fn(params, batch):
        logp = policy_lib.log_prob(params, batch.obs, batch.actions)
        per_step, ratio, clipped = grpo.clipped_surrogate(
            logp, batch.old_logp, batch.advantages[:, None], clip_low=clip
        )
        loss = grpo.aggregate(per_step, batch.mask, mode="seq_sum_norm", norm_constant=horizon)
        valid = batch.mask.astype(jnp.float32)
        denom = jnp.maximum(jnp.sum(valid), 1.0)
        metrics = {
            "clip_fraction": jnp.sum(clipped * valid) / denom,
            "approx_kl": jnp.sum((ratio - 1.0 - jnp.log(ratio)) * valid) / denom,
        }
        return loss, metrics

    @jax.jit
    def update(params, opt_state, batch):
        def body(carry, _):
            params, opt_state = carry
            (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), {"loss": loss, **metrics}

        (params, opt_state), metrics = jax.lax.scan(body, (params, opt_state), None, length=epochs)
        metrics = jax.tree.map(lambda x: x[-1], metrics)
        metrics["std"] = jnp.mean(jnp.exp(params.log_std))
        return params, opt_state, metrics

    return update
