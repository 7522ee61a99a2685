"""A small Gaussian MLP policy over the state, as pure functions of a params pytree.

The policy maps an observation of shape [D] to a diagonal Gaussian over
actions of shape [A]: ``a ~ N(mu(o), diag(exp(log_std)^2))`` with a tanh MLP
for ``mu`` and a state-independent ``log_std``. Sampled actions are what the
simulator receives (the environment clips them to its action box); the
log-probabilities used by the GRPO loss are those of the unclipped samples, so
the ratio ``pi / pi_old`` is exact.

Observations are normalised by a fixed per-task scale (``obs_scale``) chosen
by the caller; nothing is learned about it online, so the policy is a pure
function of ``(params, obs)``.

Example:
  >>> import jax
  >>> params = init_policy(jax.random.key(0), obs_dim=4, act_dim=2, hidden=(8,))
  >>> actions, logp = sample_actions(params, jax.random.key(1), jnp.zeros((3, 4)))
  >>> actions.shape, logp.shape
  ((3, 2), (3,))
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array
_LOG_2PI = 1.8378770664093453


class PolicyParams(NamedTuple):
    """Parameters of the Gaussian MLP policy.

    Attributes:
      layers: tuple of ``(w, b)`` pairs; ``w`` of shape [in, out], ``b`` of shape [out].
      log_std: per-dimension log standard deviation, of shape [A].
    """

    layers: tuple[tuple[Array, Array], ...]
    log_std: Array


def init_mlp(key: Array, sizes: tuple[int, ...], *, final_scale: float) -> tuple:
    """Initialises MLP layers ``sizes[0] -> ... -> sizes[-1]`` (LeCun normal, zero biases).

    Args:
      key: a PRNG key.
      sizes: layer widths, input first.
      final_scale: multiplier of the last layer's weights (small: near-constant output).

    Returns:
      A tuple of ``(w, b)`` pairs.
    """
    keys = jax.random.split(key, len(sizes) - 1)
    layers = []
    for i, (k, n_in, n_out) in enumerate(zip(keys, sizes[:-1], sizes[1:], strict=True)):
        w = jax.random.normal(k, (n_in, n_out), jnp.float32) / jnp.sqrt(n_in)
        if i == len(sizes) - 2:
            w = w * final_scale
        layers.append((w, jnp.zeros((n_out,), jnp.float32)))
    return tuple(layers)


def mlp(layers: tuple, x: Array) -> Array:
    """Applies a tanh MLP (linear last layer) to ``x`` of shape [..., in]."""
    for w, b in layers[:-1]:
        x = jnp.tanh(x @ w + b)
    w, b = layers[-1]
    return x @ w + b


def init_policy(
    key: Array,
    *,
    obs_dim: int,
    act_dim: int,
    hidden: tuple[int, ...] = (64, 64),
    init_log_std: float = -0.5,
) -> PolicyParams:
    """Initialises the policy: mean near zero, standard deviation ``exp(init_log_std)``."""
    if obs_dim < 1 or act_dim < 1:
        raise ValueError(f"obs_dim and act_dim must be >= 1, got {obs_dim}, {act_dim}.")
    layers = init_mlp(key, (obs_dim, *hidden, act_dim), final_scale=0.01)
    return PolicyParams(layers, jnp.full((act_dim,), init_log_std, jnp.float32))


def policy_mean(params: PolicyParams, obs: Array) -> Array:
    """The mean action for observations of shape [..., D]; returns shape [..., A]."""
    return mlp(params.layers, jnp.asarray(obs, jnp.float32))


def log_prob(params: PolicyParams, obs: Array, actions: Array) -> Array:
    """Log-density of ``actions`` of shape [..., A] given ``obs`` of shape [..., D].

    Returns:
      Float32 log-probabilities of shape [...].
    """
    mean = policy_mean(params, obs)
    actions = jnp.asarray(actions, jnp.float32)
    if actions.shape != mean.shape:
        raise ValueError(f"actions of shape {actions.shape} do not match means {mean.shape}.")
    z = (actions - mean) * jnp.exp(-params.log_std)
    return jnp.sum(-0.5 * z**2 - params.log_std - 0.5 * _LOG_2PI, axis=-1)


def sample_actions(params: PolicyParams, key: Array, obs: Array) -> tuple[Array, Array]:
    """Samples actions for observations of shape [N, D].

    Returns:
      ``(actions, logp)`` of shapes [N, A] and [N].
    """
    mean = policy_mean(params, obs)
    noise = jax.random.normal(key, mean.shape, jnp.float32)
    actions = mean + jnp.exp(params.log_std) * noise
    logp = jnp.sum(-0.5 * noise**2 - params.log_std - 0.5 * _LOG_2PI, axis=-1)
    return actions, logp
