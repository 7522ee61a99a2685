"""Runs a batch of episodes, full or truncated, with replicate continuations.

One call simulates N episodes in lockstep. Episode i runs ``lengths[i]``
steps: the horizon H for executed (anchor) episodes, the prefix length k for
episodes whose outcome the world model predicts. After step k, replicate slots
receive a copy of their source episode's simulator state and continue it to H
with fresh policy noise: two real outcomes of the same prefix, whose spread
estimates σ²_real (the outcome's variance given what the policy did so far).

Observations are recorded before each action; the prefix features (the
observation after k steps and the return of those k steps) are what the
progress model reads.

Example:
  >>> from wmrl_jax.embodied import envs, policy, tasks
  >>> spec = tasks.TASKS["reacher"]
  >>> env = envs.GymnasiumEpisodes(spec, num_envs=3)
  >>> params = policy.init_policy(jax.random.key(0), obs_dim=10, act_dim=2)
  >>> sampler = make_sampler(spec.obs_scale)
  >>> ep = run_episodes(env, sampler, params, jax.random.key(1), seeds=[5, 5],
  ...                   lengths=[50, 10], prefix_len=10, replicate_src=[0])
  >>> ep.obs.shape, int(ep.mask.sum()), int(ep.sim_steps)
  ((2, 50, 10), 60, 100)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wmrl_jax.embodied import policy as policy_lib
from wmrl_jax.embodied.envs import EpisodeEnv

Sampler = Callable[[policy_lib.PolicyParams, jax.Array, int, np.ndarray], jax.Array]


class Episodes(NamedTuple):
    """A batch of N episodes (numpy, host side).

    Attributes:
      obs: scaled observations before each action, of shape [N, H, D].
      actions: sampled (unclipped) actions, of shape [N, H, A].
      logp: their log-probabilities under the sampling policy, of shape [N, H].
      mask: bool, of shape [N, H]: the steps that were simulated.
      prefix_obs: scaled observation after k steps, of shape [N, D].
      prefix_return: sum of the first k rewards, of shape [N].
      ret: the full-horizon return, of shape [N] (NaN where truncated).
      success: bool, of shape [N]: success at the horizon (False where truncated).
      replicate_ret: a second continuation's return, of shape [N] (NaN where none).
      replicate_success: bool, of shape [N]: its success (False where none).
      prefix_raw: the environment's raw observations after k steps (a list of N,
        e.g. camera frames), or None when it has none (`EpisodeEnv.raw_observations`).
      sim_steps: environment steps simulated, replicates included.
      replicate_steps: the replicates' share of ``sim_steps``.
      sim_seconds: wall seconds in the simulators.
      policy_seconds: wall seconds of policy sampling.
    """

    obs: np.ndarray
    actions: np.ndarray
    logp: np.ndarray
    mask: np.ndarray
    prefix_obs: np.ndarray
    prefix_return: np.ndarray
    ret: np.ndarray
    success: np.ndarray
    replicate_ret: np.ndarray
    replicate_success: np.ndarray
    prefix_raw: list | None
    sim_steps: int
    replicate_steps: int
    sim_seconds: float
    policy_seconds: float


@functools.cache
def make_sampler(obs_scale: tuple[float, ...], *, deterministic: bool = False) -> Sampler:
    """A jitted ``(params, key, t, raw_obs [M, D]) -> [M, A + 1]``: actions, then log-probs.

    Observations are divided by ``obs_scale``; the step's key is
    ``fold_in(key, t)``. ``deterministic`` returns the mean action (and zero
    log-probabilities), for evaluation. One packed output: one transfer per
    simulator step. Cached per arguments, so runs share compilations.
    """
    scale = jnp.asarray(obs_scale, jnp.float32)

    @jax.jit
    def sample(params, key, t, raw_obs):
        obs = jnp.asarray(raw_obs, jnp.float32) / scale
        if deterministic:
            actions = policy_lib.policy_mean(params, obs)
            logp = jnp.zeros(actions.shape[:-1], jnp.float32)
        else:
            actions, logp = policy_lib.sample_actions(params, jax.random.fold_in(key, t), obs)
        return jnp.concatenate([actions, logp[:, None]], axis=1)

    return sample


def run_episodes(
    env: EpisodeEnv,
    sampler: Sampler,
    params: policy_lib.PolicyParams,
    key: jax.Array,
    *,
    seeds: Sequence[int],
    lengths: Sequence[int],
    prefix_len: int,
    obs_scale: Sequence[float] | None = None,
    replicate_src: Sequence[int] = (),
) -> Episodes:
    """Simulates ``len(seeds)`` episodes plus replicate continuations.

    Args:
      env: an `EpisodeEnv` with ``num_envs == len(seeds) + len(replicate_src)``.
      sampler: from `make_sampler`.
      params: policy parameters.
      key: PRNG key (folded with the step index).
      seeds: initial-state seed of each episode, N of them.
      lengths: steps of each episode, each ``prefix_len`` or ``env.horizon``.
      prefix_len: k, where the prefix features are read (1 <= k <= H).
      obs_scale: divisor of stored observations; the env task's when None.
      replicate_src: indices of full-horizon episodes to continue twice.

    Returns:
      `Episodes`.

    Raises:
      ValueError: on inconsistent sizes, lengths or replicate sources.
    """
    n, r, horizon = len(seeds), len(replicate_src), env.horizon
    lengths = np.asarray(lengths, np.int64)
    if env.num_envs != n + r:
        raise ValueError(f"env has {env.num_envs} slots, need {n} episodes + {r} replicates")
    if lengths.shape != (n,) or not np.isin(lengths, (prefix_len, horizon)).all():
        raise ValueError(f"lengths must be {n} values, each {prefix_len} or {horizon}")
    if not 1 <= prefix_len <= horizon:
        raise ValueError(f"prefix_len must be in [1, {horizon}], got {prefix_len}")
    src = np.asarray(replicate_src, np.int64)
    if r and (src.min() < 0 or src.max() >= n or (lengths[src] != horizon).any()):
        raise ValueError("replicate sources must be full-horizon episodes of this batch")
    scale = np.asarray(obs_scale if obs_scale is not None else env.task.obs_scale, np.float32)

    m, d, a = n + r, env.obs_dim, env.act_dim
    obs = np.zeros((m, horizon, d), np.float32)
    actions = np.zeros((m, horizon, a), np.float32)
    logp = np.zeros((m, horizon), np.float32)
    rewards = np.zeros((m, horizon), np.float32)
    mask = np.zeros((m, horizon), bool)
    all_lengths = np.concatenate([lengths, np.full(r, horizon)])
    prefix_obs = np.zeros((m, d), np.float32)
    sim_seconds = policy_seconds = 0.0
    prefix_raw = None

    start = time.perf_counter()
    current = env.reset(list(seeds) + [int(seeds[i]) for i in src])
    sim_seconds += time.perf_counter() - start
    for t in range(horizon):
        if t == prefix_len:
            prefix_obs[:] = current / scale
            prefix_raw = env.raw_observations()
            for j, i in enumerate(src):
                current[n + j] = env.copy_state(int(i), n + j)
        active = (t < all_lengths) & ((np.arange(m) < n) | (t >= prefix_len))
        if not active.any():
            break
        start = time.perf_counter()
        packed = np.asarray(sampler(params, key, t, current))
        act, lp = packed[:, :-1], packed[:, -1]
        policy_seconds += time.perf_counter() - start
        obs[:, t], actions[:, t], logp[:, t], mask[:, t] = current / scale, act, lp, active
        start = time.perf_counter()
        current, rewards[:, t] = env.step(act, active)
        sim_seconds += time.perf_counter() - start
    if prefix_len == horizon:
        prefix_obs[:] = current / scale
        prefix_raw = env.raw_observations()
    success = env.success()

    prefix_return = rewards[:, :prefix_len].sum(axis=1)
    full = all_lengths == horizon
    ret = np.where(full, rewards.sum(axis=1), np.nan).astype(np.float32)
    rep_ret = np.full(n, np.nan, np.float32)
    rep_success = np.zeros(n, bool)
    # A replicate shares its source's first k rewards and simulated none of them.
    rep_ret[src] = prefix_return[src] + rewards[n:, prefix_len:].sum(axis=1)
    rep_success[src] = success[n:]
    steps = int(mask.sum())
    return Episodes(
        obs=obs[:n],
        actions=actions[:n],
        logp=logp[:n],
        mask=mask[:n],
        prefix_obs=prefix_obs[:n],
        prefix_return=prefix_return[:n],
        ret=ret[:n],
        success=success[:n] & full[:n],
        replicate_ret=rep_ret,
        replicate_success=rep_success,
        prefix_raw=None if prefix_raw is None else list(prefix_raw[:n]),
        sim_steps=steps,
        replicate_steps=int(mask[n:].sum()),
        sim_seconds=sim_seconds,
        policy_seconds=policy_seconds,
    )
